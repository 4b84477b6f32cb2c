// decode_wgmma_ring4_kernel's fp16 instance (config ring4: schedule Q1 on four 32-key ring slots), behind its
// launcher: one translation unit of the WGMMA decode (mla_decode_wgmma.cuh says why it is split).

#include "mla_decode_wgmma.cuh"

namespace mla_core_cuda {

template <>
cudaError_t launch_decode_wgmma_ring4<__half>(const DecodeParams& p, cudaStream_t stream) {
  return launch_ring4<__half>(p, stream);
}

}  // namespace mla_core_cuda
