// FP8 top-k sparse MLA decode on Hopper WGMMA (sm_90a), DeepSeek-V3.2 on MATE's 576-byte rows: E4M3 query
// [batch, q_len, heads, 576] and cache rows [rows, 576] (512 latent + 64 RoPE values; the per-tensor scale folded
// into bmm1_scale / bmm2_scale), int32 indices [batch, q_len, top_k] (-1 = none), valid lengths per request.
// Numerics: docs/sparse.md (the reference backend's definition), up to float32 summation order.
//
// One CTA of two warpgroups per (query token and group of 64 heads, split) walks its split's valid slots in tiles of
// 64 (a split is a run of whole tiles). Per tile:
//   1. the tile's 64 cache rows were gathered two tiles ahead by cp.async through the index list into one of two
//      staging buffers (dense [64][576] codes); a slot past the valid length, -1 or outside the cache is
//      zero-filled, never read, and flagged invalid;
//   2. all 256 threads convert the codes to bf16 (exact: every E4M3 value is a bf16) into the K tile (nine
//      128-byte-swizzled slabs of [64 rows x 128 B]); Q was converted the same way once;
//   3. warpgroup w: S_w = Q K_w^T for keys 32w..32w+31 (36 x m64n32k16, float32 accumulation: exact products),
//      scaled to the log2 domain and masked (-inf); the two exchange row maxima through shared memory, so both
//      hold m1 = max(m, rowmax S_0) and m2 = max(m1, rowmax S_1); the freed staging buffer gathers tile + 2;
//   4. warpgroup w writes P_w = 2^(S_w - m_{w+1}) rounded to bf16 into a shared 64 x 64 P slab and keeps its row
//      sum from the float32 P; each warpgroup owns 256 of the 512 output columns:
//      O = O * 2^(m - m1) + P_0 V_0, then O * 2^(m1 - m2) + P_1 V_1 (m64n256k16, V = the K tile's first 512
//      columns read MN-major), as one chain when no row of the CTA has m2 != m1 (the factor is exactly 1).
// Row sums: l_0 = (l_0 * 2^(m - m1) + sum P_0) * 2^(m1 - m2), l_1 = (l_1 * 2^(m - m1)) * 2^(m1 - m2) + sum P_1,
// l = l_0 + l_1 at the end. Output o / l * bmm2_scale in bf16, LSE (m + log2 l) ln 2; a token with no valid slot
// gets 0 and -inf. With several splits each writes float32 partials and the combine kernel merges them by
// log-sum-exp (a split without a valid slot has LSE -inf and weight 0).
// Layout, descriptors and ordering rules: docs/cuda.md ("Hopper building blocks, verified"); measured against the
// probe it grew from (benchmarks/probes/sparse_wgmma_probe.cu, variant B): benchmarks/NOTES.md.

#include "hopper.cuh"
#include "mla_sparse.h"

#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_sparse_wgmma.cu is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

constexpr int kHeads = 64;                // heads per CTA: the wgmma M
constexpr int kKeys = 64;                 // slots per tile
constexpr int kRow = 576;                 // bytes of a cache row / query row (E4M3 codes)
constexpr int kNope = 512;                // V width
constexpr int kChunks = kRow / 16;        // 16-byte chunks of codes per row
constexpr int kThreads = 256;             // two warpgroups
constexpr int kSlab = kKeys * 128;        // one [64 rows x 128 B] slab
constexpr int kBf16Bytes = 9 * kSlab;     // a [64 x 576] bf16 operand: 9 slabs (Q, the K tile)
constexpr int kStageBytes = kKeys * kRow; // one staging buffer: 64 rows of codes
constexpr int kOffK = kBf16Bytes, kOffStage = kOffK + kBf16Bytes, kOffP = kOffStage + 2 * kStageBytes,
              kOffX = kOffP + kSlab,              // [2 warpgroups][64 rows] floats: maxima, at the end row sums
              kOffValid = kOffX + 2 * kHeads * 4, // [2 stages][64 slots] validity flags
              kSmemBytes = kOffValid + 2 * kKeys + 1024;  // + alignment slack: slabs start 1024-aligned
