// prefill_wgmma_probe.cu: a standalone WGMMA prefill probe for MLA's shapes (issue 12), FlashAttention-3's
// structure written from its description: one CTA per (128 query rows, head, sequence) with a producer warpgroup
// that loads K [64 x 192] and V [64 x 128] tiles by cp.async into a 4-stage ring and two consumer warpgroups
// (64 query rows each) that take turns on the tensor cores ("ping-pong": one warpgroup's softmax runs under the
// other's wgmmas), varlen through cu_seqlens, causal masking on the diagonal tiles only, LSE out.
//   - S = Q·Kᵀ: 12 x wgmma.m64n64k16 per 64-key tile and warpgroup, Q and K from shared memory (SS);
//   - online softmax in registers, log2 domain (scores scaled by softmax_scale·log2 e, ex2 by the SFU);
//   - O += P·V: 4 x wgmma.m64n128k16 with P from registers (RS; the S accumulator converts in place into the A
//     fragments), V row-major in shared memory read MN-major (transpose bit);
//   - S of tile j and P·V of tile j-1 are issued in one turn (two commit groups), so each warpgroup's softmax of
//     tile j also runs under its own P·V of tile j-1 (FA3's intra-warpgroup overlap).
// Variant P8 quantizes P to FP8 E4M3 with the numerics contract's rounding (code = e4m3(p / scale), the
// correctly rounded quotient, scale = p_amax / 448) before P·V; the codes are exact in bf16, so P·V runs on the
// bf16 values of the codes and the scale multiplies O once at the end. Variant NOPP is the bf16 kernel without the
// turn barriers (an ablation: what the ping-pong ordering is worth).
// Variants TMA, TMAX, TMX8 (added after the first device run's profile: the cp.async producer warps issued ~400
// instructions per tile and warp, as many as the two consumers' warps together, and the consumers waited for K):
// one producer thread loads Q, K and V by TMA (3D tensor maps over [rows, heads, d], one box per 128-byte slab,
// completing on the full barriers with expect_tx; no publication lag, so >= 2 stages suffice); TMAX also takes each
// tile's row maxima as trees of depth 4 instead of chains of 16 FMNMX (the same values); TMX8 is TMAX with P8.
// The key tile is the contract's P tile (prefill block_n = 64, docs/numerics.md): the running maximum is updated
// once per 64-key tile at absolute key positions, P is rounded against it, O rescaled in tile order: the
// reference's numbers up to float32 arithmetic (ex2 / fma order / wgmma summation order).
// Causal: queries are the suffix of their key span (query i of len_q sees keys j <= i + len_k - len_q).
// benchmarks/NOTES.md ("WGMMA prefill probe (issue 12): written before the device run") has the floors, the
// design choices and the prediction.
//
// Build (nvcc 13.0): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/prefill_probe \
//                    prefill_wgmma_probe.cu          (or: bash run_prefill_probe.sh)
//
// ---------------------------------------------------------------------------------------------------------
// Synchronization protocol (CTA of 384 threads: consumer warpgroup 0 = warps 0-3 (query rows 0-63 of the
// block), consumer warpgroup 1 = warps 4-7 (rows 64-127), producer warpgroup = warps 8-11; n = the CTA's
// 64-key tiles, the same n for both consumers; tile i in stage i % kStages):
//
// mbarriers (shared memory, initialized by thread 0 before the one __syncthreads of the kernel):
//   fullQ       (count 128: every producer thread once) Q [128 x 192] landed; completes once (parity 0).
//   fullK[s]    (count 128) K of the tile in stage s landed; fill i completes phase i / kStages of fullK[i % kStages],
//   fullV[s]    (count 128) the same for V;     a consumer waits for tile i with parity (i / kStages) & 1.
//               A producer thread arrives only after cp.async.wait_group covering its copies of the tile and
//               fence.proxy.async (the verified order for generic-proxy writes read by wgmma).
//   empty[s]    (count 8: lane 0 of each consumer warp, after the warp's wgmma.wait_group 0 that covers the P·V
//               of the tile, the last wgmma reading the stage). Tile i's release completes phase i / kStages of
//               empty[i % kStages]; the producer fills tile i >= kStages after waiting for the release of tile
//               i - kStages: parity (i / kStages - 1) & 1.
//   TMA variants: fullQ / fullK[s] / fullV[s] have count 1, the producer thread's arrive.expect_tx with the bytes
//   of its boxes, and complete when those bytes land; the producer issues tile i right after the empty wait
//   (same parity), with no lag, and its other 127 threads exit after setmaxnreg.
//   No phase can run ahead of its waiter: full*[s] completes again only after both consumers released the tile
//   it holds (each releases after its full waits), and empty[s] only after the producer refilled the stage.
// The producer publishes a tile one tile late: it issues tile i's copies (cp.async groups K_i, V_i), then waits
//   for all but the last two groups (tile i-1 landed) and publishes tile i-1; tile n-1 after the loop (Q goes in
//   the group before K_0 and is published with tile 0). So tile i-1's publication waits on empty for tile
//   i - kStages: a consumer releases that tile in its turn i - kStages + 1, which needs tile i - kStages + 1
//   published, i.e. i - kStages + 1 <= i - 2: kStages >= 3 (kStages = 2 deadlocks; the emulator shows it).
//
// Named barriers (bar.arrive / bar.sync, 256 threads = 128 of one warpgroup arriving + 128 of the other syncing;
// id 0 is __syncthreads and is not used after the prologue):
//   1 TURN0  WG1 -> WG0  "WG0 may issue its wgmmas": WG1 arrives once before its first turn and after each of its
//                        turns but the last; WG0 syncs before each of its n turns (n generations).
//   2 TURN1  WG0 -> WG1  "WG1 may issue": WG0 arrives after each of its n turns; WG1 syncs before each of its n.
// A turn is: S(j) issued (12 wgmmas, commit) and, from j = 1, P·V(j-1) issued (4 wgmmas, commit). Per
// consumer (|| the other), tile j = 0..n-1:
//   j = 0:  wait fullQ; [WG1: arrive TURN0]; sync TURNw; wait fullK(0); S(0); arrive TURN(1-w) [WG1: if n > 1];
//           wait_group 0; softmax(0) -> P(0) in registers
//   j >= 1: wait fullK(j), fullV(j-1); sync TURNw; S(j); P·V(j-1); arrive TURN(1-w) [WG1: if j < n-1];
//           wait_group 1 (S(j) done); softmax(j); wait_group 0 (P·V(j-1) done); arrive empty(j-1);
//           O *= 2^(m(j-1) - m(j)); P(j) -> A fragments
//   end:    wait fullV(n-1); P·V(n-1); wait_group 0; arrive empty(n-1); write O, LSE
// The turns alternate WG0, WG1, WG0, ... A hardware barrier only counts arrivals, so a side that arrived twice at
// one id before the other synced once would complete a generation alone. It cannot: between two arrivals at
// TURN0, WG1 syncs TURN1, which WG0 arrives at only after its sync on TURN0 (and symmetrically for TURN1).
// Each id gets exactly n generations of 128 + 128 threads, so none is left open at exit.
// All of this is checked by prefill_wgmma_emulation.py over every interleaving of the three programs for 1-8
// tiles and 3-5 stages (no deadlock, no stage overwritten before both consumers released it, no tile read
// before it was published, no named-barrier generation completed by one side alone, none left open);
// broken variants of the protocol (2 stages, no empty wait, early release, WG1's extra arrival, wrong parity)
// are caught.
#include "probe_common.cuh"

