"""The cuda backend's varlen prefill (csrc/mla_prefill_wgmma.cu, backends/cuda/mla_core_cuda/prefill.py).

CPU: what the backend declares and refuses (with the reasons), its priority and configs, and the launcher's
arguments (scales folded for the FP8 recipes, the division-free range, TMA-ready views) through a recording stand-in
for the extension. GPU (``pytest -m gpu``): against the reference backend on fresh random inputs, outputs in
NaN-filled buffers (an unwritten element fails), with the triton tests' tolerances (out rel-L2 < 1e-2, LSE within
1e-4 + 1e-5 |lse|); lengths on the 64-key and 128-row tile edges (mla_core.testing.shapes), empty sequences, causal
with a cached prefix (and len_q > len_k), non-causal, GQA, LSE, P in FP8 and the full FP8 recipe, strided and
misaligned views, K / V rows holding NaN and Inf between sequences (the kernel's TMA reads past a sequence's end),
ragged batches whose launch is mostly empty query blocks, CUDA-graph capture; the QDQ pre-pass's codes equal
mla_core.numerics' FP8 QDQ bit for bit. The fp8 recipe's FP8-wgmma config (``{"mma": "fp8"}``, csrc/mla_prefill_fp8.cu)
on the same shapes with its declared LSE tolerance (numerics.FP8_MMA_LSE_RTOL), its tile images byte for byte
against a layout built here from numerics' codes.
"""
from __future__ import annotations

import math
import pathlib
import sys

import pytest
import torch

import mla_core
from mla_core import numerics, specs
from mla_core.testing.shapes import boundary_lengths, causal_boundary_pairs
from mla_core_cuda import build
from mla_core_cuda import prefill as cuda_prefill

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from reference_math import rel_l2, same_lse  # noqa: E402

TOL = 1e-2
LSE_ATOL, LSE_RTOL = 1e-4, 1e-5
FP8 = dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), "fp8")
NVFP4 = dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), "nvfp4")
AMAX = dict(q_amax=3.5, k_amax=4.0, v_amax=3.0, p_amax=1.0)


def _problem(device="cuda", features=("lse",), **kw):
    base = dict(dtype="bfloat16", heads=128, kv_heads=128, qk_dim=192, v_dim=128, causal=1, q_quant=None,
                k_quant=None, p_quant=None, v_quant=None, block_n=64, sparsity_m=0, batch=4, max_seqlen_q=4096,
                total_k=16384)
    base.update(kw)
    return mla_core.Problem.make("prefill", device, set(features), **base)


def make_inputs(seqs, heads, kv_heads, *, seed=0, device="cuda", strided=False):
    """Packed bf16 q [total_q, heads, 192], k [total_k, kv_heads, 192], v [.., 128] (standard normal), cu_seqlens,
    max_seqlen_q. ``strided``: q a view of wider rows, k and v views into one [total_k, kv_heads, 320] buffer."""
    g = torch.Generator().manual_seed(seed)
    total_q, total_k = sum(s[0] for s in seqs), sum(s[1] for s in seqs)
    q = torch.randn(total_q, heads, 192 + (64 if strided else 0), generator=g)[..., :192]
    kv = torch.randn(total_k, kv_heads, 320, generator=g)
    k, v = kv[..., :192], kv[..., 192:]
    if not strided:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    q, k, v = (t.to(device=device, dtype=torch.bfloat16) for t in (q, k, v))
    if strided:  # .to() made them dense: rebuild the views on the device
        qw = torch.zeros(total_q, heads, 256, dtype=torch.bfloat16, device=device)
        qw[..., :192] = q
        kvw = torch.empty(total_k, kv_heads, 320, dtype=torch.bfloat16, device=device)
        kvw[..., :192], kvw[..., 192:] = k, v
        q, k, v = qw[..., :192], kvw[..., :192], kvw[..., 192:]
    cu_q = torch.tensor([0] + [sum(s[0] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    cu_k = torch.tensor([0] + [sum(s[1] for s in seqs[:i + 1]) for i in range(len(seqs))], dtype=torch.int32)
    return [q, k, v, cu_q.to(device), cu_k.to(device), max([s[0] for s in seqs] + [0])]


def run_pair(inputs, causal=True, **kw):
    """(cuda out, lse), (reference out, lse) for the same call."""
    ref = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference", **kw)
    out = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="cuda", **kw)
    return out, ref


def check(out, ref, tol=TOL, lse_rtol=LSE_RTOL):
    assert out[0].shape == ref[0].shape and out[0].dtype == ref[0].dtype == torch.bfloat16
    assert out[1].shape == ref[1].shape and out[1].dtype == torch.float32
    err = rel_l2(out[0], ref[0])
    assert err < tol, f"relative L2 {err:.3g} >= {tol}"
    finite = torch.isfinite(ref[1])
    scale = ref[1][finite].abs().max().item() if finite.any() else 0.0
    assert same_lse(out[1], ref[1], LSE_ATOL + lse_rtol * scale)
    empty = ref[1] == float("-inf")  # [heads, total_q]: rows with no visible key are exactly 0
    assert torch.all(out[0].transpose(0, 1)[empty] == 0)
    return err


# ------------------------------------------------------------------------------------------------ CPU


def test_declared_and_refused():
    backend = mla_core.get_backend("cuda")
    cap = backend.capabilities["prefill"]
    assert cap.why_not(_problem()) == []
    assert cap.why_not(_problem(causal=0, kv_heads=16, features=("lse", "gqa"), **FP8)) == []
    assert cap.why_not(_problem(**NVFP4)) == []  # the nvfp4 recipe (and any NVFP4 operand)
    assert cap.why_not(_problem(q_quant="fp8", k_quant="nvfp4", v_quant="fp8", p_quant="nvfp4")) == []
    cases = {"dtype": dict(dtype="float16"), "qk_dim": dict(qk_dim=576), "v_dim": dict(v_dim=512),
             "block_n": dict(block_n=128)}
    for name, kw in cases.items():  # one line each, with why, not the generic "(supported: ...)"
        reasons = cap.why_not(_problem(**kw))
        assert len(reasons) == 1 and reasons[0].startswith(f"{name}={kw[name]}: ") and "supported" not in reasons[0]
    reasons = cap.why_not(_problem(features=("lse", "nm_sparsity"), sparsity_m=4))
    assert len(reasons) == 1 and reasons[0].startswith("nm_sparsity: ") and "N:M" in reasons[0]
    assert "prefill" in backend.info()["ops"]


def test_why_not_explains(monkeypatch):
    """On a machine where the backend is available, why_not gives the kernel's reasons instead of the limits' lines."""
    backend = mla_core.get_backend("cuda")
    monkeypatch.setattr(type(backend), "unavailable_reason", lambda self: None)
    monkeypatch.setattr(type(backend), "device_reasons", lambda self, problem: [])
    assert backend.why_not(_problem()) == []
    reasons = backend.why_not(_problem(qk_dim=576, v_dim=512, features=("lse", "nm_sparsity"), sparsity_m=4))
    assert len(reasons) == 3 and all(":" in r for r in reasons)
    assert any("written for MLA's q/k width 192" in r for r in reasons) and any("N:M" in r for r in reasons)


def test_priority_and_configs():
    backend = mla_core.get_backend("cuda")
    assert backend.priority_for(_problem()) == backend.PRIORITY_PREFILL
    assert 200 < backend.PRIORITY_PREFILL < 250  # above triton, below cuDNN's dense / capturable path
    assert backend.configs(_problem()) == [{}, {"persistent": True}]  # the one-CTA-an-item grid stays the default
    assert backend.validate_config(_problem(), {}) == []
    assert backend.validate_config(_problem(), {"persistent": True}) == []
    assert backend.configs(_problem(**FP8)) == [{"mma": "fp8"}, {}]  # the fp8 recipe: both kernels, FP8 MMA first
    assert backend.validate_config(_problem(**FP8), {"mma": "fp8"}) == []
    for partial in (dict(p_quant="fp8"), dict(FP8, p_quant=None), dict(FP8, q_quant=None)):
        assert backend.configs(_problem(**partial)) == [{}]  # FP8 MMA only where every operand is FP8 codes
        assert backend.validate_config(_problem(**partial), {"mma": "fp8"}) != []
    # the persistent kernel: P unquantized, Q not FP8 (K / V through their pre-passes, Q's NVFP4 too)
    for covered in (dict(k_quant="fp8"), dict(k_quant="nvfp4", v_quant="fp8", q_quant="nvfp4")):
        assert backend.configs(_problem(**covered)) == [{}, {"persistent": True}]
        assert backend.validate_config(_problem(**covered), {"mma": "fp8"}) != []
    assert backend.configs(_problem(**NVFP4)) == [{}]  # the nvfp4 recipe: the bf16-wgmma kernel on NVFP4 values
    assert backend.validate_config(_problem(**NVFP4), {}) == []
    assert backend.validate_config(_problem(**NVFP4), {"mma": "fp8"}) != []
    assert backend.validate_config(_problem(**NVFP4), {"persistent": True}) != []
    assert "wgmma prefill" in backend.version


def test_sources_built():
    assert "mla_prefill_wgmma.cu" in build.SOURCES and "mla_prefill.h" in build.HEADERS
    assert "mla_prefill_fp8.cu" in build.SOURCES
    assert "mla_prefill_persistent.cu" in build.SOURCES and "mla_prefill_wgmma.cuh" in build.HEADERS


class _Recorder:
    """Stands in for the extension: records the launch and the pre-pass (codes = the values' fp8 QDQ / scale)."""

    def __init__(self):
        self.calls = []

    def fp8_codes_bf16(self, xs, outs, scales, rscales, exact_div):
        for x, out, scale, rscale in zip(xs, outs, scales, rscales):
            out.copy_(numerics.round_e4m3(numerics.divide(x.float(), scale)))
            assert rscale == float(torch.tensor(1.0) / torch.tensor(scale))  # RN(1 / scale) in float32
        self.calls.append(("codes", list(scales), exact_div))

    def prefill_wgmma(self, *args):
        self.calls.append(("prefill", args))

    def nvfp4_rows_bf16(self, xs, outs, gs, exact_div):
        for out in outs:
            out.fill_(1.0)
        self.calls.append(("nvfp4_rows", list(xs), list(outs), list(gs), exact_div))

    def nvfp4_keys_bf16(self, v, cu_k, out, g, exact_div):
        out.fill_(1.0)
        self.calls.append(("nvfp4_keys", v, cu_k, out, g, exact_div))

    def fp8_tile_image_slots(self, total_k, batch):
        return total_k // 64 + batch + 1

    def fp8_tile_images(self, *args):
        self.calls.append(("images", args))

    def prefill_fp8(self, *args):
        self.calls.append(("prefill_fp8", args))


def _call(inputs, causal=True, return_lse=True, **kw):
    args = dict(q_quant=None, k_quant=None, p_quant=None, v_quant=None, q_amax=None, k_amax=None, p_amax=1.0,
                v_amax=None, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64,
                block_n=64)
    args.update(kw)
    return specs.validate_prefill(*inputs, None, causal, return_lse, **args)[1]


def _f32(x):
    return float(torch.tensor(x, dtype=torch.float32))


def test_launch_arguments_bf16():
    inputs = make_inputs([(5, 9), (0, 3)], 2, 1, device="cpu")
    rec = _Recorder()
    out, lse = cuda_prefill.run(rec, _call(inputs), {})
    assert out.shape == (5, 2, 128) and out.dtype == torch.bfloat16 and lse.shape == (2, 5)
    (kind, args), = rec.calls
    q, k, v, cu_q, cu_k, max_q, o, l, causal, scale_log2, out_scale, p_fmt, p_scale, p_rscale, q_fmt, q_scale, _ = args
    assert q is inputs[0] and k is inputs[1] and v is inputs[2]  # dense, aligned: no copies
    assert cu_q.dtype == torch.int32 and max_q == 5 and o is out and l is lse and causal is True
    assert scale_log2 == pytest.approx(192 ** -0.5 * math.log2(math.e), rel=1e-6)
    assert (out_scale, p_fmt, p_scale, q_fmt, q_scale) == (1.0, 0, 1.0, 0, 1.0)


def test_launch_arguments_persistent():
    """The persistent config: the same arguments as ``{}`` and a zeroed int64 item counter after them (none for
    ``{}``: a binding from before it takes 17); P quantized or Q's FP8 codes are refused."""
    inputs = make_inputs([(5, 9), (0, 3)], 2, 1, device="cpu")
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs), {})
    cuda_prefill.run(rec, _call(inputs), {"persistent": True})
    (_, grid), (_, persistent) = rec.calls
    assert len(grid) == 17 and len(persistent) == 18
    assert all(a is b or a == b for a, b in zip(grid[:5], persistent[:5]))
    assert grid[8:] == persistent[8:17]
    counter = persistent[17]
    assert counter.dtype == torch.int64 and counter.shape == (1,) and int(counter) == 0
    for kw in (dict(p_quant="fp8"), dict(q_quant="fp8", q_amax=2.0)):
        with pytest.raises(ValueError, match="persistent"):
            cuda_prefill.run(_Recorder(), _call(inputs, **kw), {"persistent": True})


