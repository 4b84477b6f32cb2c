// mla_decode_split.cuh: the split schedule both decode kernels (mla_decode.cu, mla_decode_wgmma.cu) walk, one
// definition of the numerics contract's rule (docs/numerics.md): a request's length, clamped to 0 .. the block
// table's capacity, in P tiles of `p_tile` keys; split s takes tiles s * t .. s * t + t - 1 with
// t = ceil(tiles / num_splits) (a split may be empty); keys [lo, hi).
#pragma once

#include "mla_decode.h"

#include <cstdint>

namespace mla_core_cuda {

// Element i of an int32 or int64 index array (block table, lengths).
__device__ __forceinline__ int64_t load_index(const void* p, int64_t i, bool i64) {
  return i64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
}

struct SplitKeys {
  int64_t lo, hi;  // keys [lo, hi) of one split (hi <= lo: the split is empty)
};

// The keys of split `split` of request b.
__device__ __forceinline__ SplitKeys split_keys(const DecodeParams& p, int b, int split, int p_tile) {
  int64_t len = load_index(p.seq_lens, b * p.lens_stride, p.lens_i64);
  const int64_t capacity = p.table_width * p.page_size;
  len = len < 0 ? 0 : (len > capacity ? capacity : len);
  const int64_t tiles_total = (len + p_tile - 1) / p_tile;
  const int64_t tiles_per_split = (tiles_total + p.num_splits - 1) / p.num_splits;
  const int64_t lo = split * tiles_per_split * p_tile;
  return {lo, lo + tiles_per_split * p_tile < len ? lo + tiles_per_split * p_tile : len};
}

// Every split kernel calls this first: the combine kernel (launched with programmatic stream serialization) may be
// scheduled once every CTA of the split grid has run it; it still waits for the whole grid's writes
// (griddepcontrol.wait) before it reads a partial. A no-op without such a dependent.
__device__ __forceinline__ void allow_combine_launch() {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}

}  // namespace mla_core_cuda
