// SASS instruction count of P's NVFP4 step in the prefill kernel (csrc/mla_prefill_wgmma.cu's p_nvfp4, this tree's)
// against round (m)'s form kept here (p_nvfp4_round_m: per-thread float32 block maxima over 16 xor shuffles, every
// lane's 1 / s by __frcp_rn, the select form of the E2M1 rounding, the code multiplied in float32, pack_p's 16 pair
// conversions). Both write P's A fragments from the same float32 P. CPU only: compile and count
// (benchmarks/probes/prefill_p_nvfp4_count.sh). Never launched.
#include "../../csrc/mla_prefill_wgmma.cu"

namespace mla_core_cuda {
namespace {

__device__ __forceinline__ float round_e2m1_nonneg_round_m(float x) {
  const float m = x < 2.f ? 6291456.f : (x < 4.f ? 12582912.f : 25165824.f);
  const float r = __fsub_rn(__fadd_rn(x, m), m);
  return r > 6.f ? 6.f : r;
}

template <int kP>
__device__ __forceinline__ void p_nvfp4_round_m(float (&sc)[32], uint32_t (&pa)[4][4], float g, float rg, int lane) {
  float bmax[8];
#pragma unroll
  for (int e = 0; e < 32; e += 2) {
    const uint32_t w = bf16x2_bits(sc[e], sc[e + 1]);
    sc[e] = __uint_as_float(w << 16);
    sc[e + 1] = __uint_as_float(w & 0xffff0000u);
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    bmax[2 * ks] = fmaxf(fmaxf(sc[8 * ks], sc[8 * ks + 1]), fmaxf(sc[8 * ks + 4], sc[8 * ks + 5]));
    bmax[2 * ks + 1] = fmaxf(fmaxf(sc[8 * ks + 2], sc[8 * ks + 3]), fmaxf(sc[8 * ks + 6], sc[8 * ks + 7]));
  }
#pragma unroll
  for (int d = 1; d <= 2; d <<= 1)
#pragma unroll
    for (int b = 0; b < 8; ++b) bmax[b] = fmaxf(bmax[b], __shfl_xor_sync(0xffffffffu, bmax[b], d));
  const int q = lane & 3;
  auto code_of = [&](float m) { return kP == 3 ? nvfp4_block_code_div_free(m, g, rg) : nvfp4_block_code(m, g); };
  const float own[2] = {code_of(q == 0 ? bmax[0] : (q == 1 ? bmax[2] : (q == 2 ? bmax[4] : bmax[6]))),
                        code_of(q == 0 ? bmax[1] : (q == 1 ? bmax[3] : (q == 2 ? bmax[5] : bmax[7])))};
#pragma unroll
  for (int b = 0; b < 8; ++b) {
    const BlockScale bs = nvfp4_code_scale(__shfl_sync(0xffffffffu, own[b & 1], (lane & ~3) | (b >> 1)), g);
    const int e0 = 8 * (b >> 1) + 2 * (b & 1);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int e = e0 + (i & 1) + 4 * (i >> 1);
      sc[e] = round_e2m1_nonneg_round_m(div_rn(sc[e], bs.s, bs.inv_s, kP == 4)) * bs.code;
    }
  }
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) pa[ks][i] = bf16x2_bits(sc[8 * ks + 2 * i], sc[8 * ks + 2 * i + 1]);
}

// kNew 1: this tree's p_nvfp4; 0: round (m)'s. The step sits between the loads and the stores.
template <int kP, int kNew>
__global__ void p_step_probe(const float* x, const float* gp, uint32_t* out) {
  float sc[32];
  uint32_t pa[4][4];
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int e = 0; e < 32; ++e) sc[e] = x[threadIdx.x * 32 + e];
  if constexpr (kNew)
    p_nvfp4<kP>(sc, pa, gp[0], gp[1], lane);
  else
    p_nvfp4_round_m<kP>(sc, pa, gp[0], gp[1], lane);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks)
#pragma unroll
    for (int i = 0; i < 4; ++i) out[threadIdx.x * 16 + 4 * ks + i] = pa[ks][i];
}
template __global__ void p_step_probe<3, 0>(const float*, const float*, uint32_t*);
template __global__ void p_step_probe<3, 1>(const float*, const float*, uint32_t*);
template __global__ void p_step_probe<4, 0>(const float*, const float*, uint32_t*);
template __global__ void p_step_probe<4, 1>(const float*, const float*, uint32_t*);

}  // namespace
}  // namespace mla_core_cuda
