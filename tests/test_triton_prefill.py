"""Triton prefill against the reference backend.

CPU: the kernel runs under ``TRITON_INTERPRET=1`` (set by conftest.py) on small shapes with fp32/fp16
inputs (the interpreter multiplies bf16 dot operands as raw bits). GPU (``pytest -m gpu``): heads 128,
dims 192/128 and the absorbed 576/512, lengths up to 16384, bf16. The kernel's outputs are poisoned
with NaN before it runs (an unwritten element fails), inputs are fresh random values, and every
quantized case also shows the result is measurably far from the unquantized one.
"""
from __future__ import annotations

import os
import pathlib
import sys

import pytest
import torch

import triton
import triton.language as tl

import mla_core
from mla_core import numerics
from mla_core_triton import prefill as prefill_kernels

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference_math import rel_l2, same_lse  # noqa: E402

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu = pytest.mark.skipif(not INTERPRETED, reason="CPU variants run the Triton interpreter (TRITON_INTERPRET=1)")
FP32_TOL = 1e-5
HALF_TOL = 1e-2
# (len_q, len_k) per sequence: an empty sequence, q shorter than k, lengths off the tile grid
VARLEN = [(17, 40), (0, 0), (40, 70)]
RECIPES = {"bf16": {}, "fp8": dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), "fp8"),
           "nvfp4": dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), "nvfp4")}


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output the triton kernel gets starts as NaN."""
    from mla_core_triton import prefill
    monkeypatch.setattr(prefill, "_new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))


def make_inputs(seqs, heads, kv_heads, qk_dim, v_dim, dtype=torch.float32, seed=0, device="cpu", strided=False):
    """Packed q/k/v with standard-normal values, cu_seqlens and max_seqlen_q.

    ``strided``: q, k and v are views into one wider buffer per token (leading strides not dense).
    """
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, heads, qk_dim + (8 if strided else 0), generator=g)[..., :qk_dim]
    kv = torch.randn(total_k, kv_heads, qk_dim + v_dim, generator=g)
    k, v = kv[..., :qk_dim], kv[..., qk_dim:]
    if not strided:
        k, v = k.contiguous(), v.contiguous()
    cu_q = torch.tensor([0] + [sum(s[0] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(s[1] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    q, k, v = (t.to(device=device, dtype=dtype) if t.dtype != dtype or device != "cpu" else t for t in (q, k, v))
    return [q, k, v, cu_q.to(device), cu_k.to(device), max(s[0] for s in seqs)]


def run_pair(inputs, causal=True, **kw):
    """(triton out, lse), (reference out, lse) for the same call; the reference runs first."""
    ref = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference", **kw)
    out = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="triton", **kw)
    return out, ref


# LSE tolerance, the same for every input dtype and recipe. Both sides compute lse = m + log(l) in float32
# from float32 scores of the same exact operands (16-bit inputs, or fake-quantized codes times float32
# factors) and the float32, unquantized P: the input dtype and the P / V quantization never reach it, so
# the differences are float32 summation order only. Scores: |ds| <~ sqrt(d) * 2^-24 * sum|q_i k_i| * scale,
# about 1e-6 at d <= 576 with unit-normal inputs (LSEs here are O(1..10)); the row sum: |dl| / l <~
# sqrt(n) * 2^-24 (n <= 16384 keys: 8e-6); the GPU's exp2 / log2 approximations add ~2^-22 relative.
# Measured under the interpreter: <= 5e-7. 1e-4 absolute + 1e-5 relative (as the decode tests use) keeps a
# margin of 10 over those bounds; a wrong mask or scale moves an LSE by far more.
LSE_ATOL, LSE_RTOL = 1e-4, 1e-5


def check(out, ref, tol):
    assert out[0].shape == ref[0].shape and out[0].dtype == ref[0].dtype
    assert out[1].shape == ref[1].shape and out[1].dtype == torch.float32
    err = rel_l2(out[0], ref[0])
    assert err < tol, f"relative L2 {err:.3g} >= {tol}"
    finite = torch.isfinite(ref[1])
    scale = ref[1][finite].abs().max().item() if finite.any() else 0.0
    assert same_lse(out[1], ref[1], LSE_ATOL + LSE_RTOL * scale)
    return err


# ------------------------------------------------------------------------------------------------
# CPU (Triton interpreter)


@cpu
@pytest.mark.parametrize("causal,kv_heads,block_n", [(True, 4, 16), (True, 2, 32), (True, 1, 64), (False, 4, 64),
                                                    (False, 2, 16), (False, 1, 32)])
def test_fp32_varlen(causal, kv_heads, block_n):
    inputs = make_inputs(VARLEN, 4, kv_heads, 32, 16, seed=block_n + kv_heads, strided=kv_heads == 2)
    check(*run_pair(inputs, causal=causal, block_n=block_n), FP32_TOL)


@cpu
def test_rows_with_no_visible_key_and_empty_keys():
    # sequence 0: 10 queries over 4 keys, causal rows 0..5 see nothing; sequence 1: queries, no keys
    inputs = make_inputs([(10, 4), (3, 0), (1, 17)], 2, 2, 16, 16, seed=1)
    out, ref = run_pair(inputs, causal=True, block_n=16)
    check(out, ref, FP32_TOL)
    empty = list(range(6)) + [10, 11, 12]
    assert torch.all(out[0][empty] == 0) and torch.all(out[1][:, empty] == float("-inf"))
    assert torch.isfinite(out[1][:, 6:10]).all() and torch.isfinite(out[1][:, 13]).all()


@cpu
def test_without_lse_and_with_float16():
    q, k, v, cu_q, cu_k, max_q = make_inputs(VARLEN, 2, 1, 32, 16, dtype=torch.float16, seed=5)
    ref = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, backend="reference")
    out = mla_core.mla_prefill(q, k, v, cu_q, cu_k, max_q, backend="triton")
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    assert rel_l2(out, ref) < HALF_TOL


QUANT_CASES = [(op, fmt) for op in ("q", "k", "p", "v") for fmt in ("fp8", "nvfp4")]


@cpu
@pytest.mark.parametrize("op,fmt", QUANT_CASES, ids=[f"{o}-{f}" for o, f in QUANT_CASES])
def test_each_operand_quantized(op, fmt):
    # amaxes other than the defaults exercise the per-tensor factors; P's amax 0.5 saturates large P
    amax = {"q": 4.0, "k": 3.0, "p": 0.5, "v": 3.5}[op]
    inputs = make_inputs(VARLEN, 2, 1, 32, 32, seed=len(op) + len(fmt) * 7 + ord(op[0]))
    kw = {f"{op}_quant": fmt, f"{op}_amax": amax, "block_n": 32}
    out, ref = run_pair(inputs, causal=True, **kw)
    check(out, ref, FP32_TOL)
    plain = mla_core.mla_prefill(*inputs, causal=True, backend="reference", block_n=32)
    assert rel_l2(out[0], plain) > 1e-3, "the quantization did not happen"


@cpu
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
@pytest.mark.parametrize("config", [0, 1], ids=["prepass", "fused"])
def test_recipes_both_configs_float16(recipe, config):
    """Every operand quantized, fp16 inputs, K/V codes from the pre-pass and quantized inside the loop."""
    from mla_core_triton import prefill
    inputs = make_inputs([(20, 36), (33, 33)], 4, 2, 48, 32, dtype=torch.float16, seed=11)
    kw = dict(RECIPES[recipe], block_n=16, v_amax=4.0, k_amax=4.0)
    problem, call = mla_core.specs.validate_prefill(*inputs, None, True, True, q_amax=None, p_amax=1.0,
                                                   sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
                                                   dense_recent_tokens=64, block_m=64, **kw)
    cfg = prefill.configs(problem)[config]
    assert cfg["kv_prepass"] == (config == 0)
    out = prefill.run(call, cfg)
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **kw)
    check(out, ref, HALF_TOL)
    assert rel_l2(out[0], ref[0]) < 2e-3  # fp16 output rounding only
    plain = mla_core.mla_prefill(*inputs, causal=True, backend="reference", block_n=16)
    assert rel_l2(out[0], plain) > 2e-2


@cpu
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("config", [0, 1], ids=["prepass", "fused"])
def test_bfloat16_every_recipe(recipe, config):
    """bf16 inputs under the interpreter, every recipe, both configs, and automatic dispatch (which picks
    triton for bf16 prefill): the interpreter's bf16 dot and arithmetic work on raw bit patterns, so the
    kernel's interpreter path computes in float32 where the GPU uses bf16 (exact either way)."""
    from mla_core_triton import prefill
    inputs = make_inputs([(20, 36), (0, 0), (33, 33)], 4, 2, 48, 32, dtype=torch.bfloat16, seed=13)
    kw = dict(dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant")), **RECIPES[recipe], block_n=16, v_amax=4.0,
              k_amax=4.5)
    problem, call = mla_core.specs.validate_prefill(*inputs, None, True, True, q_amax=None, p_amax=1.0,
                                                   sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
                                                   dense_recent_tokens=64, block_m=64, **kw)
    out = prefill.run(call, prefill.configs(problem)[config])
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **kw)
    check(out, ref, HALF_TOL)
    assert rel_l2(out[0], ref[0]) < 1e-3  # bf16 output rounding only (an element flips by one ulp, 2^-8)
    auto = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, **kw)
    check(auto, ref, HALF_TOL)
    if recipe != "bf16":
        plain = mla_core.mla_prefill(*inputs, causal=True, backend="reference", block_n=16)
        assert rel_l2(out[0], plain) > 2e-2


