// decode_wgmma_probe_w.cu: variant W of the WGMMA decode probe (issue 9): FlashMLA's round of two 64-key blocks,
// one per consumer warpgroup, under this project's numerics contract (32-key P tiles, docs/numerics.md):
//   - round r holds blocks A = 2r (warpgroup 0's) and B = 2r + 1 (warpgroup 1's), each in a K buffer of its own
//     (Q + 2 buffers = 221 KB: no third buffer fits). Warpgroup w computes its block's full S = Q·K^T (36 x
//     m64n64k16 SS: Q read from shared memory once per 64 keys per warpgroup, where Z's m64n32 halves read it
//     once per 32 keys), its softmax over the block's two P tiles, and writes its P (64 x 64 bf16) into the
//     block's rope slab (slab 8), free once its own S completed;
//   - the output is split by columns as in Z (O_L = columns 0-255 on warpgroup 0, O_R on warpgroup 1); each
//     accumulates both blocks in key order: own block's P from registers (RS), the other's from the other
//     buffer's slab 8 (SS). Four P tiles per round, so four O rescales per round (the contract rounds each
//     32-key P tile against its own running maximum: FlashMLA's fold of the second block's factor into the
//     first block's P would change P's bf16 values);
//   - loads: Z's producer warpgroup (warps 8-11, 16 rows a warp, cp.async gather through the block table,
//     setmaxnreg 56 / 224), not TMA (see NOTES: the time this session had; a paged TMA gather needs a tensor map
//     per cache and one more PTX family to verify). The refill is per buffer part, FlashMLA's release-when-the-
//     last-reader-is-done at the granularity of the readers: part 0 of buffer X = the owner's V slabs (A: 0-3,
//     B: 4-7), read by the owner alone (S and its own P·V); part 1 = the other V slabs and slab 8 (the owner's
//     S, then the other warpgroup's P·V with P from slab 8). Each part has a full and an empty mbarrier; the
//     producer publishes a part with cp.async.mbarrier.arrive.noinc (the arrival fires when the thread's copies
//     landed), so it never waits for its own copies and refills each part as soon as its reader released it;
//     a consumer runs fence.proxy.async after each full wait (the copies are generic-proxy writes, wgmma reads
//     through the async proxy). S issues its k-steps part by part in the order the parts are freed (A: part 0
//     first; B: part 1 first).
// The probe's code (decode_wgmma_probe.cu) is included, not copied: its helpers, variant Y (timed beside W in the
// same run) and the float64 reference. benchmarks/NOTES.md ("WGMMA decode probe, variant W") has the floors, the
// prediction and the findings.
//
// Build (nvcc 13.0): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/decode_probe_w \
//                    decode_wgmma_probe_w.cu         (or: bash run_decode_probe_w.sh)
//
// ---------------------------------------------------------------------------------------------------------
// Synchronization (CTA of 384 threads: warpgroup 0 = warps 0-3, 1 = warps 4-7, producer = warps 8-11; a split
// of T 64-key blocks runs R = ceil(T / 2) rounds; a missing last block B is produced as zeros and fully masked).
//   full[X][p]  mbarrier, 128 arrivals (every producer thread, cp.async.mbarrier.arrive.noinc): round r's fill of
//               part p of buffer X completes phase r; consumers wait with parity r & 1.
//   empty[X][p] mbarrier, 4 arrivals (lane 0 of each warp of the part's reader: p = 0 the owner X, p = 1 the
//               other warpgroup) after the warp's last wgmma reading the part completed; the producer refills
//               the part for round r >= 1 after phase r - 1: parity (r - 1) & 1.
//   Named barriers (256 threads: one warpgroup arrives, the other syncs):
//     1 MXA  WG0 -> WG1  block A's row maxima (both tiles) in smxa
//     2 PAF  WG0 -> WG1  P_A in buffer A's slab 8 (+ proxy fence)
//     3 BF   WG1 -> WG0  block B's row maxima in smxb and P_B in buffer B's slab 8 (+ proxy fence)
//     4 ALL  both (Q loaded; final row sums)
//   Per round, in program order:
//     WG0: wait full[A][0]; S_A part 0; wait full[A][1]; S_A part 1; maxima -> smxa; arrive MXA; m1, m2, P_A;
//          P_A -> slab 8 of A; arrive PAF; O_L·a1; P_A0·V_A (RS); O_L·a2; P_A1·V_A (RS); sync BF; m3, m4;
//          release empty[A][0]; wait full[B][1]; O_L·a3; P_B0·V_B (SS); O_L·a4; P_B1·V_B (SS); release empty[B][1]
//     WG1: wait full[B][1]; S_B part 1; wait full[B][0]; S_B part 0; sync MXA; m1..m4, P_B; P_B -> slab 8 of B,
//          maxima -> smxb; arrive BF; O_R·a1; sync PAF; wait full[A][1]; P_A0·V_A (SS); O_R·a2; P_A1·V_A (SS);
//          release empty[A][1]; O_R·a3; P_B0·V_B (RS); O_R·a4; P_B1·V_B (RS); release empty[B][0]
//     producer: for X = A, B: for its parts in S's order: [r > 0: wait empty[X][p]]; copy; arrive.noinc full[X][p]
//   The full waits before the other block's P·V pass at once (the part's next phase needs this warpgroup's own
//   release); they make each warpgroup acquire the producer's copies itself before its proxy fence, instead of
//   relying on the other warpgroup's fence through a named barrier.
//   Buffer reuse: slab 8 of X holds block X's rope columns until the owner's S completed and then its P until the
//   other warpgroup's P·V completed; its next fill waits for that warpgroup's release of part 1 (the producer
//   ring orders it, no barrier of its own). smxa: WG0 rewrites it in round r + 1 after sync BF(r), which WG1
//   arrives at after reading smxa(r). smxb: WG1 rewrites it in round r + 1 after sync MXA(r + 1), which WG0
//   arrives at after reading smxb(r). Named barriers are never completed by one side's arrivals alone: between
//   WG0's arrivals at MXA(r) and MXA(r + 1) it syncs BF(r), arrived at by WG1 after its MXA(r) sync; between
//   PAF(r) and PAF(r + 1) WG0 waits full[A][1] of round r + 1, which needs WG1's release after its PAF(r) sync;
//   between BF(r) and BF(r + 1) WG1 syncs MXA(r + 1), arrived at by WG0 after its BF(r) sync.
//   decode_wgmma_w_emulation.py checks all of it over every interleaving of the three programs for 1-4 rounds
//   (no deadlock, no buffer part refilled before its readers released it, no slab 8 / maxima overwritten before
//   read, no generation completed by arrivals alone) and that broken variants are caught.
//
// Numerics: per round, with the tiles' row maxima mxA0, mxA1, mxB0, mxB1 (log2 domain, masked keys -inf),
// m1 = max(m, mxA0), m2 = max(m1, mxA1), m3 = max(m2, mxB0), m4 = max(m3, mxB1) (fmaxf in this order, the same
// float32 values in both warpgroups), a_k = 2^(m_{k-1} - m_k); P_A0 = bf16(2^(S_A0 - m1)), P_A1 against m2,
// P_B0 against m3, P_B1 against m4 (the contract's per-32-key running maximum); row sums from the float32 P,
// WG0 over block A: l0 = (((l0·a1 + ΣP_A0)·a2 + ΣP_A1)·a3)·a4, WG1 over block B: l1 = (((l1·a1)·a2)·a3 + ΣP_B0)·a4
// + ΣP_B1, l = l0 + l1 at the end; O_w = (((O_w·a1 + P_A0·V_A0w)·a2 + P_A1·V_A1w)·a3 + P_B0·V_B0w)·a4 + P_B1·V_B1w.
// A multiply by a factor that is exactly 1 for all 16 rows of a warp is skipped (no bit changes). The float32
// order differs from Y's (S of block B sums its k-steps in another order, l is summed per block): float32
// rounding only; the host test counts output bits that differ from Y's on the same inputs (not a pass condition).
#define main decode_probe_ry_main  // the probe's own main (R and Y) is not this program's
#include "decode_wgmma_probe.cu"
#include <cstring>
#undef main

