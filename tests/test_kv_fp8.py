"""FP8 KV cache decode: float8_e4m3fn codes with a per-tensor ``kv_scale`` (docs/numerics.md, "FP8 KV cache").

The reference against an independent float64 oracle written here from the contract (values
``code * kv_scale``, exact in float64; P rounded to q's dtype); triton against the reference under the
interpreter on small shapes with NaN-poisoned outputs and caches (unreached rows are NaN codes, table entries
past each length garbage); validation; the custom op and its fake kernel; on the GPU (``-m gpu``) DeepSeek
sizes and CUDA-graph capture.
"""
from __future__ import annotations

import math
import os

import pytest
import torch
import triton
import triton.language as tl

import mla_core
from mla_core import MLAInputError, numerics, specs
from mla_core.accuracy import rel_l2
from mla_core_triton.decode import _e4m3_to_dot
from paged_inputs import paged_decode_inputs
from reference_math import NEG_INF, _lse_merge, _online_softmax, decode_request_rows, same_lse

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
cpu = pytest.mark.skipif(not INTERPRETED, reason="CPU variants run the Triton interpreter (TRITON_INTERPRET=1)")
gpu = pytest.mark.gpu
FP8 = torch.float8_e4m3fn
KV_SCALE = 0.0123  # not a power of two: code * kv_scale rounds in float32


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output and split buffer the triton kernels get starts as NaN (an unwritten element fails)."""
    from mla_core_triton import decode
    monkeypatch.setattr(decode, "_new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))


def fp8_inputs(lengths, heads, rank, rope, page_size, q_dtype=torch.bfloat16, kv_scale=KV_SCALE, seed=0,
               device="cpu"):
    """``(q, codes, table, lens)``: the codes of random values at ``kv_scale`` (codes up to ~350); rows no
    request reaches hold NaN codes and table entries past each length garbage (tests/paged_inputs.py)."""
    q, cache, table, lens = paged_decode_inputs(lengths, heads, rank + rope, page_size, torch.float32, q_dtype, seed)
    codes = (cache / kv_scale).clamp(-448, 448).to(FP8)  # NaN stays NaN (code 0x7F)
    return [t.to(device) for t in (q, codes, table, lens)]


def run(backend, inputs, rank, rope, kv_scale=KV_SCALE, **kw):
    q, codes, table, lens = inputs
    kw.setdefault("softmax_scale", (rank + rope) ** -0.5)
    return mla_core.mla_decode(q, codes, table, lens, kv_lora_rank=rank, qk_rope_head_dim=rope, kv_scale=kv_scale,
                               backend=backend, **kw)


# ---------------------------------------------------------------------------------------------- float64 oracle


def fp8_decode_math(q, codes, kv_scale, block_table, seq_lens, *, softmax_scale, kv_lora_rank, num_kv_splits,
                    k_qdq=None, k_amax=None, v_qdq=None, v_amax=None, p_qdq=None, p_amax=1.0):
    """Float64 decode over an FP8 cache: returns (out [batch, heads, kv_lora_rank], lse [batch, heads]) float64.

    Values ``code * kv_scale`` exactly (float64: 4 + 24 significant bits); K / V fake quantization, when
    asked, of those values as float32 (the contract quantizes the float32 values); P rounded to q's dtype
    per 32-key tile; ``ceil(ceil(L/32) / splits)`` tiles per split, splits merged by log-sum-exp.
    """
    values = codes.double() * kv_scale
    batch, heads = q.shape[0], q.shape[1]
    out = torch.zeros(batch, heads, kv_lora_rank, dtype=torch.float64)
    lse = torch.full((batch, heads), NEG_INF, dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        rows = decode_request_rows(values, block_table[b], length)
        k = rows if k_qdq is None else numerics.qdq(rows.float(), k_qdq, k_amax, dim=-1).double()
        v = rows[:, :kv_lora_rank]
        v = v if v_qdq is None else numerics.qdq(v.float(), v_qdq, v_amax, dim=0).double()
        tiles_per_split = -(-(-(-length // 32)) // num_kv_splits)
        for h in range(heads):
            scores = (k @ q[b, h].double()) * softmax_scale
            parts = []
            for i in range(num_kv_splits):
                lo, hi = i * tiles_per_split * 32, min((i + 1) * tiles_per_split * 32, length)
                if lo < hi:
                    parts.append(_online_softmax(scores, v, lo, hi, 32, p_qdq, p_amax, q.dtype))
            out[b, h], lse[b, h] = _lse_merge(parts, kv_lora_rank)
    return out, lse


@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size,splits", [(1, 1), (16, 3), (64, 32)])
@pytest.mark.parametrize("recipe", [(None, None, None), (None, None, "fp8"), (None, None, "nvfp4"),
                                    ("fp8", "nvfp4", None), ("nvfp4", "fp8", "nvfp4")])
def test_reference_matches_float64_math(q_dtype, page_size, splits, recipe):
    k, v, p = recipe
    inputs = fp8_inputs([0, 1, 31, 32, 33, 64, 65, 150], heads=3, rank=32, rope=16, page_size=page_size,
                        q_dtype=q_dtype, seed=page_size + splits)
    amaxes = dict(k_qdq_amax=None if k is None else 5.0, v_qdq_amax=None if v is None else 4.0)
    out, lse = run("reference", inputs, 32, 16, num_kv_splits=splits, k_qdq=k, v_qdq=v, p_qdq=p,
                   out_dtype=torch.float32, **amaxes)
    q, codes, table, lens = inputs
    want, want_lse = fp8_decode_math(q, codes, KV_SCALE, table, lens, softmax_scale=48 ** -0.5, kv_lora_rank=32,
                                     num_kv_splits=splits, k_qdq=k, k_amax=amaxes["k_qdq_amax"], v_qdq=v,
                                     v_amax=amaxes["v_qdq_amax"], p_qdq=p)
    # float32 scores (the reference) and float64 ones (the oracle) can put a weight on opposite sides of a rounding
    # boundary of P's 16-bit dtype: one such flip (fp16, 2^-11 of one weight) measured rel-L2 2.0e-5 on an AVX-512
    # CPU whose matmul sums in another order; a dropped or misplaced key is ~1e-2, so 1e-4 still catches any bug
    assert rel_l2(out, want) < 1e-4
    assert same_lse(lse, want_lse, 1e-4)
    assert (out[0] == 0).all() and (lse[0] == NEG_INF).all()  # length 0


def test_reference_is_the_float_cache_of_the_dequantized_values():
    """An FP8 cache computes what a float32 cache holding ``float32(code) * kv_scale`` computes, P in q's dtype:
    with an fp32 cache and bf16-valued q P rounds to float32 instead, so the two differ only by that rounding."""
    q, codes, table, lens = fp8_inputs([40, 7, 100], heads=4, rank=32, rope=16, page_size=16)
    values = numerics.fp8_cache_values(codes, KV_SCALE)
    torch.testing.assert_close(values, codes.float() * torch.tensor(KV_SCALE, dtype=torch.float32), rtol=0, atol=0,
                               equal_nan=True)
    out, lse = run("reference", (q, codes, table, lens), 32, 16, out_dtype=torch.float32)
    ref, ref_lse = mla_core.mla_decode(q.float(), values, table, lens, softmax_scale=48 ** -0.5, kv_lora_rank=32,
                                       qk_rope_head_dim=16, backend="reference")
    assert torch.allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)
    assert 0 < rel_l2(out, ref) < 1e-2  # P rounded to bf16 (q's dtype) vs float32
    plain, _ = run("reference", (q, codes, table, lens), 32, 16, out_dtype=torch.float32, kv_scale=2 * KV_SCALE)
    assert rel_l2(plain, out) > 0.1  # kv_scale changes the scores and the values


# ---------------------------------------------------------------------------------------------- triton (interpreter)


def check_triton(inputs, rank, rope, tol=1e-5 if INTERPRETED else 1e-3, **kw):
    """Triton vs reference (float32 output: differences are float32 summation order and the scale folding; on
    the GPU also exp2 vs exp, which can move a P across a bf16 rounding boundary)."""
    kw.setdefault("out_dtype", torch.float32)
    out, lse = run("triton", inputs, rank, rope, **kw)
    ref, ref_lse = run("reference", inputs, rank, rope, **kw)
    assert out.dtype == ref.dtype and not torch.isnan(out).any() and not torch.isnan(lse).any()
    lens = inputs[3].to(out.device)
    empty = lens == 0
    assert (out[empty] == 0).all() and (lse[empty] == NEG_INF).all()
    err = rel_l2(out[~empty], ref[~empty])
    assert err < tol, f"rel L2 {err:.2e} >= {tol}"
    assert torch.allclose(lse[~empty], ref_lse[~empty], rtol=1e-5, atol=1e-4)
    return out


@triton.jit
def _convert_codes(src, dst, DOT: tl.constexpr, HW: tl.constexpr):
    offs = tl.arange(0, 256)
    tl.store(dst + offs, _e4m3_to_dot(tl.load(src + offs), DOT, HW).to(tl.float32))


def _check_every_code(device, dots, hw):
    codes = torch.arange(256, dtype=torch.int32, device=device).to(torch.uint8)
    want = codes.view(FP8).float()
    number = (codes & 0x7F) != 0x7F  # a NaN code's sign is not kept by the hardware cvt (nor needed)
    for dot in dots:
        got = torch.empty(256, device=device)
        _convert_codes[(1,)](codes, got, DOT=dot, HW=hw)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(torch.signbit(got[number]), torch.signbit(want[number]))


@cpu
def test_code_conversion_is_exact_for_every_code_cpu():
    """The kernel's byte -> value conversion (bit arithmetic under the interpreter) gives torch's value of each of
    the 256 E4M3 codes: normals, subnormals, both zeros, NaN."""
    _check_every_code("cpu", (tl.float32, tl.float16), False)


@gpu
def test_code_conversion_is_exact_for_every_code_gpu():
    """On the GPU: the hardware conversion to bf16 and fp16 (subnormal codes included)."""
    _check_every_code("cuda", (tl.bfloat16, tl.float16), True)


@cpu
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("page_size", [1, 16, 64])
@pytest.mark.parametrize("splits", [1, 2, 32])
def test_triton_matches_reference_cpu(q_dtype, page_size, splits):
    inputs = fp8_inputs([0, 1, 32, 33, 64, 65, 97], heads=4, rank=32, rope=16, page_size=page_size, q_dtype=q_dtype,
                        seed=page_size)
    check_triton(inputs, 32, 16, num_kv_splits=splits)


@cpu
@pytest.mark.parametrize("p_qdq", ["fp8", "nvfp4"])
def test_triton_p_qdq_cpu(p_qdq):
    inputs = fp8_inputs([70, 5, 128], heads=3, rank=32, rope=16, page_size=16)
    out = check_triton(inputs, 32, 16, num_kv_splits=2, p_qdq=p_qdq)
    plain, _ = run("reference", inputs, 32, 16, num_kv_splits=2, out_dtype=torch.float32)
    assert rel_l2(out, plain) > 1e-3  # P was quantized


@cpu
def test_triton_bf16_output_and_configs_cpu():
    """The default output dtype is q's; v_split and prefetch_pages keep the numbers."""
    from mla_core_triton import decode as kernels
    inputs = fp8_inputs([33, 200], heads=16, rank=64, rope=16, page_size=16)
    out, _ = run("triton", inputs, 64, 16, num_kv_splits=3)
    ref, _ = run("reference", inputs, 64, 16, num_kv_splits=3)
    assert out.dtype == torch.bfloat16 and rel_l2(out, ref) < 1e-2
    problem, call = specs.validate_decode(*inputs, softmax_scale=0.1, kv_lora_rank=64, qk_rope_head_dim=16,
                                          page_size=None, num_kv_splits=3, k_qdq=None, k_qdq_amax=None, v_qdq=None,
                                          v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True,
                                          out_dtype=torch.float32, kv_scale=KV_SCALE)
    base, _ = kernels.run(call, {})
    for config in ({"v_split": 2}, {"prefetch_pages": True, "sub_tiles": 2}, {"block_h": 8, "v_split": 4}):
        got, _ = kernels.run(call, config)
        assert rel_l2(got, base) < 1e-6, config


