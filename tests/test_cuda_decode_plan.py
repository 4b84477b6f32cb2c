"""The cuda decode launcher's host side on the CPU (backends/cuda/mla_core_cuda/decode.py, backend.py): the
extension's decode entries replaced by a recorder, so what each call would launch is compared, not computed.

- the launch plan cached per key (split count, scale products, formats, kernel entry, CTA shape) gives what a
  cold plan gives, call after call, when one field at a time changes (a field left out of the key reuses a stale
  plan);
- the scalar arguments against their definitions (mla_core.numerics' per-tensor factors rounded to float32);
- a CTA shape that was not built raises every call (nothing cached), a full cache is cleared, no tensor is kept;
- the backend asks the build for the extension once;
- through the public op, with the backend made available on the CPU: bad input raises MLAInputError before any
  launch.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import mla_core
from mla_core import dispatch, numerics
from mla_core.errors import MLAInputError
from mla_core.specs import decode_num_splits, validate_decode
from mla_core_cuda import backend as cuda_backend
from mla_core_cuda import build
from mla_core_cuda import decode as launcher

RANK, ROPE = 512, 64


class Recorder:
    """The extension's decode entries: record (entry, tensor descriptions and scalars) of each call."""

    def __init__(self):
        self.calls = []

    def _record(self, entry, args):
        self.calls.append((entry, tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a
                                        for a in args)))

    def decode_wgmma(self, *args):
        self._record("decode_wgmma", args)

    def decode(self, *args):
        self._record("decode", args)

    def layer_decode(self, *args):
        self._record("layer_decode", args)


def _call(batch=1, heads=16, length=100, page_size=16, softmax_scale=0.1, num_kv_splits="auto", recipe=None,
          amax=(4.0, 4.0, 4.0), return_lse=True, out_dtype=None, kv_scale=None):
    """A validated DecodeCall of bf16 CPU tensors (values irrelevant: nothing computes); ``kv_scale``: an FP8
    (float8_e4m3fn) cache with that scale."""
    pages = -(-length // page_size)
    q = torch.zeros(batch, heads, RANK + ROPE, dtype=torch.bfloat16)
    cache = torch.zeros(batch * pages, page_size, RANK + ROPE,
                        dtype=torch.bfloat16 if kv_scale is None else torch.float8_e4m3fn)
    table = torch.arange(batch * pages, dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch,), length, dtype=torch.int32)
    fmt = {None: (None, None, None), "fp8": ("fp8",) * 3, "nvfp4": ("nvfp4",) * 3}[recipe]
    _, call = validate_decode(
        q, cache, table, lens, softmax_scale=softmax_scale, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
        page_size=None, num_kv_splits=num_kv_splits, k_qdq=fmt[0], k_qdq_amax=amax[0] if fmt[0] else None,
        v_qdq=fmt[1], v_qdq_amax=amax[1] if fmt[1] else None, p_qdq=fmt[2], p_qdq_amax=amax[2] if fmt[2] else 1.0,
        return_lse=return_lse, out_dtype=out_dtype, kv_scale=kv_scale)
    return call


def _run(call, config):
    rec = Recorder()
    out, lse = launcher.run(rec, call, config)
    assert out.shape == (*call.q.shape[:2], RANK) and out.dtype == call.out_dtype
    assert (lse is not None) == call.return_lse
    return rec.calls


@pytest.fixture(autouse=True)
def fresh_plans():
    launcher._PLANS.clear()
    yield
    launcher._PLANS.clear()


WGMMA, MMA = {"kernel": "wgmma"}, {"head_tiles": 1, "warps": 4}
CASES = [  # each differs from the one before in one field the plan reads
    (dict(), WGMMA),
    (dict(softmax_scale=0.2), WGMMA),
    (dict(), MMA),
    (dict(), {"head_tiles": 1, "warps": 4, "num_kv_splits": 4}),
    (dict(), {"head_tiles": 1, "warps": 4, "num_kv_splits": 8}),
    (dict(num_kv_splits=5), MMA),
    (dict(num_kv_splits=6), MMA),
    (dict(length=1000), WGMMA),          # a wider table: more tiles, more auto splits
    (dict(length=1000, page_size=64), WGMMA),
    (dict(heads=128), WGMMA),
    (dict(heads=128), {}),               # the default CTA shape for 128 heads
    (dict(heads=128, batch=3), {}),
    (dict(recipe="fp8"), WGMMA),
    (dict(recipe="fp8", amax=(8.0, 8.0, 4.0)), WGMMA),
    (dict(recipe="fp8", amax=(8.0, 8.0, 2.0)), WGMMA),
    (dict(recipe="fp8", amax=(8.0, 2.0, 2.0)), WGMMA),     # K and V scales differ: mma.sync under this config
    (dict(recipe="fp8", amax=(1e-30, 1e-30, 2.0)), WGMMA),  # exact divisions: mma.sync
    (dict(recipe="nvfp4"), MMA),
    (dict(recipe="nvfp4", amax=(2.0, 4.0, 4.0)), MMA),
    (dict(return_lse=False, out_dtype=torch.float32), WGMMA),
    (dict(kv_scale=0.5), WGMMA),         # an FP8 cache: its scale joins both factors
    (dict(kv_scale=0.25), WGMMA),
    (dict(kv_scale=0.25, softmax_scale=0.3), WGMMA),
    (dict(), WGMMA),
]