constexpr int kThreadsW = 384;  // 2 consumer warpgroups + 1 producer warpgroup
constexpr int kProducerRegsW = 56, kConsumerRegsW = 224;  // setmaxnreg: 56 + 2 x 224 = 3 x 168
constexpr int kBarMxA = 1, kBarPaF = 2, kBarBF = 3, kBarAllW = 4;
constexpr int kPairW = 256;  // threads per named-barrier generation
// Q + 2 K buffers + smxa, smxb, sl ([2][64] floats each) + 8 mbarriers + alignment slack = 223,808 B
constexpr int kSmemW = 3 * kTileBytes + 6 * 64 * 4 + 8 * 8 + 1024;

// The producer's copy of 16 rows x 32 chunks (4 slabs from chunk c0; 16 cp.async per lane) of one block, rows
// 16pw.. (row_off: lane l < 16 holds row l's cache byte offset, -1 for a key past the split's end: zero-filled).
__device__ __forceinline__ void produce_slabs4(uint8_t* sk, const uint8_t* cache, long long row_off, int r0, int c0,
                                               int lane) {
#pragma unroll 4
  for (int r = 0; r < 16; ++r) {
    const long long off = __shfl_sync(0xffffffffu, row_off, r);
    const int c = c0 + lane;
    cp_async16(sk + slab_off(r0 + r, c * 16, 64), off >= 0 ? cache + off + c * 16 : cache, off >= 0 ? 16u : 0u);
  }
}
// The rope slab (chunks 64-71) of the same 16 rows: 4 cp.async per lane.
__device__ __forceinline__ void produce_rope(uint8_t* sk, const uint8_t* cache, long long row_off, int r0, int lane) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int r = 4 * k + (lane >> 3), c = 64 + (lane & 7);
    const long long off = __shfl_sync(0xffffffffu, row_off, r);
    cp_async16(sk + slab_off(r0 + r, c * 16, 64), off >= 0 ? cache + off + c * 16 : cache, off >= 0 ? 16u : 0u);
  }
}
// Arrive on `bar` once every cp.async this thread issued so far has landed (counts as one of its arrivals).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// P (a[ks] = the RS fragments of keys 16ks..16ks+15) into a 64 x 64 bf16 K-major slab (slab 8 of a buffer).
__device__ __forceinline__ void store_p_slab(uint8_t* sp, const uint32_t (&a)[4][4], int row_lo, int t) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    const int key = 16 * ks + 2 * (t & 3);
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, key * 2, 64)) = a[ks][0];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, key * 2, 64)) = a[ks][1];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, (key + 8) * 2, 64)) = a[ks][2];
    *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, (key + 8) * 2, 64)) = a[ks][3];
  }
}
// O·a per warp, skipped when the factor is exactly 1 for all 16 rows of the warp.
__device__ __forceinline__ void rescale(float (&o)[128], float a_lo, float a_hi) {
  if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) scale_rows(o, a_lo, a_hi);
}
// One 32-key P tile times this warpgroup's V columns of a block: 2 k-steps (keys 32h..32h+31), P from registers.
__device__ __forceinline__ void pv_rs(float (&o)[128], const uint32_t (&a)[4][4], int h, const uint8_t* sv) {
  wg_fence();
  wgmma_n256_rs_bf16<1>(o, a[2 * h], mnmajor_desc(sv, 32 * h, 64 * 128, 1024), 1);
  wgmma_n256_rs_bf16<1>(o, a[2 * h + 1], mnmajor_desc(sv, 32 * h + 16, 64 * 128, 1024), 1);
  wg_commit();
}
// The same with P from a P slab (keys 32h..32h+31 = bytes 64h.. of its rows).
__device__ __forceinline__ void pv_ss(float (&o)[128], const uint8_t* sp, int h, const uint8_t* sv) {
  wg_fence();
  wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 64 * h), mnmajor_desc(sv, 32 * h, 64 * 128, 1024), 1);
  wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 64 * h + 32), mnmajor_desc(sv, 32 * h + 16, 64 * 128, 1024), 1);
  wg_commit();
}
__device__ __forceinline__ void wg_drain(float (&o)[128]) {
  wg_wait<0>();
  reg_fence(o);
}
// Lane 0 of each warp: this warp's reads of a buffer part are done.
__device__ __forceinline__ void release(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

__global__ void __launch_bounds__(kThreadsW, 1) k_decode_w(const DecodeParams p) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);
  uint8_t* const ska = sq + kTileBytes;  // buffer A (block 2r); buffer B (block 2r + 1) follows it
  float* smxa = reinterpret_cast<float*>(sq + 3 * kTileBytes);  // [2 tiles][64 rows]: block A's maxima
  float* smxb = smxa + 128;                                     // block B's
  float* sl = smxb + 128;                                       // [2][64] final row sums
  uint64_t* full = reinterpret_cast<uint64_t*>(sl + 128);       // [buffer][part]
  uint64_t* empty = full + 4;                                   // [buffer][part]
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int h0 = blockIdx.x * kHeadsPerCta, split = blockIdx.y, b = blockIdx.z;
  int start, end;
  if (!split_range(p, b, split, start, end)) {
    if (tid < kThreads) write_empty(p, b, split, h0);
    return;
  }
  const int rounds = (end - start + 2 * kTileKeys - 1) / (2 * kTileKeys);
  if (tid == 0) {
    for (int i = 0; i < 4; ++i) {
      mbar_init(&full[i], 128);
      mbar_init(&empty[i], 4);
    }
  }
  __syncthreads();

  if (warp >= 8) {  // producer: warp 8 + pw copies rows 16pw..16pw+15 of every block
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegsW));
    const int lane = tid & 31, pw = warp - 8, r0 = 16 * pw;
    const uint8_t* cache = reinterpret_cast<const uint8_t*>(p.cache);
    const int* bt = p.block_table + (size_t)b * p.max_pages;