constexpr int kMaxSplits = 32;
constexpr int kMaxDevices = 64;           // devices whose shared-memory attribute is remembered
constexpr float kLn2 = 0.6931471805599453f;
static_assert(kSmemBytes <= 232448, "shared memory per CTA (sm_90 opt-in maximum)");
static_assert(kThreads == 4 * kKeys && kChunks % 4 == 0, "convert: 4 threads per row, chunks in groups of 4");

// The first 1024-aligned address at or after p, as p plus an offset (so accesses through it stay LDS/STS).
__device__ __forceinline__ uint8_t* shared_align1024(uint8_t* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}
// Byte offset of (row, byte) in a 64-row slab operand: slab byte / 128, 16-byte chunk position swizzled by row % 8.
__device__ __forceinline__ uint32_t slab_off(uint32_t row, uint32_t byte) {
  return (byte >> 7) * kSlab + row * 128u + ((((byte >> 4) & 7u) ^ (row & 7u)) << 4) + (byte & 15u);
}
// K-major operand (slabs), the k16 step `kbyte` bytes into each row: SBO 1024 (8 rows), LBO unused (16).
__device__ __forceinline__ uint64_t kmajor_desc(const uint8_t* s, uint32_t kbyte) {
  return make_desc(smem_u32(s) + (kbyte >> 7) * kSlab + (kbyte & 127u), 16u, 1024u);
}
// MN-major operand (V: rows = keys, slabs along the output columns), the k16 step at key k0: LBO = one slab
// (the next 64 columns), SBO 1024 (the next 8 keys).
__device__ __forceinline__ uint64_t mnmajor_desc(const uint8_t* s, uint32_t k0) {
  return make_desc(smem_u32(s) + k0 * 128u, kSlab, 1024u);
}
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
// Waits until at most one cp.async group of this thread is still in flight.
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }
__device__ __forceinline__ float exp2_approx(float x) {  // 2^x; -inf gives +0
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {  // nearest even, lo in the low half
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The two wgmma shapes, bf16 x bf16 -> f32 (`accumulate` 0: D = A B, else D += A B). S: m64n32k16, A = Q and
// B = K rows, both K-major. P V: m64n256k16, A = P K-major, B = V MN-major (transposed, imm-trans-b 1).
#define MLA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLA_F16(i) MLA_F4(i), MLA_F4(i + 4), MLA_F4(i + 8), MLA_F4(i + 12)
__device__ __forceinline__ void wgmma_s(float (&d)[16], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : MLA_F16(0)
      : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_pv(float (&d)[128], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, p, 1, 1, 0, 1;\n}\n"
      : MLA_F16(0), MLA_F16(16), MLA_F16(32), MLA_F16(48), MLA_F16(64), MLA_F16(80), MLA_F16(96), MLA_F16(112)
      : "l"(da), "l"(db), "r"(accumulate));
}
#undef MLA_F16
#undef MLA_F4

// Gathers slots pos0 .. pos0 + 63 (tile rows 0..63) into `stage` ([64][576] codes) and their flags into `valid`,
// then commits one cp.async group. A slot is valid when it is below `end`, its index is >= 0 and below the cache's
// row count; an invalid slot's row is zero-filled and nothing is read for it. Warp w copies tile rows w, w + 8, ..;
// lane l chunks l and l + 32 (< 36) of each; lanes 0..7 read the warp's 8 indices and broadcast the row offsets.
__device__ __forceinline__ void gather_tile(const SparseDecodeParams& p, const int32_t* idx, int pos0, int end,
                                            uint8_t* stage, uint8_t* valid) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  int64_t my_off = -1;  // byte offset of tile row warp + 8 * lane in the cache; -1: not a key
  if (lane < 8) {
    const int slot = pos0 + warp + 8 * lane;
    if (slot < end) {
      const int64_t row = idx[slot];
      if (row >= 0 && row < p.rows) my_off = row * kRow;
    }
    valid[warp + 8 * lane] = my_off >= 0;
  }
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t off = __shfl_sync(0xffffffffu, my_off, j);
    uint8_t* dst = stage + (warp + 8 * j) * kRow;
#pragma unroll
    for (int c = lane; c < kChunks; c += 32)
      cp_async16(dst + 16 * c, off >= 0 ? p.cache + off + 16 * c : p.cache, off >= 0 ? 16u : 0u);
  }
  cp_async_commit();
}

