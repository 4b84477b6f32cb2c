"""Launcher of the CUDA decode kernels: scales, buffers, split count, configs.

Two kernels: the WGMMA kernel (csrc/mla_decode_wgmma.cu, config ``{"kernel": "wgmma"}``) for the problems it
covers (:func:`wgmma_covers`: bf16 / fp16, K and V unquantized or both FP8, P in any format; an FP8 cache), listed
first there, and its keys-as-M variant (config ``{"kernel": "keys_m"}``, :func:`keys_m_covers`: a bf16 / fp16
cache at <= 16 heads, unquantized) and its four-slot ring variant (config ``{"kernel": "ring4"}``,
:func:`ring4_covers`: the same schedule Q1 on four 32-key ring slots, bit-equal, at >= 64 heads) listed after it for
the autotuner; the mma.sync kernel (csrc/mla_decode.cu,
configs ``{"head_tiles", "warps"}``) for every problem over a bf16 / fp16 cache. Both share the quantizers
(csrc/qdq.cuh).

The kernel computes the reference's function (mla_core.numerics): 32-key P tiles at absolute positions,
tile-aligned splits with the reference's schedule, K/V/P fake quantization with the reference's rounding
(IEEE divisions, E4M3 by the hardware's round-to-nearest-even conversion, E2M1 ties to even). Quantized
operands enter the tensor-core products as unscaled codes (exact in bf16/fp16); the per-tensor factors
scale the float32 scores (``k_scale``) and the output (``v_scale * p_scale``). An FP8 cache (float8_e4m3fn codes,
docs/numerics.md "FP8 KV cache") is never dequantized: its codes convert exactly to q's dtype in the kernel and
``kv_scale`` joins both factors.
"""
from __future__ import annotations

import math

import torch

from mla_core import numerics
from mla_core.specs import DecodeCall, LayerDecodePrep, auto_split_choices, decode_num_splits, sm_count

from .launch_args import EXACT_DIV_FREE_RANGE, f32

KV_LORA_RANK = 512
ROPE_DIM = 64
_FMT = {None: 0, "fp8": 1, "nvfp4": 2}


def _scale(fmt: str | None, amax: float | None) -> float:
    """Per-tensor factor left out of the codes: FP8 ``amax / 448``, NVFP4 ``amax / 2688`` (1.0 without amax)."""
    if fmt == "fp8":
        return numerics.fp8_scale(amax)
    if fmt == "nvfp4":
        return numerics.nvfp4_global_scale(amax)
    return 1.0


SHAPES = ((1, 4), (2, 4), (2, 8), (4, 8))
"""(head_tiles, warps) CTA shapes built: 16 * head_tiles heads per CTA share each K/V tile read."""


def _default_shape(heads: int) -> tuple[int, int]:
    return (1, 4) if heads <= 16 else ((2, 8) if heads <= 32 else (4, 8))


WGMMA = {"kernel": "wgmma"}
"""The WGMMA kernel's config: 64 heads per CTA (zero-padded), a producer and two consumer warpgroups, 64-key
steps (two 32-key P tiles), one CTA per SM."""
KEYS_M = {"kernel": "keys_m"}
"""The WGMMA kernel's keys-as-M variant (decode_km_kernel): the 64 keys of a step are the wgmma M and <= 16 heads
its N (no padding rows), both consumer warpgroups on alternate steps; one CTA per SM."""
RING4 = {"kernel": "ring4"}
"""The WGMMA kernel's schedule Q1 on a ring of four 32-key slots (decode_wgmma_ring4_kernel): each 64-key stage's two
key halves filled and released on their own, so a half is refilled once both warpgroups' P V of it completed. The
same instructions in the same order as the default: bit-equal to it; one CTA per SM. Measured 0.964-0.995x the
default's time at 64 heads, 0.987-1.001x at 128 with the cp.async producer (round q); since both load by TMA,
0.995-1.002x at 64 heads and 1.03-1.04x at 128 (round r): listed for the tuner, which times it per shape
(benchmarks/NOTES.md)."""
_WGMMA_DTYPES = frozenset({"bfloat16", "float16"})
FP8_CACHE = "float8_e4m3fn"


