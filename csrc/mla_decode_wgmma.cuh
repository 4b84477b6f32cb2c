// The WGMMA decode's kernels and their launchers, included by the translation units that instantiate them (one
// (dtype, K / V operand) each: mla_decode_wgmma_{bf16,fp16}_{kv,kv_fp8,cache_fp8}.cu; the four-slot ring's in
// mla_decode_wgmma_{bf16,fp16}_ring4.cu; the keys-as-M kernels and the dispatch in mla_decode_wgmma.cu), so the build
// compiles the 24 kernels in parallel. Everything here but the launchers' declarations at the end is in an anonymous
// namespace: a translation unit compiles only the instances it uses, and the kernels keep their names (and machine
// code) whichever file instantiates them.
//
// Paged MLA decode on Hopper WGMMA (sm_90a) for bf16 / fp16, kv_lora_rank 512 + rope 64, any head count (64
// heads per CTA; a last group of fewer heads is zero-padded and its pad rows are never stored). Fake quantization
// (csrc/qdq.cuh, the mma.sync kernel's rules) where K's and V's codes agree on the shared tile: K = V FP8 with one
// scale (the producer converts each stage in place, k_codes_fp8) and P FP8 or NVFP4 (in the consumers'
// registers, p_qdq); the mma.sync kernel (mla_decode.cu) runs every other quantized problem. An FP8 cache (E4M3
// codes, cache_fp8): the producer copies 1-byte codes and converts them exactly to q's dtype in place
// (produce_codes, codes_to_values); kv_scale is in qk_scale_log2 and out_scale (docs/numerics.md). An FP8 cache
// at <= 16 heads without P fake quantization runs decode_t_kernel instead (keys as the wgmma M, codes converted
// in the consumers' registers: its comment below).
//
// One CTA of three warpgroups per (request, split, group of 64 heads) walks its split's keys in steps of 64 (two
// 32-key P tiles of the numerics contract: a split starts at a multiple of 32, so each half is a P tile at an
// absolute position) in the seesaw of csrc/seesaw.cuh (its comment gives the consumers' step, the mbarrier ring,
// the named barriers and their order; setmaxnreg gives the producer 56 registers and the consumers 224). Here:
//   - the producer warpgroup (warps 8-11) gathers the 64 cache rows of each step through the block table with
//     cp.async into the ring's 128-byte-swizzled slabs (warp 8 + w copies rows 16w..16w+15; a key past the
//     split's end or whose page lies outside the cache is zero-filled, never read, and masked in the stage's
//     validity bits, written before the stage is published). The next step's block-table entries are read while
//     a step's copies are in flight (off the critical path). Each producer thread arrives on full[s] after its
//     copies landed (cp.async.wait_group 0), the FP8 conversion where K = V FP8, and fence.proxy.async; over a
//     16-bit cache (power-of-two pages >= 16, 16-byte aligned) a warp whose 16 rows are all present loads them
//     as 9 TMA boxes instead (produce_rows_tma; the launcher's kv_tensor_map): without K fake quantization it
//     arrives at once with their bytes expected on full[s]; where K = V FP8 the boxes complete the warp's own
//     landed[s] barrier, the warp waits on it, converts its rows in place and arrives on full[s] as above;
//   - consumer warpgroup w computes S for keys 32w..32w+31 (36 x wgmma m64n32k16 from shared memory; the
//     unquantized problem runs schedule Q1 instead, decode_wgmma_kernel's comment), masked by the validity bits;
//     P0 = T(2^(S0 - m1)), P1 = T(2^(S1 - m2)) (T = the cache dtype; FP8 / NVFP4 P rounded first, p_qdq), row
//     sums from the float32 P; factors and P are taken against 0 while a row's max is -inf.
// Outputs, LSE, empty rows and splits as the mma.sync kernel (0 and -inf), partials merged by its combine kernel.
// The protocol was checked over every interleaving for 1-6 steps (benchmarks/probes/decode_wgmma_z_emulation.py)
// and measured as variant Z of the decode probe (benchmarks/NOTES.md). Layout, descriptors and ordering rules:
// docs/cuda.md ("Hopper building blocks, verified").

#pragma once

#include "hopper.cuh"
#include "mla_decode.h"
#include "mla_decode_split.cuh"
#include "qdq.cuh"
#include "seesaw.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#error "the WGMMA decode (mla_decode_wgmma.cuh) is written for sm_90a (-gencode=arch=compute_90a,code=sm_90a)"
#endif

namespace mla_core_cuda {
namespace {

// The CTA's shape, the seesaw's named barriers and the slab layout: seesaw.cuh (kHeads, kKeys, kNope, ...).
constexpr int kPTile = 32;                         // the contract's P tile: a step is two
constexpr int kRowBytes = kDim * 2;                // a K row (512 latent + 64 rope), 16-bit elements
constexpr int kChunks = kRowBytes / 16;            // 16-byte chunks per row
constexpr int kTileBytes = kKeys * kRowBytes;      // 73,728 B: 9 slabs of [64 rows x 128 B] (Q alike)
constexpr int kSmemBytes = 3 * kTileBytes          // Q, two K stages
                           + kHeads * 128          // P slab [64 heads x 64 keys]
                           + 4 * kHeads * 4        // maxima of half 0, of half 1, [2 warpgroups] final row sums
                           + 2 * 4 * 4             // [2 stages][4 producer warps] validity bits of 16 keys
                           + 4 * 8                 // mbarriers full[2], empty[2]
                           + 2 * 4 * 8             // mbarriers landed[2 stages][4 producer warps] (K = V FP8's TMA)
                           + 1024;                 // alignment slack: slabs start 1024-aligned (231,552 B)
// ring4: mbarriers full[4], empty[4], no landed ones (231,520 B, as before the landed barriers)
constexpr int kSmemBytesRing = kSmemBytes - 2 * 4 * 8 + 4 * 8;
static_assert(kSmemBytes <= 232448 && kSmemBytesRing <= 232448, "shared memory per CTA (sm_90 opt-in maximum)");
constexpr int kMaxDevices = 64;                    // devices whose shared-memory attribute is remembered
constexpr int kCodes = 3;                          // KF of an FP8 cache (E4M3 codes; QuantFormat's values are 0-2)


// tok = pg * page_size + in_page, 0 <= in_page < page_size, for 0 <= tok < 2^51, without a division instruction
// (a 64-bit integer division is a subroutine with branches; in a divergent path it makes ptxas serialize every
// wgmma of the kernel): the float64 product with inv = RN(1 / page_size) is within 1 of the quotient, one
// correction each way makes it exact.
__device__ __forceinline__ void page_of(int64_t tok, int64_t page_size, double inv, int64_t& pg, int64_t& in_page) {
  int64_t q = __double2ll_rz(__dmul_rn(static_cast<double>(tok), inv));
  int64_t r = tok - q * page_size;
  q = r < 0 ? q - 1 : q;
  r = r < 0 ? r + page_size : r;
  q = r >= page_size ? q + 1 : q;
  r = r >= page_size ? r - page_size : r;
  pg = q;
  in_page = r;
}

// Element offset in the cache of token `tok` of request b (page block_table[b, tok / page_size], row
// tok % page_size: any page size, a shift for a power of two), or -1 for an absent key: at or past `hi`, or on
// a page outside the cache; `page_out`: the page of a present key (produce_rows_tma's coordinate), else unchanged.
__device__ __forceinline__ int64_t row_offset(const DecodeParams& p, int b, int64_t tok, int64_t hi, int& page_out) {
  if (tok >= hi) return -1;
  int64_t pg, in_page;
  if (p.page_shift >= 0) {
    pg = tok >> p.page_shift;
    in_page = tok & (p.page_size - 1);
  } else {
    page_of(tok, p.page_size, p.page_size_inv, pg, in_page);
  }
  const int64_t page = load_index(p.block_table, b * p.table_stride_b + pg * p.table_stride_col, p.table_i64);
  if (page >= 0 && page < p.num_pages) {
    page_out = static_cast<int>(page);
    return page * p.cache_stride_page + in_page * p.cache_stride_tok;
  }
  return -1;
}
__device__ __forceinline__ int64_t row_offset(const DecodeParams& p, int b, int64_t tok, int64_t hi) {
  int page;
  return row_offset(p, b, tok, hi, page);
}

// Producer warp w's share of a step: rows 16w .. 16w + 15 into the slab layout at `sk`, lane l < 16 holding
// row 16w + l's offset (row_offset). An absent key is zero-filled (nothing read); its bit in the warp's 16-bit
// validity word `valid` is 0. `aligned`: 16-byte cp.async (per group of 4 rows, chunks l and l + 32 of each
// row, then the rope chunks 64-71 of the 4 rows: 36 copies per lane), else 2-byte loads and stores. kGroups:
// each group of 4 rows is committed as its own cp.async group (4 groups, rows 4g .. 4g + 3 in group g), so the
// FP8 conversion can start on the first rows while the later ones are in flight.
template <bool kGroups>
__device__ __forceinline__ void produce_rows(const DecodeParams& p, int64_t my_off, uint8_t* sk, uint32_t* valid,
                                             int w, int lane, bool aligned) {
  const uint32_t bits = __ballot_sync(0xffffffffu, lane < 16 && my_off >= 0);
  if (lane == 0) *valid = bits;
  const uint16_t* cache = static_cast<const uint16_t*>(p.cache);
  const int r0 = 16 * w;
  // rows 4g .. 4g + 3: chunks l and l + 32 of each, then the rope chunks 64-71 of the 4 rows (lane l: row l / 8)
  const auto copy_group = [&](int g) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const int r = 4 * g + k;
      const int64_t off = __shfl_sync(0xffffffffu, my_off, r);
      const uint32_t n = off >= 0 ? 16u : 0u;
      cp_async16(sk + slab_off(r0 + r, lane * 16), off >= 0 ? cache + off + lane * 8 : cache, n);
      cp_async16(sk + slab_off(r0 + r, (lane + 32) * 16), off >= 0 ? cache + off + (lane + 32) * 8 : cache, n);
    }
    const int r = 4 * g + (lane >> 3), c = 64 + (lane & 7);
    const int64_t off = __shfl_sync(0xffffffffu, my_off, r);
    cp_async16(sk + slab_off(r0 + r, c * 16), off >= 0 ? cache + off + c * 8 : cache, off >= 0 ? 16u : 0u);
  };
  if (aligned && kGroups) {
    // lane re-read and the groups in a loop: otherwise the compiler holds the per-lane swizzled offsets of all
    // 36 copies in registers across the step loop, and the conversion gets 8 of the producer's 56
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));
#pragma unroll 1
    for (int g = 0; g < 4; ++g) {
      copy_group(g);
      cp_async_commit();
    }
  } else if (aligned) {
#pragma unroll
    for (int g = 0; g < 4; ++g) copy_group(g);
  } else {
#pragma unroll 1
    for (int i = lane; i < 16 * kChunks; i += 32) {  // 36 rounds: every lane takes part in each shuffle
      const int r = i / kChunks, c = i % kChunks;
      const int64_t off = __shfl_sync(0xffffffffu, my_off, r);
      uint16_t* dst = reinterpret_cast<uint16_t*>(sk + slab_off(r0 + r, c * 16));
      for (int e = 0; e < 8; ++e) dst[e] = off >= 0 ? cache[off + c * 8 + e] : static_cast<uint16_t>(0);
    }
  }
}

// Producer warp w's share of a step by TMA (kv_map: the cache as (576 columns, page_size rows, pages), boxes of 64
// columns x 16 rows, 128-byte swizzle: the slab layout), when all 16 rows are present: then they are one page's run
// (the launcher maps only a power-of-two page_size >= 16, and a split starts at a multiple of 32), rows in_page ..
// in_page + 15 of page `page` (lane 0's). Lane 0 writes the validity word, arrives on `bar` with the 9 boxes' bytes
// expected and issues them; the other lanes arrive; nobody waits here (the copies complete `bar`). `bar`: full[s]
// without K fake quantization (32 of its 128 arrivals; the stage is published when the bytes landed), or the warp's
// own landed barrier (count 32) where K = V FP8: the warp then waits on it, converts its rows in place and arrives on
// full[s] as after cp.async (decode_wgmma_body). Returns false, having done nothing, when a row is absent (the
// caller's produce_rows zero-fills it).
__device__ __forceinline__ bool produce_rows_tma(const CUtensorMap* kv_map, int64_t my_off, int page, int in_page,
                                                 uint8_t* sk, uint32_t* valid, uint64_t* bar, int w, int lane) {
  if (!__all_sync(0xffffffffu, lane >= 16 || my_off >= 0)) return false;
  if (lane == 0) {
    *valid = 0xffffu;
    mbar_arrive_expect_tx(bar, kChunks / 8 * 16 * 128);
#pragma unroll
    for (int c = 0; c < kChunks / 8; ++c) tma_slab(sk + c * kSlab + 16 * w * 128, kv_map, 64 * c, in_page, page, bar);
  } else {
    mbar_arrive(bar);
  }
  return true;
}

