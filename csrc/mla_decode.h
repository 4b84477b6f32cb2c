// Paged MLA decode for sm_90a: the launch parameters shared by the kernels (mla_decode.cu) and the
// PyTorch binding (bindings.cpp). Plain data only, so the .cu file compiles without PyTorch headers.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace mla_core_cuda {

// Element types of q / the cache (kernel template argument) and of the output.
enum DType : int { kBF16 = 0, kFP16 = 1, kFP32 = 2 };
// Fake-quant formats of K, V and P (mla_core.numerics: None, "fp8", "nvfp4").
enum QuantFormat : int { kNoQuant = 0, kFP8 = 1, kNVFP4 = 2 };

struct DecodeParams {
  // q [batch, heads, 576] (cache dtype; last dimension contiguous), strides in elements.
  const void* q;
  int64_t q_stride_b, q_stride_h;
  // latent_cache [num_pages, page_size, 576], strides in elements; rows 0..511 are V, all 576 are K. Elements of
  // q's dtype, or 1-byte E4M3 codes (cache_fp8: the FP8 KV cache, WGMMA kernel only).
  const void* cache;
  int64_t cache_stride_page, cache_stride_tok;
  int64_t num_pages;
  int64_t page_size;
  double page_size_inv;  // 1 / page_size rounded to float64 (the WGMMA kernel's division-free row lookup)
  int page_shift;        // log2(page_size) when a power of two (the WGMMA kernel's shift lookup), else -1
  // block_table [batch, table_width] int32 or int64; seq_lens [batch] int32 or int64.
  const void* block_table;
  int64_t table_stride_b, table_stride_col, table_width;
  bool table_i64;
  const void* seq_lens;
  int64_t lens_stride;
  bool lens_i64;
  int batch, heads, num_splits;
  int dtype;      // DType of q and of a float cache (kBF16 or kFP16)
  int out_dtype;  // DType of out
  // out [batch, heads, 512] (contiguous); lse [batch, heads] float32 or null.
  void* out;
  float* lse;
  // Per-split partial results (num_splits > 1): part_o [batch, heads, splits, 512], part_lse [batch, heads, splits].
  float* part_o;
  float* part_lse;
  // (q . k_codes) * qk_scale_log2 is the score in the log2 domain (softmax_scale * k_scale * log2(e)).
  float qk_scale_log2;
  // acc * out_scale / l is the output (v_scale * p_scale: the per-tensor factors left out of the codes).
  float out_scale;
  // Per-tensor scales: FP8 amax / 448, NVFP4 global g = amax / 2688 (1.0 without an amax).
  float k_scale, v_scale, p_scale;
  int k_fmt, v_fmt, p_fmt;  // QuantFormat each
  bool v_from_k;            // V codes equal K's first 512 codes (FP8 K and V with one scale)
  bool exact_div;           // quantizer quotients by __fdiv_rn (per-tensor factors near float32's range ends)
  bool cache_fp8;           // the cache holds E4M3 codes (kv_scale is in qk_scale_log2 and out_scale)
  bool keys_m;              // WGMMA: the keys-as-M kernel (bf16 / fp16 cache, no fake quantization, heads <= 16)
  int head_tiles;           // 16-head m-tiles per CTA (1, 2 or 4)
  int warps;                // warps per CTA: (head_tiles, warps) is (1, 4), (2, 4), (2, 8) or (4, 8)
  bool ring4;               // WGMMA: schedule Q1 on four 32-key ring slots (config ring4; bf16 / fp16 cache, no fake
                            // quantization); last, so that no other field's offset moves
};

// Launch the decode (split kernel, then the combine kernel when num_splits > 1) on `stream`.
// Returns the first CUDA error (a launch error), or cudaSuccess.
cudaError_t launch_decode(const DecodeParams& params, cudaStream_t stream);

// Whether a (head_tiles, warps) CTA shape is built.
bool decode_shape_supported(int head_tiles, int warps);

// The combine kernel alone (num_splits > 1): out and lse from part_o / part_lse, on `stream`.
cudaError_t launch_combine(const DecodeParams& params, cudaStream_t stream);

// The WGMMA decode (mla_decode_wgmma.cu: split kernel, then the combine when num_splits > 1) on `stream`.
// It reads every field but head_tiles and warps.
cudaError_t launch_decode_wgmma(const DecodeParams& params, cudaStream_t stream);

// Whether the WGMMA decode covers `params`: bf16 or fp16; K and V unquantized, or FP8 with V's codes K's
// (v_from_k) and no exact_div, or an FP8 cache (cache_fp8) with K and V unquantized; P unquantized, FP8 or NVFP4
// (any head count: 64 heads per CTA, the last group zero-padded); keys_m: a bf16 / fp16 cache, K, V and P
// unquantized, heads <= 16; ring4: a bf16 / fp16 cache, K, V and P unquantized, not keys_m (any head count).
bool decode_wgmma_supported(const DecodeParams& params);

}  // namespace mla_core_cuda
