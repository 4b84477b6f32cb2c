"""musa_fp8 backend against the reference: fused RoPE + FP8 quantize, and FP8 top-k sparse decode on both layouts.

On the CPU the Triton kernels run under the interpreter (small heads); ``-m gpu`` runs DeepSeek sizes.
Tolerances: rope outputs are bitwise equal to the reference (same float32 operations, no fused
multiply-add, exact E4M3 rounding). Sparse decode: out rel-L2 < 1e-2 (bf16 output; the kernel also rounds
P to bf16 before P·V, relative error <= 2^-9 per weight, the same order as the output's own rounding);
LSE rel-L2 < 1e-5 (float32 scores; only the dot accumulation order differs).
"""
import math

import pytest
import torch

import mla_core
from mla_core.testing.shapes import boundary_lengths
from musa_fp8_inputs import run_sparse, sparse_inputs
from test_reference_rope import make_inputs, rope_expected

FP8 = torch.float8_e4m3fn
BLOCK_NS = (32, 64)  # keys per tile of the sparse configs (the CPU tests use the small-head ones)


def rel_l2(a, b):
    a, b = a.double(), b.double()
    if torch.isnan(a).any():
        return math.inf
    den = b.norm().item()
    return (a - b).norm().item() / (den if den else 1.0)


def bits(t):
    return t.view(torch.uint8)


# ------------------------------------------------------------------------------------------------ rope


def rope_call(inputs, backend, **kw):
    return mla_core.mla_rope_quantize_fp8(*inputs, backend=backend, **kw)


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dtype,pos_dtype", [(torch.bfloat16, torch.int64), (torch.float16, torch.int32)])
def test_rope_bitwise_equal_to_reference(is_neox, cache_dtype, dtype, pos_dtype):
    inputs = make_inputs(nnz=5, heads=3, dtype=dtype, cache_dtype=cache_dtype, pos_dtype=pos_dtype, seed=11)
    kw = dict(is_neox=is_neox, quant_scale_q=0.75, quant_scale_kv=1.5)
    got = rope_call(inputs, "musa_fp8", **kw)
    want = rope_call(inputs, "reference", **kw)
    for g, w in zip(got, want):
        assert g.dtype == FP8 and g.shape == w.shape
        assert torch.equal(bits(g), bits(w))
    # the quantization happened: FP8 values are measurably far from the float64 rotation
    q_exp, _ = rope_expected(*inputs[:2], inputs[4], inputs[5], is_neox)
    assert rel_l2(got[0].double(), q_exp * 0.75) > 1e-3


@pytest.mark.parametrize("config", [{"block_r": 4, "num_warps": 2}, {"block_r": 16, "num_warps": 4}])
@pytest.mark.parametrize("heads", [1, 5, 16])
def test_rope_writes_poisoned_strided_cache_rows(config, heads):
    """Outputs are slices of 576-byte rows with a spare head row; every written byte equals the reference's."""
    from mla_core.plugins import get_backend
    from mla_core import specs
    nnz = 4
    inputs = make_inputs(nnz=nnz, heads=heads, seed=heads)
    q_rows = torch.full((nnz, heads + 1, 576), float("nan"), dtype=FP8)
    k_rows = torch.full((nnz, 2, 576), float("nan"), dtype=FP8)  # the second row of each token stays NaN
    outs = dict(q_rope_out=q_rows[:, :heads, 512:], k_rope_out=k_rows[:, 0, 512:], q_nope_out=q_rows[:, :heads, :512],
                k_nope_out=k_rows[:, 0, :512])
    problem, call = specs.validate_rope_quantize(*inputs, False, None, 2.0, 0.5, *outs.values())
    got = get_backend("musa_fp8").run(problem, call, config)
    assert all(g is o for g, o in zip(got, outs.values()))
    want = rope_call(inputs, "reference", is_neox=False, quant_scale_q=2.0, quant_scale_kv=0.5)
    for g, w in zip(got, want):
        assert torch.equal(bits(g), bits(w))
    assert q_rows[:, heads].float().isnan().all() and k_rows[:, 1].float().isnan().all()


