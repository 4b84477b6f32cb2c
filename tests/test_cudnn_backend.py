"""The cudnn backend: capability detection and ``why_not`` (CPU), its ragged decomposition and dense path
against the reference through emulations of torch's two cuDNN calls (CPU), the per-problem priority and
dispatch by it (CPU), and the real thing on the GPU (``-m gpu``).

The ragged emulation computes what ``aten._cudnn_attention_forward`` promises (per piece of the cumulative
offsets, top-left causal, natural-log LSE as ``[tokens, heads, 1]``) in float64, and fills every row
of a piece without keys with NaN, the worst cuDNN could leave there: a NaN in a result means the
backend let such a row through. It also asserts that every piece fits the ``max_q`` / ``max_k`` the
backend passed. The dense emulation computes what ``aten._scaled_dot_product_cudnn_attention`` promises
([batch, heads, length, dim] views, LSE ``[batch, heads, len_q, 1]``, output in q's memory layout) and
asserts that it gets views of the packed tensors (no copies) and only square causal calls. fp32 inputs
(cuDNN itself takes bf16/fp16; the emulations do not care) make the comparison with the reference a
float32-rounding one (< 1e-5).
"""
from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
import types

import pytest
import torch

import mla_core
from mla_core import numerics, specs
from mla_core.testing.shapes import boundary_lengths
from mla_core_cudnn import backend as cudnn_backend
from mla_core_cudnn import prefill as cudnn_prefill

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference_math import rel_l2, same_lse  # noqa: E402

FP32_TOL = 1e-5
HALF_TOL = 1e-2
NEG_INF = float("-inf")
QKV = ("q_quant", "k_quant", "v_quant")


def make_inputs(seqs, heads, kv_heads, qk_dim, v_dim, dtype=torch.float32, seed=0, device="cpu", shared_cu=False):
    """Packed standard-normal q/k/v for (len_q, len_k) per sequence, cu_seqlens (int32) and max_seqlen_q.

    ``shared_cu``: one tensor serves as both cu_seqlens (needs len_q == len_k everywhere).
    """
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, heads, qk_dim, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(total_k, kv_heads, qk_dim, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(total_k, kv_heads, v_dim, generator=g).to(device=device, dtype=dtype)
    cu_q = torch.tensor([0] + [sum(s[0] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32,
                        device=device)
    cu_k = cu_q if shared_cu else torch.tensor([0] + [sum(s[1] for s in seqs[:i + 1]) for i in range(len(seqs))],
                                               dtype=torch.int32, device=device)
    return [q, k, v, cu_q, cu_k, max([s[0] for s in seqs] + [0])]


def validated(inputs, causal=True, return_lse=True, **kw):
    """(problem, call) of mla_prefill's own validation for these inputs."""
    args = dict(q_quant=None, k_quant=None, p_quant=None, v_quant=None, q_amax=None, k_amax=None, p_amax=1.0,
                v_amax=None, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64,
                block_n=64)
    args.update(kw)
    return specs.validate_prefill(*inputs, None, causal, return_lse, **args)


# ------------------------------------------------------------------------------------------------
# capability detection and why_not (CPU)


def test_on_the_cpu_the_backend_is_loaded_and_says_why_it_cannot_run():
    backend = mla_core.get_backend("cudnn")
    problem, _ = validated(make_inputs([(3, 3)], 2, 2, 16, 8))
    reasons = backend.why_not(problem)
    assert reasons and reasons[0].startswith("unavailable: ")
    if not torch.cuda.is_available():
        assert "no CUDA device" in reasons[0]
    info = backend.info()
    assert info["name"] == "cudnn" and set(info["ops"]) == {"prefill"}
    if not torch.cuda.is_available():  # unavailable backends rank below triton
        assert info["priority"] == cudnn_backend.PRIORITY_EAGER_ONLY < mla_core.get_backend("triton").priority


def test_rebuild_probe_reads_the_host_time_of_a_call():
    import time
    calls = []

    def cached(*args):
        calls.append(args)

    def rebuilding(*args):
        time.sleep(0.005)  # torch 2.11 spent ~40 ms per call building a cuDNN graph

    def broken(*args):
        raise RuntimeError("cuDNN Frontend error: no engine\nmore")

    assert cudnn_backend.probe_graph_rebuild(cached, device="cpu") is None
    q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, need_lse = calls[0]
    assert q.shape == (64, 8, 192) and v.shape == (64, 8, 128) and causal and not need_lse
    assert "builds a new cuDNN graph for every ragged call" in cudnn_backend.probe_graph_rebuild(rebuilding, device="cpu")
    reason = cudnn_backend.probe_graph_rebuild(broken, device="cpu")
    assert "probe call" in reason and "no engine" in reason and "more" not in reason


def test_priority_is_above_triton_only_where_torch_keeps_the_cudnn_graph(available, monkeypatch):
    triton_priority = mla_core.get_backend("triton").priority
    monkeypatch.setattr(cudnn_backend, "probe_graph_rebuild", lambda: None)
    assert available.priority == cudnn_backend.PRIORITY_CAPTURABLE > triton_priority
    rebuilding = cudnn_backend.CudnnBackend()
    monkeypatch.setattr(cudnn_backend, "probe_graph_rebuild", lambda: "torch 2.11 builds a new graph per call")
    assert rebuilding.priority == cudnn_backend.PRIORITY_EAGER_ONLY < triton_priority
    assert rebuilding.rebuild_reason() == "torch 2.11 builds a new graph per call"


class _FakeOp:
    def __init__(self, names, returns=9):
        arg = types.SimpleNamespace
        self.default = types.SimpleNamespace(_schema=types.SimpleNamespace(
            arguments=[arg(name=n) for n in names], returns=[arg(name=f"r{i}") for i in range(returns)]))


def test_probe_accepts_the_installed_signature_and_explains_a_changed_or_missing_op(monkeypatch):
    assert cudnn_backend.probe_op() is None  # torch's CPU builds carry the schema too
    names = list(cudnn_backend.OP_ARGUMENTS) + ["scale"]
    monkeypatch.setattr(torch.ops.aten, "_cudnn_attention_forward", _FakeOp(names), raising=False)
    assert cudnn_backend.probe_op() is None
    renamed = ["cu_seqlens_q" if n == "cum_seq_q" else n for n in names]
    monkeypatch.setattr(torch.ops.aten, "_cudnn_attention_forward", _FakeOp(renamed))
    reason = cudnn_backend.probe_op()
    assert "cu_seqlens_q" in reason and "takes" in reason
    monkeypatch.setattr(torch.ops.aten, "_cudnn_attention_forward", _FakeOp(names, returns=1))
    assert "returns 1 values" in cudnn_backend.probe_op()
    monkeypatch.setattr(torch.ops.aten, "_cudnn_attention_forward", types.SimpleNamespace())  # no overload
    assert "has no aten._cudnn_attention_forward" in cudnn_backend.probe_op()


@pytest.mark.parametrize("cuda,cudnn,version,triton,expect", [
    (False, True, 91900, True, "no CUDA device"),
    (True, False, None, True, "built without cuDNN"),
    (True, True, 8907, True, "older than"),
    (True, True, 91900, False, "triton package is not installed"),
    (True, True, 91900, True, None)])
def test_cuda_probe_reports_each_missing_piece(monkeypatch, cuda, cudnn, version, triton, expect):
    import importlib.util
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.backends.cudnn, "is_available", lambda: cudnn)
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: version)
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" and not triton
                        else real_find_spec(name, *a))
    reason = cudnn_backend.probe_cuda()
    assert reason is None if expect is None else expect in reason


