// The mma.sync decode's entry points (launch_decode, decode_shape_supported) and the combine kernel both decodes
// merge their splits with (launch_combine). The split kernel is in mla_decode_mma.cuh; its eight instances are
// instantiated by mla_decode_bf16.cu and mla_decode_fp16.cu (launch_decode_split), so that nvcc compiles them in
// parallel.

#include "mla_decode_mma.cuh"

namespace mla_core_cuda {
namespace {

// One CTA of kCombineThreads per (request, head): o = sum_i w_i o_i / sum_i w_i with w_i = exp(lse_i - max_i lse_i),
// lse = max + log(sum_i w_i), summed in split order; an empty split (lse -inf, w 0) is skipped (its partial, read
// with the others so that the loads need no weight first, is never used). Thread t loads split t's LSE and writes
// its weight to shared memory once; then each thread reads its 4 columns of kBatch partial rows with their loads
// issued together, so that a batch of splits costs one L2 round trip rather than one per split (at batch 1 these
// few CTAs are the decode's tail). Launched with programmatic stream serialization (launch_combine):
// griddepcontrol.wait holds it until the split kernel's partials are visible.
// Two instances (launch_combine): kBatch 4 for <= 4 splits (large batches: many CTAs, each SM's occupancy keeps the
// loads in flight) and kBatch 16 above (few CTAs at small batch: each thread keeps 16 loads in flight; its
// __launch_bounds__ target of 4 CTAs an SM gives ptxas the registers, at its default of 16 it keeps 3 loads).
template <int kBatch>
__global__ void __launch_bounds__(kCombineThreads, kBatch == 4 ? 16 : 4) decode_combine_kernel(const DecodeParams p) {
  __shared__ float weights[kCombineThreads];
  __shared__ float warp_max[kCombineThreads / 32];
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t row = blockIdx.x;
  const int splits = p.num_splits;  // <= kCombineThreads (launch_combine)
  const int t = threadIdx.x;
  const float lse_t = t < splits ? p.part_lse[row * splits + t] : -INFINITY;
  float lse_max = lse_t;
  for (int lane_mask = 16; lane_mask > 0; lane_mask >>= 1)
    lse_max = fmaxf(lse_max, __shfl_xor_sync(0xffffffffu, lse_max, lane_mask));
  if (t % 32 == 0) warp_max[t / 32] = lse_max;
  __syncthreads();
  lse_max = warp_max[0];
  for (int w = 1; w < kCombineThreads / 32; ++w) lse_max = fmaxf(lse_max, warp_max[w]);
  const float safe_max = lse_max == -INFINITY ? 0.f : lse_max;
  if (t < splits) weights[t] = expf(lse_t - safe_max);  // an empty split: exp(-inf) = 0
  __syncthreads();
  const int col = t * 4;
  const float4* part = reinterpret_cast<const float4*>(p.part_o + row * splits * kNope + col);  // split 0's columns
  float total = 0.f;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  for (int first = 0; first < splits; first += kBatch) {
    float w[kBatch];
    float4 o[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      const bool present = first + j < splits;
      w[j] = present ? weights[first + j] : 0.f;
      o[j] = present ? part[(first + j) * (kNope / 4)] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
#pragma unroll
    for (int j = 0; j < kBatch; ++j) {
      if (w[j] == 0.f) continue;
      acc.x += w[j] * o[j].x;
      acc.y += w[j] * o[j].y;
      acc.z += w[j] * o[j].z;
      acc.w += w[j] * o[j].w;
      total += w[j];
    }
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
  if (t == 0 && p.lse != nullptr) p.lse[row] = total == 0.f ? -INFINITY : safe_max + logf(total);
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
  if (p.num_splits > kCombineThreads) return cudaErrorInvalidValue;
  // Programmatic dependent launch: the combine's CTAs may be scheduled before the split kernel has finished (they
  // wait in griddepcontrol.wait), which hides the gap between the two launches.
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(static_cast<unsigned>(static_cast<int64_t>(p.batch) * p.heads));
  config.blockDim = dim3(kCombineThreads);
  config.stream = stream;
  config.attrs = &attribute;
  config.numAttrs = 1;
  return p.num_splits <= 4 ? cudaLaunchKernelEx(&config, decode_combine_kernel<4>, p)
                           : cudaLaunchKernelEx(&config, decode_combine_kernel<16>, p);
}

}  // namespace mla_core_cuda