#pragma unroll 1
    for (int r = 0; r < rounds; ++r) {
#pragma unroll 1
      for (int x = 0; x < 2; ++x) {
        const int pos = start + (2 * r + x) * kTileKeys + r0 + (lane & 15);
        const long long row_off =
            pos < end ? (static_cast<long long>(bt[pos / kPage]) * kPage + pos % kPage) * kRowBytes : -1ll;
#pragma unroll 1
        for (int k = 0; k < 2; ++k) {
          const int part = x == 0 ? k : 1 - k;  // the order S reads them in
          if (r > 0) mbar_wait(&empty[2 * x + part], (r - 1) & 1);
          if (part == 0) {
            produce_slabs4(ska + x * kTileBytes, cache, row_off, r0, 32 * x, lane);  // the owner's V slabs
          } else {
            produce_slabs4(ska + x * kTileBytes, cache, row_off, r0, 32 * (1 - x), lane);  // the other's V slabs
            produce_rope(ska + x * kTileBytes, cache, row_off, r0, lane);
          }
          cp_async_mbar_arrive(&full[2 * x + part]);
        }
      }
    }
    cp_async_wait_all();  // nothing in flight when the thread exits
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegsW));

  {  // Q rows of the head group (rows past the head count zero-filled), visible to wgmma
    const uint8_t* qb = reinterpret_cast<const uint8_t*>(p.q + ((size_t)b * p.heads + h0) * kD);
    for (int i = tid; i < kHeadsPerCta * (kRowBytes / 16); i += kThreads) {
      const int r = i / (kRowBytes / 16), c = i % (kRowBytes / 16);
      const bool ok = h0 + r < p.heads;
      cp_async16(sq + slab_off(r, c * 16, 64), ok ? qb + r * kRowBytes + c * 16 : qb, ok ? 16u : 0u);
    }
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    nb_sync<kPairW>(kBarAllW);
  }
  const int wg = warp >> 2, t = tid & 127, lane = tid & 31;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);
  uint8_t* const sko = ska + wg * kTileBytes;        // own block's buffer
  uint8_t* const skx = ska + (1 - wg) * kTileBytes;  // the other block's buffer
  uint8_t* const spo = sko + 8 * 64 * 128;        // own P (slab 8 of the own buffer)
  const uint8_t* const spx = skx + 8 * 64 * 128;  // the other warpgroup's P
  const uint8_t* const svo = sko + wg * 4 * 64 * 128;  // this warpgroup's V columns of the own block
  const uint8_t* const svx = skx + wg * 4 * 64 * 128;  // ... of the other block

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: own block's tiles, this thread's columns
#pragma unroll 1
  for (int r = 0; r < rounds; ++r) {
    const uint32_t par = r & 1;
    // S of the own block: 36 x m64n64k16 SS, part by part (A: slabs 0-3, then 4-8; B: slabs 0-3 and 8, then 4-7).
    float sc[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) sc[j] = 0.f;
    reg_fence(sc);
    // One code path for both warpgroups (a wgmma chain split over two branches made ptxas inject
    // warpgroup.arrive at the join, C7519): k-steps 0-15 (slabs 0-3), 32-35 (slab 8), 16-31 (slabs 4-7), each
    // group after a wait for the part holding it (a second wait on a part already waited for passes at once:
    // its next phase needs this warpgroup's release).
    const int f1 = wg ? 3 : 0, f2 = wg ? 3 : 1, f3 = wg ? 2 : 1;  // full[buffer * 2 + part]
    mbar_wait(&full[f1], par);
    fence_proxy_async();
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 16; ++ks)
      wgmma_n64_ss_bf16(sc, kmajor_desc(sq, 64, ks * 32), kmajor_desc(sko, 64, ks * 32), ks > 0);
    mbar_wait(&full[f2], par);
    fence_proxy_async();
    wg_fence();
