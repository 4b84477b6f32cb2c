// decode_wgmma_probe_z.cu: variant Z of the WGMMA decode probe (issue 9): the probe's variant Y (split S on
// m64n32k16, the 32-key P tiles of the numerics contract, P·V on m64n256k16 with V read MN-major from the K tile)
// with the lockstep schedule replaced by warp specialization and a seesaw between the two consumer warpgroups:
//   - a producer warpgroup (warps 8-11, one per SM sub-partition, 16 rows of each tile per warp) gathers the K
//     tiles through the block table with cp.async into a 2-stage ring (a third stage does not fit next to Q) and
//     publishes each stage on an mbarrier; the consumer warpgroups issue no loads. setmaxnreg moves registers
//     from the producer (56) to the consumers (224): 384 threads get 168 each at launch;
//   - the consumers never meet at a CTA barrier inside the loop: each waits, by named barriers, only for the data
//     it needs from the other, so warpgroup 1's softmax runs under warpgroup 0's wgmmas and vice versa
//     (FlashMLA's "seesaw", with this contract's 32-key halves instead of its 64-key blocks);
//   - each warpgroup multiplies its own P half from registers (RS) and the other's from shared memory (SS).
// Variant F is Z over an FP8 cache (E4M3 codes, a per-tensor kv_scale): the producer gathers codes (half the
// bytes) into a 2-stage code ring, both consumer warpgroups convert tile i into the one bf16 tile stage at the
// start of step i (between two barriers of all 256 consumers) and release the code stage at once; the scores
// carry kv_scale in scale_log2 and the output out_scale (the codes are exact in bf16). Its harness checks it
// against float64 on code * kv_scale and times it beside Z on the same rows.
// Variant FS is Z over the same FP8 cache with Z's bf16 ring and consumers unchanged: the producer gathers a
// tile's codes into the upper half of the freed bf16 stage and converts them there in place (the sparse probe's
// k_sparse_s producer; produce_fs has its barriers), page size a template parameter. FSnc and FSd are two
// timing-only diagnostics of it (no conversion; full arrived before the conversion), never checked.
// Variant Z3 is Z with one full barrier per slab group (slabs 0-2, 3-5, 6-8) instead of one per stage: the
// producer publishes each group as its cp.async group lands, and S starts on slabs 0-2 while the rest is in flight
// (FlashMLA overlaps its 9 TMA boxes with the S GEMM the same way). Same kernel template, kGroups = 1 or 3.
// The probe's code (decode_wgmma_probe.cu, verified on the H200) is included, not copied: its helpers, variant
// Y and the float64 reference are used as they stand, so R and Y stay what was measured. The host part checks Z
// and Z3 (and Y on the same inputs, bit for bit against each) against the float64 contract, then times them.
// benchmarks/NOTES.md ("WGMMA decode probe, variant Z") has the floors, the prediction and the findings.
//
// Build (nvcc 13.0): nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o /tmp/decode_probe_z \
//                    decode_wgmma_probe_z.cu         (or: bash run_decode_probe_z.sh)
//
// ---------------------------------------------------------------------------------------------------------
// Synchronization protocol (CTA of 384 threads: warpgroup 0 = warps 0-3, warpgroup 1 = warps 4-7, producer
// warpgroup = warps 8-11; T = the split's 64-key tiles, tile i in stage i % 2):
//
// mbarriers (shared memory, initialized by thread 0 before the one __syncthreads of the kernel):
//   full[s]  (count 128: every producer thread arrives once per fill; Z3: full[s][g] per slab group g, each
//            arrived at once per fill, after that group's copies). Fill i completes phase i/2 of full[i % 2] (of
//            each full[i % 2][g]), so a consumer waits for tile i with parity (i / 2) & 1. A producer thread
//            arrives only after its own copies completed (cp.async.wait_group) and it executed fence.proxy.async:
//            the probe's verified order for generic-proxy writes read by wgmma (writer waits, writer fences, then
//            a barrier), with the mbarrier's release/acquire in place of the CTA barrier.
//   empty[s] (count 8: lane 0 of each consumer warp, after the warp's last wgmma.wait_group that covers a wgmma
//            reading tile i). Tile i's release completes phase i/2 of empty[i % 2]; the producer fills tile
//            j >= 2 after waiting for the release of tile j - 2: parity ((j - 2) / 2) & 1.
//   Phases cannot run ahead of a waiter: full[s] completes again only after both warpgroups released the tile
//   it holds (their empty arrivals come after their full waits), and empty[s] completes again only after the
//   producer filled the stage (the consumers cannot release a tile they have not received).
//
// Named barriers (bar.arrive / bar.sync, 256 threads = the 128 of one warpgroup arriving + the 128 of the
// other waiting; id 0 is __syncthreads and is not used after the prologue):
//   1 MX0    WG0 -> WG1  WG0 wrote the row maxima of half 0 (smx0)             WG1 waits before reading them
//   2 P0F    WG0 -> WG1  WG0 wrote P0 (slab columns 0-31) + proxy fence       WG1 waits before P0·V0_R
//   3 H1F    WG1 -> WG0  WG1 wrote P1 (columns 32-63), smx1 + proxy fence     WG0 waits before reading smx1, P1
//   4 P0E    WG1 -> WG0  WG1's P0·V0_R of tile i completed (if tile i+1 exists) WG0 waits before writing P0(i+1)
//   5 ALL    both warpgroups bar.sync (Q loaded; the final row sums exchanged)
// Per tile i, in program order (|| = the other warpgroup's program):
//   WG0: wait full(i); S0; write smx0; arrive MX0; P0 = ...; [i > 0: sync P0E]; write P0; arrive P0F; O·a1;
//        P0·V0_L (RS) issued; sync H1F; read smx1; a2; wait; O·a2; P1·V1_L (SS); wait; arrive empty(i)
//   WG1: wait full(i); S1; sync MX0; read smx0; P1 = ...; write P1, smx1; arrive H1F; O·a1; sync P0F;
//        P0·V0_R (SS); wait; [i < T-1: arrive P0E]; O·a2; P1·V1_R (RS); wait; arrive empty(i)
// Buffer reuse: P0 (written by WG0, read by WG1's P0·V0_R) needs P0E. P1 and smx1 (written by WG1, read by WG0
// after H1F) need no barrier of their own: WG1 rewrites them in tile i+1 after MX0(i+1), which WG0 arrives at
// only after finishing tile i (P1·V1_L(i) waited, smx1(i) read). smx0 (WG0 -> WG1): WG0 rewrites it in tile i+1
// after H1F(i), which WG1 arrives at after reading smx0(i). The final row sums go to their own array (sl).
// A hardware barrier only counts arrivals, so a warpgroup that arrived twice at one id before the other waited
// once would complete it alone. It cannot here: between two arrivals at one id the arriving warpgroup waits on
// a barrier the other side arrives at only after its wait at that id (MX0: WG0 waits H1F(i), arrived by WG1
// after its MX0(i); P0F: WG0 waits P0E(i), arrived after WG1's P0F(i); H1F: WG1 waits MX0(i+1), arrived by WG0
// after its H1F(i); P0E: WG1 waits P0F(i+1), arrived after WG0's P0E(i)). Each generation needs all 4 warps of
// both sides, so warps of one warpgroup cannot drift into different generations either. P0E is arrived at only
// when a tile follows and waited on only from tile 1 on: every generation has exactly 128 + 128 threads, none is
// left open at exit. No cycle: in tile i WG0 waits for H1F(i) and P0E(i-1), WG1 for MX0(i) and P0F(i); each is
// arrived at before its arriving side's first wait on the waiter's progress in tile i. All of this is checked by
// decode_wgmma_z_emulation.py over every interleaving of the three programs for 1-6 tiles, Z's and Z3's full
// barriers (no deadlock, no buffer hazard, no generation completed by arrivals alone; five broken variants of the
// protocol are caught).
//
// Numerics (the contract of docs/numerics.md, as variant Y): per 64-key tile, half h = keys 32h..32h+31,
// m1 = max(m, rowmax S0), m2 = max(m1, rowmax S1), a1 = 2^(m - m1), a2 = 2^(m1 - m2), P0 = bf16(2^(S0 - m1)),
// P1 = bf16(2^(S1 - m2)); WG0's row sum l0 = (l0·a1 + ΣP0)·a2, WG1's l1 = (l1·a1)·a2 + ΣP1 (float32 P), l = l0 + l1
// at the end; O_w = (O_w·a1 + P0·V0_w)·a2 + P1·V1_w. Every float32 operation is Y's, on the same operands, in
// the same order: each warpgroup computes m1, m2, a1, a2 from the same float32 maxima with fmaxf and ex2 (WG1
// reads WG0's half-0 maxima from shared memory as Y's warpgroups read both; WG0 reads WG1's), the P elements
// from the same scaled scores, and each O column's accumulation runs k-step by k-step in Y's order. Two
// differences, neither a float32 rounding change: (1) the multiplies of O by a1 and by a2 are skipped per warp
// when all 16 of the warp's rows have the factor exactly 1 (Y skips only the a2 multiply, and only when every
// row of the CTA has a2 = 1); x·1 = x exactly for the finite O, so the skip changes no bit (it saves up to 256
// FMULs per thread per tile once the running maxima settle); (2) each warpgroup's own P half enters P·V from registers
// (RS) instead of from the P slab (SS): the same bf16 values in the same k-steps, so the tensor cores' float32
// sums are expected to be Y's bit for bit (the host test counts the output bits that differ from Y's; any
// difference would be the tensor cores' internal summation order, float32 rounding only).
#define main decode_probe_ry_main  // the probe's own main (R and Y) is not this program's
#include "decode_wgmma_probe.cu"
#include <cstring>
#undef main

