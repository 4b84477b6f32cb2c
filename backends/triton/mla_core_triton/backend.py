"""The Triton backend object. Kernels land with the Triton issue; until then it declares no ops."""
from __future__ import annotations

import importlib.util
import os

import mla_core


class TritonBackend(mla_core.Backend):
    name = "triton"
    priority = 200
    description = "Triton kernels: fused fake-quant MLA decode, prefill and merge (not yet implemented)"
    capabilities = {}

    @property
    def version(self) -> str:
        try:
            import triton
            return f"triton {triton.__version__}"
        except ImportError:
            return "-"

    @property
    def device_types(self) -> frozenset[str]:
        # Under the interpreter Triton kernels run on CPU tensors (how CI tests them).
        return frozenset({"cuda", "cpu"}) if os.environ.get("TRITON_INTERPRET") == "1" else frozenset({"cuda"})

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed (pip install 'mla-core[triton]')"
        return None