@cpu
@pytest.mark.parametrize("op,fmt", QUANT_CASES, ids=[f"{o}-{f}" for o, f in QUANT_CASES])
def test_bfloat16_each_operand_quantized(op, fmt):
    """One operand quantized on bf16 inputs: its codes meet raw bf16 operands (no float16 code dots)."""
    amax = {"q": 4.0, "k": 3.0, "p": 0.5, "v": 3.5}[op]
    inputs = make_inputs(VARLEN, 2, 1, 32, 32, dtype=torch.bfloat16, seed=ord(op[0]) + len(fmt))
    kw = {f"{op}_quant": fmt, f"{op}_amax": amax, "block_n": 32}
    out, ref = run_pair(inputs, causal=True, **kw)
    check(out, ref, HALF_TOL)
    assert rel_l2(out[0], ref[0]) < 1e-3  # bf16 output rounding only
    plain = mla_core.mla_prefill(*inputs, causal=True, backend="reference", block_n=32)
    assert rel_l2(out[0], plain) > 1e-3, "the quantization did not happen"


def _probe_values(fmt: str, amax: float) -> torch.Tensor:
    """[8, 64] float32 values at and next to every rounding decision of fmt (ties, one ulp either side).

    NVFP4: each 16-block holds its maximum and then multiples t * s of its block scale s for the E2M1
    thresholds t (exact ties when g is a power of two); FP8: E4M3 midpoints times the scale.
    """
    def around(v):
        return [torch.nextafter(v, torch.tensor(-1.0)), v, torch.nextafter(v, torch.tensor(8e3))]

    vals = []
    if fmt == "fp8":
        scale = torch.tensor(numerics.fp8_scale(amax))
        mids = [(8 + m + 0.5) * 2.0 ** (e - 3) for e in range(-6, 9) for m in range(8)]
        mids += [k * 2.0 ** -10 for k in (1, 3)]  # E4M3 subnormal midpoints
        for mid in mids:
            vals += around(torch.tensor(mid, dtype=torch.float32) * scale)
        x = torch.stack(vals)
    else:
        g = torch.tensor(numerics.nvfp4_global_scale(amax))
        for code in (1.0, 1.125, 1.75, 3.0, 0.5, 0.0390625, 240.0, 448.0):
            s = torch.tensor(code, dtype=torch.float32) * g
            block = [torch.tensor(6.0) * s]
            for t in (0.25, 0.75, 1.25, 1.75, 2.5):
                block += around(torch.tensor(t) * s)
            vals += block
        x = torch.stack(vals)
    x = torch.cat([x, torch.rand(512 - x.numel(), generator=torch.Generator().manual_seed(3)) * x.max()])
    return x[:512].reshape(8, 64).float()


