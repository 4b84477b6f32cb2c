"""The musa_fp8 backend object: capabilities, configs and the entry to each op's Triton launcher.

Kernel modules (``rope.py``, ``sparse.py``) import triton; this module does not, so the backend can say
"triton is not installed" instead of failing to load. Device types: ``cuda``; ``musa`` when ``torch_musa``
is importable (declared from the Triton sources, which Moore Threads' toolchain compiles; untested here);
``cpu`` under ``TRITON_INTERPRET=1`` (how CI runs the kernels).
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import mla_core
from mla_core import OpCapability


class MusaFp8Backend(mla_core.Backend):
    name = "musa_fp8"
    priority = 150
    description = ("FP8 sparse MLA the MATE way (Triton): fused RoPE + FP8 quantize, top-k sparse decode on "
                   "576-byte FP8 rows and 656-byte fp8_ds_mla rows")
    capabilities = {
        "rope_quantize_fp8": OpCapability(
            limits={"dtype": frozenset({"bfloat16", "float16"}), "cos_dtype": frozenset({"float32", "bfloat16"}),
                    "rope_dim": range(2, 257, 2), "nope_dim": range(0, 2049)},
            notes="one launch for all four outputs; neox and interleaved; strided output slices; "
                  "positions outside cos/sin give rope 0"),
        "sparse_decode": OpCapability(
            limits={"kv_layout": frozenset({"fp8", "fp8_ds_mla"}), "heads": range(1, 129), "q_len": range(1, 5),
                    "kv_lora_rank": frozenset({512}), "rope_dim": frozenset({64})},
            features=frozenset({"lse"}),
            notes="576-byte FP8 rows (FP8 query) and 656-byte fp8_ds_mla rows (bf16 query); heads 1..128, "
                  "q_len 1..4, any top-k multiple of 64"),
    }

    @property
    def version(self) -> str:
        try:
            import triton
            return f"1 (triton {triton.__version__})"
        except ImportError:
            return "1"

    @property
    def device_types(self) -> frozenset[str]:
        types = {"cuda"}
        if importlib.util.find_spec("torch_musa") is not None:
            types.add("musa")
        if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter runs kernels on CPU tensors
            types.add("cpu")
        return frozenset(types)

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed (pip install 'mla-core[triton]')"
        return None

    def _kernels(self, op: str):
        return importlib.import_module(f"{__package__}.{'rope' if op == 'rope_quantize_fp8' else 'sparse'}")

    def configs(self, problem):
        return self._kernels(problem.op).configs(problem)

    def rope_quantize_fp8(self, call, config):
        return self._kernels("rope_quantize_fp8").run(call, config)

    def sparse_decode(self, call, config):
        return self._kernels("sparse_decode").run(call, config)
