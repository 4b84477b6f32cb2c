// The mma.sync decode's split kernel and its launchers, included by the translation units that instantiate them
// (mla_decode_bf16.cu, mla_decode_fp16.cu: one dtype each) and by mla_decode.cu (the combine kernel, the dispatch),
// so the build compiles them in parallel. Everything here but the launchers' declarations at the end is in an
// anonymous namespace: a translation unit compiles only the instances it uses, and the kernels keep their names (and
// machine code) whichever file instantiates them.
//
// Paged MLA decode (kv_lora_rank 512 + rope 64) for sm_90a with fused K/V/P fake quantization.
//
// Split kernel: one CTA of 4 or 8 warps per (request, split, group of 16 * HT heads). It walks its split's
// 32-key tiles (the numerics contract's P tile, at absolute positions), double-buffered in shared memory
// with cp.async (rows whose page lies outside the cache, or past the split's end, are zero-filled and
// masked), and per tile:
//   1. (quantized K or V) writes K codes along the 576 features into a code tile and V codes along the
//      tokens (16-token blocks at absolute positions) in place: unscaled codes, exact in bf16/fp16;
//   2. S = Q K^T with mma.sync m16n8k16 (warp w: keys 8 (w % 4) .. + 7, all 576 features), scaled to the
//      log2 domain and masked, into shared memory;
//   3. online softmax, the running max updated once per tile; P = exp2(s - m) rounded to V's dtype (or
//      its FP8 / NVFP4 codes) into shared memory, the row sum from the float32 P;
//   4. acc = acc * alpha + P V with mma.sync (warp w: output columns w * 512 / warps ..).
// Each CTA writes every row it owns: the output (or its split's partial) and the LSE; an empty split
// writes 0 and -inf. The combine kernel (mla_decode.cu) merges the splits through their log-sum-exp.
// Quantizer quotients are correctly rounded (__fdiv_rn, or its division-free Markstein form), so every rounding
// decision matches mla_core.numerics (the quantizers: qdq.cuh, shared with the WGMMA kernel).

#pragma once

#include "mla_decode.h"
#include "mla_decode_split.cuh"
#include "qdq.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>

