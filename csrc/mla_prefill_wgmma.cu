// Varlen MLA prefill on Hopper WGMMA (sm_90a) at MLA's prefill shapes: bf16 q / k [tokens, heads, 192] (128 + 64
// RoPE), v [tokens, heads, 128], cu_seqlens, causal (bottom-right: queries are the suffix of their key span) or not,
// GQA (query head h reads kv head h / (heads / kv_heads)), LSE [heads, total_q]. Numerics: docs/numerics.md, the
// reference backend's prefill: 64-key P tiles at absolute key positions (block_n 64), the running maximum updated
// once per tile, P = 2^(s·scale·log2 e - m) rounded to bf16 (or to FP8 E4M3 codes of P / p_scale, p_fmt 1-2, or to
// NVFP4 values without the global scale, p_fmt 3-4: p_nvfp4) for
// P·V, the row sum of the float32 P, O = Σ_t 2^(m_t - m_last) P_t·V_t / l, LSE = (m + log2 l)·ln 2; up to float32
// arithmetic (ex2.approx, wgmma summation order). Fake-quantized K / V arrive as FP8 codes in bf16 (exact;
// launch_fp8_codes_bf16 below, one launch for both), Q's codes are made in shared memory by each consumer
// warpgroup from its loaded rows (q_fmt; the same function), the per-tensor factors folded into scale_log2 and
// out_scale. NVFP4 (the pre-pass mla_prefill_nvfp4.cu for K / V): Q's values likewise in the P-NVFP4 instances
// (q_fmt 3 / 4, q_nvfp4).
//
// Schedule (FlashAttention-3's structure; measured as variant TMA / TMX8 of benchmarks/probes/prefill_wgmma_probe.cu):
// one CTA of 384 threads per (128 query rows, head, sequence), longest (causal) blocks first:
//   - producer warp 8 (warps 9-11 exit after setmaxnreg): lane 0 loads Q [128 x 192] once and each 64-key tile's
//     K [64 x 192] and V [64 x 128] by TMA (3D tensor maps (d, heads, tokens), one box per 128-byte slab with the
//     128-byte swizzle) into a 4-stage ring, completing on the full barriers with expect_tx. Rows past the tensors'
//     end land as zeros; rows past a sequence's end inside them are the next sequence's: K's are masked to -inf
//     before the maximum, and V's rows of the tile holding the sequence's last key (the CTA's last tile) are zeroed
//     by warp 8 after they land and before the consumers read them (P = 0 there, but 0 · Inf = NaN);
//   - consumer warpgroups 0 and 1 (rows 0-63 / 64-127 of the block) take turns on the tensor cores (ping-pong):
//     a turn issues S(j) = Q·K(j)ᵀ (12 x wgmma m64n64k16, both from shared memory) and P(j-1)·V(j-1) (4 x
//     m64n128k16, P from registers: the S accumulator converts in place; V read MN-major), so one warpgroup's
//     softmax runs under the other's wgmmas and under its own P·V.
//
// Synchronization (checked over every interleaving by benchmarks/probes/prefill_wgmma_emulation.py, TMA variant):
//   fullQ, fullK[s], fullV[s]  mbarriers, count 1: the producer's arrive.expect_tx with its boxes' bytes; tile i
//                              completes phase i / 4 of stage i % 4's (consumers wait with parity (i / 4) & 1).
//   empty[s]                   count 8: lane 0 of each consumer warp after the wgmma.wait_group covering the
//                              tile's P·V (its last read of the stage); the producer refills stage s with tile
//                              i >= 4 after phase i / 4 - 1.
//   tailV                      count 32: warp 8's lanes, each after zeroing its share of the last tile's V rows
//                              past the sequence's end and fence.proxy.async; the consumers wait on it instead of
//                              fullV for that tile.
//   named barriers 1 (TURN0: WG1 -> WG0) and 2 (TURN1: WG0 -> WG1) over the 256 consumer threads order the turns:
//   WG1 arrives at TURN0 once before its first turn and after each turn but its last; WG0 syncs TURN0 before each
//   of its turns and arrives at TURN1 after each; WG1 syncs TURN1 before each of its turns.
//   named barriers 3 / 4 (Q0 / Q1, 128 threads, q_fmt != 0 only): warpgroup w's threads after writing their Q codes
//   (after fullQ, each its own 16-byte chunks of the warpgroup's rows) and fence.proxy.async, before its first S;
//   WG1 arrives at TURN0 before converting, so its conversion runs while WG0 converts and then takes its turn.
// Layout, descriptors and ordering rules: docs/cuda.md ("Hopper building blocks, verified").

