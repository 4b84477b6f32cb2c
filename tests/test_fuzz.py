"""Fuzz every public op's arguments: a clear ``MLAInputError`` before any kernel, or a finite result equal to
the reference backend's.

Hypothesis draws shapes (lengths at tile edges from :mod:`mla_core.testing.strategies`, including lengths
past the block table's capacity), dtypes, indices (in range, -1, past the cache, int32 extremes), scalars
(ordinary, tiny, 0, negative, inf, nan, 1e39, float32 subnormals), output buffers (NaN-poisoned) and the
checks mode (``MLA_CORE_CHECKS`` full / metadata). For every draw the op either

* raises ``MLAInputError`` whose message starts with an argument name, and no backend ran; or
* returns finite outputs (an LSE may be -inf only on a row whose output is 0) of the documented shapes,
  and, for triton, equal to the reference backend's result on the same arguments within the tolerance of
  the output dtype (mla_core.accuracy); with ``metadata`` checks, a call that full checks accept gives the
  same numbers as under full checks (the checks mode never changes a result).

Any other exception, a NaN, or a mismatch is a bug. The reference backend runs ``REF_EXAMPLES`` draws per op;
triton runs fewer (the interpreter takes 0.05..0.5 s a call on these tiny shapes) so that the file stays
within about a minute on two CPU cores. Draws are derandomized: the same examples every run.
"""
from __future__ import annotations

import contextlib
import math
import os
import re

import pytest
import torch
from hypothesis import HealthCheck, Phase, event, example, given, settings
from hypothesis import strategies as st

import mla_core
from mla_core import MLAInputError, accuracy
from mla_core.errors import NoBackendError
from mla_core.plugins import registry
from mla_core.testing import shapes
from mla_core.testing import strategies as mst
from paged_inputs import paged_decode_inputs

FP8 = torch.float8_e4m3fn
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
REF_EXAMPLES = 300
TRITON_EXAMPLES = {"decode": 40, "prefill": 40, "merge": 100}

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
# scalars: ordinary values, a tiny normal float32, and the ones every op must refuse
GOOD_SCALES = [0.125, 0.3, 1.0, 2.0, 1e-30]
BAD_SCALARS = [0.0, -1.0, math.inf, -math.inf, math.nan, 1e39, 1e-39, 1e-46, 1e-300, 1e300, True, "0.5"]
GOOD_AMAX = [None, 1.0, 4.0, 0.5, 1e-30, 1e30]
BAD_INDEX = [-1, -2, 2 ** 31 - 1, -2 ** 31]

checks_modes = st.sampled_from(["full", "metadata"])


def chance(draw, percent):
    """True with about ``percent`` % probability. Hypothesis favours the first element of a sampled_from
    (and the edges of integers()), so the rare outcome is the last ones; shrinking then heads for False."""
    return draw(st.sampled_from(range(100))) >= 100 - percent


def sometimes(draw, good, bad, percent=4):
    """A value from ``good`` (a strategy or list), or with about ``percent`` % probability one from ``bad``."""
    source = bad if chance(draw, percent) else good
    return draw(source if isinstance(source, st.SearchStrategy) else st.sampled_from(source))


@contextlib.contextmanager
def checks_mode(mode):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLA_CORE_CHECKS", mode)
        yield


LAUNCHED: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def record_launches():
    """Every registered backend's ``run`` appends its name to LAUNCHED: nothing may run before an MLAInputError."""
    with pytest.MonkeyPatch.context() as mp:
        for backend in registry().backends.values():
            def spy(problem, call, config=None, _run=backend.run, _name=backend.name):
                LAUNCHED.append(_name)
                return _run(problem, call, config)
            mp.setattr(backend, "run", spy)
        yield


ARG_NAME = re.compile(r"^[a-z_][a-z0-9_]*(\[\d+\])?:")