namespace mla_core_cuda {
namespace {

constexpr int kNope = 512;             // V width (kv_lora_rank)
constexpr int kDim = 576;              // K width (kv_lora_rank + rope)
constexpr int kTile = 32;              // keys per tile (the P tile)
constexpr int kCombineThreads = 128;   // combine kernel: 4 output columns per thread
constexpr int kRowElems = kDim + 8;    // shared row stride of K tiles / Q: 1168 B (ldmatrix conflict-free)
constexpr int kSRow = 40;              // shared row stride (floats) of the score tile
constexpr int kPRow = kTile + 8;       // shared row stride (elements) of the P tile: 80 B
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kMaxDevices = 64;        // devices whose shared-memory attribute is remembered

template <typename T> struct Mma;
template <> struct Mma<__nv_bfloat16> {
  static __device__ __forceinline__ void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};
template <> struct Mma<__half> {
  static __device__ __forceinline__ void run(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t* r, const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

// 16-byte global -> shared copy; src_bytes 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
template <> __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }

// ---------------------------------------------------------------------------------------- split kernel

struct SharedLayout {
  int q, k0, k1, kc, s, p, alpha, valid, bytes;
};

// Q rows, two raw K tiles (double buffer), one code tile (K codes, or V codes when only V is quantized),
// the score tile, the P tile, per-row factors, per-key validity of both buffers.
__host__ __device__ inline SharedLayout shared_layout(int head_tiles, bool code_tile) {
  SharedLayout l{};
  const int rows = 16 * head_tiles;
  int off = 0;
  l.q = off;  off += rows * kRowElems * 2;
  l.k0 = off; off += kTile * kRowElems * 2;
  l.k1 = off; off += kTile * kRowElems * 2;
  l.kc = off; off += code_tile ? kTile * kRowElems * 2 : 0;
  l.s = off;  off += rows * kSRow * 4;
  l.p = off;  off += rows * kPRow * 2;
  l.alpha = off; off += rows * 4;
  l.valid = off; off += 2 * kTile * 4;
  l.bytes = off;
  return l;
}

__host__ __device__ inline bool needs_code_tile(const DecodeParams& p) {
  return p.k_fmt != kNoQuant || p.v_fmt != kNoQuant;
}

// One 32-key tile of cache rows into shared memory with cp.async (kThreads / 32 threads per row); rows past
// `hi` or whose page lies outside the cache are zero-filled and marked invalid.
template <typename T, int kThreads>
__device__ __forceinline__ void load_tile(const DecodeParams& p, int b, int64_t tok0, int64_t hi, T* dst, int* valid,
                                          bool aligned) {
  constexpr int kParts = kThreads / kTile;         // threads per row
  constexpr int kChunks = kDim / 8 / kParts;       // 16-byte chunks per thread
  const int row = threadIdx.x / kParts, part = threadIdx.x % kParts;
  const int64_t tok = tok0 + row;
  bool ok = false;
  int64_t page = 0;
  if (tok < hi) {  // only table entries a length reaches are read
    page = load_index(p.block_table, b * p.table_stride_b + (tok / p.page_size) * p.table_stride_col, p.table_i64);
    ok = page >= 0 && page < p.num_pages;  // a page outside the cache is an absent key
  }
  const T* cache = static_cast<const T*>(p.cache);
  const T* src = ok ? cache + page * p.cache_stride_page + (tok % p.page_size) * p.cache_stride_tok : cache;
  T* drow = dst + row * kRowElems;
  if (aligned) {
#pragma unroll
    for (int j = 0; j < kChunks; ++j) {
      const int chunk = part + kParts * j;
      cp_async_16(drow + chunk * 8, src + chunk * 8, ok ? 16 : 0);
    }
  } else {
    for (int j = 0; j < kChunks; ++j) {
      const int chunk = part + kParts * j;
      for (int e = 0; e < 8; ++e) drow[chunk * 8 + e] = ok ? src[chunk * 8 + e] : from_float<T>(0.f);
    }
  }
  if (part == 0) valid[row] = ok;
}

// Eight consecutive elements (16 bytes of shared memory) as float32, and back.
template <typename T>
__device__ __forceinline__ void load8(const T* src, float* x) {
  const uint4 v = *reinterpret_cast<const uint4*>(src);
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = to_float(e[i]);
}
template <typename T>
__device__ __forceinline__ void store8(T* dst, const float* x) {
  uint4 v;
  T* e = reinterpret_cast<T*>(&v);
#pragma unroll
  for (int i = 0; i < 8; ++i) e[i] = from_float<T>(x[i]);
  *reinterpret_cast<uint4*>(dst) = v;
}

// K codes along the features into `kc` (FP8 elementwise, NVFP4 in 36 blocks of 16 per row), from `raw`.
template <typename T, int kThreads>
__device__ void quantize_k(const DecodeParams& p, const T* raw, T* kc) {
  const float inv = __frcp_rn(p.k_scale);
  for (int blk = threadIdx.x; blk < kTile * (kDim / 16); blk += kThreads) {
    const int off = (blk / (kDim / 16)) * kRowElems + (blk % (kDim / 16)) * 16;
    float x[16];
    load8(raw + off, x);
    load8(raw + off + 8, x + 8);
    if (p.k_fmt == kFP8) {
#pragma unroll
      for (int e = 0; e < 16; ++e) x[e] = fp8_code(x[e], p.k_scale, inv, p.exact_div);
    } else {
      float bmax = 0.f;
#pragma unroll
      for (int e = 0; e < 16; ++e) bmax = fmaxf(bmax, fabsf(x[e]));
      const BlockScale bs = nvfp4_block_scale(bmax, p.k_scale);
#pragma unroll
      for (int e = 0; e < 16; ++e) x[e] = nvfp4_unscaled(x[e], bs, p.exact_div);
    }
    store8(kc + off, x);
    store8(kc + off + 8, x + 8);
  }
}

// V codes along the tokens, in place in `v` (rows of kRowElems, columns 0..511): FP8 elementwise, NVFP4 per
// column in the tile's two 16-token blocks (absolute positions: tiles start at multiples of 32). Each thread
// reads and rewrites only its own (column pair, token block), so in place is safe.
template <typename T, int kThreads>
__device__ void quantize_v(const DecodeParams& p, T* v) {
  const float inv = __frcp_rn(p.v_scale);
  for (int item = threadIdx.x; item < 2 * (kNope / 2); item += kThreads) {
    const int r0 = (item / (kNope / 2)) * 16, c = (item % (kNope / 2)) * 2;
    float x0[16], x1[16];
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      x0[e] = to_float(v[(r0 + e) * kRowElems + c]);
      x1[e] = to_float(v[(r0 + e) * kRowElems + c + 1]);
    }
    if (p.v_fmt == kFP8) {
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        x0[e] = fp8_code(x0[e], p.v_scale, inv, p.exact_div);
        x1[e] = fp8_code(x1[e], p.v_scale, inv, p.exact_div);
      }
    } else {
      float m0 = 0.f, m1 = 0.f;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        m0 = fmaxf(m0, fabsf(x0[e]));
        m1 = fmaxf(m1, fabsf(x1[e]));
      }
      const BlockScale b0 = nvfp4_block_scale(m0, p.v_scale), b1 = nvfp4_block_scale(m1, p.v_scale);
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        x0[e] = nvfp4_unscaled(x0[e], b0, p.exact_div);
        x1[e] = nvfp4_unscaled(x1[e], b1, p.exact_div);
      }
    }
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      v[(r0 + e) * kRowElems + c] = from_float<T>(x0[e]);
      v[(r0 + e) * kRowElems + c + 1] = from_float<T>(x1[e]);
    }
  }
}