@cpu
def test_triton_deepseek_width_cpu():
    inputs = fp8_inputs([40, 0, 64], heads=2, rank=512, rope=64, page_size=64, seed=5)
    check_triton(inputs, 512, 64, num_kv_splits=2)


def test_triton_and_cuda_refuse_kv_qdq_over_fp8():
    inputs = fp8_inputs([5], heads=2, rank=32, rope=16, page_size=16)
    problem, _ = specs.validate_decode(*inputs, softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=16,
                                       page_size=None, num_kv_splits=1, k_qdq="fp8", k_qdq_amax=None, v_qdq=None,
                                       v_qdq_amax=None, p_qdq="fp8", p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                                       kv_scale=1.0)
    assert "kv_qdq_fp8_cache" in problem.features
    for name in ("triton", "cuda"):     # the declared capability (on this CPU the cuda backend is unavailable first)
        reasons = mla_core.get_backend(name).capabilities["decode"].why_not(problem)
        assert any("k_qdq / v_qdq over an FP8 cache" in r for r in reasons), name
    assert not mla_core.get_backend("reference").why_not(problem)
    with pytest.raises(mla_core.NoBackendError, match="k_qdq / v_qdq over an FP8 cache"):
        run("triton", inputs, 32, 16, k_qdq="fp8")
    out, _ = run(None, inputs, 32, 16, k_qdq="fp8")  # automatic dispatch falls back to the reference
    assert not torch.isnan(out).any()


