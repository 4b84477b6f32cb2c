"""mla_core's reference backend: the executable definition of every op's numerics (PyTorch, any device)."""
from .backend import ReferenceBackend

__all__ = ["ReferenceBackend"]
