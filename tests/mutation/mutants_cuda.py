"""Mutants of the CUDA decode (csrc/mla_decode.cu, backends/cuda): each is one plausible bug the GPU tests
must notice. ``old`` occurs exactly once in ``file``; ``new`` replaces it.

On a GPU machine, ``python3 tests/mutation/mutants_cuda.py`` judges every mutant with the quick test selection
``KILL_SELECTION`` (the runner: gpu_mutants.py), printing killed / SURVIVED per mutant.
"""
from __future__ import annotations

KILL_SELECTION = ("tests/test_cuda_decode.py", "-k",
                  "(deepseek and 16-16) or heads_and_out or calibrated or fp16_cache or index_dtypes")
"""What each mutant runs: fast cases that cover every recipe, split counts, CTA shapes and edges."""
WGMMA_SELECTION = "tests/test_cuda_decode.py -k 'every_config or (deepseek and bf16-128-16)'"
"""The WGMMA kernel's mutants (tests/mutation/run.py): every config at 64/128 heads, the DeepSeek edges at page 16."""

MUTANTS = [
    dict(file="csrc/mla_decode.cu",
         old="  if (tok < hi) {  // only table entries a length reaches are read",
         new="  if (tok <= hi) {  // only table entries a length reaches are read",
         tests=["tests/test_cuda_decode.py"],
         why="off by one at a split's end: the row at the length (NaN in the tests' caches) is read as a key"),
    dict(file="csrc/mla_decode.cu",
         old="      const bool v0 = valid[key] != 0, v1 = valid[key + 1] != 0;",
         new="      const bool v0 = true, v1 = valid[key + 1] != 0;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong mask: absent keys (past the length, pages outside the cache) score 0 instead of -inf"),
    dict(file="backends/cuda/mla_core_cuda/decode.py",
         old="float(call.softmax_scale) * _f32(k_scale) * math.log2(math.e)",
         new="float(call.softmax_scale) * math.log2(math.e)",
         tests=["tests/test_cuda_decode.py"],
         why="wrong scale: the per-tensor K factor left out of the scores (only visible with a K amax)"),
    dict(file="csrc/mla_decode.cu",
         old="        p.part_lse[row * p.num_splits + split] = lse;",
         new="        p.part_lse[row * p.num_splits] = lse;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong index: every split writes its LSE to split 0's slot (the others stay poisoned)"),
    dict(file="csrc/mla_decode_split.cuh",
         old="  return {lo, lo + tiles_per_split * p_tile < len ? lo + tiles_per_split * p_tile : len};",
         new="  return {lo, lo + tiles_per_split * p_tile < len ? lo + tiles_per_split * p_tile : len - 1};",
         tests=["tests/test_cuda_decode.py"],
         why="off by one at the length: the last key of every request is dropped (both decode kernels)"),
    dict(file="csrc/mla_decode.cu",
         old="        acc[mt][nt][2] *= a1;",
         new="        acc[mt][nt][2] *= a0;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong row: the accumulator of heads g + 8 rescaled by row g's running-max factor"),
    dict(file="csrc/mla_decode.cu",
         old="  r = r > 6.f ? 6.f : r;",
         new="  r = r > 4.f ? 4.f : r;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong E2M1 saturation (4 instead of 6): NVFP4 K/V/P values at the top of a block clip"),
    dict(file="csrc/mla_decode.cu",
         old="    total += w;",
         new="    total += 1.f;",
         tests=["tests/test_cuda_decode.py"],
         why="wrong combine weight: splits merged with a plain count instead of their log-sum-exp weights"),
    dict(file="csrc/mla_decode.cu",
         old="        for (int c = 0; c < kRowCols; ++c) x[c] = to_float(from_float<T>(x[c]));",
         new="        for (int c = 0; c < kRowCols; ++c) x[c] = x[c];",
         tests=["tests/test_cuda_decode.py"],
         why="NVFP4 P not rounded to V's dtype first (the contract's order): block maxima and ties move"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  if (tok >= hi) return -1;",
         new="  if (tok > hi) return -1;",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, wrong mask at the length edge: the row at a split's end (NaN past a length) is a key"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="      rescale(o, a2_lo, a2_hi);\n      wg_fence();\n      Wgmma<T>::pv(o, kmajor_desc(sp, 64)",
         new="      wg_fence();\n      Wgmma<T>::pv(o, kmajor_desc(sp, 64)",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, warpgroup 0 skips the rescale between the two 32-key halves: P0 V0 kept against m1"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="        const float e = ex2(sc[j] - ((j & 2) ? z2_hi : z2_lo));",
         new="        const float e = ex2(sc[j] - ((j & 2) ? finite_or_zero(m1_hi) : finite_or_zero(m1_lo)));",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, half 1's P taken against m1 instead of the step's final max m2"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="(s_valid[4 * s + 2 * wg + 1] << 16)",
         new="(s_valid[4 * s + 2 * wg + 1] << 8)",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, wrong validity bits for keys 16-31 of each half (masked keys read, valid ones dropped)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  q = r >= page_size ? q + 1 : q;\n",
         new="",
         tests=["tests/test_cuda_decode.py -k odd_page_sizes"], gpu=True,
         why="WGMMA kernel, a page size that is no power of two: the reciprocal's quotient not corrected upward"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }",
         new="__device__ __forceinline__ float finite_or_zero(float m) { return m; }",
         tests=["tests/test_cuda_decode.py -k unchecked_metadata"], gpu=True,
         why="WGMMA kernel, a step whose first 32 keys are all absent: -inf - -inf gives NaN factors"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  const bool store_hi = h0 + row_lo + 8 < p.heads;",
         new="  const bool store_hi = h0 + row_lo + 16 < p.heads;",
         tests=["tests/test_cuda_decode.py -k 'every_config and 20'"], gpu=True,
         why="WGMMA kernel, padded head group: real rows 12-15 of a 20-head group never stored (the poison stays)"),
]


if __name__ == "__main__":
    import gpu_mutants
    raise SystemExit(gpu_mutants.run(MUTANTS, lambda m: list(KILL_SELECTION)))