#pragma unroll
    for (int ks = 32; ks < 36; ++ks)
      wgmma_n64_ss_bf16(sc, kmajor_desc(sq, 64, ks * 32), kmajor_desc(sko, 64, ks * 32), 1);
    mbar_wait(&full[f3], par);
    fence_proxy_async();
    wg_fence();
#pragma unroll
    for (int ks = 16; ks < 32; ++ks)
      wgmma_n64_ss_bf16(sc, kmajor_desc(sq, 64, ks * 32), kmajor_desc(sko, 64, ks * 32), 1);
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);

    // Scores in the log2 domain, keys past the end -inf; row maxima of the block's two 32-key tiles.
    const int nvalid = end - (start + (2 * r + wg) * kTileKeys);  // may be <= 0: a missing last block B
    float mx_lo[2] = {-INFINITY, -INFINITY}, mx_hi[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int col = 8 * (j >> 2) + 2 * (t & 3) + (j & 1);
      const float x = col < nvalid ? sc[j] * p.scale_log2 : -INFINITY;
      sc[j] = x;
      if (j & 2) mx_hi[j >> 4] = fmaxf(mx_hi[j >> 4], x); else mx_lo[j >> 4] = fmaxf(mx_lo[j >> 4], x);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int d = 1; d <= 2; d <<= 1) {
        mx_lo[h] = fmaxf(mx_lo[h], __shfl_xor_sync(0xffffffffu, mx_lo[h], d));
        mx_hi[h] = fmaxf(mx_hi[h], __shfl_xor_sync(0xffffffffu, mx_hi[h], d));
      }
    float ma_lo[2], ma_hi[2], mb_lo[2], mb_hi[2];  // the round's four tile maxima
    if (wg == 0) {
      if ((t & 3) == 0) {
        smxa[row_lo] = mx_lo[0];
        smxa[row_lo + 8] = mx_hi[0];
        smxa[64 + row_lo] = mx_lo[1];
        smxa[64 + row_lo + 8] = mx_hi[1];
      }
      nb_arrive<kPairW>(kBarMxA);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ma_lo[h] = mx_lo[h];
        ma_hi[h] = mx_hi[h];
      }
    } else {
      nb_sync<kPairW>(kBarMxA);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        ma_lo[h] = smxa[64 * h + row_lo];
        ma_hi[h] = smxa[64 * h + row_lo + 8];
        mb_lo[h] = mx_lo[h];
        mb_hi[h] = mx_hi[h];
      }
    }
    const float m1_lo = fmaxf(m_lo, ma_lo[0]), m1_hi = fmaxf(m_hi, ma_hi[0]);
    const float m2_lo = fmaxf(m1_lo, ma_lo[1]), m2_hi = fmaxf(m1_hi, ma_hi[1]);
    const float a1_lo = ex2(m_lo - m1_lo), a1_hi = ex2(m_hi - m1_hi);  // 0 in round 0 (m = -inf)
    const float a2_lo = ex2(m1_lo - m2_lo), a2_hi = ex2(m1_hi - m2_hi);
    uint32_t a[4][4];  // own P as RS fragments: k-steps 0, 1 = tile 0; 2, 3 = tile 1
    float sum_lo[2] = {0.f, 0.f}, sum_hi[2] = {0.f, 0.f};
    if (wg == 0) {
      // P_A0 against m1, P_A1 against m2
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float mref = j < 16 ? ((j & 2) ? m1_hi : m1_lo) : ((j & 2) ? m2_hi : m2_lo);
        const float e = ex2(sc[j] - mref);
        sc[j] = e;
        if (j & 2) sum_hi[j >> 4] += e; else sum_lo[j >> 4] += e;
      }
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[ks][i] = pack_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
      store_p_slab(spo, a, row_lo, t);
      fence_proxy_async();
      nb_arrive<kPairW>(kBarPaF);
      rescale(o, a1_lo, a1_hi);
      pv_rs(o, a, 0, svo);
      wg_drain(o);
      rescale(o, a2_lo, a2_hi);
      pv_rs(o, a, 1, svo);
      nb_sync<kPairW>(kBarBF);  // block B's maxima and P_B
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        mb_lo[h] = smxb[64 * h + row_lo];
        mb_hi[h] = smxb[64 * h + row_lo + 8];
      }
      const float m3_lo = fmaxf(m2_lo, mb_lo[0]), m3_hi = fmaxf(m2_hi, mb_hi[0]);
      const float m4_lo = fmaxf(m3_lo, mb_lo[1]), m4_hi = fmaxf(m3_hi, mb_hi[1]);
      const float a3_lo = ex2(m2_lo - m3_lo), a3_hi = ex2(m2_hi - m3_hi);
      const float a4_lo = ex2(m3_lo - m4_lo), a4_hi = ex2(m3_hi - m4_hi);
      l_lo = (((l_lo * a1_lo + sum_lo[0]) * a2_lo + sum_lo[1]) * a3_lo) * a4_lo;
      l_hi = (((l_hi * a1_hi + sum_hi[0]) * a2_hi + sum_hi[1]) * a3_hi) * a4_hi;
      m_lo = m4_lo;
      m_hi = m4_hi;
      wg_drain(o);
      release(&empty[0], lane);  // buffer A's part 0 (slabs 0-3): S_A and P_A·V_A_L done
      mbar_wait(&full[3], par);  // B's slabs 0-3: acquired and fenced by this warpgroup too (complete already)
      fence_proxy_async();
      rescale(o, a3_lo, a3_hi);
      pv_ss(o, spx, 0, svx);
      wg_drain(o);
      rescale(o, a4_lo, a4_hi);
      pv_ss(o, spx, 1, svx);
      wg_drain(o);
      release(&empty[3], lane);  // buffer B's part 1 (slabs 0-3, P_B): P_B·V_B_L done
    } else {
      const float m3_lo = fmaxf(m2_lo, mb_lo[0]), m3_hi = fmaxf(m2_hi, mb_hi[0]);
      const float m4_lo = fmaxf(m3_lo, mb_lo[1]), m4_hi = fmaxf(m3_hi, mb_hi[1]);
      const float a3_lo = ex2(m2_lo - m3_lo), a3_hi = ex2(m2_hi - m3_hi);
      const float a4_lo = ex2(m3_lo - m4_lo), a4_hi = ex2(m3_hi - m4_hi);
      // P_B0 against m3, P_B1 against m4
#pragma unroll
      for (int j = 0; j < 32; ++j) {
        const float mref = j < 16 ? ((j & 2) ? m3_hi : m3_lo) : ((j & 2) ? m4_hi : m4_lo);
        const float e = ex2(sc[j] - mref);
        sc[j] = e;
        if (j & 2) sum_hi[j >> 4] += e; else sum_lo[j >> 4] += e;
      }
      l_lo = (((l_lo * a1_lo) * a2_lo) * a3_lo + sum_lo[0]) * a4_lo + sum_lo[1];
      l_hi = (((l_hi * a1_hi) * a2_hi) * a3_hi + sum_hi[0]) * a4_hi + sum_hi[1];
      m_lo = m4_lo;
      m_hi = m4_hi;
#pragma unroll
      for (int ks = 0; ks < 4; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[ks][i] = pack_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
      store_p_slab(spo, a, row_lo, t);
      if ((t & 3) == 0) {
        smxb[row_lo] = mb_lo[0];
        smxb[row_lo + 8] = mb_hi[0];
        smxb[64 + row_lo] = mb_lo[1];
        smxb[64 + row_lo + 8] = mb_hi[1];
      }
      fence_proxy_async();
      nb_arrive<kPairW>(kBarBF);
      rescale(o, a1_lo, a1_hi);
      nb_sync<kPairW>(kBarPaF);  // P_A
      mbar_wait(&full[1], par);  // A's slabs 4-7: acquired and fenced by this warpgroup too (complete already)
      fence_proxy_async();
      pv_ss(o, spx, 0, svx);
      wg_drain(o);
      rescale(o, a2_lo, a2_hi);
      pv_ss(o, spx, 1, svx);
      wg_drain(o);
      release(&empty[1], lane);  // buffer A's part 1 (slabs 4-7, P_A): P_A·V_A_R done
      rescale(o, a3_lo, a3_hi);
      pv_rs(o, a, 0, svo);
      wg_drain(o);
      rescale(o, a4_lo, a4_hi);
      pv_rs(o, a, 1, svo);
      wg_drain(o);
      release(&empty[2], lane);  // buffer B's part 0 (slabs 4-7): S_B and P_B·V_B_R done
    }
  }
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
  }
  if ((t & 3) == 0) {
    sl[wg * 64 + row_lo] = l_lo;
    sl[wg * 64 + row_lo + 8] = l_hi;
  }
  nb_sync<kPairW>(kBarAllW);
  store_rows(p, o, b, split, h0, m_lo, m_hi, sl[row_lo] + sl[64 + row_lo], sl[row_lo + 8] + sl[64 + row_lo + 8]);
}

