// hopper.cuh: Hopper (sm_90a) building blocks shared by the WGMMA kernels (csrc/*_wgmma.cu) and the experiment
// probes in benchmarks/probes/ (which add their own in probe_common.cuh): shared-memory addresses and matrix
// descriptors (128- and 64-byte swizzle), the wgmma fence / commit / wait and register fence, setmaxnreg, cp.async,
// bulk copies, TMA boxes and the tensor-map encoder, mbarriers (with expected transactions) and named
// barriers, 1024-byte alignment, 2^x, E4M3 codes to bf16 or f16, two floats packed as bf16, and the scaling of m64n256
// accumulator rows. Layout, descriptors and ordering rules: docs/cuda.md ("Hopper building blocks, verified").
// Inline PTX only; a wgmma instruction compiles only where the target is sm_90a. What only the two seesaw decode
// kernels share: seesaw.cuh.
#pragma once

#include <cuda.h>  // CUtensorMap and its enums only: the encoder comes from the driver at run time (no -lcuda)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MLA_HOPPER_SM90A 1
#endif

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Shared-memory matrix descriptor (64 bits): start address >> 4 in [0,14), leading byte offset >> 4 in [16,30),
// stride byte offset >> 4 in [32,46), base offset in [49,52) (0: slabs are 1024-aligned), layout type in
// [62,64) with 1 = 128-byte swizzle.
__device__ __forceinline__ uint64_t make_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFFu) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}
// The same for a K-major operand in [rows x 64 B] parts with the 64-byte swizzle (layout type 2): byte b of row r
// at r·64 + ((b/16 ⊕ (r/2) mod 4)·16) + b mod 16 from a 512-byte-aligned base, 8-row groups SBO = 512 B apart (LBO
// unused: a k32 step of e4m3, 32 B, lies inside a row).
__device__ __forceinline__ uint64_t make_desc_sw64(uint32_t saddr) {
  return static_cast<uint64_t>((saddr & 0x3FFFFu) >> 4) | (static_cast<uint64_t>(1u) << 16) |
         (static_cast<uint64_t>(512u >> 4) << 32) | (2ull << 62);
}

// wgmma ordering: fence before the first wgmma that reads registers or shared memory written since, commit the
// issued wgmma as one group, wait for groups (outside sm_90a all are empty; the wgmma themselves trap there).
__device__ __forceinline__ void wg_fence() {
#ifdef MLA_HOPPER_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void wg_commit() {
#ifdef MLA_HOPPER_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
// Waits until at most N committed wgmma groups of this warpgroup are in flight.
template <int N>
__device__ __forceinline__ void wg_wait() {
#ifdef MLA_HOPPER_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// Ties registers to a point in the instruction stream, so the compiler neither reads accumulators before the
// wait that makes them valid nor moves their initialization past the first wgmma.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}
// Warp specialization: this warpgroup's per-thread register budget lowered / raised to N (all its warps execute
// it; a producer warpgroup gives registers to the consumers).
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifdef MLA_HOPPER_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifdef MLA_HOPPER_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
// Orders generic-proxy writes to shared memory before async-proxy reads (wgmma, TMA) of them.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// 16-byte cp.async into shared memory; src_bytes 0 writes 16 zero bytes and reads nothing (a masked row).
__device__ __forceinline__ void cp_async16(uint8_t* dst, const void* src, uint32_t src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src), "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// The first 1024-byte-aligned address at or after p (rounded as an integer: a generic pointer).
__device__ __forceinline__ uint8_t* align1024(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 1023) & ~static_cast<uintptr_t>(1023));
}

// An m64n256 accumulator tile's rows scaled: the thread's row r by a_lo, its row r + 8 (j % 4 >= 2) by a_hi.
__device__ __forceinline__ void scale_rows(float (&o)[128], float a_lo, float a_hi) {
#pragma unroll
  for (int j = 0; j < 128; ++j) o[j] *= (j & 2) ? a_hi : a_lo;
}

// 2^x by the SFU (ex2.approx.ftz: relative error ~2^-22, denormal results flushed); -inf -> +0.
__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// mbarrier in shared memory: init (thread count per phase), arrive (release at CTA scope), wait for the phase of
// the given parity to complete (acquire), or test it.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  } while (!done);
}

// Whether the phase of the given parity has completed, without waiting (acquire when it has).
__device__ __forceinline__ bool mbar_test(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
}
// mbarrier arrive (release, CTA scope) that also adds `bytes` to the phase's expected transaction count: the phase
// completes once every arrival is in and that many bytes of complete_tx copies have landed.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
// One bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory by the
// async proxy, completing `bytes` transactions on `bar`. The issuing thread does not wait for it.
__device__ __forceinline__ void bulk_copy(uint8_t* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n"
               ::"r"(smem_u32(dst)), "l"(src), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}

