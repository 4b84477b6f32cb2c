"""Triton decode against the reference backend.

CPU: the kernels run under ``TRITON_INTERPRET=1`` (set by conftest.py) on small widths and fp16/fp32/bf16
inputs (the kernel's interpreter path avoids the interpreter's bf16 and fp8 traps). GPU (``pytest -m gpu``):
DeepSeek sizes (kv_lora_rank 512, rope 64, heads 16 and 128, page sizes 1/16/64, lengths up to 32768).
Unreached cache rows hold NaN and block-table entries past each length hold out-of-range garbage, so a
kernel that reads them fails. Quantized cases also show the result is far from the unquantized one.
"""
from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

import mla_core
from mla_core import numerics
from mla_core_triton.quant import div_by_block_scale, round_e2m1
from paged_inputs import paged_decode_inputs

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu = pytest.mark.skipif(not INTERPRETED, reason="CPU variants run the Triton interpreter (TRITON_INTERPRET=1)")
gpu = pytest.mark.gpu
RECIPES = {"bf16": (None, None, None), "fp8": ("fp8", "fp8", "fp8"), "nvfp4": ("nvfp4", "nvfp4", "nvfp4")}


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output and split buffer the triton kernels get starts as NaN (an unwritten element fails)."""
    from mla_core_triton import decode
    monkeypatch.setattr(decode, "_new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))


def make_inputs(lengths, heads, rank, rope, page_size, dtype, q_dtype=None, seed=0, device="cpu"):
    """q [B, H, rank + rope] and a poisoned paged cache, table, lengths (tests/paged_inputs.py)."""
    return paged_decode_inputs(lengths, heads, rank + rope, page_size, dtype, q_dtype, seed, device)


def rel_l2(out, ref):
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def decode(backend, inputs, rank, rope, **kw):
    q, cache, table, lens = inputs
    kw.setdefault("softmax_scale", (rank + rope) ** -0.5)
    return mla_core.mla_attention_decode(q, cache, table, lens, kv_lora_rank=rank, qk_rope_head_dim=rope,
                                         backend=backend, **kw)


def check(inputs, rank, rope, tol, quantized=False, **kw):
    """Triton vs reference: out and LSE; with ``quantized`` also far from the unquantized reference."""
    out, lse = decode("triton", inputs, rank, rope, **kw)
    ref, ref_lse = decode("reference", inputs, rank, rope, **kw)
    assert out.dtype == ref.dtype and out.shape == ref.shape
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    lens = inputs[3].to(out.device)
    empty = lens == 0
    assert (out[empty] == 0).all() and (lse[empty] == float("-inf")).all()
    if (~empty).any():
        err = rel_l2(out[~empty], ref[~empty])
        assert err < tol, f"rel L2 {err:.2e} >= {tol}"
        assert torch.allclose(lse[~empty], ref_lse[~empty], rtol=1e-5, atol=1e-4)
        if quantized:
            plain = {k: v for k, v in kw.items() if not k.endswith(("_qdq", "_qdq_amax"))}
            unq, _ = decode("reference", inputs, rank, rope, **plain)
            far = rel_l2(out[~empty], unq[~empty])
            assert far > 10 * max(err, tol / 10), f"quantized output {far:.2e} from the unquantized one"
    return out


# ---------------------------------------------------------------------------------------------- CPU


@cpu
@pytest.mark.parametrize("k_qdq", [None, "fp8", "nvfp4"])
@pytest.mark.parametrize("v_qdq", [None, "fp8", "nvfp4"])
@pytest.mark.parametrize("p_qdq", [None, "fp8", "nvfp4"])
def test_formats_cpu(k_qdq, v_qdq, p_qdq):
    inputs = make_inputs([33, 100, 0], heads=4, rank=64, rope=16, page_size=16, dtype=torch.float16)
    quantized = any((k_qdq, v_qdq, p_qdq))
    check(inputs, 64, 16, 1e-5, quantized=quantized, k_qdq=k_qdq, v_qdq=v_qdq, p_qdq=p_qdq,
          num_kv_splits=3, out_dtype=torch.float32)


@cpu
@pytest.mark.parametrize("amaxes", [(2.0, 3.5, 0.5), (7.0, 0.7, 1.0)])
@pytest.mark.parametrize("recipe", ["fp8", "nvfp4"])
def test_amax_cpu(recipe, amaxes):
    k, v, p = RECIPES[recipe]
    inputs = make_inputs([17, 100], heads=3, rank=64, rope=16, page_size=16, dtype=torch.float16)
    check(inputs, 64, 16, 1e-5, quantized=True, k_qdq=k, v_qdq=v, p_qdq=p, k_qdq_amax=amaxes[0],
          v_qdq_amax=amaxes[1], p_qdq_amax=amaxes[2], out_dtype=torch.float32)


@cpu
@pytest.mark.parametrize("dtype,q_dtype,out_dtype,tol", [
    (torch.float32, None, None, 1e-5),
    (torch.float16, torch.float32, torch.float32, 1e-5),
    (torch.bfloat16, torch.float32, torch.float32, 1e-5),
    (torch.bfloat16, None, torch.float32, 1e-5),
    (torch.bfloat16, None, None, 1e-2),
    (torch.float16, None, torch.bfloat16, 1e-2),
])
@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
def test_dtypes_cpu(dtype, q_dtype, out_dtype, tol, recipe):
    k, v, p = RECIPES[recipe]
    inputs = make_inputs([1, 100], heads=5, rank=64, rope=16, page_size=16, dtype=dtype, q_dtype=q_dtype)
    out = check(inputs, 64, 16, tol, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p, out_dtype=out_dtype)
    assert out.dtype == (out_dtype or dtype)


@cpu
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [1, 16])
@pytest.mark.parametrize("splits", [1, 32, "auto"])
def test_shapes_cpu(page_size, heads, splits):
    inputs = make_inputs([0, 1, 17, 33, 100][: 3 if heads == 16 else 5], heads=heads, rank=64, rope=16,
                         page_size=page_size, dtype=torch.float16, seed=heads + page_size)
    check(inputs, 64, 16, 1e-5, quantized=True, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="fp8",
          num_kv_splits=splits, out_dtype=torch.float32)


@cpu
def test_launch_plans_follow_every_field(monkeypatch):
    """decode.run caches its launch constants per key: calls alternating in one field each (softmax scale, a QDQ
    amax, the split count in the call or the config, the LSE, the output dtype, the table width) each match the
    reference, and a repeat adds no plan."""
    from mla_core_triton import decode as kernels
    monkeypatch.setattr(kernels, "_PLANS", {})
    inputs = make_inputs([9, 40], heads=3, rank=32, rope=16, page_size=4, dtype=torch.float16, seed=31)
    wide = (*inputs[:2], torch.cat([inputs[2], inputs[2]], 1), inputs[3])
    fp8 = dict(k_qdq="fp8", v_qdq="fp8", p_qdq="fp8", out_dtype=torch.float32)
    calls = [(inputs, dict(fp8, k_qdq_amax=2.0, num_kv_splits=3)), (inputs, dict(fp8, k_qdq_amax=5.0, num_kv_splits=3)),
             (inputs, dict(fp8, k_qdq_amax=5.0, num_kv_splits=1)), (inputs, dict(softmax_scale=0.3)),
             (inputs, dict(softmax_scale=0.1)), (inputs, dict(softmax_scale=0.1, out_dtype=torch.float32)),
             (wide, dict(softmax_scale=0.1))]
    for round_ in range(2):
        for case, kw in calls:
            check(case, 32, 16, 1e-5 if kw.get("out_dtype") else 1e-2, quantized="k_qdq" in kw, **kw)
        assert len(kernels._PLANS) == len(calls)
    out, lse = decode("triton", inputs, 32, 16, softmax_scale=0.1, return_lse=False)
    assert lse is None and torch.equal(out, decode("triton", inputs, 32, 16, softmax_scale=0.1)[0])
    assert len(kernels._PLANS) == len(calls) + 1
    from mla_core import specs                                           # one call, configs of other split counts
    problem, call = specs.validate_decode(
        *inputs, softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=16, page_size=None, num_kv_splits="auto",
        k_qdq="fp8", k_qdq_amax=2.0, v_qdq="fp8", v_qdq_amax=2.0, p_qdq="fp8", p_qdq_amax=1.0, return_lse=True,
        out_dtype=torch.float32)
    for splits in (1, 4, 1, 4):
        config = dict(kernels.configs(problem)[0], num_kv_splits=splits)
        ref = decode("reference", inputs, 32, 16, softmax_scale=0.1, k_qdq="fp8", k_qdq_amax=2.0, v_qdq="fp8",
                     v_qdq_amax=2.0, p_qdq="fp8", num_kv_splits=splits, out_dtype=torch.float32)
        got = kernels.run(call, config)
        assert rel_l2(got[0], ref[0]) < 1e-5 and torch.allclose(got[1], ref[1], rtol=1e-5, atol=1e-4)
    assert len(kernels._PLANS) == len(calls) + 3
    monkeypatch.setattr(kernels, "_PLANS_MAX", 2)                       # full: cleared, still right
    check(inputs, 32, 16, 1e-2, softmax_scale=0.2)
    assert len(kernels._PLANS) == 1


def _dot_shape(config):
    return config.get("block_h", 16), config.get("v_split", 1)


def assert_same_numbers(got, base, config, base_config):
    """Configs never change numbers: bit for bit on the GPU, and under the interpreter too unless the two
    configs' dots differ in shape (``block_h`` rows, ``v_split`` columns). The interpreter's ``tl.dot`` is
    numpy's matmul, whose summation order (OpenBLAS kernel blocking, machine dependent) changes with the
    matrix shape, which moves a float32 sum by an ulp or two: there the check is float32 rounding level
    (rel-L2 1e-6)."""
    for g, b in zip(got, base):
        if INTERPRETED and _dot_shape(config) != _dot_shape(base_config):
            fin = torch.isfinite(b)
            assert torch.equal(fin, torch.isfinite(g)) and torch.equal(g[~fin], b[~fin]), config
            assert rel_l2(g[fin], b[fin]) < 1e-6, config
        else:
            assert torch.equal(g, b), config


@cpu
@pytest.mark.parametrize("heads", [16, 64])
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
def test_configs_keep_numerics_cpu(recipe, heads):
    """Every listed config (and larger tiles: several 32-key tiles per step) reproduces the first config's
    numbers (assert_same_numbers; the other tests check the default config against the reference)."""
    from mla_core_triton import decode as kernels
    from mla_core.specs import validate_decode
    k, v, p = RECIPES[recipe]
    inputs = make_inputs([70, 33], heads=heads, rank=64, rope=16, page_size=16, dtype=torch.float16, seed=heads)
    kw = dict(softmax_scale=0.1, kv_lora_rank=64, qk_rope_head_dim=16, page_size=None, num_kv_splits=2,
              k_qdq=k, k_qdq_amax=None, v_qdq=v, v_qdq_amax=None, p_qdq=p, p_qdq_amax=1.0,
              return_lse=True, out_dtype=torch.float32)
    problem, call = validate_decode(*inputs, **kw)
    configs = kernels.configs(problem)
    configs += [{"block_h": 16, "sub_tiles": 2, "num_warps": 4, "num_stages": 1}]
    base, base_lse = kernels.run(call, configs[0])
    assert not torch.isnan(base).any()
    # the interpreter ignores warps and stages: run each distinct remaining choice once
    seen = {}
    for config in configs[1:]:
        seen.setdefault(tuple(sorted((k_, v_) for k_, v_ in config.items() if k_ not in ("num_warps", "num_stages"))),
                        config)
    for config in seen.values():
        assert_same_numbers(kernels.run(call, config), (base, base_lse), config, configs[0])


@cpu
@pytest.mark.parametrize("page_size,dtype,splits", [(1, torch.bfloat16, 1), (16, torch.float16, 3)])
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
def test_v_split_kv_prepass_cpu(recipe, page_size, dtype, splits):
    """v_split (V / output columns across programs) and kv_prepass (K/V codes from a pre-pass) give the
    default config's numbers (assert_same_numbers), with lengths 0/1/17/100 (a NaN row past each length, garbage
    table entries), one split (direct output) and several (combine kernel), bf16 and fp16 dots; fp8 with
    distinct K/V scales takes the separate V-code buffer."""
    from mla_core_triton import decode as kernels
    from mla_core.specs import validate_decode
    k, v, p = RECIPES[recipe]
    amax = (2.0, 3.5) if recipe == "fp8" and page_size == 1 else (None, None)
    lengths = [0, 1, 17, 100]
    inputs = make_inputs(lengths, heads=16, rank=64, rope=16, page_size=page_size, dtype=dtype, seed=page_size)
    kw = dict(softmax_scale=0.1, num_kv_splits=splits, k_qdq=k, k_qdq_amax=amax[0], v_qdq=v, v_qdq_amax=amax[1],
              p_qdq=p, p_qdq_amax=1.0, out_dtype=torch.float32)
    problem, call = validate_decode(*inputs, kv_lora_rank=64, qk_rope_head_dim=16, page_size=None, return_lse=True,
                                    **kw)
    default = {"block_h": 16, "sub_tiles": 1, "num_warps": 4, "num_stages": 2}
    base, base_lse = kernels.run(call, default)
    ref, ref_lse = decode("reference", inputs, 64, 16, **kw)
    assert rel_l2(base[1:], ref[1:]) < 1e-5 and (base[0] == 0).all() and (base_lse[0] == float("-inf")).all()
    assert torch.allclose(base_lse[1:], ref_lse[1:], rtol=1e-5, atol=1e-4)
    variants = [dict(default, v_split=4, sub_tiles=2, prefetch_pages=True), dict(default, kv_prepass=True),
                dict(default, kv_prepass=True, v_split=2, prefetch_pages=True)]
    for config in variants:
        assert_same_numbers(kernels.run(call, config), (base, base_lse), config, default)


def test_configs_list_variants():
    """configs(): v_split leads at batch 1 (too few programs for the SMs), never at batch 32; kv_prepass
    leads for quantized K/V at 128 heads, is absent for bf16 and at 16 heads."""
    from mla_core_triton.decode import configs
    def problem(heads, batch, fmt):
        return dict(heads=heads, dtype="bfloat16", q_dtype="bfloat16", k_qdq=fmt, v_qdq=fmt, p_qdq=fmt,
                    batch=batch, num_kv_splits=32, max_len=8192)
    assert configs(problem(16, 1, None))[0]["v_split"] == 4
    first, second = configs(problem(128, 1, "nvfp4"))[:2]
    assert second == dict(block_h=64, sub_tiles=1, num_warps=8, num_stages=2, kv_prepass=True, v_split=2)
    assert first == dict(second, prefetch_pages=True)
    for fmt in (None, "fp8", "nvfp4"):
        assert all("v_split" not in c for c in configs(problem(16, 32, fmt)) + configs(problem(128, 32, fmt)))
        assert all("kv_prepass" not in c for c in configs(problem(16, 32, fmt)))
    assert configs(problem(128, 32, "nvfp4"))[0].get("kv_prepass") and configs(problem(128, 32, "fp8"))[1].get("kv_prepass")
    assert all("kv_prepass" not in c for c in configs(problem(128, 32, None)))


@triton.jit
def _rounding_kernel(x_ptr, s_ptr, e2m1_ptr, quot_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    x = tl.load(x_ptr + i)
    s = tl.load(s_ptr + i)
    tl.store(e2m1_ptr + i, round_e2m1(x))
    tl.store(quot_ptr + i, div_by_block_scale(x, s, tl.math.div_rn(tl.full(s.shape, 1.0, tl.float32), s), False))


@cpu
def test_division_free_rounding_cpu():
    """quant.round_e2m1 (magic-number rounding) equals numerics.round_e2m1 on every midpoint and random
    values, and div_by_block_scale (reciprocal + Markstein correction) equals the correctly rounded x / s."""
    g = torch.Generator().manual_seed(3)
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.0, 1e-30, 100.0])
    x = torch.cat([mids, -mids, torch.randn(4096 - 24, generator=g) * 4])
    s = (torch.rand(4096, generator=g) * 3 + 1e-3).to(torch.bfloat16).float()
    e2m1, quot = torch.empty(4096), torch.empty(4096)
    _rounding_kernel[(1,)](x, s, e2m1, quot, N=4096)
    assert torch.equal(e2m1, numerics.round_e2m1(x))
    assert torch.equal(quot, x / s)  # torch's float32 division is correctly rounded


@cpu
@pytest.mark.parametrize("rank,rope", [(48, 0), (32, 8)])
def test_other_widths_cpu(rank, rope):
    """Widths that are not powers of two, no RoPE part, and a partial last NVFP4 block of K."""
    inputs = make_inputs([50, 3], heads=2, rank=rank, rope=rope, page_size=16, dtype=torch.float16)
    check(inputs, rank, rope, 1e-5, quantized=True, k_qdq="nvfp4", v_qdq="fp8", p_qdq="nvfp4",
          out_dtype=torch.float32)


@cpu
def test_deepseek_width_cpu():
    inputs = make_inputs([40, 0], heads=16, rank=512, rope=64, page_size=16, dtype=torch.float16)
    check(inputs, 512, 64, 1e-5, quantized=True, k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4",
          num_kv_splits=2, out_dtype=torch.float32)


@cpu
def test_out_of_range_pages_are_absent_cpu(monkeypatch):
    """With content checks off, a page index outside the cache within a length acts as absent keys."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    q, cache, table, lens = make_inputs([60, 50], heads=4, rank=64, rope=16, page_size=16, dtype=torch.float16)
    table[0, 1] = cache.shape[0] + 5
    table[1, 0] = -1
    check([q, cache, table, lens], 64, 16, 1e-5, k_qdq="fp8", v_qdq="nvfp4", out_dtype=torch.float32)
    # the pre-pass gives absent keys codes 0 and the main loop still masks them: the same bits
    from mla_core_triton import decode as kernels
    from mla_core.specs import validate_decode
    _, call = validate_decode(q, cache, table, lens, softmax_scale=0.1, kv_lora_rank=64, qk_rope_head_dim=16,
                              page_size=None, num_kv_splits=2, k_qdq="fp8", k_qdq_amax=None, v_qdq="nvfp4",
                              v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=torch.float32)
    base = kernels.run(call, {"block_h": 16})
    for config in ({"block_h": 16, "kv_prepass": True}, {"block_h": 16, "kv_prepass": True, "v_split": 2}):
        assert all(torch.equal(a, b) for a, b in zip(kernels.run(call, config), base)), config


