// The fused MLA layer's decode prep (mla_layer_prep.h): per token, its request (a count of input_row_offsets[1:]
// entries <= t), its position, the new cache row [rmsnorm(kv[:512]) * gamma, rope(kv[512:], pos)] (float32, one
// rounding to the cache dtype; not written when its page lies outside the table or the cache), q_rope rotated
// into the absorbed query's columns 512..575, and the token's key count pos + 1.
//
// Bit-equal to backends/triton/mla_core_triton/layer.py's _prep_kernel (decode form, num_warps 4): each float32
// operation below is the one Triton's PTX runs, in its order (read from the kernel compiled for sm_90 by Triton 3.9
// with its default FP fusion and the launch's own specialization: benchmarks/NOTES.md, "Eager decode: the prep inside
// the cuda call"):
// - x = the 512 latent values; thread `tid` of 128 holds x[4 tid + j], j = 0..3 (Triton's blocked layout sizePerThread
//   4, 4 warps: its loads of the row are 8-byte vectors). That layout is Triton's only when kv's pointer is 16-byte
//   aligned and its row stride a multiple of 16 elements (the divisibility Triton specializes on); otherwise it
//   reads one element per thread (x[tid + 128 j]) and sums in another order, so the caller runs the CUDA prep only
//   for the aligned case (bindings.cpp refuses the other). The thread's partial sum: Triton >= 3.7 folds its four
//   squares as a tree (triton-lang/triton#9220), fma(x0, x0, x1 * x1) + fma(x2, x2, x3 * x3) (read from 3.9's PTX:
//   sum_order 0); before, as a left fold, fma(x3, x3, fma(x2, x2, fma(x0, x0, x1 * x1))) with 3.9's fusion of the
//   first pair (sum_order 1) or fma(x3, x3, fma(x2, x2, fma(x1, x1, x0 * x0))) with the other (sum_order 2); the
//   caller picks by Triton's version (layer.py _prep_order);
// - then a butterfly over the warp (xor 16, 8, 4, 2, 1; acc + other), each warp's sum to shared memory, and a
//   butterfly over the 4 warp sums (xor 2, 1): (w0 + w2) + (w1 + w3);
// - mean + eps = fma(div.approx(1, 512), sum, eps) (Triton turned `sum / 512 + eps` into that; 1 / 512 is exact);
// - inv = div.full.f32(1, sqrt.rn(mean + eps)) (Triton's `/` on float32 is div.full, not a correctly rounded one);
// - the row = cvt.rn((inv * x) * gamma);
// - rope: r1 = fma(cos, x1, -(sin * x2)), r2 = fma(sin, x1, cos * x2) (layer.py's `_rotate` writes these fma out,
//   so every Triton compiles them), each rounded once to the cache dtype.
// Every operation is an explicit intrinsic (__fmul_rn, __fadd_rn, __fmaf_rn) or inline PTX, so nvcc can neither
// contract nor reorder them. The sum order is a launch argument (a uniform branch), so a device whose Triton sums
// otherwise is matched without a rebuild (MLA_CORE_LAYER_PREP_ORDER; benchmarks/run_layer_prep_ab.sh tries each
// when a bit-equality test fails).

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "mla_layer_prep.h"


namespace mla_core_cuda {
namespace {

constexpr int kLatent = 512;
constexpr int kRope = 64;
constexpr int kHalf = kRope / 2;
constexpr int kRow = kLatent + kRope;
constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = kLatent / kThreads;
static_assert(kPerThread == 4 && kHalf == 32, "the prep's thread mapping is written for latent 512, rope 64");
// q_rope heads per CTA (blockIdx.y picks the group), kHeadsPerWarp a warp, their loads issued before any rotation:
// one CTA looping over 128 heads took 14.3 us at batch 1 on the H200 (each head's loads waited in turn).
constexpr int kHeadsPerWarp = 4;
constexpr int kHeadsPerCta = kHeadsPerWarp * kWarps;

__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ int64_t load_index(const void* ptr, bool i64, int64_t i) {
  return i64 ? static_cast<const int64_t*>(ptr)[i] : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i]);
}

__device__ __forceinline__ float load_gamma(const void* ptr, int dtype, int i) {
  if (dtype == kFP32) return static_cast<const float*>(ptr)[i];
  if (dtype == kBF16) return __bfloat162float(static_cast<const __nv_bfloat16*>(ptr)[i]);
  return __half2float(static_cast<const __half*>(ptr)[i]);
}

