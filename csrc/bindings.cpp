// pybind11 bindings of the CUDA kernels (mla_decode.cu: mma.sync decode, mla_decode_wgmma.cu: WGMMA decode,
// mla_sparse_wgmma.cu: FP8 top-k sparse decode, mla_prefill_wgmma.cu: varlen prefill and its FP8 QDQ pre-pass,
// mla_prefill_fp8.cu: the fp8 recipe's prefill on FP8 wgmma and its tile-image pre-pass, mla_prefill_nvfp4.cu: the
// nvfp4 recipe's pre-pass).
// The Python side (backends/cuda/mla_core_cuda) validates the call and allocates every tensor; this layer only
// reads pointers and strides and launches on the current stream (so CUDA-graph capture records the launches).
// Only what this file uses: at::Tensor, TORCH_CHECK, the pybind11 casters of at::Tensor and std::optional, the current
// stream and device guard. With <torch/extension.h> (all of libtorch's C++ API) this was the build's longest unit:
// 26 s of CPU against 13 s now (benchmarks/NOTES.md, "CUDA build split for the TP 8 warm-up").
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "mla_decode.h"
#include "mla_layer_prep.h"
#include "mla_prefill.h"
#include "mla_sparse.h"

namespace {

// The failing checks' messages, built by string concatenation, never through std::ostream: on the lent H200 (torch
// 2.11.0+cu130, g++ 13.3) an extension that formats a number with c10::str (an std::ostringstream) dies with SIGSEGV,
// so TORCH_CHECK(cond, "x ", n) killed the process where it should raise RuntimeError; a message that is one string
// raises (benchmarks/probes/torch_check_abi.py, benchmarks/NOTES.md "The bindings' refusals crashed, round (q)").
std::string piece(const char* s) { return s; }
std::string piece(const std::string& s) { return s; }
std::string piece(bool b) { return b ? "true" : "false"; }
std::string piece(double v) { return std::to_string(v); }
std::string piece(c10::ScalarType t) { return c10::toString(t); }
std::string piece(c10::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
template <typename T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
std::string piece(T v) { return std::to_string(v); }
template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string s;
  (s.append(piece(parts)), ...);
  return s;
}

}  // namespace

// TORCH_CHECK with the message made by message() (evaluated only when the check fails, as TORCH_CHECK's own).
#define MLA_CHECK(cond, ...) TORCH_CHECK(cond, message(__VA_ARGS__))

namespace {

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kBFloat16: return mla_core_cuda::kBF16;
    case at::kHalf: return mla_core_cuda::kFP16;
    case at::kFloat: return mla_core_cuda::kFP32;
    default: MLA_CHECK(false, "mla_core cuda decode: unsupported dtype ", t.scalar_type());
  }
  return -1;
}

void check_index(const at::Tensor& t, const char* name) {
  MLA_CHECK(t.scalar_type() == at::kInt || t.scalar_type() == at::kLong, name, " must be int32 or int64");
  MLA_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
}

// The fields both kernels read: pointers, strides, sizes, the split count. out [batch, heads, 512] and lse
// [batch, heads] (optional) are written; part_o / part_lse are the float32 per-split buffers ([batch * heads *
// splits * 512], [batch * heads * splits]) when splits > 1.
mla_core_cuda::DecodeParams common_params(const at::Tensor& q, const at::Tensor& cache,
                                          const at::Tensor& block_table, const at::Tensor& seq_lens,
                                          at::Tensor& out, std::optional<at::Tensor>& lse,
                                          std::optional<at::Tensor>& part_o, std::optional<at::Tensor>& part_lse,
                                          int64_t num_splits, double qk_scale_log2) {
  MLA_CHECK(q.is_cuda() && cache.is_cuda() && out.is_cuda(), "mla_core cuda decode: tensors must be on CUDA");
  MLA_CHECK(q.dim() == 3 && q.size(2) == 576 && q.stride(2) == 1, "q must be [batch, heads, 576], last dim contiguous");
  MLA_CHECK(cache.dim() == 3 && cache.size(2) == 576 && cache.stride(2) == 1,
            "latent_cache must be [pages, page_size, 576], last dim contiguous");
  const bool cache_fp8 = cache.scalar_type() == at::kFloat8_e4m3fn;
  MLA_CHECK(cache_fp8 ? q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf
                      : q.scalar_type() == cache.scalar_type(),
            "q and latent_cache must share a dtype (an FP8 cache: q bfloat16 or float16)");
  MLA_CHECK(out.is_contiguous() && out.dim() == 3 && out.size(2) == 512, "out must be contiguous [batch, heads, 512]");
  MLA_CHECK(num_splits >= 1 && num_splits <= 128, "num_splits must be 1..128");  // numerics.MAX_KV_SPLITS
  check_index(block_table, "block_table");
  check_index(seq_lens, "seq_lens");

  mla_core_cuda::DecodeParams p{};
  p.q = q.data_ptr();
  p.q_stride_b = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.cache = cache.data_ptr();
  p.cache_stride_page = cache.stride(0);
  p.cache_stride_tok = cache.stride(1);
  p.num_pages = cache.size(0);
  p.page_size = cache.size(1);
  p.page_size_inv = 1.0 / static_cast<double>(cache.size(1));
  p.page_shift = -1;
  for (int shift = 0; shift < 62; ++shift) {
    if ((int64_t{1} << shift) == cache.size(1)) p.page_shift = shift;
  }
  p.block_table = block_table.data_ptr();
  p.table_stride_b = block_table.stride(0);
  p.table_stride_col = block_table.stride(1);
  p.table_width = block_table.size(1);
  p.table_i64 = block_table.scalar_type() == at::kLong;
  p.seq_lens = seq_lens.data_ptr();
  p.lens_stride = seq_lens.stride(0);
  p.lens_i64 = seq_lens.scalar_type() == at::kLong;
  p.batch = static_cast<int>(q.size(0));
  p.heads = static_cast<int>(q.size(1));
  p.num_splits = static_cast<int>(num_splits);
  p.dtype = dtype_code(q);
  MLA_CHECK(p.dtype != mla_core_cuda::kFP32, "latent_cache must be bfloat16, float16 or float8_e4m3fn");
  p.cache_fp8 = cache_fp8;
  p.out_dtype = dtype_code(out);
  p.out = out.data_ptr();
  p.lse = nullptr;
  if (lse.has_value()) {
    MLA_CHECK(lse->scalar_type() == at::kFloat && lse->is_contiguous(), "lse must be contiguous float32");
    p.lse = lse->data_ptr<float>();
  }
  if (num_splits > 1) {
    MLA_CHECK(part_o.has_value() && part_lse.has_value(), "part_o and part_lse are needed with num_splits > 1");
    MLA_CHECK(part_o->numel() >= static_cast<int64_t>(p.batch) * p.heads * num_splits * 512 &&
                  part_lse->numel() >= static_cast<int64_t>(p.batch) * p.heads * num_splits,
              "part_o / part_lse too small");
    p.part_o = part_o->data_ptr<float>();
    p.part_lse = part_lse->data_ptr<float>();
  }
  p.qk_scale_log2 = static_cast<float>(qk_scale_log2);
  p.out_scale = 1.f;
  p.k_scale = p.v_scale = p.p_scale = 1.f;
  p.k_fmt = p.v_fmt = p.p_fmt = mla_core_cuda::kNoQuant;
  return p;
}