// ---------------------------------------------------------------------------------------------------------
// Host side: Y (the probe's lockstep variant, the same-run baseline) and W, checked on the same inputs against
// the float64 contract, then timed. Z is not in this binary (decode_wgmma_probe_z.cu has a main of its own after
// it includes the probe, so it cannot be included again); its figures are quoted from the same day's run.
struct VariantW {
  const char* tag;
  const char* name;
  void (*kernel)(DecodeParams);
  int smem, threads;
};
static const VariantW kVariantsW[2] = {{"Y", "Y (the probe's variant Y, lockstep)", k_decode_y, kSmemY, kThreads},
                                       {"W", "W (two 64-key blocks per round, one per warpgroup)", k_decode_w, kSmemW,
                                        kThreadsW}};
static int g_fail_w[2] = {0, 0};

static void launch_w(const VariantW& v, const DecodeParams& p, int batch) {
  const dim3 grid((p.heads + kHeadsPerCta - 1) / kHeadsPerCta, p.num_splits, batch);
  v.kernel<<<grid, v.threads, v.smem>>>(p);
  if (p.num_splits > 1) k_combine<<<batch * p.heads, 128>>>(p.o_part, p.lse_part, p.out, p.lse, p.heads, p.num_splits);
}

// One correctness case: uniform [-1, 1] q and cache, pages shuffled, NaN in every row no length reaches (the tail
// of a last page, 4 poison pages behind the unused block-table entries), outputs poisoned with NaN; Y and W on the
// same inputs against the float64 reference, then W's output bits against Y's (float32 order differs: counted,
// not a pass condition).
static void check_case_w(const char* name, int heads, int splits, const std::vector<int>& lens, float scale,
                         std::mt19937& rng) {
  const int batch = static_cast<int>(lens.size());
  const int max_len = *std::max_element(lens.begin(), lens.end());
  const int max_pages = std::max(1, (max_len + kPage - 1) / kPage);
  int real_pages = 0;
  for (int L : lens) real_pages += (L + kPage - 1) / kPage;
  const int poison = 4, pages = real_pages + poison;
  std::vector<int> perm(real_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int> pick_poison(real_pages, pages - 1);
  std::vector<int> bt(static_cast<size_t>(batch) * max_pages);
  std::vector<float> cache(static_cast<size_t>(pages) * kPage * kD, NAN);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto rb = [&]() { return __bfloat162float(__float2bfloat16(uni(rng))); };
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int pg = 0; pg < max_pages; ++pg) {
      const bool used = pg * kPage < lens[b];
      const int page = used ? perm[next++] : pick_poison(rng);
      bt[static_cast<size_t>(b) * max_pages + pg] = page;
      if (!used) continue;
      for (int r = 0; r < kPage && pg * kPage + r < lens[b]; ++r)
        for (int d = 0; d < kD; ++d) cache[(static_cast<size_t>(page) * kPage + r) * kD + d] = rb();
    }
  std::vector<float> q(static_cast<size_t>(batch) * heads * kD);
  for (float& x : q) x = rb();
  std::vector<__nv_bfloat16> cache_h(cache.size()), q_h(q.size());
  for (size_t i = 0; i < cache.size(); ++i) cache_h[i] = __float2bfloat16(cache[i]);
  for (size_t i = 0; i < q.size(); ++i) q_h[i] = __float2bfloat16(q[i]);
  std::vector<double> ref(static_cast<size_t>(batch) * heads * kDv), ref_lse(static_cast<size_t>(batch) * heads);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const size_t row = static_cast<size_t>(b) * heads + h;
      reference_row(&q[row * kD], cache, &bt[static_cast<size_t>(b) * max_pages], lens[b], splits, scale,
                    &ref[row * kDv], &ref_lse[row]);
    }
  DecodeParams p{};
  p.q = to_device(q_h);
  p.cache = to_device(cache_h);
  p.block_table = to_device(bt);
  p.lengths = to_device(lens);
  p.heads = heads;
  p.max_pages = max_pages;
  p.num_splits = splits;
  p.scale_log2 = scale * 1.4426950408889634f;
  const size_t n_part = static_cast<size_t>(batch) * splits * heads;
  const size_t n_out = static_cast<size_t>(batch) * heads * kDv, n_lse = static_cast<size_t>(batch) * heads;
  CK(cudaMalloc(&p.o_part, n_part * kDv * sizeof(float)));
  CK(cudaMalloc(&p.lse_part, n_part * sizeof(float)));
  CK(cudaMalloc(&p.out, n_out * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&p.lse, n_lse * sizeof(float)));
  std::vector<__nv_bfloat16> outs[2];
  std::vector<float> lses[2];
  for (int vi = 0; vi < 2; ++vi) {
    const VariantW& v = kVariantsW[vi];
    CK(cudaMemset(p.o_part, 0xff, n_part * kDv * sizeof(float)));
    CK(cudaMemset(p.lse_part, 0xff, n_part * sizeof(float)));
    CK(cudaMemset(p.out, 0xff, n_out * sizeof(__nv_bfloat16)));
    CK(cudaMemset(p.lse, 0xff, n_lse * sizeof(float)));
    launch_w(v, p, batch);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    outs[vi] = from_device(p.out, n_out);
    lses[vi] = from_device(p.lse, n_lse);
    const std::vector<__nv_bfloat16>& out = outs[vi];
    const std::vector<float>& lse = lses[vi];
    double num = 0.0, den = 0.0, lse_err = 0.0, max_abs = 0.0;
    int bad_empty = 0, nonfinite = 0;
    for (int b = 0; b < batch; ++b)
      for (int h = 0; h < heads; ++h) {
        const size_t row = static_cast<size_t>(b) * heads + h;
        if (lens[b] == 0) {
          bool ok = lse[row] == -INFINITY;
          for (int c = 0; c < kDv; ++c) ok = ok && __bfloat162float(out[row * kDv + c]) == 0.f;
          bad_empty += !ok;
          continue;
        }
        for (int c = 0; c < kDv; ++c) {
          const double x = __bfloat162float(out[row * kDv + c]), r = ref[row * kDv + c];
          if (!std::isfinite(x)) ++nonfinite;
          num += (x - r) * (x - r);
          den += r * r;
          max_abs = std::max(max_abs, std::fabs(x - r));
        }
        if (!std::isfinite(lse[row])) ++nonfinite;
        lse_err = std::max(lse_err, std::fabs(lse[row] - ref_lse[row]));
      }
    const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
    const bool pass = nonfinite == 0 && bad_empty == 0 && rel < 1e-2 && lse_err < 1e-3;
    g_fail_w[vi] += !pass;
    std::printf("%-2s %-52s %s  rel L2 %.3e  max abs %.3e  LSE max abs err %.3e  non-finite %d  bad empty rows %d\n",
                v.tag, name, pass ? "PASS" : "FAIL", rel, max_abs, lse_err, nonfinite, bad_empty);
  }
  size_t diff_out = 0, diff_lse = 0;
  for (size_t i = 0; i < n_out; ++i)
    diff_out += *reinterpret_cast<const uint16_t*>(&outs[0][i]) != *reinterpret_cast<const uint16_t*>(&outs[1][i]);
  for (size_t i = 0; i < n_lse; ++i) diff_lse += std::memcmp(&lses[0][i], &lses[1][i], sizeof(float)) != 0;
  std::printf("   W vs Y bit for bit: %zu of %zu outputs differ, %zu of %zu LSE differ\n", diff_out, n_out, diff_lse,
              n_lse);
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.q)));
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.cache)));
  CK(cudaFree(const_cast<int*>(p.block_table)));
  CK(cudaFree(const_cast<int*>(p.lengths)));
  CK(cudaFree(p.o_part));
  CK(cudaFree(p.lse_part));
  CK(cudaFree(p.out));
  CK(cudaFree(p.lse));
}

