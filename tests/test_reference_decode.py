"""Reference decode against independent float64 math (tests/reference_math.py), through the public API."""
from __future__ import annotations

import pathlib
import sys
import time

import pytest
import torch

import mla_core
from mla_core import specs

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from paged_inputs import paged_decode_inputs  # noqa: E402
from reference_math import decode_math, rel_l2, same_lse  # noqa: E402

RANK, ROPE = 512, 64
DIM = RANK + ROPE
SCALE = 0.04  # softmax scale: with randn q and k it spreads P over a few dozen keys
FP32_TOL = 1e-5
AWKWARD_LENGTHS = [0, 1, 15, 17, 33, 1000]


def make_decode_inputs(lengths, heads, page_size, dtype=torch.float32, q_dtype=None, seed=0, device="cpu"):
    """Random q and a poisoned paged cache for ``lengths`` (tests/paged_inputs.py), DeepSeek widths."""
    return paged_decode_inputs(lengths, heads, DIM, page_size, dtype, q_dtype, seed, device)


def run_decode(q, cache, table, seq_lens, **kw):
    return mla_core.mla_decode(q, cache, table, seq_lens, softmax_scale=SCALE, kv_lora_rank=RANK,
                               qk_rope_head_dim=ROPE, backend="reference", **kw)


def math_kwargs(kw):
    """The float64 math's keyword names for a decode call's quantization arguments."""
    names = {"k_qdq": "k_qdq", "v_qdq": "v_qdq", "p_qdq": "p_qdq", "k_qdq_amax": "k_amax",
             "v_qdq_amax": "v_amax", "p_qdq_amax": "p_amax"}
    return {names[k]: v for k, v in kw.items() if k in names}


def expect(q, cache, table, seq_lens, splits, **kw):
    return decode_math(q.cpu(), cache.cpu(), table.cpu(), seq_lens.cpu(), softmax_scale=SCALE, kv_lora_rank=RANK,
                       num_kv_splits=splits, **math_kwargs(kw))


@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("splits", [1, 7, 32])
def test_fp32_awkward_lengths_and_pages(page_size, splits):
    q, cache, table, seq_lens = make_decode_inputs(AWKWARD_LENGTHS, 16, page_size, seed=page_size + splits)
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=splits)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, splits)
    assert out.dtype == torch.float32 and out.shape == (6, 16, RANK) and lse.shape == (6, 16)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))


def test_auto_splits_use_the_heuristic():
    q, cache, table, seq_lens = make_decode_inputs([40, 300, 1000], 16, 16, seed=3)
    kw = dict(p_qdq="nvfp4", v_qdq="nvfp4")
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits="auto", **kw)
    _, call = specs.validate_decode(q, cache, table, seq_lens, softmax_scale=SCALE, kv_lora_rank=RANK,
                                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=None,
                                    k_qdq_amax=None, v_qdq="nvfp4", v_qdq_amax=None, p_qdq="nvfp4", p_qdq_amax=1.0,
                                    return_lse=True, out_dtype=None)
    splits = specs.decode_num_splits(call, {})
    assert 1 < splits <= 128
    ref_out, ref_lse = expect(q, cache, table, seq_lens, splits, **kw)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)


def test_128_heads():
    q, cache, table, seq_lens = make_decode_inputs([17, 70], 128, 64, seed=5)
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=2)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, 2)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)


QUANT_CASES = [
    dict(k_qdq="fp8"),
    dict(k_qdq="nvfp4"),
    dict(k_qdq="fp8", k_qdq_amax=5.0),
    dict(k_qdq="nvfp4", k_qdq_amax=5.0),
    dict(v_qdq="fp8"),
    dict(v_qdq="nvfp4"),
    dict(v_qdq="nvfp4", v_qdq_amax=5.0),
    dict(p_qdq="fp8"),
    dict(p_qdq="nvfp4"),
    dict(p_qdq="fp8", p_qdq_amax=0.5),
    dict(k_qdq="fp8", v_qdq="fp8", p_qdq="fp8"),
    dict(k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4"),
    dict(k_qdq="nvfp4", v_qdq="fp8", p_qdq="nvfp4", k_qdq_amax=5.0, v_qdq_amax=5.0),
    dict(k_qdq="fp8", v_qdq="nvfp4", p_qdq="fp8"),
]


@pytest.mark.parametrize("kw", QUANT_CASES, ids=lambda kw: "-".join(f"{k}={v}" for k, v in kw.items()))
def test_quant_formats_near_quantized_far_from_plain(kw):
    q, cache, table, seq_lens = make_decode_inputs([15, 33, 300], 16, 16, seed=11)
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=7, **kw)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, 7, **kw)
    plain_out, _ = expect(q, cache, table, seq_lens, 7)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)
    assert rel_l2(out, plain_out) > 1e-3


