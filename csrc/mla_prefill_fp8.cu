// The fp8 recipe's varlen MLA prefill on FP8 wgmma (sm_90a): Q, K, V and P as FP8 E4M3 codes (mla_core.numerics'
// per-tensor fp8 QDQ, the factors folded into the score scale and O's scale), S = Q·Kᵀ and P·V on e4m3 tensor cores
// with f32 accumulation. Shapes and numerics as mla_prefill_wgmma.cu, through what both take from
// mla_prefill_common.cuh (q / k 192, v 128, 64-key P tiles at absolute positions, the running maximum once per
// tile, P = 2^(s·scale·log2 e - m), its codes e4m3(P / p_scale), the row sum of the float32 P, LSE = (m + log2
// l)·ln 2), except the products' summation: Hopper's FP8 MMA adds its k32
// products with reduced precision, so S carries a relative error (numerics.FP8_MMA_LSE_RTOL) and each tile's P·V
// goes into a fresh accumulator that is then added to O in f32 (the error bounded per tile, not per sequence).
//
// Pre-pass (tile_images_kernel): per 64-key tile of a sequence and kv head, one contiguous 20 KB "tile image" of
// codes: K [64 keys x 192] as three [64 x 64 B] parts, V^T [128 x 64 keys] as one [128 x 64 B] part, every part
// K-major with the 64-byte swizzle (hopper.cuh, make_desc_sw64); keys past the sequence's end are zero codes in
// both. V^T's key positions are permuted inside each 32-key group (key 8g + 2c + b at position 16(g / 2) + 4c +
// 2(g % 2) + b, g, c in 0..3, b in 0..1) so that the S accumulator's registers, as a thread holds them, are P's
// FP8 A fragments (a[0] = row r, positions 4c..4c+3, a[1] = row r + 8, a[2] / a[3] positions 16 + 4c..: the
// register layout of an m64k32 e4m3 A operand): no shuffle in the kernel. Sequence b's tile i is image slot
// (start_b / 64 + b + i) of kv head hk (start_b the sequence's clamped first key): slots never overlap for
// non-decreasing cu_seqlens_k, and total_k / 64 + batch + 1 slots hold every tile, so nothing is read on the host.
//
// Kernel (prefill_fp8_kernel; mla_prefill_wgmma.cu's schedule, one CTA of 384 threads per (128 query rows, head,
// sequence), longest causal blocks first):
//   - producer warp 8 (warps 9-11 exit after setmaxnreg): lane 0 moves each tile image with ONE bulk copy into an
//     8-stage ring (20 KB a stage), completing on the stage's full barrier (arrive.expect_tx of 20,480 bytes);
//   - consumer warpgroups 0 and 1 (rows 0-63 / 64-127): each thread loads its Q elements from global memory once and
//     keeps their codes as the A fragments of the 6 k32 steps (24 registers); the warpgroups take turns (ping-pong)
//     issuing S(j) (6 x m64n64k32, A from registers, B = K's parts) and P(j-1)·V(j-1) (2 x m64n128k32 into a fresh
//     accumulator, A = P's codes from registers, B = V^T), so one's softmax runs under the other's products.
// Synchronization: full[s] (count 1: the producer's arrive.expect_tx; tile i completes phase i / 8 of stage i % 8),
// empty[s] (count 8: lane 0 of each consumer warp after the wait covering the tile's P·V, its last read of the
// stage); named barriers 1 / 2 (TURN0 / TURN1, 256 consumer threads) order the turns exactly as in
// mla_prefill_wgmma.cu (without its Q and tail barriers: Q is in registers and the tail's zeros are in the image).

#include "hopper.cuh"
#include "mla_prefill.h"
#include "mla_prefill_common.cuh"
#include "qdq.cuh"

#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_prefill_fp8.cu is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

using prefill::kMaxDevices;

