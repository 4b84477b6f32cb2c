"""One-line bugs in the musa_fp8 kernels (and the sparse/rope specs) that the tests must catch."""

_ROPE = "backends/musa_fp8/mla_core_musa_fp8/rope.py"
_SPARSE = "backends/musa_fp8/mla_core_musa_fp8/sparse.py"
_BITS = "backends/musa_fp8/mla_core_musa_fp8/fp8bits.py"
_T = ["tests/test_musa_fp8.py"]

MUTANTS = [
    dict(file=_SPARSE, old="hi = tl.minimum(lo + per_split * BLOCK_N, valid)",
         new="hi = tl.minimum(lo + per_split * BLOCK_N, valid + 1)", tests=_T,
         why="off by one at the valid length: the slot past seq_lens (garbage / NaN row) must never be read"),
    dict(file=_SPARSE, old="kmask = in_len & (idx >= 0) & (idx < rows)", new="kmask = in_len & (idx >= 0)", tests=_T,
         why="indices past the cache must be masked (metadata mode), not read"),
    dict(file=_SPARSE, old="per_split = tl.cdiv(tiles, num_splits)", new="per_split = tiles // num_splits", tests=_T,
         why="split share rounded down: the last tiles of a token are dropped when splits do not divide them"),
    dict(file=_SPARSE, old="s += mma(q2, tl.trans(k2), zero, HW) * sc2[None, :]",
         new="s += mma(q2, tl.trans(k2), zero, HW) * sc1[None, :]", tests=_T,
         why="fp8_ds_mla: each 128-value block's scores use its own scale"),
    dict(file=_SPARSE, old="acc3 = mma(to_dot_bf16(p * sc3[None, :], HW), k3, acc3 * a, HW)",
         new="acc3 = mma(to_dot_bf16(p, HW), k3, acc3 * a, HW)", tests=_T,
         why="fp8_ds_mla: V's block scale enters P·V"),
    dict(file=_SPARSE, old="krow = kv_codes + key * s_codes", new="krow = kv_codes + (key + 1) * s_codes", tests=_T,
         why="wrong cache row for every key"),
    dict(file=_SPARSE, old="    w = tl.exp(lses - top_use)  # empty splits (-inf) weigh 0",
         new="    w = tl.exp(lses - top_use) * 0.5 + 0.5 * (i == 0)", tests=_T,
         why="splits merged by their log-sum-exp weights"),
    dict(file=_SPARSE, old="        w = inv * bmm2_scale", new="        w = inv", tests=_T,
         why="bmm2_scale multiplies the output (direct path)"),
    dict(file=_SPARSE, old="    m_use = tl.where(m_new == float(\"-inf\"), 0.0, m_new)  # no key yet: nothing to subtract (no -inf - -inf)",
         new="    m_use = m_new", tests=_T,
         why="a tile with no valid key before any valid one must not give NaN"),
    dict(file=_ROPE, old="        c2 = i + HALF", new="        c2 = i + HALF - 1", tests=_T,
         why="NeoX pairs element i with i + rope/2"),
    dict(file=_ROPE, old="    y2 = x2 * cos[None, :] + x1 * sin[None, :]", new="    y2 = x2 * cos[None, :] - x1 * sin[None, :]",
         tests=_T, why="the rotation's sign"),
    dict(file=_ROPE, old="    cmask = (pos >= 0) & (pos < max_pos) & (i < HALF)", new="    cmask = (pos >= 0) & (i < HALF)",
         tests=_T, why="a position past the cos/sin table must be masked (rope 0), never read"),
    dict(file=_ROPE, old="                   k_nope_out + t * dk_nope_t, 0, 0, 0, 0, 1, cos, sin, scale_kv,",
         new="                   k_nope_out + t * dk_nope_t, 0, 0, 0, 0, 1, cos, sin, scale_q,", tests=_T,
         why="K parts use quant_scale_kv"),
    dict(file=_ROPE, old="    rmask = r < rows", new="    rmask = r <= rows", tests=_T,
         why="a partial head group must not write the next head's row (the spare row of a cache slice)"),
    dict(file=_BITS, old="    up = (frac > 0.5) | ((frac == 0.5) & ((whole & 1) == 1))", new="    up = frac >= 0.5", tests=_T,
         why="E4M3 ties round to even, not up (interpreter path)"),
    dict(file=_BITS, old="    sub = (tl.abs(r) * 512.0).to(tl.int32)  # subnormals are multiples of 2^-9",
         new="    sub = (tl.abs(r) * 256.0).to(tl.int32)  # subnormals are multiples of 2^-9", tests=_T,
         why="E4M3 subnormal codes (values below 2^-6)"),
]