@cpu
def test_no_lse_int64_indices_cpu():
    q, cache, table, lens = make_inputs([30, 70], heads=2, rank=64, rope=16, page_size=16, dtype=torch.float16)
    inputs = [q, cache, table.long(), lens.long()]
    out, lse = decode("triton", inputs, 64, 16, return_lse=False)
    ref, _ = decode("reference", inputs, 64, 16, return_lse=False)
    assert lse is None and rel_l2(out, ref) < 1e-2


# ---------------------------------------------------------------------------------------------- GPU


@gpu
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size,lengths", [(1, [0, 1, 17, 1000]), (16, [33, 8192, 5]), (64, [32768, 100])])
def test_deepseek_gpu(recipe, heads, page_size, lengths):
    k, v, p = RECIPES[recipe]
    inputs = make_inputs(lengths, heads=heads, rank=512, rope=64, page_size=page_size, dtype=torch.bfloat16,
                         device="cuda")
    check(inputs, 512, 64, 1e-2, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p)
    check(inputs, 512, 64, 1e-2, k_qdq=k, v_qdq=v, p_qdq=p, num_kv_splits="auto", out_dtype=torch.float32)


@gpu
@pytest.mark.parametrize("recipe", ["bf16", "nvfp4"])
@pytest.mark.parametrize("heads", [16, 128])
def test_fp32_q_gpu(recipe, heads):
    k, v, p = RECIPES[recipe]
    inputs = make_inputs([3000, 17], heads=heads, rank=512, rope=64, page_size=16, dtype=torch.bfloat16,
                         q_dtype=torch.float32, device="cuda")
    check(inputs, 512, 64, 1e-2, quantized=recipe != "bf16", k_qdq=k, v_qdq=v, p_qdq=p, out_dtype=torch.float32)


@gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_dtypes_gpu(dtype):
    inputs = make_inputs([2000, 1], heads=16, rank=512, rope=64, page_size=16, dtype=dtype, device="cuda")
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    check(inputs, 512, 64, tol, quantized=True, k_qdq="fp8", v_qdq="nvfp4", p_qdq="nvfp4")


@gpu
def test_configs_gpu():
    """Every listed config of a 128-head problem compiles and gives the same numbers."""
    from mla_core_triton import decode as kernels
    from mla_core.specs import validate_decode
    inputs = make_inputs([700, 64], heads=128, rank=512, rope=64, page_size=16, dtype=torch.bfloat16,
                         device="cuda")
    kw = dict(softmax_scale=0.04, kv_lora_rank=512, qk_rope_head_dim=64, page_size=None, num_kv_splits=4,
              k_qdq="nvfp4", k_qdq_amax=None, v_qdq="nvfp4", v_qdq_amax=None, p_qdq="nvfp4", p_qdq_amax=1.0,
              return_lse=True, out_dtype=torch.float32)
    problem, call = validate_decode(*inputs, **kw)
    configs = kernels.configs(problem)
    base, _ = kernels.run(call, configs[0])
    for config in configs[1:6]:
        out, _ = kernels.run(call, config)
        assert rel_l2(out, base) < 1e-5, config


