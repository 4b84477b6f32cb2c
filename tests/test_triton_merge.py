"""Triton merge_attn_states against the reference backend (CPU interpreter; GPU with ``-m gpu``)."""
from __future__ import annotations

import os

import pytest
import torch

import mla_core

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu = pytest.mark.skipif(not INTERPRETED, reason="CPU variants run the Triton interpreter (TRITON_INTERPRET=1)")


def make(tokens, heads, dim, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    pre = torch.randn(tokens, heads, dim, generator=g).to(dtype)
    suf = torch.randn(tokens, heads, dim, generator=g).to(dtype)
    a = torch.randn(heads, tokens, generator=g) * 3
    b = torch.randn(heads, tokens, generator=g) * 3
    if tokens >= 3:
        a[:, 0] = float("-inf")                                   # prefix empty
        b[:, 1] = float("-inf")                                   # suffix empty
        a[:, 2] = b[:, 2] = float("-inf")                         # both empty: 0 and -inf
    return [t.to(device) for t in (pre, a, suf, b)]


def rel_l2(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check(tokens, heads, dim, dtype, out_dtype, device, tol):
    pre, a, suf, b = make(tokens, heads, dim, dtype, device)
    out = torch.full((tokens, heads, dim), float("nan"), dtype=out_dtype, device=device)
    out_lse = torch.full((heads, tokens), float("nan"), device=device)
    got, got_lse = mla_core.merge_attn_states(pre, a, suf, b, out, out_lse, backend="triton")
    assert got.data_ptr() == out.data_ptr() and got_lse.data_ptr() == out_lse.data_ptr()
    ref, ref_lse = mla_core.merge_attn_states(pre, a, suf, b, torch.empty_like(out), backend="reference")
    assert not torch.isnan(got).any() and not torch.isnan(got_lse).any()
    assert rel_l2(got, ref) < tol
    assert torch.equal(torch.isinf(got_lse), torch.isinf(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert torch.allclose(got_lse[fin], ref_lse[fin], rtol=1e-6, atol=1e-6)
    if tokens >= 3:
        assert (got[2] == 0).all()


@cpu
@pytest.mark.parametrize("dtype,out_dtype,tol", [(torch.float32, torch.float32, 1e-5),
                                                 (torch.float16, torch.float32, 1e-5),
                                                 (torch.float16, torch.float16, 1e-2),
                                                 (torch.bfloat16, torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("tokens,heads,dim", [(5, 3, 40), (17, 16, 128), (1, 1, 1)])
def test_merge_cpu(tokens, heads, dim, dtype, out_dtype, tol):
    check(tokens, heads, dim, dtype, out_dtype, "cpu", tol)


@cpu
def test_merge_allocates_and_strided_inputs_cpu():
    pre, a, suf, b = make(9, 8, 64, torch.float32, "cpu")
    wide = torch.randn(9, 16, 64)
    wide[:, ::2] = pre
    pre_view = wide[:, ::2]                                       # strided heads, contiguous last dim
    got, got_lse = mla_core.merge_attn_states(pre_view, a, suf, b, backend="triton")
    ref, ref_lse = mla_core.merge_attn_states(pre, a, suf, b, backend="reference")
    assert got.dtype == torch.float32 and rel_l2(got, ref) < 1e-5
    assert torch.equal(torch.isinf(got_lse), torch.isinf(ref_lse))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens,heads,dim", [(4096, 128, 128), (1000, 128, 512), (3, 16, 512)])
def test_merge_gpu(tokens, heads, dim, dtype):
    check(tokens, heads, dim, dtype, dtype, "cuda", 1e-5 if dtype == torch.float32 else 1e-2)
