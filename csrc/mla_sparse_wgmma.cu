// FP8 top-k sparse MLA decode on Hopper WGMMA (sm_90a), DeepSeek-V3.2 on MATE's 576-byte rows (fp8_ds_mla's 656-byte
// rows: below): E4M3 query [batch, q_len, heads, 576] and cache rows [rows, 576] (512 latent + 64 RoPE values; the
// per-tensor scale folded into bmm1_scale / bmm2_scale), int32 indices [batch, q_len, top_k] (-1 = none), valid
// lengths per request. Numerics: docs/sparse.md (the reference backend's definition), up to float32 summation order.
//
// One CTA of three warpgroups per (query token and group of 64 heads, split) walks its split's valid slots in
// tiles of 64 (a split is a run of whole tiles; tile i in stage i % 2, a [64 x 576] 16-bit operand) in the decode
// kernel's seesaw
// (csrc/seesaw.cuh: its comment gives the consumers' step, the mbarrier ring and the named barriers), over E4M3 codes:
//   - the producer warpgroup (warps 8-11; setmaxnreg 56, the consumers 224) gathers each tile's 64 rows of codes
//     by cp.async through the index list into the upper half of the freed stage (bytes 36,864..73,727, free
//     until converted) as 9 code blocks: block k = code chunks 4k..4k+3 of every row, 4,096 B at kCodeOff +
//     4,096 k, row r at 64 r. A slot past the split's end, with index < 0 or >= rows, is zero-filled, never read,
//     and flagged invalid. Tile i's indices are read while tile i - 1's copies fly. It then converts the tile in
//     place into the slab layout as f16 (block k -> slab k, bytes 8,192 k..; exact: every E4M3 value is an f16,
//     one cvt.rn.f16x2.e4m3x2 per code pair):
//     slabs 0-3 lie below the codes, slab 4 overlaps block 0, slab 5 blocks 1-2, slab 6 blocks 3-4, slab 7
//     blocks 5-6, slab 8 blocks 7-8. So every producer thread reads block 4 before a PROD barrier that precedes
//     the stores of slab 4 (blocks 0-4 then read by all: slabs 4-6 are safe), and blocks 7 and 8 before a PROD
//     barrier that precedes the stores of slabs 7 and 8;
//   - consumer warpgroup w computes S for keys 32w..32w+31 of the tile (36 x f16 m64n32k16 from shared memory;
//     Q was converted to f16 slabs once: exact products), masked by the stage's flags (-inf), and owns output
//     columns 256w..256w+255; per tile seesaw.cuh's step with a1 = 2^(m - m1), a2 = 2^(m1 - m2) (1 while the
//     target max is -inf: no key yet), P0 = f16(2^(S0 - m1)), P1 = f16(2^(S1 - m2)) (against 0 while the max is
//     -inf; f16 keeps 2^-11 relative down to 2^-14 and subnormals below, a P <= 2^-25 becomes 0: docs/sparse.md),
//     row sums from the float32 P. The operand type is Elem<kDs> (below).
//
// fp8_ds_mla (the kernel's kDs variant; FlashMLA's / vLLM's 656-byte rows: bytes 0..511 E4M3 codes, 512..527 four
// float32 scales, scale j for values 128j..128j+127, 528..655 the 64 RoPE values in bf16; bf16 query), the same
// schedule and protocol with these differences:
//   - the wgmma operands are bf16 (the bf16 query and RoPE values are not exact in f16): codes, Q and P in bf16;
//   - the producer gathers each row's 32 code chunks as 8 code blocks at kCodeOffDs (slabs 4-7's bytes) and
//     converts them in place (slab 4 overlaps blocks 0-1, 5 blocks 2-3, 6 blocks 4-5, 7 blocks 6-7: PROD barriers
//     after blocks 4-5 and after blocks 6-7 are read), copies the 8 RoPE chunks straight into slab 8 and the 16
//     scale bytes into the stage's [64 slots][4] float32 scales (in Q's slab 8, free: Q's RoPE values are kept
//     as RS A fragments in registers, 16 per thread);
//   - S keeps the block scale outside the dot: the RoPE part (4 RS k16 steps) into s, block j's 8 k16 steps into
//     acc[j % 2], s += scale_j[key] acc once block j's group completed (wait_group 1: the next block runs);
//   - P V per 128-column scale block (m64n128k16, A from registers): warpgroup w's blocks 2w, 2w + 1 take
//     bf16(P scale_j[key]) of its own keys and of the other warpgroup's, which it reads as float32 P: warpgroup
//     0's from the P slab, warpgroup 1's from the stage's RoPE slab, which both S products have read once MX0
//     has passed (8 KB each, by thread: the other's thread t holds the same accumulator positions). Row sums stay
//     on the float32 P.
// Output o / l * bmm2_scale in bf16, LSE (m + log2 l) ln 2; a token with no valid slot gets 0 and -inf. With
// several splits each writes float32 partials and the combine kernel merges them by log-sum-exp (a split without a
// valid slot has LSE -inf and weight 0).
//
// Synchronization (seesaw.cuh's, tile = step, plus the producer's own barrier):
//   full[s]  each producer thread arrives after the tile's conversion and fence.proxy.async; the stage's flags
//            are written before. empty[s]: a consumer warp's release also follows its flag reads.
//   named barrier 6 PROD over the 128 producer threads, three generations per tile: every copy of the tile
//     landed (cp.async.wait_group 0 before it), blocks 0-4 read by all, blocks 5-8 read by all.
//   fp8_ds_mla: the same barriers in the same places (PROD's second and third generations as above); P0 / P1 are
//   float32 (P1 in the stage's RoPE slab: written after MX0, read by WG0 after H1F, before either releases the
//   stage), both P V halves RS, and WG1 arrives P0E once P0 is in its registers (before its P0 V0).
// The 576-byte protocol and in-place conversion's byte ranges were checked over every interleaving for 1-6 tiles
// (benchmarks/probes/sparse_wgmma_s_emulation.py), the fp8_ds_mla variant's for 1-4 tiles with its P1-in-RoPE-slab
// and scale-array lifetimes (sparse_wgmma_ds_emulation.py), and measured as variant S of the sparse probe
// (benchmarks/probes/sparse_wgmma_probe.cu; benchmarks/NOTES.md). Layout, descriptors and ordering rules:
// docs/cuda.md ("Hopper building blocks, verified").

