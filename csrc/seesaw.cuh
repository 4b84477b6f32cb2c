// seesaw.cuh: what the two "seesaw" WGMMA decode kernels share, one definition: mla_decode_wgmma.cu (paged bf16 /
// fp16 rows) and mla_sparse_wgmma.cu (top-k FP8 rows, converted to f16 / bf16 by the producer). Both run one CTA of
// three warpgroups per (group of 64 heads, split) over 64-key steps in a 2-stage ring of [64 rows x 128 B] slabs: a
// producer warpgroup (warps 8-11) fills the ring, two consumer warpgroups (warps 0-3, 4-7) compute S for keys
// 32w..32w+31, own output columns 256w..256w+255 and meet only on named barriers. Per step, with half h's row max
// mx_h: m1 = max(m, mx_0), m2 = max(m1, mx_1), a1 = 2^(m - m1), a2 = 2^(m1 - m2), P0 = 2^(S0 - m1),
// P1 = 2^(S1 - m2) (against 0 while the max is -inf), row sums from the float32 P: l_0 = (l_0 a1 + sum P0) a2,
// l_1 = (l_1 a1) a2 + sum P1, l = l_0 + l_1 at the end; O_w = (O_w a1 + P0 V0_w) a2 + P1 V1_w (m64n256k16, V = the
// stage's first 512 columns read MN-major; a warpgroup's own P half from registers, the other's from the shared P
// slab). A multiply by a factor that is exactly 1 for all 16 rows of a warp is skipped (rescale). Each kernel's
// header comment gives its producer, its masking and rounding of P, and what it adds to the synchronization below.
//
// Synchronization (step i in stage i % 2):
//   full[s]  mbarrier, 128 arrivals: each producer thread once the step's rows are in the stage and visible to
//            wgmma (fence.proxy.async); step i completes phase i / 2, consumers wait with parity (i / 2) & 1.
//   empty[s] mbarrier, 8 arrivals: lane 0 of each consumer warp after its last wgmma reading the stage
//            completed; the producer refills stage s with step j >= 2 after phase (j - 2) / 2.
//   named barriers over the 256 consumer threads (one warpgroup arrives, the other waits):
//     1 MX0  WG0 -> WG1: half 0's row maxima written          2 P0F  WG0 -> WG1: P0 in the slab (+ proxy fence)
//     3 H1F  WG1 -> WG0: P1 in the slab + half 1's maxima      4 P0E  WG1 -> WG0: WG1's P0 V0 of step i done
//     5 ALL  both (Q in its slabs; final row sums exchanged)
//   Per step: WG0: S0; maxima; arrive MX0; P0; [i > 0: sync P0E]; write P0; arrive P0F; O a1; P0 V0 (RS);
//             sync H1F; a2; O a2; P1 V1 (SS); release.   WG1: S1; sync MX0; P1; write P1 + maxima; arrive H1F;
//             O a1; sync P0F; P0 V0 (SS); [i < T - 1: arrive P0E]; O a2; P1 V1 (RS); release.
//   Between two arrivals of one warpgroup at one id it waits on a barrier the other arrives at only after its
//   wait at that id, so no generation completes on arrivals alone; every generation is 128 + 128 threads.
// Layout, descriptors and ordering rules: docs/cuda.md ("Hopper building blocks, verified").
#pragma once

#include "hopper.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace mla_core_cuda {

constexpr int kHeads = 64;                      // heads per CTA: the wgmma M
constexpr int kKeys = 64;                       // keys per step: two 32-key halves, one per consumer warpgroup
constexpr int kDim = 576;                       // values of a query / key row: 512 latent + 64 RoPE (S's k)
constexpr int kNope = 512;                      // V width (kv_lora_rank): 256 output columns per consumer warpgroup
constexpr int kSlab = kKeys * 128;              // one [64 rows x 128 B] slab
constexpr int kConsumerThreads = 256;           // two consumer warpgroups (warps 0-7)
constexpr int kThreads = 384;                   // + the producer warpgroup (warps 8-11)
constexpr int kProducerThreads = kThreads - kConsumerThreads;
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // setmaxnreg: 56 + 2 x 224 = 3 x 168 (the launch share)
constexpr int kBarMx0 = 1, kBarP0Full = 2, kBarH1Full = 3, kBarP0Empty = 4, kBarAll = 5;  // named barriers (above)
constexpr float kLn2 = 0.6931471805599453f;