# ---------------------------------------------------------------------------------------------- validation and keys


def _validate(inputs, **kw):
    opts = dict(softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=16, page_size=None, num_kv_splits=1,
                k_qdq=None, k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                return_lse=True, out_dtype=None, kv_scale=KV_SCALE)
    return specs.validate_decode(*inputs, **{**opts, **kw})


def test_cuda_runs_fp8_caches_on_wgmma_only():
    """The cuda backend takes an FP8 cache (q bf16 / fp16, P in any format) on its WGMMA kernel alone (the
    mma.sync kernel reads float caches), at DeepSeek's 512 + 64."""
    from mla_core_cuda import decode
    cap = mla_core.get_backend("cuda").capabilities["decode"]
    for q_dtype in ("bfloat16", "float16"):
        for p_qdq in (None, "fp8", "nvfp4"):
            problem = mla_core.Problem.make("decode", "cuda", dtype="float8_e4m3fn", q_dtype=q_dtype,
                                            out_dtype="float32", heads=16, kv_lora_rank=512, rope_dim=64,
                                            page_size=64, num_kv_splits="auto", k_qdq=None, v_qdq=None, p_qdq=p_qdq)
            assert cap.why_not(problem) == [] and decode.wgmma_covers(problem)
            configs = decode.configs(problem)
            assert configs[0] == decode.WGMMA and all(c.get("kernel") == "wgmma" for c in configs)
    float_q = mla_core.Problem.make("decode", "cuda", dtype="float8_e4m3fn", q_dtype="float32")
    assert any("q_dtype=float32" in r for r in cap.why_not(float_q))


