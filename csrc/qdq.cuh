// qdq.cuh: the device rules of the decode kernels' K/V/P fake quantization (mla_core.numerics: FP8 E4M3 per
// tensor, NVFP4 blocks of 16 with E4M3 block scales and a per-tensor global scale), one definition shared by the
// mma.sync kernel (mla_decode.cu) and the WGMMA kernel (mla_decode_wgmma.cu). Quotients are correctly rounded
// (__fdiv_rn, or its division-free Markstein form), so every rounding decision matches the reference.
#pragma once

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

namespace mla_core_cuda {

// float32 -> E4M3, nearest even, saturating at +-448 (NaN stays NaN), back to float32.
__device__ __forceinline__ float round_e4m3(float x) {
  __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// Two float32 -> E4M3 by round_e4m3's rule, as an f16 pair (lo in the low half): the same conversion instruction
// as round_e4m3 (which converts (x, 0)), here on two values at once, and E4M3 -> f16 likewise (exact: every E4M3
// value is an f16 normal or zero, NaN stays NaN).
__device__ __forceinline__ __half2 round_e4m3x2(float lo, float hi) {
  const __nv_fp8x2_storage_t codes = __nv_cvt_float2_to_fp8x2(make_float2(lo, hi), __NV_SATFINITE, __NV_E4M3);
  return __half2(__nv_cvt_fp8x2_to_halfraw2(codes, __NV_E4M3));
}

// float32 -> E2M1 (+-{0, .5, 1, 1.5, 2, 3, 4, 6}), ties to the even code, saturating at 6. In [0, 2) the
// grid step is 0.5, in [2, 4) 1, above 2: scaling by the inverse step (exact) and adding 1.5 * 2^23 rounds
// to an integer with the adder's nearest-even rounding (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4).
__device__ __forceinline__ float round_e2m1(float x) {
  const float a = fabsf(x);
  const float inv_step = a < 2.f ? 2.f : (a < 4.f ? 1.f : 0.5f);
  const float step = a < 2.f ? 0.5f : (a < 4.f ? 1.f : 2.f);
  float r = __fsub_rn(__fadd_rn(__fmul_rn(a, inv_step), 12582912.f), 12582912.f) * step;
  r = r > 6.f ? 6.f : r;
  return x < 0.f ? -r : r;
}

// Correctly rounded x / s without a division, from inv_s = RN(1 / s): q0 = x * inv_s is within an ulp and one
// exact fma residual corrects it (Markstein's theorem; bitwise __fdiv_rn for the operand ranges of these
// quantizers). `exact_div` (per-tensor factors near float32's range ends, set by the host) takes __fdiv_rn.
__device__ __forceinline__ float div_rn(float x, float s, float inv_s, bool exact_div) {
  if (exact_div) return __fdiv_rn(x, s);
  const float q0 = __fmul_rn(x, inv_s);
  return __fmaf_rn(__fmaf_rn(-q0, s, x), inv_s, q0);
}

// The FP8 codes' quotient x / scale of the prefill (its pre-passes and Q's codes in its kernels), correctly rounded
// (__fdiv_rn's bits, as far as E4M3 sees them). kExact: the
// IEEE division (per-tensor factors outside the division-free range). Else Markstein: q0 = x·rscale (rscale =
// RN(1 / scale)) within an ulp, corrected by the exact residual fma(-q0, scale, x); where the correction's proof
// stops, q0 itself gives the same code: |q0| > 464 (the quotient > 448 or ±Inf / overflow: E4M3 saturates to
// ±448 either way; the corrected form would make Inf NaN) and |q0| < 2^-20 (the quotient below E4M3's 2^-10
// rounding edge: ±0 with x's sign, -0 kept, which the corrected form would make +0). NaN stays NaN.
template <bool kExact>
__device__ __forceinline__ float codes_quotient(float x, float scale, float rscale) {
  if constexpr (kExact) {
    return __fdiv_rn(x, scale);
  } else {
    const float q0 = __fmul_rn(x, rscale), a = fabsf(q0);
    const float q = __fmaf_rn(__fmaf_rn(-q0, scale, x), rscale, q0);
    return (a > 464.f || a < 0x1p-20f) ? q0 : q;
  }
}

// FP8 code of x: e4m3(x / scale) (the caller multiplies by scale).
__device__ __forceinline__ float fp8_code(float x, float scale, float inv_scale, bool exact_div) {
  return round_e4m3(div_rn(x, scale, inv_scale, exact_div));
}

// NVFP4 block code: e4m3(bmax / 6 / g); the block's dequantized scale is code * g.
__device__ __forceinline__ float nvfp4_block_code(float bmax, float g) {
  return round_e4m3(__fdiv_rn(__fdiv_rn(bmax, 6.f), g));
}

// A block's dequantized scale s = code * g and its reciprocal (1 where the block is all zero: its values are 0).
struct BlockScale {
  float code, s, inv_s;
};
__device__ __forceinline__ BlockScale nvfp4_code_scale(float code, float g) {
  const float s = code == 0.f ? 1.f : code * g;
  return {code, s, __frcp_rn(s)};
}
__device__ __forceinline__ BlockScale nvfp4_block_scale(float bmax, float g) {
  return nvfp4_code_scale(nvfp4_block_code(bmax, g), g);
}

// NVFP4 value without the global scale: e2m1(x / (code * g)) * code (0 where code is 0).
__device__ __forceinline__ float nvfp4_unscaled(float x, const BlockScale& b, bool exact_div) {
  return round_e2m1(div_rn(x, b.s, b.inv_s, exact_div)) * b.code;
}

// E2M1 rounding of a non-negative float32 (P's quotients in the prefill kernel): round_e2m1's rule (ties to the even
// code, saturating at 6, NaN stays NaN) in 5 instructions: x6 = min(x, 6) (min.NaN: NaN stays NaN; above 6 every
// result is 6), e = the power of two of max(x6, 1)'s binade (1, 2 or 4: its exponent bits), then adding m = 1.5 *
// 2^22 * e rounds x6 to that range's grid step e / 2 ([0, 2): 0.5, [2, 4): 1, [4, 6]: 2) with the adder's
// nearest-even rounding, and subtracting m is exact; both as fma(±e, 1.5 * 2^22, ·), whose exact product is m, so
// each is the one rounding of the sum. Equal to numerics.round_e2m1 on every non-negative float32 bit pattern
// (benchmarks/probes/e2m1_nonneg5_check.py, exhaustive; the 7-instruction select form before it:
// e2m1_nonneg_check.py).
__device__ __forceinline__ float round_e2m1_nonneg(float x) {
  float x6;
  asm("min.NaN.f32 %0, %1, 0f40C00000;\n" : "=f"(x6) : "f"(x));  // 0f40C00000 = 6
  const float e = __uint_as_float(__float_as_uint(fmaxf(x6, 1.f)) & 0x7f800000u);
  return __fmaf_rn(-e, 6291456.f, __fmaf_rn(e, 6291456.f, x6));
}

// round_e2m1_nonneg without its saturation (4 instructions: e = the power of two of max(x, 1)'s binade, now also 8, 16,
// ... above 8; the two fma as there), for P's quotients in the prefill kernel's kP 3, whose caller clamps each bf16
// pair at 6 after the pair conversion (min.NaN.bf16x2: one instruction for two values instead of one each). Above 6 the
// result here is >= 6 (x in (6, 8): a multiple of 2; x >= 8: >= e >= 8, or +Inf where the first fma overflows), so
// the clamp gives 6 as round_e2m1 does; <= 6 it is round_e2m1_nonneg's; NaN stays NaN. +Inf would give NaN (Inf - Inf):
// kP 3's quotients are never +Inf (P in [0, 1] or NaN, 1 / s <= 2^61 for the division-free range of g). With the bf16
// clamp equal to numerics.round_e2m1 on every non-negative float32 pattern but +Inf (e2m1_nosat_check.py, exhaustive).
__device__ __forceinline__ float round_e2m1_nonneg_unsat(float x) {
  const float e = __uint_as_float(__float_as_uint(fmaxf(x, 1.f)) & 0x7f800000u);
  return __fmaf_rn(-e, 6291456.f, __fmaf_rn(e, 6291456.f, x));
}

// RN(1 / s) for 2^-126 <= s < 2^126 (exponent field 1 .. 252): __frcp_rn's own fast path (MUFU.RCP, then the Newton
// step fma(r, fma(-s, r, 1), r): the bits of its FFMA s·r - 1, FADD.FTZ negation and FFMA, the residual never
// subnormal) without its range test, branch and slow path, which only s outside that range takes. P's block scales in the prefill kernel's kP 3: s = code * g in [2^-61, 2^69] (g in the division-free
// range [3.7e-16, 1.1e18], codes 2^-9 .. 448) or 1, or NaN (a NaN block: NaN here as there).
__device__ __forceinline__ float rcp_rn_in_range(float s) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(s));
  return __fmaf_rn(r, __fmaf_rn(-s, r, 1.f), r);
}