def outcome(fn, kwargs, mode, runs_backend=True):
    """``fn(**kwargs)`` under checks ``mode``: its result, or None after a clean MLAInputError."""
    LAUNCHED.clear()
    with checks_mode(mode):
        try:
            result = fn(**kwargs)
        except MLAInputError as exc:
            event(f"refused: {str(exc).split(':')[0]}")
            assert ARG_NAME.match(str(exc)), f"the message does not start with the argument's name: {exc}"
            assert not LAUNCHED, f"MLAInputError after {LAUNCHED} ran: {exc}"
            return None
        except NoBackendError:
            event("no backend")
            # an explicit backend that does not declare this problem (e.g. triton at an odd width): a clear refusal
            assert not LAUNCHED
            return None
    assert LAUNCHED or not runs_backend, "a result came back without any backend running"
    event(f"ran ({mode})")
    return result


def tensors(result):
    if isinstance(result, torch.Tensor):
        return [result]
    return [t for t in result if isinstance(t, torch.Tensor)]


def assert_finite_state(out: torch.Tensor, lse: torch.Tensor | None, lse_rows):
    """out finite; lse not NaN / +inf, and -inf only where the matching output row is 0.

    ``lse_rows(out)`` maps out to the layout of lse minus the feature axis (e.g. decode [B, H, D] -> [B, H]).
    """
    o = out.float()
    assert not o.isnan().any(), "NaN in the output"
    assert o.isfinite().all(), "inf in the output"
    if lse is None:
        return
    assert not lse.isnan().any(), "NaN in the LSE"
    assert not (lse == math.inf).any(), "+inf in the LSE (mla_core gives an empty row -inf)"
    empty = lse == -math.inf
    if empty.any():
        assert (lse_rows(o.abs().amax(-1))[empty] == 0).all(), "a row with LSE -inf has a nonzero output"


def assert_same_numbers(got, want, what):
    for a, b in zip(tensors(got), tensors(want)):
        a, b = a.float(), b.float()
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and torch.equal(a.isnan(), b.isnan()), what


def assert_matches_reference(got, ref):
    dtype = accuracy.output_dtype(ref)
    err = accuracy.compare(got, ref)
    assert err <= accuracy.tolerance(dtype), f"rel-L2 {err:.3g} against the reference ({dtype})"


def check_reference(fn, kwargs, mode, check_state):
    """The reference backend: a clean refusal or a finite result; metadata checks never change the numbers."""
    result = outcome(fn, {**kwargs, "backend": "reference"}, mode)
    if result is None:
        return
    check_state(result)
    if mode == "metadata":
        full = outcome(fn, {**kwargs, "backend": "reference"}, "full")
        if full is not None:
            assert_same_numbers(result, full, "the checks mode changed the result")


def check_triton(fn, kwargs, mode, check_state):
    """triton: refuses exactly what the reference refuses, else a finite result equal to the reference's."""
    result = outcome(fn, {**kwargs, "backend": "triton"}, mode)
    ref = outcome(fn, {**kwargs, "backend": "reference"}, mode)
    if result is None:
        return
    assert ref is not None, "triton ran a call the reference refuses"
    check_state(result)
    assert_matches_reference(result, ref)


# MLA_CORE_FUZZ_NO_SHRINK=1 (the mutation runner): stop at the first failing example instead of minimizing it
PHASES = [p for p in Phase if p != Phase.shrink or not os.environ.get("MLA_CORE_FUZZ_NO_SHRINK")]


def fuzz(examples):
    return settings(max_examples=examples, deadline=None, derandomize=True, database=None, phases=PHASES,
                    suppress_health_check=list(HealthCheck), print_blob=False)
interpreter = pytest.mark.skipif(not INTERPRETED, reason="the CPU triton fuzz runs under TRITON_INTERPRET=1")


# ------------------------------------------------------------------------------------------------
# mla_decode


def mangle(draw, kwargs, names):
    """Occasionally replace one tensor argument by a wrong version of it (dtype, rank, stride, device)."""
    if not chance(draw, 6):
        return
    name = draw(st.sampled_from(names))
    x = kwargs[name]
    how = draw(st.sampled_from(["float64", "int8", "rank", "stride", "meta", "list"]))
    if how == "float64":
        kwargs[name] = x.double()
    elif how == "int8":
        kwargs[name] = x.to(torch.int8)
    elif how == "rank":
        kwargs[name] = x[None]
    elif how == "stride":
        wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype) if x.dim() else x
        kwargs[name] = wide[..., ::2] if x.dim() else x
    elif how == "meta":
        kwargs[name] = torch.empty(x.shape, dtype=x.dtype, device="meta")
    else:
        kwargs[name] = x.tolist()


