"""Entry point of the CUDA C++ backend (group ``mla_core``)."""
import mla_core

from .backend import CudaBackend


@mla_core.hookimpl
def mla_core_backends():
    return [CudaBackend()]