// The fake-quant fields (decode.py's launcher computes them alike for both kernels).
void set_quant(mla_core_cuda::DecodeParams& p, double out_scale, double k_scale, double v_scale, double p_scale,
               int64_t k_fmt, int64_t v_fmt, int64_t p_fmt, bool v_from_k, bool exact_div) {
  p.out_scale = static_cast<float>(out_scale);
  p.k_scale = static_cast<float>(k_scale);
  p.v_scale = static_cast<float>(v_scale);
  p.p_scale = static_cast<float>(p_scale);
  p.k_fmt = static_cast<int>(k_fmt);
  p.v_fmt = static_cast<int>(v_fmt);
  p.p_fmt = static_cast<int>(p_fmt);
  p.v_from_k = v_from_k;
  p.exact_div = exact_div;
}

// The mma.sync kernel (any head count, fused K/V/P fake quantization).
void decode(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_table,
            const at::Tensor& seq_lens, at::Tensor out, std::optional<at::Tensor> lse,
            std::optional<at::Tensor> part_o, std::optional<at::Tensor> part_lse, int64_t num_splits,
            double qk_scale_log2, double out_scale, double k_scale, double v_scale, double p_scale, int64_t k_fmt,
            int64_t v_fmt, int64_t p_fmt, bool v_from_k, bool exact_div, int64_t head_tiles, int64_t warps) {
  MLA_CHECK(mla_core_cuda::decode_shape_supported(static_cast<int>(head_tiles), static_cast<int>(warps)),
            "(head_tiles, warps) must be (1, 4), (2, 4), (2, 8) or (4, 8)");
  mla_core_cuda::DecodeParams p =
      common_params(q, cache, block_table, seq_lens, out, lse, part_o, part_lse, num_splits, qk_scale_log2);
  MLA_CHECK(!p.cache_fp8, "the mma.sync decode reads bfloat16 / float16 caches (an FP8 cache: decode_wgmma)");
  set_quant(p, out_scale, k_scale, v_scale, p_scale, k_fmt, v_fmt, p_fmt, v_from_k, exact_div);
  p.head_tiles = static_cast<int>(head_tiles);
  p.warps = static_cast<int>(warps);
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = mla_core_cuda::launch_decode(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda decode launch failed: ", cudaGetErrorString(err));
}

// The WGMMA kernel (mla_decode_wgmma.cu): bf16 / fp16 q and cache, or an FP8 cache (E4M3 codes, kv_scale folded
// into qk_scale_log2 and out_scale by the caller); K = V FP8 with one scale or unquantized, P any format; keys_m:
// decode_km_kernel (bf16 / fp16, unquantized, <= 16 heads); ring4: decode_wgmma_ring4_kernel, schedule Q1 on four
// 32-key ring slots (bf16 / fp16 cache, unquantized, any head count).
void decode_wgmma(const at::Tensor& q, const at::Tensor& cache, const at::Tensor& block_table,
                  const at::Tensor& seq_lens, at::Tensor out, std::optional<at::Tensor> lse,
                  std::optional<at::Tensor> part_o, std::optional<at::Tensor> part_lse, int64_t num_splits,
                  double qk_scale_log2, double out_scale, double k_scale, double v_scale, double p_scale,
                  int64_t k_fmt, int64_t v_fmt, int64_t p_fmt, bool v_from_k, bool exact_div, bool keys_m,
                  bool ring4) {
  mla_core_cuda::DecodeParams p =
      common_params(q, cache, block_table, seq_lens, out, lse, part_o, part_lse, num_splits, qk_scale_log2);
  set_quant(p, out_scale, k_scale, v_scale, p_scale, k_fmt, v_fmt, p_fmt, v_from_k, exact_div);
  p.keys_m = keys_m;
  p.ring4 = ring4;
  MLA_CHECK(mla_core_cuda::decode_wgmma_supported(p), "the WGMMA decode needs bf16 or fp16 q and cache (or an FP8 "
            "cache), K and V unquantized or FP8 with one scale and no exact division (got dtype ", p.dtype,
            ", cache_fp8 ", p.cache_fp8, ", k_fmt ", p.k_fmt, ", v_fmt ", p.v_fmt, "); keys_m needs a bf16 / "
            "fp16 cache, K, V and P unquantized and at most 16 heads (got heads ", p.heads, ", keys_m ", p.keys_m,
            "); ring4 a bf16 / fp16 cache, K, V and P unquantized, not keys_m (ring4 ", p.ring4, ")");
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = mla_core_cuda::launch_decode_wgmma(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda decode (wgmma) launch failed: ", cudaGetErrorString(err));
}

// The FP8 top-k sparse decode on WGMMA (mla_sparse_wgmma.cu): query [batch, q_len, heads, 576] and cache [rows, 576]
// float8_e4m3fn, or a bf16 query and cache [rows, 656] uint8 / float8_e4m3fn (fp8_ds_mla rows: the cache's width
// picks the layout); contiguous, 16-byte aligned; indices [batch, q_len, top_k] int32, valid_lens [batch] int32,
// out [batch, q_len, heads, 512] bf16 and lse (batch * q_len * heads float32), both contiguous.
void sparse_decode_wgmma(const at::Tensor& query, const at::Tensor& cache, const at::Tensor& indices,
                         const at::Tensor& valid_lens, at::Tensor out, at::Tensor lse,
                         std::optional<at::Tensor> part_o, std::optional<at::Tensor> part_lse,
                         int64_t num_splits, double scale_log2, double bmm2_scale) {
  const auto fp8 = at::kFloat8_e4m3fn;
  MLA_CHECK(query.is_cuda() && cache.is_cuda() && indices.is_cuda() && valid_lens.is_cuda() && out.is_cuda() &&
                lse.is_cuda(), "mla_core cuda sparse decode: tensors must be on CUDA");
  MLA_CHECK(cache.dim() == 2 && (cache.size(1) == 576 || cache.size(1) == 656) && cache.is_contiguous(),
            "cache must be contiguous [rows, 576] or [rows, 656]");
  const bool ds_mla = cache.size(1) == 656;
  if (ds_mla) {
    MLA_CHECK(query.scalar_type() == at::kBFloat16 &&
                  (cache.scalar_type() == at::kByte || cache.scalar_type() == fp8),
              "656-byte rows need a bf16 query and a uint8 / float8_e4m3fn cache");
  } else {
    MLA_CHECK(query.scalar_type() == fp8 && cache.scalar_type() == fp8, "query and cache must be float8_e4m3fn");
  }
  MLA_CHECK(query.dim() == 4 && query.size(3) == 576 && query.is_contiguous(),
            "query must be contiguous [batch, q_len, heads, 576]");
  MLA_CHECK(reinterpret_cast<uintptr_t>(query.data_ptr()) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0, "query and cache must be 16-byte aligned");
  const int64_t batch = query.size(0), q_len = query.size(1), heads = query.size(2);
  MLA_CHECK(indices.scalar_type() == at::kInt && indices.is_contiguous() && indices.dim() == 3 &&
                indices.size(0) == batch && indices.size(1) == q_len,
            "indices must be contiguous int32 [batch, q_len, top_k]");
  MLA_CHECK(valid_lens.scalar_type() == at::kInt && valid_lens.is_contiguous() && valid_lens.numel() == batch,
            "valid_lens must be contiguous int32 [batch]");
  MLA_CHECK(out.scalar_type() == at::kBFloat16 && out.is_contiguous() &&
                out.numel() == batch * q_len * heads * 512 && reinterpret_cast<uintptr_t>(out.data_ptr()) % 4 == 0,
            "out must be contiguous, 4-byte aligned bf16 [batch, q_len, heads, 512]");
  MLA_CHECK(lse.scalar_type() == at::kFloat && lse.is_contiguous() && lse.numel() == batch * q_len * heads,
            "lse must be contiguous float32 with batch * q_len * heads elements");
  mla_core_cuda::SparseDecodeParams p{};
  p.query = static_cast<const uint8_t*>(query.data_ptr());
  p.cache = static_cast<const uint8_t*>(cache.data_ptr());
  p.ds_mla = ds_mla;
  p.rows = cache.size(0);
  p.indices = indices.data_ptr<int32_t>();
  p.valid_lens = valid_lens.data_ptr<int32_t>();
  p.batch = static_cast<int>(batch);
  p.q_len = static_cast<int>(q_len);
  p.heads = static_cast<int>(heads);
  p.top_k = static_cast<int>(indices.size(2));
  p.num_splits = static_cast<int>(num_splits);
  p.scale_log2 = static_cast<float>(scale_log2);
  p.bmm2_scale = static_cast<float>(bmm2_scale);
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = lse.data_ptr<float>();
  MLA_CHECK(mla_core_cuda::sparse_decode_wgmma_supported(p),
            "the WGMMA sparse decode needs heads a multiple of 64, top_k a multiple of 64 and 1..32 splits (got heads ",
            heads, ", top_k ", p.top_k, ", splits ", num_splits, ")");
  if (num_splits > 1) {
    MLA_CHECK(part_o.has_value() && part_lse.has_value() && part_o->scalar_type() == at::kFloat &&
                  part_lse->scalar_type() == at::kFloat && part_o->is_contiguous() && part_lse->is_contiguous(),
              "part_o and part_lse (contiguous float32) are needed with num_splits > 1");
    MLA_CHECK(part_o->numel() >= batch * q_len * heads * num_splits * 512 &&
                  part_lse->numel() >= batch * q_len * heads * num_splits, "part_o / part_lse too small");
    p.part_o = part_o->data_ptr<float>();
    p.part_lse = part_lse->data_ptr<float>();
  }
  const c10::cuda::CUDAGuard guard(query.device());
  const cudaError_t err = mla_core_cuda::launch_sparse_decode_wgmma(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda sparse decode launch failed: ", cudaGetErrorString(err));
}

// The varlen prefill on WGMMA (mla_prefill_wgmma.cu): q [total_q, heads, 192], k [total_k, kv_heads, 192],
// v [total_k, kv_heads, 128] bf16 (last dimension contiguous, data and strides 16-byte aligned), cu_q / cu_k
// [batch + 1] int32 contiguous, out [total_q, heads, 128] bf16 and lse [heads, total_q] float32 (optional), both
// contiguous and written. p_fmt: 0 = P in bf16, 1 / 2 = P's FP8 codes (division-free / IEEE quotient); q_fmt
// likewise for Q's FP8 codes made in the kernel (q_scale's factor folded into scale_log2 by the caller); p_fmt 3 / 4
// = P's NVFP4, with q_fmt 3 / 4 = Q's NVFP4 values made in the kernel (q_scale = Q's g). work_counter: one int64,
// zero (p_fmt 0 and q_fmt 0 only): the persistent kernel (mla_prefill_persistent.cu) claims its work items from it.
void prefill_wgmma(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_q,
                   const at::Tensor& cu_k, int64_t max_seqlen_q, at::Tensor out, std::optional<at::Tensor> lse,
                   bool causal, double scale_log2, double out_scale, int64_t p_fmt, double p_scale, double p_rscale,
                   int64_t q_fmt, double q_scale, double q_rscale, std::optional<at::Tensor> work_counter) {
  const auto bf16 = at::kBFloat16;
  MLA_CHECK(q.is_cuda() && k.is_cuda() && v.is_cuda() && cu_q.is_cuda() && cu_k.is_cuda() && out.is_cuda(),
            "mla_core cuda prefill: tensors must be on CUDA");
  MLA_CHECK(q.scalar_type() == bf16 && k.scalar_type() == bf16 && v.scalar_type() == bf16 &&
                out.scalar_type() == bf16, "q, k, v and out must be bfloat16");
  MLA_CHECK(q.dim() == 3 && q.size(2) == 192 && q.stride(2) == 1, "q must be [total_q, heads, 192], last dim contiguous");
  MLA_CHECK(k.dim() == 3 && k.size(2) == 192 && k.stride(2) == 1, "k must be [total_k, kv_heads, 192], last dim contiguous");
  MLA_CHECK(v.dim() == 3 && v.size(2) == 128 && v.stride(2) == 1 && v.size(0) == k.size(0) && v.size(1) == k.size(1),
            "v must be [total_k, kv_heads, 128], last dim contiguous");
  MLA_CHECK(cu_q.scalar_type() == at::kInt && cu_k.scalar_type() == at::kInt && cu_q.is_contiguous() &&
                cu_k.is_contiguous() && cu_q.numel() >= 2 && cu_k.numel() == cu_q.numel(),
            "cu_q and cu_k must be contiguous int32 [batch + 1]");
  MLA_CHECK(out.is_contiguous() && out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == 128,
            "out must be contiguous [total_q, heads, 128]");
  mla_core_cuda::PrefillParams p{};
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.q_stride_t = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.k_stride_t = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.v_stride_t = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.total_q = q.size(0);
  p.total_k = k.size(0);
  p.heads = static_cast<int>(q.size(1));
  p.kv_heads = static_cast<int>(k.size(1));
  p.batch = static_cast<int>(cu_q.numel() - 1);
  p.max_seqlen_q = static_cast<int>(std::min<int64_t>(max_seqlen_q, INT32_MAX));
  p.cu_q = cu_q.data_ptr<int32_t>();
  p.cu_k = cu_k.data_ptr<int32_t>();
  p.causal = causal ? 1 : 0;
  p.scale_log2 = static_cast<float>(scale_log2);
  p.out_scale = static_cast<float>(out_scale);
  p.p_fmt = static_cast<int>(p_fmt);
  p.p_scale = static_cast<float>(p_scale);
  p.p_rscale = static_cast<float>(p_rscale);
  p.q_fmt = static_cast<int>(q_fmt);
  p.q_scale = static_cast<float>(q_scale);
  p.q_rscale = static_cast<float>(q_rscale);
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = nullptr;
  if (lse.has_value()) {
    MLA_CHECK(lse->is_cuda() && lse->scalar_type() == at::kFloat && lse->is_contiguous() &&
                  lse->numel() == q.size(0) * q.size(1), "lse must be contiguous float32 [heads, total_q]");
    p.lse = lse->data_ptr<float>();
  }
  p.work_counter = nullptr;
  if (work_counter.has_value()) {
    MLA_CHECK(work_counter->is_cuda() && work_counter->scalar_type() == at::kLong && work_counter->numel() == 1 &&
                  work_counter->device() == q.device() && p_fmt == 0 && q_fmt == 0,
              "work_counter (the persistent kernel, P and Q unquantized) must be one int64 on q's device");
    p.work_counter = reinterpret_cast<unsigned long long*>(work_counter->data_ptr<int64_t>());
  }
  MLA_CHECK(mla_core_cuda::prefill_wgmma_supported(p),
            "the WGMMA prefill needs heads a multiple of kv_heads, non-empty q and k, and data and token / head "
            "strides 16-byte aligned (TMA); got strides q ", q.strides(), ", k ", k.strides(), ", v ", v.strides());
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = mla_core_cuda::launch_prefill_wgmma(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda prefill launch failed: ", cudaGetErrorString(err));
}

// The prefill's FP8 QDQ pre-pass, one launch: outs[j] = bf16(e4m3(xs[j] / scales[j])) elementwise (1 to 3
// operands), each x and out contiguous bf16 of one size (a multiple of 8), 16-byte aligned; rscales[j] = RN(1 /
// scales[j]); exact_div: the IEEE division (a factor outside the division-free range).
void fp8_codes_bf16(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs,
                    const std::vector<double>& scales, const std::vector<double>& rscales, bool exact_div) {
  MLA_CHECK(!xs.empty() && xs.size() <= 3 && outs.size() == xs.size() && scales.size() == xs.size() &&
                rscales.size() == xs.size(), "1 to 3 operands, one out, scale and rscale each");
  mla_core_cuda::FP8CodesJobs jobs{};
  for (size_t j = 0; j < xs.size(); ++j) {
    const at::Tensor& x = xs[j];
    const at::Tensor& out = outs[j];
    MLA_CHECK(x.is_cuda() && out.is_cuda() && x.device() == xs[0].device() && out.device() == x.device() &&
                  x.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 &&
                  x.is_contiguous() && out.is_contiguous() && x.numel() == out.numel() && x.numel() % 8 == 0,
              "x and out must be contiguous bf16 CUDA tensors of one size, a multiple of 8, on one device");
    jobs.x[j] = static_cast<const uint16_t*>(x.data_ptr());
    jobs.out[j] = reinterpret_cast<uint16_t*>(out.data_ptr());
    jobs.n8[j] = x.numel() / 8;
    jobs.scale[j] = static_cast<float>(scales[j]);
    jobs.rscale[j] = static_cast<float>(rscales[j]);
  }
  const c10::cuda::CUDAGuard guard(xs[0].device());
  const cudaError_t err = mla_core_cuda::launch_fp8_codes_bf16(jobs, exact_div, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda fp8 codes launch failed (16-byte aligned operands needed): ",
            cudaGetErrorString(err));
}

// The nvfp4 recipe's pre-pass along features (mla_prefill_nvfp4.cu), one launch: outs[j] = bf16(e2m1(x / (c·g))·c)
// per block of 16 of xs[j]'s 192-wide rows (numerics.qdq_nvfp4 divided by g = gs[j]: exact in bf16); xs[j] [rows,
// heads, 192] bf16, last dimension contiguous, data and token / head strides 16-byte aligned; outs[j] contiguous of
// xs[j]'s shape. exact_div: the IEEE division (a factor outside the division-free range).
void nvfp4_rows_bf16(const std::vector<at::Tensor>& xs, const std::vector<at::Tensor>& outs,
                     const std::vector<double>& gs, bool exact_div) {
  MLA_CHECK(!xs.empty() && xs.size() <= 3 && outs.size() == xs.size() && gs.size() == xs.size(),
            "1 to 3 operands, one out and g each");
  mla_core_cuda::Nvfp4RowsJobs jobs{};
  for (size_t j = 0; j < xs.size(); ++j) {
    const at::Tensor& x = xs[j];
    const at::Tensor& out = outs[j];
    MLA_CHECK(x.is_cuda() && out.is_cuda() && x.device() == xs[0].device() && out.device() == x.device() &&
                  x.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 && x.dim() == 3 &&
                  x.size(2) == 192 && x.stride(2) == 1 && out.is_contiguous() && out.sizes() == x.sizes(),
              "x must be bf16 [rows, heads, 192] (last dim contiguous) and out contiguous bf16 of its shape, on one "
              "CUDA device");
    jobs.x[j] = static_cast<const uint16_t*>(x.data_ptr());
    jobs.out[j] = reinterpret_cast<uint16_t*>(out.data_ptr());
    jobs.rows[j] = x.size(0);
    jobs.heads[j] = static_cast<int>(x.size(1));
    jobs.stride_t[j] = x.stride(0);
    jobs.stride_h[j] = x.stride(1);
    jobs.g[j] = static_cast<float>(gs[j]);
  }
  const c10::cuda::CUDAGuard guard(xs[0].device());
  const cudaError_t err =
      mla_core_cuda::launch_nvfp4_rows_bf16(jobs, exact_div, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda nvfp4 rows launch failed (16-byte aligned data and strides needed): ",
            cudaGetErrorString(err));
}

// The nvfp4 recipe's pre-pass along keys (V): out = bf16(e2m1(v / (c·g))·c) per block of 16 keys from each sequence's
// first key (cu_k [batch + 1] int32, clamped as the kernel clamps it); v [total_k, kv_heads, 128] bf16, last dimension
// contiguous, data and strides 16-byte aligned; out contiguous of v's shape, written at every key of every sequence.
void nvfp4_keys_bf16(const at::Tensor& v, const at::Tensor& cu_k, at::Tensor out, double g, bool exact_div) {
  MLA_CHECK(v.is_cuda() && cu_k.is_cuda() && out.is_cuda() && v.device() == out.device(), "tensors must be on CUDA");
  MLA_CHECK(v.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16 && v.dim() == 3 &&
                v.size(2) == 128 && v.stride(2) == 1 && out.is_contiguous() && out.sizes() == v.sizes(),
            "v must be bf16 [total_k, kv_heads, 128] (last dim contiguous) and out contiguous bf16 of its shape");
  MLA_CHECK(cu_k.scalar_type() == at::kInt && cu_k.is_contiguous() && cu_k.numel() >= 2,
            "cu_k must be contiguous int32 [batch + 1]");
  mla_core_cuda::Nvfp4KeysParams p{};
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.v_stride_t = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.total_k = v.size(0);
  p.kv_heads = static_cast<int>(v.size(1));
  p.batch = static_cast<int>(cu_k.numel() - 1);
  p.cu_k = cu_k.data_ptr<int32_t>();
  p.g = static_cast<float>(g);
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  const c10::cuda::CUDAGuard guard(v.device());
  const cudaError_t err = mla_core_cuda::launch_nvfp4_keys_bf16(p, exact_div, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda nvfp4 keys launch failed (16-byte aligned data and strides needed): ",
            cudaGetErrorString(err));
}

// The fp8 recipe on FP8 wgmma (mla_prefill_fp8.cu), its pre-pass: k [total_k, kv_heads, 192] and v [total_k, kv_heads,
// 128] bf16 (last dimension contiguous, data and strides 16-byte aligned), cu_k [batch + 1] int32 contiguous, images
// [fp8_tile_image_slots(total_k, batch), kv_heads, 20480] uint8 contiguous, written for every tile of every
// sequence; the codes e4m3(x / scale) (exact: the IEEE division, else division-free from rscale = RN(1 / scale)).
void fp8_tile_images(const at::Tensor& k, const at::Tensor& v, const at::Tensor& cu_k, at::Tensor images,
                     double k_scale, double k_rscale, double v_scale, double v_rscale, bool exact) {
  const auto bf16 = at::kBFloat16;
  MLA_CHECK(k.is_cuda() && v.is_cuda() && cu_k.is_cuda() && images.is_cuda(), "tensors must be on CUDA");
  MLA_CHECK(k.scalar_type() == bf16 && v.scalar_type() == bf16, "k and v must be bfloat16");
  MLA_CHECK(k.dim() == 3 && k.size(2) == 192 && k.stride(2) == 1,
            "k must be [total_k, kv_heads, 192], last dim contiguous");
  MLA_CHECK(v.dim() == 3 && v.size(2) == 128 && v.stride(2) == 1 && v.size(0) == k.size(0) && v.size(1) == k.size(1),
            "v must be [total_k, kv_heads, 128], last dim contiguous");
  MLA_CHECK(cu_k.scalar_type() == at::kInt && cu_k.is_contiguous() && cu_k.numel() >= 2,
            "cu_k must be contiguous int32 [batch + 1]");
  const int batch = static_cast<int>(cu_k.numel() - 1);
  MLA_CHECK(images.scalar_type() == at::kByte && images.is_contiguous() && images.dim() == 3 &&
                images.size(0) == mla_core_cuda::fp8_tile_image_slots(k.size(0), batch) &&
                images.size(1) == k.size(1) && images.size(2) == mla_core_cuda::kFp8TileImageBytes,
            "images must be contiguous uint8 [fp8_tile_image_slots(total_k, batch), kv_heads, 20480]");
  mla_core_cuda::Fp8TileImagesParams p{};
  p.k = static_cast<const uint16_t*>(k.data_ptr());
  p.v = static_cast<const uint16_t*>(v.data_ptr());
  p.k_stride_t = k.stride(0);
  p.k_stride_h = k.stride(1);
  p.v_stride_t = v.stride(0);
  p.v_stride_h = v.stride(1);
  p.total_k = k.size(0);
  p.kv_heads = static_cast<int>(k.size(1));
  p.batch = batch;
  p.cu_k = cu_k.data_ptr<int32_t>();
  p.k_scale = static_cast<float>(k_scale);
  p.k_rscale = static_cast<float>(k_rscale);
  p.v_scale = static_cast<float>(v_scale);
  p.v_rscale = static_cast<float>(v_rscale);
  p.exact = exact ? 1 : 0;
  p.images = images.data_ptr<uint8_t>();
  MLA_CHECK(mla_core_cuda::fp8_tile_images_supported(p),
            "the FP8 tile images need non-empty k, at most 65535 kv heads, and data and token / head strides 16-byte "
            "aligned; got strides k ", k.strides(), ", v ", v.strides());
  const c10::cuda::CUDAGuard guard(k.device());
  const cudaError_t err = mla_core_cuda::launch_fp8_tile_images(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda fp8 tile images launch failed: ", cudaGetErrorString(err));
}

// The fp8 recipe's prefill on FP8 wgmma (mla_prefill_fp8.cu): q [total_q, heads, 192] bf16 (last dimension
// contiguous, data and strides 8-byte aligned), images from fp8_tile_images over total_k keys, cu_q / cu_k [batch +
// 1] int32 contiguous, out [total_q, heads, 128] bf16 and lse [heads, total_q] float32 (optional), both contiguous
// and written; Q's and P's codes e4m3(x / scale) (exact: the IEEE division).
void prefill_fp8(const at::Tensor& q, const at::Tensor& images, const at::Tensor& cu_q,
                 const at::Tensor& cu_k, int64_t max_seqlen_q, int64_t total_k, at::Tensor out,
                 std::optional<at::Tensor> lse, bool causal, double scale_log2, double out_scale, double q_scale,
                 double q_rscale, double p_scale, double p_rscale, bool exact) {
  MLA_CHECK(q.is_cuda() && images.is_cuda() && cu_q.is_cuda() && cu_k.is_cuda() && out.is_cuda(),
            "mla_core cuda prefill: tensors must be on CUDA");
  MLA_CHECK(q.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
            "q and out must be bfloat16");
  MLA_CHECK(q.dim() == 3 && q.size(2) == 192 && q.stride(2) == 1,
            "q must be [total_q, heads, 192], last dim contiguous");
  MLA_CHECK(cu_q.scalar_type() == at::kInt && cu_k.scalar_type() == at::kInt && cu_q.is_contiguous() &&
                cu_k.is_contiguous() && cu_q.numel() >= 2 && cu_k.numel() == cu_q.numel(),
            "cu_q and cu_k must be contiguous int32 [batch + 1]");
  const int batch = static_cast<int>(cu_q.numel() - 1);
  MLA_CHECK(images.scalar_type() == at::kByte && images.is_contiguous() && images.dim() == 3 &&
                images.size(0) == mla_core_cuda::fp8_tile_image_slots(total_k, batch) &&
                images.size(2) == mla_core_cuda::kFp8TileImageBytes,
            "images must be fp8_tile_images' contiguous uint8 [fp8_tile_image_slots(total_k, batch), kv_heads, "
            "20480]");
  MLA_CHECK(out.is_contiguous() && out.size(0) == q.size(0) && out.size(1) == q.size(1) && out.size(2) == 128,
            "out must be contiguous [total_q, heads, 128]");
  mla_core_cuda::PrefillFp8Params p{};
  p.q = static_cast<const uint16_t*>(q.data_ptr());
  p.q_stride_t = q.stride(0);
  p.q_stride_h = q.stride(1);
  p.images = images.data_ptr<uint8_t>();
  p.total_q = q.size(0);
  p.total_k = total_k;
  p.heads = static_cast<int>(q.size(1));
  p.kv_heads = static_cast<int>(images.size(1));
  p.batch = batch;
  p.max_seqlen_q = static_cast<int>(std::min<int64_t>(max_seqlen_q, INT32_MAX));
  p.cu_q = cu_q.data_ptr<int32_t>();
  p.cu_k = cu_k.data_ptr<int32_t>();
  p.causal = causal ? 1 : 0;
  p.scale_log2 = static_cast<float>(scale_log2);
  p.out_scale = static_cast<float>(out_scale);
  p.q_scale = static_cast<float>(q_scale);
  p.q_rscale = static_cast<float>(q_rscale);
  p.p_scale = static_cast<float>(p_scale);
  p.p_rscale = static_cast<float>(p_rscale);
  p.exact = exact ? 1 : 0;
  p.out = reinterpret_cast<uint16_t*>(out.data_ptr());
  p.lse = nullptr;
  if (lse.has_value()) {
    MLA_CHECK(lse->is_cuda() && lse->scalar_type() == at::kFloat && lse->is_contiguous() &&
                  lse->numel() == q.size(0) * q.size(1), "lse must be contiguous float32 [heads, total_q]");
    p.lse = lse->data_ptr<float>();
  }
  MLA_CHECK(mla_core_cuda::prefill_fp8_supported(p),
            "the FP8 prefill needs heads a multiple of kv_heads, non-empty q and k, and q's data and token / head "
            "strides 8-byte aligned; got strides q ", q.strides());
  const c10::cuda::CUDAGuard guard(q.device());
  const cudaError_t err = mla_core_cuda::launch_prefill_fp8(p, c10::cuda::getCurrentCUDAStream().stream());
  MLA_CHECK(err == cudaSuccess, "mla_core cuda fp8 prefill launch failed: ", cudaGetErrorString(err));
}
// The fused layer's decode step after its q_nope GEMM, in one call (backends/cuda/mla_core_cuda/decode.py, run with
// ``prep``): the prep (mla_layer_prep.cu: the new cache rows, q_rope rotated into q's columns 512..575, each token's
// key count into seq_lens), then the decode kernel ``kernel`` (0: mma.sync with head_tiles / warps, 1: WGMMA, 2: its
// keys-as-M variant, 3: its four-slot ring, config ring4) with its split and combine, all on the current stream.
// sum_order: the float32
// summation order of the Triton version whose prep this one must equal (mla_layer_prep.cu). One token per request (the layer's
// max_seq_len 1): token t of q_src / kv is request t. q_src [tokens, heads, nope + 64] and kv [tokens, 576] in the
// cache dtype (bf16 / fp16), last dims contiguous; offsets [tokens + 1] and starts [tokens] int32 / int64 contiguous;
// kv 16-byte aligned with a row stride a multiple of 16, gamma and the cache 16-byte aligned; freqs float32 [max_pos, 64] rows contiguous; gamma [512] float32 / bf16 / fp16 contiguous; the cache contiguous;
// the block table's rows contiguous; seq_lens int32 [tokens] contiguous (written by the prep). Every check runs
// before the first launch.
void layer_decode(const at::Tensor& q_src, const at::Tensor& kv, const at::Tensor& offsets, const at::Tensor& starts,
                  const at::Tensor& freqs, const at::Tensor& gamma, double eps, bool interleave, int64_t sum_order,
                  const at::Tensor& q,
                  const at::Tensor& cache, const at::Tensor& block_table, const at::Tensor& seq_lens, at::Tensor out,
                  std::optional<at::Tensor> lse, std::optional<at::Tensor> part_o, std::optional<at::Tensor> part_lse,
                  int64_t num_splits, double qk_scale_log2, double out_scale, double k_scale, double v_scale,
                  double p_scale, int64_t k_fmt, int64_t v_fmt, int64_t p_fmt, bool v_from_k, bool exact_div,
                  int64_t kernel, int64_t head_tiles, int64_t warps) {
  MLA_CHECK(kernel >= 0 && kernel <= 3, "kernel must be 0 (mma.sync), 1 (WGMMA), 2 (keys-as-M) or 3 (ring4)");
  MLA_CHECK(sum_order >= 0 && sum_order <= 2, "sum_order must be 0..2");
  mla_core_cuda::DecodeParams p =
      common_params(q, cache, block_table, seq_lens, out, lse, part_o, part_lse, num_splits, qk_scale_log2);
  set_quant(p, out_scale, k_scale, v_scale, p_scale, k_fmt, v_fmt, p_fmt, v_from_k, exact_div);
  MLA_CHECK(!p.cache_fp8, "the layer's CUDA prep writes bfloat16 / float16 caches");
  if (kernel == 0) {
    MLA_CHECK(mla_core_cuda::decode_shape_supported(static_cast<int>(head_tiles), static_cast<int>(warps)),
              "(head_tiles, warps) must be (1, 4), (2, 4), (2, 8) or (4, 8)");
    p.head_tiles = static_cast<int>(head_tiles);
    p.warps = static_cast<int>(warps);
  } else {
    p.keys_m = kernel == 2;
    p.ring4 = kernel == 3;
    MLA_CHECK(mla_core_cuda::decode_wgmma_supported(p), "the WGMMA decode does not run this call (dtype ", p.dtype,
              ", k_fmt ", p.k_fmt, ", v_fmt ", p.v_fmt, ", heads ", p.heads, ", keys_m ", p.keys_m, ", ring4 ",
              p.ring4, ")");
  }
  const int64_t tokens = q.size(0);
  const auto dt = cache.scalar_type();
  MLA_CHECK(cache.is_contiguous(), "latent_cache must be contiguous");
  MLA_CHECK(q_src.is_cuda() && kv.is_cuda() && offsets.is_cuda() && starts.is_cuda() && freqs.is_cuda() &&
                gamma.is_cuda(), "the prep's tensors must be on CUDA");
  MLA_CHECK(q_src.dim() == 3 && q_src.size(0) == tokens && q_src.size(1) == q.size(1) && q_src.size(2) > 64 &&
                q_src.stride(2) == 1 && q_src.scalar_type() == dt,
            "q_src must be [tokens, heads, nope + 64] in the cache dtype, last dim contiguous");
  MLA_CHECK(kv.dim() == 2 && kv.size(0) == tokens && kv.size(1) == 576 && kv.stride(1) == 1 && kv.scalar_type() == dt,
            "kv must be [tokens, 576] in the cache dtype, last dim contiguous");
  // the Triton prep's summation order (mla_layer_prep.cu) is its vectorized layout's: 16-byte aligned rows only
  MLA_CHECK(reinterpret_cast<uintptr_t>(kv.data_ptr()) % 16 == 0 && kv.stride(0) % 16 == 0,
            "kv must start on 16 bytes with a row stride a multiple of 16 elements (the Triton prep's layout)");
  MLA_CHECK(reinterpret_cast<uintptr_t>(gamma.data_ptr()) % 16 == 0 &&
                reinterpret_cast<uintptr_t>(cache.data_ptr()) % 16 == 0,
            "kv_norm_gamma and latent_cache must start on 16 bytes (the Triton prep's layout)");
  check_index(offsets, "input_row_offsets");
  check_index(starts, "cache_offsets");
  MLA_CHECK(offsets.dim() == 1 && offsets.size(0) == tokens + 1 && offsets.is_contiguous(),
            "input_row_offsets must be contiguous [tokens + 1] (one token per request)");
  MLA_CHECK(starts.dim() == 1 && starts.size(0) == tokens && starts.is_contiguous(),
            "cache_offsets must be contiguous [tokens] (one token per request)");
  MLA_CHECK(block_table.dim() == 2 && block_table.size(0) == tokens && block_table.stride(1) == 1,
            "block_table must be [tokens, width] with contiguous rows");
  MLA_CHECK(freqs.dim() == 2 && freqs.size(0) >= 1 && freqs.size(1) == 64 && freqs.stride(1) == 1 &&
                freqs.scalar_type() == at::kFloat, "freqs_cis must be float32 [max_pos, 64], rows contiguous");
  MLA_CHECK(gamma.dim() == 1 && gamma.size(0) == 512 && gamma.is_contiguous() &&
                (gamma.scalar_type() == at::kFloat || gamma.scalar_type() == at::kBFloat16 ||
                 gamma.scalar_type() == at::kHalf), "kv_norm_gamma must be contiguous [512] float32 / bf16 / fp16");
  MLA_CHECK(seq_lens.scalar_type() == at::kInt && seq_lens.dim() == 1 && seq_lens.size(0) == tokens &&
                seq_lens.is_contiguous(), "seq_lens must be contiguous int32 [tokens] (the prep writes it)");

  mla_core_cuda::LayerPrepParams lp{};
  lp.q = q_src.data_ptr();
  lp.q_stride_t = q_src.stride(0);
  lp.q_stride_h = q_src.stride(1);
  lp.kv = kv.data_ptr();
  lp.kv_stride_t = kv.stride(0);
  lp.offsets = offsets.data_ptr();
  lp.offsets_i64 = offsets.scalar_type() == at::kLong;
  lp.starts = starts.data_ptr();
  lp.starts_i64 = starts.scalar_type() == at::kLong;
  lp.freqs = freqs.data_ptr<float>();
  lp.freqs_stride = freqs.stride(0);
  lp.max_pos = freqs.size(0);
  lp.gamma = gamma.data_ptr();
  lp.gamma_dtype = dtype_code(gamma);
  lp.cache = cache.data_ptr();
  lp.num_pages = cache.size(0);
  lp.page_size = cache.size(1);
  lp.table = block_table.data_ptr();
  lp.table_i64 = p.table_i64;
  lp.table_stride_b = block_table.stride(0);
  lp.width = block_table.size(1);
  lp.q_out = q.data_ptr();
  lp.qo_stride_t = q.stride(0);
  lp.qo_stride_h = q.stride(1);
  lp.tok_len = seq_lens.data_ptr<int32_t>();
  lp.tokens = static_cast<int>(tokens);
  lp.batch = static_cast<int>(tokens);
  lp.heads = static_cast<int>(q.size(1));
  lp.nope = static_cast<int>(q_src.size(2) - 64);
  lp.eps = static_cast<float>(eps);
  lp.interleave = interleave;
  lp.sum_order = static_cast<int>(sum_order);
  lp.dtype = p.dtype;

  const c10::cuda::CUDAGuard guard(q.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  cudaError_t err = mla_core_cuda::launch_layer_prep(lp, stream);
  MLA_CHECK(err == cudaSuccess, "mla_core cuda layer prep launch failed: ", cudaGetErrorString(err));
  err = kernel == 0 ? mla_core_cuda::launch_decode(p, stream) : mla_core_cuda::launch_decode_wgmma(p, stream);
  MLA_CHECK(err == cudaSuccess, "mla_core cuda decode (layer) launch failed: ", cudaGetErrorString(err));
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "mla_core CUDA kernels (sm_90a): paged MLA decode with fused fake quantization";
  m.def("decode", &decode, "Paged MLA decode (see backends/cuda/mla_core_cuda/decode.py)", pybind11::arg("q"),
        pybind11::arg("cache"), pybind11::arg("block_table"), pybind11::arg("seq_lens"), pybind11::arg("out"),
        pybind11::arg("lse"), pybind11::arg("part_o"), pybind11::arg("part_lse"), pybind11::arg("num_splits"),
        pybind11::arg("qk_scale_log2"), pybind11::arg("out_scale"), pybind11::arg("k_scale"),
        pybind11::arg("v_scale"), pybind11::arg("p_scale"), pybind11::arg("k_fmt"), pybind11::arg("v_fmt"),
        pybind11::arg("p_fmt"), pybind11::arg("v_from_k"), pybind11::arg("exact_div"),
        pybind11::arg("head_tiles"), pybind11::arg("warps"));
  m.def("decode_wgmma", &decode_wgmma, "Paged MLA decode on WGMMA (see backends/cuda/mla_core_cuda/decode.py)",
        pybind11::arg("q"), pybind11::arg("cache"), pybind11::arg("block_table"), pybind11::arg("seq_lens"),
        pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("part_o"), pybind11::arg("part_lse"),
        pybind11::arg("num_splits"), pybind11::arg("qk_scale_log2"), pybind11::arg("out_scale"),
        pybind11::arg("k_scale"), pybind11::arg("v_scale"), pybind11::arg("p_scale"), pybind11::arg("k_fmt"),
        pybind11::arg("v_fmt"), pybind11::arg("p_fmt"), pybind11::arg("v_from_k"), pybind11::arg("exact_div"),
        pybind11::arg("keys_m") = false, pybind11::arg("ring4") = false);
  m.def("layer_decode", &layer_decode,
        "The fused layer's decode step: the CUDA prep, then the decode (see backends/cuda/mla_core_cuda/decode.py)",
        pybind11::arg("q_src"), pybind11::arg("kv"), pybind11::arg("offsets"), pybind11::arg("starts"),
        pybind11::arg("freqs"), pybind11::arg("gamma"), pybind11::arg("eps"), pybind11::arg("interleave"),
        pybind11::arg("sum_order"), pybind11::arg("q"), pybind11::arg("cache"), pybind11::arg("block_table"),
        pybind11::arg("seq_lens"),
        pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("part_o"), pybind11::arg("part_lse"),
        pybind11::arg("num_splits"), pybind11::arg("qk_scale_log2"), pybind11::arg("out_scale"),
        pybind11::arg("k_scale"), pybind11::arg("v_scale"), pybind11::arg("p_scale"), pybind11::arg("k_fmt"),
        pybind11::arg("v_fmt"), pybind11::arg("p_fmt"), pybind11::arg("v_from_k"), pybind11::arg("exact_div"),
        pybind11::arg("kernel"), pybind11::arg("head_tiles"), pybind11::arg("warps"));
  m.def("sparse_decode_wgmma", &sparse_decode_wgmma,
        "FP8 top-k sparse MLA decode on WGMMA, 576- or 656-byte rows (see backends/cuda/mla_core_cuda/sparse.py)",
        pybind11::arg("query"), pybind11::arg("cache"), pybind11::arg("indices"), pybind11::arg("valid_lens"),
        pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("part_o"), pybind11::arg("part_lse"),
        pybind11::arg("num_splits"), pybind11::arg("scale_log2"), pybind11::arg("bmm2_scale"));
  m.def("prefill_wgmma", &prefill_wgmma,
        "Varlen MLA prefill on WGMMA, q/k 192, v 128 bf16 (see backends/cuda/mla_core_cuda/prefill.py)",
        pybind11::arg("q"), pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("cu_q"), pybind11::arg("cu_k"),
        pybind11::arg("max_seqlen_q"), pybind11::arg("out"), pybind11::arg("lse"), pybind11::arg("causal"),
        pybind11::arg("scale_log2"), pybind11::arg("out_scale"), pybind11::arg("p_fmt"), pybind11::arg("p_scale"),
        pybind11::arg("p_rscale"), pybind11::arg("q_fmt"), pybind11::arg("q_scale"), pybind11::arg("q_rscale"),
        pybind11::arg("work_counter") = pybind11::none());
  m.def("fp8_codes_bf16", &fp8_codes_bf16,
        "FP8 E4M3 codes of each x / scale as bf16 values, one launch (the prefill's QDQ pre-pass)",
        pybind11::arg("xs"), pybind11::arg("outs"), pybind11::arg("scales"), pybind11::arg("rscales"),
        pybind11::arg("exact_div"));
  m.def("nvfp4_rows_bf16", &nvfp4_rows_bf16,
        "NVFP4 values without the global scale along 192-wide rows, as bf16, one launch (the nvfp4 pre-pass of Q / K)",
        pybind11::arg("xs"), pybind11::arg("outs"), pybind11::arg("gs"), pybind11::arg("exact_div"));
  m.def("nvfp4_keys_bf16", &nvfp4_keys_bf16,
        "NVFP4 values without the global scale along each sequence's keys, as bf16 (the nvfp4 pre-pass of V)",
        pybind11::arg("v"), pybind11::arg("cu_k"), pybind11::arg("out"), pybind11::arg("g"),
        pybind11::arg("exact_div"));
  m.def("fp8_tile_image_slots", &mla_core_cuda::fp8_tile_image_slots,
        "Tile image slots fp8_tile_images writes for total_k keys in batch sequences (total_k / 64 + batch + 1)",
        pybind11::arg("total_k"), pybind11::arg("batch"));
  m.def("fp8_tile_images", &fp8_tile_images,
        "The FP8-wgmma prefill's pre-pass: each 64-key tile's K and V^T codes as one 20 KB image",
        pybind11::arg("k"), pybind11::arg("v"), pybind11::arg("cu_k"), pybind11::arg("images"),
        pybind11::arg("k_scale"), pybind11::arg("k_rscale"), pybind11::arg("v_scale"), pybind11::arg("v_rscale"),
        pybind11::arg("exact"));
  m.def("prefill_fp8", &prefill_fp8,
        "The fp8 recipe's varlen prefill on FP8 wgmma (see backends/cuda/mla_core_cuda/prefill.py)",
        pybind11::arg("q"), pybind11::arg("images"), pybind11::arg("cu_q"), pybind11::arg("cu_k"),
        pybind11::arg("max_seqlen_q"), pybind11::arg("total_k"), pybind11::arg("out"), pybind11::arg("lse"),
        pybind11::arg("causal"), pybind11::arg("scale_log2"), pybind11::arg("out_scale"), pybind11::arg("q_scale"),
        pybind11::arg("q_rscale"), pybind11::arg("p_scale"), pybind11::arg("p_rscale"), pybind11::arg("exact"));
}