#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the driver at run time (no -lcuda)

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

constexpr int kBM = 128, kBN = 64, kDqk = 192, kDv = 128, kStages = 4;
constexpr int kThreads = 384;                           // 2 consumer warpgroups + 1 producer warpgroup
constexpr int kProducerRegs = 80, kConsumerRegs = 208;  // setmaxnreg: 80 + 2 x 208 <= 3 x 168 (56 or 72: the producer spills)
constexpr int kBarTurn0 = 1, kBarTurn1 = 2, kPairThreads = 256;
constexpr int kQWgBytes = 64 * kDqk * 2;                 // one consumer's Q rows: 3 slabs of [64 x 128 B]
constexpr int kKBytes = kBN * kDqk * 2;                  // K tile: 3 slabs of [64 x 128 B]
constexpr int kVBytes = kBN * kDv * 2;                   // V tile: 2 slabs of [64 x 128 B] (row-major: MN-major)
constexpr int kStageBytes = kKBytes + kVBytes;           // 40,960
constexpr int kSmem = 2 * kQWgBytes + kStages * kStageBytes + 16 * 8 + 1024;  // 214,144 B
constexpr float kLn2 = 0.6931471805599453f;

struct PrefillParams {
  const __nv_bfloat16* q;  // [total_q, heads, 192]
  const __nv_bfloat16* k;  // [total_k, heads, 192]
  const __nv_bfloat16* v;  // [total_k, heads, 128]
  __nv_bfloat16* o;        // [total_q, heads, 128]
  float* lse;              // [heads, total_q], natural log; -inf for a row with no visible key
  const int* cu_q;         // [batch + 1]
  const int* cu_k;         // [batch + 1]
  int heads, total_q, causal;
  float scale_log2;        // softmax_scale * log2(e)
  float p_scale, p_rscale; // P8: scale = p_amax / 448 (float32) and its correctly rounded reciprocal
};

// Variant TMA's tensor maps: X [rows, heads, D] bf16 as the 3D tensor (D, heads, rows), box (64, 1, 64) = one slab
// [64 rows x 128 B] with the 128-byte swizzle (the layout of slab_off). Rows past the tensor's end land as zeros;
// rows past a sequence's end inside the tensor are the next sequence's (finite: masked keys get P = 0 exactly).
struct TmaMaps {
  CUtensorMap q, k, v;
};

// m64n128k16 bf16 RS: A (P) from 4 registers, B (V) MN-major from shared memory.
template <int TRANS_B>
__device__ __forceinline__ void wgmma_n128_rs_bf16(float (&d)[64], const uint32_t (&a)[4], uint64_t db,
                                                   int accumulate) {
#ifdef PROBE_SM90A
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, %70;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate), "n"(TRANS_B));
#else
  __trap();
#endif
}

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

// P8: two P values to bf16 values of their E4M3 codes, packed as an RS A register (low half = lo). The code is
// e4m3(p / scale) with the correctly rounded quotient (Markstein: q = p·r, q + fma(-q, scale, p)·r, r the
// correctly rounded 1/scale) and the hardware's round-to-nearest-even, saturating conversion; E4M3 -> f16 is
// exact, f16 -> f32 -> bf16 too (an E4M3 value has 4 significant bits, exponents 2^-9..2^8).
__device__ __forceinline__ uint32_t pack_e4m3_as_bf16(float lo, float hi, float scale, float rscale) {
  const float q_lo0 = lo * rscale, q_hi0 = hi * rscale;
  const float q_lo = fmaf(fmaf(-q_lo0, scale, lo), rscale, q_lo0);
  const float q_hi = fmaf(fmaf(-q_hi0, scale, hi), rscale, q_hi0);
  uint16_t codes;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(codes) : "f"(q_hi), "f"(q_lo));
  uint32_t h2;
  asm("cvt.rn.f16x2.e4m3x2 %0, %1;\n" : "=r"(h2) : "h"(codes));
  const __half2 h = *reinterpret_cast<const __half2*>(&h2);
  return pack_bf16(__low2float(h), __high2float(h));
}

// TMA: the producer thread's expected byte count on a full barrier (its one arrival), and one box (64 features x
// 64 rows of head h from row `row`, feature `col`) into a 1024-aligned slab, completing on `bar`.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void tma_slab(uint8_t* dst, const CUtensorMap* map, int col, int h, int row, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(col), "r"(h), "r"(row), "r"(smem_u32(bar))
      : "memory");
}

