"""Reference prefill against independent float64 math (tests/reference_math.py), through the public API."""
from __future__ import annotations

import pathlib
import sys

import pytest
import torch

import mla_core

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference_math import prefill_math, rel_l2, same_lse  # noqa: E402

FP32_TOL = 1e-5
NEG_INF = float("-inf")
# (len_q, len_k) per sequence: empty query, empty keys with queries, q shorter than k, q longer than k
# (causal rows with no visible key), a single query, lengths off the tile grid.
VARLEN = [(5, 5), (0, 7), (3, 0), (4, 70), (10, 4), (1, 33), (37, 37)]


def make_prefill_inputs(seqs, heads, kv_heads, qk_dim, v_dim, dtype=torch.float32, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, heads, qk_dim, generator=g).to(dtype)
    k = torch.randn(total_k, kv_heads, qk_dim, generator=g).to(dtype)
    v = torch.randn(total_k, kv_heads, v_dim, generator=g).to(dtype)
    cu_q = torch.tensor([0] + [sum(s[0] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(s[1] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    max_q = max(s[0] for s in seqs)
    return [t.to(device) for t in (q, k, v, cu_q, cu_k)] + [max_q]


MATH_KEYS = ("q_quant", "k_quant", "p_quant", "v_quant", "q_amax", "k_amax", "p_amax", "v_amax", "sparsity_n",
             "sparsity_m", "dense_sink_tokens", "dense_recent_tokens", "block_n")


def run_both(inputs, causal=True, softmax_scale=None, **kw):
    """The reference's (out, lse) and the float64 math's, for the same arguments."""
    q, k, v, cu_q, cu_k, max_q = inputs
    scale = softmax_scale or q.shape[2] ** -0.5
    out, lse = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, softmax_scale=scale, causal=causal, return_lse=True,
                                    backend="reference", **kw)
    ref = prefill_math(q.cpu(), k.cpu(), v.cpu(), cu_q.cpu(), cu_k.cpu(), softmax_scale=scale, causal=causal,
                       **{n: x for n, x in kw.items() if n in MATH_KEYS})
    return (out, lse), ref


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_heads", [4, 2, 1], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("block_n", [16, 64])
def test_fp32_varlen(causal, kv_heads, block_n):
    inputs = make_prefill_inputs(VARLEN, 4, kv_heads, 24, 8, seed=kv_heads + block_n)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, causal=causal, block_n=block_n)
    assert out.shape == (sum(s[0] for s in VARLEN), 4, 8) and out.dtype == torch.float32
    assert lse.shape == (4, out.shape[0]) and lse.dtype == torch.float32
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)


def test_rows_with_no_visible_key():
    inputs = make_prefill_inputs([(10, 4), (3, 0)], 2, 2, 16, 8, seed=3)
    (out, lse), _ = run_both(inputs, causal=True)
    # sequence 0: query i sees keys j <= i - 6, so rows 0..5 see none; sequence 1 has no keys
    empty = list(range(6)) + [10, 11, 12]
    assert torch.all(out[empty] == 0) and torch.all(lse[:, empty] == NEG_INF)
    assert torch.all(torch.isfinite(lse[:, 6:10]))


@pytest.mark.parametrize("heads", [16, 128])
def test_deepseek_sizes(heads):
    """MLA prefill widths: q/k 192 (128 NOPE + 64 RoPE), v 128; kept short for CPU time."""
    seqs = [(9, 9), (4, 20)] if heads == 128 else [(17, 17), (6, 80)]
    inputs = make_prefill_inputs(seqs, heads, heads, 192, 128, seed=heads)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, causal=True, q_quant="nvfp4", k_quant="nvfp4", block_n=16)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)


QUANT_CASES = [
    dict(q_quant="fp8"),
    dict(q_quant="nvfp4", q_amax=4.0),
    dict(k_quant="fp8", k_amax=4.0),
    dict(k_quant="nvfp4"),
    dict(p_quant="fp8"),
    dict(p_quant="nvfp4"),
    dict(p_quant="nvfp4", p_amax=0.5),
    dict(v_quant="fp8"),
    dict(v_quant="nvfp4", v_amax=4.0),
    dict(q_quant="fp8", k_quant="fp8", p_quant="fp8", v_quant="fp8"),
    dict(q_quant="nvfp4", k_quant="nvfp4", p_quant="nvfp4", v_quant="nvfp4"),
    dict(q_quant="nvfp4", k_quant="fp8", p_quant="nvfp4", v_quant="fp8", k_amax=4.0),
]