#include "hopper.cuh"
#include "mla_prefill.h"
#include "mla_prefill_common.cuh"
#include "mla_prefill_wgmma.cuh"
#include "qdq.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_prefill_wgmma.cu is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

// Two quotients to their E4M3 codes as bf16 values, packed (low half = lo): the hardware's round-to-nearest-even,
// saturating conversion; E4M3 -> f16 is exact, f16 -> f32 -> bf16 too (4 significant bits, exponents 2^-9..2^8).
__device__ __forceinline__ uint32_t e4m3_as_bf16x2(float q_lo, float q_hi) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(q_hi), "f"(q_lo));
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(codes));
  const __half2 h = *reinterpret_cast<const __half2*>(&h2);
  return bf16x2_bits(__low2float(h), __high2float(h));
}
// P's codes, kP 1: the correctly rounded quotient p / scale without a division (Markstein: q = p·r, q + fma(-q,
// scale, p)·r, r the correctly rounded 1 / scale; exact for the decode kernel's proven scale range); kP 2: IEEE.
template <int kP>
__device__ __forceinline__ uint32_t p_codes(float lo, float hi, float scale, float rscale) {
  if constexpr (kP == 1) {
    const float q_lo0 = lo * rscale, q_hi0 = hi * rscale;
    return e4m3_as_bf16x2(fmaf(fmaf(-q_lo0, scale, lo), rscale, q_lo0), fmaf(fmaf(-q_hi0, scale, hi), rscale, q_hi0));
  } else {
    return e4m3_as_bf16x2(__fdiv_rn(lo, scale), __fdiv_rn(hi, scale));
  }
}