constexpr int kThreadsZ = 384;  // 2 consumer warpgroups + 1 producer warpgroup
constexpr int kProducerRegs = 56, kConsumerRegs = 224;  // setmaxnreg: 56 + 2 x 224 = 3 x 168 (the 384-thread share)
constexpr int kBarMx0 = 1, kBarP0Full = 2, kBarH1Full = 3, kBarP0Empty = 4, kBarAll = 5;
constexpr int kPairThreads = 256;  // threads per named-barrier generation (both consumer warpgroups)
// Q + 2 K stages + P slab + smx0, smx1, sl[2] (4 x 64 floats) + 8 mbarriers + alignment slack = 231,488 B
constexpr int kSmemZ = 3 * kTileBytes + 64 * 128 + 4 * 64 * 4 + 8 * 8 + 1024;

// One producer warp's part of a 64-key tile (rows 16pw..16pw+15; keys from pos0, keys at or past `end`
// zero-filled and never read) into the slab layout. Lanes 0-15 look up the warp's 16 rows (one block-table read
// each); per group of 4 rows the warp issues 8 full copies (chunks l and l + 32 of each row: slabs 0-7) and one
// for the rope chunks 64-71 of the 4 rows (lane l: row 4g + l / 8, chunk 64 + l % 8): 36 16-byte cp.async per
// lane, all 32 lanes busy.
__device__ __forceinline__ void produce_k_rows(uint8_t* sk, const uint8_t* cache, const int* bt, int pos0, int end,
                                               int pw, int lane) {
  const int r0 = 16 * pw, pos = pos0 + r0 + (lane & 15);
  const long long my_off =
      pos < end ? (static_cast<long long>(bt[pos / kPage]) * kPage + pos % kPage) * kRowBytes : -1ll;
#pragma unroll
  for (int g = 0; g < 4; ++g) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = 4 * g + k;
      const long long off = __shfl_sync(0xffffffffu, my_off, r);
      const uint8_t* src = off >= 0 ? cache + off : cache;
      const uint32_t n = off >= 0 ? 16u : 0u;
      cp_async16(sk + slab_off(r0 + r, lane * 16, 64), src + (off >= 0 ? lane * 16 : 0), n);
      cp_async16(sk + slab_off(r0 + r, (lane + 32) * 16, 64), src + (off >= 0 ? (lane + 32) * 16 : 0), n);
    }
    const int r = 4 * g + (lane >> 3), c = 64 + (lane & 7);
    const long long off = __shfl_sync(0xffffffffu, my_off, r);
    cp_async16(sk + slab_off(r0 + r, c * 16, 64), off >= 0 ? cache + off + c * 16 : cache, off >= 0 ? 16u : 0u);
  }
  cp_async_commit();
}

// Variant Z3's producer: the same 16 rows, copied slab group by slab group (slabs 0-2, 3-5, 6-8: 24 chunks of
// each row, 12 cp.async per lane per group), one cp.async group each, so each slab group can be published on its
// own mbarrier as soon as it lands and S can start on slabs 0-2 while the rest is in flight (FlashMLA's
// per-box TMA / GEMM overlap, with cp.async groups).
__device__ __forceinline__ void produce_k_rows_grouped(uint8_t* sk, const uint8_t* cache, const int* bt, int pos0,
                                                       int end, int pw, int lane) {
  const int r0 = 16 * pw, pos = pos0 + r0 + (lane & 15);
  const long long my_off =
      pos < end ? (static_cast<long long>(bt[pos / kPage]) * kPage + pos % kPage) * kRowBytes : -1ll;
#pragma unroll 1  // partly rolled: fully unrolled, ptxas keeps the addresses live and spills at 56 registers
  for (int gi = 0; gi < 3; ++gi) {
#pragma unroll 4
    for (int k = 0; k < 12; ++k) {
      const int idx = lane + 32 * k;  // 16 rows x 24 chunks
      const int r = idx / 24, c = 24 * gi + idx % 24;
      const long long off = __shfl_sync(0xffffffffu, my_off, r);
      cp_async16(sk + slab_off(r0 + r, c * 16, 64), off >= 0 ? cache + off + c * 16 : cache, off >= 0 ? 16u : 0u);
    }
    cp_async_commit();
  }
}

// Variant F's producer: the same 16 rows of a tile as E4M3 codes (576 bytes a row, kept row-major in an FP8
// staging stage, not swizzled: the consumers convert it), 36 16-byte chunks a row, 18 cp.async per lane.
constexpr int kStageF8 = kTileKeys * kD;  // 36,864 B: one tile of codes
__device__ __forceinline__ void produce_f8_rows(uint8_t* st, const uint8_t* codes, const int* bt, int pos0, int end,
                                                int pw, int lane) {
  const int r0 = 16 * pw, pos = pos0 + r0 + (lane & 15);
  const long long my_off = pos < end ? (static_cast<long long>(bt[pos / kPage]) * kPage + pos % kPage) * kD : -1ll;
#pragma unroll 6  // fully unrolled, ptxas spills 4 B at the producer's 56 registers
  for (int k = 0; k < 18; ++k) {
    const int idx = lane + 32 * k, r = idx / 36, c = idx % 36;
    const long long off = __shfl_sync(0xffffffffu, my_off, r);
    cp_async16(st + (r0 + r) * kD + c * 16, off >= 0 ? codes + off + c * 16 : codes, off >= 0 ? 16u : 0u);
  }
  cp_async_commit();
}

// Variant F's conversion by the 256 consumer threads: the tile's codes in staging stage `st` to bf16 in the slab
// layout at `sb` (exact: every E4M3 value is a bf16), 9 chunks of 16 codes per thread.
__device__ __forceinline__ void convert_f8_tile(uint8_t* sb, const uint8_t* st, int tid) {
#pragma unroll
  for (int k = 0; k < 9; ++k) {
    const int idx = tid + 256 * k, r = idx / 36, c = idx % 36;
    uint4 lo, hi;
    e4m3x16_to_bf16(*reinterpret_cast<const uint4*>(st + r * kD + c * 16), lo, hi);
    *reinterpret_cast<uint4*>(sb + slab_off(r, 32 * c, 64)) = lo;
    *reinterpret_cast<uint4*>(sb + slab_off(r, 32 * c + 16, 64)) = hi;
  }
}