// HT: 16-head m-tiles per CTA; WARPS: 4 or 8. Scores: warp w takes keys 8 (w % 4) .. + 7 of m-tiles
// (w / 4) * kMPerWarp .. + kMPerWarp - 1; P V: warp w takes output columns w * 512 / WARPS .. .
template <typename T, int HT, int WARPS>
__global__ void __launch_bounds__(WARPS * 32) decode_split_kernel(const DecodeParams p) {
  allow_combine_launch();
  constexpr int kThreads = WARPS * 32;
  constexpr int kRows = 16 * HT;                 // heads per CTA
  constexpr int kMPerWarp = HT * 4 / WARPS;      // m-tiles per warp in the score product
  constexpr int kRowThreads = kThreads / kRows;  // softmax threads per row
  constexpr int kRowCols = kTile / kRowThreads;  // P columns per softmax thread
  constexpr int kCols = kNope / WARPS;           // output columns per warp
  constexpr int kNT = kCols / 8;                 // 8-column n-tiles per warp
  static_assert(kMPerWarp >= 1 && kRowThreads >= 1 && kRowThreads <= 32 && kNT % 2 == 0, "tile shape");
  extern __shared__ __align__(128) unsigned char smem[];

  const int head_groups = (p.heads + kRows - 1) / kRows;
  const int hg = blockIdx.x % head_groups;
  const int split = (blockIdx.x / head_groups) % p.num_splits;
  const int b = blockIdx.x / (head_groups * p.num_splits);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q4 = lane & 3;  // mma fragment row group and column pair

  const bool k_codes = p.k_fmt != kNoQuant;
  const bool v_codes = p.v_fmt != kNoQuant && !p.v_from_k;
  const SharedLayout lay = shared_layout(HT, needs_code_tile(p));
  T* sQ = reinterpret_cast<T*>(smem + lay.q);
  T* sK[2] = {reinterpret_cast<T*>(smem + lay.k0), reinterpret_cast<T*>(smem + lay.k1)};
  T* sKc = reinterpret_cast<T*>(smem + lay.kc);
  float* sS = reinterpret_cast<float*>(smem + lay.s);
  T* sP = reinterpret_cast<T*>(smem + lay.p);
  float* sAlpha = reinterpret_cast<float*>(smem + lay.alpha);
  int* sValid = reinterpret_cast<int*>(smem + lay.valid);

  const SplitKeys keys = split_keys(p, b, split, kTile);  // the reference's schedule
  const int64_t lo = keys.lo, hi = keys.hi;
  const int64_t tiles = hi > lo ? (hi - lo + kTile - 1) / kTile : 0;

  const bool aligned = (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) && (p.cache_stride_page % 8 == 0) &&
                       (p.cache_stride_tok % 8 == 0);
  // Q rows of this head group (heads past the count are zeros; their rows are never written out), in the
  // first tile's copy group.
  const T* q = static_cast<const T*>(p.q);
  const bool q_aligned = (reinterpret_cast<uintptr_t>(q) % 16 == 0) && (p.q_stride_b % 8 == 0) &&
                         (p.q_stride_h % 8 == 0);
  for (int i = tid; i < kRows * (kDim / 8); i += kThreads) {
    const int r = i / (kDim / 8), c = (i % (kDim / 8)) * 8, head = hg * kRows + r;
    const T* src = head < p.heads ? q + b * p.q_stride_b + head * p.q_stride_h + c : q;
    if (q_aligned) {
      cp_async_16(sQ + r * kRowElems + c, src, head < p.heads ? 16 : 0);
    } else {
      for (int e = 0; e < 8; ++e) sQ[r * kRowElems + c + e] = head < p.heads ? src[e] : from_float<T>(0.f);
    }
  }
  if (tiles > 0) load_tile<T, kThreads>(p, b, lo, hi, sK[0], sValid, aligned);
  cp_async_commit();

  // Softmax state: thread tid owns row tid / kRowThreads (replicated over its kRowThreads lanes).
  const int srow = tid / kRowThreads, scol = (tid % kRowThreads) * kRowCols;
  const float p_inv = __frcp_rn(p.p_scale);
  float m_run = -INFINITY, l_run = 0.f;
  float acc[HT][kNT][4];
#pragma unroll
  for (int mt = 0; mt < HT; ++mt)
#pragma unroll
    for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  for (int64_t t = 0; t < tiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    cp_async_wait_all();
    __syncthreads();  // tile t is in sK[buf]; every warp is done with tile t - 1
    if (t + 1 < tiles) {
      load_tile<T, kThreads>(p, b, lo + (t + 1) * kTile, hi, sK[buf ^ 1], sValid + (buf ^ 1) * kTile, aligned);
      cp_async_commit();
    }
    T* kt = sK[buf];
    // 1. codes: K into the code tile; V in place in the raw tile (after K's pass read it), or into the code
    // tile when K is not quantized (QK then reads the raw tile)
    if (k_codes) quantize_k<T, kThreads>(p, kt, sKc);
    if (v_codes) {
      if (k_codes) {
        __syncthreads();
        quantize_v<T, kThreads>(p, kt);
      } else {
        for (int i = tid; i < kTile * (kNope / 8); i += kThreads) {  // copy, then quantize the copy in place
          const int off = (i / (kNope / 8)) * kRowElems + (i % (kNope / 8)) * 8;
          *reinterpret_cast<uint4*>(sKc + off) = *reinterpret_cast<const uint4*>(kt + off);
        }
        __syncthreads();
        quantize_v<T, kThreads>(p, sKc);
      }
    }
    if (k_codes || v_codes) __syncthreads();
    const T* kd = k_codes ? sKc : kt;
    const T* vd = v_codes ? (k_codes ? kt : sKc) : (p.v_from_k ? sKc : kt);

    // 2. scores
    {
      const int n0 = (warp % 4) * 8, m0 = (warp / 4) * kMPerWarp;
      // kChains independent accumulators per m-tile (k-steps round-robin): a shorter dependent mma chain
      constexpr int kChains = 4;
      float sc[kMPerWarp][kChains][4];
#pragma unroll
      for (int mt = 0; mt < kMPerWarp; ++mt)
#pragma unroll
        for (int c = 0; c < kChains; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) sc[mt][c][e] = 0.f;
      const T* kb = kd + (n0 + (lane & 7)) * kRowElems + ((lane >> 3) & 1) * 8;
      const T* qb = sQ + (m0 * 16 + (lane & 15)) * kRowElems + (lane >> 4) * 8;
      static_assert((kDim / 16) % kChains == 0, "k-steps per chain");
#pragma unroll 1
      for (int k0 = 0; k0 < kDim / 16; k0 += kChains) {
#pragma unroll
        for (int c = 0; c < kChains; ++c) {
          const int kk = k0 + c;
          uint32_t bf[2];
          ldmatrix_x2(bf, kb + kk * 16);
#pragma unroll
          for (int mt = 0; mt < kMPerWarp; ++mt) {
            uint32_t af[4];
            ldmatrix_x4(af, qb + mt * 16 * kRowElems + kk * 16);
            Mma<T>::run(sc[mt][c], af, bf[0], bf[1]);
          }
        }
      }
      float s[kMPerWarp][4];
#pragma unroll
      for (int mt = 0; mt < kMPerWarp; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][e] = (sc[mt][0][e] + sc[mt][1][e]) + (sc[mt][2][e] + sc[mt][3][e]);
      const int* valid = sValid + buf * kTile;
      const int key = n0 + 2 * q4;
      const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;
#pragma unroll
      for (int mt = 0; mt < kMPerWarp; ++mt) {
        float* r0 = sS + ((m0 + mt) * 16 + g) * kSRow + key;
        float* r1 = r0 + 8 * kSRow;
        r0[0] = v0 ? s[mt][0] * p.qk_scale_log2 : -INFINITY;
        r0[1] = v1 ? s[mt][1] * p.qk_scale_log2 : -INFINITY;
        r1[0] = v0 ? s[mt][2] * p.qk_scale_log2 : -INFINITY;
        r1[1] = v1 ? s[mt][3] * p.qk_scale_log2 : -INFINITY;
      }
    }
    __syncthreads();

    // 3. online softmax, the running max updated once per 32-key tile
    {
      float x[kRowCols], mx = -INFINITY;
#pragma unroll
      for (int c = 0; c < kRowCols; ++c) {
        x[c] = sS[srow * kSRow + scol + c];
        mx = fmaxf(mx, x[c]);
      }
#pragma unroll
      for (int off = kRowThreads / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_new = fmaxf(m_run, mx);
      const float m_safe = m_new == -INFINITY ? 0.f : m_new;  // no key yet: no NaN from -inf - -inf
      const float alpha = exp2f(m_run - m_safe);
      float sum = 0.f;
#pragma unroll
      for (int c = 0; c < kRowCols; ++c) {
        x[c] = exp2f(x[c] - m_safe);
        sum += x[c];
      }
#pragma unroll
      for (int off = kRowThreads / 2; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      l_run = l_run * alpha + sum;  // the row sum uses the float32, unquantized P
      m_run = m_new;
      T* prow = sP + srow * kPRow + scol;
      if (p.p_fmt == kFP8) {
#pragma unroll
        for (int c = 0; c < kRowCols; ++c) prow[c] = from_float<T>(fp8_code(x[c], p.p_scale, p_inv, p.exact_div));
      } else if (p.p_fmt == kNVFP4) {
        // P rounded to V's dtype, then blocks of 16 keys at absolute positions (tiles start at multiples of 32)
        constexpr int kBlocksHere = kRowCols >= 16 ? kRowCols / 16 : 1;
        constexpr int kLanesPerBlock = kRowCols >= 16 ? 1 : 16 / kRowCols;
        constexpr int kBlockCols = kRowCols >= 16 ? 16 : kRowCols;
#pragma unroll
        for (int c = 0; c < kRowCols; ++c) x[c] = to_float(from_float<T>(x[c]));
#pragma unroll
        for (int blk = 0; blk < kBlocksHere; ++blk) {
          float bmax = 0.f;
#pragma unroll
          for (int c = 0; c < kBlockCols; ++c) bmax = fmaxf(bmax, x[blk * kBlockCols + c]);  // P >= 0
#pragma unroll
          for (int off = kLanesPerBlock / 2; off > 0; off /= 2) bmax = fmaxf(bmax, __shfl_xor_sync(0xffffffffu, bmax, off));
          const BlockScale bs = nvfp4_block_scale(bmax, p.p_scale);
#pragma unroll
          for (int c = 0; c < kBlockCols; ++c) {
            const int i = blk * kBlockCols + c;
            prow[i] = from_float<T>(nvfp4_unscaled(x[i], bs, p.exact_div));
          }
        }
      } else {
#pragma unroll
        for (int c = 0; c < kRowCols; ++c) prow[c] = from_float<T>(x[c]);
      }
      if (tid % kRowThreads == 0) sAlpha[srow] = alpha;
    }
    __syncthreads();

    // 4. acc = acc * alpha + P V
#pragma unroll
    for (int mt = 0; mt < HT; ++mt) {
      const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        acc[mt][nt][0] *= a0;
        acc[mt][nt][1] *= a0;
        acc[mt][nt][2] *= a1;
        acc[mt][nt][3] *= a1;
      }
    }
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
      uint32_t af[HT][4];
#pragma unroll
      for (int mt = 0; mt < HT; ++mt)
        ldmatrix_x4(af[mt], sP + (mt * 16 + (lane & 15)) * kPRow + ks * 16 + (lane >> 4) * 8);
      const T* vb = vd + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kRowElems + warp * kCols + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < kNT / 2; ++np) {
        uint32_t bf[4];
        ldmatrix_x4_trans(bf, vb + np * 16);
#pragma unroll
        for (int mt = 0; mt < HT; ++mt) {
          Mma<T>::run(acc[mt][2 * np], af[mt], bf[0], bf[1]);
          Mma<T>::run(acc[mt][2 * np + 1], af[mt], bf[2], bf[3]);
        }
      }
    }
  }

  // Final state per row: l (scaled below) and the LSE, natural log.
  cp_async_wait_all();  // an empty split committed Q's copy group: drain it before the CTA ends
  __syncthreads();
  float* sL = sAlpha;  // reuse: the row sums
  if (tid % kRowThreads == 0) {
    sL[srow] = l_run;
    const int head = hg * kRows + srow;
    if (head < p.heads) {
      // an empty row (l == 0) gives -inf; a NaN read within the length propagates, as in the reference
      const float lse = l_run == 0.f ? -INFINITY : (m_run + log2f(l_run)) * kLn2;
      const int64_t row = static_cast<int64_t>(b) * p.heads + head;
      if (p.num_splits == 1) {
        if (p.lse != nullptr) p.lse[row] = lse;
      } else {
        p.part_lse[row * p.num_splits + split] = lse;
      }
    }
  }
  __syncthreads();
