"""Entry point of the musa_fp8 backend (group ``mla_core``)."""
import mla_core

from .backend import MusaFp8Backend


@mla_core.hookimpl
def mla_core_backends():
    return [MusaFp8Backend()]