// Byte offset, from a stage's start, of the E4M3 codes of producer warp w's row group g (rows 16w + 4g .. + 3) in
// slab 0: the upper 256 B of the group's 512 B of each slab (rows 4g + 2, 4g + 3 of the warp), where the codes
// of the group's 4 rows x 64 columns of that slab lie, row rho's at + 64 rho (slab k: + k kSlab). The group's bf16
// / fp16 values fill all 512 B, so its conversion reads and writes its own bytes only.
__device__ __forceinline__ uint32_t code_off(int w, int g) { return (16 * w + 4 * g) * 128 + 256; }

// Producer warp w's share of a step over an FP8 cache: the codes of rows 16w .. 16w + 15 (576 B a row) to their
// places (code_off), lane l < 16 holding row 16w + l's offset (row_offset: bytes). An absent key's codes are zeros
// (nothing read), its validity bit 0. `aligned` (16-byte rows and base): per row group g, its own cp.async group,
// lane l copies 16-byte chunk l (slab l / 4) of each of the 4 rows, lanes 0-15 chunk 32 + l % 4 (slab 8, the
// rope) of row 4g + l / 4: 4-5 copies a lane; else byte loads and stores, the same places.
__device__ __forceinline__ void produce_codes(const DecodeParams& p, int64_t my_off, uint8_t* sk, uint32_t* valid,
                                              int w, int lane, bool aligned) {
  const uint32_t bits = __ballot_sync(0xffffffffu, lane < 16 && my_off >= 0);
  if (lane == 0) *valid = bits;
  const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
  if (aligned) {
    asm volatile("mov.u32 %0, %%laneid;\n" : "=r"(lane));  // not held across the step loop (as produce_rows)
#pragma unroll 1
    for (int g = 0; g < 4; ++g) {
      uint8_t* dst = sk + code_off(w, g);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t off = __shfl_sync(0xffffffffu, my_off, 4 * g + r);
        cp_async16(dst + (lane >> 2) * kSlab + 64 * r + 16 * (lane & 3), off >= 0 ? cache + off + 16 * lane : cache,
                   off >= 0 ? 16u : 0u);
      }
      const int r = (lane >> 2) & 3;
      const int64_t off = __shfl_sync(0xffffffffu, my_off, 4 * g + r);
      if (lane < 16) {
        cp_async16(dst + 8 * kSlab + 64 * r + 16 * (lane & 3), off >= 0 ? cache + off + 16 * (32 + (lane & 3)) : cache,
                   off >= 0 ? 16u : 0u);
      }
      cp_async_commit();
    }
  } else {
#pragma unroll 1
    for (int i = lane; i < 16 * kDim; i += 32) {  // 288 rounds: every lane takes part in each shuffle
      const int r = i / kDim, c = i % kDim;
      const int64_t off = __shfl_sync(0xffffffffu, my_off, r);
      sk[code_off(w, r >> 2) + (c >> 6) * kSlab + 64 * (r & 3) + (c & 63)] = off >= 0 ? cache[off + c] : 0;
    }
  }
}

// Four E4M3 codes (bytes of w, lowest first) as two pairs of T, exactly (lo = codes 0, 1): e4m3x4_to_f16 or
// e4m3x4_to_bf16 (hopper.cuh). Per 8 codes: 4 conversions (fp16), + 8 widenings and 4 byte permutes (bf16).
template <typename T>
__device__ __forceinline__ void e4m3x4_to(uint32_t w, uint32_t& lo, uint32_t& hi) {
  if constexpr (std::is_same_v<T, __half>) {
    e4m3x4_to_f16(w, lo, hi);
  } else {
    e4m3x4_to_bf16(w, lo, hi);
  }
}

// Two elements of T (the lower in the low half) as float32.
template <typename T> __device__ __forceinline__ void unpack(uint32_t w, float& lo, float& hi);
template <> __device__ __forceinline__ void unpack<__nv_bfloat16>(uint32_t w, float& lo, float& hi) {
  lo = __uint_as_float(w << 16);
  hi = __uint_as_float(w & 0xffff0000u);
}
template <> __device__ __forceinline__ void unpack<__half>(uint32_t w, float& lo, float& hi) {
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w));
  lo = f.x;
  hi = f.y;
}

// 16 bytes of shared memory at a 32-bit shared-window address (the stage pointers are generic: through them the
// compiler emits generic LD/ST, which it cannot reorder past each other).
__device__ __forceinline__ uint4 ld_shared16(uint32_t a) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ void st_shared16(uint32_t a, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
               : "memory");
}
__device__ __forceinline__ uint2 ld_shared8(uint32_t a) {
  uint2 v;
  asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a) : "memory");
  return v;
}
// Schedule Q1's P publication (q1_step) through 32-bit shared-window addresses: the generic pointers made the
// compiler emit generic ST.E with 64-bit address arithmetic (two integer instructions a store) on WG0's chain.
// stmatrix x4: four 8x8 b16 matrices, one register of each per thread in the mma fragment layout (thread i: row
// i / 4, columns 2 (i % 4) and + 1, the lower column in the low half), lane l giving the address of matrix l / 8's
// row l % 8.
__device__ __forceinline__ void stsm_x4(uint32_t a, const uint32_t (&r)[4]) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(r[0]), "r"(r[1]),
               "r"(r[2]), "r"(r[3])
               : "memory");
}
__device__ __forceinline__ void st_shared4f(uint32_t a, float v) {
  asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(a), "f"(v) : "memory");
}
// store_p's bytes by stmatrix: this warp's 16 rows x 32 keys (key0 .. key0 + 31) of the P slab at shared address
// `sp` (1024-aligned), a[ks] = keys key0 + 16 ks .. + 15 as matrices (rows lo, keys 0-7), (hi, 0-7), (lo, 8-15),
// (hi, 8-15). Lane l's row: 16 w + l % 8 + 8 ((l / 8) % 2); its 16-byte chunk: key0 / 8 + 2 ks + l / 16, stored at
// chunk ^ (row % 8) = ((l / 16) ^ (l % 8)) ^ (key0 / 8 + 2 ks) (the chunk's bits 1-2 do not overlap l / 16).
__device__ __forceinline__ void store_p_stsm(uint32_t sp, const uint32_t (&a)[2][4], int key0, int t) {
  const int lane = t & 31;
  const uint32_t row = 16u * (t >> 5) + (lane & 7) + 8u * ((lane >> 3) & 1);
  const uint32_t x = ((lane >> 4) ^ (lane & 7));
#pragma unroll
  for (int ks = 0; ks < 2; ++ks) stsm_x4(sp + row * 128u + ((x ^ (key0 / 8 + 2 * ks)) << 4), a[ks]);
}
// Waits until at most n of this thread's most recent cp.async groups are pending (0 <= n <= 3).
__device__ __forceinline__ void cp_async_wait_upto(int n) {
  if (n == 3) asm volatile("cp.async.wait_group 3;\n" ::: "memory");
  else if (n == 2) asm volatile("cp.async.wait_group 2;\n" ::: "memory");
  else if (n == 1) asm volatile("cp.async.wait_group 1;\n" ::: "memory");
  else asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Two elements of T -> their FP8 codes e4m3(x / scale) as two elements of T (exact), the lower in the low half:
// division-free quotients (inv = RN(1 / scale)), then one paired conversion each way (round_e4m3x2: f16 codes,
// stored as they are for fp16, through float32 for bf16).
template <typename T>
__device__ __forceinline__ uint32_t fp8_codes2(uint32_t w, float scale, float inv) {
  float lo, hi;
  unpack<T>(w, lo, hi);
  const __half2 h = round_e4m3x2(div_rn(lo, scale, inv, false), div_rn(hi, scale, inv, false));
  if constexpr (std::is_same_v<T, __half>) return *reinterpret_cast<const uint32_t*>(&h);
  else return Wgmma<T>::pack(__low2float(h), __high2float(h));
}

// K fake quantization (FP8, k_fmt kFP8) of producer warp w's rows 16w .. 16w + 15 of the stage at shared address
// `sk`, in place: each element x -> e4m3(x / k_scale), unscaled (exact in T; k_scale is in qk_scale_log2, and V
// = these codes' first 512 columns with v_scale = k_scale, in out_scale). Elementwise, so the swizzle does not
// matter. Row group g (rows 16w + 4g .. + 3, produce_rows<true>'s cp.async group g) is 512 contiguous bytes of
// each of the 9 slabs, lane l the 16 bytes at 16 l of each: converted once the group landed (cp.async.wait_group
// 3 - g, then __syncwarp: every lane's copies visible), while the later groups are in flight; 3 slabs at a time
// (24 values per lane: 3 loads, the arithmetic, 3 stores). inv = RN(1 / k_scale). Division-free quotients only
// (decode_wgmma_supported refuses p.exact_div: __fdiv_rn's slow-path call needs registers the producer lacks).
template <typename T>
__device__ __forceinline__ void k_codes_fp8(float scale, float inv, uint32_t sk, int w, int lane) {
#pragma unroll 1
  for (int g = 0; g < 4; ++g) {
    cp_async_wait_upto(3 - g);
    __syncwarp();
    const uint32_t a = sk + (16 * w + 4 * g) * 128 + 16 * lane;
#pragma unroll 1
    for (int k = 0; k < 9; k += 3) {
      uint4 v[3];
#pragma unroll
      for (int u = 0; u < 3; ++u) v[u] = ld_shared16(a + (k + u) * (kKeys * 128));
#pragma unroll
      for (int u = 0; u < 3; ++u) {
        v[u].x = fp8_codes2<T>(v[u].x, scale, inv);
        v[u].y = fp8_codes2<T>(v[u].y, scale, inv);
        v[u].z = fp8_codes2<T>(v[u].z, scale, inv);
        v[u].w = fp8_codes2<T>(v[u].w, scale, inv);
      }
#pragma unroll
      for (int u = 0; u < 3; ++u) st_shared16(a + (k + u) * (kKeys * 128), v[u]);
    }
  }
}

// An FP8 cache's stage at shared address `sk`, producer warp w's rows: the codes produce_codes placed, as T in the
// slab layout, in place. Row group g once it landed (cp.async.wait_group 3 - g, __syncwarp: every lane's copies
// visible): lane l = 8 rho + c converts the 8 codes of row 16w + 4g + rho, columns 8c .. 8c + 7 of each slab k
// (8 bytes at code_off + k kSlab + 8 l: the group's 256 B of codes over 32 lanes) into its 16 bytes of the row
// (slab_off: the swizzled chunk c); all 9 loads, then __syncwarp (the stores to rows 4g + 2, 4g + 3 overwrite
// codes other lanes read), then the conversions and stores.
template <typename T>
__device__ __forceinline__ void codes_to_values(uint32_t sk, int w, int lane) {
#pragma unroll 1
  for (int g = 0; g < 4; ++g) {
    cp_async_wait_upto(3 - g);
    __syncwarp();
    const uint32_t src = sk + code_off(w, g) + 8 * lane;
    const uint32_t row = 16 * w + 4 * g + (lane >> 3);
    const uint32_t dst = sk + slab_off(row, 16 * (lane & 7));
    uint2 c[9];
#pragma unroll
    for (int k = 0; k < 9; ++k) c[k] = ld_shared8(src + k * kSlab);
    __syncwarp();
#pragma unroll
    for (int k = 0; k < 9; ++k) {
      uint4 v;
      e4m3x4_to<T>(c[k].x, v.x, v.y);
      e4m3x4_to<T>(c[k].y, v.z, v.w);
      st_shared16(dst + k * kSlab, v);
    }
  }
}

// P fake quantization of this thread's 16 P values (the S accumulator layout, float32 exp2(s - m)) before they
// are packed to T, the mma.sync kernel's rules: FP8 e4m3(P / p_scale); NVFP4 P rounded to T, then blocks of 16
// keys at absolute positions (this half's keys 0-15 and 16-31: a half starts at a multiple of 32), unscaled
// (p_scale is in out_scale). A block of one row is the quad's 4 threads x 4 values: j in {0, 1, 4, 5} (row lo,
// keys 0-15), {2, 3, 6, 7} (row hi), + 8 for keys 16-31; block amax over the quad by two shuffles.
template <typename T, int PF>
__device__ __forceinline__ void p_qdq(const DecodeParams& p, float (&e)[16]) {
  const float inv = __frcp_rn(p.p_scale);
  if constexpr (PF == kFP8) {
#pragma unroll
    for (int j = 0; j < 16; ++j) e[j] = fp8_code(e[j], p.p_scale, inv, p.exact_div);
  } else if constexpr (PF == kNVFP4) {
    float bmax[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int j = 0; j < 16; j += 2) {
      float lo, hi;
      unpack<T>(Wgmma<T>::pack(e[j], e[j + 1]), lo, hi);
      e[j] = lo;
      e[j + 1] = hi;
      const int blk = ((j >> 3) << 1) | ((j >> 1) & 1);
      bmax[blk] = fmaxf(bmax[blk], fmaxf(lo, hi));  // P >= 0
    }
#pragma unroll
    for (int d = 1; d <= 2; d <<= 1)
#pragma unroll
      for (int blk = 0; blk < 4; ++blk) bmax[blk] = fmaxf(bmax[blk], __shfl_xor_sync(0xffffffffu, bmax[blk], d));
#pragma unroll
    for (int blk = 0; blk < 4; ++blk) {
      const BlockScale bs = nvfp4_block_scale(bmax[blk], p.p_scale);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 8 * (blk >> 1) + 2 * (blk & 1) + (i & 1) + 4 * (i >> 1);
        e[j] = nvfp4_unscaled(e[j], bs, p.exact_div);
      }
    }
  }
}

