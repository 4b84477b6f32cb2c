"""Mutants of argument validation (mla_core/specs.py): each lets a bad argument through or refuses a good one.

tests/test_validation.py (one case per argument and bad value) and tests/test_fuzz.py must notice.
"""

SPECS = "mla_core/specs.py"
DECODE = ["tests/test_validation.py -k decode"]
PREFILL = ["tests/test_validation.py -k prefill"]
SPARSE = ["tests/test_validation.py -k 'sparse_decode or sparse_accepts'"]

MUTANTS = [
    dict(file=SPECS, old="    if v < lo or (hi is not None and v > hi):", new="    if v < lo or (hi is not None and v > hi + 1):",
         tests=DECODE, why="an int one past its upper bound (num_kv_splits = 129) must be refused"),
    dict(file=SPECS, old="        if lo < 0 or hi > capacity:", new="        if lo < 0 or hi > capacity + 1:", tests=DECODE,
         why="a decode length one past the block table's capacity must be refused"),
    dict(file=SPECS, old="        reached = cols[None, :] < used[:, None]", new="        reached = cols[None, :] <= used[:, None]",
         tests=DECODE, why="block-table entries past a request's last page are never read, so garbage there is accepted"),
    dict(file=SPECS, old="            used = idx[valid & (idx != -1)]", new="            used = idx[valid]", tests=SPARSE,
         why="-1 in a sparse index slot means 'none' and is accepted"),
    dict(file=SPECS, old="    if int(c[-1]) != total:", new="    if int(c[-1]) > total:", tests=PREFILL,
         why="cu_seqlens ending short of the packed token count must be refused"),
    dict(file=SPECS, old="    if kv_heads < 1 or heads % kv_heads:", new="    if kv_heads < 1:", tests=PREFILL,
         why="kv heads must divide the query heads (GQA)"),
    dict(file=SPECS, old="    if kv_scale is not None and (k_qdq or v_qdq):", new="    if False:",
         tests=["tests/test_kv_fp8.py -k refuse_kv_qdq_over_fp8"],
         why="k_qdq / v_qdq over an FP8 cache must name its feature, or backends that read the codes as they are "
             "run it and return unquantized K / V"),
]
