"""The fused layer's decode prep inside the decode backend's own call (``Backend.run_decode_with_prep`` with a
``specs.LayerDecodePrep``; the cuda backend's: csrc/mla_layer_prep.cu, bindings.cpp ``layer_decode``;
backends/triton/mla_core_triton/layer.py ``CUDA_PREP``) against the Triton prep.

CPU: the layer's routing (which steps take the in-call prep, with which arguments) with a stand-in backend whose
``run_decode_with_prep`` runs the Triton prep on the prep it was given, so the two paths must agree bit for bit; the
plan-to-kernel mapping of the launcher. ``-m gpu`` (H100 / H200): the CUDA prep against the Triton prep at
DeepSeek-V3 sizes (512 + 64 latent rows, 16 and 128 heads), every buffer the layer allocates NaN-poisoned: the new
cache rows, the absorbed query, the key counts and the outputs bit-equal (benchmarks/NOTES.md, "Eager decode: the
prep inside the cuda call").
"""
from __future__ import annotations

import types

import pytest
import torch

import mla_core
from mla_core import specs

from test_layer import make_case, run


@pytest.fixture
def layer():
    from mla_core_triton import layer
    return layer


@pytest.fixture
def recorded(monkeypatch, layer):
    """Every buffer the triton layer allocates, NaN-poisoned (integers -7), in allocation order."""
    made = []

    def poisoned(shape, dtype, device):
        t = torch.full(shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=device)
        made.append(t)
        return t
    monkeypatch.setattr(layer, "_new_output", poisoned)
    return made


def bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as integers (NaN payloads compare too)."""
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


# --------------------------------------------------------------------------------------------------
# CPU: the routing and the launcher's mapping


class StandIn:
    """A backend with ``decode_with_prep``: runs the Triton prep on exactly the prep it receives, then the real
    backend's decode (what the cuda extension's layer_decode does, in Python)."""
    name = "stand_in"

    def __init__(self, real, layer):
        self.real, self.layer, self.calls = real, layer, []

    def decode_prep_reason(self):
        return None

    def run(self, problem, inner, config):
        return self.real.run(problem, inner, config)

    def run_decode_with_prep(self, problem, inner, config, prep):
        latent, rope = problem["kv_lora_rank"], problem["rope_dim"]
        call = types.SimpleNamespace(
            q=prep.q_src, kv=prep.kv, latent_cache=inner.latent_cache, block_table=inner.block_table,
            input_row_offsets=prep.input_row_offsets, cache_offsets=prep.cache_offsets, freqs_cis=prep.freqs_cis,
            kv_norm_gamma=prep.kv_norm_gamma, epsilon=prep.epsilon, nope_dim=prep.q_src.shape[2] - rope,
            rope_dim=rope, kv_lora_rank=latent, rope_interleave=prep.rope_interleave)
        self.layer._prep(call, inner.q, latent, False, None, inner.seq_lens, {"num_warps": 4})
        self.calls.append(prep)
        return self.real.run(problem, inner, config)


@pytest.fixture
def stand_in(monkeypatch, layer):
    """dispatch as the layer sees it, its choices' backends replaced by one StandIn."""
    from mla_core import dispatch
    holder = {}

    def choose(problem, explicit=None):
        choice = dispatch.choose(problem, explicit)
        if "backend" not in holder:
            holder["backend"] = StandIn(choice.backend, layer)
        return dispatch.Choice(holder["backend"], choice.config, choice.source)
    monkeypatch.setattr(layer, "dispatch", types.SimpleNamespace(choose=choose))
    return holder


def _aligned_kv(case):
    """The case with its kv rows at a stride of 48 (16-byte aligned rows: the CUDA prep's layout)."""
    kv = case["kv"]
    wide = torch.full((kv.shape[0], 48), float("nan"), dtype=kv.dtype)
    wide[:, :kv.shape[1]] = kv
    case["kv"] = wide[:, :kv.shape[1]]
    return case