ROPE_EDGES = [  # tokens, heads, rope, nope, is_neox, dtype, cos/sin dtype, pos dtype
    (1, 1, 64, 512, False, torch.bfloat16, torch.float32, torch.int64),
    (3, 5, 64, 512, True, torch.float16, torch.bfloat16, torch.int32),
    (9, 17, 64, 512, False, torch.bfloat16, torch.bfloat16, torch.int32),
    (5, 3, 6, 96, False, torch.bfloat16, torch.float32, torch.int64),  # half 3 and 96 NOPE: masked columns
    (4, 2, 2, 0, True, torch.float16, torch.float32, torch.int64),  # no NOPE values
    (7, 16, 6, 40, True, torch.bfloat16, torch.float32, torch.int32),
    (2, 40, 64, 128, False, torch.bfloat16, torch.float32, torch.int64),  # three RoPE groups of 16 heads
]


@pytest.mark.parametrize("edge", ROPE_EDGES, ids=lambda e: "x".join(map(str, e[:4])) + ("-neox" if e[4] else ""))
def test_rope_every_config_at_row_and_column_edges(edge):
    """Every config of the backend: partial head groups, key-row programs past the last token, odd widths; outputs
    are slices of poisoned rows with a spare head row and a spare key row, every written byte the reference's."""
    _rope_every_config_matches_reference(*edge)


# the kernel's row tiles: block_r NOPE heads (and key rows) per program, rope_r RoPE heads per program
ROPE_ROW_TILES = [4, 8, 16, 32, 64]


@pytest.mark.parametrize("heads", [h for h in boundary_lengths(ROPE_ROW_TILES, limit=65, multiples=(1,)) if h])
def test_rope_every_config_at_head_tile_edges(heads):
    """Head counts at every edge of the configs' head tiles (block_r, rope_r), every config, interleaved."""
    _rope_every_config_matches_reference(2, heads, 64, 128, False, torch.bfloat16, torch.float32, torch.int64)


@pytest.mark.parametrize("tokens", [t for t in boundary_lengths([4, 8, 16], limit=17, multiples=(1,)) if t])
def test_rope_every_config_at_key_row_tile_edges(tokens):
    """Token counts at every edge of the key-row programs' tiles (block_r key rows each), every config, NeoX."""
    _rope_every_config_matches_reference(tokens, 1, 64, 128, True, torch.float16, torch.float32, torch.int32)


def _rope_every_config_matches_reference(nnz, heads, rope, nope, is_neox, dtype, cache_dtype, pos_dtype):
    from mla_core import specs
    from mla_core.plugins import get_backend
    inputs = make_inputs(nnz=nnz, heads=heads, rope=rope, nope=nope, dtype=dtype, cache_dtype=cache_dtype,
                         pos_dtype=pos_dtype, seed=nnz * heads)
    want = rope_call(inputs, "reference", is_neox=is_neox, quant_scale_q=2.0, quant_scale_kv=0.5)
    backend = get_backend("musa_fp8")
    width = nope + rope
    for config in backend.configs(specs.validate_rope_quantize(*inputs, is_neox, None, 2.0, 0.5, None, None, None,
                                                               None)[0]):
        q_rows = torch.full((nnz, heads + 1, width), float("nan"), dtype=FP8)
        k_rows = torch.full((nnz, 2, width), float("nan"), dtype=FP8)
        outs = (q_rows[:, :heads, nope:], k_rows[:, 0, nope:], q_rows[:, :heads, :nope], k_rows[:, 0, :nope])
        problem, call = specs.validate_rope_quantize(*inputs, is_neox, None, 2.0, 0.5, *outs)
        got = backend.run(problem, call, config)
        for g, w in zip(got, want):
            assert torch.equal(bits(g), bits(w)), config
        assert q_rows[:, heads].float().isnan().all() and k_rows[:, 1].float().isnan().all(), config


