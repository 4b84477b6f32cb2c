"""Mutants of the reference decode / prefill / merge and the numerics rules they use: each is a plausible bug
a CPU test must notice. ``old`` occurs exactly once in ``file``; ``new`` replaces it."""

DECODE = "backends/reference/mla_core_reference/decode.py"
PREFILL = "backends/reference/mla_core_reference/prefill.py"
MERGE = "backends/reference/mla_core_reference/merge.py"

MUTANTS = [
    dict(file=DECODE, old="    lens = call.seq_lens.to(device, torch.int64).clamp(0, capacity)",
         new="    lens = call.seq_lens.to(device, torch.int64)",
         tests=["tests/test_triton_safety.py -k 'decode and reference'"],
         why="lengths past the table's capacity must be clamped (a raw RuntimeError in metadata mode)"),
    dict(file=PREFILL, old="        ranges.append((start, min(max(b, start), total)))", new="        ranges.append((start, b))",
         tests=["tests/test_triton_safety.py -k 'prefill and reference'"],
         why="cu_seqlens past the tensors must be clamped like the kernels do"),
    dict(file=MERGE, old="        output = merged.to(call.prefix_output.dtype).contiguous()",
         new="        output = merged.to(call.prefix_output.dtype)",
         tests=["tests/test_triton_safety.py -k 'contiguous and reference'"],
         why="merge returned strides (128, 1280, 1) (issue 8.2)"),
    dict(file="mla_core/numerics.py", old='    return torch.where(lse == float("inf"), float("-inf"), lse)',
         new="    return lse", tests=["tests/test_reference_merge.py -k plus_inf"],
         why="an input LSE of +inf must merge as an empty state"),
    dict(file=DECODE,
         old="    split_max = torch.full((batch, heads, splits + 1), _NEG_INF, dtype=torch.float32, device=device)",
         new="    split_max = torch.full((batch, heads, splits + 1), _NEG_INF, device=device)",
         tests=["tests/test_triton_safety.py -k 'bfloat16_default and reference'"],
         why="the reference decode must not depend on torch's default dtype (scatter failed under bf16)"),
    dict(file=PREFILL, old="        rank += ((other > g) | ((other == g) & (a < pos))).to(torch.int32)",
         new="        rank += ((other > g) | ((other == g) & (a > pos))).to(torch.int32)",
         tests=["tests/test_triton_rules.py -k 'ties and reference'"],
         why="N:M ties keep the lower index"),
    dict(file=PREFILL,
         old="        dense = (kv_pos[None, :] < call.dense_sink_tokens) | ((delta >= 0) & (delta < call.dense_recent_tokens))",
         new="        dense = (kv_pos[None, :] <= call.dense_sink_tokens) | ((delta >= 0) & (delta < call.dense_recent_tokens))",
         tests=["tests/test_triton_rules.py -k 'sinks and reference'"],
         why="off by one at the sink edge: key `sinks` is not dense"),
]