// Variant FS (decode_wgmma_probe_z.cu's protocol comment, "Variant FS"): a stage's layout while it holds codes.
// The codes of a tile fill the stage's upper half (bytes kCodeOffFS.. of the 73,728-byte bf16 stage) as 9 code
// blocks: block k = code chunks 4k..4k+3 (64 B) of every row, 4,096 B at kCodeOffFS + 4,096 k, row r at 64 r.
// k_decode_zt's cache kinds: Z / Z3, F, FS; and two timing-only diagnostics of FS whose outputs are not checked
// (wrong by construction): FSnc leaves the conversion out (the consumers read whatever bf16 the stage holds), FSd
// arrives on full[s] before the conversion and converts after it, under the consumers' step (a race: the
// emulator's "full arrived before the conversion" mutant). FSnc bounds an FP8 cache whose conversion is free; FSd
// keeps the conversion's issue and shared-memory traffic but takes it off the consumers' path.
constexpr int kCacheBf16 = 0, kCacheF8 = 1, kCacheF8Prod = 2, kCacheF8ProdNoConvert = 3, kCacheF8ProdEarlyFull = 4;
constexpr int kSlabBytes = 64 * 128, kBlockFS = kTileKeys * 64, kCodeOffFS = kTileBytes - 9 * kBlockFS, kBarProd = 6, kProdThreads = 128;
static_assert(kCodeOffFS == 36864 && 9 * kBlockFS == kTileKeys * kD, "the codes fill the stage's upper half");

// The first 1024-byte-aligned shared address at or after p, as p plus an offset (align1024 rounds as an integer,
// which makes the compiler emit generic loads and stores through the result).
__device__ __forceinline__ uint8_t* align1024_shared(uint8_t* p) { return p + ((1024u - (smem_u32(p) & 1023u)) & 1023u); }

// The byte offset of the code row at key `pos` through the block table (page size kPg), -1 at or past `end`.
template <int kPg>
__device__ __forceinline__ long long fs_row_offset(const int* bt, int pos, int end) {
  return pos < end ? (static_cast<long long>(bt[pos / kPg]) * kPg + pos % kPg) * kD : -1ll;
}

// 16 codes (chunk q of a code block, row `row`) as bf16 into `slab`: row bytes 32q..32q+31, 16-byte positions 2q
// and 2q + 1 swizzled by the row (the slab layout Z's descriptors read).
__device__ __forceinline__ void fs_store_chunk(uint8_t* slab, int row, int q, const uint4& w) {
  uint4 lo, hi;
  e4m3x16_to_bf16(w, lo, hi);
  uint8_t* d = slab + row * 128;
  *reinterpret_cast<uint4*>(d + (((2 * q) ^ (row & 7)) << 4)) = lo;
  *reinterpret_cast<uint4*>(d + (((2 * q + 1) ^ (row & 7)) << 4)) = hi;
}

// Variant FS's producer warpgroup (thread u = 0..127, warp pw, lane): per tile i, stage s = i % 2 at
// sk0 + s * kTileBytes, after the release of tile i - 2 (empty[s]): gathers the tile's 64 code rows by cp.async
// into the stage's code blocks (lanes 0-15 of each warp hold the byte offsets of its 16 rows, looked up one tile
// ahead while the copies fly; lane l copies chunk q = l % 4 of every block for rows 16pw + l/4 and + 8: 18
// cp.async; keys at or past `end` zero-filled), waits for its copies, meets the other producer warps (PROD:
// every copy landed and visible), then converts in place, block k -> slab k (thread u: rows u/4 and u/4 + 32,
// chunk u % 4 of every block). Slabs 0-3 lie below the codes; slab 4 covers block 0, slab 5 blocks 1-2, slab 6
// blocks 3-4, slab 7 blocks 5-6, slab 8 blocks 7-8: so each thread reads block 4 before a PROD barrier that
// precedes the stores of slab 4 (blocks 0-4 read by all: slabs 4-6 safe), blocks 7 and 8 before one that
// precedes the stores of slabs 7-8. Then fence.proxy.async (the bf16 stores -> the consumers' wgmma) and full[s].
// The sparse probe's k_sparse_s producer with the block table in place of the index list (no slot flags: keys
// past `end` are masked by the consumers as in Z). kCache: kCacheF8Prod, or one of FS's timing-only diagnostics.
template <int kPg, int kCache>
__device__ __forceinline__ void produce_fs(uint8_t* sk0, const uint8_t* codes, const int* bt, int start, int end,
                                           int ntiles, uint64_t* full, uint64_t* empty, int pw, int lane, int u) {
  const int q = lane & 3, gr = 16 * pw + (lane >> 2), cr = u >> 2;
  long long my_off = lane < 16 ? fs_row_offset<kPg>(bt, start + 16 * pw + lane, end) : -1ll;
  for (int i = 0; i < ntiles; ++i) {
    const int s = i & 1;
    uint8_t* stage = sk0 + s * kTileBytes;
    uint8_t* code = stage + kCodeOffFS;
    if (i >= 2) mbar_wait(&empty[s], ((i - 2) >> 1) & 1);
    const long long off_a = __shfl_sync(0xffffffffu, my_off, lane >> 2);
    const long long off_b = __shfl_sync(0xffffffffu, my_off, (lane >> 2) + 8);
    const uint8_t* src_a = off_a >= 0 ? codes + off_a + 16 * q : codes;
    const uint8_t* src_b = off_b >= 0 ? codes + off_b + 16 * q : codes;
    const uint32_t n_a = off_a >= 0 ? 16u : 0u, n_b = off_b >= 0 ? 16u : 0u;
    const uint32_t step_a = off_a >= 0 ? 64u : 0u, step_b = off_b >= 0 ? 64u : 0u;
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      cp_async16(code + kBlockFS * k + 64 * gr + 16 * q, src_a + step_a * k, n_a);
      cp_async16(code + kBlockFS * k + 64 * (gr + 8) + 16 * q, src_b + step_b * k, n_b);
    }
    cp_async_commit();
    my_off = i + 1 < ntiles && lane < 16 ? fs_row_offset<kPg>(bt, start + (i + 1) * kTileKeys + 16 * pw + lane, end)
                                         : -1ll;
    cp_async_wait_all();
    nb_sync<kProdThreads>(kBarProd);  // every producer thread's copies landed and visible
    if constexpr (kCache == kCacheF8ProdNoConvert) {  // diagnostic FSnc
      fence_proxy_async();
      mbar_arrive(&full[s]);
      continue;
    }
    if constexpr (kCache == kCacheF8ProdEarlyFull) mbar_arrive(&full[s]);  // diagnostic FSd
    const uint8_t* cq = code + 64 * cr + 16 * q;  // this thread's chunk of block 0, row cr (row cr + 32: + 2,048 B)
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // slabs 0-3: below the codes
      const uint4 w0 = *reinterpret_cast<const uint4*>(cq + kBlockFS * k);
      const uint4 w1 = *reinterpret_cast<const uint4*>(cq + kBlockFS * k + 2048);
      fs_store_chunk(stage + kSlabBytes * k, cr, q, w0);
      fs_store_chunk(stage + kSlabBytes * k, cr + 32, q, w1);
    }
    {
      const uint4 w0 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 4);
      const uint4 w1 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 4 + 2048);
      nb_sync<kProdThreads>(kBarProd);  // blocks 0-4 read by every producer thread: slabs 4-6 may overwrite them
      fs_store_chunk(stage + kSlabBytes * 4, cr, q, w0);
      fs_store_chunk(stage + kSlabBytes * 4, cr + 32, q, w1);
    }
