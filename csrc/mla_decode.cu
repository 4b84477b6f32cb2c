// Paged MLA decode (kv_lora_rank 512 + rope 64) for sm_90a with fused K/V/P fake quantization.
//
// Split kernel: one CTA of 4 warps per (request, split, group of 16 * HT heads). It walks its split's
// 32-key tiles (the numerics contract's P tile, at absolute positions), double-buffered in shared memory
// with cp.async (rows whose page lies outside the cache, or past the split's end, are zero-filled and
// masked), and per tile:
//   1. (quantized K or V) writes K codes along the 576 features and V codes along the tokens (16-token
//      blocks at absolute positions) into their own shared buffers: unscaled codes, exact in bf16/fp16;
//   2. S = Q K^T with mma.sync m16n8k16 (warp w: keys 8w..8w+7, all 576 features), scaled to the log2
//      domain and masked, into shared memory;
//   3. online softmax, the running max updated once per tile; P = exp2(s - m) rounded to V's dtype (or
//      its FP8 / NVFP4 codes) into shared memory, the row sum from the float32 P;
//   4. acc = acc * alpha + P V with mma.sync (warp w: output columns 128w..128w+127).
// Each CTA writes every row it owns: the output (or its split's partial) and the LSE; an empty split
// writes 0 and -inf. The combine kernel merges the splits through their log-sum-exp.
// Quantizer quotients are correctly rounded (__fdiv_rn, or its division-free Markstein form), so every rounding
// decision matches mla_core.numerics.

#include "mla_decode.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

namespace mla_core_cuda {
namespace {

constexpr int kNope = 512;             // V width (kv_lora_rank)
constexpr int kDim = 576;              // K width (kv_lora_rank + rope)
constexpr int kTile = 32;              // keys per tile (the P tile)
constexpr int kThreads = 128;          // 4 warps
constexpr int kRowElems = kDim + 8;    // shared row stride of K tiles / Q: 1168 B (ldmatrix conflict-free)
constexpr int kVRowElems = kNope + 8;  // shared row stride of V codes: 1040 B
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

__device__ __forceinline__ int64_t load_index(const void* p, int64_t i, bool i64) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

// ---------------------------------------------------------------------------------------- quantizers

// float32 -> E4M3, nearest even, saturating at +-448 (NaN stays NaN), back to float32.
__device__ __forceinline__ float round_e4m3(float x) {
  __nv_fp8_storage_t code = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, __NV_E4M3)));
}

// float32 -> E2M1 (+-{0, .5, 1, 1.5, 2, 3, 4, 6}), ties to the even code, saturating at 6. In [0, 2) the
// grid step is 0.5, in [2, 4) 1, above 2: scaling by the inverse step (exact) and adding 1.5 * 2^23 rounds
// to an integer with the adder's nearest-even rounding (0.25 -> 0, 0.75 -> 1, 2.5 -> 2, 5 -> 4).
__device__ __forceinline__ float round_e2m1(float x) {
  const float a = fabsf(x);
  const float inv_step = a < 2.f ? 2.f : (a < 4.f ? 1.f : 0.5f);
  const float step = a < 2.f ? 0.5f : (a < 4.f ? 1.f : 2.f);
  float r = __fsub_rn(__fadd_rn(__fmul_rn(a, inv_step), 12582912.f), 12582912.f) * step;
  r = r > 6.f ? 6.f : r;
  return x < 0.f ? -r : r;
}

// Correctly rounded x / s without a division, from inv_s = RN(1 / s): q0 = x * inv_s is within an ulp and one
// exact fma residual corrects it (Markstein's theorem; bitwise __fdiv_rn for the operand ranges of these
// quantizers). `exact_div` (per-tensor factors near float32's range ends, set by the host) takes __fdiv_rn.
__device__ __forceinline__ float div_rn(float x, float s, float inv_s, bool exact_div) {
  if (exact_div) return __fdiv_rn(x, s);
  const float q0 = __fmul_rn(x, inv_s);
  return __fmaf_rn(__fmaf_rn(-q0, s, x), inv_s, q0);
}