#include "hopper.cuh"
#include "mla_sparse.h"
#include "seesaw.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_sparse_wgmma.cu is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

// The CTA's shape, the seesaw's named barriers and the slab layout: seesaw.cuh (kHeads, kKeys = slots per tile, ...).
constexpr int kRowDs = 656;                // bytes of an fp8_ds_mla cache row (MATE's rows: kDim codes)
constexpr int kDsScales = 512, kDsRope = 528;  // fp8_ds_mla: byte offsets of the 4 float32 scales, the bf16 RoPE
constexpr int kChunks = kDim / 16;         // 16-byte chunks of codes per 576-byte row
constexpr int kTileBytes = 9 * kSlab;      // a [64 x 576] 16-bit operand: 9 slabs (Q, a stage)
constexpr int kCodeBlock = kKeys * 64;     // a code block: 4 chunks of every row
constexpr int kCodeOff = kTileBytes - kKeys * kDim;  // the codes' place in a stage: its upper 36,864 B
constexpr int kCodeOffDs = 4 * kSlab;      // fp8_ds_mla: 8 code blocks over slabs 4-7 (the RoPE goes to slab 8)
constexpr int kOffScales = 8 * kSlab;      // fp8_ds_mla: [2 stages][64 slots][4] float32 scales in Q's slab 8
constexpr int kOffP = 3 * kTileBytes,      // Q, two stages
              kOffX = kOffP + kSlab,       // floats: [64] half 0's maxima, [64] half 1's, [2][64] final row sums
              kOffValid = kOffX + 4 * kHeads * 4,   // [2 stages][64 slots] validity flags
              kOffBar = kOffValid + 2 * kKeys,      // mbarriers full[2], empty[2]
              kSmemBytes = kOffBar + 4 * 8 + 1024;  // + alignment slack: slabs start 1024-aligned
constexpr int kBarProd = 6;                // the producer warpgroup's own named barrier (header comment)
constexpr int kMaxSplits = 32;
constexpr int kMaxDevices = 64;            // devices whose shared-memory attribute is remembered
static_assert(kSmemBytes <= 232448, "shared memory per CTA (sm_90 opt-in maximum)");
static_assert(kCodeOff == 36864 && kCodeOff + 9 * kCodeBlock == kTileBytes, "the codes fill a stage's upper half");
static_assert(kCodeOffDs + 8 * kCodeBlock == 8 * kSlab && 2 * kKeys * 16 <= kSlab,
              "fp8_ds_mla: the codes end where the RoPE slab starts; both stages' scales fit in Q's slab 8");
static_assert(kOffBar % 8 == 0 && kProducerThreads == 2 * kKeys && kChunks == 4 * 9,
              "mbarriers 8-aligned; producer thread u converts rows u / 4 and u / 4 + 32, chunk u % 4 of 9 blocks");

// The first 1024-aligned address at or after p, as p plus an offset (so accesses through it stay LDS/STS).
__device__ __forceinline__ uint8_t* shared_align1024(uint8_t* p) {
  return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u);
}
// kDs: the fp8_ds_mla variant (656-byte rows, bf16 query); else MATE's 576-byte rows and an E4M3 query.
template <bool kDs>
constexpr int kRowBytes = kDs ? kRowDs : kDim;
// The wgmma operands' type (Q's slabs, the converted codes, P; seesaw.cuh's Wgmma<T>): f16 on MATE's rows (E4M3
// query and codes are exact in f16, converted by one instruction per pair), bf16 for fp8_ds_mla (its bf16 query
// and RoPE values are not exact in f16).
template <bool kDs>
using Elem = std::conditional_t<kDs, __nv_bfloat16, __half>;
using MmaDs = Wgmma<Elem<true>>;  // fp8_ds_mla's own products (s_rs, s_half per block, pv128_rs)