def test_rope_saturates_and_rounds_ties_to_even():
    """Values past 448 saturate; exact E4M3 midpoints (17 = between 16 and 18) round to the even code."""
    nnz, heads = 2, 2
    inputs = list(make_inputs(nnz=nnz, heads=heads, seed=3))
    inputs[2] = torch.full((nnz, heads, 512), 17.0, dtype=torch.bfloat16)
    inputs[2][:, :, 1::2] = -1000.0
    inputs[3] = torch.full((nnz, 512), 9.5, dtype=torch.bfloat16)  # midway between 9 and 10: rounds to 10 (even)
    got = rope_call(inputs, "musa_fp8")
    assert (got[2].float()[:, :, 0::2] == 16.0).all() and (got[2].float()[:, :, 1::2] == -448.0).all()
    assert (got[3].float() == 10.0).all()


def test_rope_empty_batch():
    got = rope_call(make_inputs(nnz=0), "musa_fp8")
    assert [tuple(t.shape) for t in got] == [(0, 4, 64), (0, 64), (0, 4, 512), (0, 512)]


@pytest.mark.parametrize("backend", ["reference", "musa_fp8"])
def test_rope_positions_outside_table_give_zero_rope(backend, monkeypatch):
    """With content checks off, a position outside cos/sin is masked: rope outputs 0, NOPE quantized as usual."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    inputs = list(make_inputs(nnz=4, heads=2, max_pos=50, seed=5))
    inputs[5] = torch.tensor([-1, 50, 10 ** 6, 7], dtype=torch.int64)
    got = rope_call(inputs, backend)
    assert (got[0].float()[:3] == 0).all() and (got[1].float()[:3] == 0).all()
    want = rope_call([*inputs[:5], torch.full((4,), 7, dtype=torch.int64)], "reference")
    assert torch.equal(bits(got[0][3]), bits(want[0][3])) and torch.equal(bits(got[2]), bits(want[2]))
    monkeypatch.setenv("MLA_CORE_CHECKS", "full")
    with pytest.raises(mla_core.MLAInputError, match="pos_ids"):
        rope_call(inputs, backend)


# ------------------------------------------------------------------------------------------------ sparse


def check_sparse(case, got, lens="given", bmm1=0.05, bmm2=1.0):
    out, lse = got
    want_out, want_lse = run_sparse(case, "reference", seq_lens=lens, return_lse=True, bmm1_scale=bmm1,
                                    bmm2_scale=bmm2)
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_l2(out, want_out) < 1e-2
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_l2(lse[finite], want_lse[finite]) < 1e-5
    assert (out[~finite] == 0).all() and (lse[~finite] == -math.inf).all()


@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("q_len,top_k", [(1, 64), (2, 128), (4, 64)])
def test_sparse_matches_reference_at_tile_boundaries(layout, q_len, top_k):
    lengths = boundary_lengths(BLOCK_NS, limit=top_k, extra=[top_k])  # 0, 1, 31..33, 63..65, 127, 128
    lengths = lengths[:4] if q_len == 4 else lengths  # interpreter time
    case = sparse_inputs(len(lengths), q_len, 3, top_k, lengths, layout=layout, seed=q_len + top_k)
    got = run_sparse(case, "musa_fp8", return_lse=True, bmm1_scale=0.05)
    check_sparse(case, got)


@pytest.mark.parametrize("splits,block_n", [(1, 64), (2, 32), (3, 64)])
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_sparse_splits_and_head_groups(splits, block_n, layout):
    """Splits merged by LSE, 20 heads in groups of 16 (a partial group), bmm2 applied once."""
    from mla_core.plugins import get_backend
    from mla_core import specs
    case = sparse_inputs(2, 1, 20, 192, [192, 100], layout=layout, seed=splits)
    args = (case["query"], case["kv_cache"], 128, 512, 64, case["indices"], case["seq_lens"], 192, None, 0.04, 2.5,
            None, True, None)
    problem, call = specs.validate_sparse_decode(*args)
    config = {"block_h": 16, "block_n": block_n, "num_warps": 4, "num_stages": 1, "num_splits": splits}
    got = get_backend("musa_fp8").run(problem, call, config)
    check_sparse(case, got, bmm1=0.04, bmm2=2.5)


@pytest.mark.parametrize("lse_layout", ["flat", "3d"])
def test_sparse_poisoned_buffers_minus_one_rows_and_empty_requests(lse_layout):
    case = sparse_inputs(3, 2, 4, 64, [64, 0, 30], seed=7, four_d=True)
    case["indices"][0, 1] = -1  # an all -1 row
    out = torch.full((3, 2, 4, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((6, 4) if lse_layout == "flat" else (3, 2, 4), float("nan"))
    got_out, got_lse = run_sparse(case, "musa_fp8", out=out, lse=lse, return_lse=True, bmm1_scale=0.05)
    assert got_out is out and got_lse is lse
    check_sparse(case, (out, lse.view(3, 2, 4)))
    assert (out[0, 1] == 0).all() and (lse.view(3, 2, 4)[1] == -math.inf).all()


def test_sparse_seq_lens_none_reads_every_slot():
    case = sparse_inputs(1, 2, 4, 64, [64], layout="fp8_ds_mla", seed=8)
    check_sparse(case, run_sparse(case, "musa_fp8", seq_lens=None, return_lse=True, bmm1_scale=0.05), lens=None)


@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_sparse_masks_indices_outside_the_cache(layout, monkeypatch):
    """MLA_CORE_CHECKS=metadata: an index past the cache (or negative) among valid slots is skipped, never read."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case = sparse_inputs(2, 1, 4, 64, [64, 40], layout=layout, seed=9)
    case["indices"][0, 0, 3] = case["rows"]
    case["indices"][0, 0, 9] = case["rows"] + 5
    case["indices"][1, 0, 0] = -5
    case["indices"][1, 0, 1] = 2 ** 31 - 1
    check_sparse(case, run_sparse(case, "musa_fp8", return_lse=True, bmm1_scale=0.05))


