"""Bad input to every public op: an ``MLAInputError`` (a ValueError) whose message starts with the argument's
name and says what it got and what it needs. Nothing reaches a kernel.

Each op has one valid set of arguments; a case replaces some of them. The "meta" device stands in for a
second device on this CPU-only machine.
"""
import math

import pytest
import torch

import mla_core
from mla_core import MLAInputError, specs

FP8 = torch.float8_e4m3fn
META = "meta"


def assert_bad(fn, kwargs, name):
    """``fn(**kwargs)`` raises MLAInputError for ``name`` with a got/needs message."""
    with pytest.raises(MLAInputError, match=f"^{name}:") as err:
        fn(**kwargs)
    msg = str(err.value)
    assert "got" in msg, msg
    assert "needs" in msg or (name == "backend" and "known:" in msg), msg
    return msg


def non_contiguous_last(x: torch.Tensor) -> torch.Tensor:
    """Same shape and dtype as x, last-dimension stride 2."""
    wide = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    return wide[..., ::2]


def on_meta(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=META)


def test_input_error_is_a_value_error():
    assert issubclass(MLAInputError, ValueError)


# ------------------------------------------------------------------------------------------------
# mla_decode: rank 32 + rope 8, 4 pages of 4 tokens; capacity 3 pages * 4 = 12 tokens per request


def decode_args():
    g = torch.Generator().manual_seed(0)
    return dict(q=torch.randn(2, 4, 40, generator=g).bfloat16(),
                latent_cache=torch.randn(5, 4, 40, generator=g).bfloat16(),
                block_table=torch.tensor([[0, 1, 2], [3, 4, 0]], dtype=torch.int32),
                b_seq_len=torch.tensor([9, 12], dtype=torch.int32),
                softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=8)