#pragma unroll
  for (int mt = 0; mt < HT; ++mt) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int r = mt * 16 + g + 8 * half;
      const int head = hg * kRows + r;
      if (head >= p.heads) continue;
      const float l = sL[r];
      const float inv = l == 0.f ? 0.f : p.out_scale / l;  // an empty row writes 0
      const int64_t row = static_cast<int64_t>(b) * p.heads + head;
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt) {
        const int col = warp * kCols + nt * 8 + 2 * q4;
        const float o0 = acc[mt][nt][2 * half] * inv, o1 = acc[mt][nt][2 * half + 1] * inv;
        if (p.num_splits > 1) {
          *reinterpret_cast<float2*>(p.part_o + (row * p.num_splits + split) * kNope + col) = make_float2(o0, o1);
        } else if (p.out_dtype == kFP32) {
          *reinterpret_cast<float2*>(static_cast<float*>(p.out) + row * kNope + col) = make_float2(o0, o1);
        } else if (p.out_dtype == kBF16) {
          *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * kNope + col) =
              __floats2bfloat162_rn(o0, o1);
        } else {
          *reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + row * kNope + col) = __floats2half2_rn(o0, o1);
        }
      }
    }
  }
}

template <typename T, int HT, int WARPS>
cudaError_t launch_split(const DecodeParams& p, cudaStream_t stream) {
  const SharedLayout lay = shared_layout(HT, needs_code_tile(p));
  // Once per device and instantiation, for the largest layout (not a stream operation: capture-safe).
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_split_kernel<T, HT, WARPS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               shared_layout(HT, true).bytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int head_groups = (p.heads + 16 * HT - 1) / (16 * HT);
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits * head_groups;
  decode_split_kernel<T, HT, WARPS><<<static_cast<unsigned>(ctas), WARPS * 32, lay.bytes, stream>>>(p);
  return cudaGetLastError();
}

// The (head tiles, warps) shapes built: (1, 4) 16 heads per CTA, (2, 4) and (2, 8) 32, (4, 8) 64.
template <typename T>
cudaError_t launch_split_t(const DecodeParams& p, cudaStream_t stream) {
  if (p.head_tiles == 4) return launch_split<T, 4, 8>(p, stream);
  if (p.head_tiles == 2) return p.warps == 8 ? launch_split<T, 2, 8>(p, stream) : launch_split<T, 2, 4>(p, stream);
  return launch_split<T, 1, 4>(p, stream);
}

}  // namespace

// The split kernel's launchers, one per dtype T: defined in, and so instantiating their four CTA shapes' kernels in,
// mla_decode_bf16.cu and mla_decode_fp16.cu, so that the build compiles them in parallel; launch_decode
// (mla_decode.cu, beside the combine kernel) calls the one of p.dtype.
template <typename T>
cudaError_t launch_decode_split(const DecodeParams& p, cudaStream_t stream);
template <> cudaError_t launch_decode_split<__nv_bfloat16>(const DecodeParams&, cudaStream_t);
template <> cudaError_t launch_decode_split<__half>(const DecodeParams&, cudaStream_t);

}  // namespace mla_core_cuda