// Byte offset of (row, byte) in a 64-row slab operand: slab byte / 128, slab after slab; chunk c of row r at chunk
// position c ^ (r % 8) (the 128-byte swizzle).
__device__ __forceinline__ uint32_t slab_off(uint32_t row, uint32_t byte) {
  return (byte >> 7) * kSlab + row * 128u + ((((byte >> 4) & 7u) ^ (row & 7u)) << 4) + (byte & 15u);
}
// K-major operand (64-row slabs), the k16 step `kbyte` bytes into each row: SBO 1024 (8 rows), LBO unused (16).
__device__ __forceinline__ uint64_t kmajor_desc(const uint8_t* s, uint32_t kbyte) {
  return make_desc(smem_u32(s) + (kbyte >> 7) * kSlab + (kbyte & 127u), 16u, 1024u);
}
// MN-major operand (V: rows = keys, slabs along the output columns), the k16 step at key k0: LBO = one slab
// (the next 64 columns), SBO 1024 (the next 8 keys).
__device__ __forceinline__ uint64_t mnmajor_desc(const uint8_t* s, uint32_t k0) {
  return make_desc(smem_u32(s) + k0 * 128u, kSlab, 1024u);
}

// The wgmma products in the element type T (D f32 += A T * B T; `accumulate` 0: D = A B): S half m64n32k16
// (s_half: A = Q, B = K, both K-major), P V m64n256k16 with P from shared memory (pv: A K-major, B = V MN-major)
// or from registers (pv_rs: A = the m64k16 fragment, a[0] = (row r, keys c, c + 1), a[1] = (r + 8, c..),
// a[2] = (r, c + 8..), a[3] = (r + 8, c + 8..), r = 16 (t / 32) + (t % 32) / 4, c = 16 ks + 2 (t % 4): the
// accumulator layout of S, so P converts in place; always accumulates). The sparse kernel's fp8_ds_mla variant
// also takes S's RoPE part with A = Q's RoPE fragments from registers (s_rs: pv_rs's layout, B = K rows K-major)
// and P V over one 128-column scale block (pv128_rs: m64n128k16 into o[kOff .. kOff + 63], A from registers).
#define MLA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLA_F16(i) MLA_F4(i), MLA_F4(i + 4), MLA_F4(i + 8), MLA_F4(i + 12)
#define MLA_E4(i) "+f"(e[i]), "+f"(e[i + 1]), "+f"(e[i + 2]), "+f"(e[i + 3])
#define MLA_E16(i) MLA_E4(i), MLA_E4(i + 4), MLA_E4(i + 8), MLA_E4(i + 12)
#define MLA_F128 MLA_F16(0), MLA_F16(16), MLA_F16(32), MLA_F16(48), MLA_F16(64), MLA_F16(80), MLA_F16(96), MLA_F16(112)
template <typename T> struct Wgmma;
#define MLA_WGMMA_OPS(T_, TY, PAIR, CONVERT)                                                                           \
  template <> struct Wgmma<T_> {                                                                                       \
    static __device__ __forceinline__ void s_half(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {          \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"                                                        \
                   "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
                   : MLA_F16(0)                                                                                        \
                   : "l"(da), "l"(db), "r"(accumulate));                                                               \
    }                                                                                                                  \
    /* S of all 64 keys (m64n64k16): keys 0-31 into d, 32-63 into e, each in s_half's layout */                      \
    static __device__ __forceinline__ void s_full(float (&d)[16], float (&e)[16], uint64_t da, uint64_t db,            \
                                                  int accumulate) {                                                    \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                        \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
                   : MLA_F16(0), MLA_E16(0)                                                                            \
                   : "l"(da), "l"(db), "r"(accumulate));                                                               \
    }                                                                                                                  \
    static __device__ __forceinline__ void pv(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {             \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"                                                       \
                   "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n" \
                   : MLA_F128                                                                                          \
                   : "l"(da), "l"(db), "r"(accumulate));                                                               \
    }                                                                                                                  \
    static __device__ __forceinline__ void pv_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {               \
      asm volatile("{\n"                                                                                               \
                   "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, {%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n}\n" \
                   : MLA_F128                                                                                          \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                             \
    }                                                                                                                  \
    static __device__ __forceinline__ void s_rs(float (&d)[16], const uint32_t (&a)[4], uint64_t db,                   \
                                                int accumulate) {                                                      \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"                                                        \
                   "wgmma.mma_async.sync.aligned.m64n32k16.f32." TY "." TY " "                                         \
                   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n}\n" \
                   : MLA_F16(0)                                                                                        \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));                            \
    }                                                                                                                  \
    template <int kOff>                                                                                                \
    static __device__ __forceinline__ void pv128_rs(float (&d)[128], const uint32_t (&a)[4], uint64_t db) {            \
      asm volatile("{\n"                                                                                               \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " "                                        \
                   "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n}\n" \
                   : MLA_F16(kOff), MLA_F16(kOff + 16), MLA_F16(kOff + 32), MLA_F16(kOff + 48)                         \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));                                             \
    }                                                                                                                  \
    /* two float32 rounded to T (nearest even), the lower column in the low half */                                    \
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {                                              \
      const PAIR v = CONVERT(lo, hi);                                                                                  \
      return *reinterpret_cast<const uint32_t*>(&v);                                                                   \
    }                                                                                                                  \
  };
MLA_WGMMA_OPS(__nv_bfloat16, "bf16", __nv_bfloat162, __floats2bfloat162_rn)
MLA_WGMMA_OPS(__half, "f16", __half2, __floats2half2_rn)
#undef MLA_WGMMA_OPS
#undef MLA_F128
#undef MLA_F16
#undef MLA_F4
#undef MLA_E16
#undef MLA_E4

// This thread's P half (16 float32 of the S accumulator layout) as the two m64k16 A fragments of its keys.
template <typename T>
__device__ __forceinline__ void p_fragments(const float (&e)[16], uint32_t (&a)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) a[ks][i] = Wgmma<T>::pack(e[8 * ks + 2 * i], e[8 * ks + 2 * i + 1]);
}

// The ring's mbarriers (thread 0, before the CTA barrier that publishes them): full[s] counts the 128 producer
// threads, empty[s] the 8 consumer warps (protocol above).
__device__ __forceinline__ void init_ring(uint64_t* full, uint64_t* empty) {
  mbar_init(&full[0], kProducerThreads);
  mbar_init(&full[1], kProducerThreads);
  mbar_init(&empty[0], kConsumerThreads / 32);
  mbar_init(&empty[1], kConsumerThreads / 32);
}
// The start of step `it` for a consumer warpgroup: the S accumulator zeroed (tied before the wait: no wgmma
// overtakes it), the wait for the step's stage (full[it % 2], phase parity (it / 2) & 1), the wgmma fence.
__device__ __forceinline__ void begin_step(float (&sc)[16], uint64_t* full, int it) {
#pragma unroll
  for (int j = 0; j < 16; ++j) sc[j] = 0.f;
  reg_fence(sc);
  mbar_wait(&full[it & 1], (it >> 1) & 1);
  wg_fence();
}
// S of this warpgroup's 32 keys (their rows at `sk`: rows 32w.. of the stage's slabs, a multiple of 8, so the same
// swizzle phase) against Q's slabs at `sq` over all kDim columns: 36 k16 steps, one group, waited for.
template <typename T>
__device__ __forceinline__ void s_product(float (&sc)[16], const uint8_t* sq, const uint8_t* sk) {
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks)
    Wgmma<T>::s_half(sc, kmajor_desc(sq, 32 * ks), kmajor_desc(sk, 32 * ks), ks > 0);
  wg_commit();
  wg_wait<0>();
  reg_fence(sc);
}
// P V of keys k0 .. k0 + 31 (two k16 steps) into this warpgroup's 256 columns, V = the stage's slabs at `sv`
// (MN-major), P from registers (pv_regs: the warpgroup's own half, p_fragments' a) or from the P slab at `sp`
// (pv_slab: the other warpgroup's half). Issued only: the caller fences, commits and waits.
template <typename T>
__device__ __forceinline__ void pv_regs(float (&o)[128], const uint32_t (&a)[2][4], const uint8_t* sv, int k0) {
  Wgmma<T>::pv_rs(o, a[0], mnmajor_desc(sv, k0));
  Wgmma<T>::pv_rs(o, a[1], mnmajor_desc(sv, k0 + 16));
}
template <typename T>
__device__ __forceinline__ void pv_slab(float (&o)[128], const uint8_t* sp, const uint8_t* sv, int k0) {
  Wgmma<T>::pv(o, kmajor_desc(sp, 2 * k0), mnmajor_desc(sv, k0), 1);
  Wgmma<T>::pv(o, kmajor_desc(sp, 2 * k0 + 32), mnmajor_desc(sv, k0 + 16), 1);
}
// The end of a step, once every wgmma of this warp that reads stage s has completed: lane 0 releases the stage.
__device__ __forceinline__ void release_stage(uint64_t* empty, int s, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(&empty[s]);
}