#pragma unroll
    for (int k = 5; k < 7; ++k) {
      const uint4 w0 = *reinterpret_cast<const uint4*>(cq + kBlockFS * k);
      const uint4 w1 = *reinterpret_cast<const uint4*>(cq + kBlockFS * k + 2048);
      fs_store_chunk(stage + kSlabBytes * k, cr, q, w0);
      fs_store_chunk(stage + kSlabBytes * k, cr + 32, q, w1);
    }
    {
      const uint4 w70 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 7);
      const uint4 w71 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 7 + 2048);
      const uint4 w80 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 8);
      const uint4 w81 = *reinterpret_cast<const uint4*>(cq + kBlockFS * 8 + 2048);
      nb_sync<kProdThreads>(kBarProd);  // blocks 5-8 read by every producer thread: slabs 7-8 may overwrite them
      fs_store_chunk(stage + kSlabBytes * 7, cr, q, w70);
      fs_store_chunk(stage + kSlabBytes * 7, cr + 32, q, w71);
      fs_store_chunk(stage + kSlabBytes * 8, cr, q, w80);
      fs_store_chunk(stage + kSlabBytes * 8, cr + 32, q, w81);
    }
    fence_proxy_async();  // the generic stores of the bf16 tile -> the consumers' wgmma reads
    if constexpr (kCache == kCacheF8Prod) mbar_arrive(&full[s]);
  }
}

// kGroups = 1: variant Z (one full barrier per stage); 3: variant Z3 (one per slab group, S k-steps 12g..12g+11
// issued after group g's barrier). kCache: kCacheBf16 (Z, Z3), kCacheF8 (variant F, an FP8 cache, kGroups 1: the
// producer fills a 2-stage ring of E4M3 codes (half the bytes of a bf16 tile), both consumer warpgroups convert
// tile i into the one bf16 tile stage at the start of step i (after a barrier: both finished step i - 1) and
// release the code stage right away) or kCacheF8Prod (variant FS: Z's bf16 ring and consumers, the producer
// gathers the codes into the freed stage's upper half and converts them in place: produce_fs). F and FS: the
// scores carry kv_scale in scale_log2 and the output out_scale. kPg: FS's page size (F, Z, Z3: kPage).
// Everything else is the same code.
template <int kGroups, int kCache = kCacheBf16, int kPg = kPage>
__global__ void __launch_bounds__(kThreadsZ, 1) k_decode_zt(const DecodeParams p) {
  constexpr bool kFp8 = kCache == kCacheF8;  // variant F: the consumers convert
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);
  uint8_t* sk0 = sq + kTileBytes;                         // F: the bf16 tile stage, then the 2 code stages
  uint8_t* sp = sq + 3 * kTileBytes;                      // P [64 rows x 64 keys] bf16, one swizzled slab
  float* smx0 = reinterpret_cast<float*>(sp + 64 * 128);  // [64] row maxima of half 0 (WG0 -> WG1)
  float* smx1 = smx0 + 64;                                // [64] row maxima of half 1 (WG1 -> WG0)
  float* sl = smx1 + 64;                                  // [2][64] final row sums
  uint64_t* full = reinterpret_cast<uint64_t*>(sl + 128);  // [2 stages][kGroups]
  uint64_t* empty = full + 6;                             // [2]
  const int tid = threadIdx.x;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform for the compiler
  const int h0 = blockIdx.x * kHeadsPerCta, split = blockIdx.y, b = blockIdx.z;
  int start, end;
  if (!split_range(p, b, split, start, end)) {
    if (tid < kThreads) write_empty(p, b, split, h0);
    return;
  }
  const int ntiles = (end - start + kTileKeys - 1) / kTileKeys;
  if (tid == 0) {
    for (int i = 0; i < 2 * kGroups; ++i) mbar_init(&full[i], 128);
    mbar_init(&empty[0], 8);
    mbar_init(&empty[1], 8);
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: warp 8 + pw gathers rows 16pw..16pw+15 of every tile
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegs));
    const int lane = tid & 31, pw = warp - 8;
    const uint8_t* cache = reinterpret_cast<const uint8_t*>(p.cache);
    const int* bt = p.block_table + (size_t)b * p.max_pages;
    if constexpr (kCache >= kCacheF8Prod) {
      // the same stages through a pointer the compiler knows is shared memory (LDS/STS for the conversion)
      produce_fs<kPg, kCache>(align1024_shared(smem_raw) + kTileBytes, p.codes, bt, start, end, ntiles, full, empty, pw,
                      lane, tid - 256);
    } else {
      for (int i = 0; i < ntiles; ++i) {
        const int s = i & 1;
        if (i >= 2) mbar_wait(&empty[s], ((i - 2) >> 1) & 1);
        if constexpr (kFp8) {
          produce_f8_rows(sk0 + kTileBytes + s * kStageF8, p.codes, bt, start + i * kTileKeys, end, pw, lane);
          cp_async_wait_all();
          mbar_arrive(&full[s]);
        } else if constexpr (kGroups == 1) {
          produce_k_rows(sk0 + s * kTileBytes, cache, bt, start + i * kTileKeys, end, pw, lane);
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(&full[s]);
        } else {
          produce_k_rows_grouped(sk0 + s * kTileBytes, cache, bt, start + i * kTileKeys, end, pw, lane);
          asm volatile("cp.async.wait_group 2;\n" ::: "memory");
          fence_proxy_async();
          mbar_arrive(&full[3 * s]);
          asm volatile("cp.async.wait_group 1;\n" ::: "memory");
          fence_proxy_async();
          mbar_arrive(&full[3 * s + 1]);
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(&full[3 * s + 2]);
        }
      }
    }
    return;
  }
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegs));

  // Consumers: Q rows of the head group (rows past the head count zero-filled), visible to wgmma.
  {
    const uint8_t* qb = reinterpret_cast<const uint8_t*>(p.q + ((size_t)b * p.heads + h0) * kD);
    for (int i = tid; i < kHeadsPerCta * (kRowBytes / 16); i += kThreads) {
      const int r = i / (kRowBytes / 16), c = i % (kRowBytes / 16);
      const bool ok = h0 + r < p.heads;
      cp_async16(sq + slab_off(r, c * 16, 64), ok ? qb + r * kRowBytes + c * 16 : qb, ok ? 16u : 0u);
    }
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    nb_sync<kPairThreads>(kBarAll);
  }
  const int wg = warp >> 2, t = tid & 127, lane = tid & 31;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;  // l: own half, this thread's 8 of 32 columns
  for (int it = 0; it < ntiles; ++it) {
    const int s = it & 1;
    const uint8_t* sk = kFp8 ? sk0 : sk0 + s * kTileBytes;
    const uint8_t* sv = sk + wg * 4 * 64 * 128;  // this warpgroup's V columns: slabs 4wg..4wg+3
    const int pos0 = start + it * kTileKeys;

    // S of this warpgroup's half (keys 32wg..32wg+31): 36 x m64n32k16 SS, as Y; slab group g's k-steps after
    // group g landed.
    float sc[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) sc[j] = 0.f;
    reg_fence(sc);
    const uint8_t* skw = sk + wg * 32 * 128;
    if constexpr (kFp8) {
      if (it > 0) nb_sync<kPairThreads>(kBarAll);  // both warpgroups' wgmmas of step it - 1 completed: stage free
      mbar_wait(&full[s], (it >> 1) & 1);
      convert_f8_tile(sk0, sk0 + kTileBytes + s * kStageF8, tid);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);  // this warp's reads of the code stage are done
      fence_proxy_async();
      nb_sync<kPairThreads>(kBarAll);  // the whole bf16 tile written, visible to wgmma
    }