@gpu
@pytest.mark.parametrize("recipe", ["bf16", "fp8", "nvfp4"])
@pytest.mark.parametrize("heads,batch", [(16, 1), (128, 1), (128, 4)])
def test_v_split_kv_prepass_gpu(recipe, heads, batch):
    """On the device (wgmma / mma tiles of other widths) the variants still give the default's bits."""
    from mla_core_triton import decode as kernels
    from mla_core.specs import validate_decode
    k, v, p = RECIPES[recipe]
    lengths = [1000, 0, 17, 4097][:batch] if batch > 1 else [3001]
    inputs = make_inputs(lengths, heads=heads, rank=512, rope=64, page_size=16, dtype=torch.bfloat16, device="cuda")
    problem, call = validate_decode(*inputs, softmax_scale=0.04, kv_lora_rank=512, qk_rope_head_dim=64, page_size=None,
                                    num_kv_splits=32, k_qdq=k, k_qdq_amax=None, v_qdq=v, v_qdq_amax=None, p_qdq=p,
                                    p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    for block_h, warps, stages in [(16, 4, 3), (64, 8, 2)]:
        base_cfg = {"block_h": block_h, "sub_tiles": 1, "num_warps": warps, "num_stages": stages}
        base, base_lse = kernels.run(call, base_cfg)
        for extra in ({"v_split": 2}, {"v_split": 4}, {"kv_prepass": True}, {"kv_prepass": True, "v_split": 2},
                      {"prefetch_pages": True}):
            out, lse = kernels.run(call, dict(base_cfg, **extra))
            assert torch.equal(out, base) and torch.equal(lse, base_lse), (base_cfg, extra)


@cpu
@pytest.mark.parametrize("splits", [40, 128])
def test_many_splits_cpu(splits):
    """Above the old cap of 32 (numerics.MAX_KV_SPLITS is 128): lengths 0, 1, one 32-key tile per split at 128
    (4096 keys) and a ragged one; P quantized (the schedule shows) against the reference at the same count."""
    assert splits <= numerics.MAX_KV_SPLITS
    inputs = make_inputs([0, 1, 1000, 4096], heads=2, rank=32, rope=16, page_size=64, dtype=torch.float16,
                         seed=splits)
    check(inputs, 32, 16, 1e-5, quantized=True, p_qdq="nvfp4", num_kv_splits=splits, out_dtype=torch.float32)