def test_launch_arguments_fp8_recipe():
    inputs = make_inputs([(5, 9)], 2, 2, device="cpu")
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, **FP8, **AMAX), {})
    assert [c[0] for c in rec.calls] == ["codes", "prefill"]  # K and V's codes in one launch, Q's in the kernel
    _, scales, exact_div = rec.calls[0]
    assert scales == [_f32(4.0 / 448), _f32(3.0 / 448)] and exact_div is False
    args = rec.calls[-1][1]
    q, k, v = args[:3]
    assert q is inputs[0] and k.dtype == torch.bfloat16
    assert torch.equal(k.float() * scales[0], numerics.qdq_fp8(inputs[1], 4.0))
    assert torch.equal(v.float() * scales[1], numerics.qdq_fp8(inputs[2], 3.0))
    scale_log2, out_scale, p_fmt, p_scale, p_rscale, q_fmt, q_scale, q_rscale = args[9:]
    assert (q_fmt, q_scale) == (1, _f32(3.5 / 448)) and q_rscale == float(torch.tensor(1.0) / torch.tensor(q_scale))
    assert scale_log2 == pytest.approx(192 ** -0.5 * q_scale * scales[0] * math.log2(math.e), rel=1e-6)
    assert p_fmt == 1 and p_scale == _f32(1 / 448)
    assert p_rscale == float(torch.tensor(1.0) / torch.tensor(p_scale))  # the float32 quotient: 447.99997
    assert out_scale == pytest.approx(scales[1] * p_scale, rel=1e-7)


def test_prepass_operands_and_its_division():
    """Only quantized K / V go through the pre-pass (their factors folded, the others' 1); one factor outside the
    division-free range makes the launch take the IEEE division; Q's codes are the kernel's (q_fmt), its factor
    outside the range -> q_fmt 2."""
    inputs = make_inputs([(5, 9)], 2, 2, device="cpu")
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, k_quant="fp8", k_amax=4.0), {})
    (_, scales, exact_div), (_, args) = rec.calls
    assert scales == [_f32(4.0 / 448)] and exact_div is False
    assert args[0] is inputs[0] and args[2] is inputs[2] and torch.equal(args[1].float() * scales[0],
                                                                          numerics.qdq_fp8(inputs[1], 4.0))
    assert args[9] == pytest.approx(192 ** -0.5 * scales[0] * math.log2(math.e), rel=1e-6) and args[10] == 1.0
    assert args[14:16] == (0, 1.0)
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, q_quant="fp8", v_quant="fp8", q_amax=1e-14, v_amax=1e-14), {})
    (_, scales, exact_div), (_, args) = rec.calls
    assert scales == [_f32(1e-14 / 448)] and exact_div is True
    assert args[0] is inputs[0] and args[1] is inputs[1] and args[10] == scales[0]
    assert args[14:16] == (2, _f32(1e-14 / 448))
    assert args[9] == pytest.approx(192 ** -0.5 * args[15] * math.log2(math.e), rel=1e-6)
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, q_quant="fp8", q_amax=2.0), {})
    (kind, args), = rec.calls  # nothing for the pre-pass
    assert kind == "prefill" and args[14:16] == (1, _f32(2.0 / 448))