// S of a whole step (keys 0-31 into d, 32-63 into e; the stage at `sk`): 36 k16 steps, one group, issued only.
template <typename T>
__device__ __forceinline__ void q1_s(float (&d)[16], float (&e)[16], const uint8_t* sq, const uint8_t* sk) {
#pragma unroll
  for (int ks = 0; ks < kDim / 16; ++ks)
    Wgmma<T>::s_full(d, e, kmajor_desc(sq, 32 * ks), kmajor_desc(sk, 32 * ks), ks > 0);
  wg_commit();
}
// One step of schedule Q1 (decode_wgmma_kernel's comment) for consumer warpgroup wg: the stage's S, softmax and P
// on WG0, O's columns 256 wg.. on both; m / l as the kernel keeps them (l_0 in l_*, WG0's l_1 in l1_*).
// kRing (config ring4): the stage's two 32-key halves are ring slots 2s, 2s + 1 of their own (full / empty per
// half): WG0 waits both before S, WG1 each before its P V of that half; each warp releases keys 0-31's slot once its
// P0 V0 completed (WG0: S and P0 V0 were its last reads of them, the validity words included), keys 32-63's at the
// end, so the producer refills keys 0-31 while keys 32-63 are still read. Same products, same order: bit-equal.
template <typename T, bool kRing>
__device__ __forceinline__ void q1_step(const DecodeParams& p, float (&o)[128], const uint8_t* sq, const uint8_t* sk,
                                        const uint8_t* sv, uint8_t* sp, float* sa1, float* sa2, const uint32_t* valid4,
                                        uint64_t* full, uint64_t* empty, int it, int steps, int wg, int t, int lane,
                                        int row_lo, float& m_lo, float& m_hi, float& l_lo, float& l_hi, float& l1_lo,
                                        float& l1_hi) {
  const int s = it & 1;
  const int h0 = kRing ? 2 * s : s, h1 = kRing ? 2 * s + 1 : s;  // the ring slots of keys 0-31, 32-63
  if (wg == 0) {
    float s0[16], s1[16];  // keys 0-31, 32-63 (s_half's layout each)
#pragma unroll
    for (int j = 0; j < 16; ++j) s0[j] = s1[j] = 0.f;
    reg_fence(s0);
    reg_fence(s1);
    mbar_wait(&full[h0], (it >> 1) & 1);
    if constexpr (kRing) mbar_wait(&full[h1], (it >> 1) & 1);
    wg_fence();
    q1_s<T>(s0, s1, sq, sk);
    // The stage's validity words, read while S runs (the producer wrote them before its full arrival).
    const uint4 vw = ld_shared16(smem_u32(valid4));  // 4 words, 16 keys each
    wg_wait<0>();
    reg_fence(s0);
    reg_fence(s1);
    const uint32_t v0 = vw.x | (vw.y << 16), v1 = vw.z | (vw.w << 16);
    float mx0_lo = -INFINITY, mx0_hi = -INFINITY, mx1_lo = -INFINITY, mx1_hi = -INFINITY;
    // All 64 keys valid (every step but a split's or sequence's ragged last one; one value for the CTA): the same
    // products without the 32 bit tests and selects (x ? y : -inf with x true is y), off WG0's chain.
    if ((v0 & v1) == 0xffffffffu) {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        s0[j] = s0[j] * p.qk_scale_log2;
        s1[j] = s1[j] * p.qk_scale_log2;
        if (j & 2) {
          mx0_hi = fmaxf(mx0_hi, s0[j]);
          mx1_hi = fmaxf(mx1_hi, s1[j]);
        } else {
          mx0_lo = fmaxf(mx0_lo, s0[j]);
          mx1_lo = fmaxf(mx1_lo, s1[j]);
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const int key = 8 * (j >> 2) + 2 * (t & 3) + (j & 1);
        const float x0 = (v0 >> key) & 1u ? s0[j] * p.qk_scale_log2 : -INFINITY;
        const float x1 = (v1 >> key) & 1u ? s1[j] * p.qk_scale_log2 : -INFINITY;
        s0[j] = x0;
        s1[j] = x1;
        if (j & 2) {
          mx0_hi = fmaxf(mx0_hi, x0);
          mx1_hi = fmaxf(mx1_hi, x1);
        } else {
          mx0_lo = fmaxf(mx0_lo, x0);
          mx1_lo = fmaxf(mx1_lo, x1);
        }
      }
    }
    quad_max(mx0_lo, mx0_hi);
    quad_max(mx1_lo, mx1_hi);
    const float m1_lo = fmaxf(m_lo, mx0_lo), m1_hi = fmaxf(m_hi, mx0_hi);
    const float m2_lo = fmaxf(m1_lo, mx1_lo), m2_hi = fmaxf(m1_hi, mx1_hi);
    const float a1_lo = ex2(m_lo - finite_or_zero(m1_lo)), a1_hi = ex2(m_hi - finite_or_zero(m1_hi));
    const float a2_lo = ex2(m1_lo - finite_or_zero(m2_lo)), a2_hi = ex2(m1_hi - finite_or_zero(m2_hi));
    float sum0_lo, sum0_hi, sum1_lo, sum1_hi;
    exponentiate(s0, m1_lo, m1_hi, sum0_lo, sum0_hi);
    uint32_t a0[2][4], a1[2][4];
    p_fragments<T>(s0, a0);
    exponentiate(s1, m2_lo, m2_hi, sum1_lo, sum1_hi);
    l_lo = (l_lo * a1_lo + sum0_lo) * a2_lo;
    l_hi = (l_hi * a1_hi + sum0_hi) * a2_hi;
    l1_lo = (l1_lo * a1_lo) * a2_lo + sum1_lo;
    l1_hi = (l1_hi * a1_hi) * a2_hi + sum1_hi;
    m_lo = m2_lo;
    m_hi = m2_hi;
    p_fragments<T>(s1, a1);
    if (it > 0) nb_sync<kConsumerThreads>(kBarP0Empty);  // WG1 read the previous step's P slab and factors
    store_p_stsm(smem_u32(sp), a0, 0, t);  // store_p's bytes, 4 stmatrix instead of 16 generic stores
    store_p_stsm(smem_u32(sp), a1, kPTile, t);
    if ((t & 3) == 0) {  // store_row_pair's, through shared-window addresses
      st_shared4f(smem_u32(sa1 + row_lo), a1_lo);
      st_shared4f(smem_u32(sa1 + row_lo + 8), a1_hi);
      st_shared4f(smem_u32(sa2 + row_lo), a2_lo);
      st_shared4f(smem_u32(sa2 + row_lo + 8), a2_hi);
    }
    fence_proxy_async();
    nb_arrive<kConsumerThreads>(kBarP0Full);
    rescale_pv_regs<T>(o, a1_lo, a1_hi, a0, sv, 0);
    if constexpr (kRing) release_stage(empty, h0, lane);  // S and P0 V0 completed: keys 0-31 read
    rescale_pv_regs<T>(o, a2_lo, a2_hi, a1, sv, kPTile);
  } else {
    mbar_wait(&full[h0], (it >> 1) & 1);  // the stage's V (WG0's wait does not order this warpgroup's reads)
    nb_sync<kConsumerThreads>(kBarP0Full);  // P of both halves and the factors
    const float a1_lo = sa1[row_lo], a1_hi = sa1[row_lo + 8], a2_lo = sa2[row_lo], a2_hi = sa2[row_lo + 8];
    rescale_pv_slab<T>(o, a1_lo, a1_hi, sp, sv, 0);
    if constexpr (kRing) {
      release_stage(empty, h0, lane);       // P0 V0 completed: keys 0-31 read
      mbar_wait(&full[h1], (it >> 1) & 1);  // keys 32-63's V
    }
    rescale_pv_slab<T>(o, a2_lo, a2_hi, sp, sv, kPTile);
    if (it + 1 < steps) nb_arrive<kConsumerThreads>(kBarP0Empty);
  }
  release_stage(empty, h1, lane);  // every wgmma of this warp that reads stage s (kRing: its keys 32-63) completed
}