// A basic-block boundary that ptxas cannot remove: a branch on a value it cannot know (a row sum, never negative,
// so the trap never runs). ptxas schedules wgmma.wait_group as early as its basic block allows: without this the
// wait for P·V(j-1) sat at the top of the softmax block in the SASS (before the max and every ex2), so the softmax
// of tile j no longer ran under the warpgroup's own P·V(j-1); with it the wait follows the last ex2.
__device__ __forceinline__ void block_boundary(float never_negative) {
  if (never_negative < 0.f) asm volatile("trap;");
}

// Rows of an m64n128 accumulator scaled: the thread's row r by a_lo, its row r + 8 (j % 4 >= 2) by a_hi.
__device__ __forceinline__ void scale_rows64(float (&o)[64], float a_lo, float a_hi) {
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] *= (j & 2) ? a_hi : a_lo;
}

// The producer's copies (128 threads, pt = 0..127). Q: the block's 128 rows (rows at or past len_q zero-filled),
// consumer w's rows 64w..64w+63 in its own 3 slabs. K / V: the tile's 64 keys (keys at or past len_k
// zero-filled, never read). Consecutive threads take consecutive 16-byte chunks of a row.
__device__ __forceinline__ void load_q(uint8_t* sq, const PrefillParams& p, int q_begin, int rows, int h, int pt) {
#pragma unroll 4
  for (int c = 0; c < kBM * 24 / 128; ++c) {
    const int idx = pt + 128 * c, r = idx / 24, ch = idx % 24;
    const bool ok = r < rows;
    const __nv_bfloat16* src = p.q + ((size_t)(q_begin + (ok ? r : 0)) * p.heads + h) * kDqk + ch * 8;
    cp_async16(sq + (r >> 6) * kQWgBytes + slab_off(r & 63, ch * 16, 64), src, ok ? 16u : 0u);
  }
}
__device__ __forceinline__ void load_kv(uint8_t* sk, const PrefillParams& p, int k_begin, int keys, int h, int pt) {
#pragma unroll
  for (int c = 0; c < kBN * 24 / 128; ++c) {
    const int idx = pt + 128 * c, r = idx / 24, ch = idx % 24;
    const bool ok = r < keys;
    const __nv_bfloat16* src = p.k + ((size_t)(k_begin + (ok ? r : 0)) * p.heads + h) * kDqk + ch * 8;
    cp_async16(sk + slab_off(r, ch * 16, 64), src, ok ? 16u : 0u);
  }
  cp_async_commit();
  uint8_t* sv = sk + kKBytes;
#pragma unroll
  for (int c = 0; c < kBN * 16 / 128; ++c) {
    const int idx = pt + 128 * c, r = idx >> 4, ch = idx & 15;
    const bool ok = r < keys;
    const __nv_bfloat16* src = p.v + ((size_t)(k_begin + (ok ? r : 0)) * p.heads + h) * kDv + ch * 8;
    cp_async16(sv + slab_off(r, ch * 16, 64), src, ok ? 16u : 0u);
  }
  cp_async_commit();
}

// The CTA's tile count (the same for both consumers): keys up to the last visible key of the block's last row.
__device__ __forceinline__ int cta_tiles(int q0, int len_q, int len_k, int causal) {
  if (len_k <= 0) return 0;
  if (!causal) return (len_k + kBN - 1) / kBN;
  const int last_key = min(len_k - 1, min(q0 + kBM, len_q) - 1 + (len_k - len_q));
  return last_key < 0 ? 0 : last_key / kBN + 1;
}

