// The nvfp4 recipe's pre-pass of the varlen prefill (the bf16-wgmma kernel, mla_prefill_wgmma.cu, then runs on its
// outputs; with P's NVFP4 that kernel makes Q's values itself, by the same nvfp4_row_block): Q, K and V fake-quantized to NVFP4 as mla_core.numerics.qdq_nvfp4 defines it (E2M1 values in blocks of
// 16, each block's E4M3 code c = e4m3(bmax / 6 / g), the per-tensor global scale g = amax / 2688), written WITHOUT g:
// e2m1(x / (c·g))·c, exact in bf16 (an E2M1 value times an E4M3 code has at most 6 significant bits and lies in
// 2^-10 .. 2688; benchmarks/probes/nvfp4_e4m3_representable.py checks every pair). The caller folds g into the
// kernel's score scale (Q's and K's) and output scale (V's). So the kernel's operands are numerics' dequantized
// values divided by g exactly as products of codes; numerics' own value RN(e2m1·RN(c·g)) differs from (e2m1·c)·g by
// at most one float32 rounding (2^-24 relative), far below the bf16 outputs' rounding.
//
// Blocks: Q and K along features (numerics' dim -1: 12 blocks of a 192-wide row), V along keys from each sequence's
// first key (the reference's qdq of v[k0:k1] with dim 0; the last block of a sequence holds only its keys). Rules as
// numerics: the block code from two correctly rounded divisions (qdq.cuh's nvfp4_block_scale), the value quotient
// correctly rounded (nvfp4_quotient: IEEE or the division-free form), an all-zero block gives zeros, a block holding
// a NaN becomes all NaN (its code is NaN), ±Inf saturates (code 448, value ±6).
//
// rows_kernel: one thread per block of 16 features (two 16-byte loads, qdq.cuh's nvfp4_row_block, two stores),
// grid-stride over the operands' concatenated blocks. keys_kernel: one thread per (16-key block of a sequence, kv head, 4 columns): its 16 rows' 8
// bytes (one 256-byte row of a head spread over 32 consecutive threads: coalesced), 4 blocks (one per column).
// Sequence b's block i is slot start_b / 16 + b + i (start_b its clamped first key): no two sequences' blocks share
// a slot for non-decreasing cu_seqlens_k, total_k / 16 + batch + 1 slots hold them all, found by binary search
// (nothing read on the host: a call can be captured).

#include "mla_prefill.h"
#include "mla_prefill_common.cuh"
#include "qdq.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mla_core_cuda {
namespace {

using prefill::aligned16;
using prefill::wave_blocks;

constexpr int kBlock = 16;       // NVFP4 block
constexpr int kRowBlocks = 12;   // 192 / 16
constexpr int kVChunks = 32;     // 128 columns / 4 per thread

__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

template <bool kExact>
__global__ void __launch_bounds__(256) rows_kernel(const Nvfp4RowsJobs jobs, int64_t total_blocks) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t n0 = jobs.rows[0] * jobs.heads[0] * kRowBlocks, n1 = jobs.rows[1] * jobs.heads[1] * kRowBlocks;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total_blocks; i += step) {
    const int j = i < n0 ? 0 : (i < n0 + n1 ? 1 : 2);
    const int64_t b = i - (j == 0 ? 0 : (j == 1 ? n0 : n0 + n1));
    const int heads = jobs.heads[j];
    const int64_t row = b / kRowBlocks;
    const int f = kBlock * static_cast<int>(b % kRowBlocks);
    const int64_t token = row / heads;
    const int h = static_cast<int>(row % heads);
    const uint4* src = reinterpret_cast<const uint4*>(jobs.x[j] + token * jobs.stride_t[j] + h * jobs.stride_h[j] + f);
    const uint4 w0 = __ldg(src), w1 = __ldg(src + 1);
    uint32_t o[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
    nvfp4_row_block<kExact>(o, jobs.g[j]);
    uint4* dst = reinterpret_cast<uint4*>(jobs.out[j] + b * kBlock);
    dst[0] = make_uint4(o[0], o[1], o[2], o[3]);
    dst[1] = make_uint4(o[4], o[5], o[6], o[7]);
  }
}

__device__ __forceinline__ int64_t first_slot16(int start, int b) { return start / kBlock + b; }