// KF: K's (= V's) format, kNoQuant or kFP8 (k_codes_fp8), or kCodes (an FP8 cache: codes_to_values); PF: P's
// format (p_qdq). The unquantized problem (KF = PF = kNoQuant) runs schedule Q1 (q1_step): WG0 computes S of the
// whole step (36 x m64n64k16: Q read once per 64 keys instead of twice), both halves' maxima, P, factors and
// row-sum recurrences exactly as the seesaw's two warpgroups do (the same values, bit for bit: measured, NOTES
// "Q1"), publishes P (the slab) and the factors a1, a2 (smx0, smx1) on P0F; WG1 only accumulates O_R from the
// slab and arrives P0E once it read them (MX0 / H1F unused). Measured 0.92-0.95x the seesaw's time at 16 and 128
// heads; the quantized problems keep the seesaw (their P / K conversions are split over both warpgroups).
// kRing (config {"kernel": "ring4"}, decode_wgmma_ring4_kernel, unquantized only): the same Q1 step on a ring of
// four 32-key slots (each 64-key stage's keys 0-31 and 32-63: the same bytes as the 2-stage ring), full / empty per
// slot (+32 B of mbarriers: kSmemBytesRing): producer warps 8-9 fill keys 0-31 of every step, warps 10-11 keys 32-63,
// each pair on its own slots, and a slot is refilled as soon as both warpgroups' P V of its 32 keys completed
// (q1_step). The arithmetic is Q1's instruction for instruction: bit-equal. The body is a device function so that
// decode_wgmma_kernel<T, KF, PF> keeps its name (and SASS) and the ring gets a kernel of its own name.
template <typename T, int KF, int PF, bool kRing>
__device__ __forceinline__ void decode_wgmma_body(const DecodeParams& p, const CUtensorMap& kv_map, bool kv_tma) {
  static_assert(!kRing || (KF == kNoQuant && PF == kNoQuant), "ring4 runs schedule Q1 (unquantized) only");
  allow_combine_launch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sq = align1024(smem_raw);
  uint8_t* sk0 = sq + kTileBytes;
  uint8_t* sp = sq + 3 * kTileBytes;                      // P [64 heads x 64 keys], one swizzled slab
  float* smx0 = reinterpret_cast<float*>(sp + kHeads * 128);  // [64] half 0's row maxima (WG0 -> WG1)
  float* smx1 = smx0 + kHeads;                            // [64] half 1's row maxima (WG1 -> WG0)
  float* sl = smx1 + kHeads;                              // [2][64] final row sums
  uint32_t* s_valid = reinterpret_cast<uint32_t*>(sl + 2 * kHeads);  // [2 stages][4 producer warps]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_valid + 8);          // [2 stages] (kRing: [4 slots])
  uint64_t* empty = full + (kRing ? 4 : 2);                           // [2 stages] (kRing: [4 slots])
  uint64_t* landed = empty + 2;  // KF = kFP8: [2 stages][4 producer warps], the warp's TMA boxes of the stage
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);  // warp-uniform for the compiler
  const int head_groups = (p.heads + kHeads - 1) / kHeads;
  const int hg = blockIdx.x % head_groups;
  const int split = (blockIdx.x / head_groups) % p.num_splits;
  const int b = blockIdx.x / (head_groups * p.num_splits);

  const SplitKeys keys = split_keys(p, b, split, kPTile);  // the reference's schedule
  const int64_t lo = keys.lo, hi = keys.hi;
  const int steps = hi > lo ? static_cast<int>((hi - lo + kKeys - 1) / kKeys) : 0;

  if (tid == 0) {
    if constexpr (kRing) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        mbar_init(&full[i], kProducerThreads / 2);  // the two producer warps of the slot's half
        mbar_init(&empty[i], kConsumerThreads / 32);
      }
    } else {
      init_ring(full, empty);
      if constexpr (KF == kFP8) {
#pragma unroll
        for (int i = 0; i < 8; ++i) mbar_init(&landed[i], 32);  // the warp's 32 lanes (lane 0: + the boxes' bytes)
      }
    }
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    constexpr int kPerChunk = KF == kCodes ? 16 : 8;  // cache elements per 16 bytes
    const bool aligned = (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) &&
                         (p.cache_stride_page % kPerChunk == 0) && (p.cache_stride_tok % kPerChunk == 0);
    // Lane l < 16 looks up row 16 (warp - 8) + l of the next step while this step's copies are in flight.
    const int64_t row = 16 * (warp - 8) + (lane & 15);
    // kv_tma (KF = kNoQuant or kFP8): a warp whose 16 rows are all present loads them by TMA (produce_rows_tma);
    // lane 0 keeps its row's page for the boxes' coordinate. kNoQuant: the boxes complete full[s], the warp goes on
    // without waiting. kFP8: they complete the warp's landed[s]; after the next step's lookups the warp waits on it
    // (parity: bit s of landed_par, flipped at each use, as a warp whose rows are not all present skips it for a
    // step), converts its rows (k_codes_fp8: no cp.async group pending, its waits pass) and arrives on full[s] as
    // after cp.async.
    const bool tma = (KF == kNoQuant || KF == kFP8) && kv_tma;
    uint32_t landed_par = 0;
    int next_page = 0;
    int64_t next_off = steps > 0 && lane < 16 ? row_offset(p, b, lo + row, hi, next_page) : -1;
    const float k_inv = KF == kFP8 ? __frcp_rn(p.k_scale) : 1.f;
    // kRing: warps 8-9 (rows 0-31) fill slots 2s, warps 10-11 (rows 32-63) slots 2s + 1; otherwise the stage s
    const int half = kRing ? (warp - 8) >> 1 : 0;
    for (int i = 0; i < steps; ++i) {
      const int s = i & 1, slot = kRing ? 2 * s + half : s;
      if (i >= 2) mbar_wait(&empty[slot], ((i - 2) >> 1) & 1);
      bool by_tma = false;
      if constexpr (KF == kCodes) {
        produce_codes(p, next_off, sk0 + s * kTileBytes, s_valid + 4 * s + (warp - 8), warp - 8, lane, aligned);
      } else {
        const int in_page = static_cast<int>((lo + static_cast<int64_t>(i) * kKeys + 16 * (warp - 8)) &
                                             (p.page_size - 1));
        by_tma = tma && produce_rows_tma(&kv_map, next_off, __shfl_sync(0xffffffffu, next_page, 0), in_page,
                                         sk0 + s * kTileBytes, s_valid + 4 * s + (warp - 8),
                                         KF == kFP8 ? &landed[4 * s + (warp - 8)] : &full[slot], warp - 8, lane);
        if (!by_tma) {
          produce_rows<KF == kFP8>(p, next_off, sk0 + s * kTileBytes, s_valid + 4 * s + (warp - 8), warp - 8, lane,
                                   aligned);
        }
      }
      if (KF == kNoQuant && !by_tma) cp_async_commit();
      const int64_t next_tok = lo + static_cast<int64_t>(i + 1) * kKeys + row;
      next_off = i + 1 < steps && lane < 16 ? row_offset(p, b, next_tok, hi, next_page) : -1;
      if (KF == kNoQuant && by_tma) continue;
      if constexpr (KF == kFP8) {
        if (by_tma) {
          mbar_wait(&landed[4 * s + (warp - 8)], (landed_par >> s) & 1);
          landed_par ^= 1u << s;
        }
        k_codes_fp8<T>(p.k_scale, k_inv, smem_u32(sk0 + s * kTileBytes), warp - 8, lane);
      } else if constexpr (KF == kCodes) {
        codes_to_values<T>(smem_u32(sk0 + s * kTileBytes), warp - 8, lane);
      } else {
        cp_async_wait_all();
      }
      fence_proxy_async();
      mbar_arrive(&full[slot]);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp >> 2, t = tid & 127;
  const int row_lo = 16 * (t >> 5) + ((t & 31) >> 2);  // accumulator rows of this thread: row_lo, row_lo + 8
  const int h0 = hg * kHeads;                           // rows h0 + r >= heads are zero (padding)

  if (steps > 0) {  // Q rows of the head group, visible to wgmma
    const bool q_aligned = (reinterpret_cast<uintptr_t>(p.q) % 16 == 0) && (p.q_stride_b % 8 == 0) &&
                           (p.q_stride_h % 8 == 0);
    const uint16_t* q = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b + h0 * p.q_stride_h;
    for (int i = tid; i < kHeads * kChunks; i += kConsumerThreads) {
      const int r = i / kChunks, c = i % kChunks;
      const bool ok = h0 + r < p.heads;
      const uint16_t* src = ok ? q + r * p.q_stride_h + c * 8 : q;
      if (q_aligned) {
        cp_async16(sq + slab_off(r, c * 16), src, ok ? 16u : 0u);
      } else {
        uint16_t* dst = reinterpret_cast<uint16_t*>(sq + slab_off(r, c * 16));
        for (int e = 0; e < 8; ++e) dst[e] = ok ? src[e] : static_cast<uint16_t>(0);
      }
    }
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    nb_sync<kConsumerThreads>(kBarAll);
  }

  float o[128];
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] = 0.f;
  // Running max (log2 domain, both warpgroups alike) and this warpgroup's row sum (this thread's 8 of 32 keys).
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.f, l_hi = 0.f;
  constexpr bool kQ1 = KF == kNoQuant && PF == kNoQuant;  // schedule Q1 (above)
  float l1_lo = 0.f, l1_hi = 0.f;  // Q1: WG0 also keeps the seesaw's WG1 row sum (l_1)
  for (int it = 0; it < steps; ++it) {
    const int s = it & 1;
    const uint8_t* sk = sk0 + s * kTileBytes;
    const uint8_t* sv = sk + wg * 4 * kKeys * 128;  // this warpgroup's V columns: slabs 4 wg .. 4 wg + 3
    if constexpr (kQ1) {
      q1_step<T, kRing>(p, o, sq, sk, sv, sp, smx0, smx1, s_valid + 4 * s, full, empty, it, steps, wg, t, lane,
                        row_lo, m_lo, m_hi, l_lo, l_hi, l1_lo, l1_hi);
      continue;
    }

    // S of this warpgroup's half (rows 32 wg.. of every K slab).
    float sc[16];
    begin_step(sc, full, it);
    s_product<T>(sc, sq, sk + wg * kPTile * 128);

    const uint32_t valid = s_valid[4 * s + 2 * wg] | (s_valid[4 * s + 2 * wg + 1] << 16);  // this half's keys
    float mx_lo = -INFINITY, mx_hi = -INFINITY;
#pragma unroll
    for (int j = 0; j < 16; ++j) {
      const int key = 8 * (j >> 2) + 2 * (t & 3) + (j & 1);
      const float x = (valid >> key) & 1u ? sc[j] * p.qk_scale_log2 : -INFINITY;
      sc[j] = x;
      if (j & 2) mx_hi = fmaxf(mx_hi, x); else mx_lo = fmaxf(mx_lo, x);
    }
    quad_max(mx_lo, mx_hi);

    uint32_t a[2][4];  // this half's P as the RS A operand
    if (wg == 0) {
      store_row_pair(smx0, row_lo, t, mx_lo, mx_hi);
      nb_arrive<kConsumerThreads>(kBarMx0);
      const float m1_lo = fmaxf(m_lo, mx_lo), m1_hi = fmaxf(m_hi, mx_hi);
      const float z1_lo = finite_or_zero(m1_lo), z1_hi = finite_or_zero(m1_hi);
      const float a1_lo = ex2(m_lo - z1_lo), a1_hi = ex2(m_hi - z1_hi);
      float sum_lo, sum_hi;
      exponentiate(sc, m1_lo, m1_hi, sum_lo, sum_hi);
      p_qdq<T, PF>(p, sc);  // the row sums are of the float32 P
      p_fragments<T>(sc, a);
      if (it > 0) nb_sync<kConsumerThreads>(kBarP0Empty);  // WG1's P0 V0 of the previous step read the slab
      store_p(sp, a, row_lo, 0, t);
      fence_proxy_async();
      nb_arrive<kConsumerThreads>(kBarP0Full);
      rescale(o, a1_lo, a1_hi);
      wg_fence();
      pv_regs<T>(o, a, sv, 0);
      wg_commit();
      nb_sync<kConsumerThreads>(kBarH1Full);  // WG1's P1 and half 1's maxima
      const float m2_lo = fmaxf(m1_lo, smx1[row_lo]), m2_hi = fmaxf(m1_hi, smx1[row_lo + 8]);
      const float a2_lo = ex2(m1_lo - finite_or_zero(m2_lo)), a2_hi = ex2(m1_hi - finite_or_zero(m2_hi));
      l_lo = (l_lo * a1_lo + sum_lo) * a2_lo;
      l_hi = (l_hi * a1_hi + sum_hi) * a2_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      wg_wait<0>();
      reg_fence(o);
      rescale_pv_slab<T>(o, a2_lo, a2_hi, sp, sv, 32);
    } else {
      nb_sync<kConsumerThreads>(kBarMx0);  // WG0's half-0 maxima
      const float m1_lo = fmaxf(m_lo, smx0[row_lo]), m1_hi = fmaxf(m_hi, smx0[row_lo + 8]);
      const float m2_lo = fmaxf(m1_lo, mx_lo), m2_hi = fmaxf(m1_hi, mx_hi);
      const float z2_lo = finite_or_zero(m2_lo), z2_hi = finite_or_zero(m2_hi);
      const float a1_lo = ex2(m_lo - finite_or_zero(m1_lo)), a1_hi = ex2(m_hi - finite_or_zero(m1_hi));
      const float a2_lo = ex2(m1_lo - z2_lo), a2_hi = ex2(m1_hi - z2_hi);
      float sum_lo, sum_hi;
      exponentiate(sc, m2_lo, m2_hi, sum_lo, sum_hi);
      l_lo = (l_lo * a1_lo) * a2_lo + sum_lo;
      l_hi = (l_hi * a1_hi) * a2_hi + sum_hi;
      m_lo = m2_lo;
      m_hi = m2_hi;
      p_qdq<T, PF>(p, sc);
      p_fragments<T>(sc, a);
      store_p(sp, a, row_lo, kPTile, t);
      store_row_pair(smx1, row_lo, t, mx_lo, mx_hi);
      fence_proxy_async();
      nb_arrive<kConsumerThreads>(kBarH1Full);
      rescale(o, a1_lo, a1_hi);
      nb_sync<kConsumerThreads>(kBarP0Full);  // WG0's P0
      wg_fence();
      pv_slab<T>(o, sp, sv, 0);
      wg_commit();
      wg_wait<0>();
      reg_fence(o);
      if (it + 1 < steps) nb_arrive<kConsumerThreads>(kBarP0Empty);
      rescale_pv_regs<T>(o, a2_lo, a2_hi, a, sv, 32);
    }
    release_stage(empty, s, lane);  // every wgmma of this warp that reads stage s has completed
  }

  // Row sums: over the quad, then l = l_0 + l_1 (the same order in both warpgroups; Q1: WG0 stores both).
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, d);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, d);
    if constexpr (kQ1) {
      l1_lo += __shfl_xor_sync(0xffffffffu, l1_lo, d);
      l1_hi += __shfl_xor_sync(0xffffffffu, l1_hi, d);
    }
  }
  if ((t & 3) == 0 && (!kQ1 || wg == 0)) {
    sl[wg * kHeads + row_lo] = l_lo;
    sl[wg * kHeads + row_lo + 8] = l_hi;
    if constexpr (kQ1) {
      sl[kHeads + row_lo] = l1_lo;
      sl[kHeads + row_lo + 8] = l1_hi;
    }
  }
  nb_sync<kConsumerThreads>(kBarAll);
  const float lt_lo = sl[row_lo] + sl[kHeads + row_lo], lt_hi = sl[row_lo + 8] + sl[kHeads + row_lo + 8];
  // out_scale (v_scale * p_scale, or kv_scale * p_scale: the factors left out of the codes) / l; an empty row: 0
  const float num = KF != kNoQuant || PF != kNoQuant ? p.out_scale : 1.f;
  const float inv_lo = lt_lo == 0.f ? 0.f : num / lt_lo, inv_hi = lt_hi == 0.f ? 0.f : num / lt_hi;
  if (h0 + row_lo >= p.heads) return;  // padding rows (rows hi = lo + 8 of the same warp are padding too then)
  const bool store_hi = h0 + row_lo + 8 < p.heads;
  const int64_t g_lo = static_cast<int64_t>(b) * p.heads + h0 + row_lo, g_hi = g_lo + 8;
  if (wg == 0 && (t & 3) == 0) {
    // an empty row (l == 0) gives -inf; a NaN read within the length propagates, as in the reference
    const float lse_lo = lt_lo == 0.f ? -INFINITY : (m_lo + log2f(lt_lo)) * kLn2;
    const float lse_hi = lt_hi == 0.f ? -INFINITY : (m_hi + log2f(lt_hi)) * kLn2;
    if (p.num_splits > 1) {
      p.part_lse[g_lo * p.num_splits + split] = lse_lo;
      if (store_hi) p.part_lse[g_hi * p.num_splits + split] = lse_hi;
    } else if (p.lse != nullptr) {
      p.lse[g_lo] = lse_lo;
      if (store_hi) p.lse[g_hi] = lse_hi;
    }
  }
  const int col0 = wg * 256 + 2 * (t & 3);
  if (p.num_splits > 1) {
    store_rows(p.part_o + (g_lo * p.num_splits + split) * kNope + col0,
               p.part_o + (g_hi * p.num_splits + split) * kNope + col0, o, inv_lo, inv_hi, store_hi);
  } else if (p.out_dtype == kFP32) {
    float* out = static_cast<float*>(p.out);
    store_rows(out + g_lo * kNope + col0, out + g_hi * kNope + col0, o, inv_lo, inv_hi, store_hi);
  } else if (p.out_dtype == kBF16) {
    __nv_bfloat16* out = static_cast<__nv_bfloat16*>(p.out);
    store_rows(out + g_lo * kNope + col0, out + g_hi * kNope + col0, o, inv_lo, inv_hi, store_hi);
  } else {
    __half* out = static_cast<__half*>(p.out);
    store_rows(out + g_lo * kNope + col0, out + g_hi * kNope + col0, o, inv_lo, inv_hi, store_hi);
  }
}
template <typename T, int KF, int PF>
__global__ void __launch_bounds__(kThreads, 1)
    decode_wgmma_kernel(const DecodeParams p, const __grid_constant__ CUtensorMap kv_map, int kv_tma) {
  decode_wgmma_body<T, KF, PF, false>(p, kv_map, kv_tma != 0);
}
// Config ring4: schedule Q1 on four 32-key ring slots (decode_wgmma_body's kRing), unquantized bf16 / fp16.
template <typename T>
__global__ void __launch_bounds__(kThreads, 1)
    decode_wgmma_ring4_kernel(const DecodeParams p, const __grid_constant__ CUtensorMap kv_map, int kv_tma) {
  decode_wgmma_body<T, kNoQuant, kNoQuant, true>(p, kv_map, kv_tma != 0);
}

