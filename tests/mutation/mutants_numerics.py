"""Mutants of mla_core/numerics.py, the one definition of the rounding rules every backend and test uses.

Each is one plausible one-line bug; tests/test_numerics.py (and the reference tests built on these helpers)
must notice it. Run with ``python3 tests/mutation/run.py --only numerics``.
"""

NUMERICS = "mla_core/numerics.py"
TESTS = ["tests/test_numerics.py"]

MUTANTS = [
    dict(file=NUMERICS, old="    r = torch.where(a <= 0.25, 0.0,", new="    r = torch.where(a < 0.25, 0.0,", tests=TESTS,
         why="E2M1 tie 0.25 must round to the even code 0, not up to 0.5"),
    dict(file=NUMERICS, old="        torch.where(a <= 2.5, 2.0,", new="        torch.where(a < 2.5, 2.0,", tests=TESTS,
         why="E2M1 tie 2.5 must round to 2 (even code), not 3"),
    dict(file=NUMERICS, old="        torch.where(a <= 5.0, 4.0, 6.0)))))))", new="        torch.where(a < 5.0, 4.0, 6.0)))))))",
         tests=TESTS, why="E2M1 tie 5 must round to 4 (even code), not 6"),
    dict(file=NUMERICS, old="        torch.where(a < 1.75, 1.5,", new="        torch.where(a <= 1.75, 1.5,", tests=TESTS,
         why="E2M1 tie 1.75 must round up to 2 (even code), not down to 1.5"),
    # (dropping the clamp in round_e4m3 is no mutant on torch 2.13: its float8_e4m3fn cast saturates by itself)
    dict(file=NUMERICS, old="    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()",
         new="    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e5m2).float()", tests=TESTS,
         why="FP8 is E4M3 (3 mantissa bits), not E5M2"),
    dict(file=NUMERICS, old="    return round_e4m3(divide(x.float(), s)) * s",
         new="    return round_e4m3(x.float()) * s", tests=TESTS,
         why="FP8 QDQ divides by the scale before rounding"),
    dict(file=NUMERICS, old="NVFP4_BLOCK = 16", new="NVFP4_BLOCK = 32", tests=TESTS,
         why="NVFP4 block size: one E4M3 scale per 16 values, not 32"),
    dict(file=NUMERICS, old="    return 1.0 if amax is None else float(amax) / E4M3_MAX",
         new="    return 1.0 if amax is None else float(amax) / E2M1_MAX", tests=TESTS,
         why="FP8 per-tensor scale is amax / 448"),
    dict(file=NUMERICS, old="    return 1.0 if amax is None else float(amax) / (E2M1_MAX * E4M3_MAX)",
         new="    return 1.0 if amax is None else float(amax) / E4M3_MAX", tests=TESTS,
         why="NVFP4 global scale is amax / (6 * 448)"),
    dict(file=NUMERICS, old="    return x / torch.full((), d, dtype=torch.float32, device=x.device)",
         new="    return x * (1.0 / d)", tests=TESTS,
         why="division by a scale must be a correctly rounded float32 division: the reciprocal flips rounding ties"),
    dict(file=NUMERICS, old="    return -(-(-(-seq_len // DECODE_P_TILE)) // num_kv_splits)",
         new="    return -(-(seq_len // DECODE_P_TILE) // num_kv_splits)", tests=TESTS,
         why="split bounds: tiles per split is ceil(ceil(L / 32) / splits); a floor of the tile count drops the tail"),
    dict(file=NUMERICS, old="        lo, hi = DECODE_P_TILE * i * t, min(DECODE_P_TILE * (i + 1) * t, seq_len)",
         new="        lo, hi = DECODE_P_TILE * i * t, min(DECODE_P_TILE * (i + 1) * t, seq_len - 1)", tests=TESTS,
         why="split bounds: the last split ends at the length, not one key before"),
    dict(file=NUMERICS, old="    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()",
         new="    return 1 if n <= 1 else 1 << int(n).bit_length()",
         tests=TESTS + ["tests/test_dispatch.py", "tests/test_autotune.py", "tests/test_warmup.py"],
         why="bucket_pow2: a power of two is its own bucket (8 -> 8, not 16)"),
    dict(file=NUMERICS, old='    return torch.where(lse == float("inf"), float("-inf"), lse)', new="    return lse",
         tests=TESTS + ["tests/test_reference_merge.py"],
         why="an empty state's LSE +inf (FlashAttention / vLLM convention) must merge as empty"),
    dict(file=NUMERICS, old="        return p.to(v_dtype).float()", new="        return p.float()",
         tests=TESTS + ["tests/test_fuzz.py -k 'decode_fuzz_triton or prefill_fuzz_triton'"],
         why="unquantized P enters P.V rounded to V's dtype"),
]