def wgmma_covers(problem) -> bool:
    """Whether the WGMMA kernel runs ``problem``: cache and q bf16 or fp16 (any head count); K and V both
    unquantized or both FP8; P unquantized, FP8 or NVFP4 (its consumers quantize P in registers). An FP8 cache
    with q bf16 or fp16, K and V not fake-quantized (the cache holds codes already), P any format: its producer
    converts the codes to q's dtype in place.

    K and V share one shared-memory tile (V = K's first 512 columns), which the producer quantizes in place, so
    K's and V's fake quantization must give the same values there: both off, or FP8 with one scale (elementwise).
    NVFP4 K (blocks along the features) and NVFP4 V (blocks along the tokens) differ, and a second tile of V
    codes does not fit beside the two-stage ring (Q 72 KB + 2 x 72 KB of the 227 KB), so the nvfp4 recipe and any
    K/V mix stay on the mma.sync kernel. The amaxes are no part of the problem: a call whose FP8 K and V scales
    differ, or that needs exact divisions (:data:`EXACT_DIV_FREE_RANGE`), runs the mma.sync kernel under this
    config (:func:`_kernel_config`)."""
    kv = (problem.get("k_qdq"), problem.get("v_qdq"))
    if problem["dtype"] == FP8_CACHE:
        return problem["q_dtype"] in _WGMMA_DTYPES and kv == (None, None)
    return (problem["dtype"] in _WGMMA_DTYPES and problem["q_dtype"] == problem["dtype"]
            and kv in ((None, None), ("fp8", "fp8")))


def _unquantized_16bit(problem) -> bool:
    """A bf16 / fp16 cache and q of its dtype, K, V and P unquantized: the problems of the keys-as-M and ring4
    variants."""
    return (problem["dtype"] in _WGMMA_DTYPES and problem["q_dtype"] == problem["dtype"]
            and (problem.get("k_qdq"), problem.get("v_qdq"), problem.get("p_qdq")) == (None, None, None))


def keys_m_covers(problem) -> bool:
    """Whether the keys-as-M config runs ``problem``: :func:`_unquantized_16bit` at most 16 heads (an FP8 cache at
    <= 16 heads has its own keys-as-M kernel under the WGMMA config)."""
    return problem["heads"] <= 16 and _unquantized_16bit(problem)


def ring4_covers(problem) -> bool:
    """Whether the four-slot ring config (ring4) is listed for ``problem``: :func:`_unquantized_16bit` at least 64
    heads (where it was measured within 0.96-1.04x of the default's time, :data:`RING4`; not measured at 16, so not
    listed there; the kernel itself runs any head count)."""
    return problem["heads"] >= 64 and _unquantized_16bit(problem)


def configs(problem) -> list[dict]:
    """Launch choices: the WGMMA kernel first where it covers the problem, its keys-as-M variant next where that
    covers it, its four-slot ring variant where it covers it (no split variants of its own: it runs the default's
    split count), then (over a bf16 / fp16 cache) the mma.sync kernel's CTA shapes (16-head m-tiles
    ``head_tiles``, ``warps``), fewest padded heads first among the wide ones; for "auto" also the split counts of
    the first (and of the keys-as-M variant): 1..32, and 64 / 128 at small batch and long keys
    (:func:`mla_core.specs.auto_split_choices`: one CTA per SM per 64-head group and split)."""
    heads = problem["heads"]
    if heads <= 16:
        shapes = [(1, 4)]
    elif heads <= 32:
        shapes = [(2, 8), (2, 4), (1, 4)]
    else:
        shapes = [(4, 8), (2, 8), (2, 4), (1, 4)]
    out = [dict(WGMMA)] if wgmma_covers(problem) else []
    keys_m = [dict(KEYS_M)] if keys_m_covers(problem) else []
    out += keys_m
    out += [dict(RING4)] if ring4_covers(problem) else []
    if problem["dtype"] != FP8_CACHE:
        out += [{"head_tiles": ht, "warps": w} for ht, w in shapes]
    if problem.get("num_kv_splits") == "auto":
        out += [dict(c, num_kv_splits=s) for c in [out[0]] + keys_m for s in auto_split_choices(problem)]
    return out