// kPingPong false: the ablation without the turn barriers (both consumers issue whenever their data is there).
// kTma: one producer thread loads Q, K, V by TMA (tm) instead of the producer warpgroup's cp.async.
// kTreeMax: the row maxima of a tile as trees of depth 4 instead of two chains of 16 dependent FMNMX (the same
// values: max is exact in any order).
template <bool kP8, bool kPingPong, bool kTma, bool kTreeMax>
__global__ void __launch_bounds__(kThreads, 1) k_prefill(const PrefillParams p, const __grid_constant__ TmaMaps tm) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);
  uint8_t* sstage = sq + 2 * kQWgBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sstage + kStages * kStageBytes);
  uint64_t* full_q = bars;
  uint64_t* full_k = bars + 1;
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty = full_v + kStages;

  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int h = blockIdx.y, b = blockIdx.z;
  const int mb = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  const int q_begin_seq = p.cu_q[b], len_q = p.cu_q[b + 1] - q_begin_seq;
  const int k_begin_seq = p.cu_k[b], len_k = p.cu_k[b + 1] - k_begin_seq;
  const int q0 = mb * kBM;
  if (q0 >= len_q) return;
  const int n = cta_tiles(q0, len_q, len_k, p.causal);
  const int t = tid & 127, wg = warp >> 2, lane = tid & 31;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);  // this thread's rows: row_lo, row_lo + 8 of its warpgroup
  const int qrow_lo = q0 + 64 * wg + row_lo;           // position in the sequence
  if (n == 0) {  // no visible key for any row of the block: output 0, LSE -inf
    if (wg < 2) {
      for (int r = 0; r < 2; ++r) {
        const int qr = qrow_lo + 8 * r;
        if (qr >= len_q) continue;
        __nv_bfloat16* orow = p.o + ((size_t)(q_begin_seq + qr) * p.heads + h) * kDv;
        for (int c = 2 * (t & 3); c < kDv; c += 8) *reinterpret_cast<uint32_t*>(orow + c) = 0u;
        if ((t & 3) == 0) p.lse[(size_t)h * p.total_q + q_begin_seq + qr] = -INFINITY;
      }
    }
    return;
  }
  if (tid == 0) {
    const int producers = kTma ? 1 : 128;
    mbar_init(full_q, producers);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], producers);
      mbar_init(&full_v[s], producers);
      mbar_init(&empty[s], 8);
    }
    if (kTma) asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    if constexpr (kTma) {  // thread 256 alone; tile i is published when its bytes land (no lag: >= 2 stages)
      if (tid != 256) return;
      for (int i = 0; i < n; ++i) {
        const int s = i % kStages;
        if (i >= kStages) mbar_wait(&empty[s], (i / kStages - 1) & 1);
        if (i == 0) {
          mbar_expect_tx(full_q, 2 * kQWgBytes);
#pragma unroll
          for (int c = 0; c < 6; ++c)
            tma_slab(sq + (c / 3) * kQWgBytes + (c % 3) * 8192, &tm.q, 64 * (c % 3), h, q_begin_seq + q0 + 64 * (c / 3),
                     full_q);
        }
        uint8_t* sk = sstage + s * kStageBytes;
        const int row = k_begin_seq + i * kBN;
        mbar_expect_tx(&full_k[s], kKBytes);
#pragma unroll
        for (int c = 0; c < 3; ++c) tma_slab(sk + c * 8192, &tm.k, 64 * c, h, row, &full_k[s]);
        mbar_expect_tx(&full_v[s], kVBytes);
#pragma unroll
        for (int c = 0; c < 2; ++c) tma_slab(sk + kKBytes + c * 8192, &tm.v, 64 * c, h, row, &full_v[s]);
      }
      return;
    }
    const int pt = tid - 256;
    for (int i = 0; i < n; ++i) {
      const int s = i % kStages;
      if (i >= kStages) mbar_wait(&empty[s], (i / kStages - 1) & 1);
      if (i == 0) {
        load_q(sq, p, q_begin_seq + q0, min(kBM, len_q - q0), h, pt);
        cp_async_commit();
      }
      load_kv(sstage + s * kStageBytes, p, k_begin_seq + i * kBN, min(kBN, len_k - i * kBN), h, pt);
      if (i >= 1) {  // tile i-1 (and Q with tile 0) landed: publish it
        asm volatile("cp.async.wait_group 2;\n" ::: "memory");
        fence_proxy_async();
        if (i == 1) mbar_arrive(full_q);
        mbar_arrive(&full_k[(i - 1) % kStages]);
        mbar_arrive(&full_v[(i - 1) % kStages]);
      }
    }
    asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    fence_proxy_async();
    if (n == 1) mbar_arrive(full_q);
    mbar_arrive(&full_k[(n - 1) % kStages]);
    cp_async_wait_all();
    fence_proxy_async();
    mbar_arrive(&full_v[(n - 1) % kStages]);
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

  const uint8_t* sqw = sq + wg * kQWgBytes;
  const int my_turn = wg == 0 ? kBarTurn0 : kBarTurn1, other_turn = wg == 0 ? kBarTurn1 : kBarTurn0;
  const int off = len_k - len_q;              // causal: row qr sees keys <= qr + off
  const int first_row = q0 + 64 * wg;         // the warpgroup's first row: a tile needs a mask past its limit
  float o[64];
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] = 0.f;
  float sc[32];
  uint32_t pa[4][4];                          // P of the previous tile: the RS A fragments of 4 k16 steps
  float m_lo = -INFINITY, m_hi = -INFINITY;   // running maxima, log2 units (scores x scale_log2)
  float l_lo = 0.f, l_hi = 0.f;               // row sums: this thread's 16 of each row's 64 columns per tile

  // Descriptors: built once per operand, each k-step adds its constant byte offset / 16 to the start-address
  // field (bits 0-13; shared addresses stay below 2^18, so the add never carries out of the field). Building each
  // from the address (kmajor_desc) cost ~10 uniform-datapath instructions per wgmma in the SASS.
  const uint64_t dq = kmajor_desc(sqw, 64, 0);
  const uint64_t dk0 = kmajor_desc(sstage, 64, 0), dv0 = mnmajor_desc(sstage + kKBytes, 0, 64 * 128, 1024);
  // S(j) into sc: 12 k16 steps over the 192 features (32 B each inside a slab, 8 KB from slab to slab).
  auto issue_s = [&](int j) {
    const uint64_t dk = dk0 + static_cast<uint64_t>((j % kStages) * (kStageBytes >> 4));
#pragma unroll
    for (int ks = 0; ks < kDqk / 16; ++ks) {
      const uint32_t off = ((ks * 32) >> 7) * 64 * 128 + ((ks * 32) & 127);
      wgmma_n64_ss_bf16(sc, dq + (off >> 4), dk + (off >> 4), ks > 0);
    }
    wg_commit();
  };
  // O += P(j)·V(j): 4 k16 steps over the tile's 64 keys (2 KB each), V MN-major (LBO = the 8 KB between its two
  // 64-column slabs).
  auto issue_pv = [&](int j) {
    const uint64_t dv = dv0 + static_cast<uint64_t>((j % kStages) * (kStageBytes >> 4));
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) wgmma_n128_rs_bf16<1>(o, pa[ks], dv + static_cast<uint64_t>(ks * 16 * 128 / 16), 1);
    wg_commit();
  };
  // Online softmax of S(j) (in sc): mask (diagonal / tail tiles only), running max per 64-key tile, P = 2^(x - m)
  // in sc (float32), row sums; returns the rescale factors of O for this tile.
  auto softmax = [&](int j, float& a_lo, float& a_hi) {
    const int key0 = j * kBN;
    const bool need_mask = key0 + kBN > len_k || (p.causal && key0 + kBN - 1 > first_row + off);
    if (need_mask) {
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        const int key = key0 + 8 * (e >> 2) + 2 * (t & 3) + (e & 1);
        const int qr = qrow_lo + 8 * ((e >> 1) & 1);
        if (key >= len_k || (p.causal && key > qr + off)) sc[e] = -INFINITY;
      }
    }
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
    if constexpr (kTreeMax) {  // 4 chains of 4 per row, then 2 levels (a full tree of 16 spills: 16 more live values)
      float lo[4], hi[4];  // element e = 4q + 2r + b is row r's value 2q + b
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        lo[c] = fmaxf(fmaxf(sc[8 * c], sc[8 * c + 1]), fmaxf(sc[8 * c + 4], sc[8 * c + 5]));
        hi[c] = fmaxf(fmaxf(sc[8 * c + 2], sc[8 * c + 3]), fmaxf(sc[8 * c + 6], sc[8 * c + 7]));
      }
      mx_lo = fmaxf(fmaxf(lo[0], lo[1]), fmaxf(lo[2], lo[3]));
      mx_hi = fmaxf(fmaxf(hi[0], hi[1]), fmaxf(hi[2], hi[3]));
    } else {
#pragma unroll
      for (int e = 0; e < 32; ++e) {
        if (e & 2) mx_hi = fmaxf(mx_hi, sc[e]); else mx_lo = fmaxf(mx_lo, sc[e]);
      }
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, d));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, d));
    }
    // max commutes with the (positive) scale, so the running max of scaled scores is max(m, rowmax·scale)
    const float mn_lo = fmaxf(m_lo, mx_lo * p.scale_log2), mn_hi = fmaxf(m_hi, mx_hi * p.scale_log2);
    const float mu_lo = mn_lo == -INFINITY ? 0.f : mn_lo, mu_hi = mn_hi == -INFINITY ? 0.f : mn_hi;
    a_lo = ex2(m_lo - mu_lo);
    a_hi = ex2(m_hi - mu_hi);
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int e = 0; e < 32; ++e) {
      const float x = ex2(fmaf(sc[e], p.scale_log2, -((e & 2) ? mu_hi : mu_lo)));
      sc[e] = x;
      if (e & 2) sum_hi += x; else sum_lo += x;
    }
    l_lo = l_lo * a_lo + sum_lo;
    l_hi = l_hi * a_hi + sum_hi;
    m_lo = mn_lo;
    m_hi = mn_hi;
  };
  auto pack_p = [&]() {
#pragma unroll
    for (int ks = 0; ks < 4; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        if constexpr (kP8)
          pa[ks][i] = pack_e4m3_as_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1], p.p_scale, p.p_rscale);
        else
          pa[ks][i] = pack_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
      }
  };
  auto release = [&](int j) {
    __syncwarp();
    if (lane == 0) mbar_arrive(&empty[j % kStages]);
  };

  // Tile 0: S alone in the first turn.
  mbar_wait(full_q, 0);
  if (kPingPong && wg == 1) nb_arrive<kPairThreads>(kBarTurn0);
  mbar_wait(&full_k[0], 0);
  if (kPingPong) nb_sync<kPairThreads>(my_turn);
  wg_fence();
  issue_s(0);
  if (kPingPong && (wg == 0 || n > 1)) nb_arrive<kPairThreads>(other_turn);
  wg_wait<0>();
  reg_fence(sc);
  {
    float a_lo, a_hi;
    softmax(0, a_lo, a_hi);  // O is 0: no rescale
  }
  pack_p();

  for (int j = 1; j < n; ++j) {
    const int s = j % kStages, sp = (j - 1) % kStages;
    mbar_wait(&full_k[s], (j / kStages) & 1);
    mbar_wait(&full_v[sp], ((j - 1) / kStages) & 1);
    if (kPingPong) nb_sync<kPairThreads>(my_turn);
    wg_fence();
    issue_s(j);
    issue_pv(j - 1);
    if (kPingPong && (wg == 0 || j < n - 1)) nb_arrive<kPairThreads>(other_turn);
    wg_wait<1>();  // S(j) done; P·V(j-1) may still run
    reg_fence(sc);
    float a_lo, a_hi;
    softmax(j, a_lo, a_hi);
    block_boundary(l_lo);
    wg_wait<0>();  // P·V(j-1) done: stage j-1 is free, O and the A fragments may be written
    reg_fence(o);
    release(j - 1);
    // x·1 = x: a warp whose 16 rows all keep their maximum skips the multiply (no bit changes)
    if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) scale_rows64(o, a_lo, a_hi);
    pack_p();
  }
  mbar_wait(&full_v[(n - 1) % kStages], ((n - 1) / kStages) & 1);
  wg_fence();
  issue_pv(n - 1);
  wg_wait<0>();
  reg_fence(o);
  release(n - 1);

  // Row sums over the quad (the 4 threads of a row), normalization, LSE (natural log).
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
  }
  const float out_scale = kP8 ? p.p_scale : 1.f;
  const float inv_lo = l_lo > 0.f ? out_scale * rcp_approx(l_lo) : 0.f;
  const float inv_hi = l_hi > 0.f ? out_scale * rcp_approx(l_hi) : 0.f;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qr = qrow_lo + 8 * r;
    if (qr >= len_q) continue;
    const float inv = r ? inv_hi : inv_lo;
    __nv_bfloat16* orow = p.o + ((size_t)(q_begin_seq + qr) * p.heads + h) * kDv;