@triton.jit
def _codes_probe(x_ptr, out_ptr, f, rf, FMT: tl.constexpr, NONNEG: tl.constexpr):
    offs = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 64)[None, :]
    x = tl.load(x_ptr + offs)
    if FMT == 1:
        y = prefill_kernels._fp8_codes(x, f, rf, tl.float32, False)
    else:
        y = prefill_kernels._nvfp4_codes(x, f, rf, 8, 64, 1, tl.float32, NONNEG, False)
    tl.store(out_ptr + offs, y)


@cpu
@pytest.mark.parametrize("fmt,amax", [("fp8", 1.0), ("fp8", 0.37), ("nvfp4", 1.0), ("nvfp4", 2688.0 / 1024),
                                      ("nvfp4", 0.37)])
@pytest.mark.parametrize("sign", [1, -1])
def test_division_free_rounding_is_exact(fmt, amax, sign):
    """The kernel's codes (reciprocal products + one fma correction, add-magic E2M1) equal numerics'
    division-based QDQ bit for bit, at ties and one ulp either side of every rounding decision."""
    x = _probe_values(fmt, amax) * sign
    f = numerics.fp8_scale(amax) if fmt == "fp8" else numerics.nvfp4_global_scale(amax)
    out = torch.full_like(x, float("nan"))
    _codes_probe[(1,)](x, out, f, prefill_kernels._recip(f), FMT=1 if fmt == "fp8" else 2, NONNEG=sign > 0)
    if fmt == "fp8":
        ref = numerics.round_e4m3(x / f)
    else:  # codes e2m1(x / s) * block with s = block * g, as numerics.qdq_nvfp4 rounds them
        blocks = x.reshape(8, 4, 16)
        block = numerics.round_e4m3(blocks.abs().amax(-1, keepdim=True) / numerics.E2M1_MAX / f)
        s = block * f
        ref = torch.where(s == 0, 0.0, numerics.round_e2m1(blocks / torch.where(s == 0, 1.0, s)) * block)
        ref = ref.reshape(8, 64)
    assert torch.equal(out, ref)


