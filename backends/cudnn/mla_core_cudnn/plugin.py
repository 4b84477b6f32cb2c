"""Entry point of the cuDNN backend (group ``mla_core``)."""
import mla_core

from .backend import CudnnBackend


@mla_core.hookimpl
def mla_core_backends():
    return [CudnnBackend()]