def test_split_count_changes_quantized_p():
    """With P quantized the running max restarts per split, so different split counts give different results."""
    q, cache, table, seq_lens = make_decode_inputs([1000], 16, 16, seed=13)
    results = {}
    for splits in (1, 32):
        out, _ = run_decode(q, cache, table, seq_lens, num_kv_splits=splits, p_qdq="nvfp4")
        ref_out, _ = expect(q, cache, table, seq_lens, splits, p_qdq="nvfp4")
        assert rel_l2(out, ref_out) < FP32_TOL
        results[splits] = out
    assert rel_l2(results[1], results[32]) > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kw", [{}, dict(k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")], ids=["plain", "nvfp4"])
def test_half_caches(dtype, kw):
    """bf16 / fp16 cache and q: P is rounded to the cache dtype before P·V, and so is the math's."""
    q, cache, table, seq_lens = make_decode_inputs([0, 17, 300], 16, 16, dtype=dtype, seed=17)
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=7, **kw)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, 7, **kw)
    assert out.dtype == dtype
    assert rel_l2(out, ref_out) < 1e-2
    assert same_lse(lse, ref_lse, 1e-4)
    # in float32 output only the float32 arithmetic separates them
    out32, _ = run_decode(q, cache, table, seq_lens, num_kv_splits=7, out_dtype=torch.float32, **kw)
    assert out32.dtype == torch.float32
    assert rel_l2(out32, ref_out) < 1e-4


def test_p_rounded_to_cache_dtype():
    """bf16 cache, no P quant: the math with P rounded to bf16 is nearer than the math without."""
    q, cache, table, seq_lens = make_decode_inputs([1000], 16, 16, dtype=torch.bfloat16, seed=19)
    out, _ = run_decode(q, cache, table, seq_lens, num_kv_splits=1, out_dtype=torch.float32)
    ref_out, _ = expect(q, cache, table, seq_lens, 1)
    unrounded, _ = decode_math(q.float(), cache.float(), table, seq_lens, softmax_scale=SCALE, kv_lora_rank=RANK,
                               num_kv_splits=1)
    assert rel_l2(out, ref_out) < 1e-4
    assert rel_l2(out, unrounded) > 10 * rel_l2(out, ref_out)


def test_fp32_carrier_q_on_bf16_cache():
    """A caller-quantized q in float32 is used as is (not rounded to bf16)."""
    q, cache, table, seq_lens = make_decode_inputs([33, 500], 16, 16, dtype=torch.bfloat16, q_dtype=torch.float32,
                                                   seed=23)
    q = mla_core.numerics.qdq_nvfp4(q * 3.0, amax=20.0)  # the dynamic-NVFP4 carrier, not bf16-representable
    assert not torch.equal(q, q.to(torch.bfloat16).float())
    kw = dict(k_qdq="nvfp4", p_qdq="fp8")
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=4, out_dtype=torch.float32, **kw)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, 4, **kw)
    rounded_q_out, _ = expect(q.to(torch.bfloat16), cache, table, seq_lens, 4, **kw)
    assert rel_l2(out, ref_out) < 1e-4
    assert same_lse(lse, ref_lse, 1e-4)
    assert rel_l2(out, rounded_q_out) > 1e-3


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_out_dtype(out_dtype):
    q, cache, table, seq_lens = make_decode_inputs([17, 100], 16, 16, seed=29)
    out, _ = run_decode(q, cache, table, seq_lens, out_dtype=out_dtype)
    ref_out, _ = expect(q, cache, table, seq_lens, 32)
    assert out.dtype == out_dtype
    assert rel_l2(out, ref_out) < (FP32_TOL if out_dtype == torch.float32 else 1e-2)


def test_all_empty_batch_and_return_lse_off():
    q, cache, table, seq_lens = make_decode_inputs([0, 0], 16, 16, seed=31)
    out, lse = run_decode(q, cache, table, seq_lens)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))
    q, cache, table, seq_lens = make_decode_inputs([0, 5], 16, 16, seed=31)
    out, lse = run_decode(q, cache, table, seq_lens, return_lse=False, p_qdq="nvfp4")
    assert lse is None
    ref_out, _ = expect(q, cache, table, seq_lens, 32, p_qdq="nvfp4")
    assert rel_l2(out, ref_out) < FP32_TOL


