"""Launcher of the CUDA varlen prefill (csrc/mla_prefill_wgmma.cu, and csrc/mla_prefill_fp8.cu for the fp8 recipe on
FP8 wgmma): what it covers, scales, buffers, the QDQ pre-passes.

The kernel serves :func:`mla_core.mla_prefill` at MLA's prefill shapes: bf16 q / k [tokens, heads, 192] and v
[tokens, kv_heads, 128], any batch of ``cu_seqlens`` (len_q and len_k per sequence free: causal is bottom-right,
queries the suffix of their key span), GQA, LSE, the P tile ``block_n = 64`` (docs/numerics.md), P unquantized
(rounded to bf16) or ``p_quant="fp8"``. K / V FP8 fake quantization runs as a pre-pass (``fp8_codes_bf16``, one
launch for both: E4M3 codes of ``x / scale``, the correctly rounded quotient, stored as bf16 values, which hold
every code exactly) and Q's in the kernel (the same codes, made in shared memory once per CTA: ``q_fmt``), the
kernel working on the codes with the per-tensor factors folded into the score scale and the output scale: the fused
definition up to float32 summation order (tests/test_cuda_prefill.py checks the codes against
:func:`mla_core.numerics.qdq_fp8` bit for bit). NVFP4 operands (the nvfp4 recipe, or any one of them): K / V
through a pre-pass (``nvfp4_rows_bf16`` along features for K, and Q unless the kernel makes Q's; ``nvfp4_keys_bf16``
along each sequence's keys for V) writing :func:`mla_core.numerics.nvfp4_unscaled`, the values without the global
scale g, exact in bf16, g folded into the scales as the FP8 factors are; P's NVFP4 in the kernel (``p_fmt`` 3 / 4: P
rounded to bf16, blocks of 16 keys, its g in the output scale), and with it Q's (``q_fmt`` 3 / 4: the pre-pass's
function on each block of the CTA's Q tile in shared memory, once per CTA; Q's NVFP4 with P unquantized or FP8 stays
in the pre-pass, since only the P-NVFP4 kernel instances hold this step). Not FP8 codes on FP8 wgmma: an E2M1 value
times an E4M3 block code is an E4M3 value for only 741 of the 1,016 (value, code) pairs
(benchmarks/probes/nvfp4_e4m3_representable.py).
N:M sparsity, other dtypes and head dims are refused by :func:`why_not` (triton and the reference run them).

The fp8 recipe has a second config, :data:`FP8_MMA`: a pre-pass writes each 64-key tile's K and V^T codes as one
20 KB image of E4M3 bytes (``fp8_tile_images``) and the kernel (``prefill_fp8``) computes S and P·V on FP8 tensor
cores, Q's and P's codes made in it; its LSE within :data:`mla_core.numerics.FP8_MMA_LSE_RTOL` (docs/numerics.md).

Tensor maps are built per call from the tensors' strides; a view TMA cannot address (data or a token / head stride
not a multiple of 16 bytes) is copied first. Nothing is read on the host: a call can be captured in a CUDA graph.
"""
from __future__ import annotations

import math

import torch

from mla_core import numerics
from mla_core.specs import PrefillCall

from .launch_args import EXACT_DIV_FREE_RANGE, aligned, f32  # P's FP8 scales divided without a division too

QK_DIM, V_DIM, P_TILE = 192, 128, 64
FP8_TILE_IMAGE_BYTES = 20480
"""Bytes of one 64-key tile of the FP8-wgmma kernel's pre-pass: K's [64 x 192] and V^T's [128 x 64] E4M3 codes
(csrc/mla_prefill.h)."""
QUANT = frozenset({None, "fp8", "nvfp4"})
"""Q / K / V / P formats the kernel runs (the backend's prefill capability declares these constants)."""


FP8_MMA = {"mma": "fp8"}
"""The config of the fp8 recipe on FP8 wgmma (csrc/mla_prefill_fp8.cu): Q, K, V and P all ``"fp8"``; its S sums
e4m3 products with the tensor cores' reduced precision, so it declares :data:`mla_core.numerics.FP8_MMA_LSE_RTOL`."""


