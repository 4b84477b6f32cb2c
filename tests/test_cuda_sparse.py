"""The cuda backend's FP8 top-k sparse decode (csrc/mla_sparse_wgmma.cu, backends/cuda/mla_core_cuda/sparse.py).

CPU: what the backend declares and refuses (heads not a multiple of 64, another device, no sm_90), its configs and
split choice. GPU (``pytest -m gpu``): against the reference backend on fresh random inputs with
the musa_fp8 tests' tolerances (out rel-L2 < 1e-2, LSE rel-L2 < 1e-5 over finite rows, empty rows exactly 0 /
-inf), outputs in NaN-filled buffers; cache rows no valid slot names hold NaN codes and the slot just past each
length names one (tests/musa_fp8_inputs.py), so a kernel that reads a slot it must not fails. Shapes: lengths 0, 1,
63, 64, 65, top_k; -1 holes over whole and half tiles; indices past the cache; q_len 1..4; 64 / 128 / 192 heads;
both cache shapes; every split count (including splits left empty); both LSE layouts; misaligned views; weights
of 2^-20 and 2^-24 of a row's max (576-byte rows: P in f16, subnormal there). Both row
layouts: MATE's 576-byte rows (FP8 query) and fp8_ds_mla's 656-byte rows (bf16 query, per-block scales spread over
1e-2..1e2, so a scale applied to the wrong block, key or product moves the result far past the tolerances).
"""
from __future__ import annotations

import math

import pytest
import torch

import mla_core
from mla_core import specs
from mla_core_cuda import backend as cuda_backend
from mla_core_cuda import build
from mla_core_cuda import sparse as cuda_sparse
from mla_core.testing.shapes import boundary_lengths
from musa_fp8_inputs import run_sparse, sparse_inputs

LENGTHS = boundary_lengths([32, 64], limit=255)  # the 32-key P tiles and 64-slot tiles: 0, 1, 31..33, 63..65, 127..129


def _problem(device="cuda", **kw):
    base = dict(heads=128, q_len=1, top_k=2048, kv_lora_rank=512, rope_dim=64, kv_layout="fp8", batch=32)
    base.update(kw)
    return mla_core.Problem.make("sparse_decode", device, {"lse"}, **base)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return math.inf
    den = b.norm().item()
    return (a - b).norm().item() / (den if den else 1.0)


# ------------------------------------------------------------------------------------------------ CPU


def test_declared_and_refused():
    backend = mla_core.get_backend("cuda")
    cap = backend.capabilities["sparse_decode"]
    for heads in (64, 128, 192):
        for q_len in (1, 2, 3, 4):
            assert cap.why_not(_problem(heads=heads, q_len=q_len)) == []
    assert any("heads" in r and "step 64" in r for r in cap.why_not(_problem(heads=96)))
    assert any("heads" in r for r in cap.why_not(_problem(heads=16)))
    for heads in (64, 128):
        for q_len in (1, 2):
            assert cap.why_not(_problem(heads=heads, q_len=q_len, kv_layout="fp8_ds_mla")) == []
    assert any("heads" in r for r in cap.why_not(_problem(heads=96, kv_layout="fp8_ds_mla")))
    assert any("q_len" in r for r in cap.why_not(_problem(q_len=5)))
    assert any("device=cpu" in r for r in backend.device_reasons(_problem(device="cpu")))
    assert "sparse_decode" in backend.info()["ops"]


