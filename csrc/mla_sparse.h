// FP8 top-k sparse MLA decode for sm_90a (mla_sparse_wgmma.cu; MATE's 576-byte or fp8_ds_mla's 656-byte rows): the
// launch parameters shared by the kernel and the PyTorch binding (bindings.cpp). Plain data only, so the .cu file
// compiles without PyTorch headers.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace mla_core_cuda {

struct SparseDecodeParams {
  // query [tokens = batch * q_len, heads, 576] E4M3 codes (ds_mla: bf16), contiguous, 16-byte aligned.
  const uint8_t* query;
  // cache [rows, 576] E4M3 codes (MATE's rows: 512 latent + 64 RoPE values), or with ds_mla [rows, 656]
  // fp8_ds_mla rows (512 E4M3 codes, 4 float32 scales, 64 bf16 RoPE values; docs/sparse.md); contiguous,
  // 16-byte aligned.
  const uint8_t* cache;
  bool ds_mla;
  int64_t rows;
  // indices [tokens, top_k] int32 cache rows (-1 = none); valid_lens [batch] int32: slots at or past
  // clamp(valid_lens[b], 0, top_k) are not keys, nor is an index outside 0..rows-1 (never read).
  const int32_t* indices;
  const int32_t* valid_lens;
  int batch, q_len, heads, top_k, num_splits;
  float scale_log2;  // bmm1_scale * log2(e): scores in the log2 domain
  float bmm2_scale;
  // out [tokens, heads, 512] bf16 (raw bits), lse [tokens, heads] float32 natural log (-inf: no valid slot).
  uint16_t* out;
  float* lse;
  // num_splits > 1: per-split results, part_o [tokens, splits, heads, 512] (o / l * bmm2_scale) and
  // part_lse [tokens, splits, heads] (-inf for a split without a valid slot).
  float* part_o;
  float* part_lse;
};

// Whether the kernel covers `params`: heads a positive multiple of 64, q_len >= 1, top_k a positive multiple of 64,
// 1..32 splits, tokens * heads below 2^31.
bool sparse_decode_wgmma_supported(const SparseDecodeParams& params);

// The split kernel, then the combine kernel when num_splits > 1, on `stream`; the first CUDA error or cudaSuccess.
cudaError_t launch_sparse_decode_wgmma(const SparseDecodeParams& params, cudaStream_t stream);

}  // namespace mla_core_cuda
