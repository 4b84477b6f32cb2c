// The mma.sync decode's entry points (launch_decode, decode_shape_supported) and the combine kernel both decodes
// merge their splits with (launch_combine). The split kernel is in mla_decode_mma.cuh; its eight instances are
// instantiated by mla_decode_bf16.cu and mla_decode_fp16.cu (launch_decode_split), so that nvcc compiles them in
// parallel.

#include "mla_decode_mma.cuh"

namespace mla_core_cuda {
namespace {

// One CTA of 128 threads per (request, head): o = sum_i exp(lse_i - lse) o_i, lse = logsumexp(lse_i).
__global__ void __launch_bounds__(kCombineThreads) decode_combine_kernel(const DecodeParams p) {
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

}  // namespace

bool decode_shape_supported(int head_tiles, int warps) {
  return (head_tiles == 1 && warps == 4) || (head_tiles == 2 && (warps == 4 || warps == 8)) ||
         (head_tiles == 4 && warps == 8);
}

cudaError_t launch_decode(const DecodeParams& p, cudaStream_t stream) {
  if (p.batch == 0) return cudaSuccess;
  if (!decode_shape_supported(p.head_tiles, p.warps)) return cudaErrorInvalidValue;
  cudaError_t err =
      p.dtype == kFP16 ? launch_decode_split<__half>(p, stream) : launch_decode_split<__nv_bfloat16>(p, stream);
  if (err != cudaSuccess || p.num_splits == 1) return err;
  return launch_combine(p, stream);
}

cudaError_t launch_combine(const DecodeParams& p, cudaStream_t stream) {
  decode_combine_kernel<<<static_cast<unsigned>(static_cast<int64_t>(p.batch) * p.heads), kCombineThreads, 0,
                          stream>>>(p);
  return cudaGetLastError();
}

}  // namespace mla_core_cuda