DECODE_CASES = [
    ("q", lambda a: dict(q=a["q"][0])),
    ("q", lambda a: dict(q=torch.randn(2, 4, 41).bfloat16())),
    ("q", lambda a: dict(q=a["q"].half())),
    ("q", lambda a: dict(q=a["q"].tolist())),
    ("q", lambda a: dict(q=non_contiguous_last(a["q"]))),
    ("q", lambda a: dict(q=torch.randn(2, 0, 40).bfloat16())),
    ("latent_cache", lambda a: dict(latent_cache=a["latent_cache"].to(torch.int8))),
    ("latent_cache", lambda a: dict(latent_cache=torch.randn(5, 4, 48).bfloat16())),
    ("latent_cache", lambda a: dict(latent_cache=a["latent_cache"][None])),
    ("latent_cache", lambda a: dict(latent_cache=non_contiguous_last(a["latent_cache"]))),
    ("block_table", lambda a: dict(block_table=a["block_table"].float())),
    ("block_table", lambda a: dict(block_table=torch.zeros(3, 3, dtype=torch.int32))),
    ("block_table", lambda a: dict(block_table=on_meta(a["block_table"]))),
    ("b_seq_len", lambda a: dict(b_seq_len=torch.tensor([9, 12, 1], dtype=torch.int32))),
    ("b_seq_len", lambda a: dict(b_seq_len=on_meta(a["b_seq_len"]))),
    ("b_seq_len", lambda a: dict(b_seq_len=a["b_seq_len"].float())),
    ("b_seq_len", lambda a: dict(b_seq_len=torch.tensor([-1, 12], dtype=torch.int32))),
    ("b_seq_len", lambda a: dict(b_seq_len=torch.tensor([9, 13], dtype=torch.int32))),
    ("block_table", lambda a: dict(block_table=torch.tensor([[0, 1, 5], [3, 4, 0]], dtype=torch.int32))),
    ("block_table", lambda a: dict(block_table=torch.tensor([[0, -1, 2], [3, 4, 0]], dtype=torch.int32))),
    ("page_size", lambda a: dict(page_size=8)),
    ("num_kv_splits", lambda a: dict(num_kv_splits=0)),
    ("num_kv_splits", lambda a: dict(num_kv_splits=129)),  # numerics.MAX_KV_SPLITS + 1
    ("num_kv_splits", lambda a: dict(num_kv_splits="fast")),
    ("num_kv_splits", lambda a: dict(num_kv_splits=4.0)),
    ("softmax_scale", lambda a: dict(softmax_scale=0.0)),
    ("softmax_scale", lambda a: dict(softmax_scale=math.nan)),
    ("softmax_scale", lambda a: dict(softmax_scale=None)),
    ("k_qdq", lambda a: dict(k_qdq="int4")),
    ("v_qdq", lambda a: dict(v_qdq="FP8")),
    ("p_qdq", lambda a: dict(p_qdq="mxfp4")),
    ("k_qdq_amax", lambda a: dict(k_qdq="fp8", k_qdq_amax=math.inf)),
    ("v_qdq_amax", lambda a: dict(v_qdq_amax=-2.0)),
    ("p_qdq_amax", lambda a: dict(p_qdq_amax=0.0)),
    ("p_qdq_amax", lambda a: dict(p_qdq_amax=None)),
    ("out_dtype", lambda a: dict(out_dtype=torch.int32)),
    ("kv_lora_rank", lambda a: dict(kv_lora_rank=0)),
    ("return_lse", lambda a: dict(return_lse="yes")),
    ("backend", lambda a: dict(backend="no-such-backend")),
    # int32 lengths: 2**32 + 64 used to wrap to 64 in the kernel
    ("b_seq_len", lambda a: dict(b_seq_len=torch.tensor([2 ** 32 + 64, 1]))),
    # scalars in float32's normal range (1e39 overflowed to inf -> NaN; 1e-46 and 1e-300 flushed to 0)
    ("softmax_scale", lambda a: dict(softmax_scale=1e39)),
    ("softmax_scale", lambda a: dict(softmax_scale=10 ** 400)),
    ("p_qdq_amax", lambda a: dict(p_qdq="fp8", p_qdq_amax=1e-46)),
    ("v_qdq_amax", lambda a: dict(v_qdq="fp8", v_qdq_amax=1e300)),
    ("k_qdq_amax", lambda a: dict(k_qdq="nvfp4", k_qdq_amax=1e-300)),
    # ints are ints: not float, not bool
    ("kv_lora_rank", lambda a: dict(kv_lora_rank=32.0)),
    ("qk_rope_head_dim", lambda a: dict(qk_rope_head_dim=True)),
    ("page_size", lambda a: dict(page_size=4.0)),
    ("num_kv_splits", lambda a: dict(num_kv_splits=True)),
    # every tensor on the meta device in an eager call (used to raise NotImplementedError)
    ("q", lambda a: {n: on_meta(a[n]) for n in ("q", "latent_cache", "block_table", "b_seq_len")}),
]


@pytest.mark.parametrize("name,change", DECODE_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(DECODE_CASES)])
def test_decode_rejects(name, change):
    args = decode_args()
    assert_bad(mla_core.mla_decode, {**args, **change(args)}, name)