def test_cached_plans_match_cold_plans():
    """Every call launches what a plan built from scratch launches (a key missing a field repeats a stale one)."""
    for kwargs, config in CASES * 2:
        call = _call(**kwargs)
        warm = _run(call, config)
        launcher._PLANS.clear()
        assert warm == _run(call, config), (kwargs, config)
        assert len(warm) == 1
    launcher._PLANS.clear()
    for kwargs, config in CASES:        # one warm pass with every plan cached, against cold runs
        _run(_call(**kwargs), config)
    seen = dict(launcher._PLANS)
    for kwargs, config in CASES:
        call = _call(**kwargs)
        warm = _run(call, config)
        launcher._PLANS.clear()
        cold = _run(call, config)
        launcher._PLANS.update(seen)
        assert warm == cold, (kwargs, config)


def _f32(x: float) -> float:
    return float(np.float32(x))


@pytest.mark.parametrize("recipe,amax", [(None, (4.0, 4.0, 4.0)), ("fp8", (3.0, 3.0, 5.0)),
                                         ("fp8", (3.0, 7.0, 5.0)), ("nvfp4", (2.0, 6.0, 5.0))])
def test_scalar_arguments(recipe, amax):
    """Splits, log2-domain score scale, output factor, per-tensor factors and formats, by their definitions."""
    call = _call(recipe=recipe, amax=amax, softmax_scale=0.07, length=3000)
    (entry, args), = _run(call, WGMMA)
    scale = {None: lambda a: 1.0, "fp8": numerics.fp8_scale, "nvfp4": numerics.nvfp4_global_scale}[recipe]
    k, v, p = (scale(a) for a in amax)
    one_scale = recipe == "fp8" and _f32(k) == _f32(v)
    assert entry == ("decode_wgmma" if recipe is None or one_scale else "decode")
    resident = 1 if entry == "decode_wgmma" else 2
    splits = decode_num_splits(call, {}, 132, resident_ctas=resident)
    parts = (1 * 16 * splits * RANK,), (1 * 16 * splits,)
    fmt = {None: 0, "fp8": 1, "nvfp4": 2}[recipe]
    expect = (parts[0], torch.float32), (parts[1], torch.float32), splits
    assert args[6:9] == expect
    qk, out_scale = args[9:11]
    assert qk == pytest.approx(0.07 * (_f32(k) if recipe else 1.0) * math.log2(math.e), rel=1e-15)
    assert out_scale == pytest.approx((_f32(v) * _f32(p)) if recipe else 1.0, rel=1e-15)
    assert args[11:17] == (k, v, p, fmt, fmt, fmt)
    assert args[17] == one_scale and args[18] is False
    if entry == "decode":
        assert args[19:] == (1, 4)     # 16 heads: one m-tile, 4 warps


def test_fp8_cache_scale_joins_both_factors():
    """An FP8 cache's ``kv_scale`` multiplies the log2-domain score scale and the output factor (the codes enter
    the products unscaled), and a new scale is a new plan."""
    for kv in (0.5, 0.03125):
        (entry, args), = _run(_call(kv_scale=kv, softmax_scale=0.07), WGMMA)
        assert entry == "decode_wgmma"
        assert args[9] == pytest.approx(0.07 * math.log2(math.e) * kv, rel=1e-15)
        assert args[10] == pytest.approx(kv, rel=1e-15)


def test_unbuilt_cta_shape_raises_every_call_and_is_not_cached():
    call = _call()
    for _ in range(2):
        with pytest.raises(ValueError, match="head_tiles"):
            _run(call, {"head_tiles": 3, "warps": 4})
    assert not launcher._PLANS


def test_full_cache_cleared_and_no_tensor_kept(monkeypatch):
    monkeypatch.setattr(launcher, "_PLANS_MAX", 2)
    for scale in (0.1, 0.2, 0.3, 0.4, 0.1):
        (_, args), = _run(_call(softmax_scale=scale), WGMMA)
        assert args[9] == pytest.approx(scale * math.log2(math.e), rel=1e-15)
        assert len(launcher._PLANS) <= 2

    def tensors(x):
        return isinstance(x, torch.Tensor) or (isinstance(x, tuple) and any(tensors(y) for y in x))
    assert launcher._PLANS and not any(tensors(k) or tensors(v) for k, v in launcher._PLANS.items())