#pragma unroll
    for (int j = 2 * r; j < 64; j += 4) {  // j, j+1: columns 8(j/4) + 2(t%4) + {0, 1} of row r
      const int col = 8 * (j >> 2) + 2 * (t & 3);
      *reinterpret_cast<uint32_t*>(orow + col) = pack_bf16(o[j] * inv, o[j + 1] * inv);
    }
    if ((t & 3) == 0) {
      const float l = r ? l_hi : l_lo, m = r ? m_hi : m_lo;
      p.lse[(size_t)h * p.total_q + q_begin_seq + qr] = l > 0.f ? (m + lg2_approx(l)) * kLn2 : -INFINITY;
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// Host side

__global__ void k_fill_uniform(__nv_bfloat16* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint32_t hv = hash32(static_cast<uint32_t>(i) * 2654435761u ^ hash32(seed + static_cast<uint32_t>(i >> 32)));
    x[i] = __float2bfloat16((hv >> 8) * (2.f / 16777216.f) - 1.f);
  }
}

struct Variant {
  const char* tag;
  const char* name;
  void (*kernel)(PrefillParams, TmaMaps);
  bool p8;
};
constexpr int kNumVariants = 6;
static const Variant kVariants[kNumVariants] = {
    {"BF16", "bf16 P", k_prefill<false, true, false, false>, false},
    {"P8", "P quantized to FP8 E4M3 in the kernel", k_prefill<true, true, false, false>, true},
    {"NOPP", "bf16 P without the ping-pong turns (ablation)", k_prefill<false, false, false, false>, false},
    {"TMA", "bf16 P, Q / K / V by TMA from one producer thread", k_prefill<false, true, true, false>, false},
    {"TMAX", "TMA with the row maxima as trees", k_prefill<false, true, true, true>, false},
    {"TMX8", "TMAX with P quantized to FP8 E4M3", k_prefill<true, true, true, true>, true}};

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
static EncodeTiledFn g_encode = nullptr;  // cuTensorMapEncodeTiled from the driver (main)