// The staged codes as bf16 into the K tile's slabs: thread t converts row t / 4, code chunks 4j + t % 4 (j < 9),
// which become bf16 chunks 2 (t % 4) and 2 (t % 4) + 1 of slab j (every address a per-thread base plus a constant;
// a warp's 16-byte accesses are free of bank conflicts).
__device__ __forceinline__ void convert_tile(uint8_t* sk, const uint8_t* stage) {
  const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
  const uint8_t* src = stage + r * kRow + 16 * q;
  uint8_t* dst = sk + r * 128;
  const int c0 = ((2 * q) ^ (r & 7)) << 4, c1 = ((2 * q + 1) ^ (r & 7)) << 4;
#pragma unroll
  for (int j = 0; j < kChunks / 4; ++j) {
    uint4 lo, hi;
    e4m3x16_to_bf16(*reinterpret_cast<const uint4*>(src + 64 * j), lo, hi);
    *reinterpret_cast<uint4*>(dst + j * kSlab + c0) = lo;
    *reinterpret_cast<uint4*>(dst + j * kSlab + c1) = hi;
  }
}

// The CTA's 64 query rows (heads h0..h0+63 of token `tok`) as bf16 slabs, by 16-byte loads.
__device__ __forceinline__ void load_query(uint8_t* sq, const SparseDecodeParams& p, int64_t tok, int h0) {
  const uint8_t* src = p.query + (tok * p.heads + h0) * kRow;
  for (int i = threadIdx.x; i < kHeads * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    uint4 lo, hi;
    e4m3x16_to_bf16(*reinterpret_cast<const uint4*>(src + r * kRow + 16 * c), lo, hi);
    *reinterpret_cast<uint4*>(sq + slab_off(r, 32 * c)) = lo;
    *reinterpret_cast<uint4*>(sq + slab_off(r, 32 * c + 16)) = hi;
  }
}

// A split without a valid slot: with one split the rows' output is 0 and LSE -inf; else its partial LSE is -inf
// (the combine gives it weight 0 and never reads its partial output).
__device__ void write_empty(const SparseDecodeParams& p, int64_t tok, int split, int h0) {
  if (p.num_splits == 1) {
    uint32_t* out = reinterpret_cast<uint32_t*>(p.out + (tok * p.heads + h0) * kNope);
    for (int i = threadIdx.x; i < kHeads * kNope / 2; i += kThreads) out[i] = 0u;
    if (threadIdx.x < kHeads) p.lse[tok * p.heads + h0 + threadIdx.x] = -INFINITY;
  } else if (threadIdx.x < kHeads) {
    p.part_lse[(tok * p.num_splits + split) * p.heads + h0 + threadIdx.x] = -INFINITY;
  }
}