def _quant_args(call: DecodeCall) -> tuple:
    """(k_scale, v_scale, p_scale, v_from_k, exact_div) of ``call``: the per-tensor factors, whether V's codes are
    K's first 512 (FP8 K and V with one float32 scale), whether a factor needs ``__fdiv_rn``."""
    k_scale, v_scale, p_scale = (_scale(call.k_qdq, call.k_amax), _scale(call.v_qdq, call.v_amax),
                                 _scale(call.p_qdq, call.p_amax))
    v_from_k = call.k_qdq == call.v_qdq == "fp8" and f32(k_scale) == f32(v_scale)
    # division-free quotients are proven for per-tensor factors well inside float32's range (docs/decisions.md)
    exact_div = any(not EXACT_DIV_FREE_RANGE[0] <= s <= EXACT_DIV_FREE_RANGE[1] for s in (k_scale, v_scale, p_scale))
    return k_scale, v_scale, p_scale, v_from_k, exact_div


def _kernel_config(call: DecodeCall, config: dict, quant: tuple) -> dict:
    """``config``, or for a WGMMA config whose call the kernel cannot run (FP8 K and V with two scales, or K
    quantized with exact divisions: its producer divides without a division instruction only) the mma.sync
    kernel's default shape with the same split choice. ``quant``: :func:`_quant_args` of ``call``."""
    if config.get("kernel") != "wgmma" or call.k_qdq is None:
        return config
    _, _, _, v_from_k, exact_div = quant
    if v_from_k and not exact_div:
        return config
    return {k: v for k, v in config.items() if k != "kernel"}


def num_splits(call: DecodeCall, config: dict) -> int:
    """The split count ``config`` runs ``call`` with (the WGMMA kernel and its keys-as-M and ring4 variants keep one
    CTA per SM, mma.sync two)."""
    return decode_num_splits(call, config, sm_count(call.q.device),
                             resident_ctas=1 if config.get("kernel") in ("wgmma", "keys_m", "ring4") else 2)


_PLANS: dict[tuple, tuple] = {}
"""Launch plans by everything :func:`_plan` reads (at most :data:`_PLANS_MAX` keys; cleared when full)."""
_PLANS_MAX = 256


