// The mma.sync decode's four bf16 split kernels (CTA shapes (1, 4), (2, 4), (2, 8), (4, 8)) behind their launcher:
// one translation unit of the mma.sync decode (mla_decode_mma.cuh says why it is split).

#include "mla_decode_mma.cuh"

namespace mla_core_cuda {

template <>
cudaError_t launch_decode_split<__nv_bfloat16>(const DecodeParams& p, cudaStream_t stream) {
  return launch_split_t<__nv_bfloat16>(p, stream);
}

}  // namespace mla_core_cuda
