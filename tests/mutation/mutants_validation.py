"""Mutants of the decode / prefill / merge argument validation added for issue 7.6 (mla_core/specs.py): each lets
a bad argument through. tests/test_validation.py must notice."""

SPECS = "mla_core/specs.py"

MUTANTS = [
    dict(file=SPECS, old="    if not math.isfinite(f) or not FLOAT32_MIN_NORMAL <= f <= FLOAT32_MAX:",
         new="    if not math.isfinite(f) or f <= 0:", tests=["tests/test_validation.py -k 'decode_rejects or prefill_rejects'"],
         why="scalars outside float32's normal range (1e39, 1e-46) must be refused"),
    dict(file=SPECS, old="    if isinstance(sparsity_m, bool) or not isinstance(sparsity_m, int) or sparsity_m not in (4, 8):",
         new="    if isinstance(sparsity_m, bool) or sparsity_m not in (4, 8):",
         tests=["tests/test_validation.py -k prefill_rejects"], why="sparsity_m=4.0 must be refused (an int)"),
    dict(file=SPECS, old='    if x.device.type == "meta" and not (torch.compiler.is_compiling() or isinstance(x, FakeTensor)):',
         new="    if False:", tests=["tests/test_validation.py -k 'decode_rejects or merge_rejects'"],
         why="an eager call with meta tensors must be an MLAInputError"),
    dict(file=SPECS, old='    check_int("max_seqlen_q", max_seqlen_q, 0, INT32_MAX)', new='    check_int("max_seqlen_q", max_seqlen_q, 0)',
         tests=["tests/test_validation.py -k prefill_rejects"], why="max_seqlen_q past int32 must be refused"),
    dict(file=SPECS, old='        cols = torch.arange(block_table.shape[1], device="cpu")',
         new="        cols = torch.arange(block_table.shape[1])",
         tests=["tests/test_triton_safety.py -k 'default_device'"],
         why="the decode content check must not depend on torch's default device"),
    dict(file=SPECS, old="    if capacity > INT32_MAX:", new="    if capacity > INT32_MAX + 4:",
         tests=["tests/test_validation.py -k int32_limits"],
         why="a block table holding 2**31 tokens must be refused (int32 lengths in the kernels)"),
]