// This warpgroup's 256 output columns of the thread's rows lo and hi = lo + 8 (o[j] at column 8 (j / 4) + j % 2
// from the thread's first column, row hi when j % 4 >= 2), times bmm2_scale / l; warpgroup 0 writes the LSE.
__device__ __forceinline__ void store_rows(const SparseDecodeParams& p, const float (&o)[128], int64_t tok, int split,
                                           int h_lo, float m_lo, float m_hi, float l_lo, float l_hi) {
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int col0 = 256 * wg + 2 * (t & 3);
  const float inv_lo = l_lo > 0.f ? p.bmm2_scale / l_lo : 0.f, inv_hi = l_hi > 0.f ? p.bmm2_scale / l_hi : 0.f;
  const float lse_lo = l_lo > 0.f ? (m_lo + __log2f(l_lo)) * kLn2 : -INFINITY;
  const float lse_hi = l_hi > 0.f ? (m_hi + __log2f(l_hi)) * kLn2 : -INFINITY;
  const bool lse_writer = wg == 0 && (t & 3) == 0;
  if (p.num_splits == 1) {
    const int64_t row = tok * p.heads + h_lo;
    uint32_t* out_lo = reinterpret_cast<uint32_t*>(p.out + row * kNope + col0);
    uint32_t* out_hi = out_lo + 8 * kNope / 2;
#pragma unroll
    for (int j = 0; j < 128; j += 4) {
      out_lo[4 * (j >> 2)] = bf16x2_bits(o[j] * inv_lo, o[j + 1] * inv_lo);
      out_hi[4 * (j >> 2)] = bf16x2_bits(o[j + 2] * inv_hi, o[j + 3] * inv_hi);
    }
    if (lse_writer) {
      p.lse[row] = lse_lo;
      p.lse[row + 8] = lse_hi;
    }
  } else {
    const int64_t row = (tok * p.num_splits + split) * p.heads + h_lo;
    float* part_lo = p.part_o + row * kNope + col0;
    float* part_hi = part_lo + 8 * kNope;
#pragma unroll
    for (int j = 0; j < 128; j += 4) {
      *reinterpret_cast<float2*>(part_lo + 8 * (j >> 2)) = make_float2(o[j] * inv_lo, o[j + 1] * inv_lo);
      *reinterpret_cast<float2*>(part_hi + 8 * (j >> 2)) = make_float2(o[j + 2] * inv_hi, o[j + 3] * inv_hi);
    }
    if (lse_writer) {
      p.part_lse[row] = lse_lo;
      p.part_lse[row + 8] = lse_hi;
    }
  }
}

// 2^(from - to); 1 when `to` is -inf (no valid key yet: the factor multiplies zeros).
__device__ __forceinline__ float rescale_factor(float from, float to) {
  return to == -INFINITY ? 1.f : exp2_approx(from - to);
}

