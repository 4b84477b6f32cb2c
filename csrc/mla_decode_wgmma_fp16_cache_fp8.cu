// decode_wgmma_kernel's three fp16 instances (P none, FP8, NVFP4) for an FP8 cache (E4M3 codes),
// behind their launcher: one translation unit of the WGMMA decode (mla_decode_wgmma.cuh says why it is split).

#include "mla_decode_wgmma.cuh"

namespace mla_core_cuda {

template <>
cudaError_t launch_decode_wgmma_kv<__half, kCodes>(const DecodeParams& p, cudaStream_t stream) {
  return launch_split_p<__half, kCodes>(p, stream);
}

}  // namespace mla_core_cuda
