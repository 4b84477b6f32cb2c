"""The triton backend's fused layer (backends/triton/mla_core_triton/layer.py) against the reference layer and float64.

CPU runs the kernel under TRITON_INTERPRET=1; ``-m gpu`` adds DeepSeek-V3 sizes and a captured decode step. Every
buffer the triton layer allocates starts as NaN (poison). The triton layer rounds the dequantized weights to the
cache dtype once (docs/layer.md, "The triton layer"), so bf16 results sit ~2x further from float64 than the
reference's; the tolerances below say so.
"""
from __future__ import annotations

import types

import pytest
import torch

import mla_core
from reference_math import rel_l2
from test_layer import DECODE_STARTS, PREFILL_SHAPES, layer_math, make_case, run


def tolerance(dtype):
    return 1e-5 if dtype == torch.float32 else 2e-2


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    from mla_core_triton import layer
    monkeypatch.setattr(layer, "_new_output", lambda shape, dtype, device: torch.full(
        shape, float("nan") if dtype.is_floating_point else -7, dtype=dtype, device=device))


def _check_same_cache(a, b, dtype):
    assert torch.equal(a.isnan(), b.isnan())                     # the same slots written, nothing else
    ulp = 2.0 ** -7 if dtype == torch.bfloat16 else 2.0 ** -20
    assert torch.allclose(a.nan_to_num(0), b.nan_to_num(0), rtol=ulp, atol=1e-6)


def _compare(case, weights, dtype, against_math=True, **over):
    ref, ref_cache = run(case, weights, **over)
    out, cache = run(case, weights, backend="triton", **over)
    assert out.dtype == dtype and out.shape == ref.shape and out.is_contiguous()
    assert not out.isnan().any()
    assert rel_l2(out, ref) < tolerance(dtype)
    if against_math:
        math, _ = layer_math(case, weights, over.get("rope_interleave", True))
        assert rel_l2(out, math) < tolerance(dtype)
    _check_same_cache(cache, ref_cache, dtype)


@pytest.mark.parametrize("lens,starts", PREFILL_SHAPES)
@pytest.mark.parametrize("dtype,fp8,sinks,interleave", [
    (torch.float32, True, True, True), (torch.float32, False, False, False),
    (torch.bfloat16, True, True, False), (torch.bfloat16, False, False, True)])
def test_prefill_matches_reference(lens, starts, dtype, fp8, sinks, interleave):
    case, weights = make_case(lens, starts, dtype=dtype, fp8=fp8, sinks=sinks)
    _compare(case, weights, dtype, rope_interleave=interleave)


@pytest.mark.parametrize("dtype,fp8,sinks", [(torch.float32, True, True), (torch.bfloat16, True, False),
                                             (torch.bfloat16, False, True)])
@pytest.mark.parametrize("skip_one", [False, True])
def test_decode_matches_reference(dtype, fp8, sinks, skip_one):
    """Page and tile edges of the cached length; ``skip_one``: a request without a token (per-token tables)."""
    lens = [1] * len(DECODE_STARTS)
    if skip_one:
        lens[2] = 0
    case, weights = make_case(lens, DECODE_STARTS, dtype=dtype, fp8=fp8, sinks=sinks, seed=1)
    _compare(case, weights, dtype)


def test_partial_blocks_and_odd_sizes():
    """Weight blocks that do not divide the weights, heads not a power of two, a page of one row."""
    case, weights = make_case([2, 1, 3], [5, 0, 2], fp8=True, sinks=True, seed=3, heads=3, nope=12, rope=6,
                              latent=20, v_dim=10, block=(8, 16), page=1)
    _compare(case, weights, torch.float32)