// ---- An FP8 cache at <= 16 heads: keys as the wgmma M (decode_t_kernel) ----
// The seesaw kernel pays 64 wgmma rows a step whatever the head count (48 of 64 padding at 16 heads) and, for an FP8
// cache, converts each stage in shared memory. Here the 64 keys of a step are the M of m64n16k16 and the 16 heads
// its N: S^T = K Q^T with K's codes converted in the consumers' registers into A fragments, O^T = V^T P^T with V's
// codes alike; the ring holds only codes (4 stages of [64 rows x 576 B], the producer warpgroup copies them, one
// bulk copy a row completing on full[s], so several stages are in flight: produce_codes_t), Q^T and P^T are the B
// operands (one 16-row 128-byte-swizzled slab per 64 columns / keys). Both products run on f16 whatever q's dtype (a
// code is exact in f16: no widening to bf16): bf16 q as f16(q * 2^s) per head (q_scale_t), P^T as f16 of P rounded
// to q's dtype (p_f16_bits). The two consumer warpgroups take alternate steps (WG c: steps c, c + 2, ...), each an
// online softmax of its own (running max per 64-key step), merged at the end. Contraction orders inside a k16 step
// are permuted so each thread's codes are contiguous bytes (t_qcol, t_pkey); the output columns follow the thread's
// 16 contiguous latent columns (t_vcol).
// Checked on the CPU by benchmarks/probes/decode_fp8_cache_t_check.py (the same index formulas).
constexpr int kHeadsT = 16;                       // heads per CTA: the wgmma N
constexpr int kStagesT = 4;                       // code stages (two in flight per consumer warpgroup)
constexpr int kStageBytesT = kKeys * kDim;        // 36,864 B: 64 code rows of 576 B, row after row
constexpr int kSlabT = kHeadsT * 128;             // one [16 rows x 128 B] B-operand slab (64 columns / keys)
constexpr int kBarT0 = 6;                         // named barriers 6, 7: consumer warpgroup 0's, 1's 128 threads
constexpr int kSmemBytesT = 9 * kSlabT            // Q^T
                            + 2 * kSlabT          // P^T, one slab per consumer warpgroup
                            + kStagesT * kStageBytesT
                            + 2 * 4 * kHeadsT * 4  // [2 warpgroups][4 warps] step maxima, then row sums
                            + 2 * kHeadsT * 4      // [2 warpgroups] running maxima (the merge)
                            + kStagesT * 4 * 4     // [4 stages][4 producer warps] validity bits
                            + 2 * kStagesT * 8     // mbarriers full[4], empty[4]
                            + 1024;                // alignment slack

// Byte offset of (row, byte) in a run of 16-row B-operand slabs (the 128-byte swizzle of slab_off).
__device__ __forceinline__ uint32_t t_off(uint32_t row, uint32_t byte) {
  return (byte >> 7) * kSlabT + row * 128u + ((((byte >> 4) & 7u) ^ (row & 7u)) << 4) + (byte & 15u);
}
// K-major B descriptor (16 rows), the k16 step `kbyte` bytes into each row.
__device__ __forceinline__ uint64_t t_desc(const uint8_t* s, uint32_t kbyte) {
  return make_desc(smem_u32(s) + (kbyte >> 7) * kSlabT + (kbyte & 127u), 16u, 1024u);
}
// The physical (cache) column of Q^T's logical column L: in the k16 step u of 64-column block L / 64, thread q's
// A fragment holds logical columns (2q, 2q + 1, 2q + 8, 2q + 9) = its codes at 64 (L / 64) + 16 q + 4 u + 0..3.
__device__ __forceinline__ int t_qcol(int L) {
  const int x = L & 15;
  return (L & ~63) + 16 * ((x & 7) >> 1) + 4 * ((L >> 4) & 3) + (x & 1) + 2 * (x >> 3);
}
// The logical key (P^T's column) of the stage's physical key row pk: in k16 step pk / 16, thread q's A fragment
// holds logical keys (2q, 2q + 1, 2q + 8, 2q + 9) = its load slots j = 0..3 = rows 16 (pk / 16) + 4 q + (j ^ (q & 1))
// (pv_t_load: an odd q takes its rows pairwise swapped).
__device__ __forceinline__ int t_pkey(int pk) {
  const int q = (pk & 15) >> 2, j = (pk & 3) ^ (q & 1);
  return (pk & ~15) + 2 * q + (j & 1) + 8 * (j >> 1);
}
// (The latent column of O^T's row R of M tile mt, for the thread whose rows are R = 16 w + g and R + 8: 16 (8 w +
// g) + 2 mt + (R's half): each thread's 16 columns are contiguous, t_vcol in the check.)

// m64n16k16, A from registers (the m64k16 fragment of pv_rs), B = a K-major 16-row operand; D f32 (8 a thread).
template <typename T>
__device__ __forceinline__ void wgmma_t(float (&d)[8], const uint32_t (&a)[4], uint64_t db, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
                 "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
  }
}

// Producer warp w's share of a step: the codes of rows 16 w .. 16 w + 15 to rows of the stage `st` (576 B each),
// lane l < 16 holding row 16 w + l's offset (row_offset: bytes); an absent key's row is zeros, its validity bit 0.
// Each producer thread arrives on `full` once. `aligned` (16-byte rows and base): bulk copies that complete on
// `full` (the issuing lane's arrive.expect_tx of their bytes first), so the warp moves on to the next stage without
// waiting: the 16 rows as one copy of 9,216 B when they are present and contiguous in the cache (a page's run),
// else lane l < 16 its own row; an absent row is 36 zero stores, then fence.proxy.async (a later bulk copy of this
// thread writes the same bytes). Else byte loads and stores by the whole warp before each lane's arrive.
__device__ __forceinline__ void produce_codes_t(const DecodeParams& p, int64_t my_off, uint8_t* st, uint32_t* valid,
                                                uint64_t* full, int w, int lane, bool aligned) {
  const uint32_t bits = __ballot_sync(0xffffffffu, lane < 16 && my_off >= 0);
  if (lane == 0) *valid = bits;
  const uint8_t* cache = static_cast<const uint8_t*>(p.cache);
  uint8_t* dst = st + 16 * w * kDim;
  const int64_t off0 = __shfl_sync(0xffffffffu, my_off, 0);
  const bool run = __all_sync(0xffffffffu, lane >= 16 || (my_off >= 0 && my_off == off0 + lane * kDim));
  if (aligned && run) {
    if (lane == 0) {
      mbar_arrive_expect_tx(full, 16 * kDim);
      bulk_copy(dst, cache + off0, 16 * kDim, full);
    } else {
      mbar_arrive(full);
    }
  } else if (aligned) {
    if (lane < 16 && my_off >= 0) {
      mbar_arrive_expect_tx(full, kDim);
      bulk_copy(dst + lane * kDim, cache + my_off, kDim, full);
    } else {
      if (lane < 16) {
        const uint32_t row = smem_u32(dst + lane * kDim);
#pragma unroll 1
        for (int c = 0; c < kDim / 16; ++c) st_shared16(row + 16 * c, make_uint4(0u, 0u, 0u, 0u));
        fence_proxy_async();
      }
      mbar_arrive(full);
    }
  } else {
#pragma unroll 1
    for (int i = lane; i < 16 * kDim; i += 32) {  // every lane takes part in each shuffle
      const int r = i / kDim, c = i % kDim;
      const int64_t off = __shfl_sync(0xffffffffu, my_off, r);
      dst[r * kDim + c] = off >= 0 ? cache[off + c] : 0;
    }
    mbar_arrive(full);
  }
}

// bf16 q on f16 tensor cores, per head: Q^T holds f16(q * 2^s), s = 142 - E clamped to [-113, 126], E the exponent
// field of the head's largest |q| (`bits`: its bf16 bits without the sign): the largest lands in [2^15, 2^16), below
// f16's 65504; every element within 29 binades of it is exact (f16 normal), smaller ones round to f16's 2^-24 steps
// (<= 2^-40 of the largest; 2^-25 if it is below 2^-111); NaN and inf stay. The products with codes are exact and
// scale-free, so S^T * 2^-s (exact unless it underflows float) is the bf16 S^T. Returns 2^s (`inverse`: 2^-s).
__device__ __forceinline__ float q_scale_t(uint32_t bits, bool inverse) {
  const int s = min(max(142 - static_cast<int>(bits >> 7), -113), 126);
  return __uint_as_float(static_cast<uint32_t>(127 + (inverse ? -s : s)) << 23);
}

// S^T of a step (keys 16 w + g, + 8 of the stage `st` x the 16 heads of Q^T at `sqt`, f16: q_scale_t) into sc: per
// 64-column block two LDS.128 (the thread's 16 codes of each of its two keys, the next block's loaded before this
// one's wgmma), 8 conversions, 4 wgmma; one group per block; even blocks accumulate in sc, odd ones in a second
// accumulator (two dependent wgmma chains in flight instead of one), summed at the end; waited for.
__device__ __forceinline__ void s_t_product(float (&sc)[8], uint32_t st, const uint8_t* sqt, int w, int g, int q) {
  float s1[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) s1[j] = 0.f;
  reg_fence(s1);
  const uint32_t lo = st + (16 * w + g) * kDim + 16 * q, hi = lo + 8 * kDim;
  uint4 nlo = ld_shared16(lo), nhi = ld_shared16(hi);
#pragma unroll
  for (int blk = 0; blk < kDim / 64; ++blk) {
    const uint4 clo = nlo, chi = nhi;
    uint32_t a[4][4];
    e4m3x4_to<__half>(clo.x, a[0][0], a[0][2]);
    e4m3x4_to<__half>(chi.x, a[0][1], a[0][3]);
    e4m3x4_to<__half>(clo.y, a[1][0], a[1][2]);
    e4m3x4_to<__half>(chi.y, a[1][1], a[1][3]);
    e4m3x4_to<__half>(clo.z, a[2][0], a[2][2]);
    e4m3x4_to<__half>(chi.z, a[2][1], a[2][3]);
    e4m3x4_to<__half>(clo.w, a[3][0], a[3][2]);
    e4m3x4_to<__half>(chi.w, a[3][1], a[3][3]);
    if (blk + 1 < kDim / 64) {
      nlo = ld_shared16(lo + 64 * (blk + 1));
      nhi = ld_shared16(hi + 64 * (blk + 1));
    }
    wg_fence();
#pragma unroll
    for (int u = 0; u < 4; ++u)
      wgmma_t<__half>((blk & 1) ? s1 : sc, a[u], t_desc(sqt, 2 * (64 * blk + 16 * u)), blk > 1 || u > 0);
    wg_commit();
    wg_wait<1>();  // the previous block's fragments free (two blocks in flight)
  }
  wg_wait<0>();
  reg_fence(sc);
  reg_fence(s1);
#pragma unroll
  for (int j = 0; j < 8; ++j) sc[j] += s1[j];
}

// P's element as P·V's f16 operand: rounded to T first (numerics: P enters P·V in q's dtype), then to f16, which
// holds every bf16 value of P (<= 1) from 2^-14 up exactly (8 significant bits of 11); below 2^-14 f16's subnormals
// round it to 2^-24 steps (<= 2^-25 off, against P's row maximum 1). So P·V runs on f16 whatever q's dtype: V's
// codes enter as the f16 pairs the hardware converts them to, without the widening to bf16 (e4m3x4_to).
template <typename T>
__device__ __forceinline__ uint16_t p_f16_bits(float x) {
  const float r = std::is_same_v<T, __half> ? x : __bfloat162float(__float2bfloat16_rn(x));
  return __half_as_ushort(__float2half_rn(r));
}

