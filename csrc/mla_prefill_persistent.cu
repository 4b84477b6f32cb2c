// mla_prefill_persistent.cu: the persistent variant of the bf16-wgmma prefill (mla_prefill_wgmma.cu's
// prefill_kernel<0>: P rounded to bf16, Q as it is; the cuda backend's config {"persistent": True}).
// One CTA per SM takes work items (query block, head, sequence) in prefill_kernel's order (a sequence's heads in turn,
// each head's blocks longest first; blocks past a sequence's queries are not items) from a global counter (the
// caller's work_counter, zeroed for each call) until none is left.
// Each item computes exactly what prefill_kernel's CTA for it computes (the same products, softmax and stores in
// the same order), so outputs and LSE are bit-equal; what changes is when: item k's Q lands in Q slot k % 2 while
// item k - 1 runs, warpgroup 0 starts item k's S(0) while warpgroup 1 finishes item k - 1 (its last softmax,
// P·V and stores), and the K / V ring (3 stages: 2 Q slots of 48 KB beside them) runs on across items.
//   - producer warp 8: claims an item (lane 0's atomicAdd, the other lanes follow the same cursor over the
//     sequences), waits for its Q slot (emptyQ), writes the item into the slot's info words and arrives on fullQ
//     (with Q's TMA and its bytes when the item has a visible key), issues the item's tiles into the ring, and for a
//     last tile with keys past the sequence's end zeroes those V rows and arrives on that stage's tailV;
//   - consumers: wait fullQ[k % 2], read the item, run prefill_kernel's tile protocol with the ring's stage and
//     parity carried over from the previous item, release emptyQ after the item's last P·V, store. An item without
//     a visible key: its rows stored as 0 / -inf, emptyQ released, no turn. n = -1: no more items.
// Synchronization: fullQ[2] (count 1), emptyQ[2] (count 8: each consumer warp), fullK / fullV / empty[3] as in
// prefill_kernel; tailV[3] (count 32, one per stage: a stage's next tail phase needs the stage refilled, so at most
// one is pending; each consumer keeps one parity bit per stage). Turns run on across items: WG1 arrives at TURN0
// once before its first item and after every turn (the last of an item too: WG0's next S(0) waits only for WG1's
// last turn, not its drain); WG0 syncs TURN0 once more after the last item.

#include "hopper.cuh"
#include "mla_prefill.h"
#include "mla_prefill_common.cuh"
#include "mla_prefill_wgmma.cuh"

#include <algorithm>
#include <cmath>
#include <cstdint>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "mla_prefill_persistent.cu is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

// The persistent kernel: 2 Q slots (one item ahead) and a 3-stage ring; per slot the item's words (Item).
constexpr int kQSlots = 2, kPStages = 3, kQSlotBytes = 2 * kQWgBytes;
enum Item { kItemH, kItemQBegin, kItemLenQ, kItemLenK, kItemQ0, kItemN, kItemWords };  // n -1: none left
constexpr int kPBars = 2 * kQSlots + 4 * kPStages;  // fullQ[2], emptyQ[2], fullK[3], fullV[3], empty[3], tailV[3]
constexpr int kPSmemBytes =
    kQSlots * kQSlotBytes + kPStages * kStageBytes + kPBars * 8 + kQSlots * kItemWords * 4 + 1024;  // + alignment
static_assert(kPSmemBytes <= 232448, "shared memory per CTA of the persistent kernel");

// The high word of every descriptor here (make_desc's SBO 1024 and the 128-byte swizzle, K- and MN-major alike): the
// products below add their offsets to the low words only (32-bit uniform adds; the start address never carries out
// of its field), which keeps the loop's 16 descriptors off 64-bit add pairs.
constexpr uint32_t kDescHi = (1u << 30) | (1024u >> 4);
__device__ __forceinline__ uint64_t desc_at(uint32_t lo) { return (static_cast<uint64_t>(kDescHi) << 32) | lo; }

