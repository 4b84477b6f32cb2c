"""Device-side FP8 E4M3 helpers shared by the rope and sparse kernels, exact on the GPU and under the interpreter.

FP8 tensors travel as ``uint8`` views (the Triton interpreter has no FP8 storage type, and its float32 ->
fp8 cast rounds wrongly). ``HW``: on the GPU the hardware converts (``cvt.rn.satfinite.e4m3x2.f32``: round to
nearest even, saturating at ±448, NaN kept; E4M3 -> bf16 is exact); else integer arithmetic does the same
exactly. Constants mirror :mod:`mla_core.numerics` (E4M3_MAX 448).
"""
import triton
import triton.language as tl

E4M3_MAX = tl.constexpr(448.0)


@triton.jit
def round_e4m3(y):
    """float32 -> float32 rounded to E4M3, nearest even, saturating at ±448; NaN stays NaN (bit arithmetic)."""
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
    # the sign as a bit: a value that rounds to zero keeps it (-0.0, as the hardware cast gives; triton 3.6's
    # interpreter negates 0.0 to +0.0)
    sign = (c.to(tl.int32, bitcast=True) >> 31) << 31
    r = (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(y != y, y, r)


@triton.jit
def e4m3_value_bits(r):
    """float32 holding an E4M3 value (or NaN) -> its E4M3 code as int32 0..255 (exact)."""
    bits = r.to(tl.int32, bitcast=True)
    sign = (bits >> 24) & 0x80
    a = bits & 0x7FFFFFFF
    biased = (a >> 23) - 120  # E4M3 exponent bias 7: 127 - 7
    normal = (biased << 3) | ((a >> 20) & 7)
    sub = (tl.abs(r) * 512.0).to(tl.int32)  # subnormals are multiples of 2^-9
    code = tl.where(biased >= 1, normal, sub)
    code = tl.where(r != r, 0x7F, code)
    return code | sign


@triton.jit
def to_e4m3_bits(y, HW: tl.constexpr):
    """float32 -> uint8 E4M3 code of ``y`` (nearest even, saturating at ±448, NaN kept)."""
    if HW:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        return e4m3_value_bits(round_e4m3(y)).to(tl.uint8)


@triton.jit
def e4m3_bits_to_f32(b):
    """uint8 / int32 E4M3 codes -> their float32 values (exact bit arithmetic)."""
    b = b.to(tl.int32)
    e = (b >> 3) & 15
    m = b & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
    f = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
    f = tl.where((e == 15) & (m == 7), (b * 0 + 0x7FC00000).to(tl.float32, bitcast=True), f)  # 0x7F / 0xFF: NaN
    return tl.where((b & 0x80) != 0, -f, f)


@triton.jit
def e4m3_bits_to_dot(b, HW: tl.constexpr):
    """uint8 E4M3 codes -> exact dot operands: bf16 on the GPU, float32 under the interpreter (whose bf16 dot
    multiplies raw bit patterns)."""
    if HW:
        return b.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
    else:
        return e4m3_bits_to_f32(b)


@triton.jit
def round_bf16_rne(x):
    """float32 -> float32 rounded to bfloat16, nearest even (finite inputs; the interpreter's cast truncates)."""
    bits = x.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def to_dot_bf16(x, HW: tl.constexpr):
    """float32 -> the bf16-rounded dot operand: bf16 on the GPU, its exact float32 value under the interpreter."""
    if HW:
        return x.to(tl.bfloat16)
    else:
        return round_bf16_rne(x)


@triton.jit
def bf16_out(x, HW: tl.constexpr):
    """float32 -> bf16 output values, nearest even on the GPU and under the interpreter alike."""
    if HW:
        return x.to(tl.bfloat16)
    else:
        return round_bf16_rne(x).to(tl.bfloat16)


@triton.jit
def mma(a, b, acc, HW: tl.constexpr):
    """acc + a @ b, float32 accumulation (bf16 tensor cores on the GPU; exact float32 under the interpreter)."""
    if HW:
        return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, input_precision="ieee")
