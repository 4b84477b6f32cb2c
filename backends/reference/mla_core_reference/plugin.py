"""Entry point of the reference backend (group ``mla_core``)."""
import mla_core

from .backend import ReferenceBackend


@mla_core.hookimpl
def mla_core_backends():
    return [ReferenceBackend()]