PERSISTENT = {"persistent": True}
"""The persistent config of the bf16-wgmma kernel (csrc/mla_prefill_persistent.cu; P unquantized and Q not made in the
kernel): one CTA per SM claims (query block, head, sequence) items from a counter zeroed per call; the next item's Q
loads while the current one runs. The same outputs and LSE bit for bit as ``{}`` (each item computes what that
config's CTA computes); only the timing differs, so the autotuner may pick either."""


def persistent_covers(problem) -> bool:
    """Whether :data:`PERSISTENT` runs ``problem``: P unquantized and Q not FP8 (whose codes the kernel would make)."""
    return problem.get("p_quant") is None and problem.get("q_quant") != "fp8"


def fp8_mma_covers(problem) -> bool:
    """Whether ``{"mma": "fp8"}`` runs ``problem``: the fp8 recipe (Q, K, V and P FP8) and no other quantization."""
    return all(problem.get(name) == "fp8" for name in ("q_quant", "k_quant", "v_quant", "p_quant"))


def configs(problem) -> list[dict]:
    """The bf16-wgmma kernel (128 query rows per CTA, 64-key tiles, 4 stages), the default; where P is unquantized
    and Q not FP8 also its persistent variant (:data:`PERSISTENT`, second: 0.96-0.99x the grid kernel's time on the
    H200, round (o)); for the fp8 recipe the FP8-wgmma kernel (:data:`FP8_MMA`) first, so it is the default there
    (0.77-0.82x the bf16-wgmma kernel's time on the H200 at 4x4096, 1x16384 and a ragged batch: benchmarks/NOTES.md,
    round (l)), and the autotuner times them all."""
    if fp8_mma_covers(problem):
        return [dict(FP8_MMA), {}]
    return [{}, dict(PERSISTENT)] if persistent_covers(problem) else [{}]


def _f32_reciprocal(x: float) -> float:
    """The correctly rounded float32 reciprocal of float32 ``x`` (one IEEE float32 division)."""
    one = torch.ones((), dtype=torch.float32)
    return float(one / torch.tensor(x, dtype=torch.float32))


def _tma_ready(x: torch.Tensor) -> torch.Tensor:
    """``x`` itself when TMA can address it (data and the token / head strides 16-byte multiples), else a contiguous
    16-byte aligned copy."""
    if x.data_ptr() % 16 == 0 and all(s > 0 and (2 * s) % 16 == 0 for s in x.stride()[:2]):
        return x
    return x.clone(memory_format=torch.contiguous_format)


def fp8_codes(module, operands: list[tuple[torch.Tensor, float | None]]) -> list[tuple[torch.Tensor, float]]:
    """[(codes, scale)] for each (x, amax): x's FP8 E4M3 codes of ``x / scale`` as bf16 values (``scale = amax /
    448``, float32), every operand in one launch (division-free quotients unless a factor is outside the range)."""
    scales = [f32(numerics.fp8_scale(amax)) for _, amax in operands]
    srcs = [aligned(x.contiguous(), 16) for x, _ in operands]
    codes = [torch.empty(src.shape, dtype=torch.bfloat16, device=src.device) for src in srcs]
    exact = any(not EXACT_DIV_FREE_RANGE[0] <= s <= EXACT_DIV_FREE_RANGE[1] for s in scales)
    module.fp8_codes_bf16(srcs, codes, scales, [_f32_reciprocal(s) for s in scales], exact)
    return list(zip(codes, scales))


def nvfp4_rows(module, operands: list[tuple[torch.Tensor, float | None]]) -> list[tuple[torch.Tensor, float]]:
    """[(values, g)] for each (x [rows, heads, 192], amax): x's NVFP4 values along its rows (numerics.qdq_nvfp4, dim
    -1) without the global scale ``g = amax / 2688`` (float32), as contiguous bf16 (exact), every operand in one
    launch (division-free quotients unless some g is outside the range)."""
    gs = [f32(numerics.nvfp4_global_scale(amax)) for _, amax in operands]
    srcs = [_tma_ready(x) for x, _ in operands]
    values = [torch.empty(src.shape, dtype=torch.bfloat16, device=src.device) for src in srcs]
    exact = any(not EXACT_DIV_FREE_RANGE[0] <= g <= EXACT_DIV_FREE_RANGE[1] for g in gs)
    module.nvfp4_rows_bf16(srcs, values, gs, exact)
    return list(zip(values, gs))