def test_extension_asked_for_once(monkeypatch):
    rec, asked = Recorder(), []
    monkeypatch.setattr(build, "load_or_reason", lambda: asked.append(1) or (rec, None))
    backend = cuda_backend.CudaBackend()
    for scale in (0.1, 0.2, 0.1):
        backend.decode(_call(softmax_scale=scale), WGMMA)
    assert len(asked) == 1 and len(rec.calls) == 3


@pytest.fixture
def cuda_on_cpu(monkeypatch):
    """The registered cuda backend available for CPU tensors, its extension a Recorder; dispatch memory cleared
    before and after (no CPU choice of cuda outlives the test)."""
    rec = Recorder()
    monkeypatch.setattr(cuda_backend, "device_reason", lambda: None)
    monkeypatch.setattr(build, "load_or_reason", lambda: (rec, None))
    monkeypatch.setattr(cuda_backend.CudaBackend, "device_types", frozenset({"cuda", "cpu"}))
    monkeypatch.setattr(mla_core.get_backend("cuda"), "_loaded", None)
    dispatch.clear_memory()
    yield rec
    dispatch.clear_memory()


def test_bad_input_raises_before_any_launch(cuda_on_cpu):
    call = _call(length=40)
    args = (call.q, call.latent_cache, call.block_table, call.seq_lens)
    kw = dict(softmax_scale=0.1, kv_lora_rank=RANK, qk_rope_head_dim=ROPE, backend="cuda")
    mla_core.mla_attention_decode(*args, **kw)
    mla_core.mla_attention_decode(*args, **kw)
    assert [entry for entry, _ in cuda_on_cpu.calls] == ["decode_wgmma"] * 2
    bad = [dict(softmax_scale=float("nan")), dict(num_kv_splits=0), dict(k_qdq="fp8", k_qdq_amax=-1.0)]
    for change in bad:
        with pytest.raises(MLAInputError):
            mla_core.mla_attention_decode(*args, **{**kw, **change})
    with pytest.raises(MLAInputError, match="b_seq_len"):
        mla_core.mla_attention_decode(*args[:3], torch.full((1,), 10 ** 6, dtype=torch.int32), **kw)
    assert len(cuda_on_cpu.calls) == 2


def test_compiled_fullgraph_launches_what_eager_launches(cuda_on_cpu):
    """torch.compile(fullgraph=True) traces around the op; its calls reach the launcher with the eager arguments."""
    call = _call(length=300, heads=16)
    args = (call.q, call.latent_cache, call.block_table, call.seq_lens)

    def step(q, cache, table, lens):
        return mla_core.mla_decode(q, cache, table, lens, softmax_scale=0.1, kv_lora_rank=RANK,
                                   qk_rope_head_dim=ROPE, num_kv_splits="auto", backend="cuda")

    torch._dynamo.reset()
    try:
        step(*args)
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        compiled(*args)
        compiled(*args)
    finally:
        torch._dynamo.reset()
    eager, *rest = cuda_on_cpu.calls
    assert len(rest) >= 2 and all(c == eager for c in rest)


@pytest.mark.parametrize("config, kernel", [({"kernel": "wgmma"}, (1, 0, 0)), ({"kernel": "keys_m"}, (2, 0, 0)),
                                            ({"kernel": "ring4"}, (3, 0, 0)),
                                            ({"head_tiles": 2, "warps": 8}, (0, 2, 8))])
def test_layer_decode_runs_the_configs_kernel(config, kernel):
    """With a layer prep, the one call is layer_decode: its decode arguments are the plain call's (the plan's first
    11) and its (kernel, head_tiles, warps) the config's: 0 mma.sync with its CTA shape, 1 WGMMA, 2 keys-as-M,
    3 the four-slot ring (a ring4 plan run as the default WGMMA kernel would be bit-equal, so only this shows it)."""
    from types import SimpleNamespace
    prep = SimpleNamespace(q_src=None, kv=None, input_row_offsets=None, cache_offsets=None, freqs_cis=None,
                           kv_norm_gamma=None, epsilon=1e-6, rope_interleave=False, sum_order=0)
    call = _call(heads=16)
    (_, plain), = _run(call, config)
    rec = Recorder()
    launcher.run(rec, call, config, prep)
    (layer_entry, layer_args), = rec.calls
    assert layer_entry == "layer_decode" and layer_args[-3:] == kernel
    assert layer_args[-14:-3] == plain[8:19]  # the plain call's split count, scale products, formats and flags