def test_launch_arguments_fp8_mma():
    """The FP8-wgmma config: one tile-image pre-pass over K and V (slots total_k / 64 + batch + 1), then the kernel
    with Q's and P's factors; the factors folded as the default config folds them; each launch takes the IEEE
    division exactly when one of its own factors is outside the division-free range."""
    inputs = make_inputs([(5, 9), (0, 70)], 4, 2, device="cpu")
    rec = _Recorder()
    out, lse = cuda_prefill.run(rec, _call(inputs, **FP8, **AMAX), cuda_prefill.FP8_MMA)
    (kind, pre), (kind2, args) = rec.calls
    assert (kind, kind2) == ("images", "prefill_fp8")
    k, v, cu_k, images, k_scale, k_rscale, v_scale, v_rscale, exact = pre
    assert k is inputs[1] and v is inputs[2] and cu_k.dtype == torch.int32
    assert images.shape == (79 // 64 + 2 + 1, 2, 20480) and images.dtype == torch.uint8
    assert (k_scale, v_scale, exact) == (_f32(4.0 / 448), _f32(3.0 / 448), False)
    assert k_rscale == cuda_prefill._f32_reciprocal(k_scale) and v_rscale == cuda_prefill._f32_reciprocal(v_scale)
    q, img, cu_q, cu_k2, max_q, total_k, o, l, causal, scale_log2, out_scale, q_scale, q_rscale, p_scale, p_rscale, \
        exact = args
    assert q is inputs[0] and img is images and (max_q, total_k, causal, exact) == (5, 79, True, False)
    assert o is out and l is lse and out.shape == (5, 4, 128)
    assert (q_scale, p_scale) == (_f32(3.5 / 448), _f32(1 / 448))
    assert q_rscale == cuda_prefill._f32_reciprocal(q_scale) and p_rscale == cuda_prefill._f32_reciprocal(p_scale)
    assert scale_log2 == pytest.approx(192 ** -0.5 * q_scale * k_scale * math.log2(math.e), rel=1e-6)
    assert out_scale == pytest.approx(v_scale * p_scale, rel=1e-7)
    for amaxes, flags in ((dict(q_amax=1e-14), (False, True)), (dict(p_amax=1e-20), (False, True)),
                          (dict(k_amax=1e-14), (True, False)), (dict(v_amax=1e-14), (True, False))):
        rec = _Recorder()
        cuda_prefill.run(rec, _call(inputs, **FP8, **dict(AMAX, **amaxes)), cuda_prefill.FP8_MMA)
        assert (rec.calls[0][1][-1], rec.calls[1][1][-1]) == flags, amaxes


def test_fp8_mma_runs_the_fp8_recipe_only():
    inputs = make_inputs([(3, 3)], 1, 1, device="cpu")
    for kw in (dict(), dict(FP8, p_quant=None), dict(p_quant="fp8")):
        with pytest.raises(ValueError, match="fp8 recipe only"):
            cuda_prefill.run(_Recorder(), _call(inputs, **kw), cuda_prefill.FP8_MMA)


def test_launch_arguments_nvfp4_recipe():
    """The nvfp4 recipe on the bf16-wgmma kernel: K through the pre-pass along features, V through the pre-pass
    along keys (with cu_seqlens_k), their outputs the kernel's operands; Q's values made in the kernel (q_fmt 3,
    q_scale = Q's g, Q itself the operand); the global scales g = amax / 2688 (float32) folded into the score scale
    (Q's and K's) and the output scale (V's and P's); P's NVFP4 in the kernel (p_fmt 3, p_scale = P's g); no FP8
    pre-pass."""
    inputs = make_inputs([(5, 9), (0, 70)], 4, 2, device="cpu")
    rec = _Recorder()
    out, lse = cuda_prefill.run(rec, _call(inputs, **NVFP4, **AMAX), {})
    assert [c[0] for c in rec.calls] == ["nvfp4_rows", "nvfp4_keys", "prefill"]
    _, xs, outs, gs, exact = rec.calls[0]
    assert len(xs) == 1 and xs[0] is inputs[1] and exact is False
    assert gs == [_f32(4.0 / 2688)]
    _, v, cu_k, v_out, g_v, exact_v = rec.calls[1]
    assert v is inputs[2] and cu_k.dtype == torch.int32 and cu_k.tolist() == [0, 9, 79]
    assert g_v == _f32(3.0 / 2688) and exact_v is False
    args = rec.calls[2][1]
    assert args[0] is inputs[0] and args[1] is outs[0] and args[2] is v_out and args[7] is lse
    scale_log2, out_scale, p_fmt, p_scale, p_rscale, q_fmt, q_scale, q_rscale = args[9:]
    assert scale_log2 == pytest.approx(192 ** -0.5 * q_scale * gs[0] * math.log2(math.e), rel=1e-6)
    assert (p_fmt, p_scale, q_fmt, q_scale) == (3, _f32(1.0 / 2688), 3, _f32(3.5 / 2688))
    assert p_rscale == cuda_prefill._f32_reciprocal(p_scale) and q_rscale == cuda_prefill._f32_reciprocal(q_scale)
    assert out_scale == pytest.approx(g_v * p_scale, rel=1e-7) and out_scale == _f32(out_scale)


def test_nvfp4_q_without_nvfp4_p_goes_through_the_prepass():
    """Q's NVFP4 values are made in the kernel only by the instances with P's NVFP4 (p_fmt 3 / 4): with P unquantized
    or FP8, Q goes through the pre-pass along features with K (one launch) and the kernel gets q_fmt 0."""
    inputs = make_inputs([(5, 9)], 2, 2, device="cpu")
    for p_kw, p_fmt in ((dict(p_quant=None), 0), (dict(p_quant="fp8"), 1)):
        rec = _Recorder()
        cuda_prefill.run(rec, _call(inputs, **dict(NVFP4, **p_kw), **AMAX), {})
        assert [c[0] for c in rec.calls] == ["nvfp4_rows", "nvfp4_keys", "prefill"]
        _, xs, outs, gs, _ = rec.calls[0]
        assert xs[0] is inputs[0] and xs[1] is inputs[1] and gs == [_f32(3.5 / 2688), _f32(4.0 / 2688)]
        args = rec.calls[2][1]
        assert args[0] is outs[0] and args[11] == p_fmt and args[14:16] == (0, 1.0)


def test_nvfp4_operands_mixed_with_fp8_and_the_ieee_division():
    """NVFP4 and FP8 operands mix (Q's FP8 codes in the kernel, K's NVFP4 values, V's FP8 codes, P's NVFP4); a g
    outside the division-free range makes its own launch take the IEEE division (V's keys launch alone, P: p_fmt 4,
    Q's values in the kernel: q_fmt 4);
    a strided Q / K view goes to the pre-pass as it is (it reads token / head strides)."""
    inputs = make_inputs([(5, 9)], 2, 2, device="cpu", strided=True)
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, q_quant="fp8", k_quant="nvfp4", v_quant="fp8", p_quant="nvfp4", **AMAX), {})
    assert [c[0] for c in rec.calls] == ["nvfp4_rows", "codes", "prefill"]
    assert rec.calls[0][1][0] is inputs[1] and rec.calls[0][3] == [_f32(4.0 / 2688)]
    args = rec.calls[-1][1]
    assert args[0] is inputs[0] and args[1] is rec.calls[0][2][0] and args[14:16] == (1, _f32(3.5 / 448))
    assert args[9] == pytest.approx(192 ** -0.5 * _f32(3.5 / 448) * _f32(4.0 / 2688) * math.log2(math.e), rel=1e-6)
    assert args[11:13] == (3, _f32(1.0 / 2688))
    assert args[10] == pytest.approx(_f32(3.0 / 448) / 2688, rel=1e-6)
    for amaxes, flags in ((dict(q_amax=1e-14), (False, False, 3, 4)), (dict(k_amax=1e-14), (True, False, 3, 3)),
                          (dict(v_amax=1e-14), (False, True, 3, 3)), (dict(p_amax=1e-20), (False, False, 4, 3))):
        rec = _Recorder()
        cuda_prefill.run(rec, _call(inputs, **NVFP4, **dict(AMAX, **amaxes)), {})  # (K's, V's, P's, Q's division)
        assert (rec.calls[0][-1], rec.calls[1][-1], rec.calls[2][1][11], rec.calls[2][1][14]) == flags, amaxes