@pytest.mark.parametrize("kv_scale,match", [
    (None, "kv_scale: got None with a float8_e4m3fn latent_cache, needs the cache's per-tensor scale"),
    (0.0, "kv_scale: got 0.0, needs a positive float"),
    (-1.0, "kv_scale: got -1.0, needs a positive float"),
    (math.inf, "kv_scale: got inf"),
    (math.nan, "kv_scale: got nan"),
    (1e-40, "kv_scale: got 1e-40"),
    ("0.5", "kv_scale: got '0.5'"),
    (True, "kv_scale: got True"),
    (torch.tensor([0.5]), r"kv_scale: got a tensor of shape \[1\] on cpu, needs a python float \(pass float"),
])
def test_kv_scale_validation(kv_scale, match):
    inputs = fp8_inputs([5], heads=2, rank=32, rope=16, page_size=16)
    with pytest.raises(MLAInputError, match=match):
        _validate(inputs, kv_scale=kv_scale)


def test_kv_scale_with_a_float_cache_and_q_dtype_are_refused():
    q, codes, table, lens = fp8_inputs([5], heads=2, rank=32, rope=16, page_size=16)
    with pytest.raises(MLAInputError, match="kv_scale: got 0.5 with a bfloat16 latent_cache, needs None"):
        _validate((q, codes.to(torch.bfloat16), table, lens), kv_scale=0.5)
    with pytest.raises(MLAInputError, match="q: got dtype float32 with a float8_e4m3fn latent_cache, needs bfloat16 "
                                            r"or float16 .*pass q.bfloat16\(\)"):
        _validate((q.float(), codes, table, lens))
    with pytest.raises(MLAInputError, match="q: got dtype float8_e4m3fn"):
        _validate((q.to(FP8), codes, table, lens))
    with pytest.raises(MLAInputError, match="out_dtype: got torch.float8_e4m3fn"):
        _validate((q, codes, table, lens), out_dtype=FP8)
    with pytest.raises(MLAInputError, match="latent_cache: got dtype float8_e5m2"):
        _validate((q, codes.view(torch.float8_e5m2), table, lens))