// The output epilogue: two adjacent values of a row as one store (float32, or rounded to bf16 / fp16, nearest even).
__device__ __forceinline__ void store_pair(float* dst, float a, float b) {
  *reinterpret_cast<float2*>(dst) = make_float2(a, b);
}
__device__ __forceinline__ void store_pair(__nv_bfloat16* dst, float a, float b) {
  *reinterpret_cast<__nv_bfloat162*>(dst) = __floats2bfloat162_rn(a, b);
}
__device__ __forceinline__ void store_pair(__half* dst, float a, float b) {
  *reinterpret_cast<__half2*>(dst) = __floats2half2_rn(a, b);
}
// This thread's 2 x 64 accumulator values of rows lo and hi (= lo + 8; stored when `store_hi`) times inv_lo /
// inv_hi: o[j] sits at column 8 (j / 4) + j % 2 from the thread's first column, row hi when j % 4 >= 2.
template <typename OutT>
__device__ __forceinline__ void store_rows(OutT* lo, OutT* hi, const float (&o)[128], float inv_lo, float inv_hi,
                                           bool store_hi) {
#pragma unroll
  for (int j = 0; j < 128; j += 4) {
    store_pair(lo + 8 * (j >> 2), o[j] * inv_lo, o[j + 1] * inv_lo);
    if (store_hi) store_pair(hi + 8 * (j >> 2), o[j + 2] * inv_hi, o[j + 3] * inv_hi);
  }
}