@st.composite
def decode_kwargs(draw, triton=False):
    bad = 1 if triton else 4  # % of bad values per argument (the triton draws spend their time in kernels)
    # many heads: more rows in which a later tile's maximum is below an earlier one's, where the split schedule
    # changes quantized P (the interpreter runs 16 heads per program whatever the count, so 16 costs as 1)
    heads = draw(st.sampled_from([1, 3, 8, 16] if triton else [1, 2, 3, 16]))
    rank, rope = draw(st.sampled_from([16, 32])), draw(st.sampled_from([0, 16]))
    page = draw(st.sampled_from([4, 16] if triton else [1, 4, 16]))
    batch = draw(st.integers(0, 2 if triton else 3))
    splits = draw(st.sampled_from([1, 2, 2, 3, 4] if triton else [1, 2, 3, 32, 128, "auto"]))
    tile_limit = 40 if triton else 70
    if isinstance(splits, int) and splits <= 4 and batch:
        first = [draw(mst.split_lengths(splits, limit=70))]  # one request at a split-schedule edge
    else:
        first = []
    rest = mst.split_lengths(splits, limit=100) if triton and first else mst.lengths([32, page], limit=tile_limit)
    lens = first + draw(st.lists(rest, min_size=batch - len(first), max_size=batch - len(first)))
    dtype = draw(st.sampled_from(FLOATS))
    q_dtype = draw(st.sampled_from([None, None, torch.float32]))
    q, cache, table, seq = paged_decode_inputs(lens, heads, rank + rope, page, dtype=dtype, q_dtype=q_dtype,
                                               seed=draw(st.integers(0, 3)))
    pages_each = [-(-n // page) for n in lens]
    # the table as wide as the longest request needs, one spare column, or one short (a length past capacity)
    width = max(pages_each + [0]) + draw(st.sampled_from([0, 1, 1, -1] if batch else [0, 1]))
    table = table[:, :max(width, 0)].contiguous()
    if batch and chance(draw, 15):  # a page index a length reaches is out of range
        b = draw(st.integers(0, batch - 1))
        if 0 < pages_each[b] <= table.shape[1]:
            table[b, draw(st.integers(0, pages_each[b] - 1))] = draw(st.sampled_from(BAD_INDEX + [cache.shape[0]]))
    if batch and chance(draw, 10):  # a length out of range (int64: past 2**31 too)
        seq = seq.long()
        seq[draw(st.integers(0, batch - 1))] = draw(st.sampled_from([-1, 2 ** 31, 2 ** 32 + 16, 2 ** 62]))
        # clamped to the table's capacity, such a length reaches the NaN poison past the real length: those rows
        # now hold keys (finite garbage), so a NaN output would be right (backends differ on NaN keys)
        cache = cache.nan_to_num(nan=0.5)
    elif draw(st.booleans()):
        seq, table = seq.long(), table.long()
    quant = {}
    for name in ("k_qdq", "v_qdq", "p_qdq"):
        # quantized P makes the split schedule visible (an unquantized split merges exactly)
        formats = [None, "fp8", "nvfp4", "nvfp4"] if triton and name == "p_qdq" else [None, None, "fp8", "nvfp4"]
        fmt = sometimes(draw, formats, ["int4", "FP8", 1], bad)
        if fmt is not None:
            quant[name] = fmt
            # P's amax: 1.0 (its bound), or larger: a coarse absolute grid for the small P of rescaled tiles
            quant[f"{name}_amax"] = sometimes(draw, [1.0, 1.0, 16.0, 448.0] if name == "p_qdq" else GOOD_AMAX,
                                              BAD_SCALARS + [None], bad)
    kwargs = dict(q=q, latent_cache=cache, block_table=table, b_seq_len=seq,
                  softmax_scale=sometimes(draw, GOOD_SCALES, BAD_SCALARS + [None], bad), kv_lora_rank=rank,
                  qk_rope_head_dim=rope, num_kv_splits=sometimes(draw, [splits], [0, 129, 2.0, True, "2"], bad),
                  return_lse=sometimes(draw, [True, False], [1, None], bad),
                  out_dtype=sometimes(draw, [None, None, torch.float32, torch.bfloat16], [torch.int32, "float32"], bad),
                  **quant)
    if chance(draw, 2 * bad):
        kwargs["page_size"] = draw(st.sampled_from([page, 2 * page, 0, float(page)]))
    if chance(draw, bad):
        kwargs["kv_lora_rank"] = draw(st.sampled_from([0, rank + 1, -16, 16.0]))
    if not triton:
        mangle(draw, kwargs, ["q", "latent_cache", "block_table", "b_seq_len"])
    return kwargs


def decode_state(result):
    out, lse = result
    assert out.dim() == 3 and (lse is None or tuple(lse.shape) == tuple(out.shape[:2]))
    assert_finite_state(out, lse, lambda rows: rows)


@given(kwargs=decode_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_decode_fuzz(kwargs, mode):
    check_reference(mla_core.mla_decode, kwargs, mode, decode_state)


def issue_decode_split_example():
    """Lengths [64, 96], 2 splits, quantized P: a tile count off by one at a multiple of 32 moves the split
    bounds (one split instead of two for 64 keys: 0.7 % rel-L2 here)."""
    q, cache, table, seq = paged_decode_inputs([64, 96], 16, 48, 16, dtype=torch.float32, seed=1)
    return dict(q=q, latent_cache=cache, block_table=table, b_seq_len=seq, softmax_scale=0.3, kv_lora_rank=32,
                qk_rope_head_dim=16, num_kv_splits=2, p_qdq="fp8", p_qdq_amax=448.0, return_lse=True)


def p_rounding_example():
    """A bf16 cache with a float32 output: unquantized P enters P·V rounded to bf16 (V's dtype); leaving that
    rounding out moves the output by 8e-4 rel-L2 here, which only the float32 output's tolerance (1e-5) sees."""
    q, cache, table, seq = paged_decode_inputs([40, 7], 16, 48, 16, dtype=torch.bfloat16, seed=2)
    return dict(q=q, latent_cache=cache, block_table=table, b_seq_len=seq, softmax_scale=0.3, kv_lora_rank=32,
                qk_rope_head_dim=16, num_kv_splits=1, out_dtype=torch.float32, return_lse=True)


@interpreter
@given(kwargs=decode_kwargs(triton=True), mode=checks_modes)
@example(kwargs=issue_decode_split_example(), mode="full")  # an issue-13 bug that once passed every test
@example(kwargs=p_rounding_example(), mode="full")
@fuzz(TRITON_EXAMPLES["decode"])
def test_decode_fuzz_triton(kwargs, mode):
    check_triton(mla_core.mla_decode, kwargs, mode, decode_state)


# ------------------------------------------------------------------------------------------------
# mla_prefill


@st.composite
def prefill_kwargs(draw, triton=False):
    kv_heads = draw(st.sampled_from([1, 2]))
    heads = kv_heads * draw(st.sampled_from([1, 2]))
    qk_dim, v_dim = draw(st.sampled_from([(24, 16), (16, 8)]))
    block_m, block_n = draw(st.sampled_from([16, 32, 64])), draw(st.sampled_from([16, 32, 64]))
    batch = draw(st.integers(0, 2 if triton else 3))
    limit = 40 if triton else 70
    causal = sometimes(draw, [True, False], [1, "yes"])
    lens = []
    for _ in range(batch):
        # a causal query tile ending on a key-tile edge, for the caller's block_m and the CPU configs' BLOCK_M
        # (the interpreter runs triton's first config, BLOCK_M 32; 16 is its second)
        pairs = sorted({p for bm in {block_m, 32, 16} for p in shapes.causal_boundary_pairs(bm, block_n, limit=limit)})
        if pairs and draw(st.booleans()):
            lens.append(draw(st.sampled_from(pairs)))
        else:
            lens.append((draw(mst.lengths([block_m, block_n], limit=limit)),
                         draw(mst.lengths([block_n], limit=limit))))
    q_lens, k_lens = [a for a, _ in lens], [b for _, b in lens]
    dtype = draw(st.sampled_from(FLOATS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 3)))
    tq, tk = sum(q_lens), sum(k_lens)
    q = torch.randn(tq, heads, qk_dim, generator=g).to(dtype)
    k = torch.randn(tk, kv_heads, qk_dim, generator=g).to(dtype)
    v = torch.randn(tk, kv_heads, v_dim, generator=g).to(dtype)
    if chance(draw, 20):  # keys in equal pairs: tied scores inside every N:M group (the tie-break decides)
        k[1::2] = k[0::2][:tk // 2]
    cu_q = torch.tensor([0] + torch.tensor(q_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    cu_k = torch.tensor([0] + torch.tensor(k_lens, dtype=torch.int64).cumsum(0).tolist(), dtype=torch.int32)
    if tk and chance(draw, 10):  # k / v shorter than cu_seqlens_k says (issue 7: kernels clamp)
        cut = draw(st.integers(1, tk))
        k, v = k[:tk - cut].contiguous(), v[:tk - cut].contiguous()
    if batch and chance(draw, 6):  # a corrupt cumulative entry
        which = draw(st.sampled_from(["q", "k"]))
        cu = (cu_q if which == "q" else cu_k).long()
        cu[draw(st.integers(1, batch))] = draw(st.sampled_from([-1, 2 ** 31, 2 ** 40]))
        cu_q, cu_k = (cu, cu_k) if which == "q" else (cu_q, cu)
    max_q = max(q_lens + [0])
    quant = {}
    for name, amax in (("q_quant", "q_amax"), ("k_quant", "k_amax"), ("p_quant", "p_amax"), ("v_quant", "v_amax")):
        fmt = sometimes(draw, [None, None, "fp8", "nvfp4"], ["int8", "nvfp8"])
        if fmt is not None:
            quant[name] = fmt
            quant[amax] = sometimes(draw, [1.0] if name == "p_quant" else GOOD_AMAX, BAD_SCALARS)
    n, m = sometimes(draw, [(0, 4), (0, 4), (2, 4), (1, 4), (4, 8), (3, 8)], [(5, 4), (-1, 4), (2, 5), (2, 4.0),
                                                                                (2, True)])
    kwargs = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                  max_seqlen_q=sometimes(draw, [max_q], [max(0, max_q - 1) if max_q else -1, -1, 2 ** 62,
                                                         float(max_q)]),
                  softmax_scale=sometimes(draw, [None] + GOOD_SCALES, BAD_SCALARS), causal=causal,
                  return_lse=sometimes(draw, [True, False], [1]), sparsity_n=n, sparsity_m=m,
                  dense_sink_tokens=sometimes(draw, [0, 1, 3], [-1, 1.0, 2 ** 40]),
                  dense_recent_tokens=sometimes(draw, [0, 2, 64], [-1, 2.5]),
                  block_m=sometimes(draw, [block_m], [24, 512, 0]), block_n=sometimes(draw, [block_n], [8, "64"]),
                  **quant)
    mangle(draw, kwargs, ["q", "k", "v", "cu_seqlens_q", "cu_seqlens_k"])
    return kwargs


def prefill_state(result):
    out, lse = result if isinstance(result, tuple) else (result, None)
    assert out.dim() == 3 and (lse is None or tuple(lse.shape) == (out.shape[1], out.shape[0]))
    assert_finite_state(out, lse, lambda rows: rows.t())


@given(kwargs=prefill_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_prefill_fuzz(kwargs, mode):
    check_reference(mla_core.mla_prefill, kwargs, mode, prefill_state)


def issue_prefill_examples():
    """The issue-13 prefill bugs that once passed every test: a causal query tile whose last key starts a key
    tile (len_q 64, len_k 65, block_n 16), and N:M ties (keys in equal pairs, 1 of every 4 kept)."""
    g = torch.Generator().manual_seed(5)
    causal = dict(q=torch.randn(64, 1, 16, generator=g), k=torch.randn(65, 1, 16, generator=g),
                  v=torch.randn(65, 1, 8, generator=g), cu_seqlens_q=torch.tensor([0, 64], dtype=torch.int32),
                  cu_seqlens_k=torch.tensor([0, 65], dtype=torch.int32), max_seqlen_q=64, block_n=16,
                  return_lse=True)
    k = torch.randn(24, 1, 16, generator=g)
    k[1::2] = k[0::2]
    ties = dict(q=torch.randn(24, 1, 16, generator=g), k=k, v=torch.randn(24, 1, 8, generator=g),
                cu_seqlens_q=torch.tensor([0, 24], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 24], dtype=torch.int32), max_seqlen_q=24, block_n=16,
                sparsity_n=1, sparsity_m=4, dense_recent_tokens=0)
    return causal, ties


@interpreter
@given(kwargs=prefill_kwargs(triton=True), mode=checks_modes)
@example(kwargs=issue_prefill_examples()[0], mode="full")
@example(kwargs=issue_prefill_examples()[1], mode="metadata")
@fuzz(TRITON_EXAMPLES["prefill"])
def test_prefill_fuzz_triton(kwargs, mode):
    check_triton(mla_core.mla_prefill, kwargs, mode, prefill_state)


# ------------------------------------------------------------------------------------------------
# merge_attn_states

# |LSE| ~ 1e4: the merge must weigh relative to the larger LSE, not to the float32-rounded lse (found here)
LSE_VALUES = [-math.inf, math.inf, 0.0, -80.0, 80.0, 1e4, -1e4]


@st.composite
def merge_kwargs(draw):
    tokens = draw(mst.lengths([4, 16], limit=17))
    heads, dim = draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 8, 40]))
    dtype = draw(st.sampled_from(FLOATS))
    g = torch.Generator().manual_seed(draw(st.integers(0, 3)))
    pre, suf = (torch.randn(tokens, heads, dim, generator=g).to(dtype) for _ in range(2))
    lses = []
    for _ in range(2):
        lse = torch.randn(heads, tokens, generator=g) * 3
        if tokens and draw(st.booleans()):  # special values at random places (empty rows: -inf or +inf)
            mask = torch.rand(heads, tokens, generator=g) < 0.4
            lse[mask] = draw(st.sampled_from(LSE_VALUES))
        lses.append(lse)
    kwargs = dict(prefix_output=pre, prefix_lse=lses[0], suffix_output=suf, suffix_lse=lses[1])
    buf = draw(st.sampled_from([None, "same", torch.float32, "bad"]))
    if buf == "bad":
        kwargs["output"] = torch.empty(tokens, heads, dim + 1)
    elif buf is not None:
        kwargs["output"] = torch.full((tokens, heads, dim), math.nan, dtype=dtype if buf == "same" else buf)
    if draw(st.booleans()):
        kwargs["output_lse"] = torch.full((heads, tokens), math.nan)
    mangle(draw, kwargs, ["prefix_output", "prefix_lse", "suffix_output", "suffix_lse"])
    return kwargs


def merge_state(result):
    out, lse = result
    assert_finite_state(out, lse, lambda rows: rows.t())


@given(kwargs=merge_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_merge_fuzz(kwargs, mode):
    check_reference(mla_core.merge_attn_states, kwargs, mode, merge_state)


def empty_states_example():
    """Empty rows in both conventions on both sides (-inf, and +inf as FlashAttention / FlashMLA / vLLM write
    them), beside ordinary rows: the derandomized draws stopped reaching a +inf suffix once (mutant fuzz#4)."""
    g = torch.Generator().manual_seed(5)
    pre, suf = torch.randn(6, 2, 8, generator=g), torch.randn(6, 2, 8, generator=g)
    a, b = torch.randn(2, 6, generator=g) * 3, torch.randn(2, 6, generator=g) * 3
    a[:, 0], b[:, 1] = math.inf, math.inf
    a[:, 2], b[:, 3] = -math.inf, -math.inf
    a[:, 4], b[:, 4] = math.inf, -math.inf
    return dict(prefix_output=pre, prefix_lse=a, suffix_output=suf, suffix_lse=b)


@interpreter
@given(kwargs=merge_kwargs(), mode=checks_modes)
@example(kwargs=empty_states_example(), mode="full")
@fuzz(TRITON_EXAMPLES["merge"])
def test_merge_fuzz_triton(kwargs, mode):
    check_triton(mla_core.merge_attn_states, kwargs, mode, merge_state)


# ------------------------------------------------------------------------------------------------
# mla_rope_quantize_fp8 (reference)


@st.composite
def rope_kwargs(draw):
    nnz = draw(mst.lengths([4], limit=9))
    heads, rope, nope = draw(st.sampled_from([1, 3])), draw(st.sampled_from([2, 8])), draw(st.sampled_from([1, 16]))
    dtype = sometimes(draw, [torch.bfloat16, torch.float16], [torch.float32])
    max_pos = draw(st.sampled_from([1, 5, 12]))
    g = torch.Generator().manual_seed(draw(st.integers(0, 3)))
    scale = draw(st.sampled_from([1.0, 1.0, 100.0]))  # 100: values past 448 after scaling saturate
    kwargs = dict(q_rope=(torch.randn(nnz, heads, rope, generator=g) * scale).to(dtype),
                  k_rope=(torch.randn(nnz, rope, generator=g) * scale).to(dtype),
                  q_nope=(torch.randn(nnz, heads, nope, generator=g) * scale).to(dtype),
                  k_nope=(torch.randn(nnz, nope, generator=g) * scale).to(dtype),
                  cos_sin_cache=torch.rand(max_pos, rope, generator=g).to(draw(st.sampled_from([torch.float32,
                                                                                                torch.bfloat16]))),
                  pos_ids=torch.randint(0, max_pos, (nnz,), generator=g).to(draw(st.sampled_from([torch.int32,
                                                                                                  torch.int64]))))
    if nnz and chance(draw, 15):  # a position outside the cos/sin table
        kwargs["pos_ids"] = kwargs["pos_ids"].long()
        kwargs["pos_ids"][draw(st.integers(0, nnz - 1))] = draw(st.sampled_from([-1, max_pos, 10 ** 6, -2 ** 31,
                                                                                 2 ** 40]))
    kwargs["is_neox"] = sometimes(draw, [True, False], [1, None])
    kwargs["quant_scale_q"] = sometimes(draw, [1.0, 0.5, 3.0, 1e-30], BAD_SCALARS)
    kwargs["quant_scale_kv"] = sometimes(draw, [1.0, 0.5, 3.0, 1e-30], BAD_SCALARS)
    for name, like in (("q_rope_out", "q_rope"), ("k_rope_out", "k_rope"), ("q_nope_out", "q_nope"),
                       ("k_nope_out", "k_nope")):
        if chance(draw, 30):  # a NaN-poisoned FP8 buffer (0x7f is E4M3's NaN)
            kwargs[name] = torch.full(kwargs[like].shape, 0x7F, dtype=torch.uint8).view(FP8)
    mangle(draw, kwargs, ["q_rope", "k_rope", "q_nope", "k_nope", "cos_sin_cache", "pos_ids"])
    return kwargs


def rope_state(result):
    for t in result:
        assert t.dtype == FP8 and not t.float().isnan().any(), "NaN (or an unwritten element) in an FP8 output"


@given(kwargs=rope_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_rope_quantize_fuzz(kwargs, mode):
    check_reference(mla_core.mla_rope_quantize_fp8, kwargs, mode, rope_state)


# ------------------------------------------------------------------------------------------------
# sparse_mla_fp8_decode and get_sparse_decode_metadata (reference)


# bmm1_scale / bmm2_scale are held to float32's range like every other scalar (1e39 once became inf: found here)
BAD_BMM_SCALES = BAD_SCALARS


@st.composite
def sparse_kwargs(draw):
    batch, q_len, heads = draw(st.integers(0, 2)), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2]))
    top_k, pages, page = draw(st.sampled_from([64, 64, 128])), draw(st.integers(1, 3)), 16
    rows = pages * page
    g = torch.Generator().manual_seed(draw(st.integers(0, 3)))
    query = torch.randn(batch, q_len, heads, 576, generator=g).to(FP8)
    cache = torch.randn(pages, page, 576, generator=g).to(FP8)
    idx = torch.randint(0, rows, (batch, q_len, top_k), generator=g, dtype=torch.int32)
    idx[torch.rand(idx.shape, generator=g) < 0.2] = -1
    lens = [draw(mst.lengths([64, 16], limit=top_k)) for _ in range(batch)]
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    for b, n in enumerate(lens):  # garbage past each length: never read
        idx[b, :, n:] = rows + 1000
    if batch and chance(draw, 15):  # a slot within the length past the cache or negative
        b = draw(st.integers(0, batch - 1))
        if lens[b]:
            idx[b, 0, draw(st.integers(0, lens[b] - 1))] = draw(st.sampled_from([rows, rows + 5, 2 ** 31 - 1, -2]))
    if batch and chance(draw, 8):
        seq_lens[draw(st.integers(0, batch - 1))] = draw(st.sampled_from([-1, top_k + 1, 2 ** 31 - 1]))
    kwargs = dict(query=query, kv_cache=cache, workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512,
                  qk_rope_head_dim=64, block_tables=idx,
                  seq_lens=None if chance(draw, 10) else seq_lens, max_seq_len=rows,
                  sparse_mla_top_k=sometimes(draw, [top_k], [0, 100, 64.0, True]),
                  bmm1_scale=sometimes(draw, [576 ** -0.5, 1.0, 1e-30], BAD_BMM_SCALES + [torch.tensor([1.0, 2.0])]),
                  bmm2_scale=sometimes(draw, [1.0, 0.5], BAD_BMM_SCALES),
                  return_lse=sometimes(draw, [True, False], [1]))
    if chance(draw, 25):
        kwargs["out"] = torch.full((batch, q_len, heads, 512), math.nan, dtype=torch.bfloat16)
    if chance(draw, 25):
        kwargs["lse"] = torch.full(draw(st.sampled_from([(batch * q_len, heads), (batch, q_len, heads)])), math.nan)
    meta = draw(st.sampled_from([None, None, "fresh", "stale"]))
    if meta is not None and kwargs["seq_lens"] is not None and lens:
        built = seq_lens if meta == "fresh" else (seq_lens + 1).clamp(0, top_k) * 0
        if meta == "fresh" or not torch.equal(built.clamp(0, top_k), seq_lens.clamp(0, top_k)):
            kwargs["metadata"] = mla_core.get_sparse_decode_metadata(query, built.clamp(0, top_k), top_k)
    mangle(draw, kwargs, ["query", "kv_cache", "block_tables"])
    return kwargs


