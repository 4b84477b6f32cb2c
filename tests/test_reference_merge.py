"""Reference merge_attn_states against independent float64 math (tests/reference_math.py)."""
from __future__ import annotations

import pathlib
import sys

import pytest
import torch

import mla_core

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference_math import merge_math, rel_l2, same_lse  # noqa: E402

NEG_INF = float("-inf")


def make_states(tokens, heads, dim, dtype=torch.float32, seed=0):
    """Two random partial states; some LSEs -inf on one side, some on both (those rows' outputs are 0)."""
    g = torch.Generator().manual_seed(seed)
    po = torch.randn(tokens, heads, dim, generator=g)
    so = torch.randn(tokens, heads, dim, generator=g)
    pl = torch.randn(heads, tokens, generator=g) * 3
    sl = torch.randn(heads, tokens, generator=g) * 3
    pl[0, 1], sl[1, 2] = NEG_INF, NEG_INF
    pl[:, 3], sl[:, 3] = NEG_INF, NEG_INF
    po[1, 0] = 0.0
    so[2, 1] = 0.0
    po[3], so[3] = 0.0, 0.0
    return po.to(dtype), pl, so.to(dtype), sl


@pytest.mark.parametrize("tokens, heads, dim", [(5, 2, 8), (64, 128, 512)])
def test_matches_float64(tokens, heads, dim):
    po, pl, so, sl = make_states(tokens, heads, dim, seed=tokens)
    out, lse = mla_core.merge_attn_states(po, pl, so, sl, backend="reference")
    ref_out, ref_lse = merge_math(po, pl, so, sl)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert rel_l2(out, ref_out) < 1e-5
    assert same_lse(lse, ref_lse, 1e-5)
    assert torch.all(out[3] == 0) and torch.all(lse[:, 3] == NEG_INF)
    # a side at -inf contributes nothing
    assert torch.allclose(out[1, 0], so[1, 0]) and torch.allclose(out[2, 1], po[2, 1])


def test_writes_given_buffers():
    po, pl, so, sl = make_states(6, 4, 16, seed=1)
    output = torch.full_like(po, float("nan"))
    output_lse = torch.full_like(pl, float("nan"))
    out, lse = mla_core.merge_attn_states(po, pl, so, sl, output, output_lse, backend="reference")
    assert out is output and lse is output_lse
    ref_out, ref_lse = merge_math(po, pl, so, sl)
    assert rel_l2(out, ref_out) < 1e-5
    assert same_lse(lse, ref_lse, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_outputs(dtype):
    po, pl, so, sl = make_states(8, 4, 32, dtype=dtype, seed=2)
    out, lse = mla_core.merge_attn_states(po, pl, so, sl, backend="reference")
    ref_out, ref_lse = merge_math(po, pl, so, sl)
    assert out.dtype == dtype
    assert rel_l2(out, ref_out) < 1e-2
    assert same_lse(lse, ref_lse, 1e-5)
    # a float32 buffer keeps the float32 result of the half inputs
    output = torch.full(po.shape, float("nan"))
    out32, _ = mla_core.merge_attn_states(po, pl, so, sl, output, backend="reference")
    assert out32.dtype == torch.float32 and rel_l2(out32, ref_out) < 1e-5


def test_plus_inf_lse_is_an_empty_state():
    """FlashAttention / FlashMLA / vLLM give an empty row LSE +inf; the merge reads it as empty (vLLM's rule)."""
    po, pl, so, sl = make_states(6, 3, 16, seed=3)
    pl[1, 4], sl[2, 5] = float("inf"), float("inf")
    pl[:, 0], sl[:, 0] = float("inf"), float("inf")
    out, lse = mla_core.merge_attn_states(po, pl, so, sl, backend="reference")
    ref_out, ref_lse = merge_math(po, pl, so, sl)
    assert rel_l2(out, ref_out) < 1e-5 and same_lse(lse, ref_lse, 1e-5)
    assert torch.equal(out[4, 1], so[4, 1]) and lse[1, 4] == sl[1, 4]
    assert torch.equal(out[5, 2], po[5, 2]) and lse[2, 5] == pl[2, 5]
    assert torch.all(out[0] == 0) and torch.all(lse[:, 0] == NEG_INF)