__global__ void __launch_bounds__(kThreads, 1) sparse_decode_kernel(const SparseDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = shared_align1024(smem_raw);
  uint8_t* sk = sq + kOffK;
  uint8_t* sstage = sq + kOffStage;
  uint8_t* sp = sq + kOffP;
  float* sx = reinterpret_cast<float*>(sq + kOffX);
  uint8_t* sval = sq + kOffValid;
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int groups = p.heads / kHeads;  // head groups of a token are neighbours in launch order (shared rows in L2)
  const int64_t tok = blockIdx.x / groups;
  const int split = blockIdx.y, h0 = static_cast<int>(blockIdx.x % groups) * kHeads;
  const int b = static_cast<int>(tok / p.q_len);
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);  // the thread's accumulator rows: row_lo, row_lo + 8

  // The split's slots [start, end): ceil(tiles / splits) whole tiles of the valid slots each.
  const int len = min(max(p.valid_lens[b], 0), p.top_k);
  const int tiles = (len + kKeys - 1) / kKeys, per_split = (tiles + p.num_splits - 1) / p.num_splits;
  const int start = split * per_split * kKeys, end = min(start + per_split * kKeys, len);
  if (start >= end) {
    write_empty(p, tok, split, h0);
    return;
  }
  const int32_t* idx = p.indices + tok * p.top_k;
  const int ntiles = (end - start + kKeys - 1) / kKeys;
  gather_tile(p, idx, start, end, sstage, sval);  // cp.async groups: tiles 0 and 1, then one per tile
  if (ntiles > 1) gather_tile(p, idx, start + kKeys, end, sstage + kStageBytes, sval + kKeys);
  else cp_async_commit();
  load_query(sq, p, tok, h0);

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: this warpgroup's keys, 8 of 32 per thread
  for (int it = 0; it < ntiles; ++it) {
    const int st = it & 1;
    uint8_t* stage = sstage + st * kStageBytes;
    // Tile it has landed (this thread's copies); the barrier publishes every thread's copies, flags and Q, and
    // says both warpgroups are done with the previous tile's K tile, P slab and maxima.
    cp_async_wait_one();
    __syncthreads();
    convert_tile(sk, stage);
    fence_proxy_async();  // the converted tile (and Q) are wgmma operands
    __syncthreads();

    float s[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) s[j] = 0.f;
    reg_fence(s);
    wg_fence();
    const uint8_t* kw = sk + wg * 32 * 128;  // rows 32w.. of every slab (the same swizzle phase)
#pragma unroll
    for (int ks = 0; ks < kRow / 16; ++ks) wgmma_s(s, kmajor_desc(sq, 32 * ks), kmajor_desc(kw, 32 * ks), ks > 0);
    wg_commit();
    wgmma_wait_all();
    reg_fence(s);

    const uint8_t* flag = sval + st * kKeys + 32 * wg;
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float x = flag[8 * (j >> 2) + 2 * (t & 3) + (j & 1)] ? s[j] * p.scale_log2 : -INFINITY;
      s[j] = x;
      if (j & 2) mx_hi = fmaxf(mx_hi, x);
      else mx_lo = fmaxf(mx_lo, x);
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, d));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, d));
    }
    if ((t & 3) == 0) {
      sx[wg * kHeads + row_lo] = mx_lo;
      sx[wg * kHeads + row_lo + 8] = mx_hi;
    }
    __syncthreads();  // maxima published; both warpgroups' reads of this stage (S, flags) are done
    if (it + 2 < ntiles) gather_tile(p, idx, start + (it + 2) * kKeys, end, stage, sval + st * kKeys);
    else cp_async_commit();  // an empty group keeps the wait count uniform
    const float m1_lo = fmaxf(m_lo, sx[row_lo]), m1_hi = fmaxf(m_hi, sx[row_lo + 8]);
    const float m2_lo = fmaxf(m1_lo, sx[kHeads + row_lo]), m2_hi = fmaxf(m1_hi, sx[kHeads + row_lo + 8]);
    const float a1_lo = rescale_factor(m_lo, m1_lo), a1_hi = rescale_factor(m_hi, m1_hi);
    const float a2_lo = rescale_factor(m1_lo, m2_lo), a2_hi = rescale_factor(m1_hi, m2_hi);
    const float own_lo = wg == 0 ? m1_lo : m2_lo, own_hi = wg == 0 ? m1_hi : m2_hi;
    const float base_lo = own_lo == -INFINITY ? 0.f : own_lo, base_hi = own_hi == -INFINITY ? 0.f : own_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float e = exp2_approx(s[j] - ((j & 2) ? base_hi : base_lo));  // masked: 2^-inf = 0
      s[j] = e;
      if (j & 2) sum_hi += e;
      else sum_lo += e;
    }
    // warpgroup 0 adds its sum before the factor 2^(m1 - m2), warpgroup 1 after
    l_lo = wg == 0 ? (l_lo * a1_lo + sum_lo) * a2_lo : (l_lo * a1_lo) * a2_lo + sum_lo;
    l_hi = wg == 0 ? (l_hi * a1_hi + sum_hi) * a2_hi : (l_hi * a1_hi) * a2_hi + sum_hi;
    m_lo = m2_lo;
    m_hi = m2_hi;
#pragma unroll
    for (int j = 0; j < 16; j += 4) {  // this warpgroup's 32 keys of P, bf16 pairs
      const int key = 32 * wg + 8 * (j >> 2) + 2 * (t & 3);
      *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, 2 * key)) = bf16x2_bits(s[j], s[j + 1]);
      *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, 2 * key)) = bf16x2_bits(s[j + 2], s[j + 3]);
    }
    fence_proxy_async();
    const bool rescale2 = __syncthreads_or(a2_lo != 1.f || a2_hi != 1.f);  // also publishes the P slab
    scale_rows(o, a1_lo, a1_hi);
    const uint8_t* sv = sk + wg * 4 * kSlab;  // V columns 256w..256w+255: slabs 4w..4w+3
    // Each branch holds its whole wgmma sequence, wait and register tie (no wgmma state across the merge).
    if (rescale2) {
      wg_fence();
      wgmma_pv(o, kmajor_desc(sp, 0), mnmajor_desc(sv, 0), 1);
      wgmma_pv(o, kmajor_desc(sp, 32), mnmajor_desc(sv, 16), 1);
      wg_commit();
      wgmma_wait_all();
      reg_fence(o);
      scale_rows(o, a2_lo, a2_hi);
      wg_fence();
      wgmma_pv(o, kmajor_desc(sp, 64), mnmajor_desc(sv, 32), 1);
      wgmma_pv(o, kmajor_desc(sp, 96), mnmajor_desc(sv, 48), 1);
      wg_commit();
      wgmma_wait_all();
      reg_fence(o);
    } else {
      wg_fence();
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) wgmma_pv(o, kmajor_desc(sp, 32 * ks), mnmajor_desc(sv, 16 * ks), 1);
      wg_commit();
      wgmma_wait_all();
      reg_fence(o);
    }
  }
  cp_async_wait_all();  // the trailing empty groups
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
  }
  if ((t & 3) == 0) {  // the last tile's maxima were read before its P barrier
    sx[wg * kHeads + row_lo] = l_lo;
    sx[wg * kHeads + row_lo + 8] = l_hi;
  }
  __syncthreads();
  store_rows(p, o, tok, split, h0 + row_lo, m_lo, m_hi, sx[row_lo] + sx[kHeads + row_lo],
             sx[row_lo + 8] + sx[kHeads + row_lo + 8]);
}