// The larger of two pairs of non-negative bf16 values, lane by lane, as unsigned 16-bit integers (max.u16x2: one
// VIMNMX.U16x2): a non-negative bf16's bit pattern orders as its value (+0, subnormals, normals, +Inf), and every
// NaN pattern (either sign) lies above them all, so a pair holding a NaN gives NaN (numerics' NaN block).
__device__ __forceinline__ uint32_t bf16x2_max_nonneg(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("max.u16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// Two bf16 products, lane by lane (mul.rn.bf16x2, sm_90): exact where each product is a bf16 value (P's E2M1 value
// times its block's E4M3 code: at most 6 significant bits, 2^-10 .. 2688, or 0), so equal to the float32 product
// rounded to bf16.
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
// min.NaN.bf16x2 (sm_80+): the lane-wise minimum, NaN if either lane's operand is NaN. P's E2M1 pairs of kP 3 clamped
// at (6, 6) = 0x40c040c0 (round_e2m1_nonneg_unsat's saturation, two values at once).
__device__ __forceinline__ uint32_t bf16x2_min_nan(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("min.NaN.bf16x2 %0, %1, %2;\n" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// P's NVFP4 (kP 3: division-free quotient, 4: IEEE; numerics.qdq_p "nvfp4"): P rounded to bf16, then blocks of 16
// keys at the tile's offsets 16 ks (tiles start at multiples of 64 from the sequence's first key: numerics' absolute
// blocks), each block's code c = e4m3(bmax / 6 / g) (g = p_scale, the caller's out_scale holds it), its values
// e2m1(p / (c·g))·c, exact in bf16. In S's accumulator block ks of the thread's row lo is sc[8 ks + {0, 1, 4, 5}]
// over the quad's 4 threads (keys 16 ks + 2 (t % 4) + {0, 1}, + 8), row hi sc[8 ks + {2, 3, 6, 7}]: block b = 2 ks +
// (row hi).
//   - The maxima stay in bf16 pairs (w: P's pairs as converted; P >= +0, ex2 never gives -0, so bf16x2_max_nonneg's
//     integer maximum is the values' maximum): pair ks holds blocks 2 ks and 2 ks + 1 (low / high half).
//   - A reduce-scatter over the quad (xor 2: lane q keeps pairs 2 (q / 2) and 2 (q / 2) + 1 and takes its partner's
//     of them; xor 1: pair q) leaves lane q the maxima of blocks 2q and 2q + 1 only (3 shuffles).
//   - Lane q computes those blocks' codes and scales (nvfp4_code_scale: s = code·g, 1 / s; kP 3 without a division
//     instruction: nvfp4_block_code_div_free, rg = RN(1 / g): p_rscale); every lane takes each block's code (as the
//     bf16 pair (code, code): exact), s and 1 / s from its owner (3 shuffles a block, 2 for kP 4: cheaper than
//     s = code·g again on every lane, and far from the shuffle unit's limit).
//   - The E2M1 values by nvfp4_p_e2m1 (div_rn's quotient, the non-negative rounding), paired in bf16 (exact) and
//     multiplied by (code, code) in bf16 (exact: bf16x2_mul), straight into P's A fragments pa (pack_p's layout:
//     pa[ks][i] = sc[8 ks + 2 i], sc[8 ks + 2 i + 1]).
// P >= 0 and finite unless a score is NaN (a NaN P makes its block's code NaN, so the block's values NaN, as
// numerics; its row's output is NaN either way).
// kP 3 since round (o) (474 -> 428 SASS instructions a tile, benchmarks/probes/prefill_p_nvfp4_count.sh): the owner's
// two codes in one E4M3 pair conversion and one shuffled bf16 word (HMUL2 broadcasts each block's half), 1 / s by
// __frcp_rn's fast path alone (rcp_rn_in_range: s in [2^-61, 2^69] or 1), the values by round_e2m1_nonneg_unsat and each bf16 pair clamped at (6, 6) by min.NaN.bf16x2 (the
// saturation two values at once; exhaustive: benchmarks/probes/e2m1_nosat_check.py). kP 4 keeps the saturating
// rounding (its IEEE quotient may be +Inf for a g below the division-free range).
template <int kP>
__device__ __forceinline__ void p_nvfp4(const float (&sc)[32], uint32_t (&pa)[4][4], float g, float rg, int lane) {
  uint32_t w[16];
#pragma unroll
  for (int e = 0; e < 16; ++e) w[e] = bf16x2_bits(sc[2 * e], sc[2 * e + 1]);  // P rounded to bf16 (pairs)
  uint32_t pr[4];  // pair ks: the thread's maxima of blocks 2 ks (low half) and 2 ks + 1 (high half)
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const uint32_t lo = bf16x2_max_nonneg(w[4 * ks], w[4 * ks + 2]);      // sc[8 ks + {0, 1}], sc[8 ks + {4, 5}]
    const uint32_t hi = bf16x2_max_nonneg(w[4 * ks + 1], w[4 * ks + 3]);  // sc[8 ks + {2, 3}], sc[8 ks + {6, 7}]
    pr[ks] = bf16x2_max_nonneg(__byte_perm(lo, hi, 0x5410), __byte_perm(lo, hi, 0x7632));
  }
  const int q = lane & 3;
  const bool upper = (q & 2) != 0, odd = (q & 1) != 0;
  uint32_t k0 = upper ? pr[2] : pr[0], k1 = upper ? pr[3] : pr[1];
  k0 = bf16x2_max_nonneg(k0, __shfl_xor_sync(0xffffffffu, upper ? pr[0] : pr[2], 2));
  k1 = bf16x2_max_nonneg(k1, __shfl_xor_sync(0xffffffffu, upper ? pr[1] : pr[3], 2));
  // blocks 2q (low half) and 2q + 1 (high half), over the quad
  const uint32_t m = bf16x2_max_nonneg(odd ? k1 : k0, __shfl_xor_sync(0xffffffffu, odd ? k0 : k1, 1));
  // The two blocks' codes in one E4M3 pair conversion (round_e4m3x2: round_e4m3's instruction on two values).
  const float b0 = __uint_as_float(m << 16), b1 = __uint_as_float(m & 0xffff0000u);
  auto code_arg = [&](float x) {  // bmax / 6 / g, both quotients correctly rounded (nvfp4_block_code's)
    return kP == 3 ? div_rn(div_rn(x, 6.f, 0x1.555556p-3f, false), g, rg, false) : __fdiv_rn(__fdiv_rn(x, 6.f), g);
  };
  const __half2 codes = round_e4m3x2(code_arg(b0), code_arg(b1));
  const float c[2] = {__low2float(codes), __high2float(codes)};
  BlockScale own[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if constexpr (kP == 3) {  // s in [2^-61, 2^69] or 1: __frcp_rn's fast path alone (rcp_rn_in_range)
      const float s = c[i] == 0.f ? 1.f : c[i] * g;
      own[i] = {c[i], s, rcp_rn_in_range(s)};
    } else {
      own[i] = nvfp4_code_scale(c[i], g);
    }
  }
  const uint32_t own_c01 = bf16x2_bits(own[0].code, own[1].code);  // both codes in bf16: exact (E4M3)
  uint32_t c01 = 0;
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const int src = (lane & ~3) | (b >> 1);
    if ((b & 1) == 0) c01 = __shfl_sync(0xffffffffu, own_c01, src);  // one shuffle for the owner's two blocks
    uint32_t cc;  // (code, code) of block b: one half of c01 twice (ptxas may fold it into HMUL2's operand swizzle)
    if (b & 1)
      asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {h, h};\n}\n" : "=r"(cc) : "r"(c01));
    else
      asm("{\n .reg .b16 l, h;\n mov.b32 {l, h}, %1;\n mov.b32 %0, {l, l};\n}\n" : "=r"(cc) : "r"(c01));
    const float s = __shfl_sync(0xffffffffu, own[b & 1].s, src);
    // kP 4 divides (__fdiv_rn): 1 / s is not read
    const float inv_s = kP == 3 ? __shfl_sync(0xffffffffu, own[b & 1].inv_s, src) : 1.f;
    const BlockScale bs{0.f, s, inv_s};  // the code is applied in bf16 (cc): nvfp4_p_e2m1 reads s and 1 / s only
#pragma unroll
    for (int j = 0; j < 2; ++j) {  // the block's pairs sc[e0 + {0, 1}] and sc[e0 + 4 + {0, 1}]: pa[e / 8][(e / 2) % 4]
      const int e = 8 * (b >> 1) + 2 * (b & 1) + 4 * j;
      const uint32_t pw = w[e >> 1];
      if constexpr (kP == 3) {  // the rounding without its saturation, the pair clamped at (6, 6) in bf16
        const float v_lo = round_e2m1_nonneg_unsat(div_rn(__uint_as_float(pw << 16), s, inv_s, false));
        const float v_hi = round_e2m1_nonneg_unsat(div_rn(__uint_as_float(pw & 0xffff0000u), s, inv_s, false));
        pa[e >> 3][(e >> 1) & 3] = bf16x2_mul(bf16x2_min_nan(bf16x2_bits(v_lo, v_hi), 0x40c040c0u), cc);
      } else {
        const float v_lo = nvfp4_p_e2m1<true>(__uint_as_float(pw << 16), bs);
        const float v_hi = nvfp4_p_e2m1<true>(__uint_as_float(pw & 0xffff0000u), bs);
        pa[e >> 3][(e >> 1) & 3] = bf16x2_mul(bf16x2_bits(v_lo, v_hi), cc);
      }
    }
  }
}

// Eight bf16 values (one 16-byte chunk) -> their codes bf16(e4m3(x / scale)), the same positions.
template <bool kExact>
__device__ __forceinline__ uint4 codes8(uint4 w, float scale, float rscale) {
  uint32_t v[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const float lo = __uint_as_float(v[c] << 16), hi = __uint_as_float(v[c] & 0xffff0000u);  // bf16 -> f32 exact
    v[c] = e4m3_as_bf16x2(codes_quotient<kExact>(lo, scale, rscale), codes_quotient<kExact>(hi, scale, rscale));
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// Q's FP8 codes in the kernel (q_fmt 1 / 2): a consumer warpgroup's 64 loaded Q rows (3 slabs, 24 KB at shared
// address `sq`) turned into their codes in place, elementwise (the swizzle does not matter): thread t takes the
// 16-byte chunks t, t + 128, ... (12 of them, 6 loads in flight), the pre-pass's function on each.
template <bool kExact>
__device__ __forceinline__ void q_codes(uint32_t sq, int t, float scale, float rscale) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    uint4 w[6];
#pragma unroll
    for (int u = 0; u < 6; ++u)
      asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(w[u].x), "=r"(w[u].y), "=r"(w[u].z), "=r"(w[u].w)
                   : "r"(sq + 16 * (t + 128 * (6 * half + u))));
#pragma unroll
    for (int u = 0; u < 6; ++u) {
      const uint4 c = codes8<kExact>(w[u], scale, rscale);
      asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n" ::"r"(sq + 16 * (t + 128 * (6 * half + u))),
                   "r"(c.x), "r"(c.y), "r"(c.z), "r"(c.w) : "memory");
    }
  }
}

