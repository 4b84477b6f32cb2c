"""The CUDA C++ backend object. No kernels yet: it declares no ops, and says why it cannot run."""
from __future__ import annotations

import shutil

import mla_core


class CudaBackend(mla_core.Backend):
    name = "cuda"
    version = "0"
    priority = 300
    device_types = frozenset({"cuda"})
    description = "CUDA C++ kernels from csrc/ via pybind11 + ninja (no ops implemented yet)"
    capabilities = {}

    def unavailable_reason(self) -> str | None:
        import torch
        if not torch.cuda.is_available():
            return "no CUDA device"
        if shutil.which("nvcc") is None:
            return "nvcc not found on PATH (needed to build csrc/)"
        return None