// The cache row slot `slot` names, or -1 at or past `end` (not read there).
__device__ __forceinline__ int32_t slot_index(const int32_t* idx, int slot, int end) {
  if (slot >= end) return -1;
  return idx[slot];
}
// The byte offset of cache row `row`, or -1 when it is not a key: < 0 or >= the cache's row count.
template <bool kDs>
__device__ __forceinline__ int64_t row_offset(const SparseDecodeParams& p, int64_t row) {
  return row >= 0 && row < p.rows ? row * kRowBytes<kDs> : -1;
}

// Producer warp pw (lane l): the tile's rows 16 pw .. 16 pw + 15 by cp.async into the stage's code blocks, one
// group committed; `off` (lanes 0-15: row 16 pw + l's offset from row_offset) also gives the stage's flags. Lane l
// copies chunk l % 4 of every block for rows 16 pw + l / 4 and 16 pw + l / 4 + 8 (conflict-free 16-byte stores).
// fp8_ds_mla (kDs): 8 code blocks at kCodeOffDs; lane l also copies RoPE chunks 2 (l % 4) and 2 (l % 4) + 1 of
// both rows straight into slab 8 (bf16, swizzled as the slab) and, for l % 4 < 2, the scales of row a (0) or b (1)
// into `scales` ([64 slots][4] float32).
template <bool kDs>
__device__ __forceinline__ void gather_tile(const SparseDecodeParams& p, int64_t off, uint8_t* stage, uint8_t* valid,
                                            uint8_t* scales, int pw, int lane) {
  if (lane < 16) valid[16 * pw + lane] = off >= 0;
  const int q = lane & 3, row = 16 * pw + (lane >> 2);
  const int64_t off_a = __shfl_sync(0xffffffffu, off, lane >> 2), off_b = __shfl_sync(0xffffffffu, off, (lane >> 2) + 8);
  // A slot that is not a key copies 0 bytes (zero-filled, nothing read) from the cache's base: one select a row, the
  // chunks' offsets then immediates of the copies.
  const uint8_t* row_a = p.cache + (off_a >= 0 ? off_a : 0) + 16 * q;
  const uint8_t* row_b = p.cache + (off_b >= 0 ? off_b : 0) + 16 * q;
  const uint32_t n_a = off_a >= 0 ? 16u : 0u, n_b = off_b >= 0 ? 16u : 0u;
  uint8_t* dst = stage + (kDs ? kCodeOffDs : kCodeOff) + 64 * row + 16 * q;
#pragma unroll
  for (int k = 0; k < (kDs ? 8 : 9); ++k) {  // chunk 4k + q of the row: bytes 64 k + 16 q
    cp_async16(dst + kCodeBlock * k, row_a + 64 * k, n_a);
    cp_async16(dst + kCodeBlock * k + 64 * 8, row_b + 64 * k, n_b);
  }
  if constexpr (kDs) {
    uint8_t* rope = stage + 8 * kSlab;
#pragma unroll
    for (int c = 2 * q; c < 2 * q + 2; ++c) {  // RoPE chunk c (row_a, row_b are 16 q bytes into their rows)
      cp_async16(rope + slab_off(row, 16 * c), row_a + kDsRope + 16 * (c - q), n_a);
      cp_async16(rope + slab_off(row + 8, 16 * c), row_b + kDsRope + 16 * (c - q), n_b);
    }
    if (q < 2) {
      const int r = row + 8 * q;
      cp_async16(scales + 16 * r, (q ? row_b : row_a) + kDsScales - 16 * q, q ? n_b : n_a);
    }
  }
  cp_async_commit();
}

// 16 E4M3 codes as 32 bytes of T (bf16 or f16), exactly (hopper.cuh).
template <typename T>
__device__ __forceinline__ void e4m3x16_to(const uint4& w, uint4& lo, uint4& hi) {
  if constexpr (std::is_same_v<T, __half>) {
    e4m3x16_to_f16(w, lo, hi);
  } else {
    e4m3x16_to_bf16(w, lo, hi);
  }
}
// 16 codes (chunk q of a code block, row `row`) as T into `slab`: T bytes 32 q .. 32 q + 31 of the row, 16-byte
// positions 2q and 2q + 1 swizzled by the row.
template <typename T>
__device__ __forceinline__ void store_chunk(uint8_t* slab, int row, int q, const uint4& w) {
  uint4 lo, hi;
  e4m3x16_to<T>(w, lo, hi);
  uint8_t* d = slab + row * 128;
  *reinterpret_cast<uint4*>(d + (((2 * q) ^ (row & 7)) << 4)) = lo;
  *reinterpret_cast<uint4*>(d + (((2 * q + 1) ^ (row & 7)) << 4)) = hi;
}