// One CTA of 128 threads per (token, head), 4 columns each: out = sum_i exp(lse_i - lse) o_i over the splits with
// a valid slot, lse = log sum_i exp(lse_i); none: 0 and -inf.
__global__ void __launch_bounds__(128) sparse_combine_kernel(const SparseDecodeParams p) {
  const int64_t tok = blockIdx.x / p.heads;
  const int h = static_cast<int>(blockIdx.x % p.heads), c = 4 * threadIdx.x;
  const float* lse_part = p.part_lse + tok * p.num_splits * p.heads + h;
  float top = -INFINITY;
  for (int i = 0; i < p.num_splits; ++i) top = fmaxf(top, lse_part[i * p.heads]);
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  float lse = -INFINITY;
  if (top != -INFINITY) {
    float total = 0.f;
    for (int i = 0; i < p.num_splits; ++i) total += expf(lse_part[i * p.heads] - top);  // -inf: 0
    lse = top + logf(total);
    for (int i = 0; i < p.num_splits; ++i) {
      const float li = lse_part[i * p.heads];
      if (li == -INFINITY) continue;
      const float w = expf(li - lse);
      const float4 v = *reinterpret_cast<const float4*>(p.part_o + ((tok * p.num_splits + i) * p.heads + h) * kNope + c);
      acc.x += w * v.x;
      acc.y += w * v.y;
      acc.z += w * v.z;
      acc.w += w * v.w;
    }
  }
  uint32_t* out = reinterpret_cast<uint32_t*>(p.out + (tok * p.heads + h) * kNope + c);
  out[0] = bf16x2_bits(acc.x, acc.y);
  out[1] = bf16x2_bits(acc.z, acc.w);
  if (threadIdx.x == 0) p.lse[tok * p.heads + h] = lse;
}

}  // namespace

bool sparse_decode_wgmma_supported(const SparseDecodeParams& p) {
  const int64_t tokens = static_cast<int64_t>(p.batch) * p.q_len;
  return p.heads > 0 && p.heads % kHeads == 0 && p.q_len >= 1 && p.batch >= 0 && p.top_k > 0 &&
         p.top_k % kKeys == 0 && p.num_splits >= 1 && p.num_splits <= kMaxSplits && p.rows >= 0 &&
         tokens * p.heads < (int64_t{1} << 31);
}

cudaError_t launch_sparse_decode_wgmma(const SparseDecodeParams& p, cudaStream_t stream) {
  if (!sparse_decode_wgmma_supported(p)) return cudaErrorInvalidValue;
  const int64_t tokens = static_cast<int64_t>(p.batch) * p.q_len;
  if (tokens == 0) return cudaSuccess;
  // Once per device (not a stream operation: capture-safe).
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(sparse_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const dim3 grid(static_cast<unsigned>(tokens * (p.heads / kHeads)), static_cast<unsigned>(p.num_splits));
  sparse_decode_kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  sparse_combine_kernel<<<static_cast<unsigned>(tokens * p.heads), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