// TMA (cp.async.bulk.tensor) of one 3D box at coordinates (c0, c1, c2) of `map` (innermost first) into `dst`,
// completing its bytes on `bar` (the issuing thread's arrival on it is mbar_arrive_expect_tx of all its boxes' bytes).
// With the 128-byte swizzle and a [rows x 128 B] box, dst 1024-aligned plus a multiple of 8 rows: the slab layout.
__device__ __forceinline__ void tma_slab(uint8_t* dst, const CUtensorMap* map, int c0, int c1, int c2, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_u32(dst)), "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}

typedef CUresult (*EncodeTiledFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                  const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                  CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

// cuTensorMapEncodeTiled from the driver, looked up once (null when the driver has none). Host code.
inline EncodeTiledFn tma_encoder() {
  static EncodeTiledFn fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult res;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &res) != cudaSuccess ||
        res != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiledFn>(nullptr);
    return reinterpret_cast<EncodeTiledFn>(f);
  }();
  return fn;
}

// A 3D tensor map of 16-bit elements `type` at `base` (dims innermost first; the strides of dims 1 and 2 in bytes)
// with the 128-byte swizzle, so a box 64 elements wide lands as a slab (tma_slab); the map zeroed and false when the
// encoder refuses. Host code.
inline bool slab_tensor_map(CUtensorMap* m, EncodeTiledFn encode, CUtensorMapDataType type, const void* base,
                            const cuuint64_t (&dims)[3], const cuuint64_t (&strides)[2], const cuuint32_t (&box)[3]) {
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const bool ok = encode(m, type, 3, const_cast<void*>(base), dims, strides, box, element_strides,
                         CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                         CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
  if (!ok) std::memset(m, 0, sizeof(*m));
  return ok;
}

// Named barrier `id` (1..15; 0 is __syncthreads) over kCount threads: sync waits for the generation, arrive
// counts this thread in without waiting.
template <int kCount>
__device__ __forceinline__ void nb_sync(int id) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}
template <int kCount>
__device__ __forceinline__ void nb_arrive(int id) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "n"(kCount) : "memory");
}

// Two floats rounded to bf16 (nearest even) and packed, lo in the low half: a wgmma A-fragment register, or two
// adjacent bf16 outputs stored at once.
__device__ __forceinline__ uint32_t bf16x2_bits(float lo, float hi) {  // nearest even, lo in the low half
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Four E4M3 codes (bytes of w, lowest first) as f16 pairs lo = (code 0, code 1), hi = (code 2, code 3), exactly
// (every E4M3 value is an f16 normal or zero; NaN stays NaN): the hardware's code-pair conversion, twice.
__device__ __forceinline__ void e4m3x4_to_f16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  asm("{\n.reg .b16 a, b;\nmov.b32 {a, b}, %2;\ncvt.rn.f16x2.e4m3x2 %0, a;\ncvt.rn.f16x2.e4m3x2 %1, b;\n}\n"
      : "=r"(lo), "=r"(hi) : "r"(w));
}
// Four E4M3 codes (bytes of w, lowest first) as bf16 pairs lo = (code 0, code 1), hi = (code 2, code 3), exactly:
// e4m3x4_to_f16, then each f16 widens exactly to float32, and the upper halves of two such floats are the bf16
// pair (an E4M3 value has 3 significant mantissa bits, so the lower halves are zero). Per code pair: one
// conversion, two widenings, one byte permute. The one definition of E4M3 -> bf16 (the decode's FP8 cache, the
// sparse kernel's 656-byte rows).
__device__ __forceinline__ void e4m3x4_to_bf16(uint32_t w, uint32_t& lo, uint32_t& hi) {
  uint32_t f0, f1;
  e4m3x4_to_f16(w, f0, f1);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&f0));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&f1));
  lo = __byte_perm(__float_as_uint(a.x), __float_as_uint(a.y), 0x7632);
  hi = __byte_perm(__float_as_uint(b.x), __float_as_uint(b.y), 0x7632);
}
// 16 codes as 32 bytes of bf16.
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4& w, uint4& lo, uint4& hi) {
  e4m3x4_to_bf16(w.x, lo.x, lo.y);
  e4m3x4_to_bf16(w.y, lo.z, lo.w);
  e4m3x4_to_bf16(w.z, hi.x, hi.y);
  e4m3x4_to_bf16(w.w, hi.z, hi.w);
}

// 16 codes as 32 bytes of f16, exactly: lo = codes 0-7, hi = codes 8-15 (8 conversions against
// e4m3x16_to_bf16's 8 + 16 widenings + 8 byte permutes).
__device__ __forceinline__ void e4m3x16_to_f16(const uint4& w, uint4& lo, uint4& hi) {
  e4m3x4_to_f16(w.x, lo.x, lo.y);
  e4m3x4_to_f16(w.y, lo.z, lo.w);
  e4m3x4_to_f16(w.z, hi.x, hi.y);
  e4m3x4_to_f16(w.w, hi.z, hi.w);
}