def decode_spec(q, latent_cache, block_table, b_seq_len, **kw):
    opts = dict(page_size=None, num_kv_splits=32, k_qdq=None, k_qdq_amax=None, v_qdq=None, v_qdq_amax=None,
                p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    return specs.validate_decode(q, latent_cache, block_table, b_seq_len, **{**opts, **kw})


def test_decode_accepts_garbage_past_the_length():
    """Entries a length does not reach are never read, so they may hold anything."""
    args = decode_args()
    args["b_seq_len"] = torch.tensor([5, 0], dtype=torch.int32)  # request 0 uses 2 pages, request 1 none
    args["block_table"] = torch.tensor([[1, 2, 10 ** 6], [-7, 99, 2 ** 31 - 1]], dtype=torch.int32)
    problem, call = decode_spec(**args)
    assert problem.op == "decode" and call.block_table is args["block_table"]
    out, lse = mla_core.mla_decode(**args, backend="reference")
    assert not out.isnan().any() and (out[1] == 0).all() and (lse[1] == -math.inf).all()
    args["block_table"] = torch.tensor([[1, 10 ** 6, 0], [0, 0, 0]], dtype=torch.int32)  # page 2 of 5 tokens is used
    assert_bad(decode_spec, args, "block_table")


def test_decode_split_cap_is_128():
    """num_kv_splits 1..numerics.MAX_KV_SPLITS (128, 32 before issue 9): 128 accepted, 129 and 0 refused by name."""
    from mla_core import numerics
    assert numerics.MAX_KV_SPLITS == 128
    args = decode_args()
    _, call = decode_spec(**args, num_kv_splits=128)
    assert call.num_kv_splits == 128
    for bad in (129, 0):
        with pytest.raises(MLAInputError, match=rf"^num_kv_splits: got {bad}, needs 1\.\.128$"):
            decode_spec(**args, num_kv_splits=bad)


def test_decode_auto_splits_and_fp32_q_are_accepted():
    args = decode_args()
    problem, call = decode_spec(**{**args, "q": args["q"].float()}, num_kv_splits="auto")
    assert call.num_kv_splits is None and "fp32_q" in problem.features


# ------------------------------------------------------------------------------------------------
# mla_prefill: two sequences (3 and 4 queries over 4 and 6 keys), 4 heads over 2 kv heads


def prefill_args():
    g = torch.Generator().manual_seed(1)
    return dict(q=torch.randn(7, 4, 24, generator=g).bfloat16(), k=torch.randn(10, 2, 24, generator=g).bfloat16(),
                v=torch.randn(10, 2, 16, generator=g).bfloat16(),
                cu_seqlens_q=torch.tensor([0, 3, 7], dtype=torch.int32),
                cu_seqlens_k=torch.tensor([0, 4, 10], dtype=torch.int32), max_seqlen_q=4)


PREFILL_CASES = [
    ("q", lambda a: dict(q=a["q"][:, 0])),
    ("q", lambda a: dict(q=a["q"].to(torch.int16))),
    ("q", lambda a: dict(q=non_contiguous_last(a["q"]))),
    ("k", lambda a: dict(k=a["k"].half())),
    ("k", lambda a: dict(k=torch.randn(10, 2, 20).bfloat16())),
    ("k", lambda a: dict(k=torch.randn(10, 3, 24).bfloat16(), v=torch.randn(10, 3, 16).bfloat16())),
    ("v", lambda a: dict(v=torch.randn(9, 2, 16).bfloat16())),
    ("v", lambda a: dict(v=on_meta(a["v"]))),
    ("cu_seqlens_q", lambda a: dict(cu_seqlens_q=a["cu_seqlens_q"].float())),
    ("cu_seqlens_q", lambda a: dict(cu_seqlens_q=torch.tensor([1, 3, 7], dtype=torch.int32))),
    ("cu_seqlens_q", lambda a: dict(cu_seqlens_q=torch.tensor([0, 5, 3, 7], dtype=torch.int32),
                                    cu_seqlens_k=torch.tensor([0, 4, 8, 10], dtype=torch.int32))),
    ("cu_seqlens_q", lambda a: dict(cu_seqlens_q=torch.tensor([0, 3, 8], dtype=torch.int32))),
    ("cu_seqlens_k", lambda a: dict(cu_seqlens_k=torch.tensor([0, 10], dtype=torch.int32))),
    ("cu_seqlens_k", lambda a: dict(cu_seqlens_k=torch.tensor([0, 4, 11], dtype=torch.int32))),
    ("cu_seqlens_k", lambda a: dict(cu_seqlens_k=torch.tensor([0, 4, 9], dtype=torch.int32))),  # ends short of k
    ("cu_seqlens_k", lambda a: dict(cu_seqlens_k=on_meta(a["cu_seqlens_k"]))),
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=3)),
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=-1)),
    ("softmax_scale", lambda a: dict(softmax_scale=-0.5)),
    ("causal", lambda a: dict(causal=1)),
    ("q_quant", lambda a: dict(q_quant="int8")),
    ("v_quant", lambda a: dict(v_quant="nvfp8")),
    ("q_amax", lambda a: dict(q_amax=math.nan)),
    ("k_amax", lambda a: dict(k_amax=0)),
    ("p_amax", lambda a: dict(p_amax=-1.0)),
    ("sparsity_m", lambda a: dict(sparsity_m=5)),
    ("sparsity_m", lambda a: dict(sparsity_m=True)),
    ("sparsity_n", lambda a: dict(sparsity_n=5, sparsity_m=4)),
    ("sparsity_n", lambda a: dict(sparsity_n=-1)),
    ("dense_sink_tokens", lambda a: dict(dense_sink_tokens=-1)),
    ("dense_recent_tokens", lambda a: dict(dense_recent_tokens=2.5)),
    ("block_m", lambda a: dict(block_m=24)),
    ("block_m", lambda a: dict(block_m=512)),
    ("block_n", lambda a: dict(block_n=8)),
    ("block_n", lambda a: dict(block_n="64")),
    ("backend", lambda a: dict(backend="no-such-backend")),
    # int32 limits (2**62 used to pass and then raise OverflowError)
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=2 ** 62)),
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=2 ** 31)),
    ("dense_sink_tokens", lambda a: dict(dense_sink_tokens=2 ** 31)),
    ("dense_recent_tokens", lambda a: dict(dense_recent_tokens=2 ** 40)),
    ("cu_seqlens_k", lambda a: dict(cu_seqlens_k=torch.tensor([0, 4, 2 ** 32 + 10]))),
    # ints are ints (sparsity_m=4.0 passed `in (4, 8)` and failed deep inside)
    ("sparsity_m", lambda a: dict(sparsity_m=4.0)),
    ("sparsity_n", lambda a: dict(sparsity_n=2.0)),
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=4.0)),
    ("max_seqlen_q", lambda a: dict(max_seqlen_q=True)),
    # scalars in float32's normal range
    ("softmax_scale", lambda a: dict(softmax_scale=1e39)),
    ("q_amax", lambda a: dict(q_quant="fp8", q_amax=1e-46)),
    ("k_amax", lambda a: dict(k_quant="nvfp4", k_amax=1e-300)),
    ("v_amax", lambda a: dict(v_quant="fp8", v_amax=1e300)),
    ("p_amax", lambda a: dict(p_amax=True)),
    # every tensor on the meta device in an eager call
    ("q", lambda a: {n: on_meta(a[n]) for n in ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")}),
]


@pytest.mark.parametrize("name,change", PREFILL_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(PREFILL_CASES)])
def test_prefill_rejects(name, change):
    args = prefill_args()
    assert_bad(mla_core.mla_prefill, {**args, **change(args)}, name)