// FP8 code of x: e4m3(x / scale) (the caller multiplies by scale).
__device__ __forceinline__ float fp8_code(float x, float scale, float inv_scale, bool exact_div) {
  return round_e4m3(div_rn(x, scale, inv_scale, exact_div));
}

// NVFP4 block code: e4m3(bmax / 6 / g); the block's dequantized scale is code * g.
__device__ __forceinline__ float nvfp4_block_code(float bmax, float g) {
  return round_e4m3(__fdiv_rn(__fdiv_rn(bmax, 6.f), g));
}

// A block's dequantized scale s = code * g and its reciprocal (1 where the block is all zero: its values are 0).
struct BlockScale {
  float code, s, inv_s;
};
__device__ __forceinline__ BlockScale nvfp4_block_scale(float bmax, float g) {
  const float code = nvfp4_block_code(bmax, g);
  const float s = code == 0.f ? 1.f : code * g;
  return {code, s, __frcp_rn(s)};
}

// NVFP4 value without the global scale: e2m1(x / (code * g)) * code (0 where code is 0).
__device__ __forceinline__ float nvfp4_unscaled(float x, const BlockScale& b, bool exact_div) {
  return round_e2m1(div_rn(x, b.s, b.inv_s, exact_div)) * b.code;
}

// ---------------------------------------------------------------------------------------- split kernel

struct SharedLayout {
  int q, k0, k1, kc, vc, s, p, alpha, valid, bytes;
};

__host__ __device__ inline SharedLayout shared_layout(int head_tiles, bool k_codes, bool v_codes) {
  SharedLayout l{};
  const int rows = 16 * head_tiles;
  int off = 0;
  l.q = off;  off += rows * kRowElems * 2;
  l.k0 = off; off += kTile * kRowElems * 2;
  l.k1 = off; off += kTile * kRowElems * 2;
  l.kc = off; off += k_codes ? kTile * kRowElems * 2 : 0;
  l.vc = off; off += v_codes ? kTile * kVRowElems * 2 : 0;
  l.s = off;  off += rows * kSRow * 4;
  l.p = off;  off += rows * kPRow * 2;
  l.alpha = off; off += rows * 4;
  l.valid = off; off += 2 * kTile * 4;
  l.bytes = off;
  return l;
}

template <typename T>
__device__ __forceinline__ void load_tile(const DecodeParams& p, int b, int64_t tok0, int64_t hi, T* dst, int* valid,
                                          bool aligned) {
  const int row = threadIdx.x >> 2, part = threadIdx.x & 3;
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
    for (int j = 0; j < kDim / 8 / 4; ++j) {
      const int chunk = part + 4 * j;
      cp_async_16(drow + chunk * 8, src + chunk * 8, ok ? 16 : 0);
    }
  } else {
    for (int j = 0; j < kDim / 8 / 4; ++j) {
      const int chunk = part + 4 * j;
      for (int e = 0; e < 8; ++e) drow[chunk * 8 + e] = ok ? src[chunk * 8 + e] : from_float<T>(0.f);
    }
  }
  if (part == 0) valid[row] = ok;
}