def _decode_case(dtype=torch.bfloat16, starts=(0, 3, 4, 9), **kw):
    case, weights = make_case([1] * len(starts), list(starts), dtype=dtype, seed=5, **kw)
    return _aligned_kv(case), weights


@pytest.mark.parametrize("dtype,interleave", [(torch.bfloat16, True), (torch.float16, False)])
def test_cuda_prep_route_matches_triton_prep(monkeypatch, layer, recorded, stand_in, dtype, interleave):
    """One token per request: the step goes through run_decode_with_prep once, with the call's own tensors and scalars,
    and its cache, absorbed query, key counts and output are the Triton prep path's, bit for bit."""
    case, weights = _decode_case(dtype)
    monkeypatch.setattr(layer, "CUDA_PREP", False)
    out_a, cache_a = run(case, weights, backend="triton", rope_interleave=interleave)
    made_a = list(recorded)
    assert "backend" in stand_in and stand_in["backend"].calls == []
    recorded.clear()
    monkeypatch.setattr(layer, "CUDA_PREP", True)
    out_b, cache_b = run(case, weights, backend="triton", rope_interleave=interleave)
    calls = stand_in["backend"].calls
    assert len(calls) == 1
    p = calls[0]
    q_src, kv, offsets, starts, freqs, gamma, eps, inter = (
        p.q_src, p.kv, p.input_row_offsets, p.cache_offsets, p.freqs_cis, p.kv_norm_gamma, p.epsilon,
        p.rope_interleave)
    assert torch.equal(q_src, case["q"]) and torch.equal(kv, case["kv"]) and torch.equal(freqs, case["freqs_cis"])
    assert torch.equal(offsets, case["input_row_offsets"]) and torch.equal(starts, case["cache_offsets"])
    assert torch.equal(gamma, case["kv_norm_gamma"]) and eps == case["epsilon"] and inter is interleave
    assert p.sum_order == layer._PREP_ORDER
    assert torch.equal(bits(out_a), bits(out_b)) and torch.equal(bits(cache_a), bits(cache_b))
    assert len(made_a) == len(recorded)
    for a, b in zip(made_a, recorded):      # the absorbed query, the key counts, the output
        assert torch.equal(bits(a), bits(b))


def test_triton_prep_where_a_request_has_no_token(monkeypatch, layer, recorded, stand_in):
    """Fewer tokens than requests (per-token tables): the Triton prep, never run_decode_with_prep."""
    case, weights = make_case([1, 0, 1], [2, 5, 4], dtype=torch.bfloat16, seed=6)
    monkeypatch.setattr(layer, "CUDA_PREP", True)
    run(_aligned_kv(case), weights, backend="triton")
    assert stand_in["backend"].calls == []
    case, weights = make_case([1, 1], [2, 4], dtype=torch.bfloat16, seed=6)     # the same, a token each: taken
    run(_aligned_kv(case), weights, backend="triton")
    assert len(stand_in["backend"].calls) == 1


def _prep_call(**over):
    call = types.SimpleNamespace(
        q=torch.zeros(2, 4, 24, dtype=torch.bfloat16), kv=torch.zeros(2, 48, dtype=torch.bfloat16),
        latent_cache=torch.zeros(3, 4, 40, dtype=torch.bfloat16), block_table=torch.zeros(2, 3, dtype=torch.int32),
        input_row_offsets=torch.arange(3, dtype=torch.int32), cache_offsets=torch.zeros(2, dtype=torch.int64),
        freqs_cis=torch.zeros(9, 8), kv_norm_gamma=torch.ones(32, dtype=torch.bfloat16), epsilon=1e-6,
        rope_interleave=True)
    for k, v in over.items():
        setattr(call, k, v)
    return call