@pytest.fixture
def available(monkeypatch):
    """A cudnn backend that believes it runs on an sm90 GPU with cuDNN 9.19."""
    backend = cudnn_backend.CudnnBackend()
    monkeypatch.setattr(cudnn_backend, "probe_op", lambda: None)
    monkeypatch.setattr(cudnn_backend, "probe_cuda", lambda: None)
    monkeypatch.setattr(cudnn_backend, "device_capability", lambda: (9, 0))
    return backend


def _cuda_problem(seqs=((5, 9), (3, 3)), heads=8, kv_heads=8, qk_dim=192, v_dim=128, dtype=torch.bfloat16, **kw):
    problem, _ = validated(make_inputs(list(seqs), heads, kv_heads, qk_dim, v_dim, dtype=dtype), **kw)
    return dataclasses.replace(problem, device="cuda")


def test_why_not_accepts_what_cudnn_computes_as_the_reference_does(available):
    assert available.why_not(_cuda_problem()) == []
    assert available.why_not(_cuda_problem(causal=False, return_lse=False)) == []
    assert available.why_not(_cuda_problem(heads=8, kv_heads=2)) == []                       # GQA
    assert available.why_not(_cuda_problem(dtype=torch.float16, q_quant="fp8", k_quant="nvfp4", v_quant="nvfp4")) == []


def test_why_not_explains_p_quantization_sparsity_and_the_limits(available):
    reasons = available.why_not(_cuda_problem(p_quant="fp8"))
    assert len(reasons) == 1 and reasons[0].startswith("p_quant=fp8") and "P" in reasons[0]
    reasons = available.why_not(_cuda_problem(sparsity_n=2, sparsity_m=4))
    assert len(reasons) == 1 and reasons[0].startswith("nm_sparsity:")
    assert any(r.startswith("dtype=float32") for r in available.why_not(_cuda_problem(dtype=torch.float32)))
    assert any(r.startswith("qk_dim=576") for r in available.why_not(_cuda_problem(qk_dim=576, v_dim=512)))
    assert any(r.startswith("v_dim=100") for r in available.why_not(_cuda_problem(v_dim=100)))
    big = dataclasses.replace(_cuda_problem(), params=tuple(
        (k, 1 << 24 if k == "total_k" else v) for k, v in _cuda_problem().params))
    assert any("int32" in r for r in available.why_not(big))
    assert available.why_not(dataclasses.replace(_cuda_problem(), device="cpu"))[0].startswith("device=cpu")


def test_why_not_refuses_old_gpus(available, monkeypatch):
    monkeypatch.setattr(cudnn_backend, "device_capability", lambda: (7, 5))
    assert available.why_not(_cuda_problem())[0].startswith("compute capability 7.5")


def test_offset_overflow_is_an_input_error_before_any_launch():
    q = torch.empty(1 << 18, 128, 192, device="meta")
    k = torch.empty(8, 128, 192, device="meta")
    v = torch.empty(8, 128, 128, device="meta")
    call = types.SimpleNamespace(q=q, k=k, v=v)
    with pytest.raises(mla_core.MLAInputError, match="^q: got 262144 tokens"):
        cudnn_prefill._check_offsets(call)


# ------------------------------------------------------------------------------------------------
# the decomposition against the reference, through an emulation of cuDNN (CPU)