def _every_gpu_config(seqs, heads, kv_heads, qk_dim, v_dim, recipe, block_n, device="cpu"):
    """(config, out, ref, plain) for every config the GPU would try for this problem, bf16 inputs.

    On CPU (the interpreter) a config that keeps bf16 dots (codes_fp16 off) runs on float16 inputs,
    since the interpreter multiplies bf16 dot operands as raw bits; the float16 dots on codes keep it exact.
    """
    import dataclasses
    from mla_core_triton import prefill
    kw = dict(RECIPES[recipe], block_n=block_n, k_amax=4.5, v_amax=4.0)
    cases = {}
    for dtype in (torch.bfloat16, torch.float16):
        inputs = make_inputs(seqs, heads, kv_heads, qk_dim, v_dim, dtype=dtype, seed=qk_dim + block_n, device=device)
        problem, call = mla_core.specs.validate_prefill(*inputs, None, True, True, q_amax=None, p_amax=1.0,
                                                       sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
                                                       dense_recent_tokens=64, block_m=64, **kw)
        ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **kw)
        plain = mla_core.mla_prefill(*inputs, causal=True, backend="reference", block_n=block_n)
        cases[dtype] = (problem, call, ref, plain)
    results = []
    for cfg in prefill.configs(dataclasses.replace(cases[torch.bfloat16][0], device="cuda")):
        bf16_dots = not cfg.get("codes_fp16", True)
        _, call, ref, plain = cases[torch.float16 if bf16_dots and device == "cpu" else torch.bfloat16]
        results.append((cfg, prefill.run(call, cfg), ref, plain))
    return results


@cpu
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_every_gpu_config(recipe):
    """Each config configs() lists for a causal GQA problem on the GPU gives the reference's result."""
    results = _every_gpu_config([(20, 36), (33, 33)], 4, 2, 48, 32, recipe, 32)
    assert len(results) >= 5
    for cfg, out, ref, plain in results:
        check(out, ref, HALF_TOL)
        assert rel_l2(out[0], ref[0]) < 1e-4, cfg  # float32-level differences under the output rounding
        assert rel_l2(out[0], plain) > 2e-2, cfg


@cpu
def test_every_gpu_config_absorbed_576_512():
    for cfg, out, ref, plain in _every_gpu_config([(9, 20)], 2, 1, 576, 512, "nvfp4", 16):
        check(out, ref, HALF_TOL)
        assert rel_l2(out[0], ref[0]) < 1e-4, cfg
        assert rel_l2(out[0], plain) > 2e-2, cfg


