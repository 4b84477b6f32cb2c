// mla_prefill_common.cuh: what the two prefill kernels (mla_prefill_wgmma.cu: bf16 products; mla_prefill_fp8.cu: the
// fp8 recipe on FP8 products) share, one definition: the block shape (128 query rows of two 64-row consumer
// warpgroups, 64-key tiles, v 128), a sequence's clamped range, the CTA's tile count, the online softmax of one 64-key
// tile in an m64n64 f32 accumulator (docs/numerics.md's prefill rule), O's row rescale, and the epilogue (1 / l,
// O's scale, LSE; a block without a visible key). Accumulator layout: thread t of a warpgroup holds rows row_lo =
// 16 (t / 32) + (t % 32) / 4 and row_lo + 8; element e of an m64nN tile is row row_lo + 8 ((e / 2) % 2), column
// 8 (e / 4) + 2 (t % 4) + e % 2.
#pragma once

#include "hopper.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace mla_core_cuda {
namespace prefill {

constexpr int kBM = 128, kBN = 64, kDv = 128;  // query rows a CTA, keys a tile (the P tile), v width
constexpr float kLn2 = 0.6931471805599453f;

__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float lg2_approx(float x) {
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// Rows of an m64n128 accumulator scaled: the thread's row r by a_lo, its row r + 8 (j % 4 >= 2) by a_hi.
__device__ __forceinline__ void scale_rows64(float (&o)[64], float a_lo, float a_hi) {
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] *= (j & 2) ? a_hi : a_lo;
}

// [start, end) of sequence b in a packed tensor of `total` rows, clamped (sequence_ranges in the reference).
__device__ __forceinline__ void seq_range(const int32_t* cu, int b, int64_t total, int& start, int& len) {
  const int64_t a = min(max(static_cast<int64_t>(cu[b]), int64_t{0}), total);
  const int64_t e = min(max(static_cast<int64_t>(cu[b + 1]), a), total);
  start = static_cast<int>(a);
  len = static_cast<int>(e - a);
}

// The CTA's tile count (the same for both consumers): keys up to the last visible key of the block's last row.
__device__ __forceinline__ int cta_tiles(int q0, int len_q, int len_k, int causal) {
  if (len_k <= 0) return 0;
  if (!causal) return (len_k + kBN - 1) / kBN;
  const int last_key = min(len_k - 1, min(q0 + kBM, len_q) - 1 + (len_k - len_q));
  return last_key < 0 ? 0 : last_key / kBN + 1;
}

// A thread's two rows: running maxima (log2 units: scores x scale_log2) and row sums of its 16 of each tile's 64
// columns (the quad's four sums added at the end).
struct Rows {
  float m_lo, m_hi, l_lo, l_hi;
};

// Online softmax of the 64-key tile at key0 in sc (the S accumulator, unscaled scores): keys past len_k and, causal,
// past row qr + off masked to -inf (only where the tile crosses first_row + off, the warpgroup's first row's limit,
// or len_k), the running maximum once per tile, P = 2^(s·scale_log2 - m) in sc (float32), the row sums; a_lo / a_hi
// O's rescale factors 2^(m_old - m_new) (1 where no maximum moved, 0 · ... for a first visible tile).
__device__ __forceinline__ void tile_softmax(float (&sc)[32], Rows& r, int key0, int len_k, int causal, int first_row,
                                             int off, int qrow_lo, int t, float scale_log2, float& a_lo, float& a_hi) {
  const bool need_mask = key0 + kBN > len_k || (causal && key0 + kBN - 1 > first_row + off);
  if (need_mask) {
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const int key = key0 + 8 * (e >> 2) + 2 * (t & 3) + (e & 1);
      const int qr = qrow_lo + 8 * ((e >> 1) & 1);
      if (key >= len_k || (causal && key > qr + off)) sc[e] = -INFINITY;
    }
  }
  // row maxima as 4 chains of 4 per row, then 2 levels (element e = 4q + 2r + b is row r's value 2q + b)
  float lo[4], hi[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    lo[c] = fmaxf(fmaxf(sc[8 * c], sc[8 * c + 1]), fmaxf(sc[8 * c + 4], sc[8 * c + 5]));
    hi[c] = fmaxf(fmaxf(sc[8 * c + 2], sc[8 * c + 3]), fmaxf(sc[8 * c + 6], sc[8 * c + 7]));
  }
  float mx_lo = fmaxf(fmaxf(lo[0], lo[1]), fmaxf(lo[2], lo[3]));
  float mx_hi = fmaxf(fmaxf(hi[0], hi[1]), fmaxf(hi[2], hi[3]));
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, d));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, d));
  }
  // max commutes with the (positive) scale: the running max of scaled scores is max(m, rowmax·scale)
  const float mn_lo = fmaxf(r.m_lo, mx_lo * scale_log2), mn_hi = fmaxf(r.m_hi, mx_hi * scale_log2);
  const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
  a_lo = ex2(r.m_lo - mu_lo);
  a_hi = ex2(r.m_hi - mu_hi);
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int e = 0; e < 32; ++e) {
    const float x = ex2(fmaf(sc[e], scale_log2, -((e & 2) ? mu_hi : mu_lo)));
    sc[e] = x;
    if (e & 2) sum_hi += x; else sum_lo += x;
  }
  r.l_lo = r.l_lo * a_lo + sum_lo;
  r.l_hi = r.l_hi * a_hi + sum_hi;
  r.m_lo = mn_lo;
  r.m_hi = mn_hi;
}

