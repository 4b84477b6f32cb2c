"""Reference ``mla_rope_quantize_fp8`` against independent float64 math (naive loops per token, head, pair).

The expectation rotates in float64 and rounds to E4M3 with its own rounding (``e4m3_nearest``). The
reference rotates in float32, so a value within float32 rounding of an E4M3 midpoint may land on
either neighbour; every other element must match exactly.
"""
import math

import pytest
import torch

import mla_core

FP8 = torch.float8_e4m3fn


def e4m3_nearest(v: float) -> float:
    """Nearest FP8 E4M3 (fn) value to ``v``, ties to the even mantissa, saturating at ±448."""
    if math.isnan(v):
        return v
    a = min(abs(v), 448.0)
    if a == 0.0:
        return math.copysign(0.0, v)
    _, exp = math.frexp(a)  # a = f * 2**exp with f in [0.5, 1)
    ulp = 2.0 ** (exp - 1 - 3) if a >= 2.0 ** -6 else 2.0 ** -9  # 3 mantissa bits; subnormal step 2^-9
    return math.copysign(min(round(a / ulp) * ulp, 448.0), v)  # round(): half to even


def rope_expected(q_rope, k_rope, cache, pos_ids, is_neox):
    """Float64 rotation with explicit loops: returns (q [nnz, heads, rope], k [nnz, rope]) float64."""
    nnz, heads, rope = q_rope.shape
    half = rope // 2
    q64, k64, c64 = q_rope.double(), k_rope.double(), cache.double()
    q_out, k_out = torch.empty_like(q64), torch.empty_like(k64)
    for t in range(nnz):
        p = int(pos_ids[t])
        for i in range(half):
            cos, sin = float(c64[p, i]), float(c64[p, half + i])
            a, b = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
            for h in range(heads):
                x1, x2 = float(q64[t, h, a]), float(q64[t, h, b])
                q_out[t, h, a], q_out[t, h, b] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
            x1, x2 = float(k64[t, a]), float(k64[t, b])
            k_out[t, a], k_out[t, b] = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    return q_out, k_out


def assert_fp8_of(out: torch.Tensor, exact: torch.Tensor, scale: float, min_exact: float = 0.99):
    """``out`` (FP8) holds e4m3(exact * scale) for float64 ``exact``; a near-midpoint element may take either neighbour."""
    assert out.dtype == FP8
    got = out.double().flatten().tolist()
    want = (exact.double() * scale).flatten().tolist()
    hits = 0
    for g, w in zip(got, want):
        nearest = e4m3_nearest(w)
        hits += g == nearest
        slack = abs(w) * 2.0 ** -20 + 1e-30
        assert g in (nearest, e4m3_nearest(w - slack), e4m3_nearest(w + slack)), (g, w)
    assert hits >= min_exact * len(got)


def cos_sin_cache(max_pos: int, rope: int, dtype) -> torch.Tensor:
    """[max_pos, rope]: cos(pos * f_i) in [:rope/2], sin in [rope/2:] (DeepSeek-style frequencies)."""
    inv_freq = 10000.0 ** (-torch.arange(0, rope, 2, dtype=torch.float64) / rope)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1).to(dtype)


def make_inputs(nnz=6, heads=4, rope=64, nope=512, dtype=torch.bfloat16, cache_dtype=torch.float32, max_pos=300,
                pos_dtype=torch.int64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q_rope = (torch.randn(nnz, heads, rope, generator=g) * 3).to(dtype)
    k_rope = (torch.randn(nnz, rope, generator=g) * 3).to(dtype)
    q_nope = (torch.randn(nnz, heads, nope, generator=g) * 3).to(dtype)
    k_nope = (torch.randn(nnz, nope, generator=g) * 3).to(dtype)
    pos_ids = torch.randint(0, max_pos, (nnz,), generator=g).to(pos_dtype)
    return q_rope, k_rope, q_nope, k_nope, cos_sin_cache(max_pos, rope, cache_dtype), pos_ids


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype,pos_dtype", [(torch.bfloat16, torch.int64), (torch.float16, torch.int32)])
def test_matches_float64_rotation(is_neox, cache_dtype, dtype, pos_dtype):
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(dtype=dtype, cache_dtype=cache_dtype, pos_dtype=pos_dtype)
    scale_q, scale_kv = 0.75, 1.5
    q_r, k_r, q_n, k_n = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=is_neox,
                                                        quant_scale_q=scale_q, quant_scale_kv=scale_kv,
                                                        backend="reference")
    q_exp, k_exp = rope_expected(q_rope, k_rope, cache, pos, is_neox)
    assert_fp8_of(q_r, q_exp, scale_q)
    assert_fp8_of(k_r, k_exp, scale_kv)
    assert_fp8_of(q_n, q_nope.double(), scale_q)
    assert_fp8_of(k_n, k_nope.double(), scale_kv)
    # The quantization happened: the FP8 values are measurably far from the unquantized rotation.
    rel = (q_r.double() - q_exp * scale_q).norm() / (q_exp * scale_q).norm()
    assert rel > 1e-3


def test_neox_and_interleaved_differ():
    """The two layouts pair different elements, so (with a nonzero angle) their results differ."""
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs()
    pos = torch.full_like(pos, 7)
    neox = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=True, backend="reference")
    inter = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=False,
                                           backend="reference")
    assert not torch.equal(neox[0].float(), inter[0].float())
    assert torch.equal(neox[2].float(), inter[2].float())  # NOPE parts are not rotated