using prefill::kBM, prefill::kBN, prefill::kDv;  // 128 query rows a CTA, 64-key tiles, v 128
constexpr int kDqk = 192, kStages = 8;
constexpr int kThreads = 384;                           // 2 consumer warpgroups + the producer warpgroup
constexpr int kProducerRegs = 24, kConsumerRegs = 240;  // setmaxnreg: 24 + 2 x 240 <= 3 x 168
constexpr int kBarTurn0 = 1, kBarTurn1 = 2, kPairThreads = 256;
constexpr int kBarQCodes0 = 3, kWgThreads = 128;        // named barriers 3 / 4: a warpgroup's Q codes written
constexpr int kKPart = kBN * 64;                        // one K part: [64 keys x 64 B], features 64 p .. 64 p + 63
constexpr int kVtOffset = 3 * kKPart;                   // V^T [128 x 64 B] after K's three parts
constexpr int kImage = kFp8TileImageBytes;              // 20,480: one bulk copy a stage
constexpr int kQWgBytes = 3 * kKPart;                   // one consumer's Q codes: 64 rows x 192 B, K's layout
constexpr int kSmemBytes = kStages * kImage + 2 * kQWgBytes + 2 * kStages * 8 + 1024;  // + 1024-alignment slack
constexpr int kMaxGridZ = 65535;
static_assert(kImage == 3 * kKPart + kDv * kBN && kImage % 1024 == 0, "a tile image: K's parts, then V^T");
static_assert(kSmemBytes <= 232448, "shared memory per CTA (sm_90 opt-in maximum)");

// Byte offset of (row r, byte b) in a [rows x 64 B] part with the 64-byte swizzle (b a multiple of 8 here).
__host__ __device__ constexpr int sw64(int r, int b) { return r * 64 + ((((b >> 4) ^ (r >> 1)) & 3) << 4) + (b & 15); }

// The key at V^T position p (0..63) of a tile: inside each 32-key group, position 16 h + 4 c + 2 g1 + b holds key
// 8 (2 h + g1) + 2 c + b (the thread of quad lane c holds keys 8 g + 2 c + {0, 1} of S's accumulator).
__device__ __forceinline__ int key_at(int p) {
  const int q = p & 31;
  return (p & 32) + 8 * (2 * (q >> 4) + ((q >> 1) & 1)) + 2 * ((q >> 2) & 3) + (q & 1);
}

// Two quotients' E4M3 codes (lo in the low byte): the hardware's round-to-nearest-even, saturating conversion.
__device__ __forceinline__ uint32_t e4m3x2(float lo, float hi) {
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(hi), "f"(lo));
  return codes;
}
// Four bf16 (w.x = elements 0, 1; w.y = 2, 3) -> their codes e4m3(x / scale), element 0 in the low byte.
template <bool kExact>
__device__ __forceinline__ uint32_t codes4(uint2 w, float scale, float rscale) {
  auto q = [&](uint32_t bits) { return codes_quotient<kExact>(__uint_as_float(bits), scale, rscale); };
  return e4m3x2(q(w.x << 16), q(w.x & 0xffff0000u)) | (e4m3x2(q(w.y << 16), q(w.y & 0xffff0000u)) << 16);
}
// Four P values -> their codes e4m3(p / p_scale) (div_rn: qdq.cuh's rule, the decode kernels' and the bf16
// prefill's quotient), a in the low byte.
template <bool kExact>
__device__ __forceinline__ uint32_t p_codes4(float a, float b, float c, float d, float s, float rs) {
  return e4m3x2(div_rn(a, s, rs, kExact), div_rn(b, s, rs, kExact)) |
         (e4m3x2(div_rn(c, s, rs, kExact), div_rn(d, s, rs, kExact)) << 16);
}

// The first tile image slot of sequence b, whose clamped keys start at `start` (prefill::seq_range).
__device__ __forceinline__ int first_slot(int start, int b) { return start / kBN + b; }