// The 4 LDS.128 of P·V's k16 step u: slot j = the thread's key row 16 u + 4 q + (j ^ (q & 1)), its 16 latent
// columns 16 (8 w + g) ..; `be` / `bo` = the thread's base (st + 16 (8 w + g) + 4 q kDim) + / - kDim (q & 1) for the
// even / odd slots. A quarter warp (g = 2k, 2k + 1; q = 0..3) then reads rows of both parities (a row is 576 B, 64
// banks' bytes mod 128 apart): 4 distinct 16-byte bank groups, 2-way conflicts (8 wavefronts an LDS.128, the least
// with 576-B rows) instead of 4-way (16) when every q read the same parity.
__device__ __forceinline__ void pv_t_load(uint4 (&v)[4], uint32_t be, uint32_t bo, int u) {
#pragma unroll
  for (int j = 0; j < 4; ++j) v[j] = ld_shared16(((j & 1) ? bo : be) + (16 * u + j) * kDim);
}

// O^T += V^T P^T of a step, on f16 (P^T's f16 at `spt`: p_f16_bits): k16 step u converts the thread's 4 code
// rows `v` (pv_t_load; step 0's loaded by the caller), bytes transposed by PRMT into code pairs of one column, 8 M
// tiles of 64 columns. Half of step u + 1's rows are loaded right after step u's wgmma, before the wait for step
// u - 1's, the other half after it; after the last loads lane 0 releases the stage (`empty`). Waited for.
__device__ __forceinline__ void pv_t_product(float (&o)[64], uint4 (&v)[4], uint32_t be, uint32_t bo,
                                             const uint8_t* spt, uint64_t* empty, int lane) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
    uint32_t a[8][4];
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      const int k = mt >> 1;
      const uint32_t sel = (mt & 1) ? 0x7362u : 0x5140u;  // bytes (2 mt, 2 mt + 1) of two keys' words, interleaved
      const uint32_t w0 = (&v[0].x)[k], w1 = (&v[1].x)[k], w2 = (&v[2].x)[k], w3 = (&v[3].x)[k];
      e4m3x4_to<__half>(__byte_perm(w0, w1, sel), a[mt][0], a[mt][1]);
      e4m3x4_to<__half>(__byte_perm(w2, w3, sel), a[mt][2], a[mt][3]);
    }
    wg_fence();
#pragma unroll
    for (int mt = 0; mt < 8; ++mt) {
      float(&d)[8] = *reinterpret_cast<float(*)[8]>(o + 8 * mt);
      wgmma_t<__half>(d, a[mt], t_desc(spt, 32 * u), 1);
    }
    wg_commit();
    if (u + 1 < 4) v[0] = ld_shared16(be + (16 * (u + 1)) * kDim);  // half of step u + 1's rows before the wait
    if (u + 1 < 4) v[1] = ld_shared16(bo + (16 * (u + 1) + 1) * kDim);
    wg_wait<1>();
    if (u + 1 < 4) {
      v[2] = ld_shared16(be + (16 * (u + 1) + 2) * kDim);
      v[3] = ld_shared16(bo + (16 * (u + 1) + 3) * kDim);
      if (u + 1 == 3) {  // the step's codes are all loaded
        __syncwarp();
        if (lane == 0) mbar_arrive(empty);
      }
    }
  }
  wg_wait<0>();
  reg_fence(o);
}

// This thread's head k (0-3) of the m64n16 accumulator layout: column 8 (k / 2) + 2 q + k % 2; element i of an M
// tile belongs to head (i / 4) * 2 + i % 2, row half (i / 2) % 2.
__device__ __forceinline__ int t_head(int k, int q) { return 8 * (k >> 1) + 2 * q + (k & 1); }

// %ctaid.x read anew: asm volatile is not merged with an earlier read, so what derives from it is recomputed.
__device__ __forceinline__ int cta_x() {
  int x;
  asm volatile("mov.u32 %0, %%ctaid.x;\n" : "=r"(x));
  return x;
}

// The end of a keys-as-M kernel (decode_t_kernel, decode_km_kernel), both consumer warpgroups: each one's row sums
// (over the thread's 8 lanes of one q, then its 4 warps: sred [2][4][16]) and running maxima (smx [2][16]) and
// warpgroup 1's O^T (64 x 128 floats at `ot`: stage 1, free after warpgroup 1's last step) to shared memory; then
// warpgroup 0 merges the two online softmaxes into its o and returns true with the output factor (out_scale / l; 0
// for a row without keys) and the LSE (natural log; -inf) of its heads t_head(k, q); warpgroup 1 returns false.
__device__ __forceinline__ bool km_merge(const DecodeParams& p, float (&o)[64], const float (&m)[4], float (&l)[4],
                                         float* sred, float* smx, float* ot, int wg, int w, int g, int q, int t,
                                         float (&inv)[4], float (&lse)[4]) {
  float* red = sred + wg * 4 * kHeadsT;
  // Row sums over the thread's 8 lanes of one q, then the 4 warps; warpgroup 1's state to shared memory
#pragma unroll
  for (int d = 4; d <= 16; d <<= 1)
#pragma unroll
    for (int k = 0; k < 4; ++k) l[k] += __shfl_xor_sync(0xffffffffu, l[k], d);
  if (g == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      red[w * kHeadsT + t_head(k, q)] = l[k];
      if (w == 0) smx[wg * kHeadsT + t_head(k, q)] = m[k];
    }
  }
  if (wg == 1) {
    nb_sync<128>(kBarT0 + 1);  // every warp's last reads of stage 1 (`ot`) done
#pragma unroll
    for (int j = 0; j < 64; ++j) ot[j * 128 + t] = o[j];
  }
  nb_sync<kConsumerThreads>(kBarAll);
  if (wg == 1) return false;
  float f0[4], f1[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int hk = t_head(k, q);
    const float l0 = (sred[hk] + sred[kHeadsT + hk]) + (sred[2 * kHeadsT + hk] + sred[3 * kHeadsT + hk]);
    const float* r1 = sred + 4 * kHeadsT;
    const float l1 = (r1[hk] + r1[kHeadsT + hk]) + (r1[2 * kHeadsT + hk] + r1[3 * kHeadsT + hk]);
    const float m1 = smx[kHeadsT + hk], mt = fmaxf(m[k], m1), zt = finite_or_zero(mt);
    f0[k] = ex2(m[k] - zt);
    f1[k] = ex2(m1 - zt);
    const float lt = l0 * f0[k] + l1 * f1[k];
    inv[k] = lt == 0.f ? 0.f : p.out_scale / lt;
    lse[k] = lt == 0.f ? -INFINITY : (mt + log2f(lt)) * kLn2;
  }
#pragma unroll
  for (int j = 0; j < 64; ++j) {
    const int k = ((j & 7) >> 2) * 2 + (j & 1);
    o[j] = o[j] * f0[k] + ot[j * 128 + t] * f1[k];
  }
  return true;
}

// The keys-as-M consumers' state (decode_t_kernel, decode_km_kernel) before the first step: O^T (64 floats, 8 per
// M tile) zero; m (running max, log2 domain) -inf and l (row sums) 0 for this thread's 4 heads t_head(k, q).
__device__ __forceinline__ void km_init(float (&o)[64], float (&m)[4], float (&l)[4]) {
#pragma unroll
  for (int j = 0; j < 64; ++j) o[j] = 0.f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.f;
  }
}

// A keys-as-M consumer's S^T of one step to the log2 domain: element i (keys 16 w + g when i % 4 < 2, else + 8;
// head k = (i / 4) * 2 + i % 2, i.e. t_head(k, q)) becomes score(i, k) * qk_scale_log2, or -inf for a key that does
// not exist (ok_lo / ok_hi); mx[k] the thread's max of head k over its 2 keys.
template <typename Score>
__device__ __forceinline__ void km_scores(float (&sc)[8], float (&mx)[4], Score score, bool ok_lo, bool ok_hi,
                                          float qk_scale_log2) {
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int k = (i >> 2) * 2 + (i & 1);
    const float x = ((i & 2) ? ok_hi : ok_lo) ? score(i, k) * qk_scale_log2 : -INFINITY;
    sc[i] = x;
    mx[k] = (i & 2) ? fmaxf(mx[k], x) : x;
  }
}

// The maxima of one step of a keys-as-M consumer (decode_t_kernel, decode_km_kernel): mx[k], this thread's max of
// head t_head(k, q) over its 2 keys (log2 domain), over the 8 lanes of one q (shuffles), then written to `red`
// ([4 warps][16 heads] floats) by lane g 0, before the warpgroup's named barrier kBarT0 + wg (which also orders every
// warp's previous P V product before this step's P^T is written).
__device__ __forceinline__ void km_warp_max(float (&mx)[4], float* red, int wg, int w, int g, int q) {
#pragma unroll
  for (int d = 4; d <= 16; d <<= 1)
#pragma unroll
    for (int k = 0; k < 4; ++k) mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], d));
  if (g == 0) {
#pragma unroll
    for (int k = 0; k < 4; ++k) red[w * kHeadsT + t_head(k, q)] = mx[k];
  }
  nb_sync<128>(kBarT0 + wg);
}

// The step's new maxima of a keys-as-M consumer, after km_warp_max and the barrier: for head t_head(k, q) the max
// over the 4 warps' (in `red`) and the running max m[k] (log2 domain); z[k] the new max (0 when -inf: exponents
// stay finite), a[k] = 2^(m[k] - z[k]) the old terms' factor; m[k] becomes the new max.
__device__ __forceinline__ void km_new_max(float (&m)[4], float (&a)[4], float (&z)[4], const float* red, int q) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int hk = t_head(k, q);
    const float mk = fmaxf(fmaxf(red[hk], red[kHeadsT + hk]), fmaxf(red[2 * kHeadsT + hk], red[3 * kHeadsT + hk]));
    const float mn = fmaxf(m[k], mk);
    z[k] = finite_or_zero(mn);
    a[k] = ex2(m[k] - z[k]);
    m[k] = mn;
  }
}

// P of one step of a keys-as-M consumer: sc (S^T scaled to the log2 domain, element i of head (i / 4) * 2 + i % 2)
// becomes 2^(sc - z[k]) and l[k], the running row sum, l[k] a[k] + the 2 new terms.
__device__ __forceinline__ void km_exp(float (&sc)[8], const float (&z)[4], const float (&a)[4], float (&l)[4]) {
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int ilo = (k >> 1) * 4 + (k & 1);
    const float plo = ex2(sc[ilo] - z[k]), phi = ex2(sc[ilo + 2] - z[k]);
    sc[ilo] = plo;
    sc[ilo + 2] = phi;
    l[k] = l[k] * a[k] + (plo + phi);
  }
}

