"""Device-side fake-quant rounding for the Triton kernels (shared by decode and prefill).

Every function is exact on the GPU and under ``TRITON_INTERPRET=1`` alike: E4M3 and E2M1 rounding use
integer/bit arithmetic and comparisons (the interpreter's fp8 and bf16 casts round wrongly; see
shared/DESIGN.md, "Tests"), and divisions that feed a rounding use ``div_rn`` (``/`` is approximate
on the GPU). Constants mirror :mod:`mla_core.numerics` (E4M3_MAX 448, E2M1_MAX 6, blocks of 16).

"Unscaled" results leave the per-tensor scale out (FP8 codes ``e4m3(x / s)``; NVFP4 ``e2m1 * e4m3
block code``): such values are exact in bf16 and fp16, so the dot products run on tensor cores and
the caller applies the per-tensor scale to its fp32 accumulator.
"""
import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)
E2M1_MAX = tl.constexpr(6.0)


@triton.jit
def round_e4m3(y, HW_CVT: tl.constexpr):
    """float32 -> float32 rounded to E4M3, nearest even, saturating at ±448; NaN stays NaN.

    ``HW_CVT``: use the hardware cvt (GPU only: RNE, saturating); else bit arithmetic (exact anywhere).
    """
    c = tl.minimum(tl.maximum(y, -E4M3_MAX), E4M3_MAX)
    if HW_CVT:
        r = c.to(tl.float8e4nv).to(tl.float32)
    else:
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
    """float32 -> float32 rounded to E2M1 (±{0, .5, 1, 1.5, 2, 3, 4, 6}), ties to the even code, saturating."""
    a = tl.abs(y)
    # thresholds are midpoints; <= sends a tie to the even code below, < to the even code above
    r = tl.where(a <= 0.25, 0.0,
        tl.where(a < 0.75, 0.5,
        tl.where(a <= 1.25, 1.0,
        tl.where(a < 1.75, 1.5,
        tl.where(a <= 2.5, 2.0,
        tl.where(a < 3.5, 3.0,
        tl.where(a <= 5.0, 4.0, 6.0)))))))
    r = tl.where(y < 0, -r, r)
    return tl.where(y != y, y, r)


@triton.jit
def fp8_unscaled(x, scale, HAS_SCALE: tl.constexpr, HW_CVT: tl.constexpr):
    """FP8 codes ``e4m3(clamp(x / scale, ±448))`` of a float32 tile (the caller multiplies by ``scale``)."""
    if HAS_SCALE:
        x = tl.math.div_rn(x, tl.zeros_like(x) + scale)
    return round_e4m3(x, HW_CVT)


@triton.jit
def nvfp4_unscaled(x, g, ROWS: tl.constexpr, COLS: tl.constexpr, AXIS: tl.constexpr, HW_CVT: tl.constexpr):
    """NVFP4 QDQ of a float32 [ROWS, COLS] tile in blocks of 16 along ``AXIS``, without the global scale ``g``.

    Returns ``e2m1(x / s) * code`` with ``code = e4m3(max|block| / 6 / g)`` and ``s = code * g`` (0 where
    code is 0); times ``g`` it is the contract's QDQ value. Blocks start at index 0 of the tile, so the
    caller aligns tiles to absolute block positions; padding must be 0 (it never raises a block max).
    """
    if AXIS == 1:
        xb = tl.reshape(x, (ROWS, COLS // 16, 16))
        bmax = tl.max(tl.abs(xb), axis=2)
        code = round_e4m3(tl.math.div_rn(tl.math.div_rn(bmax, tl.zeros_like(bmax) + E2M1_MAX),
                                         tl.zeros_like(bmax) + g), HW_CVT)
        code3 = tl.broadcast_to(code[:, :, None], (ROWS, COLS // 16, 16))
    else:
        xb = tl.reshape(x, (ROWS // 16, 16, COLS))
        bmax = tl.max(tl.abs(xb), axis=1)
        code = round_e4m3(tl.math.div_rn(tl.math.div_rn(bmax, tl.zeros_like(bmax) + E2M1_MAX),
                                         tl.zeros_like(bmax) + g), HW_CVT)
        code3 = tl.broadcast_to(code[:, None, :], (ROWS // 16, 16, COLS))
    scale3 = tl.where(code3 == 0, 1.0, code3 * g)  # a zero block stays 0 (x is 0 there), with no 0/0
    q = round_e2m1(tl.math.div_rn(xb, scale3)) * code3
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
