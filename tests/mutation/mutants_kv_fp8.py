"""Mutants of the FP8 KV cache (decode with a float8_e4m3fn cache and ``kv_scale``): each a plausible bug that
tests/test_kv_fp8.py must notice (the kernels under the Triton interpreter on the CPU)."""

DECODE = "backends/triton/mla_core_triton/decode.py"
REFERENCE = "backends/reference/mla_core_reference/decode.py"

MUTANTS = [
    dict(file=DECODE, old="                 kv_scale * v_scale * p_scale, 1.0 / k_scale,",
         new="                 v_scale * p_scale, 1.0 / k_scale,",
         tests=["tests/test_kv_fp8.py -k 'triton_matches'"],
         why="kv_scale forgotten on the output: P·codes must be scaled back to values"),
    dict(file=DECODE, old="float(call.softmax_scale) * k_scale * _LOG2E * kv_scale,",
         new="float(call.softmax_scale) * k_scale * _LOG2E,",
         tests=["tests/test_kv_fp8.py -k 'triton_matches'"],
         why="kv_scale forgotten on the scores: q·codes must be scaled to q·values"),
    dict(file=DECODE, old="        f = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)",
         new="        f = tl.where(e == 0, m.to(tl.float32) * 0.00390625, normal)",
         tests=["tests/test_kv_fp8.py -k 'code_conversion'"],
         why="E4M3 subnormals are m * 2^-9 (not 2^-8)"),
    dict(file=DECODE, old="    value_dtype = numerics.decode_value_dtype(cache.dtype, q.dtype)",
         new="    value_dtype = numerics.decode_value_dtype(torch.bfloat16, q.dtype)",
         tests=["tests/test_kv_fp8.py -k 'triton_matches and q_dtype1'"],
         why="an fp16 q over an FP8 cache must run fp16 dots and round P to fp16, not bf16"),
    dict(file=REFERENCE,
         old="values = numerics.fp8_cache_values(rows, call.kv_scale) if call.kv_scale is not None else rows.float()",
         new="values = rows.float()",
         tests=["tests/test_kv_fp8.py -k 'reference_matches'"],
         why="the reference must dequantize the codes (value = code * kv_scale)"),
    dict(file="mla_core/numerics.py", old="    return q_dtype if cache_dtype == FP8_CACHE_DTYPE else cache_dtype",
         new="    return torch.float32 if cache_dtype == FP8_CACHE_DTYPE else cache_dtype",
         tests=["tests/test_kv_fp8.py -k 'reference_matches'"],
         why="P over an FP8 cache is rounded to q's dtype, as the kernels' P·codes dot takes it"),
    dict(file="mla_core/specs.py", old="        if kv_scale is not None:\n            raise MLAInputError(f\"kv_scale: got",
         new="        if False:\n            raise MLAInputError(f\"kv_scale: got",
         tests=["tests/test_kv_fp8.py -k 'float_cache_and_q_dtype'"],
         why="a kv_scale with a bf16 cache would be silently ignored"),
    dict(file="mla_core/compat/flashinfer/decode.py", old="softmax_scale=b1 / b2 if fp8 else b1,",
         new="softmax_scale=b1,",
         tests=["tests/test_kv_fp8.py -k 'flashinfer_dense_path_over_an_fp8'"],
         why="FlashInfer's bmm1_scale multiplies q·codes: with kv_scale = bmm2_scale inside the values, the "
             "softmax scale must divide it back out"),
]