// The NVFP4 quotient x / s of a prefill operand (its pre-pass over Q / K / V and P in its kernel), as E2M1 sees it:
// kExact the IEEE division; else Markstein from inv_s = RN(1 / s) (div_rn's form), where the correction's proof
// stops q0 = x·inv_s itself gives the same E2M1 value: |q0| > 16 (the quotient > 6: saturates to 6, ±Inf included,
// which the corrected form would make NaN) and |q0| < 2^-20 (the quotient < 0.25: ±0 with x's sign). NaN stays NaN.
template <bool kExact>
__device__ __forceinline__ float nvfp4_quotient(float x, float s, float inv_s) {
  if constexpr (kExact) {
    return __fdiv_rn(x, s);
  } else {
    const float q0 = __fmul_rn(x, inv_s), a = fabsf(q0);
    const float q = __fmaf_rn(__fmaf_rn(-q0, s, x), inv_s, q0);
    return (a > 16.f || a < 0x1p-20f) ? q0 : q;
  }
}

// round_e2m1's rule on any float32 (the prefill's Q / K / V quotients) in 7 instructions instead of its select form's
// ~13: round_e2m1_nonneg of |x|, then round_e2m1's own sign select (x < 0: -r, so -0 and NaN give +0 / NaN as there).
// The magnitudes agree on all 2^31 non-negative float32 patterns (benchmarks/probes/e2m1_prepass_check.py,
// exhaustive), and the select is the same, so the bits agree on every float32.
__device__ __forceinline__ float round_e2m1_signed(float x) {
  const float r = round_e2m1_nonneg(fabsf(x));
  return x < 0.f ? -r : r;
}