def test_problem_carries_the_cache_dtype():
    q, codes, table, lens = fp8_inputs([5], heads=2, rank=32, rope=16, page_size=16)
    problem, call = _validate((q, codes, table, lens))
    bf16_problem, bf16_call = _validate((q, codes.to(torch.bfloat16), table, lens), kv_scale=None)
    assert problem["dtype"] == "float8_e4m3fn" and problem["q_dtype"] == "bfloat16"
    assert problem.key() != bf16_problem.key()
    assert call.kv_scale == KV_SCALE and bf16_call.kv_scale is None
    assert call.out_dtype == torch.bfloat16 and problem["out_dtype"] == "bfloat16"
    from mla_core import inputs as builders
    built = builders.make_call(problem, seed=1)  # what the tuner times: codes with a calibrated kv_scale
    assert built.latent_cache.dtype == FP8 and built.kv_scale > 0


# ---------------------------------------------------------------------------------------------- custom op


def test_custom_op_and_fake_kernel_compile_fullgraph():
    torch._dynamo.reset()
    q, codes, table, lens = fp8_inputs([5, 40, 0], heads=4, rank=32, rope=16, page_size=16, seed=3)

    def step(q, codes, table, lens):
        out, lse = mla_core.mla_decode(q, codes, table, lens, softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=16,
                                       kv_scale=KV_SCALE, num_kv_splits=4, backend="reference")
        return out * 2, lse

    got, got_lse = torch.compile(step, fullgraph=True, backend="aot_eager")(q, codes, table, lens)
    want, want_lse = step(q, codes, table, lens)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want) and torch.equal(got_lse, want_lse)
    torch._dynamo.reset()


def test_custom_op_opcheck():
    q, codes, table, lens = fp8_inputs([5, 40], heads=2, rank=32, rope=16, page_size=16, seed=4)
    torch.library.opcheck(torch.ops.mla_core.decode.default,
                          (q, codes, table, lens, 0.1, 32, 16, None, 2, None, None, None, None, "fp8", 1.0, True, None,
                           KV_SCALE, "reference"),
                          test_utils="test_faketensor")


# ---------------------------------------------------------------------------------------------- FlashInfer dense path


def test_flashinfer_dense_path_over_an_fp8_cache():
    """``trtllm_batch_decode_with_kv_cache_mla`` with ``sparse_mla_top_k = 0``: scores ``q·codes * bmm1_scale``,
    output ``softmax · codes * bmm2_scale`` (the float64 oracle with kv_scale 1, scaled), LSE +inf when empty."""
    from mla_core.compat.flashinfer import decode as fi
    q, codes, table, lens = fp8_inputs([40, 0, 100], heads=4, rank=32, rope=16, page_size=16, seed=9)
    bmm1, bmm2 = 0.1 * KV_SCALE, KV_SCALE
    out_buf = torch.full((3, 1, 4, 32), float("nan"), dtype=torch.bfloat16)
    lse_buf = torch.full((3, 4), float("nan"))
    out, lse = fi.trtllm_batch_decode_with_kv_cache_mla(q[:, None], codes[:, None], None, 128, 32, 16, table, lens,
                                                       100, 0, out=out_buf, bmm1_scale=bmm1, bmm2_scale=bmm2,
                                                       lse=lse_buf, return_lse=True)
    assert out is out_buf and lse is lse_buf
    want, want_lse = fp8_decode_math(q, codes, 1.0, table, lens, softmax_scale=bmm1, kv_lora_rank=32, num_kv_splits=32)
    assert rel_l2(out[:, 0], want * bmm2) < 1e-2
    assert (out[1] == 0).all() and (lse[1] == math.inf).all()
    assert torch.allclose(lse[[0, 2]].double(), want_lse[[0, 2]], atol=1e-4)