def test_int32_limits_on_sizes_seen_only_in_metadata():
    """A block table of 2**29 pages x 4 tokens and 2**31 packed tokens exceed the int32 lengths and offsets
    kernels hold. Fake tensors (no memory) carry the shapes; the checks read metadata only."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        bf16 = torch.bfloat16
        args = dict(q=torch.empty(2, 4, 40, dtype=bf16), latent_cache=torch.empty(5, 4, 40, dtype=bf16),
                    block_table=torch.empty(2, 2 ** 29 - 1, dtype=torch.int32), b_seq_len=torch.empty(2, dtype=torch.int32),
                    softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=8)
        decode_spec(**args)  # 2**31 - 4 tokens of capacity: accepted; 2**31 refused
        assert_bad(decode_spec, {**args, "block_table": torch.empty(2, 2 ** 29, dtype=torch.int32)}, "block_table")
        cu = torch.empty(2, dtype=torch.int32)
        opts = dict(max_seqlen_q=4, softmax_scale=None, causal=True, return_lse=False, q_quant=None, k_quant=None,
                    p_quant=None, v_quant=None, q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0,
                    sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=0, block_m=64, block_n=64)
        small, huge = torch.empty(8, 1, 16, dtype=bf16), torch.empty(2 ** 31, 1, 16, dtype=bf16)
        for name, q, kv in (("q", huge, small), ("k", small, huge)):
            assert_bad(lambda **kw: specs.validate_prefill(**kw), dict(q=q, k=kv, v=kv, cu_seqlens_q=cu,
                                                                       cu_seqlens_k=cu, **opts), name)


# ------------------------------------------------------------------------------------------------
# merge_attn_states: 5 tokens, 3 heads, 8 features


def merge_args():
    g = torch.Generator().manual_seed(2)
    return dict(prefix_output=torch.randn(5, 3, 8, generator=g), prefix_lse=torch.randn(3, 5, generator=g),
                suffix_output=torch.randn(5, 3, 8, generator=g), suffix_lse=torch.randn(3, 5, generator=g))


MERGE_CASES = [
    ("prefix_output", lambda a: dict(prefix_output=a["prefix_output"][0])),
    ("prefix_output", lambda a: dict(prefix_output=a["prefix_output"].int())),
    ("prefix_output", lambda a: dict(prefix_output=non_contiguous_last(a["prefix_output"]))),
    ("suffix_output", lambda a: dict(suffix_output=a["suffix_output"].bfloat16())),
    ("suffix_output", lambda a: dict(suffix_output=torch.randn(5, 3, 9))),
    ("suffix_output", lambda a: dict(suffix_output=on_meta(a["suffix_output"]))),
    ("prefix_lse", lambda a: dict(prefix_lse=a["prefix_lse"].bfloat16())),
    ("prefix_lse", lambda a: dict(prefix_lse=a["prefix_lse"].t().contiguous())),
    ("prefix_lse", lambda a: dict(prefix_lse=torch.randn(5, 3).t())),
    ("suffix_lse", lambda a: dict(suffix_lse=a["suffix_lse"][None])),
    ("suffix_lse", lambda a: dict(suffix_lse=on_meta(a["suffix_lse"]))),
    ("output", lambda a: dict(output=torch.empty(5, 3, 4))),
    ("output", lambda a: dict(output=torch.empty(5, 3, 8, dtype=torch.int32))),
    ("output", lambda a: dict(output=torch.empty(5, 3, 8, device=META))),
    ("output_lse", lambda a: dict(output_lse=torch.empty(5, 3))),
    ("output_lse", lambda a: dict(output_lse=torch.empty(3, 5, dtype=torch.float16))),
    ("backend", lambda a: dict(backend="no-such-backend")),
    ("prefix_output", lambda a: {n: on_meta(a[n]) for n in a}),
]


@pytest.mark.parametrize("name,change", MERGE_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(MERGE_CASES)])
def test_merge_rejects(name, change):
    args = merge_args()
    assert_bad(mla_core.merge_attn_states, {**args, **change(args)}, name)


# ------------------------------------------------------------------------------------------------
# mla_rope_quantize_fp8: 4 tokens, 2 heads, rope 8, nope 16, 10 cached positions


def rope_args():
    g = torch.Generator().manual_seed(3)
    return dict(q_rope=torch.randn(4, 2, 8, generator=g).bfloat16(), k_rope=torch.randn(4, 8, generator=g).bfloat16(),
                q_nope=torch.randn(4, 2, 16, generator=g).bfloat16(), k_nope=torch.randn(4, 16, generator=g).bfloat16(),
                cos_sin_cache=torch.randn(10, 8, generator=g), pos_ids=torch.tensor([0, 3, 9, 2]))


ROPE_CASES = [
    ("q_rope", lambda a: dict(q_rope=a["q_rope"][:, 0])),
    ("q_rope", lambda a: dict(q_rope=a["q_rope"].float())),
    ("q_rope", lambda a: dict(q_rope=non_contiguous_last(a["q_rope"]))),
    ("q_rope", lambda a: dict(q_rope=torch.randn(4, 2, 7).bfloat16(), k_rope=torch.randn(4, 7).bfloat16(),
                              cos_sin_cache=torch.randn(10, 7))),
    ("k_rope", lambda a: dict(k_rope=a["k_rope"].half())),
    ("k_rope", lambda a: dict(k_rope=a["k_rope"][:3])),
    ("k_rope", lambda a: dict(k_rope=on_meta(a["k_rope"]))),
    ("q_nope", lambda a: dict(q_nope=torch.randn(4, 3, 16).bfloat16())),
    ("k_nope", lambda a: dict(k_nope=torch.randn(4, 12).bfloat16())),
    ("cos_sin_cache", lambda a: dict(cos_sin_cache=a["cos_sin_cache"].half())),
    ("cos_sin_cache", lambda a: dict(cos_sin_cache=torch.randn(10, 6))),
    ("cos_sin_cache", lambda a: dict(cos_sin_cache=torch.randn(20, 8)[::2])),
    ("pos_ids", lambda a: dict(pos_ids=a["pos_ids"].float())),
    ("pos_ids", lambda a: dict(pos_ids=a["pos_ids"][:3])),
    ("pos_ids", lambda a: dict(pos_ids=torch.tensor([0, 3, 10, 2]))),
    ("pos_ids", lambda a: dict(pos_ids=torch.tensor([0, -1, 9, 2], dtype=torch.int32))),
    ("pos_ids", lambda a: dict(pos_ids=on_meta(a["pos_ids"]))),
    ("is_neox", lambda a: dict(is_neox="yes")),
    ("quantize_dtype", lambda a: dict(quantize_dtype=torch.bfloat16)),
    ("quantize_dtype", lambda a: dict(quantize_dtype=torch.float8_e5m2)),
    ("q_rope_out", lambda a: dict(q_rope_out=torch.empty(4, 2, 8, dtype=torch.bfloat16))),
    ("q_rope_out", lambda a: dict(q_rope_out=torch.empty(4, 2, 9, dtype=FP8))),
    ("q_rope_out", lambda a: dict(q_rope_out=non_contiguous_last(torch.empty(4, 2, 8, dtype=FP8)))),
    ("k_nope_out", lambda a: dict(k_nope_out=torch.empty(4, 16, dtype=FP8, device=META))),
    ("quant_scale_q", lambda a: dict(quant_scale_q=0.0)),
    ("quant_scale_q", lambda a: dict(quant_scale_q=math.inf)),
    ("quant_scale_kv", lambda a: dict(quant_scale_kv=math.nan)),
    ("quant_scale_kv", lambda a: dict(quant_scale_kv=-1.0)),
    ("backend", lambda a: dict(backend="no-such-backend")),
]


@pytest.mark.parametrize("name,change", ROPE_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(ROPE_CASES)])
def test_rope_quantize_rejects(name, change):
    args = rope_args()
    assert_bad(mla_core.mla_rope_quantize_fp8, {**args, **change(args)}, name)


def test_rope_accepts_last_position_and_strided_buffers():
    args = rope_args()
    rows = torch.empty(4, 2, 24, dtype=FP8)  # nope ++ rope per row, written through strided views
    out = mla_core.mla_rope_quantize_fp8(**args, q_rope_out=rows[..., 16:], q_nope_out=rows[..., :16],
                                         backend="reference")
    assert out[0].data_ptr() == rows[..., 16:].data_ptr()


def test_content_checks_can_be_turned_off(monkeypatch):
    """MLA_CORE_CHECKS=metadata skips value checks (pos_ids range) but never metadata checks."""
    args = rope_args()
    args["pos_ids"] = torch.tensor([0, 3, 10, 2])
    opts = dict(is_neox=True, quantize_dtype=None, quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None,
                k_rope_out=None, q_nope_out=None, k_nope_out=None)
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    specs.validate_rope_quantize(**args, **opts)
    assert_bad(specs.validate_rope_quantize, {**args, **opts, "pos_ids": args["pos_ids"].float()}, "pos_ids")
    monkeypatch.delenv("MLA_CORE_CHECKS")
    assert_bad(specs.validate_rope_quantize, {**args, **opts}, "pos_ids")


# ------------------------------------------------------------------------------------------------
# sparse_mla_fp8_decode: batch 2, q_len 1, 2 heads, a [3, 16, 576] cache (48 rows), top-k 64


def sparse_args():
    g = torch.Generator().manual_seed(4)
    return dict(query=torch.randn(2, 1, 2, 576, generator=g).to(FP8),
                kv_cache=torch.randn(3, 16, 576, generator=g).to(FP8), workspace_buffer=None, qk_nope_head_dim=128,
                kv_lora_rank=512, qk_rope_head_dim=64,
                block_tables=torch.randint(0, 48, (2, 1, 64), generator=g, dtype=torch.int32),
                seq_lens=torch.tensor([30, 64], dtype=torch.int32), max_seq_len=0, sparse_mla_top_k=64)


def sparse_bad_index(a, value):
    idx = a["block_tables"].clone()
    idx[0, 0, 29] = value  # the last slot request 0's length reaches
    return dict(block_tables=idx)


SPARSE_CASES = [
    ("query", lambda a: dict(query=a["query"].float().bfloat16())),
    ("query", lambda a: dict(query=a["query"][..., :512].contiguous())),
    ("query", lambda a: dict(query=a["query"][:, 0])),
    ("query", lambda a: dict(query=torch.empty(2, 1, 4, 576, dtype=FP8)[:, :, ::2])),
    ("kv_lora_rank", lambda a: dict(kv_lora_rank=256)),
    ("qk_rope_head_dim", lambda a: dict(qk_rope_head_dim=32)),
    ("kv_cache", lambda a: dict(kv_cache=a["kv_cache"].float().bfloat16())),
    ("kv_cache", lambda a: dict(kv_cache=a["kv_cache"].view(48, 576))),
    ("kv_cache", lambda a: dict(kv_cache=a["kv_cache"].view(3, 2, 8, 576))),
    ("kv_cache", lambda a: dict(kv_cache=torch.empty(6, 16, 576, dtype=FP8)[::2])),
    ("kv_cache", lambda a: dict(kv_cache=on_meta(a["kv_cache"]))),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=100)),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=0)),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=64.0)),
    ("block_tables", lambda a: dict(block_tables=a["block_tables"].long())),
    ("block_tables", lambda a: dict(block_tables=torch.zeros(2, 1, 128, dtype=torch.int32))),
    ("block_tables", lambda a: dict(block_tables=torch.zeros(2, 2, 64, dtype=torch.int32)[:, ::2])),
    ("block_tables", lambda a: sparse_bad_index(a, 48)),
    ("block_tables", lambda a: sparse_bad_index(a, -2)),
    ("seq_lens", lambda a: dict(seq_lens=a["seq_lens"].long())),
    ("seq_lens", lambda a: dict(seq_lens=a["seq_lens"][:1])),
    ("seq_lens", lambda a: dict(seq_lens=torch.tensor([-1, 64], dtype=torch.int32))),
    ("seq_lens", lambda a: dict(seq_lens=torch.tensor([30, 65], dtype=torch.int32))),
    ("seq_lens", lambda a: dict(seq_lens=on_meta(a["seq_lens"]))),
    ("out", lambda a: dict(out=torch.empty(2, 1, 2, 512))),
    ("out", lambda a: dict(out=torch.empty(2, 1, 2, 576, dtype=torch.bfloat16))),
    ("out", lambda a: dict(out=torch.empty(2, 1, 4, 512, dtype=torch.bfloat16)[:, :, ::2])),
    ("lse", lambda a: dict(lse=torch.empty(2, 2, dtype=torch.bfloat16))),
    ("lse", lambda a: dict(lse=torch.empty(4, 2))),
    ("lse", lambda a: dict(lse=torch.empty(2, 1, 2, device=META))),
    ("bmm1_scale", lambda a: dict(bmm1_scale=math.nan)),
    ("bmm1_scale", lambda a: dict(bmm1_scale=torch.tensor([0.1, 0.2]))),
    ("bmm1_scale", lambda a: dict(bmm1_scale=torch.tensor(0.1, device=META))),
    ("bmm2_scale", lambda a: dict(bmm2_scale="2.0")),
    ("return_lse", lambda a: dict(return_lse=1)),
    ("metadata", lambda a: dict(metadata={"valid_lens": a["seq_lens"]})),
    ("metadata", lambda a: dict(metadata=mla_core.get_sparse_decode_metadata(a["query"], a["seq_lens"], 128))),
    ("backend", lambda a: dict(backend="no-such-backend")),
]


@pytest.mark.parametrize("name,change", SPARSE_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(SPARSE_CASES)])
def test_sparse_decode_rejects(name, change):
    args = sparse_args()
    assert_bad(mla_core.sparse_mla_fp8_decode, {**args, **change(args)}, name)


def test_sparse_unknown_backend_lists_known_ones():
    msg = assert_bad(mla_core.sparse_mla_fp8_decode, {**sparse_args(), "backend": "flashmla"}, "backend")
    assert "'flashmla'" in msg and "reference" in msg


def test_sparse_accepts_garbage_past_the_length_and_minus_one():
    args = sparse_args()
    idx = args["block_tables"]
    idx[0, 0, 30:] = 10 ** 9  # past seq_lens[0] = 30: never read
    idx[0, 0, 31:] = -5
    idx[1, 0, 7] = -1  # an empty slot within the length
    out, lse = mla_core.sparse_mla_fp8_decode(**args, return_lse=True)
    assert out.shape == (2, 1, 2, 512) and torch.isfinite(lse).all()


# ------------------------------------------------------------------------------------------------
# get_sparse_decode_metadata


def metadata_args():
    return dict(query=torch.zeros(2, 1, 2, 576, dtype=FP8), seq_lens=torch.tensor([30, 64], dtype=torch.int32),
                sparse_mla_top_k=64)


METADATA_CASES = [
    ("query", lambda a: dict(query=torch.zeros(2, 1, 2, 576, dtype=torch.float16))),  # FP8 or bf16 (fp8_ds_mla)
    ("query", lambda a: dict(query=a["query"][:, 0])),
    ("query", lambda a: dict(query=torch.zeros(2, 1, 2, 512, dtype=FP8))),
    ("query", lambda a: dict(query=[[0.0]])),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=0)),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=65)),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=-64)),
    ("sparse_mla_top_k", lambda a: dict(sparse_mla_top_k=True)),
    ("seq_lens", lambda a: dict(seq_lens=a["seq_lens"].long())),
    ("seq_lens", lambda a: dict(seq_lens=torch.tensor([30, 64, 1], dtype=torch.int32))),
    ("seq_lens", lambda a: dict(seq_lens=a["seq_lens"][None])),
    ("seq_lens", lambda a: dict(seq_lens=on_meta(a["seq_lens"]))),
    ("seq_lens", lambda a: dict(seq_lens=torch.tensor([-3, 64], dtype=torch.int32))),
    ("seq_lens", lambda a: dict(seq_lens=torch.tensor([30, 65], dtype=torch.int32))),
]


@pytest.mark.parametrize("name,change", METADATA_CASES, ids=[f"{i}-{n}" for i, (n, _) in enumerate(METADATA_CASES)])
def test_sparse_metadata_rejects(name, change):
    args = metadata_args()
    assert_bad(mla_core.get_sparse_decode_metadata, {**args, **change(args)}, name)


def test_sparse_metadata_accepts_none_and_edge_lengths():
    args = metadata_args()
    meta = mla_core.get_sparse_decode_metadata(args["query"], torch.tensor([0, 64], dtype=torch.int32), 64)
    assert meta.valid_lens.tolist() == [0, 64]
    assert mla_core.get_sparse_decode_metadata(args["query"], None, 128).valid_lens.tolist() == [128, 128]