// One tile image (slot blockIdx.x, kv head blockIdx.y) from bf16 K / V: the codes staged in shared memory in the
// image's layout (K chunks of 8 codes to their swizzled place, V's codes row-major, then V^T gathered from them),
// then written out as 1,280 coalesced 16-byte stores. A slot no sequence's tile uses is left unwritten.
template <bool kExact>
__global__ void __launch_bounds__(256) tile_images_kernel(const Fp8TileImagesParams p) {
  __shared__ __align__(16) uint8_t img[kImage];
  __shared__ __align__(16) uint8_t vs[kBN * kDv];  // V's codes [64 keys x 128]
  const int slot = blockIdx.x, hk = blockIdx.y, tid = threadIdx.x;
  int lo = 0, hi = p.batch - 1;  // the last sequence whose first slot is <= slot (first slots are increasing)
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    int s, l;
    prefill::seq_range(p.cu_k, mid, p.total_k, s, l);
    if (first_slot(s, mid) <= slot) lo = mid; else hi = mid - 1;
  }
  int start, len;
  prefill::seq_range(p.cu_k, lo, p.total_k, start, len);
  const int i = slot - first_slot(start, lo);
  if (i < 0 || i * kBN >= len) return;
  const int keys = min(kBN, len - i * kBN);
  const int64_t row0 = start + static_cast<int64_t>(i) * kBN;
  // Thread tid's chunks of 8 features: K's tid + 256 u (u < 6: 64 keys x 24), V's tid + 256 u (u < 4: 64 keys x 16),
  // all 10 loads issued before any conversion (keys past the sequence's end: zero codes, nothing read).
  uint4 wk[6], wv[4];
#pragma unroll
  for (int u = 0; u < 6; ++u) {
    const int r = (tid + 256 * u) / 24, f = 8 * ((tid + 256 * u) % 24);
    wk[u] = r < keys ? __ldg(reinterpret_cast<const uint4*>(p.k + (row0 + r) * p.k_stride_t + hk * p.k_stride_h + f))
                     : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    const int r = (tid + 256 * u) / 16, f = 8 * ((tid + 256 * u) % 16);
    wv[u] = r < keys ? __ldg(reinterpret_cast<const uint4*>(p.v + (row0 + r) * p.v_stride_t + hk * p.v_stride_h + f))
                     : make_uint4(0u, 0u, 0u, 0u);
  }
#pragma unroll
  for (int u = 0; u < 6; ++u) {  // to the K part of features f / 64, swizzled
    const int r = (tid + 256 * u) / 24, f = 8 * ((tid + 256 * u) % 24);
    *reinterpret_cast<uint2*>(img + (f >> 6) * kKPart + sw64(r, f & 63)) =
        make_uint2(codes4<kExact>(make_uint2(wk[u].x, wk[u].y), p.k_scale, p.k_rscale),
                   codes4<kExact>(make_uint2(wk[u].z, wk[u].w), p.k_scale, p.k_rscale));
  }
#pragma unroll
  for (int u = 0; u < 4; ++u) {  // V's codes row-major, for the transpose below
    const int r = (tid + 256 * u) / 16, f = 8 * ((tid + 256 * u) % 16);
    *reinterpret_cast<uint2*>(vs + r * kDv + f) =
        make_uint2(codes4<kExact>(make_uint2(wv[u].x, wv[u].y), p.v_scale, p.v_rscale),
                   codes4<kExact>(make_uint2(wv[u].z, wv[u].w), p.v_scale, p.v_rscale));
  }
  __syncthreads();
  for (int idx = tid; idx < kDv * 4; idx += 256) {  // V^T: 128 rows x 4 chunks of 16 positions
    const int d = idx & (kDv - 1), chunk = idx >> 7;
    uint32_t w[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      w[u] = 0u;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        w[u] |= static_cast<uint32_t>(vs[key_at(16 * chunk + 4 * u + e) * kDv + d]) << (8 * e);
    }
    *reinterpret_cast<uint4*>(img + kVtOffset + sw64(d, 16 * chunk)) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  __syncthreads();
  uint4* dst = reinterpret_cast<uint4*>(p.images + (static_cast<int64_t>(slot) * p.kv_heads + hk) * kImage);
  for (int idx = tid; idx < kImage / 16; idx += 256) dst[idx] = reinterpret_cast<const uint4*>(img)[idx];
}

