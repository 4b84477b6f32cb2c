// The fused MLA layer's decode prep on CUDA (mla_layer_prep.cu): the Triton prep kernel of
// backends/triton/mla_core_triton/layer.py (_prep_kernel, decode form: TOKEN_LEN, no TOKEN_TABLE, no ROWS, no
// COPY_NOPE) written again so it launches inside the cuda decode's one pybind11 call (bindings.cpp: layer_decode).
// Bit-equal to the Triton kernel by construction: the same float32 operations in the same order
// (benchmarks/NOTES.md, "Eager decode: the prep inside the cuda call (round m, pending)").
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "mla_decode.h"

namespace mla_core_cuda {

// Everything the prep reads or writes. Pointers to elements; strides in elements. kv, q, cache and q_out share the
// cache dtype (kBF16 / kFP16); freqs is float32 [max_pos, 64] ((cos, sin) pairs); gamma [512] of gamma_dtype.
struct LayerPrepParams {
  const void* q;          // [tokens, heads, nope + 64], last dim contiguous
  int64_t q_stride_t;
  int64_t q_stride_h;
  const void* kv;         // [tokens, 512 + 64], last dim contiguous
  int64_t kv_stride_t;
  const void* offsets;    // [batch + 1] input_row_offsets
  bool offsets_i64;
  const void* starts;     // [batch] cache_offsets
  bool starts_i64;
  const float* freqs;     // [max_pos, 64]
  int64_t freqs_stride;
  int64_t max_pos;
  const void* gamma;      // [512]
  int gamma_dtype;        // DType
  void* cache;            // [num_pages, page_size, 576], contiguous
  int64_t num_pages;
  int64_t page_size;
  const void* table;      // [batch, width], last dim contiguous
  bool table_i64;
  int64_t table_stride_b;
  int64_t width;
  void* q_out;            // the absorbed query [tokens, heads, 576]: columns 512..575 written here
  int64_t qo_stride_t;
  int64_t qo_stride_h;
  int32_t* tok_len;       // [tokens]: pos + 1
  int tokens;
  int batch;
  int heads;
  int nope;
  float eps;
  bool interleave;
  int sum_order;          // each thread's four squares: 0 a tree (Triton >= 3.7), 1 / 2 a left fold (mla_layer_prep.cu)
  int dtype;              // DType of q / kv / cache / q_out
};

// One CTA of 128 threads (Triton's num_warps 4) per token on ``stream``.
cudaError_t launch_layer_prep(const LayerPrepParams& params, cudaStream_t stream);

}  // namespace mla_core_cuda