#pragma unroll
    for (int gi = 0; gi < kGroups; ++gi) {
      if constexpr (!kFp8) mbar_wait(&full[kGroups * s + gi], (it >> 1) & 1);
      wg_fence();  // after each wait: without it ptxas injects warpgroup.arrive there itself (C7519)
#pragma unroll
      for (int ks = gi * (kD / 16 / kGroups); ks < (gi + 1) * (kD / 16 / kGroups); ++ks)
        wgmma_n32_ss_bf16(sc, kmajor_desc(sq, 64, ks * 32), kmajor_desc(skw, 64, ks * 32), ks > 0);
    }
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);

    const int nvalid = end - pos0 - 32 * wg;  // keys of this half; half 0 has >= 1, half 1 may have none
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int col = 8 * (j >> 2) + 2 * (t & 3) + (j & 1);
      const float x = col < nvalid ? sc[j] * p.scale_log2 : -INFINITY;
      sc[j] = x;
      if (j & 2) mx_hi = fmaxf(mx_hi, x); else mx_lo = fmaxf(mx_lo, x);
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, d));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, d));
    }

    if (wg == 0) {
      if ((t & 3) == 0) {
        smx0[row_lo] = mx_lo;
        smx0[row_lo + 8] = mx_hi;
      }
      nb_arrive<kPairThreads>(kBarMx0);
      const float m1_lo = fmaxf(m_lo, mx_lo), m1_hi = fmaxf(m_hi, mx_hi);
      const float a1_lo = ex2(m_lo - m1_lo), a1_hi = ex2(m_hi - m1_hi);
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float e = ex2(sc[j] - ((j & 2) ? m1_hi : m1_lo));
        sc[j] = e;
        if (j & 2) sum_hi += e; else sum_lo += e;
      }
      uint32_t a[2][4];  // P0 as the RS A operand (k-steps over keys 0-15, 16-31)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[ks][i] = pack_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
      if (it > 0) nb_sync<kPairThreads>(kBarP0Empty);  // WG1's P0·V0_R of the previous tile has read the slab's half 0
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int key = 16 * ks + 2 * (t & 3);
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, key * 2, 64)) = a[ks][0];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, key * 2, 64)) = a[ks][1];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, (key + 8) * 2, 64)) = a[ks][2];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, (key + 8) * 2, 64)) = a[ks][3];
      }
      fence_proxy_async();
      nb_arrive<kPairThreads>(kBarP0Full);
      if (__any_sync(0xffffffffu, a1_lo != 1.f || a1_hi != 1.f)) scale_rows(o, a1_lo, a1_hi);
      wg_fence();
      wgmma_n256_rs_bf16<1>(o, a[0], mnmajor_desc(sv, 0, 64 * 128, 1024), 1);
      wgmma_n256_rs_bf16<1>(o, a[1], mnmajor_desc(sv, 16, 64 * 128, 1024), 1);
      wg_commit();
      nb_sync<kPairThreads>(kBarH1Full);  // WG1's P1 and half-1 maxima
      const float m2_lo = fmaxf(m1_lo, smx1[row_lo]), m2_hi = fmaxf(m1_hi, smx1[row_lo + 8]);
      const float a2_lo = ex2(m1_lo - m2_lo), a2_hi = ex2(m1_hi - m2_hi);
      l_lo = (l_lo * a1_lo + sum_lo) * a2_lo;
      l_hi = (l_hi * a1_hi + sum_hi) * a2_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      wg_wait<0>();
      reg_fence(o);
      if (__any_sync(0xffffffffu, a2_lo != 1.f || a2_hi != 1.f)) scale_rows(o, a2_lo, a2_hi);
      wg_fence();
      wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 64), mnmajor_desc(sv, 32, 64 * 128, 1024), 1);
      wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 96), mnmajor_desc(sv, 48, 64 * 128, 1024), 1);
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
    } else {
      nb_sync<kPairThreads>(kBarMx0);  // WG0's half-0 maxima
      const float m1_lo = fmaxf(m_lo, smx0[row_lo]), m1_hi = fmaxf(m_hi, smx0[row_lo + 8]);
      const float m2_lo = fmaxf(m1_lo, mx_lo), m2_hi = fmaxf(m1_hi, mx_hi);
      const float a1_lo = ex2(m_lo - m1_lo), a1_hi = ex2(m_hi - m1_hi);
      const float a2_lo = ex2(m1_lo - m2_lo), a2_hi = ex2(m1_hi - m2_hi);
      float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float e = ex2(sc[j] - ((j & 2) ? m2_hi : m2_lo));
        sc[j] = e;
        if (j & 2) sum_hi += e; else sum_lo += e;
      }
      l_lo = (l_lo * a1_lo) * a2_lo + sum_lo;
      l_hi = (l_hi * a1_hi) * a2_hi + sum_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      uint32_t a[2][4];  // P1 as the RS A operand (k-steps over keys 32-47, 48-63)
#pragma unroll
      for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int i = 0; i < 4; ++i) a[ks][i] = pack_bf16(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const int key = 32 + 16 * ks + 2 * (t & 3);
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, key * 2, 64)) = a[ks][0];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, key * 2, 64)) = a[ks][1];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo, (key + 8) * 2, 64)) = a[ks][2];
        *reinterpret_cast<uint32_t*>(sp + slab_off(row_lo + 8, (key + 8) * 2, 64)) = a[ks][3];
      }
      if ((t & 3) == 0) {
        smx1[row_lo] = mx_lo;
        smx1[row_lo + 8] = mx_hi;
      }
      fence_proxy_async();
      nb_arrive<kPairThreads>(kBarH1Full);
      if (__any_sync(0xffffffffu, a1_lo != 1.f || a1_hi != 1.f)) scale_rows(o, a1_lo, a1_hi);
      nb_sync<kPairThreads>(kBarP0Full);  // WG0's P0
      wg_fence();
      wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 0), mnmajor_desc(sv, 0, 64 * 128, 1024), 1);
      wgmma_n256_ss_bf16<1>(o, kmajor_desc(sp, 64, 32), mnmajor_desc(sv, 16, 64 * 128, 1024), 1);
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
      if (it + 1 < ntiles) nb_arrive<kPairThreads>(kBarP0Empty);
      if (__any_sync(0xffffffffu, a2_lo != 1.f || a2_hi != 1.f)) scale_rows(o, a2_lo, a2_hi);
      wg_fence();
      wgmma_n256_rs_bf16<1>(o, a[0], mnmajor_desc(sv, 32, 64 * 128, 1024), 1);
      wgmma_n256_rs_bf16<1>(o, a[1], mnmajor_desc(sv, 48, 64 * 128, 1024), 1);
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
    }
    // Every wgmma of this warp that reads stage s has completed: release the stage to the producer (F released
    // its code stage after the conversion).
    if constexpr (!kFp8) {
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
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
  nb_sync<kPairThreads>(kBarAll);
  if constexpr (kCache != kCacheBf16) scale_rows(o, p.out_scale, p.out_scale);  // the codes' kv_scale, left out of V
  // The same order in both warpgroups, as Y: l = l_0 + l_1.
  store_rows(p, o, b, split, h0, m_lo, m_hi, sl[row_lo] + sl[64 + row_lo], sl[row_lo + 8] + sl[64 + row_lo + 8]);
}