// X [rows, heads, d] bf16 as (d, heads, rows), box (64, 1, 64), 128-byte swizzle (TmaMaps).
static CUtensorMap slab_map(const __nv_bfloat16* x, int rows, int heads, int d) {
  CUtensorMap m;
  std::memset(&m, 0, sizeof(m));
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(d), static_cast<cuuint64_t>(heads),
                              static_cast<cuuint64_t>(std::max(rows, 1))};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(d) * 2, static_cast<cuuint64_t>(heads) * d * 2};
  const cuuint32_t box[3] = {64, 1, 64}, estr[3] = {1, 1, 1};
  const CUresult r = g_encode(&m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(x), dims, strides,
                              box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    std::printf("cuTensorMapEncodeTiled failed: %d\n", static_cast<int>(r));
    std::exit(2);
  }
  return m;
}
static TmaMaps make_maps(const PrefillParams& p, int total_k) {
  return TmaMaps{slab_map(p.q, p.total_q, p.heads, kDqk), slab_map(p.k, total_k, p.heads, kDqk),
                 slab_map(p.v, total_k, p.heads, kDv)};
}

static void launch(const Variant& v, const PrefillParams& p, const TmaMaps& maps, int batch, int max_len_q) {
  const dim3 grid((max_len_q + kBM - 1) / kBM, p.heads, batch);
  v.kernel<<<grid, kThreads, kSmem>>>(p, maps);
}

// E4M3 (fn) round to nearest even, saturating at 448, of a non-negative double.
static double round_e4m3(double x) {
  if (x >= 448.0) return 448.0;
  if (x <= 0.0) return 0.0;
  const int e = std::max(static_cast<int>(std::floor(std::log2(x))), -6);
  const double quantum = std::ldexp(1.0, e - 3);
  const double r = std::nearbyint(x / quantum) * quantum;  // default rounding mode: nearest even
  return std::min(r, 448.0);
}
static double round_bf16(double x) { return __bfloat162float(__float2bfloat16(static_cast<float>(x))); }

// The contract in float64 (docs/numerics.md; backends/reference prefill): P tiles of 64 keys from the sequence's
// first key, the running maximum updated per tile, P = exp(s - m_t) rounded to bf16 (or FP8 with scale
// p_scale), the row sum of the unrounded P, O = Σ_t e^(m_t - m_last) P_t·V_t / l, LSE = m_last + ln l.
static void reference_row(const float* q, const std::vector<float>& k, const std::vector<float>& v, int heads, int h,
                          int k_begin, int len_k, int visible, double scale, bool p8, double p_scale, double* out,
                          double* lse) {
  std::vector<double> s(visible);
  for (int j = 0; j < visible; ++j) {
    const float* kr = &k[((size_t)(k_begin + j) * heads + h) * kDqk];
    double acc = 0.0;
    for (int d = 0; d < kDqk; ++d) acc += static_cast<double>(q[d]) * kr[d];
    s[j] = acc * scale;
  }
  double m = -INFINITY, l = 0.0;
  std::vector<double> acc(kDv, 0.0);
  for (int t0 = 0; t0 < visible; t0 += kBN) {
    const int t1 = std::min(visible, t0 + kBN);
    double mt = m;
    for (int j = t0; j < t1; ++j) mt = std::max(mt, s[j]);
    const double a = m == -INFINITY ? 0.0 : std::exp(m - mt);
    l *= a;
    for (double& x : acc) x *= a;
    for (int j = t0; j < t1; ++j) {
      const double pv = std::exp(s[j] - mt);
      l += pv;
      const double pq = p8 ? round_e4m3(pv / p_scale) * p_scale : round_bf16(pv);
      const float* vr = &v[((size_t)(k_begin + j) * heads + h) * kDv];
      for (int c = 0; c < kDv; ++c) acc[c] += pq * vr[c];
    }
    m = mt;
  }
  for (int c = 0; c < kDv; ++c) out[c] = l > 0 ? acc[c] / l : 0.0;
  *lse = l > 0 ? m + std::log(l) : -INFINITY;
}

static int g_fail[kNumVariants] = {};