// The thread's rows of out [total_q, heads, 128] (bf16) and lse [heads, total_q] (natural log; null: none): O ·
// out_scale / l with l summed over the quad, rows past len_q skipped; LSE = (m + log2 l)·ln 2, -inf where l = 0.
__device__ __forceinline__ void store_rows(const float (&o)[64], Rows r, float out_scale, uint16_t* out, float* lse,
                                           int64_t total_q, int heads, int h, int q_begin_seq, int qrow_lo, int len_q,
                                           int t) {
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    r.l_lo += __shfl_xor_sync(0xffffffffu, r.l_lo, d);
    r.l_hi += __shfl_xor_sync(0xffffffffu, r.l_hi, d);
  }
  const float inv_lo = r.l_lo > 0.f ? out_scale * rcp_approx(r.l_lo) : 0.f;
  const float inv_hi = r.l_hi > 0.f ? out_scale * rcp_approx(r.l_hi) : 0.f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int qr = qrow_lo + 8 * i;
    if (qr >= len_q) continue;
    const float inv = i ? inv_hi : inv_lo;
    uint16_t* orow = out + ((int64_t)(q_begin_seq + qr) * heads + h) * kDv;
#pragma unroll
    for (int j = 2 * i; j < 64; j += 4) {  // j, j+1: columns 8(j/4) + 2(t%4) + {0, 1} of row i
      const int col = 8 * (j >> 2) + 2 * (t & 3);
      *reinterpret_cast<uint32_t*>(orow + col) = bf16x2_bits(o[j] * inv, o[j + 1] * inv);
    }
    if ((t & 3) == 0 && lse) {
      const float l = i ? r.l_hi : r.l_lo, m = i ? r.m_hi : r.m_lo;
      lse[(int64_t)h * total_q + q_begin_seq + qr] = l > 0.f ? (m + lg2_approx(l)) * kLn2 : -INFINITY;
    }
  }
}

// A block without a visible key: the thread's rows of out are 0, their LSE -inf.
__device__ __forceinline__ void store_empty_rows(uint16_t* out, float* lse, int64_t total_q, int heads, int h,
                                                 int q_begin_seq, int qrow_lo, int len_q, int t) {
  for (int i = 0; i < 2; ++i) {
    const int qr = qrow_lo + 8 * i;
    if (qr >= len_q) continue;
    uint16_t* orow = out + ((int64_t)(q_begin_seq + qr) * heads + h) * kDv;
    for (int c = 2 * (t & 3); c < kDv; c += 8) *reinterpret_cast<uint32_t*>(orow + c) = 0u;
    if ((t & 3) == 0 && lse) lse[(int64_t)h * total_q + q_begin_seq + qr] = -INFINITY;
  }
}

// Where a prefill CTA stands (mla_prefill_wgmma.cu, mla_prefill_fp8.cu; grid x = the 128-row query block counted from
// the last, y = head, z = sequence - b0; 384 threads: consumer warpgroups 0, 1 and the producer's).
struct Cta {
  int tid, warp, lane, t, wg;                  // thread, warp (uniform), lane; thread t of warpgroup wg
  int h, b, hk;                                // head, sequence, the head's kv head
  int q_begin_seq, len_q, k_begin_seq, len_k;  // the sequence's first token and length in q and in k
  int q0, n;                                   // the block's first row (in the sequence), its key tiles (64 keys)
  int first_row;                               // the warpgroup's first row (in the sequence)
  int row_lo, qrow_lo;  // this thread's rows: row_lo, row_lo + 8 of its warpgroup; qrow_lo: position in the sequence
};