@cpu
@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
def test_tiny_and_huge_amax_take_the_division_path(fmt):
    """Per-tensor factors whose reciprocals leave float32's normal range quantize by division, same results."""
    from mla_core_triton import prefill
    assert prefill._hw_mode(False, [(1, 1e-20)]) == 2 and prefill._hw_mode(True, [(2, 1.0 / 2688)]) == 1
    inputs = make_inputs(VARLEN, 2, 1, 32, 32, seed=21)
    # 2e-38: the smallest amaxes validation accepts are float32 normals (>= 2^-126 ~ 1.18e-38)
    for kw in (dict(k_quant=fmt, k_amax=2e-38, v_quant=fmt, v_amax=1e30), dict(p_quant=fmt, p_amax=1e-36)):
        out, ref = run_pair(inputs, causal=True, block_n=32, **kw)
        check(out, ref, FP32_TOL)


NM_CASES = [(2, 4, 0, 4, True, 16), (2, 4, 3, 0, False, 32), (4, 8, 5, 9, True, 64), (3, 8, 0, 0, False, 16),
            (1, 4, 2, 6, True, 32)]


@cpu
@pytest.mark.parametrize("n,m,sinks,recent,causal,block_n", NM_CASES)
def test_nm_sparsity(n, m, sinks, recent, causal, block_n):
    # a one-query sequence stays dense
    inputs = make_inputs([(17, 40), (1, 30), (40, 70)], 2, 2, 32, 16, seed=n * 10 + m)
    kw = dict(sparsity_n=n, sparsity_m=m, dense_sink_tokens=sinks, dense_recent_tokens=recent, block_n=block_n)
    out, ref = run_pair(inputs, causal=causal, **kw)
    check(out, ref, FP32_TOL)
    dense = mla_core.mla_prefill(*inputs, causal=causal, backend="reference", block_n=block_n)
    assert rel_l2(out[0], dense) > 1e-2, "the sparsity did not happen"


@cpu
def test_mla_head_dims_nvfp4():
    """192/128 (two K tile widths, 128 + 64) with every operand NVFP4, GQA."""
    inputs = make_inputs([(9, 9), (4, 20)], 4, 2, 192, 128, seed=2)
    out, ref = run_pair(inputs, causal=True, block_n=16, **RECIPES["nvfp4"])
    check(out, ref, FP32_TOL)


# ------------------------------------------------------------------------------------------------
# GPU


def _gpu_case(seqs, heads, kv_heads, qk_dim, v_dim, recipe, causal=True, seed=0, **kw):
    inputs = make_inputs(seqs, heads, kv_heads, qk_dim, v_dim, dtype=torch.bfloat16, seed=seed, device="cuda")
    kw = dict(RECIPES[recipe], **kw)
    out, ref = run_pair(inputs, causal=causal, **kw)
    check(out, ref, HALF_TOL)
    if recipe != "bf16":
        plain = mla_core.mla_prefill(*inputs, causal=causal, backend="triton", block_n=kw.get("block_n", 64))
        assert rel_l2(out[0], plain) > 2e-2


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
def test_gpu_mla_dims_4096(recipe):
    _gpu_case([(4096, 4096), (1000, 3000), (0, 5)], 128, 128, 192, 128, recipe)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_gpu_long_16384(recipe):
    _gpu_case([(16384, 16384)], 16, 16, 192, 128, recipe, seed=3)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,block_n", [(True, 32), (False, 128), (True, 128)])
def test_gpu_block_n_and_gqa(causal, block_n):
    _gpu_case([(777, 2048), (1, 100), (300, 300)], 128, 16, 192, 128, "fp8", causal=causal, block_n=block_n, seed=block_n)


@pytest.mark.gpu
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_gpu_every_config(recipe):
    """Every config configs() lists (what --all-configs times), at the benchmark's dims."""
    for cfg, out, ref, plain in _every_gpu_config([(1024, 1024), (300, 700)], 128, 128, 192, 128, recipe, 64,
                                                  device="cuda"):
        check(out, ref, HALF_TOL)
        assert rel_l2(out[0], plain) > 2e-2, cfg


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_absorbed_576_512(heads):
    _gpu_case([(1024, 2048), (64, 64)], heads, 1, 576, 512, "nvfp4", seed=heads)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", [(2, 4), (4, 8)])
def test_gpu_nm_sparsity(n, m):
    _gpu_case([(2048, 4096), (1, 64)], 128, 128, 192, 128, "bf16", sparsity_n=n, sparsity_m=m, dense_sink_tokens=16,
              dense_recent_tokens=64, seed=n + m)