// K codes along the features (FP8 elementwise, NVFP4 in 36 blocks of 16 per row) and V codes along the
// tokens (FP8 elementwise, NVFP4 per column in the tile's two 16-token blocks), from the raw tile.
template <typename T>
__device__ void quantize_tile(const DecodeParams& p, const T* raw, T* kc, T* vc) {
  const int tid = threadIdx.x;
  const float k_inv = __frcp_rn(p.k_scale), v_inv = __frcp_rn(p.v_scale);
  if (p.k_fmt == kFP8) {
    for (int i = tid; i < kTile * kDim; i += kThreads) {
      const int r = i / kDim, c = i % kDim;
      kc[r * kRowElems + c] = from_float<T>(fp8_code(to_float(raw[r * kRowElems + c]), p.k_scale, k_inv, p.exact_div));
    }
  } else if (p.k_fmt == kNVFP4) {
    for (int blk = tid; blk < kTile * (kDim / 16); blk += kThreads) {
      const int r = blk / (kDim / 16), c0 = (blk % (kDim / 16)) * 16;
      float x[16], bmax = 0.f;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        x[e] = to_float(raw[r * kRowElems + c0 + e]);
        bmax = fmaxf(bmax, fabsf(x[e]));
      }
      const BlockScale bs = nvfp4_block_scale(bmax, p.k_scale);
#pragma unroll
      for (int e = 0; e < 16; ++e) kc[r * kRowElems + c0 + e] = from_float<T>(nvfp4_unscaled(x[e], bs, p.exact_div));
    }
  }
  if (p.v_fmt == kNoQuant || p.v_from_k) return;
  if (p.v_fmt == kFP8) {
    for (int i = tid; i < kTile * kNope; i += kThreads) {
      const int r = i / kNope, c = i % kNope;
      vc[r * kVRowElems + c] = from_float<T>(fp8_code(to_float(raw[r * kRowElems + c]), p.v_scale, v_inv, p.exact_div));
    }
  } else {
    for (int blk = tid; blk < 2 * kNope; blk += kThreads) {  // (token block, column): neighbours share a block
      const int r0 = (blk / kNope) * 16, c = blk % kNope;
      float x[16], bmax = 0.f;
#pragma unroll
      for (int e = 0; e < 16; ++e) {
        x[e] = to_float(raw[(r0 + e) * kRowElems + c]);
        bmax = fmaxf(bmax, fabsf(x[e]));
      }
      const BlockScale bs = nvfp4_block_scale(bmax, p.v_scale);
#pragma unroll
      for (int e = 0; e < 16; ++e) vc[(r0 + e) * kVRowElems + c] = from_float<T>(nvfp4_unscaled(x[e], bs, p.exact_div));
    }
  }
}