def test_prep_in_decode_layouts(monkeypatch, layer):
    """The in-call prep runs only with the switch on, on a backend offering decode_with_prep, over a bf16 / fp16
    cache, float32 freqs, a contiguous gamma (float32 / bf16 / fp16), offsets and block-table rows, kv rows 16-byte
    aligned with a stride a multiple of 16 (Triton's vectorized layout, whose summation order the CUDA prep has)."""
    backend = types.SimpleNamespace(decode_prep_reason=lambda: None)
    monkeypatch.setattr(layer, "CUDA_PREP", True)
    call = _prep_call()
    prep = layer._prep_in_decode(call, backend)
    assert prep == specs.LayerDecodePrep(call.q, call.kv, call.input_row_offsets, call.cache_offsets, call.freqs_cis,
                                         call.kv_norm_gamma, 1e-6, True, layer._PREP_ORDER)
    assert layer._prep_in_decode(_prep_call(kv_norm_gamma=torch.ones(32)), backend) is not None
    assert layer._prep_in_decode(_prep_call(latent_cache=torch.zeros(3, 4, 40, dtype=torch.float16)),
                                 backend) is not None
    refused = [dict(latent_cache=torch.zeros(3, 4, 40)), dict(freqs_cis=torch.zeros(9, 8, dtype=torch.float64)),
               dict(kv_norm_gamma=torch.ones(64, dtype=torch.bfloat16)[::2]),
               dict(kv_norm_gamma=torch.ones(32, dtype=torch.float64)),
               dict(block_table=torch.zeros(3, 2, dtype=torch.int32).T),
               dict(input_row_offsets=torch.arange(6, dtype=torch.int32)[::2]),
               dict(cache_offsets=torch.zeros(4, dtype=torch.int64)[::2]),
               dict(kv=torch.zeros(2, 40, dtype=torch.bfloat16)),               # row stride 40: no
               dict(kv=torch.zeros(2 * 48 + 1, dtype=torch.bfloat16)[1:].view(2, 48)),   # 2 bytes past 16
               dict(kv_norm_gamma=torch.ones(33, dtype=torch.bfloat16)[1:]),
               dict(latent_cache=torch.zeros(3 * 4 * 40 + 1, dtype=torch.bfloat16)[1:].view(3, 4, 40))]
    assert layer._prep_in_decode(_prep_call(kv=torch.zeros(2, 64, dtype=torch.bfloat16)[:, :40]), backend) \
        is not None                                                        # row stride 64, aligned: yes
    for over in refused:
        assert layer._prep_in_decode(_prep_call(**over), backend) is None, over
    assert layer._prep_in_decode(call, mla_core.Backend()) is None       # the base: no decode_with_prep
    old = types.SimpleNamespace(decode_prep_reason=lambda: "no layer_decode")
    assert layer._prep_in_decode(call, old) is None
    monkeypatch.setattr(layer, "CUDA_PREP", False)
    assert layer._prep_in_decode(call, backend) is None


def test_switch_from_the_environment(monkeypatch, layer):
    """MLA_CORE_LAYER_CUDA_PREP: unset / 1 on, 0 off, anything else an error naming the variable."""
    for raw, on in (("", True), ("1", True), (" 0 ", False)):
        monkeypatch.setenv("MLA_CORE_LAYER_CUDA_PREP", raw)
        assert layer._cuda_prep_switch() is on
    monkeypatch.delenv("MLA_CORE_LAYER_CUDA_PREP")
    assert layer._cuda_prep_switch() is True
    monkeypatch.setenv("MLA_CORE_LAYER_CUDA_PREP", "yes")
    with pytest.raises(ValueError, match="MLA_CORE_LAYER_CUDA_PREP='yes'"):
        layer._cuda_prep_switch()


def test_prep_order_by_triton_version(monkeypatch, layer):
    """Triton folds a thread's elements left to right before 3.7 and as a tree from 3.7 (triton-lang/triton#9220;
    3.9's PTX read: a tree): sum_order 1 for the device's 3.6, 0 from 3.7; MLA_CORE_LAYER_PREP_ORDER overrides,
    validated."""
    monkeypatch.delenv("MLA_CORE_LAYER_PREP_ORDER", raising=False)
    assert layer._prep_order("3.6.0") == layer._prep_order("3.5.1") == layer._prep_order("2.3.1") == 1
    assert layer._prep_order("3.7.0") == layer._prep_order("3.9.0") == layer._prep_order("4.0.0+git1") == 0
    import triton
    assert layer._PREP_ORDER == layer._prep_order(triton.__version__)
    monkeypatch.setenv("MLA_CORE_LAYER_PREP_ORDER", "2")
    assert layer._prep_order("3.9.0") == 2
    for bad in ("3", "1,0", "-1", "a"):
        monkeypatch.setenv("MLA_CORE_LAYER_PREP_ORDER", bad)
        with pytest.raises(ValueError, match="MLA_CORE_LAYER_PREP_ORDER"):
            layer._prep_order("3.6.0")


