// decode_wgmma_kernel's three bf16 instances (P none, FP8, NVFP4) without K / V fake quantization,
// behind their launcher: one translation unit of the WGMMA decode (mla_decode_wgmma.cuh says why it is split).

#include "mla_decode_wgmma.cuh"

namespace mla_core_cuda {

template <>
cudaError_t launch_decode_wgmma_kv<__nv_bfloat16, kNoQuant>(const DecodeParams& p, cudaStream_t stream) {
  return launch_split_p<__nv_bfloat16, kNoQuant>(p, stream);
}

}  // namespace mla_core_cuda