// Producer thread u (0..127) converts the stage's landed codes in place to Elem<kDs> (block k -> slab k): rows
// u / 4 and u / 4 + 32, chunk u % 4 of every block. The caller's PROD barrier after the copies landed comes first;
// the two here order the reads of the blocks a slab overlaps before its stores (header comment).
// fp8_ds_mla (kDs): 8 blocks at kCodeOffDs (slabs 4-7's bytes; the RoPE slab is already in place): slab 4 overlaps
// blocks 0-1, slab 5 blocks 2-3, slab 6 blocks 4-5, slab 7 blocks 6-7, so blocks 4-5 are read before a PROD barrier
// that precedes slabs 4-5 (blocks 0-5 then read by all: slab 6 is safe), blocks 6-7 before one that precedes slab 7.
template <bool kDs>
__device__ __forceinline__ void convert_in_place(uint8_t* stage, int u) {
  using T = Elem<kDs>;
  const int r = u >> 2, q = u & 3;
  const uint8_t* code = stage + (kDs ? kCodeOffDs : kCodeOff) + 64 * r + 16 * q;  // block 0, row r; r + 32: +2,048 B
  const auto load = [code](int k, int half) {
    return *reinterpret_cast<const uint4*>(code + kCodeBlock * k + half * 32 * 64);
  };
#pragma unroll
  for (int k = 0; k < 4; ++k) {  // slabs 0-3: below the codes
    const uint4 w0 = load(k, 0), w1 = load(k, 1);
    store_chunk<T>(stage + kSlab * k, r, q, w0);
    store_chunk<T>(stage + kSlab * k, r + 32, q, w1);
  }
  if constexpr (kDs) {
    const uint4 w40 = load(4, 0), w41 = load(4, 1), w50 = load(5, 0), w51 = load(5, 1);
    nb_sync<kProducerThreads>(kBarProd);  // blocks 0-5 read by every producer thread: slabs 4-6 may overwrite them
    store_chunk<T>(stage + kSlab * 4, r, q, w40);
    store_chunk<T>(stage + kSlab * 4, r + 32, q, w41);
    store_chunk<T>(stage + kSlab * 5, r, q, w50);
    store_chunk<T>(stage + kSlab * 5, r + 32, q, w51);
    const uint4 w60 = load(6, 0), w61 = load(6, 1), w70 = load(7, 0), w71 = load(7, 1);
    store_chunk<T>(stage + kSlab * 6, r, q, w60);
    store_chunk<T>(stage + kSlab * 6, r + 32, q, w61);
    nb_sync<kProducerThreads>(kBarProd);  // blocks 6-7 read by every producer thread: slab 7 may overwrite them
    store_chunk<T>(stage + kSlab * 7, r, q, w70);
    store_chunk<T>(stage + kSlab * 7, r + 32, q, w71);
    return;
  }
  const uint4 w40 = load(4, 0), w41 = load(4, 1);
  nb_sync<kProducerThreads>(kBarProd);  // blocks 0-4 read by every producer thread: slabs 4-6 may overwrite them
  store_chunk<T>(stage + kSlab * 4, r, q, w40);
  store_chunk<T>(stage + kSlab * 4, r + 32, q, w41);
#pragma unroll
  for (int k = 5; k < 7; ++k) {
    const uint4 w0 = load(k, 0), w1 = load(k, 1);
    store_chunk<T>(stage + kSlab * k, r, q, w0);
    store_chunk<T>(stage + kSlab * k, r + 32, q, w1);
  }
  const uint4 w70 = load(7, 0), w71 = load(7, 1), w80 = load(8, 0), w81 = load(8, 1);
  nb_sync<kProducerThreads>(kBarProd);  // blocks 5-8 read by every producer thread: slabs 7-8 may overwrite them
  store_chunk<T>(stage + kSlab * 7, r, q, w70);
  store_chunk<T>(stage + kSlab * 7, r + 32, q, w71);
  store_chunk<T>(stage + kSlab * 8, r, q, w80);
  store_chunk<T>(stage + kSlab * 8, r + 32, q, w81);
}

// The CTA's 64 query rows (heads h0..h0+63 of token `tok`) as Elem<kDs> slabs (576-byte rows: the E4M3 query
// converted to f16), by 16-byte loads (consumer threads).
// fp8_ds_mla (kDs): the bf16 query's 512 latent values copied into slabs 0-7 (its RoPE values: load_qrope).
template <bool kDs>
__device__ __forceinline__ void load_query(uint8_t* sq, const SparseDecodeParams& p, int64_t tok, int h0) {
  if constexpr (kDs) {
    const uint8_t* src = p.query + (tok * p.heads + h0) * (2 * kDim);
    for (int i = threadIdx.x; i < kHeads * kNope / 8; i += kConsumerThreads) {
      const int r = i / (kNope / 8), c = i % (kNope / 8);
      *reinterpret_cast<uint4*>(sq + slab_off(r, 16 * c)) = *reinterpret_cast<const uint4*>(src + r * 2 * kDim + 16 * c);
    }
    return;
  }
  const uint8_t* src = p.query + (tok * p.heads + h0) * kDim;
  for (int i = threadIdx.x; i < kHeads * kChunks; i += kConsumerThreads) {
    const int r = i / kChunks, c = i % kChunks;
    uint4 lo, hi;
    e4m3x16_to<Elem<kDs>>(*reinterpret_cast<const uint4*>(src + r * kDim + 16 * c), lo, hi);
    *reinterpret_cast<uint4*>(sq + slab_off(r, 32 * c)) = lo;
    *reinterpret_cast<uint4*>(sq + slab_off(r, 32 * c + 16)) = hi;
  }
}

