"""Kernel bugs the fuzz test (tests/test_fuzz.py) must notice on its own, with no test written for the bug:
the issue-13 bugs that once passed every test, and a few more. Kernel tests have their own mutant files;
these show that the fuzz's shapes (tile edges by construction) and its comparison against the reference
reach the kernels' edges.
"""

PREFILL = "backends/triton/mla_core_triton/prefill.py"
DECODE = "backends/triton/mla_core_triton/decode.py"
MERGE = "backends/triton/mla_core_triton/merge.py"

MUTANTS = [
    dict(file=PREFILL, old="        hi = tl.minimum(len_k, m0 + BLOCK_M + shift)",
         new="        hi = tl.minimum(len_k, m0 + BLOCK_M + shift) - 1",
         tests=["tests/test_fuzz.py -k prefill_fuzz_triton"],
         why="the last key of a causal query tile skipped where it is the first key of a key tile"),
    dict(file=PREFILL, old="        rank += ((sj > s3) | ((sj == s3) & (idx > j))).to(tl.int32)",
         new="        rank += ((sj > s3) | ((sj == s3) & (idx < j))).to(tl.int32)",
         tests=["tests/test_fuzz.py -k prefill_fuzz_triton"],
         why="N:M ties kept at the higher index instead of the lower"),
    dict(file=DECODE, old="    tiles_total = tl.cdiv(seq_len, TILE)", new="    tiles_total = seq_len // TILE + 1",
         tests=["tests/test_fuzz.py -k decode_fuzz_triton"],
         why="a length that is a multiple of 32 gets one tile too many: the split schedule shifts"),
    dict(file=MERGE, old='    b = tl.where(b == float("inf"), float("-inf"), b)', new="",
         tests=["tests/test_fuzz.py -k merge_fuzz_triton"],
         why="a suffix LSE of +inf (an empty state) must merge as empty"),
    # (mx_safe = mx is no mutant: the `has` guard already gives an all-empty row 0 and -inf)
    dict(file=MERGE, old="    wb = tl.where(has, eb * inv, 0.0)", new="    wb = tl.where(has, ea * inv, 0.0)",
         tests=["tests/test_fuzz.py -k merge_fuzz_triton"],
         why="the suffix weighted by the prefix's share"),
]