def test_flashinfer_dense_path_over_a_bf16_cache_and_its_errors():
    from mla_core.compat.flashinfer import decode as fi
    q, codes, table, lens = fp8_inputs([40, 7], heads=4, rank=32, rope=16, page_size=16, seed=10)
    cache = numerics.fp8_cache_values(codes, KV_SCALE).to(torch.bfloat16)
    out = fi.trtllm_batch_decode_with_kv_cache_mla(q[:, None], cache, None, 128, 32, 16, table, lens, 40,
                                                   bmm1_scale=0.1, bmm2_scale=0.5, backend="reference")
    want, _ = mla_core.mla_decode(q, cache, table, lens, softmax_scale=0.1, kv_lora_rank=32, qk_rope_head_dim=16,
                                  out_dtype=torch.float32, backend="reference")
    assert out.shape == (2, 1, 4, 32) and out.dtype == torch.bfloat16
    assert torch.equal(out[:, 0], (want * 0.5).to(torch.bfloat16))
    with pytest.raises(MLAInputError, match="query: got q_len 2"):
        fi.trtllm_batch_decode_with_kv_cache_mla(q[:, None].expand(2, 2, 4, 48), cache, None, 128, 32, 16, table,
                                                 lens, 40)
    with pytest.raises(MLAInputError, match="bmm2_scale: got 0.0"):
        fi.trtllm_batch_decode_with_kv_cache_mla(q[:, None], codes, None, 128, 32, 16, table, lens, 40,
                                                 bmm2_scale=0.0)


# ---------------------------------------------------------------------------------------------- GPU


@gpu
@pytest.mark.parametrize("heads", [16, 128])
@pytest.mark.parametrize("page_size,lengths", [(64, [8192, 1, 0, 4097]), (1, [1000, 33]), (16, [8192, 64])])
def test_deepseek_gpu(heads, page_size, lengths):
    inputs = fp8_inputs(lengths, heads=heads, rank=512, rope=64, page_size=page_size, device="cuda")
    for splits in (32, 1, "auto"):
        check_triton(inputs, 512, 64, num_kv_splits=splits)
    out, _ = run("triton", inputs, 512, 64)
    ref, _ = run("reference", inputs, 512, 64)
    assert out.dtype == torch.bfloat16 and rel_l2(out, ref) < 1e-2
    check_triton(inputs, 512, 64, p_qdq="fp8")


@gpu
def test_configs_gpu():
    """Every listed config of an FP8-cache problem compiles and gives the same numbers."""
    from mla_core_triton import decode as kernels
    for heads in (16, 128):
        inputs = fp8_inputs([3000, 64], heads=heads, rank=512, rope=64, page_size=64, device="cuda")
        problem, call = specs.validate_decode(*inputs, softmax_scale=0.04, kv_lora_rank=512, qk_rope_head_dim=64,
                                              page_size=None, num_kv_splits=8, k_qdq=None, k_qdq_amax=None,
                                              v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0,
                                              return_lse=True, out_dtype=torch.float32, kv_scale=KV_SCALE)
        configs = kernels.configs(problem)
        base, _ = kernels.run(call, configs[0])
        for config in configs[1:4]:
            out, _ = kernels.run(call, config)
            assert rel_l2(out, base) < 1e-5, config


@gpu
def test_fp8_cache_captures_into_a_cuda_graph():
    inputs = fp8_inputs([8192, 100, 1], heads=16, rank=512, rope=64, page_size=64, device="cuda", seed=7)
    eager, _ = run(None, inputs, 512, 64)
    static = torch.empty_like(eager)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run(None, inputs, 512, 64)  # warm-up: compile kernels outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _ = run(None, inputs, 512, 64)
        static.copy_(out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static, eager)