def nvfp4_keys(module, v: torch.Tensor, cu_k: torch.Tensor, amax: float | None) -> tuple[torch.Tensor, float]:
    """(values, g): v's NVFP4 values in blocks of 16 keys from each sequence's first key (the reference's qdq of
    ``v[k0:k1]`` along dim 0) without the global scale, as contiguous bf16; keys no sequence covers are left
    unwritten (the kernel never reads them: it zeroes the rows past a sequence's end)."""
    g = f32(numerics.nvfp4_global_scale(amax))
    src = _tma_ready(v)
    values = torch.empty(src.shape, dtype=torch.bfloat16, device=src.device)
    module.nvfp4_keys_bf16(src, cu_k, values, g, not EXACT_DIV_FREE_RANGE[0] <= g <= EXACT_DIV_FREE_RANGE[1])
    return values, g


def _new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully writes (tests replace this to poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def _run_fp8_mma(module, call: PrefillCall, out: torch.Tensor, lse: torch.Tensor | None) -> None:
    """The fp8 recipe on FP8 wgmma: the tile-image pre-pass over K and V (one launch), then the kernel (Q's and P's
    codes in it), the factors folded into the score scale and O's scale as :func:`run` folds them."""
    q_scale, k_scale, v_scale, p_scale = (f32(numerics.fp8_scale(a)) for a in
                                          (call.q_amax, call.k_amax, call.v_amax, call.p_amax))
    inside = [EXACT_DIV_FREE_RANGE[0] <= s <= EXACT_DIV_FREE_RANGE[1] for s in (q_scale, k_scale, v_scale, p_scale)]
    k, v = _tma_ready(call.k), _tma_ready(call.v)
    batch = call.cu_seqlens_q.shape[0] - 1
    cu_q = call.cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = call.cu_seqlens_k.to(torch.int32).contiguous()
    images = torch.empty((module.fp8_tile_image_slots(k.shape[0], batch), k.shape[1], FP8_TILE_IMAGE_BYTES),
                         dtype=torch.uint8, device=k.device)
    module.fp8_tile_images(k, v, cu_k, images, k_scale, _f32_reciprocal(k_scale), v_scale, _f32_reciprocal(v_scale),
                           not (inside[1] and inside[2]))
    module.prefill_fp8(_tma_ready(call.q), images, cu_q, cu_k, call.max_seqlen_q, k.shape[0], out, lse, call.causal,
                       f32(call.softmax_scale) * f32(q_scale * k_scale) * math.log2(math.e), f32(v_scale) * p_scale,
                       q_scale, _f32_reciprocal(q_scale), p_scale, _f32_reciprocal(p_scale),
                       not (inside[0] and inside[3]))


def run(module, call: PrefillCall, config: dict):
    """Prefill with the built extension ``module`` (``config``: ``{}``, :data:`PERSISTENT` or :data:`FP8_MMA`).

    Returns ``(out [total_q, heads, 128] bf16, lse [heads, total_q] float32 natural log, or None)``.
    """
    q, k, v = call.q, call.k, call.v
    total_q, heads, _ = q.shape
    total_k, kv_heads = k.shape[0], k.shape[1]
    if q.dtype != torch.bfloat16 or q.shape[2] != QK_DIM or v.shape[2] != V_DIM or call.block_n != P_TILE:
        raise ValueError(f"cuda prefill: needs bf16, q/k width {QK_DIM}, v width {V_DIM} and block_n {P_TILE} "
                         f"(got {q.dtype}, {q.shape[2]}, {v.shape[2]}, {call.block_n})")
    if any(f not in QUANT for f in (call.q_quant, call.k_quant, call.v_quant, call.p_quant)):
        raise ValueError("cuda prefill: FP8, NVFP4 or no quantization only")
    device = q.device
    out = _new_output((total_q, heads, V_DIM), torch.bfloat16, device)
    lse = _new_output((heads, total_q), torch.float32, device) if call.return_lse else None
    batch = call.cu_seqlens_q.shape[0] - 1
    if total_q == 0 or batch == 0 or call.max_seqlen_q == 0:
        return out, lse
    if total_k == 0:  # no sequence has a key: every row is empty
        out.zero_()
        if lse is not None:
            lse.fill_(float("-inf"))
        return out, lse
    if config.get("mma") == "fp8":
        if not all(f == "fp8" for f in (call.q_quant, call.k_quant, call.v_quant, call.p_quant)):
            raise ValueError("cuda prefill: the FP8-wgmma config runs the fp8 recipe only (Q, K, V and P FP8)")
        _run_fp8_mma(module, call, out, lse)
        return out, lse
    persistent = bool(config.get("persistent"))
    if persistent and not persistent_covers({"p_quant": call.p_quant, "q_quant": call.q_quant}):
        raise ValueError("cuda prefill: the persistent config runs P unquantized and Q not FP8 only")
    cu_q = call.cu_seqlens_q.to(torch.int32).contiguous()
    cu_k = call.cu_seqlens_k.to(torch.int32).contiguous()
    q_fmt, q_scale = 0, 1.0
    if call.q_quant == "fp8":  # Q's codes are made in the kernel, once per CTA after its Q tile lands
        q_scale = f32(numerics.fp8_scale(call.q_amax))
        q_fmt = 1 if EXACT_DIV_FREE_RANGE[0] <= q_scale <= EXACT_DIV_FREE_RANGE[1] else 2
    elif call.q_quant == "nvfp4" and call.p_quant == "nvfp4":  # Q's values in the kernels with P's NVFP4 (q_fmt 3 / 4)
        q_scale = f32(numerics.nvfp4_global_scale(call.q_amax))
        q_fmt = 3 if EXACT_DIV_FREE_RANGE[0] <= q_scale <= EXACT_DIV_FREE_RANGE[1] else 4
    ops = dict(q=q, k=k, v=v)
    factor = dict(q=q_scale, k=1.0, v=1.0)
    amaxes = dict(q=call.q_amax, k=call.k_amax, v=call.v_amax)
    rows = [name for name, fmt in (("q", call.q_quant if q_fmt == 0 else None), ("k", call.k_quant)) if fmt == "nvfp4"]
    if rows:  # the nvfp4 pre-pass along features: K's values (without g), Q's too where the kernel does not make them
        for name, (values, g) in zip(rows, nvfp4_rows(module, [(ops[name], amaxes[name]) for name in rows])):
            ops[name], factor[name] = values, g
    if call.v_quant == "nvfp4":  # and along each sequence's keys: V's
        ops["v"], factor["v"] = nvfp4_keys(module, ops["v"], cu_k, call.v_amax)
    quantized = [name for name, fmt in (("k", call.k_quant), ("v", call.v_quant)) if fmt == "fp8"]
    if quantized:  # the FP8 pre-pass: K and V's codes in one launch
        made = fp8_codes(module, [(ops[name], amaxes[name]) for name in quantized])
        for name, (codes, scale) in zip(quantized, made):
            ops[name], factor[name] = codes, scale
    q, k, v = ops["q"], ops["k"], ops["v"]
    scale_qk, out_scale = factor["q"] * factor["k"], factor["v"]
    p_fmt, p_scale = 0, 1.0
    if call.p_quant in ("fp8", "nvfp4"):  # FP8: codes of P / scale; NVFP4: values without g (p_scale = g)
        nv = call.p_quant == "nvfp4"
        p_scale = f32(numerics.nvfp4_global_scale(call.p_amax) if nv else numerics.fp8_scale(call.p_amax))
        p_fmt = (3 if nv else 1) + (0 if EXACT_DIV_FREE_RANGE[0] <= p_scale <= EXACT_DIV_FREE_RANGE[1] else 1)
        out_scale = f32(out_scale) * p_scale
    # the persistent kernel's item counter, zero for each call (a memset: a graph node under capture)
    counter = (torch.zeros(1, dtype=torch.int64, device=device),) if persistent else ()
    module.prefill_wgmma(_tma_ready(q), _tma_ready(k), _tma_ready(v), cu_q, cu_k, call.max_seqlen_q, out, lse,
                         call.causal, f32(call.softmax_scale) * f32(scale_qk) * math.log2(math.e),
                         f32(out_scale), p_fmt, p_scale, _f32_reciprocal(p_scale), q_fmt, q_scale,
                         _f32_reciprocal(q_scale), *counter)
    return out, lse