// A split without a valid slot (all threads of the CTA): with one split the rows' output is 0 and LSE -inf; else its
// partial LSE is -inf (the combine gives it weight 0 and never reads its partial output).
__device__ void write_empty(const SparseDecodeParams& p, int64_t tok, int split, int h0) {
  if (p.num_splits == 1) {
    uint32_t* out = reinterpret_cast<uint32_t*>(p.out + (tok * p.heads + h0) * kNope);
    for (int i = threadIdx.x; i < kHeads * kNope / 2; i += kThreads) out[i] = 0u;
    if (threadIdx.x < kHeads) p.lse[tok * p.heads + h0 + threadIdx.x] = -INFINITY;
  } else if (threadIdx.x < kHeads) {
    p.part_lse[(tok * p.num_splits + split) * p.heads + h0 + threadIdx.x] = -INFINITY;
  }
}

// This warpgroup's 256 output columns of the thread's rows lo and hi = lo + 8 (store_rows), times bmm2_scale / l;
// warpgroup 0 writes the LSE.
__device__ __forceinline__ void store_outputs(const SparseDecodeParams& p, const float (&o)[128], int64_t tok,
                                              int split, int h_lo, float m_lo, float m_hi, float l_lo, float l_hi) {
  const int wg = threadIdx.x >> 7, t = threadIdx.x & 127;
  const int col0 = 256 * wg + 2 * (t & 3);
  const float inv_lo = l_lo > 0.f ? p.bmm2_scale / l_lo : 0.f, inv_hi = l_hi > 0.f ? p.bmm2_scale / l_hi : 0.f;
  const float lse_lo = l_lo > 0.f ? (m_lo + __log2f(l_lo)) * kLn2 : -INFINITY;
  const float lse_hi = l_hi > 0.f ? (m_hi + __log2f(l_hi)) * kLn2 : -INFINITY;
  const bool lse_writer = wg == 0 && (t & 3) == 0;
  if (p.num_splits == 1) {
    const int64_t row = tok * p.heads + h_lo;
    __nv_bfloat16* out = reinterpret_cast<__nv_bfloat16*>(p.out) + row * kNope + col0;
    store_rows(out, out + 8 * kNope, o, inv_lo, inv_hi, true);
    if (lse_writer) {
      p.lse[row] = lse_lo;
      p.lse[row + 8] = lse_hi;
    }
  } else {
    const int64_t row = (tok * p.num_splits + split) * p.heads + h_lo;
    float* part = p.part_o + row * kNope + col0;
    store_rows(part, part + 8 * kNope, o, inv_lo, inv_hi, true);
    if (lse_writer) {
      p.part_lse[row] = lse_lo;
      p.part_lse[row + 8] = lse_hi;
    }
  }
}

// 2^(from - to); 1 when `to` is -inf (no valid key yet: the factor multiplies zeros).
__device__ __forceinline__ float rescale_factor(float from, float to) { return to == -INFINITY ? 1.f : ex2(from - to); }

// fp8_ds_mla helpers. Scales: the stage's [64 slots][4] float32, scale j of a slot for its values 128j..128j+127.
// This thread's Q RoPE values (rows row_lo, row_lo + 8 of the CTA's heads, columns 512..575) as the m64k16 A
// fragments of the four k16 steps (pv_rs's layout), by 4-byte loads from the bf16 query.
__device__ __forceinline__ void load_qrope(const SparseDecodeParams& p, int64_t tok, int h0, int row_lo, int t,
                                           uint32_t (&qr)[4][4]) {
  const uint32_t* lo = reinterpret_cast<const uint32_t*>(p.query) + ((tok * p.heads + h0 + row_lo) * kDim + kNope) / 2;
  const uint32_t* hi = lo + 8 * kDim / 2;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const int c = (16 * ks + 2 * (t & 3)) / 2;  // column pair
    qr[ks][0] = lo[c];
    qr[ks][1] = hi[c];
    qr[ks][2] = lo[c + 4];
    qr[ks][3] = hi[c + 4];
  }
}
// s += scale_j[key] * acc over this thread's 16 scores (S accumulator layout, keys key0 + 8 (n / 4) + 2 (t % 4) +
// n % 2): block j's partial dot of exact products, the scale outside it.
__device__ __forceinline__ void add_scaled(float (&s)[16], const float (&acc)[16], const float* scales, int key0,
                                           int j, int t) {
#pragma unroll
  for (int n = 0; n < 16; ++n) {
    const int key = key0 + 8 * (n >> 2) + 2 * (t & 3) + (n & 1);
    s[n] = fmaf(scales[4 * key + j], acc[n], s[n]);
  }
}
// P (16 float32 of the S accumulator layout, keys key0..key0 + 31) times block j's scales of their keys, rounded
// to bf16, as the two m64k16 A fragments (p_fragments' order).
__device__ __forceinline__ void scaled_fragments(const float (&e)[16], const float* scales, int key0, int j, int t,
                                                 uint32_t (&a)[2][4]) {
#pragma unroll
  for (int ks = 0; ks < 2; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int n = 8 * ks + 2 * i, key = key0 + 8 * (n >> 2) + 2 * (t & 3);
      a[ks][i] = bf16x2_bits(e[n] * scales[4 * key + j], e[n + 1] * scales[4 * (key + 1) + j]);
    }
}
// A warpgroup's float32 P (16 per thread, accumulator layout) to / from 8 KB of shared memory by thread: the other
// warpgroup's thread t holds the same positions of the other 32 keys (conflict-free 16-byte accesses).
__device__ __forceinline__ void store_p32(uint8_t* dst, const float (&e)[16], int t) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
    *reinterpret_cast<float4*>(dst + 16 * (128 * i + t)) = make_float4(e[4 * i], e[4 * i + 1], e[4 * i + 2], e[4 * i + 3]);
}
__device__ __forceinline__ void load_p32(const uint8_t* src, float (&e)[16], int t) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float4 v = *reinterpret_cast<const float4*>(src + 16 * (128 * i + t));
    e[4 * i] = v.x;
    e[4 * i + 1] = v.y;
    e[4 * i + 2] = v.z;
    e[4 * i + 3] = v.w;
  }
}
// P V over this warpgroup's two scale blocks for keys k0..k0 + 31 (two k16 steps): a[b] = P times block 2w + b's
// scales, V's columns 128b.. of the warpgroup's slabs (o[64 b ..]).
__device__ __forceinline__ void pv_scaled(float (&o)[128], const uint32_t (&a)[2][2][4], const uint8_t* sv, int k0) {
  MmaDs::pv128_rs<0>(o, a[0][0], mnmajor_desc(sv, k0));
  MmaDs::pv128_rs<0>(o, a[0][1], mnmajor_desc(sv, k0 + 16));
  MmaDs::pv128_rs<64>(o, a[1][0], mnmajor_desc(sv + 2 * kSlab, k0));
  MmaDs::pv128_rs<64>(o, a[1][1], mnmajor_desc(sv + 2 * kSlab, k0 + 16));
}