// O^T (64 floats: element j's head t_head((j % 8 / 4) * 2 + j % 2, q)) times the step's factors a, skipped when
// every lane's 4 factors are 1.
__device__ __forceinline__ void km_rescale(float (&o)[64], const float (&a)[4]) {
  if (__any_sync(0xffffffffu, a[0] != 1.f || a[1] != 1.f || a[2] != 1.f || a[3] != 1.f)) {
#pragma unroll
    for (int j = 0; j < 64; ++j) o[j] *= a[((j & 7) >> 2) * 2 + (j & 1)];
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) decode_t_kernel(const DecodeParams p) {
  allow_combine_launch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sqt = align1024(smem_raw);                 // Q^T: 9 slabs [16 heads x 128 B]
  uint8_t* spt = sqt + 9 * kSlabT;                    // P^T: [2 warpgroups] one slab [16 heads x 64 keys]
  uint8_t* sst = spt + 2 * kSlabT;                    // code stages [4][64 rows x 576 B]
  float* sred = reinterpret_cast<float*>(sst + kStagesT * kStageBytesT);  // [2][4 warps][16]
  float* smx = sred + 2 * 4 * kHeadsT;                                     // [2][16]
  uint32_t* s_valid = reinterpret_cast<uint32_t*>(smx + 2 * kHeadsT);     // [4 stages][4 producer warps]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_valid + kStagesT * 4);   // [4]
  uint64_t* empty = full + kStagesT;                                       // [4]
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int head_groups = (p.heads + kHeadsT - 1) / kHeadsT;
  const int hg = blockIdx.x % head_groups;
  const int split = (blockIdx.x / head_groups) % p.num_splits;
  const int b = blockIdx.x / (head_groups * p.num_splits);

  const SplitKeys keys = split_keys(p, b, split, kPTile);
  const int64_t lo = keys.lo, hi = keys.hi;
  const int steps = hi > lo ? static_cast<int>((hi - lo + kKeys - 1) / kKeys) : 0;

  if (tid == 0) {
    for (int s = 0; s < kStagesT; ++s) {
      mbar_init(&full[s], kProducerThreads);  // every producer thread once a step (+ its row's bytes: expect_tx)
      mbar_init(&empty[s], 4);  // the 4 warps of the stage's consumer warpgroup (s % 2)
    }
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: copies only
    setmaxnreg_dec<kProducerRegs>();
    const bool aligned = (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) && (p.cache_stride_page % 16 == 0) &&
                         (p.cache_stride_tok % 16 == 0);
    const int64_t row = 16 * (warp - 8) + (lane & 15);
    int64_t next_off = steps > 0 && lane < 16 ? row_offset(p, b, lo + row, hi) : -1;
    for (int i = 0; i < steps; ++i) {
      const int s = i % kStagesT;
      if (i >= kStagesT) mbar_wait(&empty[s], ((i - kStagesT) / kStagesT) & 1);
      produce_codes_t(p, next_off, sst + s * kStageBytesT, s_valid + 4 * s + (warp - 8), &full[s], warp - 8, lane,
                      aligned);
      const int64_t next_tok = lo + static_cast<int64_t>(i + 1) * kKeys + row;
      next_off = i + 1 < steps && lane < 16 ? row_offset(p, b, next_tok, hi) : -1;
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp >> 2, w = warp & 3, t = tid & 127, g = lane >> 2, q = lane & 3;
  const int h0 = hg * kHeadsT;

  float hs[4] = {1.f, 1.f, 1.f, 1.f};  // bf16 q: 2^-s of the thread's heads t_head(k, q) (Q^T on f16: q_scale_t)
  if (steps > 0) {  // Q^T: heads h0.. (zero past p.heads), logical column L from cache column t_qcol(L)
    // every load issued before the first store (one memory latency, not one a round)
    constexpr int kRounds = kHeadsT * kDim / 2 / kConsumerThreads;
    static_assert(kRounds * kConsumerThreads == kHeadsT * kDim / 2, "Q^T pairs split evenly over the consumers");
    static_assert((kDim / 2) % 32 == 0, "a warp's 32 pairs of a round belong to one head");
    const uint16_t* qg = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b + h0 * p.q_stride_h;
    // (a head past p.heads reads the last head's row, in bounds, and stores zeros: no branch between the loads)
    uint16_t lo[kRounds], hi[kRounds];
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      const int i = tid + k * kConsumerThreads, h = i / (kDim / 2), L = 2 * (i - h * (kDim / 2));
      const uint16_t* src = qg + min(h, p.heads - 1 - h0) * p.q_stride_h + t_qcol(L);  // t_qcol(L + 1) = .. + 1
      lo[k] = src[0];
      hi[k] = src[1];
    }
    uint32_t* qmax = reinterpret_cast<uint32_t*>(smx);  // [16] bf16 q: each head's largest |q| bits (until the loop)
    if constexpr (!std::is_same_v<T, __half>) {
      if (tid < kHeadsT) qmax[tid] = 0u;
      nb_sync<kConsumerThreads>(kBarAll);
#pragma unroll
      for (int k = 0; k < kRounds; ++k) {
        const int h = (tid + k * kConsumerThreads) / (kDim / 2);
        const uint32_t mk = h0 + h < p.heads ? max(lo[k] & 0x7fffu, hi[k] & 0x7fffu) : 0u;
        const uint32_t mw = __reduce_max_sync(0xffffffffu, mk);
        if (lane == 0) atomicMax(qmax + h, mw);
      }
      nb_sync<kConsumerThreads>(kBarAll);
#pragma unroll
      for (int k = 0; k < 4; ++k) hs[k] = q_scale_t(qmax[t_head(k, q)], true);
    }
#pragma unroll
    for (int k = 0; k < kRounds; ++k) {
      const int i = tid + k * kConsumerThreads, h = i / (kDim / 2), L = 2 * (i - h * (kDim / 2));
      uint32_t v = h0 + h < p.heads ? static_cast<uint32_t>(lo[k]) | (static_cast<uint32_t>(hi[k]) << 16) : 0u;
      if constexpr (!std::is_same_v<T, __half>) {
        const float f = q_scale_t(qmax[h], false);
        v = Wgmma<__half>::pack(__uint_as_float(v << 16) * f, __uint_as_float(v & 0xffff0000u) * f);
      }
      *reinterpret_cast<uint32_t*>(sqt + t_off(h, 2 * L)) = v;
    }
    fence_proxy_async();
    nb_sync<kConsumerThreads>(kBarAll);
  }

  float o[64], m[4], l[4];
  km_init(o, m, l);
  uint8_t* my_pt = spt + wg * kSlabT;
  float* red = sred + wg * 4 * kHeadsT;
  for (int it = wg; it < steps; it += 2) {
    const int s = it % kStagesT;
    const uint32_t st = smem_u32(sst + s * kStageBytesT);
    float sc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) sc[j] = 0.f;
    reg_fence(sc);
    mbar_wait(&full[s], (it / kStagesT) & 1);
    s_t_product(sc, st, sqt, w, g, q);

    // keys 16 w + g (elements i % 4 < 2) and + 8; heads t_head((i / 4) * 2 + i % 2, q)
    const uint32_t vb = s_valid[4 * s + w];
    const bool ok_lo = (vb >> g) & 1u, ok_hi = (vb >> (g + 8)) & 1u;
    float mx[4];
    km_scores(
        sc, mx,
        [&](int i, int k) {
          float y = sc[i];
          if constexpr (!std::is_same_v<T, __half>) y *= hs[k];  // exact: back to q's scale
          return y;
        },
        ok_lo, ok_hi, p.qk_scale_log2);
    km_warp_max(mx, red, wg, w, g, q);  // the 4 warps' maxima in red
    float a[4], z[4];
    km_new_max(m, a, z, red, q);
    km_exp(sc, z, a, l);
    // P^T (f16, p_f16_bits): head row, logical key t_pkey(physical key)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int pk = 16 * w + g + ((i & 2) ? 8 : 0), hk = t_head((i >> 2) * 2 + (i & 1), q);
      *reinterpret_cast<uint16_t*>(my_pt + t_off(hk, 2 * t_pkey(pk))) = p_f16_bits<T>(sc[i]);
    }
    km_rescale(o, a);
    uint4 v[4];  // P·V's first code rows, loaded before the barrier
    const uint32_t pv_base = st + 16 * (8 * w + g) + 4 * q * kDim, pv_flip = (q & 1) ? kDim : 0u;
    pv_t_load(v, pv_base + pv_flip, pv_base - pv_flip, 0);
    fence_proxy_async();
    nb_sync<128>(kBarT0 + wg);  // P^T complete
    pv_t_product(o, v, pv_base + pv_flip, pv_base - pv_flip, my_pt, &empty[s], lane);
  }

  float inv[4], lse[4];
  float* ot = reinterpret_cast<float*>(sst + kStageBytesT);  // stage 1
  if (!km_merge(p, o, m, l, sred, smx, ot, wg, w, g, q, t, inv, lse)) return;
  // the split again, from a fresh read of %ctaid.x (kept live from the prologue, ptxas spilled it)
  const int split_e = (cta_x() / head_groups) % p.num_splits;
  const int col0 = 16 * (8 * w + g);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int hk = t_head(k, q);
    if (h0 + hk >= p.heads) continue;
    const int64_t gi = static_cast<int64_t>(b) * p.heads + h0 + hk;
    if (w == 0 && g == 0) {
      if (p.num_splits > 1) p.part_lse[gi * p.num_splits + split_e] = lse[k];
      else if (p.lse != nullptr) p.lse[gi] = lse[k];
    }
    const int e = (k >> 1) * 4 + (k & 1);  // element of M tile mt: row half 0 at e, 1 at e + 2
    if (p.num_splits > 1) {
      float* dst = p.part_o + (gi * p.num_splits + split_e) * kNope + col0;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) store_pair(dst + 2 * mt, o[8 * mt + e] * inv[k], o[8 * mt + e + 2] * inv[k]);
    } else if (p.out_dtype == kFP32) {
      float* dst = static_cast<float*>(p.out) + gi * kNope + col0;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) store_pair(dst + 2 * mt, o[8 * mt + e] * inv[k], o[8 * mt + e + 2] * inv[k]);
    } else if (p.out_dtype == kBF16) {
      __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(p.out) + gi * kNope + col0;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) store_pair(dst + 2 * mt, o[8 * mt + e] * inv[k], o[8 * mt + e + 2] * inv[k]);
    } else {
      __half* dst = static_cast<__half*>(p.out) + gi * kNope + col0;
#pragma unroll
      for (int mt = 0; mt < 8; ++mt) store_pair(dst + 2 * mt, o[8 * mt + e] * inv[k], o[8 * mt + e + 2] * inv[k]);
    }
  }
}

template <typename T>
cudaError_t launch_t(const DecodeParams& p, cudaStream_t stream) {
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_t_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytesT);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits * ((p.heads + kHeadsT - 1) / kHeadsT);
  decode_t_kernel<T><<<static_cast<unsigned>(ctas), kThreads, kSmemBytesT, stream>>>(p);
  return cudaGetLastError();
}

// ---- A bf16 / fp16 cache at <= 16 heads: keys as the wgmma M (decode_km_kernel, config {"kernel": "keys_m"}) ----
// The seesaw's Q1 schedule pays 64 wgmma rows a step whatever the head count (48 of 64 padding at 16 heads). Here
// the 64 keys of a step are the M of m64n16k16 and the 16 heads its N, both products from shared memory: S^T = K Q^T
// (36 k16 steps, A = the stage's K rows K-major, B = Q^T) and O^T = V^T P^T (8 M tiles of 64 latent columns x 4 k16
// steps, A = the same rows read MN-major: the wgmma transpose-A bit, mnmajor_desc of one slab; B = P^T). The ring and
// its producer are the seesaw's (produce_rows: cp.async through the block table into two 128-byte-swizzled stages
// of 9 [64 rows x 128 B] slabs, validity bits, full[s] after cp.async.wait_group 0 + fence.proxy.async); Q^T and
// P^T are decode_t_kernel's 16-row slabs (t_off, t_desc). The two consumer warpgroups take alternate steps (WG c:
// steps c, c + 2, ..., always stage c; empty[s] counts its 4 warps), each an online softmax of its own with one
// running max per 64-key step (decode_t_kernel's rule), P rounded to T (q's dtype) as the Q1 kernel does, merged at
// the end. Outputs, LSE, empty rows and splits as decode_wgmma_kernel.
constexpr int kSmemBytesKm = 9 * kSlabT            // Q^T
                             + 2 * kSlabT          // P^T, one slab per consumer warpgroup
                             + 2 * kTileBytes      // two K stages (the seesaw's slabs)
                             + 2 * 4 * kHeadsT * 4  // [2 warpgroups][4 warps] step maxima, then row sums
                             + 2 * kHeadsT * 4      // [2 warpgroups] running maxima (the merge)
                             + 2 * 4 * 4            // [2 stages][4 producer warps] validity bits
                             + 2 * 2 * 8            // mbarriers full[2], empty[2]
                             + 1024;                // alignment slack

// m64n16k16 from shared memory (D f32 8 a thread, m64n16's accumulator layout: t_head): S^T with A and B K-major
// (`accumulate` 0: D = A B), or O^T with A MN-major (transpose-A bit: V^T from V's rows), always accumulating.
template <typename T>
__device__ __forceinline__ void km_wgmma(float (&d)[8], uint64_t da, uint64_t db, int accumulate) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, "
                 "1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
  } else {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, "
                 "1, 1, 0, 0;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db), "r"(accumulate));
  }
}
template <typename T>
__device__ __forceinline__ void km_wgmma_vt(float (&d)[8], uint64_t da, uint64_t db) {
  if constexpr (std::is_same_v<T, __half>) {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, "
                 "1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db));
  } else {
    asm volatile("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, "
                 "1, 1, 1, 0;\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
                 : "l"(da), "l"(db));
  }
}