// The wgmma products, e4m3 x e4m3 -> f32, B K-major from shared memory; `accumulate` 0: D = A·B. S: A = Q's codes
// from shared memory (K-major). P·V: A from registers (4 x 4 codes: a[0] = row r, k 4c..4c+3; a[1] = row r + 8;
// a[2] / a[3] = k 16 + 4c.., c = t % 4).
#define MLA_F4(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define MLA_F16(i) MLA_F4(i), MLA_F4(i + 4), MLA_F4(i + 8), MLA_F4(i + 12)
__device__ __forceinline__ void wgmma_s8(float (&d)[32], uint64_t da, uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n}\n"
      : MLA_F16(0), MLA_F16(16)
      : "l"(da), "l"(db), "r"(accumulate));
}
__device__ __forceinline__ void wgmma_pv8(float (&d)[64], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, "
      "%23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, "
      "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
      : MLA_F16(0), MLA_F16(16), MLA_F16(32), MLA_F16(48)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}
#undef MLA_F16
#undef MLA_F4

template <bool kExact>
__global__ void __launch_bounds__(kThreads, 1) prefill_fp8_kernel(const PrefillFp8Params p, int b0) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sstage = align1024(smem_raw);
  uint8_t* sq = sstage + kStages * kImage;  // Q's codes, consumer warpgroup w's at sq + w kQWgBytes
  uint64_t* full = reinterpret_cast<uint64_t*>(sq + 2 * kQWgBytes);
  uint64_t* empty = full + kStages;

  prefill::Cta c;
  if (!prefill::cta_start(p, b0, c)) return;
  const int tid = c.tid, warp = c.warp, lane = c.lane, t = c.t, wg = c.wg, h = c.h, b = c.b, hk = c.hk;
  const int q_begin_seq = c.q_begin_seq, len_q = c.len_q, k_begin_seq = c.k_begin_seq, len_k = c.len_k;
  const int n = c.n, row_lo = c.row_lo, qrow_lo = c.qrow_lo;
  if (tid == 0) {
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: lane 0 of warp 8 alone stays
    setmaxnreg_dec<kProducerRegs>();
    if (tid == 256) {
      const uint8_t* src = p.images + (static_cast<int64_t>(first_slot(k_begin_seq, b)) * p.kv_heads + hk) * kImage;
      const int64_t step = static_cast<int64_t>(p.kv_heads) * kImage;  // the next slot, same kv head
      for (int i = 0; i < n; ++i) {
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(&empty[s], (i / kStages - 1) & 1);
        mbar_arrive_expect_tx(&full[s], kImage);
        bulk_copy(sstage + s * kImage, src + i * step, kImage, &full[s]);
      }
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int my_turn = wg == 0 ? kBarTurn0 : kBarTurn1, other_turn = wg == 0 ? kBarTurn1 : kBarTurn0;
  if (wg == 1) nb_arrive<kPairThreads>(kBarTurn0);  // WG0 takes the first turn
  // Q's codes in shared memory, K's layout (3 parts of [64 rows x 64 B]): the thread's own 4-byte pieces, row
  // row_lo + 8 (i % 2), features 32 ks + 16 (i / 2) + 4 (t % 4) + 0..3 (rows past the sequence's end: zeros), loaded
  // from global memory once, then fence.proxy.async and the warpgroup's named barrier before its first S.
  uint8_t* sqw = sq + wg * kQWgBytes;
  {
    uint2 w[kDqk / 32][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int qr = qrow_lo + 8 * (i & 1);
      const uint16_t* qrow = p.q + (int64_t)(q_begin_seq + qr) * p.q_stride_t + (int64_t)h * p.q_stride_h;
#pragma unroll
      for (int ks = 0; ks < kDqk / 32; ++ks)
        w[ks][i] = qr < len_q ? __ldg(reinterpret_cast<const uint2*>(qrow + 32 * ks + 16 * (i >> 1) + 4 * (t & 3)))
                              : make_uint2(0u, 0u);
    }
#pragma unroll
    for (int ks = 0; ks < kDqk / 32; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<uint32_t*>(sqw + (ks >> 1) * kKPart +
                                     sw64(row_lo + 8 * (i & 1), 32 * (ks & 1) + 16 * (i >> 1) + 4 * (t & 3))) =
            codes4<kExact>(w[ks][i], p.q_scale, p.q_rscale);
  }
  fence_proxy_async();                        // the codes (generic proxy) before the wgmma's reads (async proxy)
  nb_sync<kWgThreads>(kBarQCodes0 + wg);      // every thread's pieces written before the warpgroup's first S

  const int off = len_k - len_q;       // causal: row qr sees keys <= qr + off
  const int first_row = c.first_row;  // the warpgroup's first row: a tile needs a mask past its limit
  float o[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] = 0.f;
  float ot[64];                              // one tile's P·V (a fresh accumulator each tile)
  float sc[32];
  uint32_t pa[2][4];                         // P's codes of the previous tile: the A fragments of 2 k32 steps
  prefill::Rows rows{-INFINITY, -INFINITY, 0.f, 0.f};  // the thread's running maxima and row sums

  // Descriptors built once; a stage adds its offset / 16 to the start-address field (below 2^18: no carry out).
  const uint64_t dq = make_desc_sw64(smem_u32(sqw));
  const uint64_t dk0 = make_desc_sw64(smem_u32(sstage)), dv0 = make_desc_sw64(smem_u32(sstage + kVtOffset));
  // S(j) into sc: 6 k32 steps over the 192 features (two per K part, 32 B apart).
  auto issue_s = [&](int j) {
    const uint64_t dk = dk0 + static_cast<uint64_t>((j % kStages) * (kImage >> 4));
#pragma unroll
    for (int ks = 0; ks < kDqk / 32; ++ks) {
      const uint64_t step = static_cast<uint64_t>(((ks >> 1) * kKPart + (ks & 1) * 32) >> 4);
      wgmma_s8(sc, dq + step, dk + step, ks > 0);
    }
    wg_commit();
  };
  // ot = P(j)·V(j): 2 k32 steps over the tile's 64 key positions (32 B each), the first one not accumulating.
  auto issue_pv = [&](int j) {
    const uint64_t dv = dv0 + static_cast<uint64_t>((j % kStages) * (kImage >> 4));
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) wgmma_pv8(ot, pa[ks], dv + static_cast<uint64_t>(ks * 2), ks > 0);
    wg_commit();
  };
  auto softmax = [&](int j, float& a_lo, float& a_hi) {
    prefill::tile_softmax(sc, rows, j * kBN, len_k, p.causal, first_row, off, qrow_lo, t, p.scale_log2, a_lo, a_hi);
  };
  // P's codes as A fragments: element e = 16 ks + 4 g + 2 (row r + 8) + b is key 32 ks + 8 g + 2 c + b, which
  // V^T holds at position 16 (g / 2) + 4 c + 2 (g % 2) + b of its k32 step: a[0] = row r, g 0-1; a[1] = row r + 8,
  // g 0-1; a[2] / a[3] the same for g 2-3.
  auto pack_p = [&]() {
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int e = 16 * ks + 8 * (i >> 1) + 2 * (i & 1);
        pa[ks][i] = p_codes4<kExact>(sc[e], sc[e + 1], sc[e + 4], sc[e + 5], p.p_scale, p.p_rscale);
      }
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[j % kStages]);
  };

  // Tile 0: S alone in the first turn.
  mbar_wait(&full[0], 0);
  prefill::first_tile(sc, my_turn, other_turn, wg == 0 || n > 1, issue_s, softmax, pack_p);

  for (int j = 1; j < n; ++j) {
    mbar_wait(&full[j % kStages], (j / kStages) & 1);
    nb_sync<kPairThreads>(my_turn);
    wg_fence();
    issue_pv(j - 1);
    issue_s(j);
    if (wg == 0 || j < n - 1) nb_arrive<kPairThreads>(other_turn);
    wg_wait<1>();  // P·V(j-1) done: stage j-1 is free, ot may be read; S(j) may still run
    reg_fence(ot);
    release(j - 1);
#pragma unroll
    for (int e = 0; e < 64; ++e) o[e] += ot[e];
    wg_wait<0>();  // S(j) done
    reg_fence(sc);
    float a_lo, a_hi;
    softmax(j, a_lo, a_hi);
    if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) prefill::scale_rows64(o, a_lo, a_hi);  // x·1 = x
    pack_p();
  }
  wg_fence();
  issue_pv(n - 1);
  wg_wait<0>();
  reg_fence(ot);
  release(n - 1);