// Q's NVFP4 values in the kernel (q_fmt 3 / 4, kernels with P's NVFP4 only: kP >= 3): a consumer warpgroup's 64
// loaded Q rows (24 KB at shared address `sq`) replaced in place by their values without g (nvfp4_row_block, the
// pre-pass's function on each block). Every aligned 32-byte unit of the tile is one 16-feature block: the 128-byte
// swizzle moves 16-byte chunk c of row r to c ^ (r % 8), so chunks 2i and 2i + 1 land on an aligned pair (in either
// order; a block's maximum and values do not depend on it). Thread t takes units t, t + 128, ... (6; 3 at a time,
// 6 loads in flight).
constexpr int kQUnitsInFlight = 3, kQUnitRounds = 6 / kQUnitsInFlight;  // 6 blocks a thread
template <bool kExact>
__device__ __forceinline__ void q_nvfp4(uint32_t sq, int t, float g) {
#pragma unroll
  for (int round = 0; round < kQUnitRounds; ++round) {
    uint32_t w[kQUnitsInFlight][8];
#pragma unroll
    for (int u = 0; u < kQUnitsInFlight; ++u)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(w[u][4 * c]), "=r"(w[u][4 * c + 1]), "=r"(w[u][4 * c + 2]), "=r"(w[u][4 * c + 3])
                     : "r"(sq + 32 * (t + 128 * (kQUnitsInFlight * round + u)) + 16 * c));
#pragma unroll
    for (int u = 0; u < kQUnitsInFlight; ++u) {
      nvfp4_row_block<kExact>(w[u], g);
#pragma unroll
      for (int c = 0; c < 2; ++c)
        asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                     ::"r"(sq + 32 * (t + 128 * (kQUnitsInFlight * round + u)) + 16 * c), "r"(w[u][4 * c]),
                     "r"(w[u][4 * c + 1]), "r"(w[u][4 * c + 2]), "r"(w[u][4 * c + 3]) : "memory");
    }
  }
}