class EmulatedCudnn:
    """float64 stand-in for ``cudnn_attend``: per piece, softmax(q k^T * scale) v, top-left causal."""

    def __init__(self):
        self.calls = []
        self.dense_calls = []  # filled by the EmulatedDenseCudnn of the same run

    def __call__(self, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale, need_lse):
        assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32 and cu_q.shape == cu_k.shape
        assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
        self.calls.append(dict(pieces=cu_q.shape[0] - 1, causal=causal))
        tokens, heads, _ = q.shape
        group = heads // k.shape[1]
        out = torch.full((tokens, heads, v.shape[2]), float("nan"), dtype=q.dtype)
        lse = torch.full((tokens, heads, 1), float("nan"), dtype=torch.float32)
        cq, ck = cu_q.tolist(), cu_k.tolist()
        for q0, q1, k0, k1 in zip(cq[:-1], cq[1:], ck[:-1], ck[1:]):
            assert 0 <= q1 - q0 <= max_q and 0 <= k1 - k0 <= max_k, (q0, q1, k0, k1, max_q, max_k)
            if q1 == q0 or k1 == k0:
                continue
            qs = q[q0:q1].double()
            ks = k[k0:k1].double().repeat_interleave(group, dim=1)
            vs = v[k0:k1].double().repeat_interleave(group, dim=1)
            s = torch.einsum("qhd,khd->hqk", qs, ks) * scale
            if causal:
                s = s.masked_fill(torch.ones(q1 - q0, k1 - k0, dtype=torch.bool).triu(1), NEG_INF)
            out[q0:q1] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vs).to(q.dtype)
            lse[q0:q1, :, 0] = torch.logsumexp(s, -1).t().float()
        return out, (cudnn_prefill.lse_heads_tokens(lse, tokens, heads) if need_lse else None)


class EmulatedDenseCudnn:
    """float64 stand-in for ``cudnn_dense_attend``: softmax(q k^T * scale) v per batch and head, top-left causal."""

    def __init__(self, calls):
        self.calls = calls

    def __call__(self, q, k, v, causal, scale, need_lse):
        batch, heads, len_q, _ = q.shape
        len_k = k.shape[2]
        assert k.shape[:2] == (batch, heads) and tuple(v.shape[:3]) == (batch, heads, len_k)
        assert not causal or len_q == len_k, "causal dense calls must be square (top-left == bottom-right)"
        for x in (q, k, v):  # views of packed [tokens, heads, dim] tensors, never copies
            assert x.transpose(1, 2).is_contiguous() and x.stride(1) == x.shape[3], x.stride()
        self.calls.append(dict(batch=batch, len_q=len_q, len_k=len_k, causal=causal))
        s = torch.einsum("bhqd,bhkd->bhqk", q.double(), k.double()) * scale
        if causal:
            s = s.masked_fill(torch.ones(len_q, len_k, dtype=torch.bool).triu(1), NEG_INF)
        # torch allocates the output in q's layout ([batch, len_q, heads, v_dim] in memory)
        out = torch.empty(batch, len_q, heads, v.shape[3], dtype=q.dtype).transpose(1, 2)
        out.copy_(torch.einsum("bhqk,bhkd->bhqd", torch.softmax(s, -1), v.double()))
        lse = torch.logsumexp(s, -1).float()[..., None]
        return out, (cudnn_prefill.dense_lse(lse, batch, heads, len_q) if need_lse else None)


def run_emulated(inputs, causal=True, return_lse=True, dense=True, **kw):
    """(emulated cudnn backend (out, lse), reference (out, lse), the emulator: ``calls`` ragged, ``dense_calls``).

    ``dense`` False: the dense op is absent (every batch takes the ragged path)."""
    problem, call = validated(inputs, causal=causal, return_lse=return_lse, **kw)
    emulator = EmulatedCudnn()
    dense_attend = EmulatedDenseCudnn(emulator.dense_calls) if dense else None
    out = cudnn_prefill.run(call, {}, attend=emulator, dense_attend=dense_attend)
    ref = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference", **kw)
    return out, ref, emulator


def check(out, ref, tol, return_lse=True):
    assert out[0].shape == ref[0].shape and out[0].dtype == ref[0].dtype
    err = rel_l2(out[0], ref[0])
    assert err < tol, f"relative L2 {err:.3g} >= {tol}"
    if return_lse:
        assert out[1].shape == ref[1].shape and out[1].dtype == torch.float32 and out[1].is_contiguous()
        assert same_lse(out[1], ref[1], max(tol, 1e-5) * 10)
    else:
        assert out[1] is None