def sparse_state(result):
    out, lse = result if isinstance(result, tuple) else (result, None)
    assert out.dtype == torch.bfloat16 and out.dim() == 4
    if lse is not None:
        lse = lse.view(out.shape[:3])
    assert_finite_state(out, lse, lambda rows: rows)


@given(kwargs=sparse_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_sparse_decode_fuzz(kwargs, mode):
    check_reference(mla_core.sparse_mla_fp8_decode, kwargs, mode, sparse_state)


@st.composite
def metadata_kwargs(draw):
    batch = draw(st.integers(0, 3))
    query = torch.zeros(batch, draw(st.sampled_from([1, 2])), 2, sometimes(draw, [576], [512, 656]),
                        dtype=sometimes(draw, [FP8, torch.bfloat16], [torch.float32]))
    top_k = sometimes(draw, [64, 128, 2048], [0, 65, -64, 64.0, True])
    lens = draw(st.lists(st.one_of(st.sampled_from([0, 1, 63, 64, 65, 128]), st.integers(-2, 3000)),
                         min_size=batch, max_size=batch))
    seq_lens = torch.tensor(lens, dtype=sometimes(draw, [torch.int32], [torch.int64]))
    return dict(query=query, seq_lens=None if chance(draw, 15) else seq_lens, sparse_mla_top_k=top_k)


@given(kwargs=metadata_kwargs(), mode=checks_modes)
@fuzz(REF_EXAMPLES)
def test_sparse_metadata_fuzz(kwargs, mode):
    meta = outcome(mla_core.get_sparse_decode_metadata, kwargs, mode, runs_backend=False)
    if meta is None:
        return
    top_k, lens = kwargs["sparse_mla_top_k"], kwargs["seq_lens"]
    want = [top_k] * kwargs["query"].shape[0] if lens is None else lens.clamp(0, top_k).tolist()
    assert meta.valid_lens.dtype == torch.int32 and meta.valid_lens.tolist() == want
