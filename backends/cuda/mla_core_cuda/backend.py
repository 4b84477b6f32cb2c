"""The CUDA C++ backend object: capabilities, configs, and the entry to the kernels built from csrc/.

The extension is built on first use (``build.py``): asking whether the backend is available on a machine
with a compute capability 9.0 GPU builds it (or loads the cached build); a failed build makes the backend
unavailable with the compiler's first error line. Nothing here imports the extension at module load.
"""
from __future__ import annotations

import mla_core
from mla_core import OpCapability

from . import build, decode, prefill

_FORMATS = frozenset({None, "fp8", "nvfp4"})
CAPABILITY = (9, 0)
"""The compute capability the kernels are built for (sm_90a: H100 / H200)."""


def device_reason() -> str | None:
    """Why this machine cannot run the kernels at all (no GPU, another compute capability), or None."""
    import torch
    if not torch.cuda.is_available():
        return "no CUDA device"
    cap = torch.cuda.get_device_capability()
    if tuple(cap) != CAPABILITY:
        return (f"compute capability {cap[0]}.{cap[1]} (built only for {CAPABILITY[0]}.{CAPABILITY[1]}, "
                f"{build.ARCH}: H100 / H200)")
    return None


class CudaBackend(mla_core.Backend):
    name = "cuda"
    # the shipped H200 choices (autotune_cache/) carry this string: change both together
    version = ("0.5 (sm_90a, mma.sync + wgmma with FP8 K=V and P quantization, wgmma prefill; FP8 K converted "
               "through 16-byte shared accesses)")
    priority = 180  # below triton (200) where not measured faster (priority_for); tuned caches pick per shape
    PRIORITY_WGMMA = 210
    """Above triton's 200: decode on the WGMMA kernel where it was measured faster unquantized (H200, graph
    replays: 1.5-3.4x triton's speed at 128 heads with auto splits, 1.8-2.4x at 32 splits; docs/cuda.md "Speed");
    the K = V FP8 recipes it runs rank alike: the fp8 recipe measured 522 us at 128 heads, batch 32, 8k keys (auto
    splits) against triton's 856 at 32 splits, and the TP 8 warm-up picked it over triton at 16 heads from 4k keys
    (benchmarks/NOTES.md, "fused fake quantization on WGMMA", lead's run)."""
    PRIORITY_PREFILL = 220
    """Prefill: above triton (200), below cuDNN's 250 where cuDNN serves the problem (bf16 dense batches, and ragged
    ones where torch keeps its cuDNN graph). Measured on the H200 (causal, 128 heads, 4 x 4096 and 1 x 16384):
    1.43-1.55x triton's speed in bf16 and 1.24-1.38x with the fp8 recipe (which cuDNN cannot run), 0.94-1.01x
    SDPA-cuDNN's in bf16 (benchmarks/NOTES.md, "cuda prefill: the TMA kernel in the library")."""
    device_types = frozenset({"cuda"})
    description = ("CUDA C++ kernels from csrc/ (pybind11, built with ninja on first use): fused fake-quant MLA "
                   "decode, FP8 top-k sparse decode, varlen prefill (q/k 192, v 128); the fused layer's decode prep "
                   "inside the decode call (decode_with_prep)")
    capabilities = {
        "decode": OpCapability(
            limits={"dtype": frozenset({"bfloat16", "float16", decode.FP8_CACHE}),
                    "q_dtype": frozenset({"bfloat16", "float16"}),
                    "k_qdq": _FORMATS, "v_qdq": _FORMATS, "p_qdq": _FORMATS, "heads": range(1, 129),
                    "kv_lora_rank": frozenset({512}), "rope_dim": frozenset({64})},
            features=frozenset({"lse"}),
            notes="sm_90 (H100/H200) only; kv_lora_rank 512 + rope 64; heads 1..128 (unquantized and K = V FP8 "
                  "with any P on WGMMA, the nvfp4 recipe and K/V mixes on mma.sync); any page size >= 1; "
                  "q in the cache dtype (bf16/fp16); an FP8 KV cache (float8_e4m3fn + kv_scale) with q bf16/fp16 "
                  "on WGMMA, p_qdq only (no k_qdq / v_qdq)",
            why={"kv_qdq_fp8_cache": "k_qdq / v_qdq over an FP8 cache: the kernels read its codes as they are "
                                     "(re-quantizing the dequantized values: the reference backend)"}),
        "sparse_decode": OpCapability(
            limits={"kv_layout": frozenset({"fp8", "fp8_ds_mla"}), "heads": range(64, 1025, 64),
                    "q_len": range(1, 5), "kv_lora_rank": frozenset({512}), "rope_dim": frozenset({64})},
            features=frozenset({"lse"}),
            notes="sm_90 (H100/H200) only, WGMMA; MATE's 576-byte FP8 rows (FP8 query) and FlashMLA's / vLLM's "
                  "656-byte fp8_ds_mla rows (bf16 query); heads a multiple of 64 (others: musa_fp8); q_len 1..4; "
                  "any top-k multiple of 64"),
        "prefill": OpCapability(
            limits={"dtype": frozenset({"bfloat16"}), "qk_dim": frozenset({prefill.QK_DIM}),
                    "v_dim": frozenset({prefill.V_DIM}), "block_n": frozenset({prefill.P_TILE}),
                    **dict.fromkeys(("q_quant", "k_quant", "v_quant", "p_quant"), prefill.QUANT)},
            features=frozenset({"lse", "gqa"}),
            notes="sm_90 (H100/H200) only, WGMMA + TMA; bf16 q/k 192 (128 + 64 RoPE), v 128; varlen, causal "
                  "(bottom-right) and non-causal, any len_q / len_k, GQA; P tile block_n 64; P in bf16, FP8 or "
                  "NVFP4 (rounded in the kernel); Q/K/V FP8 as a QDQ pre-pass to codes, NVFP4 as a pre-pass to "
                  "values without the global scale (exact in bf16); no N:M sparsity",
            why={"dtype": "the kernel's tensor-core products and TMA maps are bf16 (fp16 / fp32: triton)",
                 "qk_dim": "the kernel is written for MLA's q/k width 192 = 128 + 64 RoPE (three 128-byte slabs "
                           "per row)",
                 "v_dim": "the kernel is written for MLA's v width 128 (one m64n128 accumulator per warpgroup)",
                 "block_n": "the P tile (docs/numerics.md) is the kernel's 64-key tile; another block_n rounds P "
                            "against other maxima (triton, reference)",
                 "nm_sparsity": "N:M sparsity ranks scores inside key groups, which this kernel does not (triton "
                                "runs it)"}),
    }

    def priority_for(self, problem) -> int:
        """:data:`PRIORITY_WGMMA` for a decode the WGMMA kernel runs at more than 16 heads, or at 16 heads or
        fewer with ``num_kv_splits="auto"`` from batch 8 (measured on the H200: 1.15-1.29x triton's speed there; at
        the API's default 32 splits its one-CTA-per-SM kernel runs 8+ waves and triton is faster, 0.74-0.81x) or,
        below batch 8, for an eager call (:func:`mla_core.dispatch.capturing` False); :data:`PRIORITY_PREFILL` for
        every prefill it runs; else 180.

        Eager below batch 8 (the fused layer's decode step): one pybind11 call against triton's split and combine
        launches, 28.7 against 122.9 us of host time per call on the H200 (benchmarks/NOTES.md, "eager step, round
        (h)"), while the GPU time differs by 2.4-4.7 us (triton faster at L <= 4k, WGMMA from 16k). A call captured
        into a CUDA graph, where only the GPU time counts, keeps triton unless the problem was called eagerly
        before (dispatch then replays the eager choice). Tuned cache entries win over both."""
        if problem.op == "prefill":
            return self.PRIORITY_PREFILL
        if problem.op != "decode" or not decode.wgmma_covers(problem):
            return self.priority
        if problem["heads"] > 16 or (problem.get("num_kv_splits") == "auto" and (
                problem.get("batch", 1) >= 8 or not mla_core.dispatch.capturing(problem))):
            return self.PRIORITY_WGMMA
        return self.priority

    def unavailable_reason(self) -> str | None:
        reason = device_reason()
        if reason:
            return reason
        _, reason = build.load_or_reason()
        return reason

    def prepare(self) -> None:
        """Build (or load) the extension now; a failed build is remembered as :meth:`unavailable_reason`."""
        if device_reason() is None:
            build.load_or_reason()

    def build(self, verbose: bool = False) -> str | None:
        """``mla-core build``: build the kernels now (or find the cached build); no GPU needed, only nvcc.

        Returns None when built, else one line: the compiler's first error (full log in the build folder).
        """
        try:
            build.build(verbose)
        except (build.BuildError, OSError) as exc:
            return f"build failed: {exc}"
        return None

    def configs(self, problem):
        if problem.op == "sparse_decode":
            from . import sparse
            return sparse.configs(problem)
        if problem.op == "prefill":
            return prefill.configs(problem)
        return decode.configs(problem)

    _loaded = None
    """The extension once an op found it (a loaded extension module stays valid for the process): every op's
    launch reads this attribute instead of asking the build each call."""

    def _module(self):
        """The built extension (dispatch only reaches an op when :meth:`unavailable_reason` was None)."""
        if self._loaded is not None:
            return self._loaded
        module, reason = build.load_or_reason()
        if module is None:
            raise RuntimeError(f"the cuda backend is unavailable: {reason}")
        self._loaded = module
        return module

    def decode(self, call, config):
        return decode.run(self._module(), call, config)

    def decode_prep_reason(self) -> str | None:
        """None when the built extension has ``layer_decode`` (the layer's prep and the decode in one call), else why
        not (an extension built from a csrc/ without mla_layer_prep.cu: an A/B base snapshot)."""
        if not hasattr(self._module(), "layer_decode"):
            return "the built extension has no layer_decode (csrc/ from before mla_layer_prep.cu)"
        return None

    def decode_with_prep(self, call, config, prep):
        """:meth:`decode` with the fused layer's prep (:class:`mla_core.specs.LayerDecodePrep`) in the same extension
        call (:func:`decode.run` with ``prep``). The caller (the layer) checked the prep's layout: bf16 / fp16 cache,
        one token per request, float32 freqs, aligned rows."""
        return decode.run(self._module(), call, config, prep)

    def sparse_decode(self, call, config):
        from . import sparse
        return sparse.run(self._module(), call, config)

    def prefill(self, call, config):
        return prefill.run(self._module(), call, config)
