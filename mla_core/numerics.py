"""The one definition of mla_core's numerics (docs/numerics.md).

Every backend computes the function these helpers define; kernels re-implement the same rounding
on the device but take their constants from here, and every test compares against these helpers.
All helpers work on any device and return float32 tensors (the carrier), never low-precision dtypes.

Formats
    "fp8":   FP8 E4M3, per-tensor scale ``amax / 448`` (amax None -> scale 1.0), round to nearest even.
    "nvfp4": E2M1 values in blocks of 16 along one axis, each block with an E4M3 scale, and a global
             scale ``g = amax / (6 * 448)`` (amax None -> g = 1.0).
"""
from __future__ import annotations

import torch

QUANT_FORMATS = ("fp8", "nvfp4")
"""Fake-quant formats every quantized argument accepts (besides None)."""

E4M3_MAX = 448.0
"""Largest finite FP8 E4M3 (fn) magnitude."""
E2M1_MAX = 6.0
"""Largest E2M1 magnitude."""
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Non-negative E2M1 values, by code (code 0..7)."""
NVFP4_BLOCK = 16
"""Elements per NVFP4 block (along the quantized axis)."""

QUANT_RECIPES = {"bf16": None, "fp8": "fp8", "nvfp4": "nvfp4"}
"""Quant recipe (the CLI's, warm-up's and benchmarks' name) -> the format it fake-quantizes (see recipe_quant)."""

DECODE_P_TILE = 32
"""Keys per P tile in decode: the running max is updated once per 32-key tile at absolute positions."""
DEFAULT_PREFILL_BLOCK_N = 64
"""Default prefill key tile (``block_n``), which is also prefill's P tile."""
MAX_KV_SPLITS = 128
"""Largest decode split count (``num_kv_splits`` is 1..128). 128, not 32 (before issue 9): at batch 1 the cuda
WGMMA decode runs one CTA per SM per (64-head group, split), so 32 splits kept 32 of a 132-SM GPU's SMs busy at 16
heads and 64 at 128 heads on a memory-bound problem; ``"auto"`` (:func:`specs.decode_num_splits`) wants
``sm_count // (batch * head_groups)`` (132 / 66 there). The split schedule is unchanged (tile-aligned, ceil of the
32-key tiles over the splits); only the cap moved. The sparse decode keeps its own cap (32)."""
FP8_MMA_LSE_RTOL = 1e-3
"""LSE tolerance, relative to the largest reference |LSE|, of a kernel that computes the scores with FP8 MMA (the cuda
prefill's ``{"mma": "fp8"}``): ``|LSE - LSE_ref| <= 1e-4 + FP8_MMA_LSE_RTOL * max|LSE_ref|`` (the out tolerance is
unchanged). Hopper's FP8 tensor cores add their e4m3 products with reduced precision (~1e-3 relative on 64-long
dots, truncating toward zero), so the scores shrink by a fraction of their own size and the LSE, which follows the
largest score, moves in proportion to it: an absolute bound would fail at large |LSE| (~25 for MLA's scales) for a
correct kernel. The codes themselves (Q, K, V, P) are the recipe's, bit for bit."""
KEYS_AS_M_F32_RTOL = {torch.bfloat16: 3e-3, torch.float16: 1e-3}
"""Relative-L2 tolerance, by q's dtype, of float32 decode outputs of the cuda keys-as-M kernel for a bf16 / fp16 cache
(``{"kernel": "keys_m"}``) against the reference: its two consumer warpgroups keep their own running maxima (one
per 64-key step), so the P of the one that did not see a row's maximum is rounded to q's dtype at another scale than
the reference's per-32-key-tile one (independent roundings over about half the keys: 1.3-1.9e-3 with bf16 P in a
float64 emulation, 1.1-1.5e-3 measured on the H200). bf16 outputs keep the 1e-2 every kernel has."""


def check_format(fmt: str | None) -> None:
    """Raise ValueError unless ``fmt`` is None or one of :data:`QUANT_FORMATS`."""
    if fmt is not None and fmt not in QUANT_FORMATS:
        raise ValueError(f"unknown quant format {fmt!r} (supported: None, 'fp8', 'nvfp4')")


def recipe_quant(recipe: str, op: str) -> dict[str, str | None]:
    """The fake-quantization keywords of ``op`` under ``recipe`` (a QUANT_RECIPES name), as the op and its problem
    key name them: decode quantizes K, V and P (``k_qdq`` ...; the absorbed query is not quantized by the op),
    prefill Q, K, V and P (``q_quant`` ...; FP8 attention kernels take Q, K and V in FP8 alike)."""
    fmt = QUANT_RECIPES[recipe]
    if op == "decode":
        return {"k_qdq": fmt, "v_qdq": fmt, "p_qdq": fmt}
    if op == "prefill":
        return {"q_quant": fmt, "k_quant": fmt, "v_quant": fmt, "p_quant": fmt}
    raise ValueError(f"op: quant recipes apply to decode and prefill, not {op!r}")


def fp8_scale(amax: float | None) -> float:
    """Per-tensor FP8 scale: ``amax / 448``; 1.0 when amax is None."""
    return 1.0 if amax is None else float(amax) / E4M3_MAX


def nvfp4_global_scale(amax: float | None) -> float:
    """NVFP4 global scale ``g = amax / (6 * 448)``; 1.0 when amax is None."""
    return 1.0 if amax is None else float(amax) / (E2M1_MAX * E4M3_MAX)


def divide(x: torch.Tensor, d: float) -> torch.Tensor:
    """``x / d`` correctly rounded in float32 on every device, ``d`` rounded to float32 first.

    PyTorch's CUDA division by a host scalar multiplies by its reciprocal (``x * (1/d)``), which is off
    by an ulp often enough to flip rounding ties (seen on the H200: 0.6% of NVFP4 V codes with a
    calibrated amax); a divisor tensor on x's device takes the IEEE division path everywhere (filled
    there, so no host-to-device copy).
    """
    return x / torch.full((), d, dtype=torch.float32, device=x.device)


def round_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to FP8 E4M3, nearest even, saturating at ±448 (NaN stays NaN)."""
    x = x.float()
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def round_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round float32 values to E2M1, nearest with ties to the even code, saturating at ±6.

    Ties: 0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4. NaN stays NaN.
    """
    x = x.float()
    a = x.abs()
    # Each threshold is the midpoint between neighbouring values; <= sends the tie down (even code
    # below), < sends it up (even code above).
    r = torch.where(a <= 0.25, 0.0,
        torch.where(a < 0.75, 0.5,
        torch.where(a <= 1.25, 1.0,
        torch.where(a < 1.75, 1.5,
        torch.where(a <= 2.5, 2.0,
        torch.where(a < 3.5, 3.0,
        torch.where(a <= 5.0, 4.0, 6.0)))))))
    r = torch.copysign(r, x)
    return torch.where(torch.isnan(x), x, r)


def qdq_fp8(x: torch.Tensor, amax: float | None = None) -> torch.Tensor:
    """FP8 E4M3 per-tensor fake quantization: ``e4m3(clamp(x / s, ±448)) * s`` with ``s = amax / 448``.

    Args: x any shape, any float dtype; amax per-tensor amax (None -> s = 1.0).
    Returns: float32 tensor of x's shape.
    """
    s = fp8_scale(amax)
    return round_e4m3(divide(x.float(), s)) * s


def nvfp4_block_codes(x: torch.Tensor, amax: float | None = None, dim: int = -1) -> torch.Tensor:
    """NVFP4 block codes ``c = e4m3(max|x_block| / 6 / g)`` along ``dim`` (E4M3 values as float32; the block's
    dequantized scale is ``c * g``).

    Blocks are 16 consecutive elements from index 0; a last partial block (the open tail) holds only
    the elements that exist. Returns float32, x's shape with ``dim`` replaced by ceil(n / 16).
    A block holding a NaN gets a NaN code.
    """
    g = nvfp4_global_scale(amax)
    xt = x.float().movedim(dim, -1)
    n = xt.shape[-1]
    nb = -(-n // NVFP4_BLOCK)
    pad = nb * NVFP4_BLOCK - n
    if pad:
        xt = torch.nn.functional.pad(xt, (0, pad))  # zeros never raise a block maximum
    blocks = xt.reshape(*xt.shape[:-1], nb, NVFP4_BLOCK)
    bmax = blocks.abs().amax(dim=-1)
    bmax = torch.where(torch.isnan(blocks).any(dim=-1), float("nan"), bmax)
    return round_e4m3(divide(divide(bmax, E2M1_MAX), g)).movedim(-1, dim)


def nvfp4_block_scales(x: torch.Tensor, amax: float | None = None, dim: int = -1) -> torch.Tensor:
    """Dequantized NVFP4 block scales ``s = e4m3(max|x_block| / 6 / g) * g`` along ``dim``: the codes of
    :func:`nvfp4_block_codes` times g in float32. A block holding a NaN gets a NaN scale."""
    return nvfp4_block_codes(x, amax, dim) * nvfp4_global_scale(amax)


def _nvfp4_blocks(x: torch.Tensor, amax: float | None, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(e2m1(x / s), c, s), each of x's shape: the E2M1 value of every element and its block's code ``c``
    (:func:`nvfp4_block_codes`) and dequantized scale ``s = c * g`` repeated over the block; ``e2m1`` is taken
    against 1 where s == 0 (the callers write 0 there)."""
    n = x.shape[dim]
    c = nvfp4_block_codes(x, amax, dim)
    c_full = c.movedim(dim, -1).repeat_interleave(NVFP4_BLOCK, dim=-1)[..., :n].movedim(-1, dim)
    s_full = c_full * nvfp4_global_scale(amax)
    e = round_e2m1(x.float() / torch.where(s_full == 0, 1.0, s_full))
    return e, c_full, s_full


def qdq_nvfp4(x: torch.Tensor, amax: float | None = None, dim: int = -1) -> torch.Tensor:
    """NVFP4 fake quantization along ``dim``: ``e2m1(x / s) * s`` per 16-block (0 where s == 0).

    Args: x any shape, any float dtype; amax per-tensor amax (None -> g = 1.0); dim the blocked axis.
    Returns: float32 tensor of x's shape. A block holding a NaN becomes all NaN.
    """
    e, _, s_full = _nvfp4_blocks(x, amax, dim)
    return torch.where(s_full == 0, 0.0, e * s_full)


def nvfp4_unscaled(x: torch.Tensor, amax: float | None = None, dim: int = -1) -> torch.Tensor:
    """NVFP4 values without the global scale: ``e2m1(x / s) * c`` per 16-block (s and c as :func:`qdq_nvfp4` and
    :func:`nvfp4_block_codes` take them; 0 where s == 0). An E2M1 value times an E4M3 code has at most 6 significant
    bits in 2^-10 .. 2688, so every result is exact in bf16 and f16 (not in E4M3); ``nvfp4_unscaled(x) * g`` is
    :func:`qdq_nvfp4` up to one float32 rounding (qdq_nvfp4 rounds ``c * g`` first). What the cuda prefill's nvfp4
    pre-pass writes (g folded into the kernel's scales; docs/numerics.md).

    Returns: float32 tensor of x's shape. A block holding a NaN becomes all NaN.
    """
    e, c_full, s_full = _nvfp4_blocks(x, amax, dim)
    return torch.where(s_full == 0, 0.0, e * c_full)


def qdq(x: torch.Tensor, fmt: str | None, amax: float | None = None, dim: int = -1) -> torch.Tensor:
    """Fake-quantize ``x`` in ``fmt`` (None: return x as float32 unchanged); NVFP4 blocks along ``dim``."""
    if fmt is None:
        return x.float()
    if fmt == "fp8":
        return qdq_fp8(x, amax)
    if fmt == "nvfp4":
        return qdq_nvfp4(x, amax, dim)
    check_format(fmt)
    raise AssertionError("unreachable")


def qdq_p(p: torch.Tensor, fmt: str | None, amax: float, v_dtype: torch.dtype, dim: int = -1) -> torch.Tensor:
    """Quantize unnormalized softmax probabilities P for the P·V product.

    None: P rounded to V's dtype. "fp8": per-tensor FP8 of the float32 P. "nvfp4": P first rounded to
    V's dtype, then NVFP4 in blocks of 16 keys along ``dim`` (blocks at absolute key positions: the
    caller passes P tiles that start at a multiple of 16). Returns float32.
    """
    if fmt is None:
        return p.to(v_dtype).float()
    if fmt == "fp8":
        return qdq_fp8(p, amax)
    return qdq_nvfp4(p.to(v_dtype), amax, dim)


FP8_CACHE_DTYPE = torch.float8_e4m3fn
"""Dtype of an FP8 latent cache: E4M3 codes with one per-tensor ``kv_scale`` (docs/numerics.md, "FP8 KV cache")."""


def fp8_cache_values(codes: torch.Tensor, kv_scale: float) -> torch.Tensor:
    """The values an FP8 latent cache holds: ``float32(code) * float32(kv_scale)``, one float32 rounding.

    Args: codes any shape, float8_e4m3fn (or already float32 code values); kv_scale the per-tensor scale.
    Returns: float32 tensor of codes' shape.
    """
    return codes.float() * torch.full((), kv_scale, dtype=torch.float32, device=codes.device)


def decode_value_dtype(cache_dtype: torch.dtype, q_dtype: torch.dtype) -> torch.dtype:
    """The dtype decode's P is rounded to without ``p_qdq`` (V's dtype in the dot): the cache's dtype, or
    q's dtype (bf16 / fp16) over an FP8 cache, whose codes enter the P·V dot exactly in q's dtype."""
    return q_dtype if cache_dtype == FP8_CACHE_DTYPE else cache_dtype


def decode_tiles_per_split(seq_len: int, num_kv_splits: int) -> int:
    """``ceil(ceil(L / 32) / num_kv_splits)``: 32-key tiles per decode split (0 when L == 0)."""
    return -(-(-(-seq_len // DECODE_P_TILE)) // num_kv_splits)


def decode_split_bounds(seq_len: int, num_kv_splits: int) -> list[tuple[int, int]]:
    """Key ranges ``[lo, hi)`` of the decode splits for one request; empty splits are left out.

    Split i covers ``[32*i*t, min(32*(i+1)*t, L))`` with ``t = decode_tiles_per_split(L, splits)``.
    """
    t = decode_tiles_per_split(seq_len, num_kv_splits)
    bounds = []
    for i in range(num_kv_splits):
        lo, hi = DECODE_P_TILE * i * t, min(DECODE_P_TILE * (i + 1) * t, seq_len)
        if lo < hi:
            bounds.append((lo, hi))
    return bounds


def merge_lse(lse_a: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """``log(exp(a) + exp(b))`` elementwise, with -inf + -inf = -inf (float32)."""
    return torch.logaddexp(lse_a.float(), lse_b.float())


def empty_state_lse(lse: torch.Tensor) -> torch.Tensor:
    """An attention state's LSE as merging reads it: +inf becomes -inf (float32).

    mla_core gives a row with no key LSE -inf; FlashAttention, FlashMLA and vLLM give it +inf, and
    vLLM's merge reads +inf as an empty state. ``merge_attn_states`` accepts both: either marks a state
    that contributes nothing to the merge.
    """
    lse = lse.float()
    return torch.where(lse == float("inf"), float("-inf"), lse)


def sink_factor(lse: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention-sink weight of a row: ``1 / (1 + exp(sink - lse)) = sigmoid(lse - sink)``, float32.

    lse [tokens, heads] (natural log; -inf gives 0), sinks [heads]. The row's output is multiplied by it (a sink is
    one more key with score ``sink`` and a zero value).
    """
    return torch.sigmoid(lse.float() - sinks.float()[None, :])


def bucket_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1): how batch sizes and lengths are bucketed in keys."""
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()