// One output value (float32, or rounded to bf16 / fp16, nearest even).
__device__ __forceinline__ void store_one(float* dst, float x) { *dst = x; }
__device__ __forceinline__ void store_one(__nv_bfloat16* dst, float x) { *dst = __float2bfloat16_rn(x); }
__device__ __forceinline__ void store_one(__half* dst, float x) { *dst = __float2half_rn(x); }
// This thread's 16 output values of head k (km_wgmma's layout: element e of M tile mt is latent column 64 mt + r,
// e + 2 column 64 mt + r + 8, r = 16 w + g) times inv from `dst` (the head's row).
template <typename OutT>
__device__ __forceinline__ void km_store(OutT* dst, const float (&o)[64], int e, float inv) {
#pragma unroll
  for (int mt = 0; mt < 8; ++mt) {
    store_one(dst + 64 * mt, o[8 * mt + e] * inv);
    store_one(dst + 64 * mt + 8, o[8 * mt + e + 2] * inv);
  }
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 1) decode_km_kernel(const DecodeParams p) {
  allow_combine_launch();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* sqt = align1024(smem_raw);                 // Q^T: 9 slabs [16 heads x 128 B]
  uint8_t* spt = sqt + 9 * kSlabT;                    // P^T: [2 warpgroups] one slab [16 heads x 64 keys]
  uint8_t* sk0 = spt + 2 * kSlabT;                    // K stages [2][9 slabs of 64 rows x 128 B]
  float* sred = reinterpret_cast<float*>(sk0 + 2 * kTileBytes);           // [2][4 warps][16]
  float* smx = sred + 2 * 4 * kHeadsT;                                     // [2][16]
  uint32_t* s_valid = reinterpret_cast<uint32_t*>(smx + 2 * kHeadsT);     // [2 stages][4 producer warps]
  uint64_t* full = reinterpret_cast<uint64_t*>(s_valid + 2 * 4);          // [2]
  uint64_t* empty = full + 2;                                              // [2]
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = __shfl_sync(0xffffffffu, tid >> 5, 0);
  const int split = blockIdx.x % p.num_splits;  // one head group (heads <= 16)
  const int b = blockIdx.x / p.num_splits;

  const SplitKeys keys = split_keys(p, b, split, kPTile);
  const int64_t lo = keys.lo, hi = keys.hi;
  const int steps = hi > lo ? static_cast<int>((hi - lo + kKeys - 1) / kKeys) : 0;

  if (tid == 0) {
    for (int s = 0; s < 2; ++s) {
      mbar_init(&full[s], kProducerThreads);
      mbar_init(&empty[s], 4);  // the 4 warps of consumer warpgroup s (it takes the steps of stage s)
    }
  }
  __syncthreads();

  if (warp >= 8) {  // the producer warpgroup: decode_wgmma_kernel's copies (unquantized), two steps in flight
    setmaxnreg_dec<kProducerRegs>();
    const bool aligned = (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) && (p.cache_stride_page % 8 == 0) &&
                         (p.cache_stride_tok % 8 == 0);
    const int64_t row = 16 * (warp - 8) + (lane & 15);
    int64_t next_off = steps > 0 && lane < 16 ? row_offset(p, b, lo + row, hi) : -1;
    // Step i's copies are one cp.async group, published on full[i % 2] (wait for the group, fence.proxy.async,
    // arrive) once step i + 1's copies are issued, or before the producer would wait for a stage while a step is
    // unpublished (its consumer may be the one that frees it): both stages load at once when both are free.
    bool pending = false;  // the previous step's copies issued, not yet published
    for (int i = 0; i < steps; ++i) {
      const int s = i & 1;
      if (i >= 2) {
        const uint32_t parity = ((i - 2) >> 1) & 1;
        if (pending && !__all_sync(0xffffffffu, mbar_test(&empty[s], parity))) {
          cp_async_wait_all();
          fence_proxy_async();
          mbar_arrive(&full[s ^ 1]);
          pending = false;
        }
        mbar_wait(&empty[s], parity);
      }
      produce_rows<false>(p, next_off, sk0 + s * kTileBytes, s_valid + 4 * s + (warp - 8), warp - 8, lane, aligned);
      cp_async_commit();
      const int64_t next_tok = lo + static_cast<int64_t>(i + 1) * kKeys + row;
      next_off = i + 1 < steps && lane < 16 ? row_offset(p, b, next_tok, hi) : -1;
      if (pending) {
        cp_async_wait_upto(1);  // step i - 1's group landed
        fence_proxy_async();
        mbar_arrive(&full[s ^ 1]);
      }
      pending = true;
    }
    if (pending) {
      cp_async_wait_all();
      fence_proxy_async();
      mbar_arrive(&full[(steps - 1) & 1]);
    }
    return;
  }
  setmaxnreg_inc<kConsumerRegs>();
  const int wg = warp >> 2, w = warp & 3, t = tid & 127, g = lane >> 2, q = lane & 3;

  if (steps > 0) {  // Q^T: head h's row (zeros past p.heads) as row h of the 16-row slabs
    const bool q_aligned = (reinterpret_cast<uintptr_t>(p.q) % 16 == 0) && (p.q_stride_b % 8 == 0) &&
                           (p.q_stride_h % 8 == 0);
    const uint16_t* qg = static_cast<const uint16_t*>(p.q) + b * p.q_stride_b;
    for (int i = tid; i < kHeadsT * kChunks; i += kConsumerThreads) {
      const int h = i / kChunks, c = i % kChunks;
      const bool ok = h < p.heads;
      const uint16_t* src = ok ? qg + h * p.q_stride_h + c * 8 : qg;
      if (q_aligned) {
        cp_async16(sqt + t_off(h, c * 16), src, ok ? 16u : 0u);
      } else {
        uint16_t* dst = reinterpret_cast<uint16_t*>(sqt + t_off(h, c * 16));
        for (int e = 0; e < 8; ++e) dst[e] = ok ? src[e] : static_cast<uint16_t>(0);
      }
    }
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    nb_sync<kConsumerThreads>(kBarAll);
  }

  float o[64], m[4], l[4];  // O^T: M tile mt's 8 (km_store's layout)
  km_init(o, m, l);
  uint8_t* my_pt = spt + wg * kSlabT;
  float* red = sred + wg * 4 * kHeadsT;
  const uint8_t* sk = sk0 + wg * kTileBytes;  // this warpgroup's stage
  for (int it = wg; it < steps; it += 2) {
    float sc[8], s1[8];  // S^T of the even / odd k16 steps (two accumulation chains), summed
#pragma unroll
    for (int j = 0; j < 8; ++j) sc[j] = s1[j] = 0.f;
    reg_fence(sc);
    reg_fence(s1);
    mbar_wait(&full[wg], (it >> 1) & 1);
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < kDim / 16; ++ks)
      km_wgmma<T>((ks & 1) ? s1 : sc, kmajor_desc(sk, 32 * ks), t_desc(sqt, 32 * ks), ks > 1);
    wg_commit();
    wg_wait<0>();
    reg_fence(sc);
    reg_fence(s1);

    // keys 16 w + g (elements i % 4 < 2) and + 8; heads t_head((i / 4) * 2 + i % 2, q)
    const uint32_t vb = s_valid[4 * wg + w] >> g;  // this warp's 16 keys' validity bits from key g
    const bool ok_lo = vb & 1u, ok_hi = (vb >> 8) & 1u;
    float mx[4];
    km_scores(sc, mx, [&](int i, int) { return sc[i] + s1[i]; }, ok_lo, ok_hi, p.qk_scale_log2);
    km_warp_max(mx, red, wg, w, g, q);  // the 4 warps' maxima in red
    float a[4], z[4];
    km_new_max(m, a, z, red, q);
    km_exp(sc, z, a, l);
    // P^T rounded to T (P enters P V in q's dtype): head row, key column 16 w + g (+ 8)
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int key = 16 * w + g + ((i & 2) ? 8 : 0), hk = t_head((i >> 2) * 2 + (i & 1), q);
      *reinterpret_cast<uint16_t*>(my_pt + t_off(hk, 2 * key)) = static_cast<uint16_t>(Wgmma<T>::pack(sc[i], 0.f));
    }
    km_rescale(o, a);
    fence_proxy_async();
    nb_sync<128>(kBarT0 + wg);  // P^T complete
    wg_fence();
#pragma unroll
    for (int u = 0; u < kKeys / 16; ++u)
#pragma unroll
      for (int mt = 0; mt < kNope / 64; ++mt) {
        float(&d)[8] = *reinterpret_cast<float(*)[8]>(o + 8 * mt);
        km_wgmma_vt<T>(d, mnmajor_desc(sk + mt * kSlab, 16 * u), t_desc(my_pt, 32 * u));
      }
    wg_commit();
    wg_wait<0>();
    reg_fence(o);
    release_stage(empty, wg, lane);
  }

  float inv[4], lse[4];
  float* ot = reinterpret_cast<float*>(sk0 + kTileBytes);  // stage 1
  if (!km_merge(p, o, m, l, sred, smx, ot, wg, w, g, q, t, inv, lse)) return;
  const int split_e = cta_x() % p.num_splits;
  const int col0 = 16 * w + g;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const int hk = t_head(k, q);
    if (hk >= p.heads) continue;
    const int64_t gi = static_cast<int64_t>(b) * p.heads + hk;
    if (w == 0 && g == 0) {
      if (p.num_splits > 1) p.part_lse[gi * p.num_splits + split_e] = lse[k];
      else if (p.lse != nullptr) p.lse[gi] = lse[k];
    }
    const int e = (k >> 1) * 4 + (k & 1);  // element of M tile mt: column half 0 at e, 1 at e + 2
    if (p.num_splits > 1) {
      km_store(p.part_o + (gi * p.num_splits + split_e) * kNope + col0, o, e, inv[k]);
    } else if (p.out_dtype == kFP32) {
      km_store(static_cast<float*>(p.out) + gi * kNope + col0, o, e, inv[k]);
    } else if (p.out_dtype == kBF16) {
      km_store(static_cast<__nv_bfloat16*>(p.out) + gi * kNope + col0, o, e, inv[k]);
    } else {
      km_store(static_cast<__half*>(p.out) + gi * kNope + col0, o, e, inv[k]);
    }
  }
}

template <typename T>
cudaError_t launch_km(const DecodeParams& p, cudaStream_t stream) {
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_km_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmemBytesKm);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits;
  decode_km_kernel<T><<<static_cast<unsigned>(ctas), kThreads, kSmemBytesKm, stream>>>(p);
  return cudaGetLastError();
}

// The cache as produce_rows_tma's map (16-bit elements as (576 columns, page_size rows, num_pages pages), boxes of
// 64 x 16 x 1, 128-byte swizzle), or false, the map zeroed, and the producer copies every row with cp.async: not
// `wanted` (the launchers want it for 16-bit rows: KF kNoQuant or kFP8, not an FP8 cache's codes), a cache of
// codes, a page size not a power of two >= 16, a base or stride not 16-byte aligned, no encoder, or its refusal.
inline bool kv_tensor_map(const DecodeParams& p, bool wanted, CUtensorMap* map) {
  std::memset(map, 0, sizeof(*map));
  if (!wanted || p.cache_fp8 || p.page_shift < 0 || p.page_size < 16 || p.num_pages < 1 || p.num_pages > INT32_MAX ||
      reinterpret_cast<uintptr_t>(p.cache) % 16 != 0 || p.cache_stride_tok % 8 != 0 || p.cache_stride_page % 8 != 0)
    return false;
  const EncodeTiledFn encode = tma_encoder();
  if (encode == nullptr) return false;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kDim), static_cast<cuuint64_t>(p.page_size),
                              static_cast<cuuint64_t>(p.num_pages)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.cache_stride_tok) * 2,
                                 static_cast<cuuint64_t>(p.cache_stride_page) * 2};
  const cuuint32_t box[3] = {64, 16, 1};
  return slab_tensor_map(map, encode, CU_TENSOR_MAP_DATA_TYPE_UINT16, p.cache, dims, strides, box);
}

template <typename T, int KF, int PF>
cudaError_t launch_split(const DecodeParams& p, cudaStream_t stream) {
  // Once per device and instantiation (not a stream operation: capture-safe).
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_wgmma_kernel<T, KF, PF>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kSmemBytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits * ((p.heads + kHeads - 1) / kHeads);
  CUtensorMap kv_map;
  const bool kv_tma = kv_tensor_map(p, KF == kNoQuant || KF == kFP8, &kv_map);
  decode_wgmma_kernel<T, KF, PF><<<static_cast<unsigned>(ctas), kThreads, kSmemBytes, stream>>>(p, kv_map, kv_tma);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_ring4(const DecodeParams& p, cudaStream_t stream) {
  // Once per device and instantiation (not a stream operation: capture-safe).
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_wgmma_ring4_kernel<T>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kSmemBytesRing);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits * ((p.heads + kHeads - 1) / kHeads);
  CUtensorMap kv_map;
  const bool kv_tma = kv_tensor_map(p, true, &kv_map);
  decode_wgmma_ring4_kernel<T><<<static_cast<unsigned>(ctas), kThreads, kSmemBytesRing, stream>>>(p, kv_map, kv_tma);
  return cudaGetLastError();
}

template <typename T, int KF>
cudaError_t launch_split_p(const DecodeParams& p, cudaStream_t stream) {
  if (p.p_fmt == kFP8) return launch_split<T, KF, kFP8>(p, stream);
  if (p.p_fmt == kNVFP4) return launch_split<T, KF, kNVFP4>(p, stream);
  return launch_split<T, KF, kNoQuant>(p, stream);
}

}  // namespace

// The launchers of decode_wgmma_kernel's instances, one (dtype T, K / V operand KF) each: defined in, and so
// instantiating their three kernels (P none / FP8 / NVFP4, p.p_fmt picks) in, one mla_decode_wgmma_*.cu each, so that
// the build compiles them in parallel; launch_decode_wgmma (mla_decode_wgmma.cu) calls the one of the problem. KF:
// kNoQuant, kFP8 (K = V fake-quantized) or kCodes (an FP8 cache).
template <typename T, int KF>
cudaError_t launch_decode_wgmma_kv(const DecodeParams& p, cudaStream_t stream);
template <> cudaError_t launch_decode_wgmma_kv<__nv_bfloat16, kNoQuant>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_kv<__nv_bfloat16, kFP8>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_kv<__nv_bfloat16, kCodes>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_kv<__half, kNoQuant>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_kv<__half, kFP8>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_kv<__half, kCodes>(const DecodeParams&, cudaStream_t);
// The ring4 config's launcher (decode_wgmma_ring4_kernel), one per dtype, in mla_decode_wgmma_{bf16,fp16}_ring4.cu.
template <typename T>
cudaError_t launch_decode_wgmma_ring4(const DecodeParams& p, cudaStream_t stream);
template <> cudaError_t launch_decode_wgmma_ring4<__nv_bfloat16>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_wgmma_ring4<__half>(const DecodeParams&, cudaStream_t);

}  // namespace mla_core_cuda
