// The WGMMA decode's entry point (launch_decode_wgmma, decode_wgmma_supported) and the keys-as-M kernels'
// instances (decode_t_kernel, decode_km_kernel: four). The kernels are in mla_decode_wgmma.cuh; the 18 instances of
// decode_wgmma_kernel are instantiated by mla_decode_wgmma_{bf16,fp16}_{kv,kv_fp8,cache_fp8}.cu, one launcher each
// (launch_decode_wgmma_kv), and the two of decode_wgmma_ring4_kernel (config ring4) by
// mla_decode_wgmma_{bf16,fp16}_ring4.cu (launch_decode_wgmma_ring4), so that nvcc compiles them in parallel.

#include "mla_decode_wgmma.cuh"

namespace mla_core_cuda {
namespace {

template <typename T>
cudaError_t launch_split_t(const DecodeParams& p, cudaStream_t stream) {
  if (p.keys_m) return launch_km<T>(p, stream);
  if (p.ring4) return launch_decode_wgmma_ring4<T>(p, stream);
  if (p.cache_fp8 && p.heads <= kHeadsT && p.p_fmt == kNoQuant) return launch_t<T>(p, stream);
  if (p.cache_fp8) return launch_decode_wgmma_kv<T, kCodes>(p, stream);
  return p.k_fmt == kFP8 ? launch_decode_wgmma_kv<T, kFP8>(p, stream)
                         : launch_decode_wgmma_kv<T, kNoQuant>(p, stream);
}

}  // namespace

bool decode_wgmma_supported(const DecodeParams& p) {
  // K and V share the stage: quantized, their values on the 512 shared columns must be the same codes (FP8 with
  // one scale); the producer's K conversion divides without a division instruction only (no exact_div). An FP8
  // cache: K and V are its codes (no fake quantization of them). keys_m (decode_km_kernel): a bf16 / fp16 cache, no
  // fake quantization, at most 16 heads (one head group)
  const bool kv = (p.k_fmt == kNoQuant && p.v_fmt == kNoQuant) ||
                  (!p.cache_fp8 && p.k_fmt == kFP8 && p.v_fmt == kFP8 && p.v_from_k && !p.exact_div);
  const bool keys_m = !p.keys_m || (p.heads <= kHeadsT && !p.cache_fp8 && p.k_fmt == kNoQuant &&
                                     p.v_fmt == kNoQuant && p.p_fmt == kNoQuant);
  // ring4 (decode_wgmma_ring4_kernel: schedule Q1 on four 32-key slots): a bf16 / fp16 cache, no fake quantization,
  // not with keys_m; any head count
  const bool ring4 = !p.ring4 || (!p.keys_m && !p.cache_fp8 && p.k_fmt == kNoQuant && p.v_fmt == kNoQuant &&
                                   p.p_fmt == kNoQuant);
  return p.heads > 0 && kv && keys_m && ring4 && (p.p_fmt == kNoQuant || p.p_fmt == kFP8 || p.p_fmt == kNVFP4) &&
         (p.dtype == kBF16 || p.dtype == kFP16);
}

cudaError_t launch_decode_wgmma(const DecodeParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (!decode_wgmma_supported(p)) return cudaErrorInvalidValue;
  const cudaError_t err = p.dtype == kFP16 ? launch_split_t<__half>(p, stream) : launch_split_t<__nv_bfloat16>(p, stream);
  if (err != cudaSuccess || p.num_splits == 1) return err;
  return launch_combine(p, stream);
}

}  // namespace mla_core_cuda