def test_out_of_range_pages_within_length_are_absent_keys(monkeypatch):
    """With content checks off, a page index outside the cache is masked (as if absent), never read."""
    monkeypatch.setenv(specs.ENV_CHECKS, "metadata")
    q, cache, table, seq_lens = make_decode_inputs([48], 4, 16, seed=37)
    good_out, _ = run_decode(q, cache, table, seq_lens)
    table[0, 2] = 10 ** 6  # keys 32..47 now point outside the cache
    out, lse = run_decode(q, cache, table, seq_lens)
    ref_out, ref_lse = expect(q, cache, table, torch.tensor([32], dtype=torch.int32), 32)
    assert rel_l2(out, ref_out) < FP32_TOL and same_lse(lse, ref_lse, FP32_TOL)
    assert rel_l2(out, good_out) > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_float64_math():
    kw = dict(k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")
    inputs = make_decode_inputs(AWKWARD_LENGTHS, 16, 16, seed=41, device="cuda")
    out, lse = run_decode(*inputs, num_kv_splits=7, **kw)
    ref_out, ref_lse = expect(*inputs, 7, **kw)
    assert out.is_cuda
    # float32 on the GPU may round P one step differently where it sits on a rounding boundary
    assert rel_l2(out.cpu(), ref_out) < 1e-4
    assert same_lse(lse.cpu(), ref_lse, 1e-4)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_benchmark_size_is_fast():
    """Batch 32, 128 heads, length 8192 (bf16, everything NVFP4) stays well under a second."""
    g = torch.Generator(device="cuda").manual_seed(0)
    batch, heads, length, page = 32, 128, 8192, 64
    pages = batch * length // page
    cache = torch.randn(pages, page, DIM, device="cuda", generator=g).to(torch.bfloat16)
    q = torch.randn(batch, heads, DIM, device="cuda", generator=g).to(torch.bfloat16)
    table = torch.randperm(pages, device="cuda", generator=g).view(batch, -1).to(torch.int32)
    seq_lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    kw = dict(num_kv_splits=32, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")
    run_decode(q, cache, table, seq_lens, **kw)
    torch.cuda.synchronize()
    start = time.perf_counter()
    out, _ = run_decode(q, cache, table, seq_lens, **kw)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    assert not torch.isnan(out).any()
    assert elapsed < 1.0, f"{elapsed:.3f} s"


@pytest.mark.parametrize("splits", [64, 128])
@pytest.mark.parametrize("kw", [{}, dict(p_qdq="fp8")], ids=["plain", "p_fp8"])
def test_many_splits_against_float64(splits, kw):
    """Above the old cap of 32 (numerics.MAX_KV_SPLITS is 128): ragged lengths incl. 0 and 1, one request with a
    tile per split (128 x 32 keys), one with more tiles than splits and one with empty trailing splits; with P
    quantized the schedule is visible, so the result must also differ from 32 splits' (no silent clamp). (Quantized P
    at thousands of keys: a float32 P on a rounding boundary may round the other way than the float64 math's in a
    head or two at any split count, 32 included; these seeds stay inside the aggregate tolerance.)"""
    lengths = [0, 1, 33, 4096, 5000, 8191]
    q, cache, table, seq_lens = make_decode_inputs(lengths, 16, 64, seed=splits)
    out, lse = run_decode(q, cache, table, seq_lens, num_kv_splits=splits, **kw)
    ref_out, ref_lse = expect(q, cache, table, seq_lens, splits, **kw)
    assert rel_l2(out, ref_out) < FP32_TOL
    assert same_lse(lse, ref_lse, FP32_TOL)
    assert torch.all(out[0] == 0) and torch.all(lse[0] == float("-inf"))
    if kw:
        at_32, _ = expect(q, cache, table, seq_lens, 32, **kw)
        assert rel_l2(ref_out[3:], at_32[3:]) > 1e-3


def test_auto_fills_past_the_old_cap():
    """"auto" at batch 1 over 8192 keys: ceil(2 * 132 / 1) capped at MAX_KV_SPLITS = 128 (32 before), and one CTA
    per SM (the cuda WGMMA kernel's rule): 132 // 1 capped by 2 steps of 64 keys per split (and 64-head group) of
    the table's keys; triton's fill stops at 64."""
    q, cache, table, seq_lens = make_decode_inputs([8192], 16, 64, seed=21)
    _, call = specs.validate_decode(q, cache, table, seq_lens, softmax_scale=SCALE, kv_lora_rank=RANK,
                                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=None,
                                    k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                                    return_lse=True, out_dtype=None)
    assert specs.decode_num_splits(call, {}) == 128
    table_keys = call.block_table.shape[1] * 64  # 8192 keys and the helper's spare page
    assert specs.decode_num_splits(call, {}, resident_ctas=1) == table_keys // 128 == 65
    wide = dataclasses_replace_table(call, 4)  # 4 x the table: 132 // 1 -> capped at 128
    assert specs.decode_num_splits(wide, {}, resident_ctas=1) == 128
    assert specs.decode_num_splits(dataclasses_replace_q(wide, 128), {}, resident_ctas=1) == 66
    assert specs.decode_num_splits(dataclasses_replace_q(call, 128), {}, resident_ctas=1) == -(-table_keys // 256) == 33
    assert specs.decode_num_splits(call, {}, max_fill=64) == 64
    assert specs.decode_num_splits(call, {"num_kv_splits": 100}, max_fill=64) == 100  # a tuned or given count


def dataclasses_replace_table(call, factor):
    import dataclasses
    return dataclasses.replace(call, block_table=call.block_table.repeat(1, factor))


def dataclasses_replace_q(call, heads):
    import dataclasses
    return dataclasses.replace(call, q=call.q[:, :1].expand(call.q.shape[0], heads, call.q.shape[2]))