template <bool kDs>
__global__ void __launch_bounds__(kThreads, 1) sparse_decode_kernel(const SparseDecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = shared_align1024(smem_raw);
  uint8_t* sk0 = sq + kTileBytes;                       // stage s at sk0 + s * kTileBytes
  uint8_t* sp = sq + kOffP;                             // P [64 heads x 64 keys], one swizzled slab (kDs: WG0's P)
  uint8_t* sscale = sq + kOffScales;                    // kDs: [2 stages][64 slots][4] float32 scales
  float* smx0 = reinterpret_cast<float*>(sq + kOffX);   // [64] half 0's row maxima (WG0 -> WG1)
  float* smx1 = smx0 + kHeads;                          // [64] half 1's row maxima (WG1 -> WG0)
  float* sl = smx1 + kHeads;                            // [2][64] final row sums
  uint8_t* sval = sq + kOffValid;                       // [2 stages][64 slots] flags
  uint64_t* full = reinterpret_cast<uint64_t*>(sq + kOffBar);  // [2 stages]
  uint64_t* empty = full + 2;                                  // [2 stages]
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform for the compiler
  const int groups = p.heads / kHeads;  // head groups of a token are neighbours in launch order (shared rows in L2)
  const int64_t tok = blockIdx.x / groups;
  const int split = blockIdx.y, h0 = static_cast<int>(blockIdx.x % groups) * kHeads;
  const int b = static_cast<int>(tok / p.q_len);

  // The split's slots [start, end): ceil(tiles / splits) whole tiles of the valid slots each.
  const int len = min(max(p.valid_lens[b], 0), p.top_k);
  const int tiles = (len + kKeys - 1) / kKeys, per_split = (tiles + p.num_splits - 1) / p.num_splits;
  const int start = split * per_split * kKeys, end = min(start + per_split * kKeys, len);
  if (start >= end) {
    write_empty(p, tok, split, h0);
    return;
  }
  const int ntiles = (end - start + kKeys - 1) / kKeys;
  if (tid == 0) init_ring(full, empty);
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    const int pw = warp - 8;
    const int32_t* idx = p.indices + tok * p.top_k;
    // Lane l < 16 (row 16 pw + l of a tile): `off` the row offset of tile i, `next` the index of tile i + 1, read a
    // tile ahead of its use so the load's latency stays off the producer's chain.
    const int slot0 = start + 16 * pw + lane;
    int64_t off = lane < 16 ? row_offset<kDs>(p, slot_index(idx, slot0, end)) : -1;
    int32_t next = lane < 16 ? slot_index(idx, slot0 + kKeys, end) : -1;
    for (int i = 0; i < ntiles; ++i) {
      const int s = i & 1;
      uint8_t* stage = sk0 + s * kTileBytes;
      if (i >= 2) mbar_wait(&empty[s], ((i - 2) >> 1) & 1);
      gather_tile<kDs>(p, off, stage, sval + kKeys * s, sscale + 16 * kKeys * s, pw, lane);
      off = lane < 16 ? row_offset<kDs>(p, next) : -1;
      next = lane < 16 ? slot_index(idx, slot0 + (i + 2) * kKeys, end) : -1;
      cp_async_wait_all();
      nb_sync<kProducerThreads>(kBarProd);  // every producer thread's copies landed and visible
      convert_in_place<kDs>(stage, tid - kConsumerThreads);
      fence_proxy_async();  // the converted tile is a wgmma operand
      mbar_arrive(&full[s]);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp >> 2, t = tid & 127;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);  // the thread's accumulator rows: row_lo, row_lo + 8
  load_query<kDs>(sq, p, tok, h0);
  uint32_t qr[4][4];  // kDs: Q's RoPE values as A fragments (its slab 8 holds the scales)
  if constexpr (kDs) load_qrope(p, tok, h0, row_lo, t, qr);
  fence_proxy_async();  // Q is a wgmma operand
  nb_sync<kConsumerThreads>(kBarAll);

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: this warpgroup's keys, 8 of 32 per thread
  for (int it = 0; it < ntiles; ++it) {
    const int s = it & 1;
    uint8_t* sk = sk0 + s * kTileBytes;
    const uint8_t* sv = sk + wg * 4 * kSlab;  // this warpgroup's V columns 256w..256w+255: slabs 4w..4w+3
    const float* ssc = reinterpret_cast<const float*>(sscale + 16 * kKeys * s);  // kDs: the tile's scales

    float sc[16];
    begin_step(sc, full, it);
    const uint8_t* kw = sk + wg * 32 * 128;  // rows 32w.. of every slab (the same swizzle phase)
    if constexpr (kDs) {
      // s = q_rope . k_rope + sum_j scale_j (q_j . codes_j): the RoPE part into sc, block j's 8 k16 steps into
      // acc[j % 2], each block added with its scale once its group completed while the next one runs.
      float acc[2][16];
#pragma unroll
      for (int ks = 0; ks < 4; ++ks) MmaDs::s_rs(sc, qr[ks], kmajor_desc(kw, kNope * 2 + 32 * ks), ks > 0);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j > 0) wg_fence();  // acc[j % 2] was read by add_scaled
#pragma unroll
        for (int ks = 0; ks < 8; ++ks)
          MmaDs::s_half(acc[j & 1], kmajor_desc(sq, 256 * j + 32 * ks), kmajor_desc(kw, 256 * j + 32 * ks), ks > 0);
        wg_commit();
        if (j > 0) {
          wg_wait<1>();
          reg_fence(sc);
          reg_fence(acc[(j - 1) & 1]);
          add_scaled(sc, acc[(j - 1) & 1], ssc, 32 * wg, j - 1, t);
        }
      }
      wg_wait<0>();
      reg_fence(sc);
      reg_fence(acc[1]);
      add_scaled(sc, acc[1], ssc, 32 * wg, 3, t);
    } else {
      s_product<Elem<kDs>>(sc, sq, kw);
    }

    const uint8_t* flag = sval + kKeys * s + 32 * wg;
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const float x = flag[8 * (j >> 2) + 2 * (t & 3) + (j & 1)] ? sc[j] * p.scale_log2 : -INFINITY;
      sc[j] = x;
      if (j & 2) mx_hi = fmaxf(mx_hi, x);
      else mx_lo = fmaxf(mx_lo, x);
    }
    quad_max(mx_lo, mx_hi);

    // a: a P half as the RS A operand (kDs: a[b] = P times the scales of the warpgroup's block 2w + b; else a[0]).
    uint32_t a[2][2][4];
    float sum_lo, sum_hi;
    if (wg == 0) {
      store_row_pair(smx0, row_lo, t, mx_lo, mx_hi);
      nb_arrive<kConsumerThreads>(kBarMx0);
      const float m1_lo = fmaxf(m_lo, mx_lo), m1_hi = fmaxf(m_hi, mx_hi);
      const float a1_lo = rescale_factor(m_lo, m1_lo), a1_hi = rescale_factor(m_hi, m1_hi);
      exponentiate(sc, m1_lo, m1_hi, sum_lo, sum_hi);
      if constexpr (kDs) {
        scaled_fragments(sc, ssc, 0, 0, t, a[0]);
        scaled_fragments(sc, ssc, 0, 1, t, a[1]);
      } else {
        p_fragments<Elem<kDs>>(sc, a[0]);
      }
      if (it > 0) nb_sync<kConsumerThreads>(kBarP0Empty);  // WG1's P0 V0 of the previous tile read the slab
      if constexpr (kDs) {
        store_p32(sp, sc, t);  // float32 P0: WG1 scales it by its blocks' scales
      } else {
        store_p(sp, a[0], row_lo, 0, t);
        fence_proxy_async();
      }
      nb_arrive<kConsumerThreads>(kBarP0Full);
      rescale(o, a1_lo, a1_hi);
      wg_fence();
      if constexpr (kDs) {
        pv_scaled(o, a, sv, 0);
      } else {
        pv_regs<Elem<kDs>>(o, a[0], sv, 0);
      }
      wg_commit();
      nb_sync<kConsumerThreads>(kBarH1Full);  // WG1's P1 and half 1's maxima
      const float m2_lo = fmaxf(m1_lo, smx1[row_lo]), m2_hi = fmaxf(m1_hi, smx1[row_lo + 8]);
      const float a2_lo = rescale_factor(m1_lo, m2_lo), a2_hi = rescale_factor(m1_hi, m2_hi);
      l_lo = (l_lo * a1_lo + sum_lo) * a2_lo;  // warpgroup 0 adds its sum before the factor 2^(m1 - m2)
      l_hi = (l_hi * a1_hi + sum_hi) * a2_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      wg_wait<0>();
      reg_fence(o);
      rescale(o, a2_lo, a2_hi);
      if constexpr (kDs) {  // WG1's float32 P1 (in the stage's RoPE slab) times the scales of blocks 0, 1
        float e1[16];
        load_p32(sk + 8 * kSlab, e1, t);
        scaled_fragments(e1, ssc, 32, 0, t, a[0]);
        scaled_fragments(e1, ssc, 32, 1, t, a[1]);
      }
      wg_fence();
      if constexpr (kDs) {
        pv_scaled(o, a, sv, 32);
      } else {
        pv_slab<Elem<kDs>>(o, sp, sv, 32);
      }
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
    } else {
      nb_sync<kConsumerThreads>(kBarMx0);  // WG0's half-0 maxima (and its S done: kDs overwrites the RoPE slab)
      const float m1_lo = fmaxf(m_lo, smx0[row_lo]), m1_hi = fmaxf(m_hi, smx0[row_lo + 8]);
      const float m2_lo = fmaxf(m1_lo, mx_lo), m2_hi = fmaxf(m1_hi, mx_hi);
      const float a1_lo = rescale_factor(m_lo, m1_lo), a1_hi = rescale_factor(m_hi, m1_hi);
      const float a2_lo = rescale_factor(m1_lo, m2_lo), a2_hi = rescale_factor(m1_hi, m2_hi);
      exponentiate(sc, m2_lo, m2_hi, sum_lo, sum_hi);
      l_lo = (l_lo * a1_lo) * a2_lo + sum_lo;  // warpgroup 1 adds its sum after the factor 2^(m1 - m2)
      l_hi = (l_hi * a1_hi) * a2_hi + sum_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      if constexpr (kDs) {
        store_p32(sk + 8 * kSlab, sc, t);  // float32 P1 over the RoPE slab, which both S products have read
      } else {
        p_fragments<Elem<kDs>>(sc, a[0]);
        store_p(sp, a[0], row_lo, 32, t);
      }
      store_row_pair(smx1, row_lo, t, mx_lo, mx_hi);
      if constexpr (!kDs) fence_proxy_async();
      nb_arrive<kConsumerThreads>(kBarH1Full);
      rescale(o, a1_lo, a1_hi);
      nb_sync<kConsumerThreads>(kBarP0Full);  // WG0's P0
      if constexpr (kDs) {  // WG0's float32 P0 times the scales of blocks 2, 3
        float e0[16];
        load_p32(sp, e0, t);
        scaled_fragments(e0, ssc, 0, 2, t, a[0]);
        scaled_fragments(e0, ssc, 0, 3, t, a[1]);
        if (it + 1 < ntiles) nb_arrive<kConsumerThreads>(kBarP0Empty);  // P0 is in registers
        wg_fence();
        pv_scaled(o, a, sv, 0);
        wg_commit();
        wg_wait<0>();
        reg_fence(o);
      } else {
        wg_fence();
        pv_slab<Elem<kDs>>(o, sp, sv, 0);
        wg_commit();
        wg_wait<0>();
        reg_fence(o);
        if (it + 1 < ntiles) nb_arrive<kConsumerThreads>(kBarP0Empty);
      }
      rescale(o, a2_lo, a2_hi);
      if constexpr (kDs) {  // this warpgroup's P1 back from the RoPE slab, times the scales of blocks 2, 3
        float e1[16];
        load_p32(sk + 8 * kSlab, e1, t);
        scaled_fragments(e1, ssc, 32, 2, t, a[0]);
        scaled_fragments(e1, ssc, 32, 3, t, a[1]);
      }
      wg_fence();
      if constexpr (kDs) {
        pv_scaled(o, a, sv, 32);
      } else {
        pv_regs<Elem<kDs>>(o, a[0], sv, 32);
      }
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
    }
    release_stage(empty, s, lane);  // every wgmma of this warp that reads stage s completed, its flags were read
  }
  // Row sums: over the quad, then l = l_0 + l_1 (the same order in both warpgroups).
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
  }
  if ((t & 3) == 0) {
    sl[wg * kHeads + row_lo] = l_lo;
    sl[wg * kHeads + row_lo + 8] = l_hi;
  }
  nb_sync<kConsumerThreads>(kBarAll);
  store_outputs(p, o, tok, split, h0 + row_lo, m_lo, m_hi, sl[row_lo] + sl[kHeads + row_lo],
                sl[row_lo + 8] + sl[kHeads + row_lo + 8]);
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
  static bool attribute_set[2][kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const auto kernel = p.ds_mla ? sparse_decode_kernel<true> : sparse_decode_kernel<false>;
  if (device >= kMaxDevices || !attribute_set[p.ds_mla][device]) {
    err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[p.ds_mla][device] = true;
  }
  const dim3 grid(static_cast<unsigned>(tokens * (p.heads / kHeads)), static_cast<unsigned>(p.num_splits));
  kernel<<<grid, kThreads, kSmemBytes, stream>>>(p);
  err = cudaGetLastError();
  if (err != cudaSuccess || p.num_splits == 1) return err;
  sparse_combine_kernel<<<static_cast<unsigned>(tokens * p.heads), 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