// Timing as the probe's bench (median of 20 after 3 warm-up, L2 flushed by a 256 MB memset before each), Y and W
// alternating per iteration on the same block table (so clock drift hits both), a line each; z_us: Z's split-
// kernel + combine time from the same day's run (benchmarks/results/decode_wgmma_probe_z.log, commit de24a07).
static void bench_w(const BenchBuffers& buf, int heads, int batch, int L, int splits, double flashmla_us, double z_us,
                    std::mt19937& rng) {
  const int max_pages = L / kPage, pages = batch * max_pages;
  std::vector<int> bt(pages), lens(batch, L);
  std::iota(bt.begin(), bt.end(), 0);
  std::shuffle(bt.begin(), bt.end(), rng);
  DecodeParams p{};
  p.q = buf.q;
  p.cache = buf.cache;
  p.block_table = to_device(bt);
  p.lengths = to_device(lens);
  p.heads = heads;
  p.max_pages = max_pages;
  p.num_splits = splits;
  p.scale_log2 = 0.0625f * 1.4426950408889634f;
  CK(cudaMalloc(&p.o_part, static_cast<size_t>(batch) * splits * heads * kDv * sizeof(float)));
  CK(cudaMalloc(&p.lse_part, static_cast<size_t>(batch) * splits * heads * sizeof(float)));
  CK(cudaMalloc(&p.out, static_cast<size_t>(batch) * heads * kDv * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&p.lse, static_cast<size_t>(batch) * heads * sizeof(float)));
  cudaEvent_t e0, e1, e2;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventCreate(&e2));
  const dim3 grid((heads + kHeadsPerCta - 1) / kHeadsPerCta, splits, batch);
  std::vector<float> total[2], split_only[2];
  for (int it = 0; it < 23; ++it)
    for (int vi = 0; vi < 2; ++vi) {
      if (g_fail_w[vi]) continue;
      const VariantW& v = kVariantsW[vi];
      CK(cudaMemsetAsync(buf.flush, it & 0xff, buf.flush_bytes));
      CK(cudaEventRecord(e0));
      v.kernel<<<grid, v.threads, v.smem>>>(p);
      CK(cudaEventRecord(e1));
      if (splits > 1) k_combine<<<batch * heads, 128>>>(p.o_part, p.lse_part, p.out, p.lse, heads, splits);
      CK(cudaEventRecord(e2));
      CK(cudaEventSynchronize(e2));
      CK(cudaGetLastError());
      float ms01 = 0.f, ms02 = 0.f;
      CK(cudaEventElapsedTime(&ms01, e0, e1));
      CK(cudaEventElapsedTime(&ms02, e0, e2));
      if (it >= 3) {
        split_only[vi].push_back(ms01 * 1e3f);
        total[vi].push_back(ms02 * 1e3f);
      }
    }
  const int ctas = grid.x * grid.y * grid.z;
  for (int vi = 0; vi < 2; ++vi) {
    if (g_fail_w[vi]) continue;
    std::sort(total[vi].begin(), total[vi].end());
    std::sort(split_only[vi].begin(), split_only[vi].end());
    const double us = total[vi][total[vi].size() / 2], us_split = split_only[vi][split_only[vi].size() / 2];
    const double tflops = 2.0 * batch * heads * static_cast<double>(L) * (kD + kDv) / (us * 1e-6) / 1e12;
    std::printf("%-2s H%-3d B%-3d L%-5d splits %-2d (%4d CTAs)  %8.1f us (split kernel %8.1f, min %8.1f)  %6.1f "
                "TFLOP/s  %5.2f x FlashMLA (%.1f us)  %5.2f x Z (%.1f us, quoted)\n", kVariantsW[vi].tag, heads, batch,
                L, splits, ctas, us, us_split, total[vi].front(), tflops, us / flashmla_us, flashmla_us, us / z_us,
                z_us);
  }
  CK(cudaFree(const_cast<int*>(p.block_table)));
  CK(cudaFree(const_cast<int*>(p.lengths)));
  CK(cudaFree(p.o_part));
  CK(cudaFree(p.lse_part));
  CK(cudaFree(p.out));
  CK(cudaFree(p.lse));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaEventDestroy(e2));
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out at once: a later hang or trap keeps what came before
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, cc %d.%d, %d SMs, smem/block optin %zu B; smem per CTA: Y %d B, W %d B; threads Y %d, W %d\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.sharedMemPerBlockOptin, kSmemY, kSmemW,
              kThreads, kThreadsW);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("FAIL: needs compute capability 9.0 (sm_90a)\n");
    return 2;
  }
  for (const VariantW& v : kVariantsW)
    CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));

  // Correctness: lengths on and off the 32/64-key edges (0, 1, 31-33, 63-65, 127-129, 777, 1000, 4095, 8191),
  // empty requests and splits, split starts at odd multiples of 32, 1 split (direct write), rounds whose block B
  // is partly or wholly past the end, 1 and 2 rounds per split, heads 16 / 64 / 128 (padded CTAs), scales.
  std::mt19937 rng(2026);
  std::printf("\n== %s\ncorrectness vs a float64 reference of the contract (bf16 output: rel L2 < 1e-2, LSE abs "
              "< 1e-3), Y on the same inputs\n", kVariantsW[1].name);
  check_case_w("H128 splits 3, L {0,1,63,100,1000,3000}", 128, 3, {0, 1, 63, 100, 1000, 3000}, 0.25f, rng);
  check_case_w("H16 splits 5, L {64,33,4096,129,777,8191}", 16, 5, {64, 33, 4096, 129, 777, 8191}, 0.25f, rng);
  check_case_w("H128 splits 1, L {4161,65,2000,0}", 128, 1, {4161, 65, 2000, 0}, 0.25f, rng);
  check_case_w("H64 splits 32, L {31,32,2049}, scale 0.5", 64, 32, {31, 32, 2049}, 0.5f, rng);
  check_case_w("H128 splits 2, L {8192,4095}, scale 0.05", 128, 2, {8192, 4095}, 0.05f, rng);
  check_case_w("H64 splits 2, L {31,32,33,63,64,65,777}", 64, 2, {31, 32, 33, 63, 64, 65, 777}, 0.25f, rng);
  check_case_w("H16 splits 1, L {0,1,31,32,33,63,64,65,127,128,129}", 16, 1,
               {0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129}, 0.25f, rng);
  check_case_w("H128 splits 5, L {1000,33,8191,96}", 128, 5, {1000, 33, 8191, 96}, 0.25f, rng);
  check_case_w("H128 splits 32, L {8191,1,65}", 128, 32, {8191, 1, 65}, 0.25f, rng);
  check_case_w("H64 splits 1, L {192,193,255,256,257}, scale 0.05", 64, 1, {192, 193, 255, 256, 257}, 0.05f, rng);
  for (int vi = 0; vi < 2; ++vi)
    if (g_fail_w[vi]) std::printf("variant %s: %d correctness case(s) failed; its timing skipped\n", kVariantsW[vi].name,
                                  g_fail_w[vi]);

  BenchBuffers buf{};
  const size_t max_rows = static_cast<size_t>(128) * 8192;
  CK(cudaMalloc(&buf.cache, max_rows * kD * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.q, static_cast<size_t>(128) * 128 * kD * sizeof(__nv_bfloat16)));
  buf.flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&buf.flush, buf.flush_bytes));
  k_fill_uniform<<<1024, 256>>>(buf.cache, max_rows * kD, 1u, 1.f);
  k_fill_uniform<<<1024, 256>>>(buf.q, static_cast<size_t>(128) * 128 * kD, 2u, 1.f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::printf("timing: median of 20 (after 3 warm-up), L2 flushed by a 256 MB memset before each, Y and W alternating; "
              "FLOPs 2*B*H*L*1088; FlashMLA's figures on this card from issue 9; Z's quoted from de24a07's run\n");
  bench_w(buf, 128, 32, 8192, 2, 133.0, 174.8, rng);
  bench_w(buf, 128, 128, 8192, 1, 509.4, 615.5, rng);
  bench_w(buf, 16, 32, 8192, 4, 95.3, 101.6, rng);
  CK(cudaFree(buf.cache));
  CK(cudaFree(buf.q));
  CK(cudaFree(buf.flush));
  const bool ok = g_fail_w[0] == 0 && g_fail_w[1] == 0;
  std::printf("\n%s: Y %d, W %d correctness case(s) failed\n", ok ? "ALL PASS" : "FAIL", g_fail_w[0], g_fail_w[1]);
  return ok ? 0 : 1;
}