def test_sparse_empty_cache(monkeypatch):
    """A cache with no rows: with content checks the valid slots are an error; without, every slot is masked."""
    case = sparse_inputs(2, 1, 4, 64, [10, 0], seed=10)
    case["kv_cache"] = case["kv_cache"][:0]
    with pytest.raises(mla_core.MLAInputError, match="block_tables"):
        run_sparse(case, "musa_fp8")
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    out, lse = run_sparse(case, "musa_fp8", return_lse=True)
    assert (out == 0).all() and (lse == -math.inf).all()


@pytest.mark.parametrize("backend", ["reference", "musa_fp8"])
def test_sparse_fp8_ds_mla_through_torch_compile(backend):
    """The custom op's fake validates the 656-byte layout (bf16 query) and the compiled call equals the eager one."""
    case = sparse_inputs(2, 1, 4, 64, [64, 10], layout="fp8_ds_mla", seed=14)

    @torch.compile(fullgraph=True, backend="eager")
    def step(query, kv_cache, indices, seq_lens):
        return mla_core.sparse_mla_fp8_decode(query, kv_cache, None, 128, 512, 64, indices, seq_lens, 0, 64,
                                              bmm1_scale=0.05, return_lse=True, backend=backend)
    got = step(case["query"], case["kv_cache"], case["indices"], case["seq_lens"])
    want = run_sparse(case, backend, return_lse=True, bmm1_scale=0.05)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_musa_fp8_is_listed_with_both_ops_and_configs():
    info = mla_core.get_backend("musa_fp8").info()
    assert set(info["ops"]) == {"rope_quantize_fp8", "sparse_decode"}
    assert "fp8_ds_mla" in info["ops"]["sparse_decode"]["limits"]["kv_layout"]
    problem = mla_core.Problem.make("sparse_decode", "cuda", heads=128, q_len=1, top_k=2048, kv_lora_rank=512,
                                    rope_dim=64, kv_layout="fp8", batch=32)
    configs = mla_core.get_backend("musa_fp8").configs(problem)
    assert configs and all({"block_h", "block_n", "num_warps"} <= set(c) for c in configs)
    assert mla_core.get_backend("musa_fp8").why_not(problem) == []
    too_long = mla_core.Problem.make("sparse_decode", "cuda", heads=128, q_len=5, top_k=64, kv_lora_rank=512,
                                     rope_dim=64, kv_layout="fp8", batch=1)
    assert any("q_len" in r for r in mla_core.get_backend("musa_fp8").why_not(too_long))


