"""Mutants of the CUDA decode (csrc/mla_decode.cu, backends/cuda): each is one plausible bug the GPU tests
must notice. ``old`` occurs exactly once in ``file``; ``new`` replaces it.

On a GPU machine, ``python3 tests/mutation/mutants_cuda.py`` judges every mutant with the quick test selection
``KILL_SELECTION`` (the runner: gpu_mutants.py), printing killed / SURVIVED per mutant; ``MUTANT_SELECTION=qdq``
(or ``wgmma``) judges with ``QDQ_SELECTION`` (``WGMMA_SELECTION``), ``MUTANT_INDICES=16,17`` only those mutants.
"""
from __future__ import annotations

KILL_SELECTION = ("tests/test_cuda_decode.py", "-k",
                  "(deepseek and 16-16) or heads_and_out or calibrated or fp16_cache or index_dtypes")
"""What each mutant runs: fast cases that cover every recipe, split counts, CTA shapes and edges."""
WGMMA_SELECTION = "tests/test_cuda_decode.py -k 'every_config or (deepseek and bf16-128-16)'"
"""The WGMMA kernel's mutants (tests/mutation/run.py): every config at 64/128 heads, the DeepSeek edges at page 16."""
QDQ_SELECTION = ("tests/test_cuda_decode.py -k 'calibrated or (deepseek and fp8-16-16) or "
                 "(deepseek and fp8_p_nvfp4-128-16) or heads_and_out'")
"""The WGMMA kernel's fake-quantization mutants: FP8 K/V with calibrated amaxes, FP8 P, NVFP4 P at 16 and 128 heads."""

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
         old="float(call.softmax_scale) * k32 * math.log2(math.e)",
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
    dict(file="csrc/qdq.cuh",
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
         old="      rescale(o, a2_lo, a2_hi);\n      wg_fence();\n      pv_slab<T>(o, sp, sv, 32);",
         new="      wg_fence();\n      pv_slab<T>(o, sp, sv, 32);",
         tests=[WGMMA_SELECTION], gpu=True,
         why="WGMMA kernel, warpgroup 0 skips the rescale between the two 32-key halves: P0 V0 kept against m1"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="      exponentiate(sc, m2_lo, m2_hi, sum_lo, sum_hi);",
         new="      exponentiate(sc, m1_lo, m1_hi, sum_lo, sum_hi);",
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
    dict(file="csrc/seesaw.cuh",
         old="__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }",
         new="__device__ __forceinline__ float finite_or_zero(float m) { return m; }",
         tests=["tests/test_cuda_decode.py -k unchecked_metadata"], gpu=True,
         why="WGMMA kernel, a step whose first 32 keys are all absent: -inf - -inf gives NaN factors (csrc/seesaw.cuh: "
             "the sparse kernel's P takes the same rule)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  const bool store_hi = h0 + row_lo + 8 < p.heads;",
         new="  const bool store_hi = h0 + row_lo + 16 < p.heads;",
         tests=["tests/test_cuda_decode.py -k 'every_config and 20'"], gpu=True,
         why="WGMMA kernel, padded head group: real rows 12-15 of a 20-head group never stored (the poison stays)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="    for (int k = 0; k < 9; k += 3) {",
         new="    for (int k = 0; k < 6; k += 3) {",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, the producer's FP8 K conversion stops after 6 slabs (columns 384-575 stay raw)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="    const uint32_t a = sk + (16 * w + 4 * g) * 128 + 16 * lane;",
         new="    const uint32_t a = sk + (8 * w + 4 * g) * 128 + 16 * lane;",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, producer warps convert the wrong rows (some twice, some never)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  const float inv = __frcp_rn(p.p_scale);",
         new="  const float inv = __frcp_rn(p.k_scale);",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, P's quotient corrected from K's reciprocal: FP8 / NVFP4 P codes of the wrong scale"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="        const int j = 8 * (blk >> 1) + 2 * (blk & 1) + (i & 1) + 4 * (i >> 1);",
         new="        const int j = 8 * (blk & 1) + 2 * (blk >> 1) + (i & 1) + 4 * (i >> 1);",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P: a block's scale applied to another block (row hi / keys 16-31 swapped)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="bmax[blk] = fmaxf(bmax[blk], __shfl_xor_sync(0xffffffffu, bmax[blk], d));",
         new="bmax[blk] = fmaxf(bmax[blk], __shfl_xor_sync(0xffffffffu, bmax[blk], 1));",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P block amax over 2 threads of the quad (8 keys) instead of 4 (16 keys)"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="      unpack<T>(Wgmma<T>::pack(e[j], e[j + 1]), lo, hi);",
         new="      lo = e[j];\n      hi = e[j + 1];",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, NVFP4 P not rounded to V's dtype first (the contract's order): block maxima and ties move"),
    dict(file="csrc/mla_decode_wgmma.cu",
         old="  const float num = KF != kNoQuant || PF != kNoQuant ? p.out_scale : 1.f;",
         new="  const float num = 1.f;",
         tests=[QDQ_SELECTION], gpu=True,
         why="WGMMA kernel, the output without v_scale * p_scale (the factors left out of the codes)"),
]


if __name__ == "__main__":
    import os
    import shlex

    import gpu_mutants
    # MUTANT_SELECTION=wgmma / qdq: judge with WGMMA_SELECTION / QDQ_SELECTION instead of KILL_SELECTION
    chosen = {"wgmma": WGMMA_SELECTION, "qdq": QDQ_SELECTION}.get(os.environ.get("MUTANT_SELECTION", ""))
    selection = shlex.split(chosen) if chosen else list(KILL_SELECTION)
    raise SystemExit(gpu_mutants.run(MUTANTS, lambda m: selection))