template <int kP>
__global__ void __launch_bounds__(kThreads, 1)
    prefill_kernel(const PrefillParams p, const __grid_constant__ TmaMaps tm, int b0) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);
  uint8_t* sstage = sq + 2 * kQWgBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sstage + kStages * kStageBytes);
  uint64_t* full_q = bars;
  uint64_t* tail_v = bars + 1;
  uint64_t* full_k = bars + 2;
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty = full_v + kStages;

  prefill::Cta c;
  if (!prefill::cta_start(p, b0, c)) return;
  const int tid = c.tid, warp = c.warp, lane = c.lane, t = c.t, wg = c.wg, h = c.h, hk = c.hk;
  const int q_begin_seq = c.q_begin_seq, len_q = c.len_q, k_begin_seq = c.k_begin_seq, len_k = c.len_k;
  const int q0 = c.q0, n = c.n, qrow_lo = c.qrow_lo;
  const int tail_keys = len_k - (n - 1) * kBN;  // keys of the CTA's last tile that exist (< 64: V rows to zero)
  if (tid == 0) {
    mbar_init(full_q, 1);
    mbar_init(tail_v, 32);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: warp 8 alone stays
    setmaxnreg_dec<kProducerRegs>();
    if (warp != 8) return;
    if (lane == 0) {  // tile i is published when its bytes land (no lag: >= 2 stages suffice)
      for (int i = 0; i < n; ++i) {
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(&empty[s], (i / kStages - 1) & 1);
        if (i == 0) {
          mbar_arrive_expect_tx(full_q, 2 * kQWgBytes);
#pragma unroll
          for (int c = 0; c < 6; ++c)
            tma_slab(sq + (c / 3) * kQWgBytes + (c % 3) * kSlab, &tm.q, 64 * (c % 3), h, q_begin_seq + q0 + 64 * (c / 3),
                     full_q);
        }
        uint8_t* sk = sstage + s * kStageBytes;
        const int row = k_begin_seq + i * kBN;
        mbar_arrive_expect_tx(&full_k[s], kKBytes);
#pragma unroll
        for (int c = 0; c < 3; ++c) tma_slab(sk + c * kSlab, &tm.k, 64 * c, hk, row, &full_k[s]);
        mbar_arrive_expect_tx(&full_v[s], kVBytes);
#pragma unroll
        for (int c = 0; c < 2; ++c) tma_slab(sk + kKBytes + c * kSlab, &tm.v, 64 * c, hk, row, &full_v[s]);
      }
    }
    __syncwarp();
    if (tail_keys < kBN) {  // the last tile's V rows past the sequence's end: zeros before any consumer reads them
      const int s = (n - 1) % kStages;
      mbar_wait(&full_v[s], ((n - 1) / kStages) & 1);
      uint8_t* sv = sstage + s * kStageBytes + kKBytes;
      for (int idx = lane; idx < (kBN - tail_keys) * 16; idx += 32) {  // 16 chunks of 16 B per row: 8 per slab
        const int r = tail_keys + (idx >> 4), c = idx & 15;
        *reinterpret_cast<uint4*>(sv + (c >> 3) * kSlab + r * 128 + (c & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
      }
      fence_proxy_async();
      mbar_arrive(tail_v);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const uint8_t* sqw = sq + wg * kQWgBytes;
  const int my_turn = wg == 0 ? kBarTurn0 : kBarTurn1, other_turn = wg == 0 ? kBarTurn1 : kBarTurn0;
  const int off = len_k - len_q;       // causal: row qr sees keys <= qr + off
  const int first_row = c.first_row;  // the warpgroup's first row: a tile needs a mask past its limit
  float o[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] = 0.f;
  float sc[32];
  uint32_t pa[4][4];                         // P of the previous tile: the RS A fragments of 4 k16 steps
  prefill::Rows rows{-INFINITY, -INFINITY, 0.f, 0.f};  // the thread's running maxima and row sums

  const uint64_t dq = kmajor_desc(sqw);
  const uint64_t dk0 = kmajor_desc(sstage), dv0 = mnmajor_desc(sstage + kKBytes);
  // Descriptors built once per operand; each k-step adds its byte offset / 16 to the start-address field (shared
  // addresses stay below 2^18: the add never carries out of the field).
  // S(j) into sc: 12 k16 steps over the 192 features (32 B each inside a slab, one slab per 128 B).
  auto issue_s = [&](int j) {
    const uint64_t dk = dk0 + static_cast<uint64_t>((j % kStages) * (kStageBytes >> 4));
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks) {
      const uint32_t byte = ((ks * 32) >> 7) * kSlab + ((ks * 32) & 127);
      wgmma_s(sc, dq + (byte >> 4), dk + (byte >> 4), ks > 0);
    }
    wg_commit();
  };
  // O += P(j)·V(j): 4 k16 steps over the tile's 64 keys (16 rows of 128 B each).
  auto issue_pv = [&](int j) {
    const uint64_t dv = dv0 + static_cast<uint64_t>((j % kStages) * (kStageBytes >> 4));
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_pv_rs(o, pa[ks], dv + static_cast<uint64_t>(ks * 16 * 128 / 16));
    wg_commit();
  };
  auto softmax = [&](int j, float& a_lo, float& a_hi) {
    prefill::tile_softmax(sc, rows, j * kBN, len_k, p.causal, first_row, off, qrow_lo, t, p.scale_log2, a_lo, a_hi);
  };
  auto pack_p = [&]() {
    if constexpr (kP >= 3) {  // NVFP4: the values straight into the A fragments
      p_nvfp4<kP>(sc, pa, p.p_scale, p.p_rscale, lane);
    } else {
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          if constexpr (kP == 0)
            pa[ks][i] = bf16x2_bits(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
          else
            pa[ks][i] = p_codes<kP>(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1], p.p_scale, p.p_rscale);
        }
    }
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[j % kStages]);
  };

  // Tile 0: S alone in the first turn.
  mbar_wait(full_q, 0);
  if (wg == 1) nb_arrive<kPairThreads>(kBarTurn0);
  if (p.q_fmt != 0) {  // Q's codes or NVFP4 values in place, the warpgroup's own rows; WG1's under WG0's turn
    if (kP >= 3 && p.q_fmt == 3)  // NVFP4 (q_scale = Q's g): only the P-NVFP4 instances have it
      q_nvfp4<false>(smem_u32(sqw), t, p.q_scale);
    else if (kP >= 3 && p.q_fmt == 4)
      q_nvfp4<true>(smem_u32(sqw), t, p.q_scale);
    else if (p.q_fmt == 1)
      q_codes<false>(smem_u32(sqw), t, p.q_scale, p.q_rscale);
    else
      q_codes<true>(smem_u32(sqw), t, p.q_scale, p.q_rscale);
    fence_proxy_async();                      // the codes (generic proxy) before the wgmma's reads (async proxy)
    nb_sync<kWgThreads>(kBarQCodes0 + wg);    // every thread's chunks written before the warpgroup's first S
  }
  mbar_wait(&full_k[0], 0);
  prefill::first_tile(sc, my_turn, other_turn, wg == 0 || n > 1, issue_s, softmax, pack_p);

  for (int j = 1; j < n; ++j) {
    const int s = j % kStages, sp = (j - 1) % kStages;
    mbar_wait(&full_k[s], (j / kStages) & 1);
    mbar_wait(&full_v[sp], ((j - 1) / kStages) & 1);
    nb_sync<kPairThreads>(my_turn);
    wg_fence();
    issue_s(j);
    issue_pv(j - 1);
    if (wg == 0 || j < n - 1) nb_arrive<kPairThreads>(other_turn);
    wg_wait<1>();  // S(j) done; P·V(j-1) may still run
    reg_fence(sc);
    float a_lo, a_hi;
    softmax(j, a_lo, a_hi);
    block_boundary(rows.l_lo);
    wg_wait<0>();  // P·V(j-1) done: stage j-1 is free, O and the A fragments may be written
    reg_fence(o);
    release(j - 1);
    // x·1 = x: a warp whose 16 rows all keep their maximum skips the multiply (no bit changes)
    if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) prefill::scale_rows64(o, a_lo, a_hi);
    pack_p();
  }
  if (tail_keys < kBN)
    mbar_wait(tail_v, 0);  // the last tile's V with its rows past the sequence's end zeroed
  else
    mbar_wait(&full_v[(n - 1) % kStages], ((n - 1) / kStages) & 1);
  wg_fence();
  issue_pv(n - 1);
  wg_wait<0>();
  reg_fence(o);
  release(n - 1);

  prefill::store_rows(o, rows, p.out_scale, p.out, p.lse, p.total_q, p.heads, h, q_begin_seq, qrow_lo, len_q, t);
}

