"""Mutants of the triton decode / prefill / merge kernels: each is one plausible bug a CPU test (the kernels
under the Triton interpreter) must notice. ``old`` occurs exactly once in ``file``; ``new`` replaces it.

The first three are the kernel bugs of the audit that no test used to see (issue 13's table), as they
would read in today's code.
"""

DECODE = "backends/triton/mla_core_triton/decode.py"
PREFILL = "backends/triton/mla_core_triton/prefill.py"
MERGE = "backends/triton/mla_core_triton/merge.py"

MUTANTS = [
    dict(file=DECODE, old="    tiles_total = tl.cdiv(seq_len, TILE)", new="    tiles_total = seq_len // TILE + 1",
         tests=["tests/test_triton_rules.py -k 'decode_lengths and triton'"],
         why="issue 13: one tile too many at lengths that are multiples of 32 moves the split boundaries "
             "(visible with NVFP4 P, 2 splits)"),
    dict(file=PREFILL, old="        hi = tl.minimum(len_k, m0 + BLOCK_M + shift)\n",
         new="        hi = tl.minimum(len_k, m0 + BLOCK_M + shift) - 1\n",
         tests=["tests/test_triton_rules.py -k 'causal_query_tile and triton'"],
         why="issue 13: the last key of a causal query tile skipped when it opens a key tile (64 / 65, block_n 16)"),
    dict(file=PREFILL, old="        rank += ((sj > s3) | ((sj == s3) & (idx > j))).to(tl.int32)",
         new="        rank += ((sj > s3) | ((sj == s3) & (idx < j))).to(tl.int32)",
         tests=["tests/test_triton_rules.py -k 'ties and triton'"],
         why="issue 13: N:M ties kept at the higher index instead of the lower"),
    dict(file=DECODE,
         old="    seq_len = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), capacity).to(tl.int32)\n    tiles_total",
         new="    seq_len = tl.load(lens_ptr + b).to(tl.int32)\n    tiles_total",
         tests=["tests/test_triton_safety.py -k 'decode and triton'"],
         why="a length past the block table's capacity must be clamped (the kernel read the next table row)"),
    dict(file=PREFILL, old="    end = tl.minimum(tl.maximum(tl.load(cu_ptr + seq + 1), start), total)",
         new="    end = tl.maximum(tl.load(cu_ptr + seq + 1), start)",
         tests=["tests/test_triton_safety.py -k 'prefill and triton and past_the_tensors'"],
         why="a cu_seqlens end past k / q must be clamped (the kernel read past k's last row)"),
    dict(file=DECODE, old="            valid = in_split & (page >= 0) & (page < num_pages)",
         new="            valid = in_split & (page < num_pages)",
         tests=["tests/test_triton_safety.py -k 'page_ids and triton'"],
         why="wrong mask: a negative page id within the length must be an absent key, not read"),
    dict(file=MERGE, old='    a = tl.where(a == float("inf"), float("-inf"), a)', new="    a = a",
         tests=["tests/test_triton_safety.py -k 'plus_inf and triton'"],
         why="an input LSE of +inf (FlashAttention's empty row) must be an empty state"),
    dict(file=MERGE, old="torch.empty(pre.shape, dtype=pre.dtype, device=pre.device)", new="torch.empty_like(pre)",
         tests=["tests/test_triton_safety.py -k 'contiguous and triton'"],
         why="a new merge output must be contiguous whatever the input strides"),
    dict(file=DECODE, old="float(call.softmax_scale) * k_scale * _LOG2E", new="float(call.softmax_scale) * _LOG2E",
         tests=["tests/test_triton_decode.py -k amax_cpu"],
         why="wrong scale: the per-tensor K factor left out of the scores (visible with a K amax)"),
    dict(file=PREFILL, old="        tl.store(lse_ptr + head.to(tl.int64) * lse_stride_h + q_start + offs_m, lse, mask=q_in)",
         new="        tl.store(lse_ptr + head.to(tl.int64) * lse_stride_h + offs_m, lse, mask=q_in)",
         tests=["tests/test_triton_prefill.py -k fp32_varlen"],
         why="wrong index: every sequence writes its LSE at row 0 (the others stay poisoned)"),
    dict(file=DECODE, old="    mask_lse = mask_h & (tl.full([BLOCK_H], v_part, tl.int32) == 0)",
         new="    mask_lse = mask_h & (v_part == 0)",
         tests=["tests/test_triton_decode.py -k 'formats_cpu and None-None-None'"],
         why="triton 3.9's interpreter rejects a vector & scalar-bool mask (issue 8.1)"),
    dict(file=PREFILL, old="        UPCAST=q.dtype == torch.bfloat16 and not (hw_fp8 & 1),", new="        UPCAST=False,",
         tests=["tests/test_triton_prefill.py -k 'bfloat16_every_recipe and bf16'"],
         why="bf16 prefill under the interpreter multiplies raw bits (issue 8.3)"),
    dict(file=DECODE, old="           tuple(config.items()), on_gpu, sms)", new="           on_gpu, sms)",
         tests=["tests/test_triton_decode.py -k launch_plans"],
         why="launch plans keyed without the config: another split count in the config reuses the first plan"),
    dict(file=DECODE, old="           call.v_qdq, call.v_amax, call.p_qdq, call.p_amax, call.return_lse, call.kv_scale,",
         new="           call.v_qdq, call.v_amax, call.p_qdq, call.p_amax, call.kv_scale,",
         tests=["tests/test_triton_decode.py -k launch_plans"],
         why="launch plans keyed without return_lse: a call without LSE reuses a plan that writes one (into out)"),
]
