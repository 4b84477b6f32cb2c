// mla_prefill_wgmma.cuh: what the bf16-wgmma prefill kernels share (mla_prefill_wgmma.cu: one CTA per query block,
// P in bf16, FP8 or NVFP4; mla_prefill_persistent.cu: the persistent kernel, P in bf16): the CTA's shape and shared
// memory constants, the tensor maps and their TMA boxes, the shared-memory descriptors and the two wgmma products.
// Both translation units include it (internal linkage: each its own copy), so neither kernel's code depends on the
// other being compiled beside it (ptxas scheduled prefill_kernel differently with the persistent kernel in its unit).
#pragma once

#include "hopper.cuh"
#include "mla_prefill.h"
#include "mla_prefill_common.cuh"

#include <cstdint>
#include <cstring>

namespace mla_core_cuda {
namespace {

using prefill::aligned16;
using prefill::kMaxDevices;
using prefill::wave_blocks;

using prefill::kBM, prefill::kBN, prefill::kDv;  // 128 query rows a CTA, 64-key tiles, v 128
constexpr int kDqk = 192, kStages = 4;
constexpr int kThreads = 384;                           // 2 consumer warpgroups + the producer warpgroup
constexpr int kProducerRegs = 80, kConsumerRegs = 208;  // setmaxnreg: 80 + 2 x 208 <= 3 x 168
constexpr int kBarTurn0 = 1, kBarTurn1 = 2, kPairThreads = 256;
constexpr int kBarQCodes0 = 3, kWgThreads = 128;         // named barriers 3 / 4: a warpgroup's Q codes written
constexpr int kSlab = 64 * 128;                         // one [64 rows x 128 B] slab
constexpr int kQWgBytes = 64 * kDqk * 2;                // one consumer's Q rows: 3 slabs
constexpr int kKBytes = kBN * kDqk * 2;                 // K tile: 3 slabs
constexpr int kVBytes = kBN * kDv * 2;                  // V tile: 2 slabs (row-major: the MN-major operand)
constexpr int kStageBytes = kKBytes + kVBytes;          // 40,960
constexpr int kBars = 2 + 3 * kStages;                  // fullQ, tailV, fullK[4], fullV[4], empty[4]
constexpr int kSmemBytes = 2 * kQWgBytes + kStages * kStageBytes + kBars * 8 + 1024;  // + 1024-alignment slack
constexpr int kMaxGridZ = 65535;                        // sequences per launch (grid z)
static_assert(kSmemBytes <= 232448, "shared memory per CTA (sm_90 opt-in maximum)");

struct TmaMaps {
  CUtensorMap q, k, v;
};

// K-major operand (64-row slabs), start `byte_off` bytes in: SBO 1024 (8 rows x 128 B), LBO unused (16).
__device__ __forceinline__ uint64_t kmajor_desc(const uint8_t* s) { return make_desc(smem_u32(s), 16u, 1024u); }
// V [64 keys x 128] row-major as the MN-major operand: LBO = one slab (the next 64 columns), SBO 1024 (8 keys).
__device__ __forceinline__ uint64_t mnmajor_desc(const uint8_t* s) { return make_desc(smem_u32(s), kSlab, 1024u); }
// The wgmma products, bf16 x bf16 -> f32. S: m64n64k16, A = Q and B = K rows, both K-major (`accumulate` 0: D = A B).
// P V: m64n128k16, A = P from registers (the m64k16 fragment a[0] = (row r, keys c, c + 1), a[1] = (r + 8, c..),
// a[2] = (r, c + 8..), a[3] = (r + 8, c + 8..), r = row_lo, c = 16 ks + 2 (t % 4): S's accumulator layout), B = V
// MN-major (imm-trans-b 1); always accumulates.
#define MLA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLA_F16(i) MLA_F4(i), MLA_F4(i + 4), MLA_F4(i + 8), MLA_F4(i + 12)
__device__ __forceinline__ void wgmma_s(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : MLA_F16(0), MLA_F16(16)
      : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "{\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n}\n"
      : MLA_F16(0), MLA_F16(16), MLA_F16(32), MLA_F16(48)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
#undef MLA_F16
#undef MLA_F4

// A basic-block boundary ptxas cannot remove (a branch on a row sum, never negative): without it ptxas hoisted the
// wait for P·V(j-1) above the softmax of tile j, which then no longer ran under the warpgroup's own P·V.
__device__ __forceinline__ void block_boundary(float never_negative) {
  if (never_negative < 0.f) asm volatile("trap;");
}

// X [rows, heads, d] bf16 with token / head strides (elements) as the 3D tensor (d, heads, rows), box (64, 1, 64) =
// one [64 rows x 128 B] slab with the 128-byte swizzle (the consumers' slab layout); rows past `rows` read as zeros.
bool slab_map(CUtensorMap* m, EncodeTiledFn encode, const uint16_t* x, int64_t rows, int heads, int d,
              int64_t stride_t, int64_t stride_h) {
  std::memset(m, 0, sizeof(*m));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(stride_h) * 2, static_cast<cuuint64_t>(stride_t) * 2};
  const cuuint32_t box[3] = {64, 1, 64};
  return slab_tensor_map(m, encode, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, x, dims, strides, box);
}

// The three tensor maps of a prefill call (Q, K, V as 64-row slabs); false when the encoder refuses one.
inline bool prefill_maps(const PrefillParams& p, EncodeTiledFn encode, TmaMaps& maps) {
  return slab_map(&maps.q, encode, p.q, p.total_q, p.heads, kDqk, p.q_stride_t, p.q_stride_h) &&
         slab_map(&maps.k, encode, p.k, p.total_k, p.kv_heads, kDqk, p.k_stride_t, p.k_stride_h) &&
         slab_map(&maps.v, encode, p.v, p.total_k, p.kv_heads, kDv, p.v_stride_t, p.v_stride_h);
}

}  // namespace
}  // namespace mla_core_cuda