@pytest.mark.parametrize("kw", QUANT_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_quant_formats_near_quantized_far_from_plain(kw):
    inputs = make_prefill_inputs([(20, 50), (0, 3), (33, 33)], 4, 2, 32, 16, seed=7)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, causal=True, block_n=32, **kw)
    (_, _), (plain_out, _) = run_both(inputs, causal=True, block_n=32)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)
    assert rel_l2(out, plain_out) > 1e-3


def test_block_n_is_the_p_tile():
    """With P quantized, the running max per block_n tile decides P's rounding."""
    inputs = make_prefill_inputs([(40, 200)], 2, 2, 16, 8, seed=9)
    outs = {}
    for block_n in (16, 128):
        (out, _), (ref_out, _) = run_both(inputs, causal=True, p_quant="nvfp4", block_n=block_n)
        assert rel_l2(out, ref_out) < FP32_TOL
        outs[block_n] = out
    assert rel_l2(outs[16], outs[128]) > 1e-3
    # block_m is speed only
    (out_m, _), _ = run_both(inputs, causal=True, p_quant="nvfp4", block_n=16, block_m=16)
    assert torch.equal(out_m, outs[16])


SPARSE_CASES = [
    dict(sparsity_n=2, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=0),
    dict(sparsity_n=1, sparsity_m=4, dense_sink_tokens=4, dense_recent_tokens=8),
    dict(sparsity_n=2, sparsity_m=8, dense_sink_tokens=3, dense_recent_tokens=5),
    dict(sparsity_n=5, sparsity_m=8, dense_sink_tokens=0, dense_recent_tokens=16),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kw", SPARSE_CASES, ids=lambda kw: "{sparsity_n}of{sparsity_m}-s{dense_sink_tokens}"
                         "-r{dense_recent_tokens}".format(**kw))
def test_nm_sparsity(kw, causal):
    # (1, 30): a single query keeps every score dense
    inputs = make_prefill_inputs([(20, 45), (1, 30), (13, 13)], 4, 2, 16, 8, seed=13)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, causal=causal, block_n=16, **kw)
    (dense_out, _), _ = run_both(inputs, causal=causal, block_n=16)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)
    assert rel_l2(out, dense_out) > 1e-2
    assert rel_l2(out[20:21], dense_out[20:21]) < FP32_TOL


def test_nm_sparsity_with_quantization():
    kw = dict(sparsity_n=2, sparsity_m=4, dense_sink_tokens=2, dense_recent_tokens=4, q_quant="nvfp4",
              k_quant="nvfp4", p_quant="nvfp4", v_quant="nvfp4", block_n=16)
    inputs = make_prefill_inputs([(24, 40)], 4, 4, 32, 8, seed=15)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, **kw)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)


def test_nm_ties_keep_the_lower_index():
    """Identical keys tie: the N earliest of each group are the ones kept."""
    q, k, v, cu_q, cu_k, max_q = make_prefill_inputs([(3, 16)], 1, 1, 8, 8, seed=17)
    k = k[0:1].expand(16, 1, 8).contiguous()  # every score of a row is equal
    kw = dict(sparsity_n=1, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=0)
    out = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, causal=False, backend="reference", **kw)
    expected = v[0::4].mean(dim=0)  # keys 0, 4, 8, 12 with equal weight
    assert rel_l2(out, expected.expand(3, 1, 8)) < FP32_TOL


def test_n_equal_m_keeps_everything():
    inputs = make_prefill_inputs([(12, 30)], 2, 2, 16, 8, seed=19)
    (out, _), _ = run_both(inputs, sparsity_n=4, sparsity_m=4, dense_recent_tokens=0)
    (dense, _), _ = run_both(inputs)
    assert torch.equal(out, dense)