# --------------------------------------------------------------------------------------------------
# GPU: the CUDA prep against the Triton prep, bit for bit


def _cuda_case(heads, starts, page, dtype=torch.bfloat16, seed=11):
    case, weights = make_case([1] * len(starts), list(starts), dtype=dtype, seed=seed, page=page, heads=heads,
                              nope=128, rope=64, latent=512, v_dim=128, block=(128, 128))
    case = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    for name in ("w_k", "w_uk", "w_uv"):
        setattr(weights, name, getattr(weights, name).cuda())
    return case, weights


def _both(monkeypatch, layer, recorded, case, weights, expect_cuda=True, **over):
    """(out, cache, buffers) of the Triton prep path and of the CUDA prep path; asserts the second one ran (or, with
    ``expect_cuda`` False, that the Triton prep ran both times)."""
    from mla_core_cuda import backend as cuda_backend
    ran = []
    real = cuda_backend.CudaBackend.decode_with_prep

    def counted(self, *a):
        ran.append(1)
        return real(self, *a)
    monkeypatch.setattr(cuda_backend.CudaBackend, "decode_with_prep", counted)
    results = []
    for on in (False, True):
        monkeypatch.setattr(layer, "CUDA_PREP", on)
        recorded.clear()
        out, cache = run(case, weights, backend="triton", attention_backend="cuda", **over)
        torch.cuda.synchronize()
        results.append((out, cache, list(recorded)))
    assert len(ran) == (1 if expect_cuda else 0)
    return results


def _assert_bit_equal(results):
    (out_a, cache_a, made_a), (out_b, cache_b, made_b) = results
    assert torch.equal(bits(cache_a), bits(cache_b))                 # the new rows, and nothing else written
    assert len(made_a) == len(made_b)
    for a, b in zip(made_a, made_b):                                 # absorbed query, key counts, output
        assert torch.equal(bits(a), bits(b))
    assert not out_b.isnan().any()
    assert torch.equal(bits(out_a), bits(out_b))


@pytest.mark.gpu
@pytest.mark.parametrize("starts", [(0,), (63,), (64,), (0, 63, 64), (36, 37, 200)], ids=str)
@pytest.mark.parametrize("page", [64, 37])
@pytest.mark.parametrize("heads", [16, 128])
def test_gpu_cuda_prep_bit_equal(monkeypatch, layer, recorded, heads, page, starts):
    """DeepSeek sizes, batch 1 and 3, positions at the page edges of 64 and of 37."""
    case, weights = _cuda_case(heads, starts, page)
    _assert_bit_equal(_both(monkeypatch, layer, recorded, case, weights))


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [1, 9, 20, 40])
def test_gpu_cuda_prep_partial_head_group(monkeypatch, layer, recorded, heads):
    """Head counts that leave the last 16-head CTA partly empty (1 and 9: one group, some warps without a head; 20,
    40: a last group of 4 / 8): every head's q_rope written, none past the last."""
    case, weights = _cuda_case(heads, (0, 63, 64), 64, seed=13)
    _assert_bit_equal(_both(monkeypatch, layer, recorded, case, weights))


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["fp16", "split_halves", "gamma_f32", "index_i64", "sinks", "strided_q",
                                     "kv_stride_592", "kv_unaligned"])