// One correctness case: sequences (len_q, len_k), uniform [-1, 1] bf16 inputs, outputs poisoned with NaN; each
// variant against the float64 contract of its own P rounding (and, for P8, the distance to the bf16 contract).
static void check_case(const char* name, int heads, bool causal, float scale, const std::vector<std::pair<int, int>>& seqs,
                       std::mt19937& rng) {
  const int batch = static_cast<int>(seqs.size());
  std::vector<int> cu_q(batch + 1, 0), cu_k(batch + 1, 0);
  int max_q = 0;
  for (int b = 0; b < batch; ++b) {
    cu_q[b + 1] = cu_q[b] + seqs[b].first;
    cu_k[b + 1] = cu_k[b] + seqs[b].second;
    max_q = std::max(max_q, seqs[b].first);
  }
  const int total_q = cu_q[batch], total_k = cu_k[batch];
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  auto fill = [&](size_t count) {
    std::vector<float> x(count);
    for (float& e : x) e = __bfloat162float(__float2bfloat16(uni(rng)));
    return x;
  };
  const std::vector<float> q = fill((size_t)total_q * heads * kDqk), k = fill((size_t)total_k * heads * kDqk),
                           v = fill((size_t)total_k * heads * kDv);
  auto to_bf16 = [](const std::vector<float>& x) {
    std::vector<__nv_bfloat16> y(x.size());
    for (size_t i = 0; i < x.size(); ++i) y[i] = __float2bfloat16(x[i]);
    return y;
  };
  const double p_scale = static_cast<double>(1.0f / 448.0f);  // p_amax 1.0 (the bound of P), as float32

  // references: [variant][row][c]
  std::vector<double> ref[2], ref_lse[2];
  for (int pv = 0; pv < 2; ++pv) {
    ref[pv].assign((size_t)total_q * heads * kDv, 0.0);
    ref_lse[pv].assign((size_t)total_q * heads, 0.0);
  }
  for (int b = 0; b < batch; ++b) {
    const int len_q = seqs[b].first, len_k = seqs[b].second;
    for (int i = 0; i < len_q; ++i)
      for (int h = 0; h < heads; ++h) {
        const int visible = causal ? std::max(0, std::min(len_k, i + len_k - len_q + 1)) : len_k;
        const size_t row = (size_t)(cu_q[b] + i) * heads + h;
        for (int pv = 0; pv < 2; ++pv)
          reference_row(&q[row * kDqk], k, v, heads, h, cu_k[b], len_k, visible, scale, pv == 1, p_scale,
                        &ref[pv][row * kDv], &ref_lse[pv][row]);
      }
  }

  PrefillParams p{};
  p.q = to_device(to_bf16(q));
  p.k = to_device(to_bf16(k));
  p.v = to_device(to_bf16(v));
  p.cu_q = to_device(cu_q);
  p.cu_k = to_device(cu_k);
  p.heads = heads;
  p.total_q = total_q;
  p.causal = causal;
  p.scale_log2 = scale * 1.4426950408889634f;
  p.p_scale = 1.0f / 448.0f;
  p.p_rscale = 1.0f / p.p_scale;
  const size_t n_out = (size_t)total_q * heads * kDv, n_lse = (size_t)total_q * heads;
  CK(cudaMalloc(&p.o, std::max<size_t>(n_out, 1) * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&p.lse, std::max<size_t>(n_lse, 1) * sizeof(float)));
  const TmaMaps maps = make_maps(p, total_k);
  for (int vi = 0; vi < kNumVariants; ++vi) {
    const Variant& var = kVariants[vi];
    CK(cudaMemset(p.o, 0xff, n_out * sizeof(__nv_bfloat16)));  // NaN
    CK(cudaMemset(p.lse, 0xff, n_lse * sizeof(float)));
    launch(var, p, maps, batch, max_q);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    const std::vector<__nv_bfloat16> out = from_device(p.o, n_out);
    const std::vector<float> lse = from_device(p.lse, n_lse);
    const int own = var.p8 ? 1 : 0;
    double num = 0, den = 0, num_other = 0, lse_err = 0, max_abs = 0;
    int nonfinite = 0, bad_empty = 0;
    for (int b = 0; b < batch; ++b)
      for (int i = 0; i < seqs[b].first; ++i)
        for (int h = 0; h < heads; ++h) {
          const size_t row = (size_t)(cu_q[b] + i) * heads + h;
          const float lse_k = lse[(size_t)h * total_q + cu_q[b] + i];
          if (ref_lse[own][row] == -INFINITY) {  // no visible key: exactly 0 and -inf
            bool ok = lse_k == -INFINITY;
            for (int c = 0; c < kDv; ++c) ok = ok && __bfloat162float(out[row * kDv + c]) == 0.f;
            bad_empty += !ok;
            continue;
          }
          for (int c = 0; c < kDv; ++c) {
            const double x = __bfloat162float(out[row * kDv + c]), r = ref[own][row * kDv + c];
            if (!std::isfinite(x)) ++nonfinite;
            num += (x - r) * (x - r);
            den += r * r;
            const double r2 = ref[1 - own][row * kDv + c];
            num_other += (x - r2) * (x - r2);
            max_abs = std::max(max_abs, std::fabs(x - r));
          }
          if (!std::isfinite(lse_k)) ++nonfinite;
          lse_err = std::max(lse_err, std::fabs(lse_k - ref_lse[own][row]));
        }
    const double rel = den > 0 ? std::sqrt(num / den) : 0.0, rel_other = den > 0 ? std::sqrt(num_other / den) : 0.0;
    const bool pass = nonfinite == 0 && bad_empty == 0 && rel < 1e-2 && lse_err < 1e-3;
    g_fail[vi] += !pass;
    std::printf("%-4s %-58s %s  rel L2 %.3e (vs the other P rounding's contract %.3e)  max abs %.3e  LSE max abs "
                "err %.3e  non-finite %d  bad empty rows %d\n", var.tag, name, pass ? "PASS" : "FAIL", rel, rel_other,
                max_abs, lse_err, nonfinite, bad_empty);
  }
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.q)));
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.k)));
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.v)));
  CK(cudaFree(const_cast<int*>(p.cu_q)));
  CK(cudaFree(const_cast<int*>(p.cu_k)));
  CK(cudaFree(p.o));
  CK(cudaFree(p.lse));
}

struct BenchBuffers {
  __nv_bfloat16 *q, *k, *v, *o;
  float* lse;
  void* flush;
  size_t flush_bytes;
};