TILES = boundary_lengths([64, 128], limit=200)  # cuDNN's query and key tiles are 64 or 128 rows
# len_q < len_k (cached prefix), equal, len_q > len_k (leading rows see no key), empty queries / keys
RAGGED = [(17, 40), (0, 0), (0, 5), (1, 1), (1, 129), (63, 128), (65, 64), (129, 3), (5, 0), (127, 127), (40, 257)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("return_lse", [True, False])
def test_ragged_lengths_match_the_reference(causal, return_lse):
    inputs = make_inputs(RAGGED, 4, 4, 16, 8, seed=1)
    out, ref, emulator = run_emulated(inputs, causal=causal, return_lse=return_lse)
    check(out, ref, FP32_TOL, return_lse)
    assert [c["causal"] for c in emulator.calls] == ([False, True] if causal else [False])
    if causal:
        assert all(c["pieces"] == 2 * len(RAGGED) for c in emulator.calls)


def test_equal_lengths_with_one_cu_tensor_take_one_call():
    seqs = [(n, n) for n in TILES]
    out, ref, emulator = run_emulated(make_inputs(seqs, 4, 4, 16, 8, seed=2, shared_cu=True))
    check(out, ref, FP32_TOL)
    assert emulator.calls == [dict(pieces=len(seqs), causal=True)]
    # the same lengths in two tensors: metadata cannot prove them equal, so the split runs (same result)
    inputs = make_inputs(seqs, 4, 4, 16, 8, seed=2)
    out2, _, emulator = run_emulated(inputs)
    check(out2, ref, FP32_TOL)
    assert len(emulator.calls) == 2


@pytest.mark.parametrize("len_q,len_k", [(70, 70), (70, 200), (200, 70)])
def test_one_sequence_uses_its_token_counts(len_q, len_k):
    out, ref, emulator = run_emulated(make_inputs([(len_q, len_k)], 4, 2, 16, 8, seed=len_q))
    check(out, ref, FP32_TOL)
    assert len(emulator.calls) == (1 if len_q == len_k else 2)


def test_gqa_and_the_default_scale_match():
    inputs = make_inputs(RAGGED, 8, 2, 24, 16, seed=4)
    out, ref, _ = run_emulated(inputs)
    check(out, ref, FP32_TOL)


def test_no_tokens_at_all():
    out, ref, emulator = run_emulated(make_inputs([(0, 4), (0, 0)], 4, 4, 16, 8))
    check(out, ref, FP32_TOL)
    out, ref, emulator = run_emulated(make_inputs([(3, 0), (2, 0)], 4, 4, 16, 8), causal=False)
    check(out, ref, FP32_TOL)
    assert emulator.calls == []


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("amax", [None, 3.7])
def test_qkv_quantization_is_the_fused_definition(fmt, amax):
    """QDQ then attention equals the reference's fused quantization (Q/K along features, V along keys per
    sequence), and is measurably far from the unquantized result."""
    inputs = make_inputs(RAGGED, 4, 4, 32, 32, seed=5)
    kw = {name: fmt for name in QKV}
    kw.update(q_amax=amax, k_amax=amax, v_amax=amax)
    out, ref, _ = run_emulated(inputs, **kw)
    check(out, ref, FP32_TOL)
    plain = mla_core.mla_prefill(*inputs, backend="reference")
    assert rel_l2(out[0], plain) > 2e-2


def test_v_quantized_alone_per_sequence_blocks():
    inputs = make_inputs(RAGGED, 4, 4, 16, 32, seed=6)
    out, ref, _ = run_emulated(inputs, v_quant="nvfp4", v_amax=2.5)
    check(out, ref, FP32_TOL)


def test_per_sequence_v_blocks_are_bitwise_the_reference_blocks():
    lens = [0, 1, 15, 16, 17, 33, 0, 64, 5]
    v = torch.randn(sum(lens), 3, 32, generator=torch.Generator().manual_seed(7))
    cu = torch.tensor([0] + [sum(lens[:i + 1]) for i in range(len(lens))], dtype=torch.int32)
    got = cudnn_prefill.qdq_v_per_sequence(v, cu, 1.5)
    want = torch.cat([numerics.qdq_nvfp4(v[a:b], 1.5, dim=0) for a, b in zip(cu[:-1].tolist(), cu[1:].tolist())])
    assert torch.equal(got, want)


def test_codes_are_exact_in_half_precision():
    x = torch.randn(64, 4, 32, generator=torch.Generator().manual_seed(8))
    for fmt in ("fp8", "nvfp4"):
        for dtype in (torch.bfloat16, torch.float16):
            codes, factor = cudnn_prefill._codes(x.to(dtype), fmt, 3.7)
            assert codes.dtype == dtype
            mantissa, _ = torch.frexp(codes.float())       # at most 6 significant bits: nothing was rounded away
            assert torch.equal(mantissa * 64, torch.round(mantissa * 64))
            # codes x factor is the QDQ value up to float32 rounding (the factor is applied in float32 later)
            assert torch.allclose(codes.float() * factor, numerics.qdq(x.to(dtype), fmt, 3.7, dim=-1), rtol=2 ** -22,
                                  atol=0)


def test_half_precision_through_the_finishing_kernels():
    """fp16 outputs and LSE through mask_rows and merge (the interpreter handles fp16 loads and stores)."""
    inputs = make_inputs(RAGGED, 4, 4, 16, 16, dtype=torch.float16, seed=9)
    for causal in (True, False):
        out, ref, _ = run_emulated(inputs, causal=causal)
        check(out, ref, HALF_TOL)


# ------------------------------------------------------------------------------------------------
# the dense path against the reference, through an emulation of the dense op (CPU)

ONE_SEQUENCE = [(70, 70), (40, 200), (200, 40), (1, 1), (1, 129), (129, 1), (64, 128)]


def _dense_calls(len_q, len_k, causal, batch=1):
    """The dense calls the backend should make for ``batch`` sequences of (len_q, len_k)."""
    if not causal or len_q == len_k:
        return [dict(batch=batch, len_q=len_q, len_k=len_k, causal=causal)]
    if len_q > len_k:  # the leading len_q - len_k queries see no key
        return [dict(batch=1, len_q=len_k, len_k=len_k, causal=True)]
    return [dict(batch=1, len_q=len_q, len_k=len_k - len_q, causal=False), dict(batch=1, len_q=len_q, len_k=len_q,
                                                                                 causal=True)]


@pytest.mark.parametrize("len_q,len_k", ONE_SEQUENCE)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("return_lse", [True, False])
def test_one_sequence_takes_the_dense_path(len_q, len_k, causal, return_lse):
    out, ref, emulator = run_emulated(make_inputs([(len_q, len_k)], 4, 4, 16, 8, seed=len_q + 3 * len_k),
                                      causal=causal, return_lse=return_lse)
    check(out, ref, FP32_TOL, return_lse)
    assert emulator.calls == [] and emulator.dense_calls == _dense_calls(len_q, len_k, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("return_lse", [True, False])
def test_equal_length_batch_with_one_cu_tensor_is_one_dense_call(causal, return_lse):
    seqs = [(65, 65)] * 3
    inputs = make_inputs(seqs, 4, 4, 16, 8, seed=21, shared_cu=True)
    out, ref, emulator = run_emulated(inputs, causal=causal, return_lse=return_lse)
    check(out, ref, FP32_TOL, return_lse)
    assert emulator.calls == [] and emulator.dense_calls == _dense_calls(65, 65, causal, batch=3)
    # not proven by shapes: two cu_seqlens tensors (values are never read), or max_seqlen_q above the lengths
    for other in (make_inputs(seqs, 4, 4, 16, 8, seed=21), inputs[:5] + [66]):
        out, _, emulator = run_emulated(other, causal=causal, return_lse=return_lse)
        check(out, ref, FP32_TOL, return_lse)
        assert emulator.dense_calls == [] and emulator.calls


def test_gqa_and_a_missing_dense_op_take_the_ragged_path():
    inputs = make_inputs([(40, 200)], 4, 2, 16, 8, seed=23)              # GQA: the dense op gets one head count
    out, ref, emulator = run_emulated(inputs)
    check(out, ref, FP32_TOL)
    assert emulator.dense_calls == [] and len(emulator.calls) == 2
    inputs = make_inputs([(40, 200)], 4, 4, 16, 8, seed=23)
    out, ref, emulator = run_emulated(inputs, dense=False)
    check(out, ref, FP32_TOL)
    assert emulator.dense_calls == [] and len(emulator.calls) == 2


@pytest.mark.parametrize("fmt", ["fp8", "nvfp4"])
@pytest.mark.parametrize("seqs,shared_cu", [([(40, 97)], False), ([(97, 40)], False), ([(33, 33)] * 3, True)])
def test_dense_path_qkv_quantization_is_the_fused_definition(fmt, seqs, shared_cu):
    """Lengths off the NVFP4 block of 16: V's blocks must start at each sequence's first key."""
    kw = dict({name: fmt for name in QKV}, q_amax=3.7, k_amax=3.7, v_amax=3.7)
    inputs = make_inputs(seqs, 4, 4, 32, 32, seed=24, shared_cu=shared_cu)
    out, ref, emulator = run_emulated(inputs, **kw)
    check(out, ref, FP32_TOL)
    assert emulator.dense_calls and not emulator.calls
    assert rel_l2(out[0], mla_core.mla_prefill(*inputs, backend="reference")) > 2e-2


def test_dense_path_in_half_precision_through_the_merge():
    inputs = make_inputs([(40, 200)], 4, 4, 16, 16, dtype=torch.float16, seed=25)
    out, ref, emulator = run_emulated(inputs)
    check(out, ref, HALF_TOL)
    assert len(emulator.dense_calls) == 2


def _problem(seqs, shared_cu=False, max_q=None, kv_heads=4, cu_k_view=False):
    inputs = make_inputs(list(seqs), 4, kv_heads, 16, 8, shared_cu=shared_cu)
    if max_q is not None:
        inputs[5] = max_q
    if cu_k_view:  # the same memory through another tensor object
        inputs[4] = inputs[3].view(-1)
    return validated(inputs)[0]


@pytest.mark.parametrize("checks", ["full", "metadata"])
def test_dense_batch_is_in_the_problem_exactly_when_shapes_prove_it(checks, monkeypatch):
    monkeypatch.setenv("MLA_CORE_CHECKS", checks)

    def dense(problem):
        assert ("dense_batch=1" in problem.key()) == (problem.get("dense_batch") == 1)
        return problem.get("dense_batch") == 1

    assert all(dense(_problem([seq])) for seq in ONE_SEQUENCE + [(0, 5), (5, 0)])
    assert dense(_problem([(8, 8)] * 4, shared_cu=True))
    assert dense(_problem([(8, 8)] * 4, cu_k_view=True))
    assert dense(_problem([(8, 8)] * 4, shared_cu=True, kv_heads=2))   # a property of the batch; GQA ranks apart
    assert not dense(_problem([(8, 8)] * 4))                          # two tensors: equal values are not read
    assert not dense(_problem([(8, 8)] * 3 + [(4, 4)], shared_cu=True))  # total_q < batch * max_seqlen_q
    if checks == "metadata":  # content checks would refuse a max_seqlen_q below the longest sequence
        assert not dense(_problem([(8, 8)] * 4, shared_cu=True, max_q=9))
    assert not dense(_problem(RAGGED))
    assert _problem(RAGGED).key() == _problem(RAGGED).key().replace("|dense_batch=1", "")


def test_dense_problems_rebuild_their_inputs_for_the_autotuner():
    from mla_core import inputs as problem_inputs
    for problem in (_problem([(8, 8)] * 4, shared_cu=True), _problem([(8, 8)]), _problem([(8, 8)] * 4)):
        call = problem_inputs.make_call(problem, "cpu")
        assert specs.prefill_dense_batch(call.q, call.k, call.cu_seqlens_q, call.cu_seqlens_k,
                                         call.max_seqlen_q) == bool(problem.get("dense_batch"))


def test_priority_for_dense_problems_is_above_triton_even_where_the_ragged_path_rebuilds(available, monkeypatch):
    triton_priority = mla_core.get_backend("triton").priority
    monkeypatch.setattr(cudnn_backend, "probe_graph_rebuild", lambda: "torch 2.11 builds a new graph per call")
    dense, ragged = _cuda_problem(seqs=((64, 64),)), _cuda_problem()
    gqa = _cuda_problem(seqs=((64, 64),), kv_heads=2)
    assert available.priority_for(dense) == cudnn_backend.PRIORITY_CAPTURABLE > triton_priority
    assert available.priority_for(ragged) == available.priority == cudnn_backend.PRIORITY_EAGER_ONLY
    assert available.priority_for(gqa) == cudnn_backend.PRIORITY_EAGER_ONLY
    assert available.capture_reason(dense) is None
    assert "builds a new graph" in available.capture_reason(ragged)
    monkeypatch.setattr(cudnn_backend, "probe_dense_op", lambda: "torch 9 has no aten._scaled_dot_product_cudnn_attention")
    without = cudnn_backend.CudnnBackend()
    assert without.priority_for(dense) == cudnn_backend.PRIORITY_EAGER_ONLY
    assert without.dense_reason().startswith("torch 9 has no")


def test_dense_op_probe_accepts_the_installed_signature_and_explains_a_changed_or_missing_op(monkeypatch):
    assert cudnn_backend.probe_dense_op() is None  # torch's CPU builds carry the schema too
    names = list(cudnn_backend.DENSE_OP_ARGUMENTS) + ["scale"]
    attr = "_scaled_dot_product_cudnn_attention"
    monkeypatch.setattr(torch.ops.aten, attr, _FakeOp(names), raising=False)
    assert cudnn_backend.probe_dense_op() is None
    monkeypatch.setattr(torch.ops.aten, attr, _FakeOp([n for n in names if n != "compute_log_sumexp"]))
    assert "takes" in cudnn_backend.probe_dense_op()
    monkeypatch.setattr(torch.ops.aten, attr, _FakeOp(names, returns=1))
    assert "returns 1 values" in cudnn_backend.probe_dense_op()
    monkeypatch.setattr(torch.ops.aten, attr, types.SimpleNamespace())
    assert "has no aten._scaled_dot_product_cudnn_attention" in cudnn_backend.probe_dense_op()


class _Ranked(mla_core.Backend):
    """A CPU prefill backend whose priority depends on the problem (the reference computes)."""

    device_types = frozenset({"cpu"})
    capabilities = {"prefill": mla_core.OpCapability(features=frozenset({"lse", "gqa"}))}

    def __init__(self, name, priority, dense_priority):
        self.name, self.priority, self.dense_priority = name, priority, dense_priority

    def priority_for(self, problem):
        if isinstance(self.dense_priority, Exception):
            raise self.dense_priority
        if type(self.dense_priority) is not int:
            return self.dense_priority
        return self.dense_priority if problem.get("dense_batch") else self.priority

    def prefill(self, call, config):
        return mla_core.get_backend("reference").prefill(call, config)


def test_dispatch_ranks_by_priority_for(monkeypatch):
    from mla_core import dispatch, plugins
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    ranked = [_Ranked("tt_dense_fast", 1000, 3000), _Ranked("tt_flat", 2000, 2000),
              _Ranked("tt_raises", 5000, ValueError("no idea")), _Ranked("tt_not_int", 5000, 2.5)]

    class Plugin:
        @mla_core.hookimpl
        def mla_core_backends(self):
            return ranked

    mla_core.register_plugin(Plugin(), "tt_ranked")
    try:
        dense, ragged = _problem([(5, 9)]), _problem(RAGGED)
        for problem, first in ((dense, "tt_dense_fast"), (ragged, "tt_flat")):
            ok, reasons = dispatch.candidates(problem)
            assert [b.name for b in ok][:2] == [first, ({"tt_dense_fast", "tt_flat"} - {first}).pop()]
            assert reasons["tt_raises"] == ["priority_for() raised ValueError: no idea"]
            assert reasons["tt_not_int"][0].startswith("priority_for() returned 2.5, not an int")
            assert dispatch.choose(problem).backend.name == first
        from mla_core.explain import explain_problem
        reasons = explain_problem(dense).reasons["tt_flat"]
        assert reasons[0].startswith("valid (priority 2000), but not chosen: tt_dense_fast (priority 3000) is")
    finally:
        plugins.reload()
        dispatch.clear_memory()


# ------------------------------------------------------------------------------------------------
# GPU: the real cuDNN against the reference at DeepSeek sizes (pytest -m gpu)

HEADS, QK_DIM, V_DIM = 128, 192, 128
GPU_RAGGED = [(17, 40), (0, 0), (0, 5), (1, 1), (1, 129), (127, 128), (129, 64), (300, 1000), (1000, 4096), (64, 64)]


def _poison_allocator(nbytes: int = 3 << 30) -> None:
    """Fill free CUDA-allocator memory with NaN so the buffers cuDNN allocates for its outputs start as NaN."""
    torch.cuda.empty_cache()
    junk = torch.full((nbytes // 4,), float("nan"), dtype=torch.float32, device="cuda")
    del junk


def _gpu_pair(inputs, causal=True, dtype_tol=HALF_TOL, **kw):
    ref = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference", **kw)
    _poison_allocator()
    out = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="cudnn", **kw)
    torch.cuda.synchronize()
    check(out, ref, dtype_tol)
    return out, ref


@pytest.mark.gpu
def test_gpu_backend_is_available_and_first_for_plain_prefill_where_capturable(monkeypatch):
    backend = mla_core.get_backend("cudnn")
    assert backend.unavailable_reason() is None, backend.unavailable_reason()
    print(f"cudnn backend: priority {backend.priority}; graph rebuilds: {backend.rebuild_reason() or 'no'}")
    monkeypatch.setenv("MLA_CORE_AUTOTUNE", "off")
    from mla_core import dispatch
    dispatch.clear_memory()
    print(f"cudnn dense path: {backend.dense_reason() or 'on'}")
    assert backend.dense_reason() is None, backend.dense_reason()
    dense, _ = validated(make_inputs([(64, 64)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, device="cuda"))
    assert dispatch.choose(dense).backend.name == "cudnn"  # dense batches: 250 whatever the ragged path does
    ragged, _ = validated(make_inputs([(64, 64), (32, 32)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, device="cuda"))
    # below cudnn's capturable priority: the cuda backend's own prefill kernel (220) where it builds, then triton (200)
    fallback = "cuda" if mla_core.get_backend("cuda").unavailable_reason() is None else "triton"
    expected = "cudnn" if backend.rebuild_reason() is None else fallback
    assert dispatch.choose(ragged).backend.name == expected
    fp8 = validated(make_inputs([(64, 64)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, device="cuda"),
                    **dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), "fp8"))[0]
    assert dispatch.choose(fp8).backend.name == fallback  # P quantized: cudnn refuses it
    dispatch.clear_memory()


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_ragged_deepseek_dims(causal):
    """bf16 tolerance 1e-2: cuDNN rounds P to bf16 against its own running maximum (tiles other than the
    reference's block_n), so rows differ by bf16 rounding of P and of the output (measured ~3e-3)."""
    inputs = make_inputs(GPU_RAGGED, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=11, device="cuda")
    _gpu_pair(inputs, causal=causal)


@pytest.mark.gpu
def test_gpu_equal_lengths_one_cu_tensor_boundary_lengths():
    seqs = [(n, n) for n in boundary_lengths([64, 128], limit=300)] + [(4096, 4096)]
    _gpu_pair(make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=12, device="cuda", shared_cu=True))


@pytest.mark.gpu
def test_gpu_gqa_and_fp16():
    _gpu_pair(make_inputs(GPU_RAGGED[:8], HEADS, 16, QK_DIM, V_DIM, torch.bfloat16, seed=13, device="cuda"))
    _gpu_pair(make_inputs(GPU_RAGGED[:8], 16, 16, 64, 64, torch.float16, seed=14, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,amax", [("fp8", 4.0), ("nvfp4", 5.0), ("nvfp4", None)])
def test_gpu_qkv_recipes(fmt, amax):
    inputs = make_inputs(GPU_RAGGED[:8], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=15, device="cuda")
    kw = dict({name: fmt for name in QKV}, q_amax=amax, k_amax=amax, v_amax=amax)
    out, _ = _gpu_pair(inputs, **kw)
    plain = mla_core.mla_prefill(*inputs, backend="reference")
    assert rel_l2(out[0], plain) > 2e-2


@pytest.mark.gpu
def test_gpu_never_uses_rows_past_the_tensors():
    """k and v are the head of larger buffers whose tail is NaN: a tile read past the last key must not
    reach the output (0 * NaN)."""
    inputs = make_inputs([(100, 100), (37, 300)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=16,
                         device="cuda")
    q, k, v = inputs[:3]
    for i, t in ((1, k), (2, v)):
        big = torch.full((t.shape[0] + 256,) + tuple(t.shape[1:]), float("nan"), dtype=t.dtype, device="cuda")
        big[:t.shape[0]] = t
        inputs[i] = big[:t.shape[0]]
    for causal in (True, False):
        _gpu_pair(inputs, causal=causal)


@pytest.mark.gpu
@pytest.mark.parametrize("shared_cu", [True, False])
def test_gpu_cuda_graph_capture_replays_new_values(shared_cu, monkeypatch):
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    seqs = [(300, 300), (1, 1), (129, 129)] if shared_cu else [(300, 700), (1, 1), (129, 64), (0, 9)]
    inputs = make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=17, device="cuda",
                         shared_cu=shared_cu)

    def step():
        return mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cudnn")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    reason = mla_core.get_backend("cudnn").rebuild_reason()
    if reason is not None:  # this torch cannot capture the call: the backend says so before anything launches
        with pytest.raises(RuntimeError, match="cannot run this ragged batch inside a CUDA graph capture"):
            with torch.cuda.graph(graph):
                step()
        pytest.xfail(reason)
    with torch.cuda.graph(graph):
        out, lse = step()
    fresh = make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=18, device="cuda")
    for dst, src in zip(inputs[:3], fresh[:3]):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference")
    check((out, lse), ref, HALF_TOL)


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    torch._dynamo.reset()
    inputs = make_inputs([(200, 500), (64, 64)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=19, device="cuda")

    @torch.compile(fullgraph=True)
    def step(q, k, v, cu_q, cu_k):
        out, lse = mla_core.mla_prefill(q, k, v, cu_q, cu_k, 500, causal=True, return_lse=True, backend="cudnn")
        return out * 2, lse

    out, lse = step(*inputs[:5])
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference")
    check((out / 2, lse), ref, HALF_TOL)
    torch._dynamo.reset()
    assert math.isfinite(float(out.float().abs().sum()))


# ------------------------------------------------------------------------------------------------
# GPU: the dense path (pytest -m gpu)

GPU_ONE_SEQUENCE = [(1000, 1000), (300, 1000), (1000, 300), (1, 1), (1, 4096), (129, 64), (64, 4096)]


def _gpu_dense_pair(inputs, monkeypatch, causal=True, calls=None, **kw):
    """_gpu_pair, asserting that the dense op served the call (``calls``: how many dense calls)."""
    made = []
    real = cudnn_prefill.cudnn_dense_attend

    def counted(*args):
        made.append(args[0].shape)
        return real(*args)

    monkeypatch.setattr(cudnn_prefill, "cudnn_dense_attend", counted)
    out = _gpu_pair(inputs, causal=causal, **kw)
    assert made and (calls is None or len(made) == calls), made
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_dense_one_sequence_deepseek_dims(causal, monkeypatch):
    for i, (len_q, len_k) in enumerate(GPU_ONE_SEQUENCE):
        inputs = make_inputs([(len_q, len_k)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=40 + i, device="cuda")
        _gpu_dense_pair(inputs, monkeypatch, causal=causal, calls=2 if causal and len_q < len_k else 1)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_dense_equal_length_batch(causal, monkeypatch):
    inputs = make_inputs([(1024, 1024)] * 4, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=50, device="cuda",
                         shared_cu=True)
    _gpu_dense_pair(inputs, monkeypatch, causal=causal, calls=1)


@pytest.mark.gpu
def test_gpu_dense_matches_triton_at_4x4096():
    """The benchmark's shape, against the triton backend (the reference would need 8 GB of scores per head
    group); both within bf16 rounding of each other (measured ~1e-3 for the ragged path)."""
    inputs = make_inputs([(4096, 4096)] * 4, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=51, device="cuda",
                         shared_cu=True)
    want = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="triton")
    _poison_allocator()
    got = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cudnn")
    torch.cuda.synchronize()
    check(got, want, HALF_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,amax", [("fp8", 4.0), ("nvfp4", 5.0)])
def test_gpu_dense_qkv_recipes(fmt, amax, monkeypatch):
    kw = dict({name: fmt for name in QKV}, q_amax=amax, k_amax=amax, v_amax=amax)
    for seqs, shared_cu in (([(300, 1000)], False), ([(257, 257)] * 2, True)):
        inputs = make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=52, device="cuda",
                             shared_cu=shared_cu)
        out, _ = _gpu_dense_pair(inputs, monkeypatch, **kw)
        assert rel_l2(out[0], mla_core.mla_prefill(*inputs, backend="reference")) > 2e-2


@pytest.mark.gpu
def test_gpu_dense_output_comes_back_without_a_copy():
    """torch allocates the dense op's output in q's layout: on [batch, len, heads, dim] views of packed
    tensors the packed output is then a view of it (printed either way; the layout is torch's choice)."""
    q, k, v, *_ = make_inputs([(256, 256)] * 2, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=53, device="cuda",
                              shared_cu=True)
    out, lse = cudnn_prefill.cudnn_dense_attend(*(cudnn_prefill._bhsd(x, 2) for x in (q, k, v)), True, 0.1, True)
    packed = cudnn_prefill._packed(out)
    print(f"dense op: output {list(out.shape)} strides {out.stride()}; LSE {list(lse.shape)} strides {lse.stride()}; "
          f"packed output {'is a view' if packed.data_ptr() == out.data_ptr() else 'needed a copy'}")
    assert packed.data_ptr() == out.data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("seqs,shared_cu", [([(1000, 1000)] * 2, True), ([(300, 1000)], False),
                                             ([(1000, 300)], False)])
def test_gpu_dense_cuda_graph_capture_replays_new_values(seqs, shared_cu, monkeypatch):
    """Captured whatever the ragged path does (torch caches the dense op's cuDNN graphs)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    inputs = make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=54, device="cuda", shared_cu=shared_cu)

    def step():
        return mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cudnn")

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = step()
    fresh = make_inputs(seqs, HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=55, device="cuda")
    for dst, src in zip(inputs[:3], fresh[:3]):
        dst.copy_(src)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference")
    check((out, lse), ref, HALF_TOL)


@pytest.mark.gpu
def test_gpu_dense_torch_compile_fullgraph():
    torch._dynamo.reset()
    inputs = make_inputs([(300, 1000)], HEADS, HEADS, QK_DIM, V_DIM, torch.bfloat16, seed=56, device="cuda")

    @torch.compile(fullgraph=True)
    def step(q, k, v, cu_q, cu_k):
        out, lse = mla_core.mla_prefill(q, k, v, cu_q, cu_k, 300, causal=True, return_lse=True, backend="cudnn")
        return out * 2, lse

    out, lse = step(*inputs[:5])
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference")
    check((out / 2, lse), ref, HALF_TOL)
    torch._dynamo.reset()
