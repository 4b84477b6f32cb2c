// A/B timing of a version of csrc/mla_prefill_wgmma.cu without PyTorch: build one binary per version and run them
// alternately, so two kernels are compared in the same machine state (the bench's one-run ratios move +-3-6 % from
// run to run with the clock):
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -DPREFILL_SRC='"<dir>/mla_prefill_wgmma.cu"' \
//        -o ab_x benchmarks/probes/prefill_ab.cu
//   ./ab_x <label>
// Written against the tree's API (one pre-pass launch for K and V, Q's codes in the kernel: q_fmt); sources before
// that change need main's copy of this file before 0ce85af. (The round-2 persistent variant it was written for, 89103da, needed a counter and Q's scale in PrefillParams:
// that version of this file is in git at 3c974bf; benchmarks/NOTES.md "cuda prefill, round 2".)
// Causal, 128 heads, q/k 192, v 128, inputs uniform in [-2, 2); 4 x 4096, 1 x 16384 and ragged16 (bench_prefill.py's
// cases), bf16 and the fp8 recipe
// (Q/K/V/P, amax 4 and 1): median and minimum µs of 12 launches, each after a 256 MB memset (L2 flushed).
#include PREFILL_SRC

#include <algorithm>
#include <cstdio>
#include <vector>

using namespace mla_core_cuda;

__global__ void fill_uniform(uint16_t* x, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = (h >> 8) * (4.f / 16777216.f) - 2.f;
    const __nv_bfloat16 b = __float2bfloat16(u);
    x[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

#define CHECK(x)                                                                   \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      std::printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__); \
      return 1;                                                                    \
    }                                                                              \
  } while (0)

int main(int argc, char** argv) {
  const char* label = argc > 1 ? argv[1] : "?";
  const int H = 128;
  const int64_t T = 33430, nq = T * H * 192, nv = T * H * 128;  // ragged16's tokens (the most of the three cases)
  uint16_t *q, *k, *v, *qc, *kc, *vc, *out;
  float* lse;
  int32_t* cu;
  void* flush;
  CHECK(cudaMalloc(&q, nq * 2));
  CHECK(cudaMalloc(&k, nq * 2));
  CHECK(cudaMalloc(&v, nv * 2));
  CHECK(cudaMalloc(&qc, nq * 2));
  CHECK(cudaMalloc(&kc, nq * 2));
  CHECK(cudaMalloc(&vc, nv * 2));
  CHECK(cudaMalloc(&out, nv * 2));
  CHECK(cudaMalloc(&lse, T * H * 4));
  CHECK(cudaMalloc(&cu, 17 * 4));
  CHECK(cudaMalloc(&flush, 256 << 20));
  fill_uniform<<<1024, 256>>>(q, nq, 1);
  fill_uniform<<<1024, 256>>>(k, nq, 2);
  fill_uniform<<<1024, 256>>>(v, nv, 3);
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  const float log2e = 1.4426950408889634f, sm = 0.07216878364870322f;  // 192^-0.5
  const float s_in = 4.f / 448.f, p_scale = 1.f / 448.f;
  struct Case {
    const char* name;
    std::vector<int> lens;
  };
  const std::vector<Case> cases = {
      {"4x4096", {4096, 4096, 4096, 4096}},
      {"1x16384", {16384}},
      {"ragged16", {128, 169, 223, 294, 388, 512, 676, 891, 1176, 1552, 2048, 2702, 3566, 4705, 6208, 8192}}};
  for (const Case& c : cases) {
    std::vector<int32_t> h_cu(1, 0);
    for (int n : c.lens) h_cu.push_back(h_cu.back() + n);
    CHECK(cudaMemcpy(cu, h_cu.data(), h_cu.size() * 4, cudaMemcpyHostToDevice));
    const int64_t tokens = h_cu.back();
    for (int fp8 = 0; fp8 < 2; ++fp8) {
      PrefillParams p{};
      p.q_stride_t = H * 192;
      p.q_stride_h = 192;
      p.k_stride_t = H * 192;
      p.k_stride_h = 192;
      p.v_stride_t = H * 128;
      p.v_stride_h = 128;
      p.total_q = p.total_k = tokens;
      p.heads = p.kv_heads = H;
      p.batch = static_cast<int>(c.lens.size());
      p.max_seqlen_q = *std::max_element(c.lens.begin(), c.lens.end());
      p.cu_q = p.cu_k = cu;
      p.causal = 1;
      p.out = out;
      p.lse = lse;
      p.p_scale = p.p_rscale = 1.f;
      p.scale_log2 = sm * log2e;
      p.out_scale = 1.f;
      if (fp8) {
        p.p_fmt = 1;
        p.p_scale = p_scale;
        p.p_rscale = 1.f / p_scale;
        p.scale_log2 = sm * log2e * s_in * s_in;
        p.out_scale = s_in * p_scale;
      }
      auto run = [&]() -> cudaError_t {
        cudaError_t e = cudaSuccess;
        p.q = q, p.k = k, p.v = v;
        if (fp8) {  // K and V's codes in one pre-pass launch, Q's in the kernel (the library's recipe)
          FP8CodesJobs jobs{};
          jobs.x[0] = k, jobs.x[1] = v, jobs.out[0] = kc, jobs.out[1] = vc;
          jobs.n8[0] = tokens * H * 192 / 8, jobs.n8[1] = tokens * H * 128 / 8;
          jobs.scale[0] = jobs.scale[1] = s_in;
          jobs.rscale[0] = jobs.rscale[1] = 1.f / s_in;
          if ((e = launch_fp8_codes_bf16(jobs, false, 0)) != cudaSuccess) return e;
          p.k = kc, p.v = vc;
          p.q_fmt = 1, p.q_scale = s_in, p.q_rscale = 1.f / s_in;
        }
        return launch_prefill_wgmma(p, 0);
      };
      std::vector<float> ts;
      for (int it = 0; it < 14; ++it) {
        CHECK(cudaMemsetAsync(flush, it & 0xff, 256 << 20));
        CHECK(cudaEventRecord(e0));
        CHECK(run());
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (it >= 2) ts.push_back(ms * 1000.f);
      }
      std::sort(ts.begin(), ts.end());
      std::printf("AB %-10s %-8s %-5s median %8.0f us  min %8.0f us\n", label, c.name, fp8 ? "fp8" : "bf16",
                  ts[ts.size() / 2], ts[0]);
      std::fflush(stdout);
    }
  }
  return 0;
}