// ---------------------------------------------------------------------------------------------------------
// Host side: the probe's check and timing, with the block size a parameter (Z and Z3 run 384 threads).
struct VariantZ {
  const char* tag;
  const char* name;
  void (*kernel)(DecodeParams);
  int smem, threads;
};
constexpr int kNumVariantsZ = 9;
constexpr int kVarF = 3, kVarFS = 4, kVarFS1 = 5, kVarFS48 = 6;  // FS1 / FS48: FS at page size 1 / 48 (checked only)
constexpr int kVarFSnc = 7, kVarFSd = 8;                       // timing-only diagnostics (never checked)
static const VariantZ kVariantsZ[kNumVariantsZ] = {
    {"Y", "Y (the probe's variant Y, lockstep)", k_decode_y, kSmemY, kThreads},
    {"Z", "Z (producer warpgroup + seesaw)", k_decode_zt<1>, kSmemZ, kThreadsZ},
    {"Z3", "Z3 (Z + S per landed slab group)", k_decode_zt<3>, kSmemZ, kThreadsZ},
    {"F", "F (Z over an FP8 cache: consumers convert the codes)", k_decode_zt<1, kCacheF8>, kSmemZ, kThreadsZ},
    {"FS", "FS (Z over an FP8 cache: the producer converts in place)", k_decode_zt<1, kCacheF8Prod>, kSmemZ, kThreadsZ},
    {"FS1", "FS at page size 1", k_decode_zt<1, kCacheF8Prod, 1>, kSmemZ, kThreadsZ},
    {"FS48", "FS at page size 48", k_decode_zt<1, kCacheF8Prod, 48>, kSmemZ, kThreadsZ},
    {"FSnc", "FS without the conversion (timing only)", k_decode_zt<1, kCacheF8ProdNoConvert>, kSmemZ, kThreadsZ},
    {"FSd", "FS with full arrived before the conversion (timing only)", k_decode_zt<1, kCacheF8ProdEarlyFull>, kSmemZ,
     kThreadsZ}};

static void launch_z(const VariantZ& v, const DecodeParams& p, int batch) {
  const dim3 grid((p.heads + kHeadsPerCta - 1) / kHeadsPerCta, p.num_splits, batch);
  v.kernel<<<grid, v.threads, v.smem>>>(p);
  if (p.num_splits > 1) k_combine<<<batch * p.heads, 128>>>(p.o_part, p.lse_part, p.out, p.lse, p.heads, p.num_splits);
}

// One correctness case (inputs as the probe's check_case: uniform [-1, 1] q and cache, pages shuffled, NaN in every
// row no length reaches, outputs poisoned with NaN): Y and the variants in `vis` on the same inputs against the
// float64 reference; then each variant's output bits compared with Y's.
static int g_fail_z[kNumVariantsZ] = {};
static void check_case_z(const std::vector<int>& vis, const char* name, int heads, int splits,
                         const std::vector<int>& lens, float scale, std::mt19937& rng) {
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
  const size_t n_out = static_cast<size_t>(batch) * heads * kDv, n_lse = static_cast<size_t>(batch) * heads;
  CK(cudaMalloc(&p.o_part, static_cast<size_t>(batch) * splits * heads * kDv * sizeof(float)));
  CK(cudaMalloc(&p.lse_part, static_cast<size_t>(batch) * splits * heads * sizeof(float)));
  CK(cudaMalloc(&p.out, n_out * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&p.lse, n_lse * sizeof(float)));
  std::vector<int> run = {0};
  run.insert(run.end(), vis.begin(), vis.end());
  std::vector<__nv_bfloat16> outs[kNumVariantsZ];
  std::vector<float> lses[kNumVariantsZ];
  for (int vi : run) {
    const VariantZ& v = kVariantsZ[vi];
    CK(cudaMemset(p.o_part, 0xff, static_cast<size_t>(batch) * splits * heads * kDv * sizeof(float)));
    CK(cudaMemset(p.lse_part, 0xff, static_cast<size_t>(batch) * splits * heads * sizeof(float)));
    CK(cudaMemset(p.out, 0xff, n_out * sizeof(__nv_bfloat16)));
    CK(cudaMemset(p.lse, 0xff, n_lse * sizeof(float)));
    launch_z(v, p, batch);
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
    g_fail_z[vi] += !pass;
    std::printf("%-2s %-50s %s  rel L2 %.3e  max abs %.3e  LSE max abs err %.3e  non-finite %d  bad empty rows %d\n",
                v.tag, name, pass ? "PASS" : "FAIL", rel, max_abs, lse_err, nonfinite, bad_empty);
  }
  for (int vi : vis) {
    size_t diff_out = 0, diff_lse = 0;
    for (size_t i = 0; i < n_out; ++i)
      diff_out += *reinterpret_cast<const uint16_t*>(&outs[0][i]) != *reinterpret_cast<const uint16_t*>(&outs[vi][i]);
    for (size_t i = 0; i < n_lse; ++i) diff_lse += std::memcmp(&lses[0][i], &lses[vi][i], sizeof(float)) != 0;
    std::printf("   %s vs Y bit for bit: %zu of %zu outputs differ, %zu of %zu LSE differ\n", kVariantsZ[vi].tag,
                diff_out, n_out, diff_lse, n_lse);
  }
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.q)));
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.cache)));
  CK(cudaFree(const_cast<int*>(p.block_table)));
  CK(cudaFree(const_cast<int*>(p.lengths)));
  CK(cudaFree(p.o_part));
  CK(cudaFree(p.lse_part));
  CK(cudaFree(p.out));
  CK(cudaFree(p.lse));
}

// Timing as the probe's bench (median of 20 after 3 warm-up, L2 flushed by a 256 MB memset before each), the
// variants in `vis` that passed every case on the same block table, a line each.
static void bench_z(const std::vector<int>& vis, const BenchBuffers& buf, int heads, int batch, int L, int splits, double flashmla_us,
                    std::mt19937& rng) {
  const int max_pages = L / kPage, pages = batch * max_pages;
  std::vector<int> bt(pages), lens(batch, L);
  std::iota(bt.begin(), bt.end(), 0);
  std::shuffle(bt.begin(), bt.end(), rng);
  DecodeParams p{};
  p.q = buf.q;
  p.cache = buf.cache;
  p.codes = buf.codes;  // variant F's cache (kv_scale 1)
  p.out_scale = 1.f;
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
  for (int vi : vis) {
    if (g_fail_z[vi]) continue;
    const VariantZ& v = kVariantsZ[vi];
    std::vector<float> total, split_only;
    for (int it = 0; it < 23; ++it) {
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
        split_only.push_back(ms01 * 1e3f);
        total.push_back(ms02 * 1e3f);
      }
    }
    std::sort(total.begin(), total.end());
    std::sort(split_only.begin(), split_only.end());
    const double us = total[total.size() / 2], us_split = split_only[split_only.size() / 2];
    const double tflops = 2.0 * batch * heads * static_cast<double>(L) * (kD + kDv) / (us * 1e-6) / 1e12;
    const int ctas = grid.x * grid.y * grid.z;
    std::printf("%-2s H%-3d B%-3d L%-5d splits %-2d (%4d CTAs)  %8.1f us (split kernel %8.1f, min %8.1f)  %6.1f TFLOP/s  "
                "%5.2f x FlashMLA (%.1f us)\n", v.tag, heads, batch, L, splits, ctas, us, us_split, total.front(),
                tflops, us / flashmla_us, flashmla_us);
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

// Variant F's inputs: E4M3 codes drawn with exponent fields 3..8 (|value| in [2^-4, 480)), random sign and
// mantissa; the cache values are code * kv_scale (the float64 reference reads those).
static float e4m3_value(uint8_t code) {
  const int e = (code >> 3) & 15, m = code & 7;
  const float mag = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.f + m / 8.f, e - 7);
  return code & 0x80 ? -mag : mag;
}
static uint8_t random_code(std::mt19937& rng) {
  std::uniform_int_distribution<int> exp_field(3, 8), bits(0, 15);
  const int b = bits(rng);
  return static_cast<uint8_t>(((b & 8) << 4) | (exp_field(rng) << 3) | (b & 7));
}
__global__ void k_fill_codes_e4m3(uint8_t* x, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const uint32_t h = hash32(static_cast<uint32_t>(i) * 2654435761u ^ seed);
    x[i] = static_cast<uint8_t>(((h & 8) << 4) | ((3 + (h >> 4) % 6) << 3) | (h & 7));
  }
}