// The start of a prefill kernel: false when the CTA has no work (a block past the sequence's end; a block that sees
// no key, whose consumer rows it stores here as 0 with LSE -inf). P: PrefillParams or PrefillFp8Params.
template <typename P>
__device__ __forceinline__ bool cta_start(const P& p, int b0, Cta& c) {
  c.tid = threadIdx.x;
  c.warp = __shfl_sync(0xffffffffu, c.tid >> 5, 0);
  c.h = blockIdx.y, c.b = b0 + blockIdx.z;
  c.hk = c.h / (p.heads / p.kv_heads);
  const int mb = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  seq_range(p.cu_q, c.b, p.total_q, c.q_begin_seq, c.len_q);
  seq_range(p.cu_k, c.b, p.total_k, c.k_begin_seq, c.len_k);
  c.q0 = mb * kBM;
  if (c.q0 >= c.len_q) return false;
  c.n = cta_tiles(c.q0, c.len_q, c.len_k, p.causal);
  c.t = c.tid & 127, c.wg = c.warp >> 2, c.lane = c.tid & 31;
  c.row_lo = 16 * (c.t >> 5) + ((c.t & 31) >> 2);
  c.first_row = c.q0 + 64 * c.wg;
  c.qrow_lo = c.first_row + c.row_lo;
  if (c.n == 0) {  // no visible key for any row of the block: output 0, LSE -inf
    if (c.wg < 2) store_empty_rows(p.out, p.lse, p.total_q, p.heads, c.h, c.q_begin_seq, c.qrow_lo, c.len_q, c.t);
    return false;
  }
  return true;
}

// Tile 0 of a prefill consumer warpgroup (the kernels; after its wait for tile 0's K): S(0) alone in the warpgroup's
// first turn (named barriers my_turn / other_turn, 256 threads: the other warpgroup's turn follows if `pass_turn`:
// one CTA an item, unless this is warpgroup 1 with a single tile; always in the persistent kernel), then the softmax
// of S(0) (O is 0: no rescale) and P's A fragments. issue_s(j): S(j) into sc; softmax(j, a_lo, a_hi); pack_p(): the
// kernel's own.
template <typename IssueS, typename Softmax, typename PackP>
__device__ __forceinline__ void first_tile(float (&sc)[32], int my_turn, int other_turn, bool pass_turn,
                                           IssueS& issue_s, Softmax& softmax, PackP& pack_p) {
  nb_sync<256>(my_turn);
  wg_fence();
  issue_s(0);
  if (pass_turn) nb_arrive<256>(other_turn);
  wg_wait<0>();
  reg_fence(sc);
  {
    float a_lo, a_hi;
    softmax(0, a_lo, a_hi);  // O is 0: no rescale
  }
  pack_p();
}

// Host side, shared by the prefill launchers.
constexpr int kMaxDevices = 64;  // devices whose per-device facts (SM count, shared-memory attribute) are remembered

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The current device's SM count, asked once per device (not a stream operation: capture-safe).
inline cudaError_t sm_count(int& count) {
  static int sms[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  count = device < kMaxDevices ? sms[device] : 0;
  if (count == 0) {
    err = cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) sms[device] = count;
  }
  return cudaSuccess;
}

// Blocks for a grid-stride launch: one resident wave of 256-thread CTAs (per_sm per SM: 8 unless the kernel's
// registers allow fewer, resident_ctas), or fewer where `items` (one per thread) run out.
inline cudaError_t wave_blocks(int64_t items, unsigned& blocks, int per_sm = 8) {
  int count = 0;
  const cudaError_t err = sm_count(count);
  if (err != cudaSuccess) return err;
  blocks = static_cast<unsigned>(std::min<int64_t>((items + 255) / 256, int64_t{per_sm} * count));
  return cudaSuccess;
}

// How many 256-thread CTAs of `kernel` one SM holds at once (its registers decide), asked once per device into
// `cache` (one array per kernel; not a stream operation: capture-safe). A grid-stride launch of more CTAs than that
// per SM runs its last ones in a second, partly empty wave (8 launched, 6 resident: the last 2 alone).
template <typename Kernel>
inline cudaError_t resident_ctas(Kernel kernel, int (&cache)[kMaxDevices], int& per_sm) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  per_sm = device < kMaxDevices ? cache[device] : 0;
  if (per_sm == 0) {
    err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, 256, 0);
    if (err != cudaSuccess) return err;
    per_sm = std::max(per_sm, 1);
    if (device < kMaxDevices) cache[device] = per_sm;
  }
  return cudaSuccess;
}

}  // namespace prefill
}  // namespace mla_core_cuda
