"""Device-side fake-quant rounding for the Triton kernels (shared by decode and prefill).

Every function is exact on the GPU and under ``TRITON_INTERPRET=1`` alike: E4M3 and E2M1 rounding use
integer/bit arithmetic and comparisons (the interpreter's fp8 and bf16 casts round wrongly; see
docs/testing.md, "The Triton interpreter"), and divisions that feed a rounding are correctly rounded (``div_rn``, or
for the NVFP4 elements the per-block reciprocal plus one Markstein correction, which gives the same
bits: see ``div_by_block_scale``). Constants mirror :mod:`mla_core.numerics` (E4M3_MAX 448, E2M1_MAX 6,
blocks of 16).

"Unscaled" results leave the per-tensor scale out (FP8 codes ``e4m3(x / s)``; NVFP4 ``e2m1 * e4m3
block code``): such values are exact in bf16 and fp16, so the dot products run on tensor cores and
the caller applies the per-tensor scale to its fp32 accumulator.
"""
import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)
E2M1_MAX = tl.constexpr(6.0)
INV_6 = tl.constexpr(0.16666667163372040)  # float32 RN(1/6), for the Markstein-corrected bmax / 6


@triton.jit
def round_e4m3(y, HW_CVT: tl.constexpr):
    """float32 -> float32 rounded to E4M3, nearest even, saturating at ±448; NaN stays NaN.

    ``HW_CVT``: the hardware cvt (GPU only: ``F2FP.SATFINITE.E4M3`` in the SASS, two elements per
    instruction, round to nearest even, saturating to ±448, NaN stays NaN, so no clamp or NaN test is
    needed); else bit arithmetic (exact anywhere).
    """
    if HW_CVT:
        return y.to(tl.float8e4nv).to(tl.float32)
    else:
        c = tl.minimum(tl.maximum(y, -E4M3_MAX), E4M3_MAX)
        a = tl.abs(c)
        expo = ((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
        # spacing of E4M3 values around a: 2^(e-3) for normals, 2^-9 below the normal range (2^-6)
        qexp = tl.maximum(expo - 3, -9)
        quantum = ((qexp + 127) << 23).to(tl.float32, bitcast=True)
        inv_quantum = ((127 - qexp) << 23).to(tl.float32, bitcast=True)
        t = a * inv_quantum  # exact (power-of-two scaling), 0 <= t < 16
        whole = t.to(tl.int32)
        frac = t - whole.to(tl.float32)
        up = (frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))
        r = (whole + up.to(tl.int32)).to(tl.float32) * quantum
        r = tl.where(c < 0, -r, r)
        return tl.where(y != y, y, r)


@triton.jit
def round_e2m1(y):
    """float32 -> float32 rounded to E2M1 (±{0, .5, 1, 1.5, 2, 3, 4, 6}), ties to the even code, saturating;
    NaN stays NaN. ~10 instructions (a chain of 7 midpoint comparisons costs ~18).

    In [0, 2) the E2M1 grid has step 0.5, in [2, 4) step 1, from 4 step 2 (then 6 saturates): scaling by
    the inverse step and adding 1.5 * 2^23 rounds to an integer, nearest even (the fp32 adder's own
    rounding), so ties land on the even code exactly as the contract says (0.25->0, 0.75->1, 2.5->2, 5->4).
    """
    a = tl.abs(y)
    small = a < 2.0
    mid = a < 4.0
    inv_step = tl.where(small, 2.0, tl.where(mid, 1.0, 0.5))
    step = tl.where(small, 0.5, tl.where(mid, 1.0, 2.0))
    r = ((a * inv_step + 12582912.0) - 12582912.0) * step  # power-of-two scalings: exact
    r = tl.where(r > E2M1_MAX, E2M1_MAX, r)  # a NaN compares false and stays NaN
    return tl.where(y < 0, -r, r)


@triton.jit
def div_by_block_scale(x, s, inv_s, FMA: tl.constexpr):
    """Correctly rounded ``x / s`` (bitwise ``div_rn``) from ``inv_s = div_rn(1, s)`` without a division.

    Markstein: ``q0 = x * inv_s`` is within one ulp of x / s and ``inv_s`` within half an ulp of 1 / s, so
    with the exact residual ``e = x - q0 * s`` (one fma) ``q0 + e * inv_s`` rounds to the correctly rounded
    quotient (Muller et al., Handbook of Floating-Point Arithmetic, "Markstein's theorem"; no underflow or
    overflow here: s >= 2^-9 g and |x / s| <= ~7). ``FMA``: hardware fma (GPU); else the interpreter, whose
    fma rounds twice, takes the residual in float64 (exact: 24 x 24-bit product).
    """
    q0 = x * inv_s
    if FMA:
        e = tl.fma(-q0, s, x)
        return tl.fma(e, inv_s, q0)
    else:
        e = (x.to(tl.float64) - q0.to(tl.float64) * s.to(tl.float64)).to(tl.float32)
        return (q0.to(tl.float64) + e.to(tl.float64) * inv_s.to(tl.float64)).to(tl.float32)


@triton.jit
def fp8_unscaled(x, scale, HAS_SCALE: tl.constexpr, HW_CVT: tl.constexpr):
    """FP8 codes ``e4m3(clamp(x / scale, ±448))`` of a float32 tile (the caller multiplies by ``scale``)."""
    if HAS_SCALE:
        x = tl.math.div_rn(x, tl.zeros_like(x) + scale)
    return round_e4m3(x, HW_CVT)


@triton.jit
def nvfp4_unscaled(x, g, inv_g, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, G_POW2: tl.constexpr,
                   HW_CVT: tl.constexpr):
    """NVFP4 QDQ of a float32 [ROWS, COLS] tile in blocks of 16 along ``AXIS``, without the global scale ``g``.

    Returns ``e2m1(x / s) * code`` with ``code = e4m3(max|block| / 6 / g)`` and ``s = code * g`` (0 where
    code is 0); times ``g`` it is the contract's QDQ value. Blocks start at index 0 of the tile, so the
    caller aligns tiles to absolute block positions; padding must be 0 (it never raises a block max).
    No per-element division (~18 fp32 instructions per element on sm_90 instead of ~33 with ``div_rn``):
    one ``div_rn`` per block for ``1 / s``, then per element the Markstein-corrected quotient (bitwise
    ``div_rn``, see ``div_by_block_scale``) and the E2M1 rounding by magic-number addition. ``G_POW2``:
    ``g`` is a power of two (``amax`` None) and ``inv_g = 1 / g``, so ``/ g`` is an exact multiplication.
    """
    if AXIS == 1:
        xb = tl.reshape(x, (ROWS, COLS // 16, 16))
        bmax = tl.max(tl.abs(xb), axis=2)
    else:
        xb = tl.reshape(x, (ROWS // 16, 16, COLS))
        bmax = tl.max(tl.abs(xb), axis=1)
    per6 = div_by_block_scale(bmax, tl.full(bmax.shape, 6.0, tl.float32), tl.full(bmax.shape, INV_6, tl.float32),
                              HW_CVT)  # = div_rn(bmax, 6)
    if G_POW2:
        code = round_e4m3(per6 * inv_g, HW_CVT)  # power-of-two scaling: exact, = div_rn(per6, g)
    else:
        code = round_e4m3(tl.math.div_rn(per6, tl.zeros_like(bmax) + g), HW_CVT)
    s = tl.where(code == 0, 1.0, code * g)  # a zero block stays 0 (x is 0 there), with no 0/0
    inv_s = tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s)
    if AXIS == 1:
        code3 = tl.broadcast_to(code[:, :, None], (ROWS, COLS // 16, 16))
        s3 = tl.broadcast_to(s[:, :, None], (ROWS, COLS // 16, 16))
        inv3 = tl.broadcast_to(inv_s[:, :, None], (ROWS, COLS // 16, 16))
    else:
        code3 = tl.broadcast_to(code[:, None, :], (ROWS // 16, 16, COLS))
        s3 = tl.broadcast_to(s[:, None, :], (ROWS // 16, 16, COLS))
        inv3 = tl.broadcast_to(inv_s[:, None, :], (ROWS // 16, 16, COLS))
    q = round_e2m1(div_by_block_scale(xb, s3, inv3, HW_CVT)) * code3
    return tl.reshape(q, (ROWS, COLS))


@triton.jit
def round_bf16_rne(x):
    """float32 -> float32 rounded to bfloat16, nearest even (finite inputs; exact in the interpreter too)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def split3_bf16(x):
    """Split float32 x exactly into bf16 parts ``hi + mid + lo`` (8 significant bits each, by truncation)."""
    hi = (x.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    r = x - hi
    mid = (r.to(tl.int32, bitcast=True) & -65536).to(tl.float32, bitcast=True)
    lo = r - mid
    return hi.to(tl.bfloat16), mid.to(tl.bfloat16), lo.to(tl.bfloat16)