template <typename T, int HT>
__global__ void __launch_bounds__(kThreads) decode_split_kernel(const DecodeParams p) {
  constexpr int kRows = 16 * HT;                // heads per CTA
  constexpr int kRowThreads = kThreads / kRows;  // softmax threads per row
  constexpr int kRowCols = kTile / kRowThreads;  // P columns per softmax thread
  extern __shared__ __align__(128) unsigned char smem[];

  const int head_groups = (p.heads + kRows - 1) / kRows;
  const int hg = blockIdx.x % head_groups;
  const int split = (blockIdx.x / head_groups) % p.num_splits;
  const int b = blockIdx.x / (head_groups * p.num_splits);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, q4 = lane & 3;  // mma fragment row group and column pair

  const bool k_codes = p.k_fmt != kNoQuant;
  const bool v_codes = p.v_fmt != kNoQuant && !p.v_from_k;
  const SharedLayout lay = shared_layout(HT, k_codes, v_codes);
  T* sQ = reinterpret_cast<T*>(smem + lay.q);
  T* sK[2] = {reinterpret_cast<T*>(smem + lay.k0), reinterpret_cast<T*>(smem + lay.k1)};
  T* sKc = reinterpret_cast<T*>(smem + lay.kc);
  T* sVc = reinterpret_cast<T*>(smem + lay.vc);
  float* sS = reinterpret_cast<float*>(smem + lay.s);
  T* sP = reinterpret_cast<T*>(smem + lay.p);
  float* sAlpha = reinterpret_cast<float*>(smem + lay.alpha);
  int* sValid = reinterpret_cast<int*>(smem + lay.valid);

  // Split bounds (the reference's schedule), the length clamped to the block table's capacity.
  int64_t len = load_index(p.seq_lens, b * p.lens_stride, p.lens_i64);
  const int64_t capacity = p.table_width * p.page_size;
  len = len < 0 ? 0 : (len > capacity ? capacity : len);
  const int64_t tiles_total = (len + kTile - 1) / kTile;
  const int64_t tiles_per_split = (tiles_total + p.num_splits - 1) / p.num_splits;
  const int64_t lo = split * tiles_per_split * kTile;
  const int64_t hi = lo + tiles_per_split * kTile < len ? lo + tiles_per_split * kTile : len;
  const int64_t tiles = hi > lo ? (hi - lo + kTile - 1) / kTile : 0;

  const bool aligned = (reinterpret_cast<uintptr_t>(p.cache) % 16 == 0) && (p.cache_stride_page % 8 == 0) &&
                       (p.cache_stride_tok % 8 == 0);
  if (tiles > 0) {
    load_tile<T>(p, b, lo, hi, sK[0], sValid, aligned);
    cp_async_commit();
  }
  // Q rows of this head group (heads past the count are zeros; their rows are never written out).
  const T* q = static_cast<const T*>(p.q);
  for (int i = tid; i < kRows * kDim; i += kThreads) {
    const int r = i / kDim, c = i % kDim, head = hg * kRows + r;
    sQ[r * kRowElems + c] = head < p.heads ? q[b * p.q_stride_b + head * p.q_stride_h + c] : from_float<T>(0.f);
  }

  // Softmax state: thread tid owns row tid / kRowThreads (replicated over its kRowThreads lanes).
  const int srow = tid / kRowThreads, scol = (tid % kRowThreads) * kRowCols;
  const float p_inv = __frcp_rn(p.p_scale);
  float m_run = -INFINITY, l_run = 0.f;
  float acc[HT][16][4];
#pragma unroll
  for (int mt = 0; mt < HT; ++mt)
#pragma unroll
    for (int nt = 0; nt < 16; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;

  for (int64_t t = 0; t < tiles; ++t) {
    const int buf = static_cast<int>(t & 1);
    cp_async_wait_all();
    __syncthreads();  // tile t is in sK[buf]; every warp is done with tile t - 1
    if (t + 1 < tiles) {
      load_tile<T>(p, b, lo + (t + 1) * kTile, hi, sK[buf ^ 1], sValid + (buf ^ 1) * kTile, aligned);
      cp_async_commit();
    }
    const T* kt = sK[buf];
    if (k_codes || v_codes) {
      quantize_tile<T>(p, kt, sKc, sVc);
      __syncthreads();
    }
    const T* kd = k_codes ? sKc : kt;
    const T* vd = v_codes ? sVc : (p.v_from_k ? sKc : kt);
    const int vstride = v_codes ? kVRowElems : kRowElems;

    // 2. scores: warp w -> keys 8w..8w+7 of every head row
    {
      float s[HT][4];
#pragma unroll
      for (int mt = 0; mt < HT; ++mt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][e] = 0.f;
      const T* kb = kd + (warp * 8 + (lane & 7)) * kRowElems + ((lane >> 3) & 1) * 8;
#pragma unroll 4
      for (int kk = 0; kk < kDim / 16; ++kk) {
        uint32_t bf[2];
        ldmatrix_x2(bf, kb + kk * 16);
#pragma unroll
        for (int mt = 0; mt < HT; ++mt) {
          uint32_t af[4];
          ldmatrix_x4(af, sQ + (mt * 16 + (lane & 15)) * kRowElems + kk * 16 + (lane >> 4) * 8);
          Mma<T>::run(s[mt], af, bf[0], bf[1]);
        }
      }
      const int* valid = sValid + buf * kTile;
      const int key = warp * 8 + 2 * q4;
      const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;
#pragma unroll
      for (int mt = 0; mt < HT; ++mt) {
        float* r0 = sS + (mt * 16 + g) * kSRow + key;
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

    // 4. acc = acc * alpha + P V: warp w -> output columns 128w..128w+127
#pragma unroll
    for (int mt = 0; mt < HT; ++mt) {
      const float a0 = sAlpha[mt * 16 + g], a1 = sAlpha[mt * 16 + g + 8];
#pragma unroll
      for (int nt = 0; nt < 16; ++nt) {
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
      const T* vb = vd + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * vstride + warp * 128 + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < 8; ++np) {
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
      for (int nt = 0; nt < 16; ++nt) {
        const int col = warp * 128 + nt * 8 + 2 * q4;
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

// One CTA of 128 threads per (request, head): o = sum_i exp(lse_i - lse) o_i, lse = logsumexp(lse_i).
__global__ void __launch_bounds__(kThreads) decode_combine_kernel(const DecodeParams p) {
  const int64_t row = blockIdx.x;
  const float* lses = p.part_lse + row * p.num_splits;
  float lse_max = -INFINITY;
  for (int i = 0; i < p.num_splits; ++i) lse_max = fmaxf(lse_max, lses[i]);
  const float safe_max = lse_max == -INFINITY ? 0.f : lse_max;
  float total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const int col = threadIdx.x * 4;
  for (int i = 0; i < p.num_splits; ++i) {
    const float w = expf(lses[i] - safe_max);  // an empty split: exp(-inf) = 0
    if (w == 0.f) continue;                    // its partial is 0 anyway; skip the read
    const float4 o = *reinterpret_cast<const float4*>(p.part_o + (row * p.num_splits + i) * kNope + col);
    acc.x += w * o.x;
    acc.y += w * o.y;
    acc.z += w * o.z;
    acc.w += w * o.w;
    total += w;
  }
  const float inv = total == 0.f ? 0.f : 1.f / total;
  const float o[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
  if (p.out_dtype == kFP32) {
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * kNope + col) = make_float4(o[0], o[1], o[2], o[3]);
  } else if (p.out_dtype == kBF16) {
    __nv_bfloat162* dst = reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(p.out) + row * kNope + col);
    dst[0] = __floats2bfloat162_rn(o[0], o[1]);
    dst[1] = __floats2bfloat162_rn(o[2], o[3]);
  } else {
    __half2* dst = reinterpret_cast<__half2*>(static_cast<__half*>(p.out) + row * kNope + col);
    dst[0] = __floats2half2_rn(o[0], o[1]);
    dst[1] = __floats2half2_rn(o[2], o[3]);
  }
  if (threadIdx.x == 0 && p.lse != nullptr) p.lse[row] = total == 0.f ? -INFINITY : safe_max + logf(total);
}

template <typename T, int HT>
cudaError_t launch_split(const DecodeParams& p, cudaStream_t stream) {
  const SharedLayout lay = shared_layout(HT, p.k_fmt != kNoQuant, p.v_fmt != kNoQuant && !p.v_from_k);
  // Once per device and instantiation, for the largest layout (not a stream operation: capture-safe).
  static bool attribute_set[kMaxDevices] = {};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  if (device >= kMaxDevices || !attribute_set[device]) {
    err = cudaFuncSetAttribute(decode_split_kernel<T, HT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               shared_layout(HT, true, true).bytes);
    if (err != cudaSuccess) return err;
    if (device < kMaxDevices) attribute_set[device] = true;
  }
  const int head_groups = (p.heads + 16 * HT - 1) / (16 * HT);
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.num_splits * head_groups;
  decode_split_kernel<T, HT><<<static_cast<unsigned>(ctas), kThreads, lay.bytes, stream>>>(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_split_t(const DecodeParams& p, cudaStream_t stream) {
  return p.head_tiles == 2 ? launch_split<T, 2>(p, stream) : launch_split<T, 1>(p, stream);
}

}  // namespace

int decode_smem_bytes(const DecodeParams& p) {
  return shared_layout(p.head_tiles, p.k_fmt != kNoQuant, p.v_fmt != kNoQuant && !p.v_from_k).bytes;
}

cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  cudaError_t err = p.dtype == kFP16 ? launch_split_t<__half>(p, stream) : launch_split_t<__nv_bfloat16>(p, stream);
  if (err != cudaSuccess || p.num_splits == 1) return err;
  decode_combine_kernel<<<static_cast<unsigned>(static_cast<int64_t>(p.batch) * p.heads), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