// S = Q·Kᵀ into sc: 12 k16 steps over the 192 features (32 B each inside a slab, one slab per 128 B); q_lo: the low
// word of the warpgroup's Q rows' descriptor, k_lo: the stage's K tile's.
__device__ __forceinline__ void s_product(float (&sc)[32], uint32_t q_lo, uint32_t k_lo) {
#pragma unroll
  for (int ks = 0; ks < kDqk / 16; ++ks) {
    const uint32_t byte = ((ks * 32) >> 7) * kSlab + ((ks * 32) & 127);
    wgmma_s(sc, desc_at(q_lo + (byte >> 4)), desc_at(k_lo + (byte >> 4)), ks > 0);
  }
  wg_commit();
}
// O += P·V: 4 k16 steps over the tile's 64 keys (16 rows of 128 B each); v_lo: the low word of the stage's V tile's
// descriptor.
__device__ __forceinline__ void pv_product(float (&o)[64], const uint32_t (&pa)[4][4], uint32_t v_lo) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_pv_rs(o, pa[ks], desc_at(v_lo + ks * 16 * 128 / 16));
  wg_commit();
}
// P (float32, S's accumulator) rounded to bf16 into the A fragments: pa[ks][i] = sc[8 ks + 2 i], sc[8 ks + 2 i + 1].
__device__ __forceinline__ void pack_bf16(const float (&sc)[32], uint32_t (&pa)[4][4]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[ks][i] = bf16x2_bits(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
}

// The kernel (schedule and synchronization: the top of this file); blocks: prefill_kernel's query blocks a head.
__global__ void __launch_bounds__(kThreads, 1)
    prefill_persistent_kernel(const PrefillParams p, const __grid_constant__ TmaMaps tm, int blocks) {
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);  // Q slot i: sq + i * kQSlotBytes (warpgroup w's rows kQWgBytes in)
  uint8_t* sstage = sq + kQSlots * kQSlotBytes;
  uint64_t* bars = reinterpret_cast<uint64_t*>(sstage + kPStages * kStageBytes);
  uint64_t* full_q = bars;
  uint64_t* empty_q = bars + kQSlots;
  uint64_t* full_k = bars + 2 * kQSlots;
  uint64_t* full_v = full_k + kPStages;
  uint64_t* empty = full_v + kPStages;
  uint64_t* tail_v = empty + kPStages;
  int* info = reinterpret_cast<int*>(tail_v + kPStages);  // per slot: kItemWords words (Item)

  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0), lane = tid & 31;
  if (tid == 0) {
    for (int i = 0; i < kQSlots; ++i) {
      mbar_init(&full_q[i], 1);
      mbar_init(&empty_q[i], 8);
    }
    for (int s = 0; s < kPStages; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty[s], 8);
      mbar_init(&tail_v[s], 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: warp 8 alone stays; its lanes keep the same state, lane 0 issues
    setmaxnreg_dec<kProducerRegs>();
    if (warp != 8) return;
    int b = -1, nb = 0, q_begin_seq = 0, len_q = 0, k_begin_seq = 0, len_k = 0;
    int64_t base = 0, span = 0;  // sequence b's first item and its item count (nb blocks x heads)
    int s = 0;                   // the stage of the next tile
    uint32_t ph = 0;             // its round's parity
    bool first_round = true;     // no tile issued into stage s yet
    for (int k = 0;; ++k) {
      const int slot = k & 1;
      if (k >= kQSlots) mbar_wait(&empty_q[slot], ((k >> 1) - 1) & 1);
      unsigned long long w = 0;
      if (lane == 0) w = atomicAdd(p.work_counter, 1ull);
      w = __shfl_sync(0xffffffffu, w, 0);
      while (b < p.batch && static_cast<int64_t>(w) >= base + span) {  // the cursor: item w's sequence
        base += span;
        span = 0;
        if (++b < p.batch) {
          prefill::seq_range(p.cu_q, b, p.total_q, q_begin_seq, len_q);
          prefill::seq_range(p.cu_k, b, p.total_k, k_begin_seq, len_k);
          nb = min((len_q + kBM - 1) / kBM, blocks);  // prefill_kernel's grid holds `blocks` blocks a head
          span = static_cast<int64_t>(nb) * p.heads;
        }
      }
      int* item = info + kItemWords * slot;
      if (b >= p.batch) {  // no items left: the consumers stop
        if (lane == 0) {
          item[kItemN] = -1;
          mbar_arrive(&full_q[slot]);
        }
        return;
      }
      const int64_t r = static_cast<int64_t>(w) - base;
      const int h = static_cast<int>(r / nb), q0 = (nb - 1 - static_cast<int>(r % nb)) * kBM;
      const int hk = h / (p.heads / p.kv_heads);
      const int n = prefill::cta_tiles(q0, len_q, len_k, p.causal);
      uint8_t* sqs = sq + slot * kQSlotBytes;
      if (lane == 0) {
        item[kItemH] = h, item[kItemQBegin] = q_begin_seq, item[kItemLenQ] = len_q;
        item[kItemLenK] = len_k, item[kItemQ0] = q0, item[kItemN] = n;
        if (n > 0) {
          mbar_arrive_expect_tx(&full_q[slot], 2 * kQWgBytes);
#pragma unroll
          for (int c = 0; c < 6; ++c)
            tma_slab(sqs + (c / 3) * kQWgBytes + (c % 3) * kSlab, &tm.q, 64 * (c % 3), h,
                     q_begin_seq + q0 + 64 * (c / 3), &full_q[slot]);
        } else {
          mbar_arrive(&full_q[slot]);
        }
      }
      int s_last = 0;
      uint32_t ph_last = 0;
      for (int i = 0; i < n; ++i) {
        if (!first_round) mbar_wait(&empty[s], ph ^ 1u);
        if (lane == 0) {
          uint8_t* sk = sstage + s * kStageBytes;
          const int row = k_begin_seq + i * kBN;
          mbar_arrive_expect_tx(&full_k[s], kKBytes);
#pragma unroll
          for (int c = 0; c < 3; ++c) tma_slab(sk + c * kSlab, &tm.k, 64 * c, hk, row, &full_k[s]);
          mbar_arrive_expect_tx(&full_v[s], kVBytes);
#pragma unroll
          for (int c = 0; c < 2; ++c) tma_slab(sk + kKBytes + c * kSlab, &tm.v, 64 * c, hk, row, &full_v[s]);
        }
        s_last = s, ph_last = ph;
        if (++s == kPStages) {
          s = 0;
          ph ^= 1u;
          first_round = false;
        }
      }
      __syncwarp();
      const int tail_keys = len_k - (n - 1) * kBN;
      if (n > 0 && tail_keys < kBN) {  // the last tile's V rows past the sequence's end: zeros before it is read
        mbar_wait(&full_v[s_last], ph_last);
        uint8_t* sv = sstage + s_last * kStageBytes + kKBytes;
        for (int idx = lane; idx < (kBN - tail_keys) * 16; idx += 32) {  // 16 chunks of 16 B per row: 8 per slab
          const int rr = tail_keys + (idx >> 4), c = idx & 15;
          *reinterpret_cast<uint4*>(sv + (c >> 3) * kSlab + rr * 128 + (c & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
        fence_proxy_async();
        mbar_arrive(&tail_v[s_last]);
      }
    }
  }
  setmaxnreg_inc<kConsumerRegs>();

  const int t = tid & 127, wg = warp >> 2;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);
  const int my_turn = wg == 0 ? kBarTurn0 : kBarTurn1, other_turn = wg == 0 ? kBarTurn1 : kBarTurn0;
  const uint32_t dk0 = static_cast<uint32_t>(kmajor_desc(sstage));  // the low words: desc_at adds the high one
  const uint32_t dv0 = static_cast<uint32_t>(mnmajor_desc(sstage + kKBytes));
  auto stage_off = [](int s) { return static_cast<uint32_t>(s * (kStageBytes >> 4)); };
  auto release = [&](uint64_t* bar) {
    __syncwarp();
    if (lane == 0) mbar_arrive(bar);
  };
  int s = 0;              // the stage of the item's first tile
  uint32_t ph = 0;        // its round's parity
  uint32_t tail_par = 0;  // bit s: the parity of stage s's next tailV phase
  float o[64];
  float sc[32];
  uint32_t pa[4][4];
  if (wg == 1) nb_arrive<kPairThreads>(kBarTurn0);
  for (int k = 0;; ++k) {
    const int slot = k & 1;
    mbar_wait(&full_q[slot], (k >> 1) & 1);
    const int* item = info + kItemWords * slot;
    // n broadcast: read from shared memory it is a per-thread value to ptxas, and the ring's stage and parity, which
    // follow it across items, would put every descriptor of the loop in vector registers (R2UR before each wgmma)
    const int n = __shfl_sync(0xffffffffu, item[kItemN], 0);
    if (n < 0) break;
    const int h = item[kItemH], q_begin_seq = item[kItemQBegin], len_q = item[kItemLenQ];
    const int len_k = item[kItemLenK], q0 = item[kItemQ0];
    const int first_row = q0 + 64 * wg, qrow_lo = first_row + row_lo;
    if (n == 0) {  // no visible key for any row of the block: output 0, LSE -inf
      release(&empty_q[slot]);
      prefill::store_empty_rows(p.out, p.lse, p.total_q, p.heads, h, q_begin_seq, qrow_lo, len_q, t);
      continue;
    }
    const int off = len_k - len_q;  // causal: row qr sees keys <= qr + off
    const int tail_keys = len_k - (n - 1) * kBN;
#pragma unroll
    for (int j = 0; j < 64; ++j) o[j] = 0.f;
    prefill::Rows rows{-INFINITY, -INFINITY, 0.f, 0.f};
    const uint32_t dq = static_cast<uint32_t>(kmajor_desc(sq + slot * kQSlotBytes + wg * kQWgBytes));
    int cs = s;  // the stage of the current tile j, its parity; ps, pph: tile j - 1's
    uint32_t cph = ph;
    auto issue_s = [&](int) { s_product(sc, dq, dk0 + stage_off(cs)); };
    auto softmax = [&](int j, float& a_lo, float& a_hi) {
      prefill::tile_softmax(sc, rows, j * kBN, len_k, p.causal, first_row, off, qrow_lo, t, p.scale_log2, a_lo, a_hi);
    };
    auto pack_p = [&]() { pack_bf16(sc, pa); };

    mbar_wait(&full_k[cs], cph);
    prefill::first_tile(sc, my_turn, other_turn, true, issue_s, softmax, pack_p);
    for (int j = 1; j < n; ++j) {
      const int ps = cs;
      const uint32_t pph = cph;
      if (++cs == kPStages) {
        cs = 0;
        cph ^= 1u;
      }
      mbar_wait(&full_k[cs], cph);
      mbar_wait(&full_v[ps], pph);
      nb_sync<kPairThreads>(my_turn);
      wg_fence();
      s_product(sc, dq, dk0 + stage_off(cs));
      pv_product(o, pa, dv0 + stage_off(ps));
      nb_arrive<kPairThreads>(other_turn);
      wg_wait<1>();  // S(j) done; P·V(j-1) may still run
      reg_fence(sc);
      float a_lo, a_hi;
      softmax(j, a_lo, a_hi);
      block_boundary(rows.l_lo);
      wg_wait<0>();  // P·V(j-1) done: stage ps is free, O and the A fragments may be written
      reg_fence(o);
      release(&empty[ps]);
      // x·1 = x: a warp whose 16 rows all keep their maximum skips the multiply (no bit changes)
      if (__any_sync(0xffffffffu, a_lo != 1.f || a_hi != 1.f)) prefill::scale_rows64(o, a_lo, a_hi);
      pack_p();
    }
    if (tail_keys < kBN) {  // the last tile's V with its rows past the sequence's end zeroed
      mbar_wait(&tail_v[cs], (tail_par >> cs) & 1u);
      tail_par ^= 1u << cs;
    } else {
      mbar_wait(&full_v[cs], cph);
    }
    wg_fence();
    pv_product(o, pa, dv0 + stage_off(cs));
    wg_wait<0>();
    reg_fence(o);
    release(&empty[cs]);
    release(&empty_q[slot]);  // the item's S products are done: its Q slot and info words are free
    s = cs + 1, ph = cph;
    if (s == kPStages) {
      s = 0;
      ph ^= 1u;
    }
    prefill::store_rows(o, rows, p.out_scale, p.out, p.lse, p.total_q, p.heads, h, q_begin_seq, qrow_lo, len_q, t);
  }
  if (wg == 0) nb_sync<kPairThreads>(kBarTurn0);  // WG1's arrival after its last turn
}

}  // namespace

cudaError_t launch_prefill_persistent(const PrefillParams& p, const void* tensor_maps, cudaStream_t stream) {
  static bool attribute_set[kMaxDevices] = {};  // once per device (not a stream operation: capture-safe)
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(prefill_persistent_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kPSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  int sms = 0;
  err = prefill::sm_count(sms);
  if (err != cudaSuccess) return err;
  // prefill_kernel's grid: `blocks` query blocks a head and sequence; one CTA per SM, or per item where fewer
  const int blocks = static_cast<int>((std::min<int64_t>(p.max_seqlen_q, p.total_q) + kBM - 1) / kBM);
  const unsigned grid = static_cast<unsigned>(std::min<int64_t>(int64_t{blocks} * p.heads * p.batch, sms));
  prefill_persistent_kernel<<<grid, kThreads, kPSmemBytes, stream>>>(p, *static_cast<const TmaMaps*>(tensor_maps),
                                                                      blocks);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
