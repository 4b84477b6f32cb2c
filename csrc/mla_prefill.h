// Varlen MLA prefill for sm_90a (mla_prefill_wgmma.cu, mla_prefill_fp8.cu): the launch parameters shared by the kernels
// and the PyTorch binding (bindings.cpp). Plain data only, so the .cu files compile without PyTorch headers.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace mla_core_cuda {

struct PrefillParams {
  // q [total_q, heads, 192], k [total_k, kv_heads, 192], v [total_k, kv_heads, 128] bf16 (raw bits): the last
  // dimension contiguous, the data and the token / head strides (elements) 16-byte aligned (TMA's rule).
  const uint16_t* q;
  const uint16_t* k;
  const uint16_t* v;
  int64_t q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h;
  int64_t total_q, total_k;
  int heads, kv_heads, batch, max_seqlen_q;
  // cu_q / cu_k [batch + 1] int32 cumulative lengths; each range is clamped into 0..total (a decreasing entry gives
  // an empty sequence), so nothing outside q / k / v / out is touched whatever their values.
  const int32_t* cu_q;
  const int32_t* cu_k;
  int causal;  // bottom-right: query i of len_q sees keys j <= i + len_k - len_q
  float scale_log2;  // softmax_scale * (Q and K's per-tensor factors) * log2(e): scores in the log2 domain
  float out_scale;   // O's factor: V's per-tensor factor times P's FP8 scale (1 without quantization)
  // P fake quantization: 0 = P rounded to bf16; 1 = FP8 E4M3 codes of P / p_scale (p_rscale the correctly rounded
  // reciprocal; the quotient division-free, exact for p_scale in the decode kernel's proven range) ; 2 = the same
  // codes through the IEEE division (any p_scale); 3 / 4 = NVFP4 (P rounded to bf16, blocks of 16 keys, E4M3 block
  // codes of bmax / 6 / p_scale, p_scale the global scale g, which the caller puts in out_scale; the values
  // e2m1(P / (code·g))·code), division-free / IEEE.
  int p_fmt;
  float p_scale, p_rscale;
  // Q's FP8 codes made in the kernel (the fp8 recipe's Q; its factor is in scale_log2): 0 = q read as it is; 1 =
  // each consumer warpgroup turns its loaded Q rows into e4m3(q / q_scale) in place before its first S (the
  // pre-pass's codes: division-free quotient, q_rscale = RN(1 / q_scale)); 2 = the same through the IEEE division;
  // 3 / 4 (p_fmt 3 / 4 only) = Q's NVFP4 values without the global scale q_scale = g, the pre-pass's rows rule
  // (nvfp4_row_block: blocks of 16 features), division-free / IEEE.
  int q_fmt;
  float q_scale, q_rscale;
  // out [total_q, heads, 128] bf16 (raw bits), contiguous; lse [heads, total_q] float32 natural log (-inf: no visible
  // key), contiguous, or null.
  uint16_t* out;
  float* lse;
  // The persistent kernel (p_fmt 0 and q_fmt 0 only): a uint64 counter of claimed work items, 0 before the launch
  // (the caller zeroes it for every call); null = one CTA per (query block, head, sequence).
  unsigned long long* work_counter;
};

// Whether the kernel covers `params`: heads >= 1 and a multiple of kv_heads, total_q and total_k >= 1 and below 2^31,
// max_seqlen_q >= 1, every pointer and stride 16-byte aligned, p_fmt 0..4, q_fmt 0..2 (or 3..4 with p_fmt 3..4); a
// work_counter with p_fmt 0 and q_fmt 0 only.
bool prefill_wgmma_supported(const PrefillParams& params);

// The prefill kernel on `stream` (tensor maps encoded on the host from the pointers and strides; no -lcuda: the
// driver's encoder is looked up through the runtime); the first CUDA error or cudaSuccess.
cudaError_t launch_prefill_wgmma(const PrefillParams& params, cudaStream_t stream);

// The persistent kernel (mla_prefill_persistent.cu; launch_prefill_wgmma calls it for a params.work_counter, after
// its checks): tensor_maps points at the call's Q / K / V maps (mla_prefill_wgmma.cuh's TmaMaps).
cudaError_t launch_prefill_persistent(const PrefillParams& params, const void* tensor_maps, cudaStream_t stream);

// The FP8 pre-pass's operands (up to three; unused ones n8 = 0): x[j] and out[j] bf16 (raw bits), n8[j] chunks of 8
// values each, contiguous and 16-byte aligned; scale[j] the per-tensor factor, rscale[j] = RN(1 / scale[j]).
struct FP8CodesJobs {
  const uint16_t* x[3];
  uint16_t* out[3];
  int64_t n8[3];
  float scale[3], rscale[3];
};

// FP8 E4M3 codes of x / scale (the correctly rounded quotient, saturating at +-448, nearest even), written as bf16
// values (exact: an E4M3 value has 4 significant bits): out[j][i] = e4m3(x[j][i] / scale[j]), every operand in one
// launch. exact_div: the IEEE division (some factor outside the division-free range), else the division-free
// quotient (same codes).
cudaError_t launch_fp8_codes_bf16(const FP8CodesJobs& jobs, bool exact_div, cudaStream_t stream);