// One correctness case of the FP8-cache variants in `vis` (F, FS: page size 64; FS1, FS48: their own), on the
// same inputs: as check_case_z, pages (of `pg` rows) shuffled, rows no length reaches hold NaN codes (0x7F),
// outputs poisoned; against the float64 reference on the values code * kv_scale (which reads a page-64 copy of
// each request's rows); then each later variant's output bits against the first's.
static void check_case_f(const std::vector<int>& vis, int pg, const char* name, int heads, int splits,
                         const std::vector<int>& lens, float scale, float kv_scale, std::mt19937& rng) {
  const int batch = static_cast<int>(lens.size());
  const int max_len = *std::max_element(lens.begin(), lens.end());
  const int max_pages = std::max(1, (max_len + pg - 1) / pg), ref_pages = std::max(1, (max_len + kPage - 1) / kPage);
  int real_pages = 0;
  for (int L : lens) real_pages += (L + pg - 1) / pg;
  const int poison = 4, pages = real_pages + poison;
  std::vector<int> perm(real_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_int_distribution<int> pick_poison(real_pages, pages - 1);
  std::vector<int> bt(static_cast<size_t>(batch) * max_pages), bt_ref(static_cast<size_t>(batch) * ref_pages);
  std::iota(bt_ref.begin(), bt_ref.end(), 0);  // the reference's copy: request b's rows in pages b * ref_pages..
  std::vector<uint8_t> codes(static_cast<size_t>(pages) * pg * kD, 0x7F);
  std::vector<float> cache(static_cast<size_t>(batch) * ref_pages * kPage * kD, NAN);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int pi = 0; pi < max_pages; ++pi) {
      const bool used = pi * pg < lens[b];
      const int page = used ? perm[next++] : pick_poison(rng);
      bt[static_cast<size_t>(b) * max_pages + pi] = page;
      if (!used) continue;
      for (int r = 0; r < pg && pi * pg + r < lens[b]; ++r)
        for (int d = 0; d < kD; ++d) {
          const size_t i = (static_cast<size_t>(page) * pg + r) * kD + d;
          codes[i] = random_code(rng);
          cache[(static_cast<size_t>(b) * ref_pages * kPage + pi * pg + r) * kD + d] = e4m3_value(codes[i]) * kv_scale;
        }
    }
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> q(static_cast<size_t>(batch) * heads * kD);
  for (float& x : q) x = __bfloat162float(__float2bfloat16(uni(rng)));
  std::vector<__nv_bfloat16> q_h(q.size());
  for (size_t i = 0; i < q.size(); ++i) q_h[i] = __float2bfloat16(q[i]);
  std::vector<double> ref(static_cast<size_t>(batch) * heads * kDv), ref_lse(static_cast<size_t>(batch) * heads);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < heads; ++h) {
      const size_t row = static_cast<size_t>(b) * heads + h;
      reference_row(&q[row * kD], cache, &bt_ref[static_cast<size_t>(b) * ref_pages], lens[b], splits, scale,
                    &ref[row * kDv], &ref_lse[row]);
    }
  DecodeParams p{};
  p.q = to_device(q_h);
  p.codes = to_device(codes);
  p.block_table = to_device(bt);
  p.lengths = to_device(lens);
  p.heads = heads;
  p.max_pages = max_pages;
  p.num_splits = splits;
  p.scale_log2 = scale * kv_scale * 1.4426950408889634f;
  p.out_scale = kv_scale;
  const size_t n_out = static_cast<size_t>(batch) * heads * kDv, n_lse = static_cast<size_t>(batch) * heads;
  CK(cudaMalloc(&p.o_part, static_cast<size_t>(batch) * splits * heads * kDv * sizeof(float)));
  CK(cudaMalloc(&p.lse_part, static_cast<size_t>(batch) * splits * heads * sizeof(float)));
  CK(cudaMalloc(&p.out, n_out * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&p.lse, n_lse * sizeof(float)));
  std::vector<std::vector<__nv_bfloat16>> outs;
  std::vector<std::vector<float>> lses;
  for (int vi : vis) {
    CK(cudaMemset(p.o_part, 0xff, static_cast<size_t>(batch) * splits * heads * kDv * sizeof(float)));
    CK(cudaMemset(p.lse_part, 0xff, static_cast<size_t>(batch) * splits * heads * sizeof(float)));
    CK(cudaMemset(p.out, 0xff, n_out * sizeof(__nv_bfloat16)));
    CK(cudaMemset(p.lse, 0xff, n_lse * sizeof(float)));
    launch_z(kVariantsZ[vi], p, batch);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    outs.push_back(from_device(p.out, n_out));
    lses.push_back(from_device(p.lse, n_lse));
    const std::vector<__nv_bfloat16>& out = outs.back();
    const std::vector<float>& lse = lses.back();
    double num = 0.0, den = 0.0, lse_err = 0.0;
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
        }
        if (!std::isfinite(lse[row])) ++nonfinite;
        lse_err = std::max(lse_err, std::fabs(lse[row] - ref_lse[row]));
      }
    const double rel = den > 0 ? std::sqrt(num / den) : 0.0;
    const bool pass = nonfinite == 0 && bad_empty == 0 && rel < 1e-2 && lse_err < 1e-3;
    g_fail_z[vi] += !pass;
    std::printf("%-4s page %-2d %-46s %s  rel L2 %.3e  LSE max abs err %.3e  non-finite %d  bad empty rows %d\n",
                kVariantsZ[vi].tag, pg, name, pass ? "PASS" : "FAIL", rel, lse_err, nonfinite, bad_empty);
  }
  for (size_t k = 1; k < vis.size(); ++k) {
    size_t diff_out = 0, diff_lse = 0;
    for (size_t i = 0; i < n_out; ++i)
      diff_out += *reinterpret_cast<const uint16_t*>(&outs[0][i]) != *reinterpret_cast<const uint16_t*>(&outs[k][i]);
    for (size_t i = 0; i < n_lse; ++i) diff_lse += std::memcmp(&lses[0][i], &lses[k][i], sizeof(float)) != 0;
    std::printf("     %s vs %s bit for bit: %zu of %zu outputs differ, %zu of %zu LSE differ\n", kVariantsZ[vis[k]].tag,
                kVariantsZ[vis[0]].tag, diff_out, n_out, diff_lse, n_lse);
  }
  CK(cudaFree(const_cast<__nv_bfloat16*>(p.q)));
  CK(cudaFree(const_cast<uint8_t*>(p.codes)));
  CK(cudaFree(const_cast<int*>(p.block_table)));
  CK(cudaFree(const_cast<int*>(p.lengths)));
  CK(cudaFree(p.o_part));
  CK(cudaFree(p.lse_part));
  CK(cudaFree(p.out));
  CK(cudaFree(p.lse));
}