def test_refuses_machines_without_sm90(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cuda_backend.device_reason() == "no CUDA device"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    assert "compute capability 8.0" in cuda_backend.device_reason()
    reasons = mla_core.get_backend("cuda").why_not(_problem())
    assert reasons and "compute capability 8.0" in reasons[0]


def test_configs_and_their_validation():
    backend = mla_core.get_backend("cuda")
    problem = _problem()
    assert backend.configs(problem) == [{}, {"num_splits": 1}, {"num_splits": 2}, {"num_splits": 4},
                                        {"num_splits": 8}]
    assert backend.validate_config(problem, {"num_splits": 4}) == []
    assert backend.validate_config(problem, {"num_splits": 3})
    assert backend.validate_config(problem, {"num_splits": "4"})


@pytest.mark.parametrize("tokens,heads,top_k,config,want", [
    (32, 64, 2048, {}, 4), (32, 128, 2048, {}, 2), (128, 64, 2048, {}, 1), (128, 128, 2048, {}, 1),
    (1, 64, 2048, {}, 32), (1, 64, 128, {}, 2), (2, 64, 64, {}, 1), (132, 64, 2048, {}, 1),
    (4, 64, 128, {"num_splits": 8}, 2), (4, 64, 2048, {"num_splits": 8}, 8), (4, 64, 2048, {"num_splits": 1}, 1)])
def test_split_choice(tokens, heads, top_k, config, want):
    """One wave of CTAs on 132 SMs (the probe's fastest split counts), at most one split per 64-slot tile."""
    assert cuda_sparse.num_splits_for(tokens, heads, top_k, 132, config) == want


def test_sources_built():
    assert "mla_sparse_wgmma.cu" in build.SOURCES and "mla_sparse.h" in build.HEADERS


def test_launcher_refuses_what_it_does_not_cover():
    case = sparse_inputs(1, 1, 16, 64, [64], layout="fp8_ds_mla")
    _, call = specs.validate_sparse_decode(case["query"], case["kv_cache"], 128, 512, 64, case["indices"],
                                           case["seq_lens"], 64, None, 0.05, 1.0, None, True, None)
    with pytest.raises(ValueError, match="heads a multiple of 64"):
        cuda_sparse.run(None, call, {})


# ------------------------------------------------------------------------------------------------ GPU


def _case(batch, q_len, heads, top_k, lengths, *, rows=4096, four_d=False, seed=0, minus_one=0.1, layout="fp8"):
    page_size = 64
    return sparse_inputs(batch, q_len, heads, top_k, lengths, layout=layout, pages=rows // page_size,
                         page_size=page_size, seed=seed, four_d=four_d, device="cuda", minus_one=minus_one)


def _poisoned(batch, q_len, heads, lse_flat):
    out = torch.full((batch, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((batch * q_len, heads) if lse_flat else (batch, q_len, heads), float("nan"), device="cuda")
    return out, lse


def _check(case, got, bmm1, bmm2=1.0):
    out, lse = got
    want_out, want_lse = run_sparse(case, "reference", return_lse=True, bmm1_scale=bmm1, bmm2_scale=bmm2)
    lse = lse.view(want_lse.shape)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_l2(out, want_out) < 1e-2
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_l2(lse[finite], want_lse[finite]) < 1e-5
    assert (out[~finite] == 0).all() and (lse[~finite] == -math.inf).all()


def _run_cuda(case, bmm1, bmm2=1.0, lse_flat=True):
    batch, q_len, heads = case["query"].shape[:3]
    out, lse = _poisoned(batch, q_len, heads, lse_flat)
    got = run_sparse(case, "cuda", out=out, lse=lse, return_lse=True, bmm1_scale=bmm1, bmm2_scale=bmm2)
    assert got[0].data_ptr() == out.data_ptr() and got[1].data_ptr() == lse.data_ptr()
    return got


@pytest.mark.gpu
def test_gpu_backend_available_and_chosen():
    backend = mla_core.get_backend("cuda")
    assert backend.why_not(_problem()) == []
    assert backend.why_not(_problem(kv_layout="fp8_ds_mla")) == []


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 2, 3, 4])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("four_d", [False, True])
def test_gpu_boundary_lengths(q_len, heads, four_d):
    top_k = 256
    case = _case(len(LENGTHS) + 1, q_len, heads, top_k, LENGTHS + [top_k], four_d=four_d, seed=q_len + heads)
    case["indices"][-1, 0, 64:128] = -1     # a whole tile without a key
    case["indices"][-1, -1, 160:192] = -1   # a tile's second half
    case["indices"][3, 0, :] = -1           # all -1 within the length: an empty row
    _check(case, _run_cuda(case, 0.15, lse_flat=four_d), 0.15)


@pytest.mark.gpu
@pytest.mark.parametrize("q_len", [1, 2])
@pytest.mark.parametrize("heads", [64, 128])
@pytest.mark.parametrize("four_d", [False, True])
def test_gpu_ds_mla_boundary_lengths(q_len, heads, four_d):
    """656-byte rows: the 32 / 64 tile edges, -1 holes over a whole tile and a tile's second half, an empty row."""
    top_k = 256
    case = _case(len(LENGTHS) + 1, q_len, heads, top_k, LENGTHS + [top_k], four_d=four_d, seed=q_len + heads + 50,
                 layout="fp8_ds_mla")
    case["indices"][-1, 0, 64:128] = -1
    case["indices"][-1, -1, 160:192] = -1
    case["indices"][3, 0, :] = -1
    _check(case, _run_cuda(case, 0.05, lse_flat=four_d), 0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("config", [{}, {"num_splits": 1}, {"num_splits": 2}, {"num_splits": 4}, {"num_splits": 8},
                                    {"num_splits": 32}])
def test_gpu_every_split_count(config, layout):
    """Top-k 2048 with lengths that leave splits empty (65 slots: 2 tiles), and top-k 192 (3 tiles) at 8 splits."""
    backend = mla_core.get_backend("cuda")
    for top_k, lengths in ((2048, [2048, 1000, 0, 65]), (192, [192, 130, 64])):
        case = _case(len(lengths), 1, 128, top_k, lengths, rows=32768, seed=7, layout=layout)
        out, lse = _poisoned(len(lengths), 1, 128, lse_flat=False)
        problem, call = specs.validate_sparse_decode(case["query"], case["kv_cache"], 128, 512, 64, case["indices"],
                                                     case["seq_lens"], top_k, out, 0.05, 1.0, lse, True, None)
        _check(case, backend.run(problem, call, config), 0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_gpu_indices_outside_the_cache_are_not_keys(monkeypatch, layout):
    """Within the valid length, indices past the cache (rows, rows + 5, 2^31 - 1) and negative ones other than -1
    are skipped, never read (content checks off: the public op would refuse them in full mode)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case = _case(3, 2, 64, 128, [128, 100, 65], seed=11, layout=layout)
    rows = case["rows"]
    case["indices"][0, 0, 5] = rows
    case["indices"][0, 1, 70] = rows + 5
    case["indices"][1, :, 64:80] = 2 ** 31 - 1
    case["indices"][2, 0, 0] = -7
    case["indices"][2, 1, 64] = rows  # the only slot of the second tile
    _check(case, _run_cuda(case, 0.1), 0.1)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("bmm1,bmm2", [(0.01, 1.0), (0.3, 0.5), (576 ** -0.5 * 4, 2.0)])
def test_gpu_deepseek_size(bmm1, bmm2, layout):
    """32k-token cache, top-k 2048, q_len 2, 128 heads; and 192 heads (three head groups)."""
    case = _case(4, 2, 128, 2048, [2048, 1, 1500, 0], rows=32768, seed=3, minus_one=0.05, layout=layout)
    _check(case, _run_cuda(case, bmm1, bmm2), bmm1, bmm2)
    case = _case(2, 1, 192, 512, [512, 300], rows=8192, seed=4, layout=layout)
    _check(case, _run_cuda(case, bmm1, bmm2, lse_flat=False), bmm1, bmm2)


@pytest.mark.gpu
@pytest.mark.parametrize("slot", [1, 40])
@pytest.mark.parametrize("exponent", [20, 24])
def test_gpu_tiny_weights_are_kept(exponent, slot):
    """576-byte rows enter P·V with P rounded to f16: a weight of 2^-20 (f16 subnormal) or 2^-24 (f16's smallest)
    of the row's max still carries its value. q is 1 on the RoPE values and 0 on the latent ones; key 0's RoPE
    values are 1, every other key's 0, so with bmm1 = exponent ln 2 / 64 key 0 weighs 1 and the other 63 keys
    2^-exponent each; only key `slot`'s latent values (V) are nonzero, 448 (E4M3's largest), in warpgroup 0's half
    (1) or warpgroup 1's (40). Every output is 448 2^-e / (1 + 63 2^-e); a P flushed to 0 gives 0 (rel-L2 1)."""
    heads, rows = 64, 64
    query = torch.zeros(1, 1, heads, 576)
    query[..., 512:] = 1.0
    cache = torch.zeros(rows, 576)
    cache[0, 512:] = 1.0
    cache[slot, :512] = 448.0
    fp8 = torch.float8_e4m3fn
    case = dict(query=query.to(fp8).cuda(), kv_cache=cache.to(fp8).view(1, rows, 576).cuda(),
                indices=torch.arange(64, dtype=torch.int32).view(1, 1, 64).cuda(),
                seq_lens=torch.tensor([64], dtype=torch.int32).cuda(), rows=rows, top_k=64)
    bmm1 = exponent * math.log(2) / 64
    got = _run_cuda(case, bmm1)
    _check(case, got, bmm1)
    want = 448 * 2.0 ** -exponent / (1 + 63 * 2.0 ** -exponent)
    assert torch.allclose(got[0].float(), torch.full_like(got[0].float(), want), rtol=1e-2, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_gpu_misaligned_views(layout):
    """Query and cache views starting off a 16-byte boundary and an out buffer off a 4-byte one give the same
    result (the launcher copies them aligned)."""
    case = _case(2, 1, 64, 128, [128, 77], seed=5, layout=layout)
    want = _run_cuda(case, 0.1)
    moved = dict(case)
    for name in ("query", "kv_cache"):
        t = case[name]
        size = t.element_size()  # one element off the allocation's start
        raw = torch.empty((t.numel() + 1) * size, dtype=torch.uint8, device="cuda")
        moved[name] = raw[size:].view(t.dtype).view(t.shape).copy_(t)
        assert moved[name].data_ptr() % 16
    raw = torch.full((want[0].numel() + 1,), float("nan"), dtype=torch.bfloat16, device="cuda")
    out = raw[1:].view(want[0].shape)
    got = run_sparse(moved, "cuda", out=out, return_lse=True, bmm1_scale=0.1)
    assert got[0].data_ptr() == out.data_ptr()
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1].view(got[1].shape))


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_gpu_cuda_graph_capture_without_host_sync(monkeypatch, layout):
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case = _case(2, 2, 128, 128, [128, 50], seed=9, layout=layout)
    meta = mla_core.get_sparse_decode_metadata(case["query"], case["seq_lens"], 128)
    out, lse = _poisoned(2, 2, 128, lse_flat=False)

    def call():
        run_sparse(case, "cuda", out=out, lse=lse, metadata=meta, bmm1_scale=0.05)
    call()  # build and load outside the graph
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _check(case, (out, lse), 0.05)
