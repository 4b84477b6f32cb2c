"""The Triton backend object: capabilities, configs and the entry to each op's launcher.

Kernel modules (``decode.py``, ``prefill.py``, ``merge.py``) import triton; this module does not, so
the backend can say "triton is not installed" instead of failing to load.
"""
from __future__ import annotations

import importlib
import importlib.util
import os

import mla_core
from mla_core import OpCapability

_FORMATS = frozenset({None, "fp8", "nvfp4"})
_FLOAT = frozenset({"bfloat16", "float16", "float32"})
_FP8_CACHE = "float8_e4m3fn"
_KERNEL_MODULES: dict = {}
"""The kernel modules by op name, once imported."""


class TritonBackend(mla_core.Backend):
    name = "triton"
    priority = 200
    description = "Triton kernels: fused fake-quant MLA decode (split-KV, paged), varlen prefill, merge"
    capabilities = {
        "decode": OpCapability(
            limits={"dtype": _FLOAT | {_FP8_CACHE}, "k_qdq": _FORMATS, "v_qdq": _FORMATS, "p_qdq": _FORMATS,
                    "heads": range(1, 129), "kv_lora_rank": range(16, 1025, 16), "rope_dim": range(0, 257)},
            features=frozenset({"lse", "fp32_q"}),
            notes="any page size >= 1; heads 1..128; kv_lora_rank a multiple of 16 (NVFP4 K blocks stay "
                  "within the latent part) up to 1024; rope 0..256; an FP8 cache (float8_e4m3fn + kv_scale) with "
                  "p_qdq only (no k_qdq / v_qdq)",
            why={"kv_qdq_fp8_cache": "k_qdq / v_qdq over an FP8 cache: the kernels read its codes as they are "
                                     "(re-quantizing the dequantized values: the reference backend)"}),
        "prefill": OpCapability(
            limits={"dtype": _FLOAT, "q_quant": _FORMATS, "k_quant": _FORMATS, "p_quant": _FORMATS,
                    "v_quant": _FORMATS},
            features=frozenset({"lse", "nm_sparsity", "gqa"}), notes="causal and non-causal, varlen, GQA/MQA"),
        "merge": OpCapability(limits={"dtype": _FLOAT}),
        "layer": OpCapability(
            limits={"dtype": _FLOAT, "kv_lora_rank": range(1, 4097), "rope_dim": range(2, 257, 2)},
            features=frozenset({"sinks", "fp8_weights"}),
            notes="fused layer (layer.py): one Triton kernel for RMSNorm + RoPE + cache write, weights dequantized "
                  "once into the cache dtype (cached per weight tensor), bf16/fp16/fp32 GEMMs; no sparse indices"),
    }

    version = "1"  # the kernels' own version; the Triton release is recorded beside it in cache entries

    @property
    def device_types(self) -> frozenset[str]:
        # Under the interpreter Triton kernels run on CPU tensors (how CI tests them).
        return frozenset({"cuda", "cpu"}) if os.environ.get("TRITON_INTERPRET") == "1" else frozenset({"cuda"})

    def unavailable_reason(self) -> str | None:
        if importlib.util.find_spec("triton") is None:
            return "the triton package is not installed (pip install 'mla-core[triton]')"
        return None

    def _kernels(self, op: str):
        module = _KERNEL_MODULES.get(op)
        if module is None:          # imported once (import_module costs a few frames per call)
            module = _KERNEL_MODULES[op] = importlib.import_module(f"{__package__}.{op}")
        return module

    def configs(self, problem):
        return self._kernels(problem.op).configs(problem)

    def decode(self, call, config):
        return self._kernels("decode").run(call, config)

    def prefill(self, call, config):
        return self._kernels("prefill").run(call, config)

    def merge(self, call, config):
        return self._kernels("merge").run(call, config)

    def layer(self, call, config):
        return self._kernels("layer").run(call, config)