@pytest.mark.slow
def test_more_requests_than_one_search_block():
    """1,100 requests (the kernel searches input_row_offsets 1,024 at a time), two without a token (~12 s here)."""
    lens = [1] * 1100
    lens[5] = lens[1050] = 0
    case, weights = make_case(lens, [i % 7 for i in range(1100)], fp8=True, seed=4, heads=2, nope=8, rope=4,
                              latent=16, v_dim=8, block=(8, 8), page=2, extra_pages=1)
    _compare(case, weights, torch.float32, against_math=False)


def test_no_tokens():
    case, weights = make_case([0, 0], [3, 0], seed=11)
    out, _ = run(case, weights, backend="triton")
    assert out.shape == (0, 4, 16)


def test_out_of_table_writes_are_dropped(monkeypatch):
    """Without content checks a page index outside the cache is neither written nor read (as the reference)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case, weights = make_case([3, 2], [2, 3], seed=5)
    case["block_table"][1, 1] = case["latent_cache"].shape[0] + 3       # positions 4..7 of request 1: token 2
    _compare(case, weights, torch.float32, against_math=False)


@pytest.mark.parametrize("checks", ["full", "metadata"])
def test_prefill_without_prefix_keys_from_the_kernel(monkeypatch, checks):
    """No cached prefix: the keys are the kernel's new rows (key count from the content checks, or read here);
    without checks a row on a page outside the cache is not written and its key reads as zeros."""
    monkeypatch.setenv("MLA_CORE_CHECKS", checks)
    case, weights = make_case([5, 3, 0, 4], [0, 0, 0, 0], fp8=True, sinks=True, seed=9)
    if checks == "metadata":
        case["block_table"][1, 0] = case["latent_cache"].shape[0] + 2      # request 1's rows: nowhere to go
    _compare(case, weights, torch.float32, against_math=checks == "full")


def _prefill_q_pre(monkeypatch, case, weights, **over):
    """The prefill prep's q_pre [T, H, nope + rope] and the prep's call, from one triton layer run."""
    from mla_core_triton import layer
    seen, prep = [], layer._prep

    def spy(call, q_out, q_rope_at, copy_nope, *args, **kwargs):
        prep(call, q_out, q_rope_at, copy_nope, *args, **kwargs)
        if copy_nope:
            seen.append((call, q_out.clone()))
    monkeypatch.setattr(layer, "_prep", spy)
    run(case, weights, backend="triton", **over)
    (call, q_pre), = seen
    return call, q_pre


def _q_rope_by_decode_form(call, nope):
    """The decode form's (COPY_NOPE False: stride-2 pair loads) q_rope written at column ``nope`` of a NaN buffer."""
    from mla_core_triton import layer
    tokens, heads = call.q.shape[:2]
    out = torch.full((tokens, heads, nope + call.rope_dim), float("nan"), dtype=call.latent_cache.dtype,
                     device=call.q.device)
    layer._prep(call, out, nope, False, None, None, {"num_warps": 4})
    return out


def _q_rope_torch(call, fused=False):
    """q_rope rotated in float32 in the kernel's operation order: ``fused``, fma(cos, x1, -(sin x2)) and
    fma(sin, x1, cos x2) rounded once (the product in float64 is exact; the sum's float64 rounding before float32
    differs from one rounding only on a float32 tie, ~2^-29 of elements); else each product and the sum rounded to
    float32 (Triton 3.6's interpreter evaluates tl.fma so)."""
    offsets = call.input_row_offsets.long()
    tokens = call.q.shape[0]
    t = torch.arange(tokens, device=offsets.device)
    b = (torch.searchsorted(offsets[1:], t, right=True)).clamp(max=offsets.numel() - 2)
    pos = (call.cache_offsets.long()[b] + t - offsets[b]).clamp(0, call.freqs_cis.shape[0] - 1)
    cos, sin = call.freqs_cis[pos, 0::2][:, None].float(), call.freqs_cis[pos, 1::2][:, None].float()
    x = call.q[..., call.nope_dim:].float()
    half = call.rope_dim // 2
    x1, x2 = (x[..., 0::2], x[..., 1::2]) if call.rope_interleave else (x[..., :half], x[..., half:])
    if fused:
        r1 = (cos.double() * x1.double() - (sin * x2).double()).float()
        r2 = (sin.double() * x1.double() + (cos * x2).double()).float()
    else:
        r1, r2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rot = torch.stack((r1, r2), -1).flatten(-2) if call.rope_interleave else torch.cat((r1, r2), -1)
    return rot.to(call.latent_cache.dtype)