// Up to three operands' codes in one launch: chunk i of the concatenation [x0 | x1 | x2] (16-byte chunks) belongs
// to the operand whose range holds it. Grid-stride, two chunks per thread per step (both loads before the math).
template <bool kExact>
__global__ void __launch_bounds__(256) fp8_codes_kernel(const FP8CodesJobs jobs, int64_t total8) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  auto locate = [&](int64_t i, const uint4*& x, uint4*& out, float& scale, float& rscale) {
    const int j = i < jobs.n8[0] ? 0 : (i < jobs.n8[0] + jobs.n8[1] ? 1 : 2);
    const int64_t first = j == 0 ? 0 : (j == 1 ? jobs.n8[0] : jobs.n8[0] + jobs.n8[1]);
    x = reinterpret_cast<const uint4*>(j == 0 ? jobs.x[0] : (j == 1 ? jobs.x[1] : jobs.x[2])) + (i - first);
    out = reinterpret_cast<uint4*>(j == 0 ? jobs.out[0] : (j == 1 ? jobs.out[1] : jobs.out[2])) + (i - first);
    scale = j == 0 ? jobs.scale[0] : (j == 1 ? jobs.scale[1] : jobs.scale[2]);
    rscale = j == 0 ? jobs.rscale[0] : (j == 1 ? jobs.rscale[1] : jobs.rscale[2]);
  };
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total8; i += 2 * step) {
    const uint4* xa;
    const uint4* xb;
    uint4 *oa, *ob;
    float sa, ra, sb, rb;
    locate(i, xa, oa, sa, ra);
    const bool second = i + step < total8;
    const uint4 wa = __ldg(xa);
    uint4 wb = make_uint4(0u, 0u, 0u, 0u);
    if (second) {
      locate(i + step, xb, ob, sb, rb);
      wb = __ldg(xb);
    }
    *oa = codes8<kExact>(wa, sa, ra);
    if (second) *ob = codes8<kExact>(wb, sb, rb);
  }
}