template <bool kExact>
__global__ void __launch_bounds__(256) keys_kernel(const Nvfp4KeysParams p, int64_t items) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t it = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; it < items; it += step) {
    const int chunk = static_cast<int>(it % kVChunks);
    const int hk = static_cast<int>((it / kVChunks) % p.kv_heads);
    const int64_t slot = it / (static_cast<int64_t>(kVChunks) * p.kv_heads);
    int lo = 0, hi = p.batch - 1;  // the last sequence whose first slot is <= slot (first slots are increasing)
    while (lo < hi) {
      const int mid = (lo + hi + 1) >> 1;
      int s, l;
      prefill::seq_range(p.cu_k, mid, p.total_k, s, l);
      if (first_slot16(s, mid) <= slot) lo = mid; else hi = mid - 1;
    }
    int start, len;
    prefill::seq_range(p.cu_k, lo, p.total_k, start, len);
    const int64_t i = slot - first_slot16(start, lo);
    if (i < 0 || i * kBlock >= len) continue;
    const int keys = static_cast<int>(min(static_cast<int64_t>(kBlock), len - i * kBlock));
    const int64_t row0 = start + i * kBlock;
    uint2 w[kBlock];
#pragma unroll
    for (int r = 0; r < kBlock; ++r)
      w[r] = r < keys ? __ldg(reinterpret_cast<const uint2*>(p.v + (row0 + r) * p.v_stride_t + hk * p.v_stride_h +
                                                             4 * chunk))
                      : make_uint2(0u, 0u);
    // column c of the chunk: word c / 2 of each row, low or high half
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      float x[kBlock];
#pragma unroll
      for (int r = 0; r < kBlock; ++r) {
        const uint32_t word = (c >> 1) == 0 ? w[r].x : w[r].y;
        x[r] = (c & 1) ? bf16_hi(word) : bf16_lo(word);
      }
      const BlockScale bs = nvfp4_block_scale(nvfp4_block_max(x, keys), p.g);
#pragma unroll
      for (int r = 0; r < kBlock; ++r) {
        const uint32_t v = __float_as_uint(nvfp4_value<kExact>(x[r], bs)) >> 16;  // exact: the low half is zero
        uint32_t& word = (c >> 1) == 0 ? w[r].x : w[r].y;
        word = (c & 1) ? ((word & 0x0000ffffu) | (v << 16)) : ((word & 0xffff0000u) | v);
      }
    }
#pragma unroll
    for (int r = 0; r < kBlock; ++r)
      if (r < keys)
        *reinterpret_cast<uint2*>(p.out + ((row0 + r) * p.kv_heads + hk) * prefill::kDv + 4 * chunk) = w[r];
  }
}

// A grid-stride kernel of the pre-pass over `items` threads: one wave of the CTAs it can hold (rows: 39-40 registers,
// 6 per SM, not 8; keys: ~100, 2), each kernel's count asked once per device.
template <typename Params>
cudaError_t launch_wave(void (*kernel)(Params, int64_t), int (&resident)[prefill::kMaxDevices], const Params& p,
                        int64_t items, cudaStream_t stream) {
  int per_sm = 0;
  cudaError_t err = prefill::resident_ctas(kernel, resident, per_sm);
  if (err != cudaSuccess) return err;
  unsigned blocks = 0;
  err = wave_blocks(items, blocks, per_sm);
  if (err != cudaSuccess) return err;
  kernel<<<blocks, 256, 0, stream>>>(p, items);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_nvfp4_rows_bf16(const Nvfp4RowsJobs& jobs, bool exact_div, cudaStream_t stream) {
  int64_t total = 0;
  for (int j = 0; j < 3; ++j) {
    if (jobs.rows[j] == 0) continue;
    if (jobs.rows[j] < 0 || jobs.heads[j] < 1 || !aligned16(jobs.x[j]) || !aligned16(jobs.out[j]) ||
        jobs.stride_t[j] <= 0 || jobs.stride_h[j] <= 0 || jobs.stride_t[j] % 8 != 0 || jobs.stride_h[j] % 8 != 0)
      return cudaErrorInvalidValue;
    total += jobs.rows[j] * jobs.heads[j] * kRowBlocks;
  }
  if (total == 0) return cudaSuccess;
  static int resident[2][prefill::kMaxDevices] = {};
  return exact_div ? launch_wave(rows_kernel<true>, resident[1], jobs, total, stream)
                   : launch_wave(rows_kernel<false>, resident[0], jobs, total, stream);
}

cudaError_t launch_nvfp4_keys_bf16(const Nvfp4KeysParams& p, bool exact_div, cudaStream_t stream) {
  if (p.total_k < 1 || p.total_k >= (int64_t{1} << 31) || p.kv_heads < 1 || p.batch < 1 || !p.cu_k ||
      !aligned16(p.v) || !aligned16(p.out) || p.v_stride_t <= 0 || p.v_stride_h <= 0 || p.v_stride_t % 8 != 0 ||
      p.v_stride_h % 8 != 0)
    return cudaErrorInvalidValue;
  const int64_t items = (p.total_k / kBlock + p.batch + 1) * p.kv_heads * kVChunks;
  static int resident[2][prefill::kMaxDevices] = {};
  return exact_div ? launch_wave(keys_kernel<true>, resident[1], p, items, stream)
                   : launch_wave(keys_kernel<false>, resident[0], p, items, stream);
}

}  // namespace mla_core_cuda