// The row maxima of this thread's rows lo and hi = lo + 8 over the 4 threads of its quad (they share rows).
__device__ __forceinline__ void quad_max(float& lo, float& hi) {
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    lo = fmaxf(lo, __shfl_xor_sync(0xffffffffu, lo, d));
    hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, d));
  }
}
// A row pair's quad-reduced values into shared memory (dst[row_lo], dst[row_lo + 8]), by the quad's first thread.
__device__ __forceinline__ void store_row_pair(float* dst, int row_lo, int t, float lo, float hi) {
  if ((t & 3) == 0) {
    dst[row_lo] = lo;
    dst[row_lo + 8] = hi;
  }
}

// A row without a valid key so far has max -inf: its factors and P are taken against 0 (no -inf - -inf NaN).
__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }
// The scores of this warpgroup's 32 keys as P = 2^(s - max) against the rows' max (finite_or_zero: masked scores
// give 2^-inf = 0), in place; returns the float32 row sums of this thread's 8 keys.
__device__ __forceinline__ void exponentiate(float (&s)[16], float m_lo, float m_hi, float& sum_lo, float& sum_hi) {
  const float base_lo = finite_or_zero(m_lo), base_hi = finite_or_zero(m_hi);
  sum_lo = sum_hi = 0.f;
#pragma unroll
  for (int j = 0; j < 16; ++j) {
    const float e = ex2(s[j] - ((j & 2) ? base_hi : base_lo));
    s[j] = e;
    if (j & 2) sum_hi += e;
    else sum_lo += e;
  }
}
// O rows scaled by a_lo / a_hi unless both are exactly 1 in every row of the warp (x * 1 = x: skipping changes no
// bit). A factor is 1 once a row's running max has settled, so most steps skip it.
__device__ __forceinline__ void rescale(float (&o)[128], float a_lo, float a_hi) {
  if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) scale_rows(o, a_lo, a_hi);
}
// O <- a O, then O += P V of keys k0 .. k0 + 31 (pv_regs / pv_slab above), fenced, committed and waited for.
template <typename T>
__device__ __forceinline__ void rescale_pv_regs(float (&o)[128], float a_lo, float a_hi, const uint32_t (&a)[2][4],
                                                const uint8_t* sv, int k0) {
  rescale(o, a_lo, a_hi);
  wg_fence();
  pv_regs<T>(o, a, sv, k0);
  wg_commit();
  wg_wait<0>();
  reg_fence(o);
}
template <typename T>
__device__ __forceinline__ void rescale_pv_slab(float (&o)[128], float a_lo, float a_hi, const uint8_t* sp,
                                                const uint8_t* sv, int k0) {
  rescale(o, a_lo, a_hi);
  wg_fence();
  pv_slab<T>(o, sp, sv, k0);
  wg_commit();
  wg_wait<0>();
  reg_fence(o);
}
// This thread's P fragments (two m64k16 A fragments: the S accumulator layout) into the P slab at keys
// key0 .. key0 + 31 (rows row_lo, row_lo + 8).
__device__ __forceinline__ void store_p(uint8_t* sp, const uint32_t (&a)[2][4], int row_lo, int key0, int t) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) {
    const int key = key0 + 16 * ks + 2 * (t & 3);
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, 2 * key)) = a[ks][0];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, 2 * key)) = a[ks][1];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, 2 * key + 16)) = a[ks][2];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, 2 * key + 16)) = a[ks][3];
  }
}

}  // namespace mla_core_cuda
