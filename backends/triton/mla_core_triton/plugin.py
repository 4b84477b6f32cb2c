"""Entry point of the Triton backend (group ``mla_core``)."""
import mla_core

from .backend import TritonBackend


@mla_core.hookimpl
def mla_core_backends():
    return [TritonBackend()]