// An NVFP4 value of the prefill without the global scale: e2m1(x / (code * g)) * code, exact in bf16 (an E2M1 value
// times an E4M3 code has at most 6 significant bits, 2^-10 .. 2688: benchmarks/probes/nvfp4_e4m3_representable.py).
template <bool kExact>
__device__ __forceinline__ float nvfp4_value(float x, const BlockScale& b) {
  return round_e2m1_signed(nvfp4_quotient<kExact>(x, b.s, b.inv_s)) * b.code;
}

// The maximum magnitude of a block's first n values, NaN (the canonical 0x7fffffff) if one of them is NaN: max.NaN
// (one FMNMX.NAN with |x| a value) keeps a NaN where fmaxf would drop it.
__device__ __forceinline__ float nvfp4_block_max(const float (&x)[16], int n) {
  float m = 0.f;
#pragma unroll
  for (int e = 0; e < 16; ++e)
    if (e < n) asm("max.NaN.f32 %0, %0, %1;\n" : "+f"(m) : "f"(fabsf(x[e])));
  return m;
}

// One NVFP4 block of 16 consecutive bf16 values of a row (8 words, value 2i in word i's low half), replaced in place
// by its values without the global scale g (nvfp4_value: exact in bf16, so the pack truncates nothing). The prefill's
// Q / K blocks along features: the pre-pass (mla_prefill_nvfp4.cu, rows_kernel) and the kernel's Q (q_nvfp4 of
// mla_prefill_wgmma.cu) both call this, so their values are the same bits.
template <bool kExact>
__device__ __forceinline__ void nvfp4_row_block(uint32_t (&w)[8], float g) {
  float x[16];
#pragma unroll
  for (int c = 0; c < 8; ++c) {
    x[2 * c] = __uint_as_float(w[c] << 16);
    x[2 * c + 1] = __uint_as_float(w[c] & 0xffff0000u);
  }
  const BlockScale bs = nvfp4_block_scale(nvfp4_block_max(x, 16), g);
#pragma unroll
  for (int c = 0; c < 8; ++c)
    w[c] = (__float_as_uint(nvfp4_value<kExact>(x[2 * c], bs)) >> 16) |
           (__float_as_uint(nvfp4_value<kExact>(x[2 * c + 1], bs)) & 0xffff0000u);
}

// nvfp4_block_code without a division instruction (P's blocks in the prefill kernel, g inside the division-free
// range, rg = RN(1 / g)): both quotients by div_rn (Markstein from the correctly rounded reciprocals RN(1 / 6) and rg:
// bitwise __fdiv_rn wherever the quotient is a float32 normal; a subnormal bmax / 6 is below 2^-126, so its code is 0
// either way for any g of the range, >= 2^-52).
__device__ __forceinline__ float nvfp4_block_code_div_free(float bmax, float g, float rg) {
  return round_e4m3(div_rn(div_rn(bmax, 6.f, 0x1.555556p-3f, false), g, rg, false));
}

// P's E2M1 value in the prefill kernel (P >= 0, finite unless a score is NaN; the block scale from
// nvfp4_code_scale): e2m1(p / s) with div_rn's quotient (the decode kernels' P rule) and the non-negative rounding;
// the kernel multiplies it by the block's code in bf16 (exact, as nvfp4_value's product).
template <bool kExact>
__device__ __forceinline__ float nvfp4_p_e2m1(float p, const BlockScale& b) {
  return round_e2m1_nonneg(div_rn(p, b.s, b.inv_s, kExact));
}

}  // namespace mla_core_cuda