// Causal timing at batch x L, 128 heads: median of 20 launches (after 3 warm-up), L2 flushed by a 256 MB memset
// before each; FLOPs 2 * (192 + 128) per visible (query, key) pair per head (benchmarks/bench_prefill.py).
static void bench(const Variant& var, const BenchBuffers& buf, int batch, int L, double cudnn_us) {
  const int heads = 128;
  std::vector<int> cu(batch + 1);
  for (int b = 0; b <= batch; ++b) cu[b] = b * L;
  PrefillParams p{};
  p.q = buf.q;
  p.k = buf.k;
  p.v = buf.v;
  p.o = buf.o;
  p.lse = buf.lse;
  p.cu_q = to_device(cu);
  p.cu_k = p.cu_q;
  p.heads = heads;
  p.total_q = batch * L;
  p.causal = 1;
  p.scale_log2 = static_cast<float>(1.0 / std::sqrt(192.0) * 1.4426950408889634);
  p.p_scale = 1.0f / 448.0f;
  p.p_rscale = 1.0f / p.p_scale;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const TmaMaps maps = make_maps(p, batch * L);
  std::vector<float> us;
  for (int it = 0; it < 23; ++it) {
    CK(cudaMemsetAsync(buf.flush, it & 0xff, buf.flush_bytes));
    CK(cudaEventRecord(e0));
    launch(var, p, maps, batch, L);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    CK(cudaGetLastError());
    float ms = 0.f;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 3) us.push_back(ms * 1e3f);
  }
  std::sort(us.begin(), us.end());
  const double med = us[us.size() / 2];
  const double pairs = static_cast<double>(batch) * L * (L + 1.0) / 2.0;
  const double flops = 2.0 * (kDqk + kDv) * pairs * heads;
  const double floor_us = flops / 840e12 * 1e6;
  std::printf("%-4s causal %dx%d H128: %9.1f us (min %9.1f, max %9.1f)  %6.1f TFLOP/s  %.3f x cuDNN bf16 "
              "(%.0f us)  floor at 840 TFLOP/s %.0f us (%.0f %% of it)\n", var.tag, batch, L, med, us.front(),
              us.back(), flops / (med * 1e-6) / 1e12, med / cudnn_us, cudnn_us, floor_us, 100.0 * floor_us / med);
  CK(cudaFree(const_cast<int*>(p.cu_q)));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out at once: a later hang or trap keeps what came before
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, cc %d.%d, %d SMs, smem/block optin %zu B; smem per CTA %d B, %d threads, %d stages\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.sharedMemPerBlockOptin, kSmem,
              kThreads, kStages);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("FAIL: needs compute capability 9.0 (sm_90a)\n");
    return 2;
  }
  void* enc = nullptr;
  cudaDriverEntryPointQueryResult qres;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &enc, 12000, cudaEnableDefault, &qres));
  if (qres != cudaDriverEntryPointSuccess || !enc) {
    std::printf("FAIL: cuTensorMapEncodeTiled not found\n");
    return 2;
  }
  g_encode = reinterpret_cast<EncodeTiledFn>(enc);
  for (const Variant& v : kVariants)
    CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem));

  std::mt19937 rng(2026);
  const float sc = static_cast<float>(1.0 / std::sqrt(192.0));
  const std::vector<std::pair<int, int>> ragged = {{1, 1}, {63, 63}, {64, 64}, {65, 65}, {127, 127},
                                                   {128, 128}, {129, 129}, {1000, 1000}};
  std::printf("correctness vs a float64 reference of the contract (bf16 output: rel L2 < 1e-2, LSE abs < 1e-3), "
              "4 heads, outputs NaN-poisoned\n");
  check_case("non-causal, L {1,63,64,65,127,128,129,1000}", 4, false, sc, ragged, rng);
  check_case("causal, L {1,63,64,65,127,128,129,1000}", 4, true, sc, ragged, rng);
  check_case("causal suffix, (q,k) {(1,1000),(63,64),(65,129),(128,1000),(129,300)}", 4, true, sc,
             {{1, 1000}, {63, 64}, {65, 129}, {128, 1000}, {129, 300}}, rng);
  check_case("non-causal (q,k) {(5,0),(65,1),(200,129)}: empty rows", 4, false, sc, {{5, 0}, {65, 1}, {200, 129}}, rng);
  check_case("causal, scale 1.0 (sharp maxima), L {129,1000,64}", 4, true, 1.0f, {{129, 129}, {1000, 1000}, {64, 64}},
             rng);
  check_case("causal, 128 heads, L {300,1}", 128, true, sc, {{300, 300}, {1, 1}}, rng);
  for (int vi = 0; vi < kNumVariants; ++vi)
    if (g_fail[vi]) std::printf("variant %s: %d correctness case(s) failed; its timing skipped\n", kVariants[vi].tag,
                                g_fail[vi]);

  BenchBuffers buf{};
  const size_t tokens = 16384, heads = 128;
  CK(cudaMalloc(&buf.q, tokens * heads * kDqk * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.k, tokens * heads * kDqk * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.v, tokens * heads * kDv * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.o, tokens * heads * kDv * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.lse, tokens * heads * sizeof(float)));
  buf.flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&buf.flush, buf.flush_bytes));
  k_fill_uniform<<<1024, 256>>>(buf.q, tokens * heads * kDqk, 1u);
  k_fill_uniform<<<1024, 256>>>(buf.k, tokens * heads * kDqk, 2u);
  k_fill_uniform<<<1024, 256>>>(buf.v, tokens * heads * kDv, 3u);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  std::printf("timing: median of 20 (after 3 warm-up), L2 flushed by a 256 MB memset before each; cuDNN SDPA bf16 "
              "figures from issue 12 (same card)\n");
  for (int vi = 0; vi < kNumVariants; ++vi) {
    if (g_fail[vi]) continue;
    bench(kVariants[vi], buf, 4, 4096, 5043.0);
    bench(kVariants[vi], buf, 1, 16384, 18755.0);
  }
  CK(cudaFree(buf.q));
  CK(cudaFree(buf.k));
  CK(cudaFree(buf.v));
  CK(cudaFree(buf.o));
  CK(cudaFree(buf.lse));
  CK(cudaFree(buf.flush));
  bool ok = true;
  std::string fails;
  for (int vi = 0; vi < kNumVariants; ++vi) {
    ok = ok && g_fail[vi] == 0;
    fails += std::string(vi ? ", " : "") + kVariants[vi].tag + " " + std::to_string(g_fail[vi]);
  }
  std::printf("\n%s: %s correctness case(s) failed\n", ok ? "ALL PASS" : "FAIL", fails.c_str());
  return ok ? 0 : 1;
}