__device__ __forceinline__ float div_full(float a, float b) {
  float r;
  asm("div.full.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

__device__ __forceinline__ float div_approx(float a, float b) {
  float r;
  asm("div.approx.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
}

// rope([x1, x2]) at (cos, sin): r1 = x1 cos - x2 sin, r2 = x2 cos + x1 sin as layer.py's `_rotate` writes them.
__device__ __forceinline__ void rotate(float x1, float x2, float c, float s, float& r1, float& r2) {
  r1 = __fmaf_rn(c, x1, -__fmul_rn(s, x2));
  r2 = __fmaf_rn(s, x1, __fmul_rn(c, x2));
}

// Grid (tokens, ceil(heads / kHeadsPerCta)): CTA (t, g) rotates heads [g kHeadsPerCta, (g + 1) kHeadsPerCta) of token
// t; CTA (t, 0) also writes the new cache row and the key count.
template <typename T>
__global__ void __launch_bounds__(kThreads) layer_prep_kernel(const LayerPrepParams p) {
  __shared__ float warp_sums[kWarps];
  const int t = blockIdx.x;
  const int group = blockIdx.y;
  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;

  // the token's request: how many offsets[1:] entries are <= t, clamped (memory-safe whatever the offsets)
  int b = 0;
  for (int start = 0; start < p.batch; start += kThreads) {
    const int i = start + tid;
    b += __syncthreads_count(i < p.batch && load_index(p.offsets, p.offsets_i64, 1 + i) <= t);
  }
  b = min(b, p.batch - 1);
  const int64_t first = load_index(p.offsets, p.offsets_i64, b);
  const int64_t pos = load_index(p.starts, p.starts_i64, b) + t - first;
  const int64_t row = min(max(pos, int64_t{0}), p.max_pos - 1);

  // the pair this lane rotates (every warp: lane j holds pair j of the rope part)
  const int p1 = p.interleave ? 2 * lane : lane;
  const int p2 = p.interleave ? 2 * lane + 1 : lane + kHalf;
  const float cs = p.freqs[row * p.freqs_stride + 2 * lane];
  const float sn = p.freqs[row * p.freqs_stride + 2 * lane + 1];

  // q_rope of this CTA's heads into the absorbed query's rope columns (warp w: heads w, w + 4, ... of the group)
  {
    float x1[kHeadsPerWarp], x2[kHeadsPerWarp];
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      const int h = group * kHeadsPerCta + warp + k * kWarps;
      const T* q_row = static_cast<const T*>(p.q) + static_cast<int64_t>(t) * p.q_stride_t +
                       static_cast<int64_t>(min(h, p.heads - 1)) * p.q_stride_h + p.nope;
      x1[k] = to_float(q_row[p1]);
      x2[k] = to_float(q_row[p2]);
    }
#pragma unroll
    for (int k = 0; k < kHeadsPerWarp; ++k) {
      const int h = group * kHeadsPerCta + warp + k * kWarps;
      if (h < p.heads) {
        T* o_row = static_cast<T*>(p.q_out) + static_cast<int64_t>(t) * p.qo_stride_t +
                   static_cast<int64_t>(h) * p.qo_stride_h + kLatent;
        float r1, r2;
        rotate(x1[k], x2[k], cs, sn, r1, r2);
        o_row[p1] = from_float<T>(r1);
        o_row[p2] = from_float<T>(r2);
      }
    }
  }
  if (group != 0) return;   // (uniform per CTA: the barrier below is reached by all of CTA (t, 0)'s threads)

  // RMSNorm of the latent part: the sum of squares in Triton's order
  const T* kv_row = static_cast<const T*>(p.kv) + static_cast<int64_t>(t) * p.kv_stride_t;
  float x[kPerThread];
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) x[j] = to_float(kv_row[kPerThread * tid + j]);
  float s;
  if (p.sum_order == 0) {
    s = __fadd_rn(__fmaf_rn(x[0], x[0], __fmul_rn(x[1], x[1])), __fmaf_rn(x[2], x[2], __fmul_rn(x[3], x[3])));
  } else {
    s = p.sum_order == 1 ? __fmaf_rn(x[0], x[0], __fmul_rn(x[1], x[1])) : __fmaf_rn(x[1], x[1], __fmul_rn(x[0], x[0]));
    s = __fmaf_rn(x[3], x[3], __fmaf_rn(x[2], x[2], s));
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, off));
  if (lane == 0) warp_sums[warp] = s;
  __syncthreads();
  float total = warp_sums[lane & (kWarps - 1)];
  total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, 2));
  total = __fadd_rn(total, __shfl_xor_sync(0xffffffffu, total, 1));
  const float inv = div_full(1.0f, __fsqrt_rn(__fmaf_rn(div_approx(1.0f, static_cast<float>(kLatent)), total, p.eps)));

  // the cache row, where its page lies inside the table and the cache
  const int64_t col = pos / p.page_size;
  const int64_t col_c = min(max(col, int64_t{0}), p.width - 1);
  const int64_t page = load_index(p.table, p.table_i64, static_cast<int64_t>(b) * p.table_stride_b + col_c);
  const bool ok = pos >= 0 && col < p.width && page >= 0 && page < p.num_pages;
  if (ok) {
    T* dst = static_cast<T*>(p.cache) + (page * p.page_size + pos % p.page_size) * kRow;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const float g = load_gamma(p.gamma, p.gamma_dtype, kPerThread * tid + j);
      dst[kPerThread * tid + j] = from_float<T>(__fmul_rn(__fmul_rn(inv, x[j]), g));
    }
    if (warp == 0) {
      float r1, r2;
      rotate(to_float(kv_row[kLatent + p1]), to_float(kv_row[kLatent + p2]), cs, sn, r1, r2);
      dst[kLatent + p1] = from_float<T>(r1);
      dst[kLatent + p2] = from_float<T>(r2);
    }
  }

  if (tid == 0) p.tok_len[t] = static_cast<int32_t>(pos + 1);
}

}  // namespace

cudaError_t launch_layer_prep(const LayerPrepParams& p, cudaStream_t stream) {
  if (p.tokens <= 0 || p.heads <= 0) return cudaSuccess;
  const dim3 grid(p.tokens, (p.heads + kHeadsPerCta - 1) / kHeadsPerCta);
  if (p.dtype == kBF16) {
    layer_prep_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  } else if (p.dtype == kFP16) {
    layer_prep_kernel<__half><<<grid, kThreads, 0, stream>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