def test_two_chunk_prefill_merges_to_one_shot():
    """Context chunk (causal=False) + new chunk (causal=True), merged by LSE, equals one causal pass."""
    ctx, new, heads = [40, 0, 17], [9, 5, 1], 4
    g = torch.Generator().manual_seed(21)
    seqs_q = new
    total_ctx, total_new = sum(ctx), sum(new)
    q = torch.randn(total_new, heads, 24, generator=g)
    k_ctx, v_ctx = torch.randn(total_ctx, heads, 24, generator=g), torch.randn(total_ctx, heads, 16, generator=g)
    k_new, v_new = torch.randn(total_new, heads, 24, generator=g), torch.randn(total_new, heads, 16, generator=g)

    def cumulative(lengths):
        return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)

    # the full KV span of each sequence: its context, then its new tokens
    k_full, v_full, at_c, at_n = [], [], 0, 0
    for c, n in zip(ctx, new):
        k_full += [k_ctx[at_c:at_c + c], k_new[at_n:at_n + n]]
        v_full += [v_ctx[at_c:at_c + c], v_new[at_n:at_n + n]]
        at_c, at_n = at_c + c, at_n + n
    k_full, v_full = torch.cat(k_full), torch.cat(v_full)
    cu_q = cumulative(seqs_q)
    max_q = max(seqs_q)
    run = dict(return_lse=True, backend="reference")
    o_ctx, lse_ctx = mla_core.mla_prefill(q, k_ctx, v_ctx, cu_q, cumulative(ctx), max_q, causal=False, **run)
    o_new, lse_new = mla_core.mla_prefill(q, k_new, v_new, cu_q, cu_q, max_q, causal=True, **run)
    merged, merged_lse = mla_core.merge_attn_states(o_ctx, lse_ctx, o_new, lse_new, backend="reference")
    one_shot, one_lse = mla_core.mla_prefill(q, k_full, v_full, cu_q, cumulative([c + n for c, n in zip(ctx, new)]),
                                             max_q, causal=True, **run)
    assert rel_l2(merged, one_shot) < FP32_TOL
    assert same_lse(merged_lse, one_lse, FP32_TOL)
    # the sequence with no context: its context rows are empty (-inf) and the merge keeps the new chunk
    assert torch.all(lse_ctx[:, 9:14] == NEG_INF)


def test_return_lse_off_returns_the_output_only():
    q, k, v, cu_q, cu_k, max_q = make_prefill_inputs([(6, 6)], 2, 2, 16, 8, seed=23)
    out = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, backend="reference")
    assert isinstance(out, torch.Tensor) and out.shape == (6, 2, 8)
    ref_out, _ = prefill_math(q, k, v, cu_q, cu_k, softmax_scale=16 ** -0.5, causal=True)
    assert rel_l2(out, ref_out) < FP32_TOL


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs(dtype):
    """bf16 / fp16 q, k, v: output in v's dtype; P rounded to v's dtype in the math as in the reference."""
    inputs = make_prefill_inputs([(20, 50), (0, 4), (7, 7)], 4, 1, 32, 16, dtype=dtype, seed=25)
    kw = dict(q_quant="nvfp4", k_quant="nvfp4", p_quant="nvfp4", v_quant="nvfp4", block_n=16)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, **kw)
    assert out.dtype == dtype
    assert rel_l2(out, ref_out) < 1e-2
    assert same_lse(lse, ref_lse, 1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_p_rounded_to_v_dtype(dtype):
    """No P quant: P is rounded to v's dtype before P·V.

    The output is in v's dtype, so compare with the math rounded to it: the reference equals it but
    for rare rounding-boundary flips, and the math without P rounding is at least 10x farther.
    """
    inputs = make_prefill_inputs([(20, 50), (0, 4), (7, 7)], 4, 1, 32, 16, dtype=dtype, seed=25)
    (out, _), (ref_out, _) = run_both(inputs)
    q, k, v, cu_q, cu_k, _ = inputs
    unrounded, _ = prefill_math(q.float(), k.float(), v.float(), cu_q, cu_k, softmax_scale=32 ** -0.5, causal=True)
    near = rel_l2(out, ref_out.to(dtype))
    assert near < 1e-4
    assert rel_l2(out, unrounded.to(dtype)) > 10 * near


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_float64_math():
    inputs = make_prefill_inputs(VARLEN, 8, 2, 64, 32, seed=27, device="cuda")
    kw = dict(q_quant="nvfp4", k_quant="nvfp4", p_quant="nvfp4", v_quant="nvfp4", sparsity_n=2, sparsity_m=4,
              dense_sink_tokens=2, dense_recent_tokens=4, block_n=16)
    (out, lse), (ref_out, ref_lse) = run_both(inputs, **kw)
    assert out.is_cuda
    # float32 on the GPU may round P one step differently where it sits on a rounding boundary
    assert rel_l2(out.cpu(), ref_out) < 1e-4
    assert same_lse(lse.cpu(), ref_lse, 1e-4)