# ------------------------------------------------------------------------------------------------ GPU


def _gpu_case(batch, q_len, heads, top_k, layout, lengths=None, tokens=32768, seed=0):
    """DeepSeek-sized case: a 32k-token cache, lengths default to top_k (the case of FlashMLA's benchmark)."""
    lengths = lengths if lengths is not None else [top_k] * batch
    return sparse_inputs(batch, q_len, heads, top_k, lengths, layout=layout, pages=tokens // 64, page_size=64,
                         seed=seed, device="cuda", minus_one=0.05)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
@pytest.mark.parametrize("q_len", [1, 2, 4])
@pytest.mark.parametrize("heads,top_k", [(128, 2048), (64, 64), (16, 2048)])
def test_gpu_sparse_deepseek_sizes(layout, q_len, heads, top_k):
    lengths = [top_k, 0, top_k // 2 + 1, 1]
    case = _gpu_case(4, q_len, heads, top_k, layout, lengths=lengths, seed=q_len)
    case["indices"][2, -1] = -1  # an all -1 row
    out = torch.full((4, q_len, heads, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((4 * q_len, heads), float("nan"), device="cuda")
    scale = 576 ** -0.5 if layout == "fp8_ds_mla" else 576 ** -0.5 * 4
    run_sparse(case, "musa_fp8", out=out, lse=lse, return_lse=True, bmm1_scale=scale)
    check_sparse(case, (out, lse.view(4, q_len, heads)), bmm1=scale)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_gpu_sparse_every_config_agrees(layout):
    from mla_core import specs
    from mla_core.plugins import get_backend
    case = _gpu_case(8, 1, 128, 2048, layout, seed=3)
    args = (case["query"], case["kv_cache"], 128, 512, 64, case["indices"], case["seq_lens"], 2048, None, 0.05, 1.0,
            None, True, None)
    problem, call = specs.validate_sparse_decode(*args)
    backend = get_backend("musa_fp8")
    for config in backend.configs(problem) + [dict(backend.configs(problem)[0], num_splits=1)]:
        check_sparse(case, backend.run(problem, call, config))


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["musa_fp8", "reference"])
def test_gpu_sparse_cuda_graph_capture_without_host_sync(backend, monkeypatch):
    """In metadata checks mode both backends run inside a CUDA graph and never synchronize with the host."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    case = _gpu_case(2, 2, 64, 128, "fp8", lengths=[128, 50])
    meta = mla_core.get_sparse_decode_metadata(case["query"], case["seq_lens"], 128)
    out = torch.empty(2, 2, 64, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(2, 2, 64, device="cuda")

    def call():
        run_sparse(case, backend, out=out, lse=lse, metadata=meta, bmm1_scale=0.05)
    call()  # compile outside the graph
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
    graph.replay()
    torch.cuda.synchronize()
    check_sparse(case, (out, lse))


@pytest.mark.gpu
def test_gpu_sparse_and_rope_under_torch_compile():
    case = _gpu_case(2, 1, 16, 64, "fp8", lengths=[64, 10])

    @torch.compile(fullgraph=True)
    def step(query, kv_cache, indices, seq_lens):
        return mla_core.sparse_mla_fp8_decode(query, kv_cache, None, 128, 512, 64, indices, seq_lens, 0, 64,
                                              bmm1_scale=0.05, return_lse=True, backend="musa_fp8")
    check_sparse(case, step(case["query"], case["kv_cache"], case["indices"], case["seq_lens"]))
    inputs = [t.cuda() for t in make_inputs(nnz=8, heads=16)]

    @torch.compile(fullgraph=True)
    def rope(*args):
        return mla_core.mla_rope_quantize_fp8(*args, quant_scale_q=0.5, backend="musa_fp8")
    for g, w in zip(rope(*inputs), rope_call(inputs, "reference", quant_scale_q=0.5)):
        assert torch.equal(bits(g), bits(w))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
def test_gpu_rope_deepseek_size_bitwise(is_neox):
    """4096 tokens x 128 heads into 576-byte cache rows, bf16 cos/sin, against the reference."""
    nnz, heads = 4096, 128
    inputs = [t.cuda() for t in make_inputs(nnz=nnz, heads=heads, cache_dtype=torch.bfloat16, max_pos=8192, seed=2)]
    q_rows = torch.full((nnz, heads, 576), float("nan"), dtype=FP8, device="cuda")
    k_rows = torch.full((nnz, 576), float("nan"), dtype=FP8, device="cuda")
    got = rope_call(inputs, "musa_fp8", is_neox=is_neox, quant_scale_q=0.5, quant_scale_kv=2.0,
                    q_rope_out=q_rows[..., 512:], k_rope_out=k_rows[:, 512:], q_nope_out=q_rows[..., :512],
                    k_nope_out=k_rows[:, :512])
    want = rope_call(inputs, "reference", is_neox=is_neox, quant_scale_q=0.5, quant_scale_kv=2.0)
    for g, w in zip(got, want):
        assert torch.equal(bits(g), bits(w))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize("nnz,heads", [(1001, 128), (33, 17)])
def test_gpu_rope_every_config_bitwise(is_neox, nnz, heads):
    """Each config of the backend (the autotuner may pick any) into 576-byte rows, against the reference."""
    from mla_core import specs
    from mla_core.plugins import get_backend
    inputs = [t.cuda() for t in make_inputs(nnz=nnz, heads=heads, max_pos=4096, seed=heads)]
    want = rope_call(inputs, "reference", is_neox=is_neox, quant_scale_q=0.5, quant_scale_kv=2.0)
    backend = get_backend("musa_fp8")
    q_rows = torch.empty((nnz, heads, 576), dtype=FP8, device="cuda")
    k_rows = torch.empty((nnz, 576), dtype=FP8, device="cuda")
    outs = (q_rows[..., 512:], k_rows[:, 512:], q_rows[..., :512], k_rows[:, :512])
    problem, call = specs.validate_rope_quantize(*inputs, is_neox, None, 0.5, 2.0, *outs)
    for config in backend.configs(problem):
        q_rows.fill_(float("nan"))
        k_rows.fill_(float("nan"))
        got = backend.run(problem, call, config)
        for g, w in zip(got, want):
            assert torch.equal(bits(g), bits(w)), config


@pytest.mark.gpu
def test_gpu_rope_positions_outside_table_masked(monkeypatch):
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    inputs = [t.cuda() for t in make_inputs(nnz=4, heads=16, max_pos=64)]
    inputs[5] = torch.tensor([-1, 64, 10 ** 9, 3], device="cuda")
    for backend in ("musa_fp8", "reference"):
        got = rope_call(inputs, backend)
        torch.cuda.synchronize()
        assert (got[0].float()[:3] == 0).all() and (got[1].float()[:3] == 0).all()