def _check_q_pre(call, q_pre, exact_torch):
    nope = call.nope_dim
    assert torch.equal(q_pre[..., :nope], call.q[..., :nope].to(q_pre.dtype))           # the nope copy, exact
    assert torch.equal(q_pre[..., nope:], _q_rope_by_decode_form(call, nope)[..., nope:])  # bit-equal to decode's
    if exact_torch:     # the interpreter's tl.fma: one rounding (newer Triton) or two (3.6); either, bit for bit
        rope = q_pre[..., nope:]
        assert torch.equal(rope, _q_rope_torch(call, fused=True)) or torch.equal(rope, _q_rope_torch(call))


@pytest.mark.parametrize("heads,nope,rope", [(3, 16, 8), (40, 16, 8), (20, 24, 12), (128, 8, 4), (5, 4, 2)])
@pytest.mark.parametrize("interleave", [True, False])
@pytest.mark.parametrize("dtype,starts", [(torch.bfloat16, [0, 0, 0]), (torch.float16, [0, 0, 0]),
                                          (torch.float32, [0, 5, 2])])
def test_prefill_q_pre_bit_equal(monkeypatch, heads, nope, rope, interleave, dtype, starts):
    """The prefill form's q_pre (rope rows loaded whole, pairs split in registers when interleaved): the nope part
    copied, the rope part bit-equal to the decode form's stride-2 path and to float32 torch in the same order
    (heads not a multiple of the 16-head block, a rope whose half is not a power of two, with / without rows; not
    for bf16 here: the interpreter rounds float32 to bf16 toward zero, the device to nearest)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case, weights = make_case([5, 3, 4], starts, dtype=dtype, seed=heads + rope, heads=heads, nope=nope, rope=rope)
    if starts == [0, 0, 0]:
        case["block_table"][1, 0] = case["latent_cache"].shape[0] + 2      # request 1's rows: nowhere to go
    call, q_pre = _prefill_q_pre(monkeypatch, case, weights, rope_interleave=interleave)
    _check_q_pre(call, q_pre, exact_torch=dtype != torch.bfloat16)


def test_weight_cache_follows_in_place_updates():
    from mla_core_triton import layer
    case, weights = make_case([1, 1], [3, 8], fp8=True, seed=6)
    first, _ = run(case, weights, backend="triton")
    cached = [v[3] for v in layer.WEIGHTS._entries.values()]
    again, _ = run(case, weights, backend="triton")
    assert torch.equal(first, again)
    assert all(any(v[3] is c for v in layer.WEIGHTS._entries.values()) for c in cached)     # reused, not rebuilt
    weights.w_uv_scale.mul_(2.0)                                         # the next call must see it
    doubled, _ = run(case, weights, backend="triton")
    assert rel_l2(doubled, 2 * first) < 1e-6


def test_inner_decode_validated_once_per_metadata(monkeypatch):
    """The inner decode's metadata checks run once per key (shapes, dtypes, strides, scalars); a hit runs on this
    call's tensors (two cases of one shape each match the reference), a new shape, dtype or softmax scale
    validates again, and the cached call keeps no tensor alive."""
    from mla_core import specs
    from mla_core_triton import layer
    monkeypatch.setattr(layer, "_DECODE_CALLS", {})
    seen = []                                                  # the triton layer's validations (not the reference's)
    monkeypatch.setattr(layer, "specs", types.SimpleNamespace(
        DecodeCall=specs.DecodeCall,
        validate_decode=lambda *a, **k: seen.append(a[0].shape) or specs.validate_decode(*a, **k)))
    starts = DECODE_STARTS[:3]
    for seed in (21, 22):                                      # one shape, two contents: one validation
        case, weights = make_case([1] * 3, starts, seed=seed)
        _compare(case, weights, torch.float32, attention_backend="triton")
    assert len(seen) == 1
    case, weights = make_case([1] * 3, starts, seed=23)
    case["softmax_scale"] *= 0.5
    _compare(case, weights, torch.float32, attention_backend="triton")
    assert len(seen) == 2
    for over in (dict(lens=[1] * 4, starts=DECODE_STARTS[:4]), dict(lens=[1] * 3, starts=starts, dtype=torch.bfloat16)):
        case, weights = make_case(over.pop("lens"), over.pop("starts"), seed=24, **over)
        _compare(case, weights, case["q"].dtype, attention_backend="triton")
    assert len(seen) == 4
    assert not any(isinstance(v, torch.Tensor) for _, fields in layer._DECODE_CALLS.values() for v in fields.values())
    monkeypatch.setattr(layer, "_DECODE_CALLS_MAX", 1)                 # full: cleared, still right
    _compare(*make_case([1] * 2, starts[:2], seed=25), torch.float32, attention_backend="triton")
    assert len(layer._DECODE_CALLS) == 1


def test_dispatch_prefers_triton_and_leaves_sparse_to_the_reference():
    from mla_core import dispatch, layer
    case, weights = make_case([1, 1], [3, 8], seed=7)
    args = dict(case, **weights.kwargs())
    pos = [args.pop(k) for k in ("q", "kv", "input_row_offsets", "freqs_cis", "kv_norm_gamma", "latent_cache",
                                 "block_table", "cache_offsets")]
    problem, _ = layer.validate_layer(*pos, attention_backend=None, rope_interleave=True, **args)
    assert dispatch.choose(problem).backend.name == "triton"
    sparse, _ = layer.validate_layer(*pos, attention_backend=None, rope_interleave=True,
                                     sparse_indices=torch.zeros(2, 1, dtype=torch.int32), **args)
    assert dispatch.choose(sparse).backend.name == "reference"


def test_torch_compile():
    """The triton layer inside a compiled function (through the mla_forward custom op): the same output and cache."""
    torch._dynamo.reset()
    case, weights = make_case([3, 2], [1, 4], fp8=True, sinks=True, seed=14)
    expected, expected_cache = run(case, weights, backend="triton")
    cache = case["latent_cache"].clone()

    def layer_step(q, kv, cache):
        return mla_core.mla_forward(q, kv, case["input_row_offsets"], case["freqs_cis"], case["kv_norm_gamma"], cache,
                                    case["block_table"], case["cache_offsets"], max_seq_len=case["max_seq_len"],
                                    softmax_scale=case["softmax_scale"], epsilon=case["epsilon"],
                                    attn_sinks=case["attn_sinks"], attention_backend="reference", backend="triton",
                                    **weights.kwargs()) * 2.0

    out = torch.compile(layer_step, backend="aot_eager", fullgraph=True)(case["q"], case["kv"], cache)
    assert rel_l2(out, expected * 2.0) < 1e-6
    assert torch.equal(cache.nan_to_num(3.0), expected_cache.nan_to_num(3.0))


# --------------------------------------------------------------------------------------------------
# GPU: DeepSeek-V3 sizes


def _cuda(case, weights):
    case = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    w = {k: (v.cuda() if isinstance(v, torch.Tensor) else v) for k, v in weights.kwargs().items()}
    return case, w


def _forward(case, w, cache, backend):
    return mla_core.mla_forward(case["q"], case["kv"], case["input_row_offsets"], case["freqs_cis"],
                                case["kv_norm_gamma"], cache, case["block_table"], case["cache_offsets"],
                                max_seq_len=case["max_seq_len"], softmax_scale=case["softmax_scale"],
                                epsilon=case["epsilon"], attn_sinks=case["attn_sinks"], backend=backend, **w)


@pytest.mark.gpu
@pytest.mark.parametrize("fp8", [False, True])
@pytest.mark.parametrize("lens,starts", [([1] * 32, list(range(0, 8192, 256))), ([1, 0, 1], [63, 5, 4000]),
                                         ([300, 1, 64], [0, 4000, 63]), ([1000, 7], [0, 129])])
def test_gpu_deepseek_v3_sizes_match_reference(fp8, lens, starts):
    case, weights = make_case(lens, starts, dtype=torch.bfloat16, fp8=fp8, sinks=True, heads=128, nope=128, rope=64,
                              latent=512, v_dim=128, block=(128, 128), page=64)
    case, w = _cuda(case, weights)
    caches = [case["latent_cache"].clone() for _ in range(2)]
    ref = _forward(case, w, caches[0], "reference")
    out = _forward(case, w, caches[1], "triton")
    assert not out.isnan().any()
    assert rel_l2(out, ref) < 2e-2
    _check_same_cache(caches[1], caches[0], torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("interleave", [True, False])
def test_gpu_prefill_q_pre_bit_equal_to_decode_form(monkeypatch, interleave):
    """DeepSeek-V3 sizes: the prefill form's q_pre is the decode form's rotation bit for bit (both fma-contracted),
    its nope part the query's; within one bf16 rounding of float32 torch."""
    case, weights = make_case([300, 7, 64], [0, 0, 0], dtype=torch.bfloat16, heads=128, nope=128, rope=64,
                              latent=512, v_dim=128, block=(128, 128), page=64)
    case, w = _cuda(case, weights)
    weights = types.SimpleNamespace(kwargs=lambda: w)
    call, q_pre = _prefill_q_pre(monkeypatch, case, weights, rope_interleave=interleave, attention_backend=None)
    _check_q_pre(call, q_pre, exact_torch=False)
    assert torch.allclose(q_pre[..., 128:].float(), _q_rope_torch(call).float(), rtol=2 ** -6, atol=1e-5)