def test_position_zero_is_identity_rotation():
    """cos = 1, sin = 0 at position 0: the rope outputs are the FP8 of the inputs themselves."""
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs()
    pos = torch.zeros_like(pos)
    q_r, k_r, _, _ = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=False,
                                                    backend="reference")
    assert_fp8_of(q_r, q_rope.double(), 1.0, min_exact=1.0)
    assert_fp8_of(k_r, k_rope.double(), 1.0, min_exact=1.0)


@pytest.mark.parametrize("is_neox", [True, False])
def test_writes_strided_buffers_and_returns_them(is_neox):
    """Outputs land in slices of caller-owned 576-byte rows (strided leading dims), nothing else is touched."""
    nnz, heads = 5, 3
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(nnz=nnz, heads=heads, seed=1)
    nan = float("nan")
    q_rows = torch.full((nnz, heads + 1, 576), nan, dtype=FP8)  # one spare head row: heads stride != 576 * heads
    k_rows = torch.full((nnz, 576), nan, dtype=FP8)
    outs = (q_rows[:, :heads, 512:], k_rows[:, 512:], q_rows[:, :heads, :512], k_rows[:, :512])
    got = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=is_neox,
                                         quant_scale_q=2.0, quant_scale_kv=0.5, q_rope_out=outs[0], k_rope_out=outs[1],
                                         q_nope_out=outs[2], k_nope_out=outs[3], backend="reference")
    assert all(g is o for g, o in zip(got, outs))
    assert not q_rows[:, :heads].float().isnan().any()
    assert not k_rows.float().isnan().any()
    assert q_rows[:, heads].float().isnan().all()  # the spare row was not written
    fresh = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=is_neox,
                                           quant_scale_q=2.0, quant_scale_kv=0.5, backend="reference")
    for g, f, shape in zip(got, fresh, (q_rope.shape, k_rope.shape, q_nope.shape, k_nope.shape)):
        assert f.dtype == FP8 and f.shape == shape and f.is_contiguous()
        assert torch.equal(g.float(), f.float())
    q_exp, k_exp = rope_expected(q_rope, k_rope, cache, pos, is_neox)
    assert_fp8_of(got[0], q_exp, 2.0)
    assert_fp8_of(got[1], k_exp, 0.5)


def test_some_buffers_given_others_allocated():
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(seed=2)
    k_nope_out = torch.full(k_nope.shape, float("nan"), dtype=FP8)
    got = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, k_nope_out=k_nope_out,
                                         backend="reference")
    assert got[3] is k_nope_out
    assert_fp8_of(k_nope_out, k_nope.double(), 1.0, min_exact=1.0)
    assert all(t.dtype == FP8 for t in got[:3])


def test_scale_saturates_at_448_and_keeps_signs():
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(seed=3)
    q_r, k_r, q_n, k_n = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos,
                                                        quant_scale_q=400.0, quant_scale_kv=1000.0,
                                                        backend="reference")
    for out, x, scale in ((q_n, q_nope, 400.0), (k_n, k_nope, 1000.0)):
        vals, want = out.float(), x.float() * scale
        big = want.abs() > 464  # beyond the 448 / next-code midpoint: must saturate, never NaN
        assert big.sum() > 100
        assert torch.equal(vals[big], torch.copysign(torch.full_like(vals[big], 448.0), want[big]))
        assert not vals.isnan().any()
    q_exp, k_exp = rope_expected(q_rope, k_rope, cache, pos, True)
    assert_fp8_of(q_r, q_exp, 400.0)
    assert_fp8_of(k_r, k_exp, 1000.0)


def test_deepseek_shape_small_batch_interleaved_bf16_cache():
    """DeepSeek widths (rope 64, nope 512) with 16 heads and a bf16 cache at large positions."""
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(nnz=2, heads=16, cache_dtype=torch.bfloat16,
                                                             max_pos=4096, seed=4)
    q_r, k_r, q_n, k_n = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, is_neox=False,
                                                        backend="reference")
    q_exp, k_exp = rope_expected(q_rope, k_rope, cache, pos, False)
    assert_fp8_of(q_r, q_exp, 1.0)
    assert_fp8_of(k_r, k_exp, 1.0)
    assert_fp8_of(q_n, q_nope.double(), 1.0, min_exact=1.0)


def test_empty_batch():
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(nnz=0)
    got = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, pos, backend="reference")
    assert [tuple(t.shape) for t in got] == [(0, 4, 64), (0, 64), (0, 4, 512), (0, 512)]


def test_positions_outside_the_table_raise_in_full_mode_and_give_zero_rope_otherwise(monkeypatch):
    q_rope, k_rope, q_nope, k_nope, cache, pos = make_inputs(nnz=3, max_pos=20, seed=9)
    bad = torch.tensor([-1, 20, 10 ** 6])
    with pytest.raises(mla_core.MLAInputError, match="pos_ids"):
        mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, bad, backend="reference")
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    q_r, k_r, q_n, _ = mla_core.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cache, bad, backend="reference")
    assert (q_r.float() == 0).all() and (k_r.float() == 0).all()
    assert_fp8_of(q_n, q_nope.double(), 1.0, min_exact=1.0)  # NOPE parts are quantized as usual