#pragma unroll
  for (int e = 0; e < 64; ++e) o[e] += ot[e];

  prefill::store_rows(o, rows, p.out_scale, p.out, p.lse, p.total_q, p.heads, h, q_begin_seq, qrow_lo, len_q, t);
}

bool aligned(const void* ptr, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }

template <bool kExact>
cudaError_t launch(const PrefillFp8Params& p, cudaStream_t stream) {
  static bool attribute_set[kMaxDevices] = {};  // once per device (not a stream operation: capture-safe)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(prefill_fp8_kernel<kExact>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const unsigned blocks = static_cast<unsigned>((std::min<int64_t>(p.max_seqlen_q, p.total_q) + kBM - 1) / kBM);
  for (int b0 = 0; b0 < p.batch; b0 += kMaxGridZ) {
    const dim3 grid(blocks, static_cast<unsigned>(p.heads), static_cast<unsigned>(std::min(kMaxGridZ, p.batch - b0)));
    prefill_fp8_kernel<kExact><<<grid, kThreads, kSmemBytes, stream>>>(p, b0);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

int64_t fp8_tile_image_slots(int64_t total_k, int batch) { return total_k / kBN + batch + 1; }

bool fp8_tile_images_supported(const Fp8TileImagesParams& p) {
  const int64_t strides[4] = {p.k_stride_t, p.k_stride_h, p.v_stride_t, p.v_stride_h};
  for (int64_t s : strides)
    if (s <= 0 || s % 8 != 0) return false;  // 16-byte chunks
  return p.kv_heads >= 1 && p.kv_heads <= 65535 && p.batch >= 1 && p.total_k >= 1 && p.total_k < (int64_t{1} << 31) &&
         aligned(p.k, 16) && aligned(p.v, 16) && p.cu_k && p.images && aligned(p.images, 16);
}

bool prefill_fp8_supported(const PrefillFp8Params& p) {
  return p.heads >= 1 && p.kv_heads >= 1 && p.heads % p.kv_heads == 0 && p.heads <= 65535 && p.batch >= 1 &&
         p.max_seqlen_q >= 1 && p.total_q >= 1 && p.total_k >= 1 && p.total_q < (int64_t{1} << 31) &&
         p.total_k < (int64_t{1} << 31) && p.q_stride_t > 0 && p.q_stride_h > 0 && p.q_stride_t % 4 == 0 &&
         p.q_stride_h % 4 == 0 && aligned(p.q, 8) && p.images && aligned(p.images, 16) && p.out && aligned(p.out, 4) &&
         p.cu_q && p.cu_k;
}

cudaError_t launch_fp8_tile_images(const Fp8TileImagesParams& p, cudaStream_t stream) {
  if (!fp8_tile_images_supported(p)) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(fp8_tile_image_slots(p.total_k, p.batch)), static_cast<unsigned>(p.kv_heads));
  if (p.exact)
    tile_images_kernel<true><<<grid, 256, 0, stream>>>(p);
  else
    tile_images_kernel<false><<<grid, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_prefill_fp8(const PrefillFp8Params& p, cudaStream_t stream) {
  if (!prefill_fp8_supported(p)) return cudaErrorInvalidValue;
  return p.exact ? launch<true>(p, stream) : launch<false>(p, stream);
}

}  // namespace mla_core_cuda