def _plan(call: DecodeCall, config: dict, key: tuple) -> tuple:
    """(entry, partial sizes or None, the entry's arguments after the partial buffers, layer_decode's (kernel,
    head_tiles, warps)) of ``call``, cached under ``key`` (everything read here, built in :func:`run`): the extension
    function, the split count, the scale products, the formats, for keys-as-M / ring4 its flags, and for mma.sync its
    CTA shape. Raises ValueError for a CTA shape not built (nothing is cached then)."""
    batch, heads, _ = call.q.shape
    quant = _quant_args(call)
    config = _kernel_config(call, config, quant)
    splits = num_splits(call, config)
    parts = (batch * heads * splits * KV_LORA_RANK, batch * heads * splits) if splits > 1 else None
    k_scale, v_scale, p_scale, v_from_k, exact_div = quant
    k32, v32, p32 = (f32(s) if fmt else 1.0 for s, fmt in ((k_scale, call.k_qdq), (v_scale, call.v_qdq),
                                                           (p_scale, call.p_qdq)))
    kv = 1.0 if call.kv_scale is None else call.kv_scale  # an FP8 cache: its scale joins both factors
    args = (splits, float(call.softmax_scale) * k32 * math.log2(math.e) * kv, kv * v32 * p32, k_scale, v_scale,
            p_scale, _FMT[call.k_qdq], _FMT[call.v_qdq], _FMT[call.p_qdq], v_from_k, exact_div)
    # layer: the same kernel as layer_decode's (kernel, head_tiles, warps): 0 mma.sync (its CTA shape), 1 WGMMA,
    # 2 keys-as-M, 3 the four-slot ring
    if config.get("kernel") == "wgmma":
        entry, layer = "decode_wgmma", (1, 0, 0)
    elif config.get("kernel") == "keys_m":  # the extension refuses a call keys_m_covers would not list it for
        entry, args, layer = "decode_wgmma", args + (True,), (2, 0, 0)
    elif config.get("kernel") == "ring4":  # the extension refuses a quantized call (ring4_covers: never listed)
        entry, args, layer = "decode_wgmma", args + (False, True), (3, 0, 0)
    else:
        default = _default_shape(heads)
        head_tiles, warps = int(config.get("head_tiles", default[0])), int(config.get("warps", default[1]))
        if (head_tiles, warps) not in SHAPES:
            raise ValueError(f"cuda decode config: (head_tiles, warps) = {(head_tiles, warps)} not in {SHAPES}")
        entry, args, layer = "decode", args + (head_tiles, warps), (0, head_tiles, warps)
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    plan = _PLANS[key] = entry, parts, args, layer
    return plan


def run(module, call: DecodeCall, config: dict, prep: LayerDecodePrep | None = None):
    """Decode with the built extension ``module``: one call of its ``decode_wgmma`` or ``decode`` (split kernel and
    combine), with the launch constants of :func:`_plan` (cached per key: a repeated shape reads one dict).

    ``prep`` (the fused layer's decode step): then the one call is the extension's ``layer_decode``: the prep (the
    new cache rows, q_rope into ``call.q``'s columns 512.., the key counts into ``call.seq_lens``) and this decode,
    on the same stream.

    Returns (out [batch, heads, 512] in ``call.out_dtype``, lse [batch, heads] float32 natural log, or None).
    """
    q = call.q
    batch, heads, _ = q.shape
    device = q.device
    out = torch.empty(batch, heads, KV_LORA_RANK, dtype=call.out_dtype, device=device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=device) if call.return_lse else None
    if batch == 0:
        return out, lse
    # batch and heads, the device (its multiprocessor count), table width, page size, the split request, the
    # softmax scale, the cache's scale, each operand's format and amax, the config
    key = (q.shape, device, call.block_table.shape[1], call.page_size, call.num_kv_splits, call.softmax_scale,
           call.kv_scale, call.k_qdq, call.k_amax, call.v_qdq, call.v_amax, call.p_qdq, call.p_amax,
           tuple(config.items()))
    plan = _PLANS.get(key)
    entry, parts, args, layer = plan if plan is not None else _plan(call, config, key)
    if parts is None:
        part_o = part_lse = None
    else:   # scratch of this call (a buffer kept across calls would be shared by streams and CUDA graphs)
        part_o = torch.empty(parts[0], dtype=torch.float32, device=device)
        part_lse = torch.empty(parts[1], dtype=torch.float32, device=device)
    if prep is not None:
        module.layer_decode(prep.q_src, prep.kv, prep.input_row_offsets, prep.cache_offsets, prep.freqs_cis,
                            prep.kv_norm_gamma, prep.epsilon, prep.rope_interleave, prep.sum_order,
                            q, call.latent_cache, call.block_table, call.seq_lens, out, lse, part_o, part_lse,
                            *args[:11], *layer)
        return out, lse
    getattr(module, entry)(q, call.latent_cache, call.block_table, call.seq_lens, out, lse, part_o, part_lse, *args)
    return out, lse