def test_p_nvfp4_register_layout_emulation(monkeypatch):
    """The kernel's P NVFP4 steps (accumulator registers of a 16-key block, quad shuffles, owner lanes of the block
    codes), emulated on the CPU over 64 x 64 tiles, give numerics.nvfp4_unscaled of P in bf16
    (benchmarks/probes/prefill_p_nvfp4_emulation.py)."""
    import importlib.util
    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("p_nvfp4_emulation",
                                                  root / "benchmarks/probes/prefill_p_nvfp4_emulation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0


def test_q_nvfp4_swizzle_emulation():
    """The kernel's Q NVFP4 step (q_nvfp4: every aligned 32-byte unit of the 128-byte-swizzled Q tile one block),
    emulated on the CPU over a warpgroup's 64 x 192 rows, gives the pre-pass's values (numerics.nvfp4_unscaled along
    features) bit for bit, and mutant 35's unit layout does not (benchmarks/probes/q_nvfp4_swizzle_emulation.py)."""
    import importlib.util
    root = pathlib.Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location("q_nvfp4_emulation",
                                                  root / "benchmarks/probes/q_nvfp4_swizzle_emulation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main() == 0


def test_p_scale_outside_the_division_free_range_takes_ieee_division():
    inputs = make_inputs([(3, 3)], 1, 1, device="cpu")
    rec = _Recorder()
    cuda_prefill.run(rec, _call(inputs, p_quant="fp8", p_amax=1e-20), {})
    assert rec.calls[-1][1][11] == 2


def test_views_tma_cannot_address_are_copied():
    x = torch.zeros(10, 4, 200, dtype=torch.bfloat16)
    view = x[..., :192]
    assert cuda_prefill._tma_ready(view) is view  # strides 800 / 400 bytes: TMA reads it in place
    odd = torch.zeros(10, 4, 197, dtype=torch.bfloat16)[..., :192]  # 394-byte head stride
    copy = cuda_prefill._tma_ready(odd)
    assert copy is not odd and copy.is_contiguous() and torch.equal(copy, odd)
    shifted = torch.zeros(10 * 4 * 192 + 1, dtype=torch.bfloat16)[1:].view(10, 4, 192)  # data 2 bytes off
    assert cuda_prefill._tma_ready(shifted).data_ptr() % 16 == 0


def test_launcher_refuses_what_it_does_not_cover():
    inputs = make_inputs([(3, 3)], 1, 1, device="cpu")
    inputs[:3] = [t.half() for t in inputs[:3]]
    with pytest.raises(ValueError, match="bf16"):
        cuda_prefill.run(None, _call(inputs), {})


def test_no_keys_at_all_gives_empty_rows():
    inputs = make_inputs([(4, 0), (2, 0)], 2, 2, device="cpu")
    out, lse = cuda_prefill.run(None, _call(inputs), {})  # nothing launched
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


# ------------------------------------------------------------------------------------------------ GPU


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every output the cuda kernel gets starts as NaN."""
    monkeypatch.setattr(cuda_prefill, "_new_output",
                        lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device))


gpu = pytest.mark.gpu
LENGTHS = boundary_lengths([64, 128], limit=257)  # 0, 1, 63..65, 127..129, 255..257


@gpu
def test_gpu_backend_available():
    backend = mla_core.get_backend("cuda")
    assert backend.unavailable_reason() is None
    assert backend.why_not(_problem()) == []


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_boundary_lengths(poisoned_outputs, causal):
    seqs = [(n, n) for n in LENGTHS] + [(5, 0), (0, 7)]
    check(*run_pair(make_inputs(seqs, 4, 4, seed=int(causal)), causal=causal))


@gpu
def test_gpu_cached_prefix_and_gqa(poisoned_outputs):
    """Causal with len_q < len_k (the query tile's last key on a key-tile edge), len_q > len_k (rows with no key),
    8 heads over 2 kv heads."""
    seqs = list(causal_boundary_pairs(128, 64)) + [(1, 1000), (300, 2000), (200, 129), (65, 1), (130, 64)]
    check(*run_pair(make_inputs(seqs, 8, 2, seed=3), causal=True))
    check(*run_pair(make_inputs(seqs[-6:], 8, 2, seed=4), causal=False))


@gpu
@pytest.mark.parametrize("recipe", ["p_fp8", "fp8", "fp8_bf16_mma"])
def test_gpu_fp8(poisoned_outputs, recipe):
    """P in FP8 alone, and the fp8 recipe: through dispatch (its default config is FP8 wgmma, the LSE within
    FP8_MMA_LSE_RTOL) and on the bf16-wgmma config ``{}`` (the codes' products exact: the LSE at the exact bound)."""
    kw = dict(p_quant="fp8", p_amax=0.75) if recipe == "p_fp8" else dict(FP8, **AMAX)
    inputs = make_inputs([(129, 129), (64, 300), (1, 65), (0, 9)], 4, 2, seed=5)
    if recipe == "fp8_bf16_mma":
        ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **kw)
        out = cuda_prefill.run(build.build(), _call(inputs, causal=True, **kw), {})
        check(out, ref)
    elif recipe == "fp8":
        out, ref = run_pair(inputs, causal=True, **kw)
        check_fp8_mma(out, ref)
    else:
        out, ref = run_pair(inputs, causal=True, **kw)
        check(out, ref)
    plain = mla_core.mla_prefill(*inputs, causal=True, backend="cuda")
    assert rel_l2(out[0], plain) > 2e-2  # the rounding is there


@gpu
def test_gpu_mla_heads_and_lengths(poisoned_outputs):
    """128 heads, a sequence of 1,100 keys, bf16 and the fp8 recipe (through dispatch: its FP8-wgmma default; on the
    bf16-wgmma config ``{}`` at the exact LSE bound)."""
    inputs = make_inputs([(1100, 1100), (300, 700)], 128, 128, seed=6)
    check(*run_pair(inputs, causal=True))
    out, ref = run_pair(inputs, causal=True, **FP8, **AMAX)
    check_fp8_mma(out, ref)
    check(cuda_prefill.run(build.build(), _call(inputs, **FP8, **AMAX), {}), ref)


def _check_nan_and_inf_rows(run, seed):
    """``run(inputs, causal=...)`` -> (out, ref) on a batch whose key-only sequence holds NaN / Inf K and V rows right
    after a partial last tile and whose query-only sequence holds NaN Q rows: finite outputs, equal to the reference."""
    seqs = [(100, 100), (0, 50), (70, 130), (3, 0), (64, 65), (0, 40), (1, 1)]
    inputs = make_inputs(seqs, 4, 4, seed=seed)
    q, k, v = inputs[:3]
    k[100:150, :, ::2], k[100:150, :, 1::2] = float("nan"), float("inf")
    v[100:150, :, ::2], v[100:150, :, 1::2] = float("-inf"), float("nan")
    q[170:173] = float("nan")
    k[345:385], v[345:385] = float("inf"), float("nan")
    for causal in (True, False):
        out, ref = run(inputs, causal=causal)
        assert not out[0].isnan().any() and not out[1].isnan().any()
        check(out, ref)


@gpu
def test_gpu_nan_and_inf_rows_between_sequences(poisoned_outputs):
    """A sequence with keys but no queries holds NaN / Inf K and V rows right after sequences whose last tile is
    partial (the kernel's TMA boxes read them); a sequence with queries but no keys holds NaN Q rows."""
    _check_nan_and_inf_rows(run_pair, seed=7)


@gpu
def test_gpu_strided_and_misaligned_views(poisoned_outputs):
    seqs = [(70, 200), (128, 128)]
    inputs = make_inputs(seqs, 4, 2, seed=8, strided=True)
    assert not inputs[1].is_contiguous()
    check(*run_pair(inputs, causal=True))
    q = inputs[0]
    flat = torch.empty(q.numel() + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(q.shape)  # data 2 bytes past a 16-byte boundary: copied first
    shifted.copy_(q)
    check(*run_pair([shifted] + inputs[1:], causal=True))


@gpu
def test_gpu_ragged_batch_of_mostly_empty_blocks(poisoned_outputs):
    """Many short sequences under a long one's block count (most query blocks of the launch empty), sequences without
    queries or keys among them, and single-block launches (one head, one short sequence)."""
    seqs = ([(1, 1)] * 20 + [(0, 9), (700, 700), (0, 0), (129, 300), (5, 0), (0, 3)] + [(64, 64)] * 6
            + [(1500, 1500), (2, 1)])
    check(*run_pair(make_inputs(seqs, 8, 2, seed=12), causal=True))
    check(*run_pair(make_inputs(seqs[-4:], 8, 2, seed=13), causal=False))
    for seqs in ([(100, 100)], [(1, 1)], [(3, 700)]):
        check(*run_pair(make_inputs(seqs, 1, 1, seed=14), causal=True))


@gpu
def test_gpu_without_lse_and_int64_cu_seqlens():
    inputs = make_inputs([(65, 130), (3, 3)], 2, 2, seed=9)
    ref = mla_core.mla_prefill(*inputs, backend="reference")
    inputs[3], inputs[4] = inputs[3].long(), inputs[4].long()
    out = mla_core.mla_prefill(*inputs, backend="cuda")
    assert rel_l2(out, ref) < TOL


@gpu
def test_gpu_qdq_prepass_codes_equal_the_numerics_definition():
    """fp8_codes_bf16's codes times the float32 scale are mla_core.numerics.qdq_fp8 bit for bit: ties, the
    saturation at 448, subnormal codes, Inf (clamped), -0 and NaN included; the division-free quotient (factors
    inside the range, three operands in one launch) and the IEEE one (a factor outside it)."""
    module, reason = build.load_or_reason()
    assert module is not None, reason
    g = torch.Generator().manual_seed(10)
    x = torch.cat([torch.randn(4096, generator=g) * 3, torch.randn(1024, generator=g) * 1e-3,
                   torch.tensor([448.0, 464.0, 480.0, -1e4, 2.0 ** -10, 3 * 2.0 ** -10, float("inf"),
                                 float("-inf"), float("nan"), 0.0, -0.0, 17.0, 18.0, 19.0, 20.0, 0.6875])])
    x = torch.nn.functional.pad(x, (0, -x.numel() % 8)).to(torch.bfloat16).cuda()
    for amaxes in ((None, 448.0, 3.0), (26.88, 1e-14), (1e22,)):
        made = cuda_prefill.fp8_codes(module, [(x, amax) for amax in amaxes])
        for amax, (codes, scale) in zip(amaxes, made):
            got = codes.float() * torch.tensor(scale, dtype=torch.float32, device="cuda")
            want = numerics.qdq_fp8(x, amax)
            assert torch.equal(got.isnan(), want.isnan())
            assert torch.equal(got[~got.isnan()], want[~want.isnan()])
            assert torch.equal(codes.float().signbit()[~got.isnan()], (want / scale).signbit()[~want.isnan()])


@gpu
@pytest.mark.parametrize("q_amax", [3.5, 1e-14, 1e-40])
def test_gpu_q_codes_in_the_kernel_equal_the_prepass_codes(q_amax):
    """The kernel's Q codes (q_fmt 1: division-free; q_amax 1e-14 / 1e-40: q_fmt 2, IEEE, the second a subnormal
    factor whose reciprocal is Inf) give the outputs and LSE of the
    kernel run on the pre-pass's Q codes bit for bit; Q holds ties, values past 448 · scale, Inf, -0 and tiny values,
    rows of a sequence without keys NaN; q a strided view (TMA reads it in place)."""
    module, reason = build.load_or_reason()
    assert module is not None, reason
    seqs = [(130, 130), (64, 200), (3, 0), (1, 1)]
    inputs = make_inputs(seqs, 4, 2, seed=12, strided=True)
    q, k, v, cu_q, cu_k, max_q = inputs
    scale = _f32(q_amax / 448)
    special = torch.tensor([448.0, 464.0, 1e4, float("inf"), float("-inf"), -0.0, 2.0 ** -10, 3 * 2.0 ** -10,
                            17.0, 18.0, 19.0, -1e-30])
    q[:20, 0, :12] = (special * scale).to(torch.bfloat16)
    q[194:197] = float("nan")
    (codes, _), = cuda_prefill.fp8_codes(module, [(q, q_amax)])
    scale_log2 = _f32(192 ** -0.5) * scale * math.log2(math.e)
    q_fmt = 1 if cuda_prefill.EXACT_DIV_FREE_RANGE[0] <= scale <= cuda_prefill.EXACT_DIV_FREE_RANGE[1] else 2
    assert q_fmt == (1 if q_amax == 3.5 else 2) and scale > 0
    got, want = [], []
    for qx, fmt, out in ((q, q_fmt, got), (codes, 0, want)):
        o = torch.full((q.shape[0], 4, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((4, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
        module.prefill_wgmma(qx, k, v, cu_q, cu_k, max_q, o, lse, True, scale_log2, 1.0, 0, 1.0, 1.0, fmt, scale,
                             cuda_prefill._f32_reciprocal(scale))
        out += [o, lse]
    assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


@gpu
def test_gpu_cuda_graph_capture(poisoned_outputs):
    inputs = make_inputs([(300, 300), (10, 77)], 4, 4, seed=11)
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference")
    eager = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            got = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cuda")
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    check(got, ref)


# ------------------------------------------------------------------ GPU: the persistent config {"persistent": True}

PERSISTENT = {"persistent": True}


def _bit_equal_to_grid(inputs, causal, **kw):
    """The persistent kernel's output and LSE equal the one-CTA-an-item kernel's bit for bit (NaN where it has NaN),
    both from NaN-poisoned buffers (rows the grid leaves unwritten stay NaN in both)."""
    call = _call(inputs, causal=causal, **kw)
    module = build.build()
    grid = cuda_prefill.run(module, call, {})
    persistent = cuda_prefill.run(module, call, PERSISTENT)
    for g, p in zip(grid, persistent):
        assert torch.equal(g.isnan(), p.isnan())
        assert torch.equal(g.nan_to_num(), p.nan_to_num())
    return persistent


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_persistent_boundary_lengths_bit_equal(poisoned_outputs, causal):
    """Ragged lengths 0, 1, 63..65, ..., 255..257 (tail tiles in many items, items without a key), against the
    reference and bit for bit against the default config."""
    seqs = [(n, n) for n in LENGTHS] + [(5, 0), (0, 7)]
    inputs = make_inputs(seqs, 4, 4, seed=20 + int(causal))
    out = _bit_equal_to_grid(inputs, causal)
    check(out, mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference"))


@gpu
def test_gpu_persistent_gqa_cached_prefix_and_mostly_empty_blocks(poisoned_outputs):
    """GQA (8 heads over 2), len_q < len_k and len_q > len_k (rows without a key), many short sequences under a long
    one's block count (most blocks of the old grid empty), and single items (one head, one short sequence)."""
    seqs = ([(1, 1)] * 20 + [(0, 9), (700, 700), (0, 0), (129, 300), (5, 0), (0, 3), (1, 1000), (200, 129)]
            + [(64, 64)] * 6 + [(1500, 1500), (2, 1)])
    for causal in (True, False):
        _bit_equal_to_grid(make_inputs(seqs, 8, 2, seed=22), causal)
    for seqs in ([(100, 100)], [(1, 1)], [(3, 700)]):
        _bit_equal_to_grid(make_inputs(seqs, 1, 1, seed=23), True)


@gpu
def test_gpu_persistent_more_items_than_sms_and_kv_prepass(poisoned_outputs):
    """128 heads x 3 sequences (hundreds of items a CTA claims in turn, long and short), and K / V through the FP8
    pre-pass (the kernel on their codes): bit-equal to the default config."""
    inputs = make_inputs([(1100, 1100), (300, 700), (129, 129)], 128, 128, seed=24)
    _bit_equal_to_grid(inputs, True)
    _bit_equal_to_grid(inputs, True, k_quant="fp8", v_quant="fp8", k_amax=4.0, v_amax=4.0)


@gpu
def test_gpu_persistent_nan_and_inf_rows_between_sequences(poisoned_outputs):
    """NaN / Inf K and V rows past partial last tiles (the persistent kernel's own tail guard, one tailV a stage) and
    NaN Q rows of a sequence without keys: finite, equal to the reference and to the default config bit for bit."""
    def run(inputs, causal):
        out = _bit_equal_to_grid(inputs, causal)
        return out, mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference")
    _check_nan_and_inf_rows(run, seed=26)


@gpu
def test_gpu_persistent_counter_zeroed_per_call_and_graph_capture(poisoned_outputs):
    """Two calls in a row and a captured graph replayed twice: the counter is zeroed for each (a stale one would
    leave rows unwritten: NaN)."""
    inputs = make_inputs([(300, 300), (10, 77)], 4, 4, seed=25)
    module = build.build()
    call = _call(inputs, causal=True)
    eager = cuda_prefill.run(module, call, PERSISTENT)
    again = cuda_prefill.run(module, call, PERSISTENT)
    assert torch.equal(eager[0], again[0]) and torch.equal(eager[1], again[1])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            got = cuda_prefill.run(module, call, PERSISTENT)
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(2):
        got[0].fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])


# ------------------------------------------------------------------------ GPU: the FP8-wgmma config {"mma": "fp8"}


def run_fp8_mma(inputs, causal=True, **amax):
    """(the FP8-wgmma config's out, lse), (reference out, lse) for the fp8 recipe (AMAX unless given)."""
    kw = dict(FP8, **dict(AMAX, **amax))
    ref = mla_core.mla_prefill(*inputs, causal=causal, return_lse=True, backend="reference", **kw)
    out = cuda_prefill.run(build.build(), _call(inputs, causal=causal, **kw), cuda_prefill.FP8_MMA)
    return out, ref


def check_fp8_mma(out, ref):
    """The out tolerance as every kernel's, the LSE within the FP8-MMA score tolerance (docs/numerics.md). A failure
    names both errors: the LSE depends on S alone (Q / K layouts), the output on P·V too (P's fragments, V^T)."""
    finite = torch.isfinite(ref[1])
    scale = ref[1][finite].abs().max().item() if finite.any() else 0.0
    dlse = (out[1][finite] - ref[1][finite]).abs().max().item() if finite.any() else 0.0
    try:
        return check(out, ref, lse_rtol=numerics.FP8_MMA_LSE_RTOL)
    except AssertionError as e:
        raise AssertionError(f"{e}; out rel-L2 {rel_l2(out[0], ref[0]):.3g}, max |dLSE| {dlse:.3g} "
                             f"(max |LSE| {scale:.3g})") from None


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_fp8_mma_boundary_lengths(poisoned_outputs, causal):
    seqs = [(n, n) for n in LENGTHS] + [(5, 0), (0, 7)]
    check_fp8_mma(*run_fp8_mma(make_inputs(seqs, 4, 4, seed=20 + int(causal)), causal=causal))


@gpu
def test_gpu_fp8_mma_cached_prefix_and_gqa(poisoned_outputs):
    seqs = list(causal_boundary_pairs(128, 64)) + [(1, 1000), (300, 2000), (200, 129), (65, 1), (130, 64)]
    check_fp8_mma(*run_fp8_mma(make_inputs(seqs, 8, 2, seed=22), causal=True))
    check_fp8_mma(*run_fp8_mma(make_inputs(seqs[-6:], 8, 2, seed=23), causal=False))


@gpu
def test_gpu_fp8_mma_mla_heads_and_lengths(poisoned_outputs):
    """128 heads, 1,100 keys; the two configs of the fp8 recipe agree (the same codes, other summation)."""
    inputs = make_inputs([(1100, 1100), (300, 700)], 128, 128, seed=24)
    out, ref = run_fp8_mma(inputs)
    check_fp8_mma(out, ref)
    default = cuda_prefill.run(build.build(), _call(inputs, **FP8, **AMAX), {})
    assert rel_l2(out[0], default[0]) < TOL


@gpu
def test_gpu_fp8_mma_nan_and_inf_rows_between_sequences(poisoned_outputs):
    """K / V rows of a sequence without queries hold NaN / Inf (their tile images too, never read); rows of a
    sequence with queries but no keys hold NaN Q."""
    seqs = [(100, 100), (0, 50), (70, 130), (3, 0), (64, 65), (0, 40), (1, 1)]
    inputs = make_inputs(seqs, 4, 4, seed=25)
    q, k, v = inputs[:3]
    k[100:150, :, ::2], k[100:150, :, 1::2] = float("nan"), float("inf")
    v[100:150, :, ::2], v[100:150, :, 1::2] = float("-inf"), float("nan")
    q[170:173] = float("nan")
    k[345:385], v[345:385] = float("inf"), float("nan")
    for causal in (True, False):
        out, ref = run_fp8_mma(inputs, causal=causal)
        assert not out[0].isnan().any() and not out[1].isnan().any()
        check_fp8_mma(out, ref)


@gpu
def test_gpu_fp8_mma_ragged_strided_and_single_blocks(poisoned_outputs):
    """Many short sequences under a long one (most query blocks empty), strided K / V views read in place by the
    pre-pass, a misaligned q (copied), single-block launches."""
    seqs = ([(1, 1)] * 20 + [(0, 9), (700, 700), (0, 0), (129, 300), (5, 0), (0, 3)] + [(64, 64)] * 6
            + [(1500, 1500), (2, 1)])
    check_fp8_mma(*run_fp8_mma(make_inputs(seqs, 8, 2, seed=26), causal=True))
    inputs = make_inputs([(70, 200), (128, 128)], 4, 2, seed=27, strided=True)
    assert not inputs[1].is_contiguous()
    check_fp8_mma(*run_fp8_mma(inputs))
    flat = torch.empty(inputs[0].numel() + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(inputs[0].shape)
    shifted.copy_(inputs[0])
    check_fp8_mma(*run_fp8_mma([shifted] + inputs[1:]))
    for seqs in ([(100, 100)], [(1, 1)], [(3, 700)]):
        check_fp8_mma(*run_fp8_mma(make_inputs(seqs, 1, 1, seed=28), causal=True))


@gpu
@pytest.mark.parametrize("amax", [dict(q_amax=2e-38), dict(k_amax=1e-14, v_amax=1e-14), dict(p_amax=1e-20)],
                         ids=["q_subnormal_factor", "kv_ieee", "p_ieee"])
def test_gpu_fp8_mma_factors_outside_the_division_free_range(poisoned_outputs, amax):
    """The IEEE division where a factor is outside the division-free range (q_amax 2e-38, a normal float as the op
    requires: its factor amax / 448 is subnormal, whose reciprocal is Inf, so the division-free form would make zeros
    NaN); the operands scaled to their amax."""
    inputs = make_inputs([(130, 130), (64, 200), (1, 1)], 4, 2, seed=29)
    for i, name in enumerate("qkv"):
        if f"{name}_amax" in amax:
            inputs[i].mul_(amax[f"{name}_amax"] / AMAX[f"{name}_amax"])
    out, ref = run_fp8_mma(inputs, **amax)
    assert not out[0].isnan().any()
    check_fp8_mma(out, ref)


def _expected_tile_images(k, v, cu_k, k_scale, v_scale, slots):
    """The tile images built here from numerics' codes (csrc/mla_prefill_fp8.cu's layout): {(slot, kv head): bytes}."""
    kc = numerics.round_e4m3(numerics.divide(k.float(), k_scale)).to(torch.float8_e4m3fn).view(torch.uint8).cpu()
    vc = numerics.round_e4m3(numerics.divide(v.float(), v_scale)).to(torch.float8_e4m3fn).view(torch.uint8).cpu()

    def sw64(r, b):  # byte b of row r in a [rows x 64 B] part, 64-byte swizzle
        return r * 64 + ((((b >> 4) ^ (r >> 1)) & 3) << 4) + (b & 15)

    src = torch.empty(20480, dtype=torch.long)  # image byte -> index into a tile's [64 x 320] (K ++ V) codes
    for r in range(64):
        for f in range(192):
            src[(f // 64) * 4096 + sw64(r, f % 64)] = r * 320 + f
    for d in range(128):
        for pos in range(64):
            q = pos % 32  # position 16 h + 4 c + 2 g1 + b holds key 8 (2 h + g1) + 2 c + b of its 32-key group
            key = 32 * (pos // 32) + 8 * (2 * (q >> 4) + ((q >> 1) & 1)) + 2 * ((q >> 2) & 3) + (q & 1)
            src[12288 + sw64(d, pos)] = key * 320 + 192 + d
    images = {}
    cu = cu_k.tolist()
    for b in range(len(cu) - 1):
        start, length = cu[b], cu[b + 1] - cu[b]
        for i in range((length + 63) // 64):
            keys = min(64, length - 64 * i)
            tile = torch.zeros(k.shape[1], 64, 320, dtype=torch.uint8)
            rows = slice(start + 64 * i, start + 64 * i + keys)
            tile[:, :keys, :192] = kc[rows].transpose(0, 1)
            tile[:, :keys, 192:] = vc[rows].transpose(0, 1)
            slot = start // 64 + b + i
            assert slot < slots
            for hk in range(k.shape[1]):
                images[(slot, hk)] = tile[hk].reshape(-1)[src]
    return images


@gpu
def test_gpu_fp8_tile_images_byte_for_byte():
    """fp8_tile_images writes every tile of every sequence (partial tiles' missing keys as zero codes) in the layout
    the kernel's descriptors read: K in three 64-byte-swizzled parts, V^T with its keys permuted to P's fragments."""
    module, reason = build.load_or_reason()
    assert module is not None, reason
    seqs = [(1, 130), (0, 64), (5, 1), (9, 0), (3, 200)]
    q, k, v, cu_q, cu_k, _ = make_inputs(seqs, 2, 3, seed=30, strided=True)
    k_scale, v_scale = _f32(4.0 / 448), _f32(3.0 / 448)
    slots = module.fp8_tile_image_slots(k.shape[0], len(seqs))
    images = torch.zeros((slots, 3, 20480), dtype=torch.uint8, device="cuda")
    module.fp8_tile_images(k, v, cu_k, images, k_scale, cuda_prefill._f32_reciprocal(k_scale), v_scale,
                           cuda_prefill._f32_reciprocal(v_scale), False)
    got = images.cpu()
    want = _expected_tile_images(k, v, cu_k, k_scale, v_scale, slots)
    assert len(want) == 3 * (3 + 1 + 1 + 4)
    for (slot, hk), image in want.items():
        assert torch.equal(got[slot, hk], image), (slot, hk)


@gpu
def test_gpu_fp8_mma_cuda_graph_capture(poisoned_outputs):
    inputs = make_inputs([(300, 300), (10, 77)], 4, 4, seed=31)
    call = _call(inputs, **FP8, **AMAX)
    module = build.build()
    eager = cuda_prefill.run(module, call, cuda_prefill.FP8_MMA)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            got = cuda_prefill.run(module, call, cuda_prefill.FP8_MMA)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **FP8, **AMAX)
    check_fp8_mma(got, ref)


# ------------------------------------------------------------------------ GPU: the nvfp4 recipe on the bf16-wgmma kernel


def run_nvfp4(inputs, causal=True, **amax):
    """(cuda out, lse), (reference out, lse) for the nvfp4 recipe (Q, K, V, P NVFP4; AMAX unless given), through
    dispatch (its one config ``{}``). Held to the bf16 kernel's exact bound (check): the pre-pass's values are exact
    in bf16 and their products exact in the float32 accumulation, so S differs from the reference's by float32
    summation order and one float32 rounding of each dequantized value (the reference rounds c · g first); tighter
    than the fp8 recipe's FP8-wgmma bound (numerics.FP8_MMA_LSE_RTOL), which only FP8 MMA's reduced-precision sums
    need."""
    return run_pair(inputs, causal=causal, **NVFP4, **dict(AMAX, **amax))


@gpu
@pytest.mark.parametrize("causal", [True, False])
def test_gpu_nvfp4_boundary_lengths(poisoned_outputs, causal):
    # the kernel's tiles and the 16-value NVFP4 blocks the pre-pass and P's step round in
    lengths = boundary_lengths([numerics.NVFP4_BLOCK, 64, 128], limit=257)
    seqs = [(n, n) for n in lengths] + [(5, 0), (0, 7), (15, 33)]
    check(*run_nvfp4(make_inputs(seqs, 4, 4, seed=40 + int(causal)), causal=causal))


@gpu
def test_gpu_nvfp4_cached_prefix_and_gqa(poisoned_outputs):
    """Cached prefixes (V's 16-key blocks from each sequence's first key, not from the query suffix), len_q > len_k,
    8 heads over 2 kv heads."""
    seqs = list(causal_boundary_pairs(128, 64)) + [(1, 1000), (300, 2000), (200, 129), (65, 1), (130, 64), (7, 23)]
    check(*run_nvfp4(make_inputs(seqs, 8, 2, seed=42), causal=True))
    check(*run_nvfp4(make_inputs(seqs[-6:], 8, 2, seed=43), causal=False))


@gpu
def test_gpu_nvfp4_mla_heads_and_lengths(poisoned_outputs):
    """128 heads, 1,100 keys; the quantization is there (far from the bf16 result)."""
    inputs = make_inputs([(1100, 1100), (300, 700)], 128, 128, seed=44)
    out, ref = run_nvfp4(inputs)
    check(out, ref)
    plain = mla_core.mla_prefill(*inputs, causal=True, backend="cuda")
    assert rel_l2(out[0], plain) > 2e-2


@gpu
def test_gpu_nvfp4_p_blocks_are_the_reference_blocks(poisoned_outputs):
    """P's NVFP4 alone (Q, K, V bf16), with a fitting and a small p_amax (saturated block codes): the kernel's error
    against the reference is under a quarter of what P's quantization itself moves the output by, so the blocks
    (16 keys along the tile at absolute positions), their codes and the values' rounding are the reference's."""
    inputs = make_inputs([(200, 200), (70, 333), (1, 17)], 4, 2, seed=45)
    for p_amax in (1.0, 0.05):
        kw = dict(p_quant="nvfp4", p_amax=p_amax)
        out, ref = run_pair(inputs, causal=True, **kw)
        check(out, ref)
        unquantized = mla_core.mla_prefill(*inputs, causal=True, backend="reference")
        moved = rel_l2(ref[0], unquantized)
        assert moved > 1e-2 and rel_l2(out[0], ref[0]) < 0.25 * moved, (p_amax, rel_l2(out[0], ref[0]), moved)


@gpu
def test_gpu_nvfp4_nan_and_inf_rows_between_sequences(poisoned_outputs):
    """K / V rows of a sequence without queries hold NaN / Inf (the pre-pass turns their blocks NaN; the kernel masks
    those keys and zeroes those V rows past a sequence's end); rows of a sequence with queries but no keys hold NaN Q."""
    _check_nan_and_inf_rows(run_nvfp4, seed=46)


@gpu
def test_gpu_nvfp4_ragged_strided_and_single_blocks(poisoned_outputs):
    """Many short sequences under a long one (most query blocks empty; V's blocks restart at every sequence), strided
    views read in place by the pre-pass, a misaligned q (copied), single-block launches."""
    seqs = ([(1, 1)] * 20 + [(0, 9), (700, 700), (0, 0), (129, 300), (5, 0), (0, 3)] + [(64, 64)] * 6
            + [(1500, 1500), (2, 1)])
    check(*run_nvfp4(make_inputs(seqs, 8, 2, seed=47, strided=True), causal=True))
    inputs = make_inputs([(70, 200), (128, 128)], 4, 2, seed=48)
    flat = torch.empty(inputs[0].numel() + 1, dtype=torch.bfloat16, device="cuda")
    shifted = flat[1:].view(inputs[0].shape)
    shifted.copy_(inputs[0])
    check(*run_nvfp4([shifted] + inputs[1:], causal=True))
    for seqs in ([(100, 100)], [(1, 1)], [(3, 700)]):
        check(*run_nvfp4(make_inputs(seqs, 1, 1, seed=49), causal=True))


@gpu
@pytest.mark.parametrize("amax", [dict(q_amax=1e-14), dict(k_amax=1e-14, v_amax=1e-14), dict(p_amax=1e-20)],
                         ids=["q", "kv", "p"])
def test_gpu_nvfp4_factors_outside_the_division_free_range(poisoned_outputs, amax):
    """A global scale outside the division-free range: that launch's IEEE division (the pre-pass's, or P's p_fmt 4);
    the block codes saturate at 448 and the values at 6 (amax far below the data's), as in the reference."""
    check(*run_nvfp4(make_inputs([(129, 129), (64, 300), (1, 65)], 4, 2, seed=50), **amax))


def _nvfp4_specials(g: float) -> torch.Tensor:
    """Values that exercise the NVFP4 rules at global scale g: E2M1 ties against a block code of 1 (block max 6 g),
    saturation, Inf, NaN, a zero block, -0, subnormal block codes."""
    ties = torch.tensor([6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -2.5, -5.0, 0.0, -0.0, 4.9, 5.1])
    rows = [ties * g, torch.tensor([1e4, -3.0] + [1.0] * 14) * g,
            torch.tensor([float("inf"), 1.0] + [0.5] * 14) * g, torch.tensor([float("nan")] + [1.0] * 15),
            torch.zeros(16), torch.tensor([-0.0] * 16), torch.linspace(-1, 1, 16) * 2.0 ** -8 * 6 * g]
    return torch.cat(rows)


@gpu
@pytest.mark.parametrize("amax", [2688 * 2.0 ** -10, 2688 * 2.0 ** -60], ids=["division_free", "ieee"])
def test_gpu_nvfp4_prepass_values_equal_the_numerics_definition(amax):
    """The pre-pass's values are mla_core.numerics.nvfp4_unscaled bit for bit (values without g: the products
    exact in bf16): Q / K along features (one launch, a strided view read in place), V along each sequence's keys
    with partial blocks at sequence ends, sequences starting inside a 16-key block, an empty sequence; ties, Inf,
    NaN, zero and -0 blocks, subnormal block codes; the division-free quotient (g = 2^-10) and the IEEE one (g =
    2^-60, below the range; powers of two keep the ties exact in bf16)."""
    module, reason = build.load_or_reason()
    assert module is not None, reason
    seqs = [(0, 37), (0, 0), (0, 16), (0, 5), (0, 100)]
    q, k, v, _, cu_k, _ = make_inputs([(150, 158)], 3, 2, seed=51, strided=True)
    _, _, v, _, cu_k, _ = make_inputs(seqs, 3, 2, seed=52, strided=True)
    g = numerics.nvfp4_global_scale(amax)
    exact = not cuda_prefill.EXACT_DIV_FREE_RANGE[0] <= _f32(g) <= cuda_prefill.EXACT_DIV_FREE_RANGE[1]
    assert exact == (amax < 1.0)
    sp = _nvfp4_specials(g).to(torch.bfloat16).cuda()  # 112 values: 7 blocks
    q[0, 0, :112] = sp
    k[3, 1, 80:192] = sp
    v[37:37 + 16, 1, 5] = sp[:16]  # one block of the third sequence (keys 37..52), one column
    v[0:37, 0, 7] = torch.cat([sp[32:48], sp[48:64], sp[:5]])  # the first sequence's blocks, its partial tail
    made = cuda_prefill.nvfp4_rows(module, [(q, amax), (k, amax)])
    for x, (values, gx) in zip((q, k), made):
        assert gx == _f32(g) and values.is_contiguous()
        want = numerics.nvfp4_unscaled(x, amax, dim=-1)
        assert torch.equal(values.float().isnan(), want.isnan())
        assert torch.equal(values.float()[~want.isnan()], want[~want.isnan()])
    values, gv = cuda_prefill.nvfp4_keys(module, v, cu_k.to(torch.int32), amax)
    assert gv == _f32(g)
    bounds = cu_k.tolist()
    for k0, k1 in zip(bounds[:-1], bounds[1:]):
        if k1 > k0:
            want = numerics.nvfp4_unscaled(v[k0:k1], amax, dim=0)
            got = values[k0:k1].float()
            assert torch.equal(got.isnan(), want.isnan()), (k0, k1)
            assert torch.equal(got[~want.isnan()], want[~want.isnan()]), (k0, k1)


@gpu
@pytest.mark.parametrize("q_amax", [3.5, 2688 * 2.0 ** -60], ids=["division_free", "ieee"])
@pytest.mark.parametrize("p_amax", [1.0, 1e-13], ids=["p_div_free", "p_ieee"])
def test_gpu_nvfp4_q_in_the_kernel_equals_the_prepass_values(q_amax, p_amax):
    """The kernel's Q NVFP4 values (q_fmt 3: division-free; Q's g outside the range: q_fmt 4, IEEE; in both P-NVFP4
    instances, p_fmt 3 / 4) give the outputs and LSE of the kernel run on the pre-pass's Q values (q_fmt 0) bit for
    bit: Q holds E2M1 ties, saturation, Inf, NaN, zero and -0 blocks, subnormal block codes (_nvfp4_specials) in
    blocks of every 128-byte swizzle row (rows 0..7 of a slab), rows of a sequence without keys NaN, rows past the
    tensor's end (TMA's zeros), a strided view (TMA reads it in place)."""
    module, reason = build.load_or_reason()
    assert module is not None, reason
    seqs = [(130, 130), (64, 200), (3, 0), (1, 1)]
    q, k, v, cu_q, cu_k, max_q = make_inputs(seqs, 4, 2, seed=54, strided=True)
    g = _f32(numerics.nvfp4_global_scale(q_amax))
    sp = _nvfp4_specials(g).to(torch.bfloat16).cuda()  # 112 values: 7 blocks
    for r in range(8):  # each swizzle row of the first slabs; the specials' blocks at shifted feature offsets
        q[r, r % 4, 16 * (r % 5):16 * (r % 5) + 112] = sp
    q[194:197] = float("nan")
    (kv, gk), = cuda_prefill.nvfp4_rows(module, [(k, 4.0)])
    vv, gv = cuda_prefill.nvfp4_keys(module, v, cu_k.to(torch.int32), 3.0)
    (qv, gq), = cuda_prefill.nvfp4_rows(module, [(q, q_amax)])
    assert gq == g
    q_fmt = 3 if cuda_prefill.EXACT_DIV_FREE_RANGE[0] <= g <= cuda_prefill.EXACT_DIV_FREE_RANGE[1] else 4
    assert q_fmt == (3 if q_amax == 3.5 else 4)
    p_scale = _f32(numerics.nvfp4_global_scale(p_amax))
    p_fmt = 3 if cuda_prefill.EXACT_DIV_FREE_RANGE[0] <= p_scale <= cuda_prefill.EXACT_DIV_FREE_RANGE[1] else 4
    assert p_fmt == (3 if p_amax == 1.0 else 4)
    scale_log2 = _f32(192 ** -0.5) * g * gk * math.log2(math.e)
    got, want = [], []
    for qx, fmt, out in ((q, q_fmt, got), (qv, 0, want)):
        o = torch.full((q.shape[0], 4, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((4, q.shape[0]), float("nan"), dtype=torch.float32, device="cuda")
        module.prefill_wgmma(qx, kv, vv, cu_q, cu_k, max_q, o, lse, True, scale_log2, _f32(gv * p_scale), p_fmt,
                             p_scale, cuda_prefill._f32_reciprocal(p_scale), fmt, g, cuda_prefill._f32_reciprocal(g))
        out += [o, lse]
    assert torch.equal(got[0].view(torch.int16), want[0].view(torch.int16))
    assert torch.equal(got[1].view(torch.int32), want[1].view(torch.int32))


@gpu
def test_gpu_nvfp4_cuda_graph_capture(poisoned_outputs):
    inputs = make_inputs([(300, 300), (10, 77)], 4, 4, seed=53)
    kw = dict(NVFP4, **AMAX)
    eager = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cuda", **kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        with torch.cuda.graph(graph, stream=stream):
            got = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="cuda", **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got[0], eager[0]) and torch.equal(got[1], eager[1])
    ref = mla_core.mla_prefill(*inputs, causal=True, return_lse=True, backend="reference", **kw)
    check(got, ref)