@pytest.mark.gpu
def test_gpu_triton_decode_step_in_a_cuda_graph():
    """The triton layer's decode step captured once (weights cached before), replayed on new inputs."""
    case, weights = make_case([1, 1, 0, 1], [0, 63, 5, 700], dtype=torch.bfloat16, fp8=True, sinks=True, heads=128,
                              nope=128, rope=64, latent=512, v_dim=128, block=(128, 128), page=64)
    case, w = _cuda(case, weights)
    q, kv = case["q"], case["kv"]
    cache = case["latent_cache"].clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        _forward(case, w, cache, "triton")
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _forward(case, w, cache, "triton")
    q.copy_(torch.randn_like(q))
    kv.copy_(torch.randn_like(kv))
    graph.replay()
    torch.cuda.synchronize()
    replayed, replayed_cache = out.clone(), cache.clone()
    expected = _forward(case, w, cache, "triton")
    assert rel_l2(replayed, expected) < 1e-6
    assert torch.equal(replayed_cache.nan_to_num(2.0), cache.nan_to_num(2.0))


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_weights_that_require_grad(backend):
    """The layer is an inference op (it writes the cache in place): with grad mode on and weights that require
    grad (an nn.Module's bf16 parameters) every backend runs it as under no_grad, output without grad."""
    case, weights = make_case([1, 3], [5, 8], dtype=torch.bfloat16, seed=9)
    expected, expected_cache = run(case, weights, backend=backend, attention_backend=backend)
    for name in ("w_k", "w_uk", "w_uv"):
        getattr(weights, name).requires_grad_(True)
    with torch.enable_grad():
        out, cache = run(case, weights, backend=backend, attention_backend=backend)
    assert not out.requires_grad
    assert torch.equal(out, expected) and torch.equal(cache.isnan(), expected_cache.isnan())