template <int kP>
cudaError_t launch(const PrefillParams& p, const TmaMaps& maps, cudaStream_t stream) {
  static bool attribute_set[kMaxDevices] = {};  // once per device (not a stream operation: capture-safe)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(prefill_kernel<kP>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const unsigned blocks = static_cast<unsigned>((std::min<int64_t>(p.max_seqlen_q, p.total_q) + kBM - 1) / kBM);
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    const dim3 grid(blocks, static_cast<unsigned>(p.heads), static_cast<unsigned>(std::min(kMaxGridZ, p.batch - b0)));
    prefill_kernel<kP><<<grid, kThreads, kSmemBytes, stream>>>(p, maps, b0);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

bool prefill_wgmma_supported(const PrefillParams& p) {
  const int64_t strides[6] = {p.q_stride_t, p.q_stride_h, p.k_stride_t, p.k_stride_h, p.v_stride_t, p.v_stride_h};
  for (int64_t s : strides)
    if (s <= 0 || s % 8 != 0 || s >= (int64_t{1} << 38)) return false;  // TMA: 16-byte multiples below 2^40 bytes
  return p.heads >= 1 && p.kv_heads >= 1 && p.heads % p.kv_heads == 0 && p.heads <= 65535 && p.batch >= 1 &&
         p.max_seqlen_q >= 1 && p.total_q >= 1 && p.total_k >= 1 && p.total_q < (int64_t{1} << 31) &&
         p.total_k < (int64_t{1} << 31) && aligned16(p.q) && aligned16(p.k) && aligned16(p.v) && p.out &&
         aligned16(p.out) && p.cu_q && p.cu_k && p.p_fmt >= 0 && p.p_fmt <= 4 && p.q_fmt >= 0 && p.q_fmt <= 4 &&
         (p.q_fmt <= 2 || p.p_fmt >= 3) && (!p.work_counter || (p.p_fmt == 0 && p.q_fmt == 0));
}

cudaError_t launch_prefill_wgmma(const PrefillParams& p, cudaStream_t stream) {
  if (!prefill_wgmma_supported(p)) return cudaErrorInvalidValue;
  const EncodeTiledFn encode = tma_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  TmaMaps maps;
  if (!prefill_maps(p, encode, maps)) return cudaErrorInvalidValue;
  if (p.work_counter) return launch_prefill_persistent(p, &maps, stream);
  switch (p.p_fmt) {
    case 0: return launch<0>(p, maps, stream);
    case 1: return launch<1>(p, maps, stream);
    case 2: return launch<2>(p, maps, stream);
    case 3: return launch<3>(p, maps, stream);
    default: return launch<4>(p, maps, stream);
  }
}

cudaError_t launch_fp8_codes_bf16(const FP8CodesJobs& jobs, bool exact_div, cudaStream_t stream) {
  int64_t total8 = 0;
  for (int j = 0; j < 3; ++j) {
    if (jobs.n8[j] < 0 || (jobs.n8[j] > 0 && (!aligned16(jobs.x[j]) || !aligned16(jobs.out[j]))))
      return cudaErrorInvalidValue;
    total8 += jobs.n8[j];
  }
  if (total8 == 0) return cudaSuccess;
  unsigned blocks = 0;  // one resident wave, or fewer where the chunks run out (two per thread)
  const cudaError_t err = wave_blocks((total8 + 1) / 2, blocks);
  if (err != cudaSuccess) return err;
  if (exact_div)
    fp8_codes_kernel<true><<<blocks, 256, 0, stream>>>(jobs, total8);
  else
    fp8_codes_kernel<false><<<blocks, 256, 0, stream>>>(jobs, total8);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