// The fp8 recipe on FP8 wgmma (mla_prefill_fp8.cu). Its pre-pass writes each 64-key tile of each sequence and kv head
// as one 20 KB image of E4M3 codes (K's [64 x 192] and V^T's [128 x 64], the layout in mla_prefill_fp8.cu): images
// [fp8_tile_image_slots(total_k, batch), kv_heads, kFp8TileImageBytes] uint8, 16-byte aligned.
constexpr int kFp8TileImageBytes = 20480;
int64_t fp8_tile_image_slots(int64_t total_k, int batch);

struct Fp8TileImagesParams {
  // k [total_k, kv_heads, 192], v [total_k, kv_heads, 128] bf16 (raw bits), the last dimension contiguous, data and
  // token / head strides (elements) 16-byte aligned; cu_k [batch + 1] int32, clamped as PrefillParams' cu_k.
  const uint16_t* k;
  const uint16_t* v;
  int64_t k_stride_t, k_stride_h, v_stride_t, v_stride_h;
  int64_t total_k;
  int kv_heads, batch;
  const int32_t* cu_k;
  // codes e4m3(x / scale): the division-free quotient from rscale = RN(1 / scale), or the IEEE division (exact 1)
  float k_scale, k_rscale, v_scale, v_rscale;
  int exact;
  uint8_t* images;
};

struct PrefillFp8Params {
  // q [total_q, heads, 192] bf16 (raw bits), the last dimension contiguous, data and strides 8-byte aligned; its
  // codes e4m3(q / q_scale) made in the kernel's registers.
  const uint16_t* q;
  int64_t q_stride_t, q_stride_h;
  const uint8_t* images;  // the pre-pass's tile images of K and V
  int64_t total_q, total_k;
  int heads, kv_heads, batch, max_seqlen_q;
  const int32_t* cu_q;
  const int32_t* cu_k;
  int causal;
  float scale_log2;  // softmax_scale * q_scale * k_scale * log2(e)
  float out_scale;   // v_scale * p_scale
  // Q's and P's codes: e4m3(x / scale), the division-free quotient from rscale = RN(1 / scale), or the IEEE
  // division (exact 1: some factor outside the division-free range)
  float q_scale, q_rscale, p_scale, p_rscale;
  int exact;
  uint16_t* out;  // [total_q, heads, 128] bf16, contiguous
  float* lse;     // [heads, total_q] float32 natural log, or null
};

// Whether the pre-pass / the kernel cover `params` (counts >= 1 and below the limits, pointers and strides aligned).
bool fp8_tile_images_supported(const Fp8TileImagesParams& params);
bool prefill_fp8_supported(const PrefillFp8Params& params);
// The pre-pass and the kernel on `stream`; the first CUDA error or cudaSuccess.
cudaError_t launch_fp8_tile_images(const Fp8TileImagesParams& params, cudaStream_t stream);
cudaError_t launch_prefill_fp8(const PrefillFp8Params& params, cudaStream_t stream);

// The nvfp4 recipe's pre-pass (mla_prefill_nvfp4.cu): NVFP4 values without the global scale, e2m1(x / (c·g))·c with
// c = e4m3(bmax / 6 / g) per block of 16 (mla_core.numerics.qdq_nvfp4 divided by g: the products are exact in bf16),
// written as bf16 into contiguous outputs; g goes into the kernel's score / output scale.
// Along features (Q, K: blocks of 16 of a 192-wide row), up to three operands in one launch: x[j] [rows[j], heads[j],
// 192] bf16 (raw bits), last dimension contiguous, data and token / head strides (elements) 16-byte aligned.
struct Nvfp4RowsJobs {
  const uint16_t* x[3];
  uint16_t* out[3];  // [rows, heads, 192] contiguous
  int64_t rows[3], stride_t[3], stride_h[3];
  int heads[3];
  float g[3];
};
// Along keys (V: blocks of 16 keys from each sequence's first key, the last one partial): v [total_k, kv_heads, 128]
// bf16, the same alignment; out [total_k, kv_heads, 128] contiguous, written for every key of every sequence (keys no
// sequence covers are left unwritten).
struct Nvfp4KeysParams {
  const uint16_t* v;
  int64_t v_stride_t, v_stride_h, total_k;
  int kv_heads, batch;
  const int32_t* cu_k;
  float g;
  uint16_t* out;
};
// exact_div: the IEEE division (a factor outside the division-free range), else the division-free quotient.
cudaError_t launch_nvfp4_rows_bf16(const Nvfp4RowsJobs& jobs, bool exact_div, cudaStream_t stream);
cudaError_t launch_nvfp4_keys_bf16(const Nvfp4KeysParams& params, bool exact_div, cudaStream_t stream);

}  // namespace mla_core_cuda