// Arguments: none (Y / Z checked, Z timed; F and FS checked and timed beside Z) or --with-z3 (Z3 too).
int main(int argc, char** argv) {
  const bool with_z3 = argc > 1 && std::strcmp(argv[1], "--with-z3") == 0;
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out at once: a later hang or trap keeps what came before
  CK(cudaSetDevice(0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s, cc %d.%d, %d SMs, smem/block optin %zu B; smem per CTA: Y %d B, Z %d B; threads Y %d, Z %d\n",
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.sharedMemPerBlockOptin, kSmemY, kSmemZ,
              kThreads, kThreadsZ);
  if (prop.major != 9 || prop.minor != 0) {
    std::printf("FAIL: needs compute capability 9.0 (sm_90a)\n");
    return 2;
  }
  for (const VariantZ& v : kVariantsZ)
    CK(cudaFuncSetAttribute(v.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, v.smem));

  BenchBuffers buf{};
  const size_t max_rows = static_cast<size_t>(128) * 8192;
  CK(cudaMalloc(&buf.cache, max_rows * kD * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.q, static_cast<size_t>(128) * 128 * kD * sizeof(__nv_bfloat16)));
  CK(cudaMalloc(&buf.codes, max_rows * kD));
  k_fill_codes_e4m3<<<1024, 256>>>(buf.codes, max_rows * kD, 3u);
  buf.flush_bytes = size_t(256) << 20;
  CK(cudaMalloc(&buf.flush, buf.flush_bytes));
  k_fill_uniform<<<1024, 256>>>(buf.cache, max_rows * kD, 1u, 1.f);
  k_fill_uniform<<<1024, 256>>>(buf.q, static_cast<size_t>(128) * 128 * kD, 2u, 1.f);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  // Z first (checked and timed with Y), then Z3 (--with-z3): a hang or fault in Z3 leaves Z's lines printed.
  for (const std::vector<int>& vis : {std::vector<int>{1}, std::vector<int>{2}}) {
    if (vis[0] == 2 && !with_z3) continue;
    // Correctness: lengths on and off the 32/64-key edges (0, 1, 31-33, 63-65, 777, 1000, 4095, 8191), empty
    // requests, splits whose start is not 64-aligned, empty splits, one split (direct write), 1 and 2 tiles per
    // split (the seesaw's first and last tile, the P0E skips), padded heads (16 and 64 in a 64-row CTA).
    std::mt19937 rng(2026);
    std::printf("\n== %s\ncorrectness vs a float64 reference of the contract (bf16 output: rel L2 < 1e-2, LSE abs "
                "< 1e-3), Y on the same inputs\n", kVariantsZ[vis[0]].name);
    check_case_z(vis, "H128 splits 3, L {0,1,63,100,1000,3000}", 128, 3, {0, 1, 63, 100, 1000, 3000}, 0.25f, rng);
    check_case_z(vis, "H16 splits 5, L {64,33,4096,129,777,8191}", 16, 5, {64, 33, 4096, 129, 777, 8191}, 0.25f, rng);
    check_case_z(vis, "H128 splits 1, L {4161,65,2000,0}", 128, 1, {4161, 65, 2000, 0}, 0.25f, rng);
    check_case_z(vis, "H64 splits 32, L {31,32,2049}, scale 0.5", 64, 32, {31, 32, 2049}, 0.5f, rng);
    check_case_z(vis, "H128 splits 2, L {8192,4095}, scale 0.05", 128, 2, {8192, 4095}, 0.05f, rng);
    check_case_z(vis, "H64 splits 2, L {31,32,33,63,64,65,777}", 64, 2, {31, 32, 33, 63, 64, 65, 777}, 0.25f, rng);
    check_case_z(vis, "H16 splits 1, L {0,1,31,32,33,63,64,65,128,129}", 16, 1,
                 {0, 1, 31, 32, 33, 63, 64, 65, 128, 129}, 0.25f, rng);
    check_case_z(vis, "H128 splits 5, L {1000,33,8191,96}", 128, 5, {1000, 33, 8191, 96}, 0.25f, rng);
    check_case_z(vis, "H128 splits 32, L {8191,1,65}", 128, 32, {8191, 1, 65}, 0.25f, rng);
    for (int vi : {0, vis[0]})
      if (g_fail_z[vi]) std::printf("variant %s: %d correctness case(s) failed; its timing skipped\n", kVariantsZ[vi].name, g_fail_z[vi]);
    std::printf("timing: median of 20 (after 3 warm-up), L2 flushed by a 256 MB memset before each; FLOPs "
                "2*B*H*L*1088; FlashMLA's figures on this card from issue 9\n");
    const std::vector<int> timed = vis[0] == 1 ? std::vector<int>{0, 1} : vis;
    bench_z(timed, buf, 128, 32, 8192, 2, 133.0, rng);
    bench_z(timed, buf, 128, 32, 8192, 32, 133.0, rng);
    bench_z(timed, buf, 128, 128, 8192, 1, 509.4, rng);
    bench_z(timed, buf, 16, 32, 8192, 4, 95.3, rng);
  }
  // F and FS: an FP8 cache (correctness against float64 on code * kv_scale, F and FS on the same inputs, FS at
  // page sizes 1 and 48 too; then timed beside Z's bf16 cache on the same shapes: the memory-bound 16-head shapes
  // read half the bytes). FS last: a hang in it leaves F's lines printed.
  {
    std::mt19937 rng(2027);
    std::printf("\n== %s and %s\ncorrectness vs a float64 reference on code * kv_scale (bf16 output: rel L2 < 1e-2, "
                "LSE abs < 1e-3)\n", kVariantsZ[kVarF].name, kVariantsZ[kVarFS].name);
    const std::vector<int> f_fs = {kVarF, kVarFS};
    check_case_f(f_fs, 64, "H128 splits 3, L {0,1,63,100,1000,3000}", 128, 3, {0, 1, 63, 100, 1000, 3000}, 0.05f, 0.5f, rng);
    check_case_f(f_fs, 64, "H16 splits 5, L {64,33,4096,129,777,8191}", 16, 5, {64, 33, 4096, 129, 777, 8191}, 0.05f,
                 0.25f, rng);
    check_case_f(f_fs, 64, "H128 splits 1, L {4161,65,2000,0}", 128, 1, {4161, 65, 2000, 0}, 0.02f, 1.0f, rng);
    check_case_f(f_fs, 64, "H64 splits 32, L {31,32,2049}", 64, 32, {31, 32, 2049}, 0.05f, 0.125f, rng);
    check_case_f(f_fs, 64, "H16 splits 1, L {0,1,31,32,33,63,64,65,128,129}", 16, 1,
                 {0, 1, 31, 32, 33, 63, 64, 65, 128, 129}, 0.05f, 0.5f, rng);
    check_case_f(f_fs, 64, "H128 splits 2, L {8192,4095}", 128, 2, {8192, 4095}, 0.01f, 2.0f, rng);
    for (int vi : {kVarFS1, kVarFS48}) {
      const int pg = vi == kVarFS1 ? 1 : 48;
      check_case_f({vi}, pg, "H16 splits 1, L {0,1,47,48,49,63,64,65,129}", 16, 1, {0, 1, 47, 48, 49, 63, 64, 65, 129},
                   0.05f, 0.5f, rng);
      check_case_f({vi}, pg, "H128 splits 3, L {1000,33,3001,96}", 128, 3, {1000, 33, 3001, 96}, 0.05f, 0.25f, rng);
      check_case_f({vi}, pg, "H64 splits 7, L {2049,5,777}", 64, 7, {2049, 5, 777}, 0.02f, 1.0f, rng);
    }
    for (int vi = kVarF; vi <= kVarFS48; ++vi)
      if (g_fail_z[vi]) std::printf("variant %s: %d correctness case(s) failed; its timing skipped\n", kVariantsZ[vi].tag, g_fail_z[vi]);
    std::printf("timing: Z over the bf16 cache, F and FS over the same rows as E4M3 codes (kv_scale 1), page 64; "
                "FSnc and FSd: FS's timing-only diagnostics (no conversion; full before the conversion)\n");
    const std::vector<int> timed = {1, kVarF, kVarFS, kVarFSnc, kVarFSd};
    bench_z(timed, buf, 16, 32, 8192, 4, 95.3, rng);
    bench_z(timed, buf, 16, 128, 8192, 1, 316.7, rng);
    bench_z(timed, buf, 128, 32, 8192, 2, 133.0, rng);
    bench_z(timed, buf, 128, 128, 8192, 1, 509.4, rng);
  }
  CK(cudaFree(buf.cache));
  CK(cudaFree(buf.codes));
  CK(cudaFree(buf.q));
  CK(cudaFree(buf.flush));
  bool ok = true;
  std::printf("\n");
  for (int vi = 0; vi <= kVarFS48; ++vi) {
    ok = ok && g_fail_z[vi] == 0;
    std::printf("%s %d%s", kVariantsZ[vi].tag, g_fail_z[vi], vi < kVarFS48 ? ", " : "");
  }
  std::printf(" correctness case(s) failed%s: %s\n", with_z3 ? "" : " (Z3 not run)", ok ? "ALL PASS" : "FAIL");
  return ok ? 0 : 1;
}