def test_gpu_cuda_prep_layouts(monkeypatch, layer, recorded, variant):
    """fp16, rope in split halves, a float32 gamma, int64 offsets / table, sinks, a q with padded heads, kv rows at a
    stride of 592 (aligned: the CUDA prep) and at 577 (not: the Triton prep both times)."""
    dtype = torch.float16 if variant == "fp16" else torch.bfloat16
    case, weights = _cuda_case(16, (5, 64, 130), 64, dtype=dtype, seed=12)
    over = {}
    if variant == "split_halves":
        over["rope_interleave"] = False
    if variant == "gamma_f32":
        case["kv_norm_gamma"] = case["kv_norm_gamma"].float() * 1.001
    if variant == "index_i64":
        case["input_row_offsets"] = case["input_row_offsets"].long()
        case["block_table"] = case["block_table"].long()
    if variant == "sinks":
        case["attn_sinks"] = torch.randn(16, device="cuda")
    if variant == "strided_q":
        wide = torch.full((3, 16, 200), float("nan"), dtype=dtype, device="cuda")
        wide[:, :, :192] = case["q"]
        case["q"] = wide[:, :, :192]
    if variant.startswith("kv_"):
        stride = 592 if variant == "kv_stride_592" else 577
        wide = torch.full((3, stride), float("nan"), dtype=dtype, device="cuda")
        wide[:, :576] = case["kv"]
        case["kv"] = wide[:, :576]
    results = _both(monkeypatch, layer, recorded, case, weights, expect_cuda=variant != "kv_unaligned", **over)
    _assert_bit_equal(results)


@pytest.mark.gpu
def test_gpu_cuda_prep_pages_outside(monkeypatch, layer, recorded):
    """Metadata checks only: a page index past the cache and a negative one: the row is not written on either
    path (the cache keeps its NaN there), the rest bit-equal; 128 heads, page 64."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case, weights = _cuda_case(128, (0, 63, 64), 64, seed=13)
    num_pages = case["latent_cache"].shape[0]
    case["block_table"][0, 0] = num_pages
    case["block_table"][2, 1] = -3
    results = _both(monkeypatch, layer, recorded, case, weights)
    (_, cache_a, made_a), (_, cache_b, made_b) = results
    assert torch.equal(bits(cache_a), bits(cache_b))
    for a, b in zip(made_a[:2], made_b[:2]):                         # absorbed query, key counts
        assert torch.equal(bits(a), bits(b))


@pytest.mark.gpu
@pytest.mark.parametrize("config", [{"kernel": "keys_m"}, {"head_tiles": 1, "warps": 4}, {"kernel": "wgmma",
                                    "num_kv_splits": 1}, {"kernel": "keys_m", "num_kv_splits": 7},
                                    {"kernel": "ring4"}, {"kernel": "ring4", "num_kv_splits": 3}], ids=str)
def test_gpu_cuda_prep_every_kernel(monkeypatch, layer, recorded, config):
    """layer_decode's four kernels (keys-as-M, mma.sync with its CTA shape, WGMMA, its four-slot ring: kernel id 3,
    run here at 16 heads, where the tuner does not list it but the kernel runs) and split counts, chosen for both paths
    alike: 16 heads, page 64, batch 3."""
    from mla_core import dispatch

    def choose(problem, explicit=None):
        choice = dispatch.choose(problem, explicit)
        return dispatch.Choice(choice.backend, dict(config), "test")
    monkeypatch.setattr(layer, "dispatch", types.SimpleNamespace(choose=choose))
    case, weights = _cuda_case(16, (0, 63, 64), 64, seed=14)
    _assert_bit_equal(_both(monkeypatch, layer, recorded, case, weights))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_gpu_cuda_prep_many_rows(monkeypatch, layer, recorded, dtype):
    """2,048 one-token requests (16 heads, page 64): a one-ulp difference of the float32 RMS factor flips a rounded
    value only rarely (~2^-15 of them in bf16, 2^-18 in fp16), so the summation order shows only over many rows:
    ~1 million new cache values here. The search of benchmarks/run_layer_prep_ab.sh runs this test."""
    starts = [(7 * t) % 130 for t in range(2048)]
    case, weights = _cuda_case(16, starts, 64, dtype=dtype, seed=15)
    _assert_bit_equal(_both(monkeypatch, layer, recorded, case, weights))
