"""Reference ``sparse_mla_fp8_decode`` against independent float64 math (a naive loop per request, query, head).

Inputs are FP8 (the op's data), so the expectation upcasts the same FP8 values to float64; the
reference's float32 softmax and its bf16 output must match within bf16 (out) and fp32 (lse) tolerances.
"""
import math

import pytest
import torch

import mla_core

FP8 = torch.float8_e4m3fn
LATENT, WIDTH = 512, 576


def sparse_expected(query, kv_flat, indices, seq_lens, top_k, bmm1, bmm2):
    """Float64 (out [b, q, h, 512], lse [b, q, h]); slots past seq_lens[b] and -1 are skipped."""
    batch, q_len, heads, _ = query.shape
    q64, kv64 = query.double(), kv_flat.double()
    out = torch.zeros(batch, q_len, heads, LATENT, dtype=torch.float64)
    lse = torch.full((batch, q_len, heads), -math.inf, dtype=torch.float64)
    for b in range(batch):
        length = top_k if seq_lens is None else min(int(seq_lens[b]), top_k)
        for t in range(q_len):
            rows = [int(indices[b, t, j]) for j in range(length) if int(indices[b, t, j]) != -1]
            if not rows:
                continue
            keys = torch.stack([kv64[r] for r in rows])  # [n, 576]; a duplicate row is a second key
            for h in range(heads):
                scores = [float(keys[n] @ q64[b, t, h]) * bmm1 for n in range(len(rows))]
                m = max(scores)
                weights = [math.exp(s - m) for s in scores]
                total = sum(weights)
                lse[b, t, h] = m + math.log(total)
                acc = sum(w * keys[n, :LATENT] for n, w in enumerate(weights))
                out[b, t, h] = acc / total * bmm2
    return out, lse


def rel_l2(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def make_case(batch=2, q_len=2, heads=4, pages=6, page_size=16, top_k=64, seed=0, four_d=False):
    """FP8 query and cache, indices into the flat cache rows (-1 sprinkled in); returns a dict of inputs."""
    g = torch.Generator().manual_seed(seed)
    query = (torch.randn(batch, q_len, heads, WIDTH, generator=g) * 0.5).to(FP8)
    cache = (torch.randn(pages, page_size, WIDTH, generator=g)).to(FP8)
    rows = pages * page_size
    indices = torch.randint(0, rows, (batch, q_len, top_k), generator=g, dtype=torch.int32)
    indices[torch.rand(indices.shape, generator=g) < 0.15] = -1
    if four_d:
        cache = cache.view(pages, 1, page_size, WIDTH)
    return dict(query=query, kv_cache=cache, indices=indices, rows=rows, top_k=top_k)


def run(case, seq_lens, backend="auto", **kw):
    return mla_core.sparse_mla_fp8_decode(case["query"], case["kv_cache"], None, 128, 512, 64, case["indices"],
                                          seq_lens, 0, case["top_k"], backend=backend, **kw)


def check(case, seq_lens, out, lse, bmm1=1.0, bmm2=1.0):
    exp_out, exp_lse = sparse_expected(case["query"], case["kv_cache"].reshape(-1, WIDTH), case["indices"], seq_lens,
                                       case["top_k"], bmm1, bmm2)
    assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32
    assert not out.isnan().any() and not lse.isnan().any()
    assert rel_l2(out, exp_out) < 1e-2
    finite = torch.isfinite(exp_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert rel_l2(lse[finite], exp_lse[finite]) < 1e-5
    assert (out[~finite] == 0).all() and (lse[~finite] == -math.inf).all()


@pytest.mark.parametrize("four_d", [False, True])
def test_matches_float64_with_short_lengths_and_minus_one(four_d):
    case = make_case(four_d=four_d, top_k=128)
    seq_lens = torch.tensor([37, 128], dtype=torch.int32)  # 37 < top_k: most slots unused in request 0
    out, lse = run(case, seq_lens, return_lse=True, bmm1_scale=576 ** -0.5)
    assert out.shape == (2, 2, 4, LATENT) and lse.shape == (2, 2, 4)
    check(case, seq_lens, out, lse, bmm1=576 ** -0.5)


def test_seq_lens_none_reads_every_slot():
    case = make_case(seed=1)
    out, lse = run(case, None, return_lse=True, bmm1_scale=0.05)
    check(case, None, out, lse, bmm1=0.05)


def test_bmm_scales_change_softmax_and_output():
    case = make_case(seed=2, batch=1)
    seq_lens = torch.tensor([50], dtype=torch.int32)
    out_a, lse_a = run(case, seq_lens, return_lse=True, bmm1_scale=0.02, bmm2_scale=1.0)
    out_b, lse_b = run(case, seq_lens, return_lse=True, bmm1_scale=0.08, bmm2_scale=3.0)
    check(case, seq_lens, out_a, lse_a, bmm1=0.02, bmm2=1.0)
    check(case, seq_lens, out_b, lse_b, bmm1=0.08, bmm2=3.0)
    assert rel_l2(out_a * 3.0, out_b) > 0.05  # bmm1 sharpens the softmax, not only bmm2's factor


def test_tensor_host_scalars_are_accepted():
    case = make_case(seed=3, batch=1)
    seq_lens = torch.tensor([64], dtype=torch.int32)
    out, lse = run(case, seq_lens, return_lse=True, bmm1_scale=torch.tensor(0.03), bmm2_scale=torch.tensor([2.0]))
    check(case, seq_lens, out, lse, bmm1=0.03, bmm2=2.0)


def test_garbage_past_lengths_and_unreferenced_nan_rows_are_never_read():
    """Slots past seq_lens hold out-of-range and negative values; unselected cache rows are NaN."""
    case = make_case(seed=4, pages=8, top_k=64)
    seq_lens = torch.tensor([20, 0], dtype=torch.int32)
    idx = case["indices"]
    idx[0, :, 20:] = 10 ** 9
    idx[0, :, 40:] = -7
    idx[1] = 2 ** 31 - 1  # request 1 has no valid slot at all
    flat = case["kv_cache"].view(-1, WIDTH)
    used = idx[0, :, :20]
    unused = torch.ones(case["rows"], dtype=torch.bool)
    unused[used[used >= 0].long()] = False
    flat[unused] = torch.full((int(unused.sum()), WIDTH), float("nan"), dtype=FP8)
    out, lse = run(case, seq_lens, return_lse=True, bmm1_scale=0.05)
    check(case, seq_lens, out, lse, bmm1=0.05)
    assert (out[1] == 0).all() and (lse[1] == -math.inf).all()


def test_all_minus_one_row_gives_zero_and_minus_inf():
    case = make_case(seed=5)
    case["indices"][0, 1] = -1
    out, lse = run(case, None, return_lse=True)
    assert (out[0, 1] == 0).all() and (lse[0, 1] == -math.inf).all()
    check(case, None, out, lse)


def test_duplicate_indices_count_as_separate_keys():
    """One row selected twice among two distinct rows gets weight 2/3 when all scores are equal."""
    case = make_case(seed=6, batch=1, q_len=1, heads=2)
    flat = case["kv_cache"].view(-1, WIDTH)
    idx = torch.full((1, 1, 64), -1, dtype=torch.int32)
    idx[0, 0, :3] = torch.tensor([5, 9, 5], dtype=torch.int32)
    case["indices"] = idx
    out, lse = run(case, None, return_lse=True, bmm1_scale=0.0)  # scale 0: uniform softmax over the 3 keys
    want = (2 * flat[5, :LATENT].double() + flat[9, :LATENT].double()) / 3
    assert rel_l2(out[0, 0, 0], want) < 1e-2
    assert torch.allclose(lse[0, 0], torch.full((2,), math.log(3.0)))
    check(case, None, out, lse, bmm1=0.0)


@pytest.mark.parametrize("lse_layout", ["flat", "3d"])
def test_given_out_and_lse_buffers_are_written(lse_layout):
    case = make_case(seed=7)
    batch, q_len, heads = 2, 2, 4
    seq_lens = torch.tensor([64, 33], dtype=torch.int32)
    out_buf = torch.full((batch, q_len, heads, LATENT), float("nan"), dtype=torch.bfloat16)
    shape = (batch * q_len, heads) if lse_layout == "flat" else (batch, q_len, heads)
    lse_buf = torch.full(shape, float("nan"), dtype=torch.float32)
    out, lse = run(case, seq_lens, out=out_buf, lse=lse_buf, return_lse=True, bmm1_scale=0.05)
    assert out is out_buf
    assert lse is lse_buf  # returned in the caller's own layout
    check(case, seq_lens, out_buf, lse_buf.view(batch, q_len, heads), bmm1=0.05)
    # Without return_lse the buffer is still written and only out comes back.
    lse_buf.fill_(float("nan"))
    only_out = run(case, seq_lens, lse=lse_buf, bmm1_scale=0.05)
    assert isinstance(only_out, torch.Tensor) and not lse_buf.isnan().any()


def test_metadata_reuse_matches_fresh_metadata():
    case = make_case(seed=8)
    seq_lens = torch.tensor([10, 64], dtype=torch.int32)
    meta = mla_core.get_sparse_decode_metadata(case["query"], seq_lens, case["top_k"])
    assert meta.valid_lens.tolist() == [10, 64]
    alias = mla_core.get_batch_decode_metadata_mla(case["query"], seq_lens, case["top_k"])
    assert torch.equal(alias.valid_lens, meta.valid_lens)
    fresh = run(case, seq_lens, return_lse=True, bmm1_scale=0.05)
    for _ in range(2):  # the same metadata object serves several calls
        reused = run(case, seq_lens, return_lse=True, bmm1_scale=0.05, metadata=meta)
        assert torch.equal(reused[0], fresh[0]) and torch.equal(reused[1], fresh[1])
    none_meta = mla_core.get_sparse_decode_metadata(case["query"], None, case["top_k"])
    assert none_meta.valid_lens.tolist() == [64, 64]


@pytest.mark.parametrize("name", ["trtllm-gen", "xqa", "auto", None])
def test_flashinfer_backend_names_mean_auto(name):
    case = make_case(seed=9, batch=1)
    seq_lens = torch.tensor([40], dtype=torch.int32)
    out, lse = run(case, seq_lens, backend=name, return_lse=True)
    ref_out, ref_lse = run(case, seq_lens, backend="reference", return_lse=True)
    check(case, seq_lens, out, lse)
    assert rel_l2(out, ref_out) < 1e-2


def test_unknown_backend_lists_known_ones():
    case = make_case(seed=10, batch=1)
    with pytest.raises(mla_core.MLAInputError, match="backend") as err:
        run(case, None, backend="no-such-backend")
    assert "no-such-backend" in str(err.value) and "reference" in str(err.value)


def test_deepseek_heads_q_len_one():
    """128 heads, one query token, top-k 128 over a [pages, 1, page_size, 576] cache."""
    case = make_case(seed=11, batch=1, q_len=1, heads=128, pages=4, page_size=64, top_k=128, four_d=True)
    seq_lens = torch.tensor([100], dtype=torch.int32)
    out, lse = run(case, seq_lens, return_lse=True, bmm1_scale=576 ** -0.5)
    check(case, seq_lens, out, lse, bmm1=576 ** -0.5)


def test_stale_metadata_is_refused_by_value_in_full_mode_and_by_shape_in_metadata_mode(monkeypatch):
    """Metadata built from seq_lens [5, 5] is refused for [100, 0] (issue: it used to run silently)."""
    case = make_case(seed=12, top_k=128)
    meta = mla_core.get_sparse_decode_metadata(case["query"], torch.tensor([5, 5], dtype=torch.int32), 128)
    new_lens = torch.tensor([100, 0], dtype=torch.int32)
    with pytest.raises(mla_core.MLAInputError, match=r"metadata: .*seq_lens\[0\] = 5"):
        run(case, new_lens, metadata=meta)
    run(case, torch.tensor([5, 5], dtype=torch.int32), metadata=meta)  # the lengths it was built from: fine
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")
    run(case, new_lens, metadata=meta)  # values unseen without a sync: accepted (documented)
    other_q = dict(case, query=case["query"][:, :1].contiguous(), indices=case["indices"][:, :1].contiguous())
    with pytest.raises(mla_core.MLAInputError, match="metadata"):
        run(other_q, new_lens, metadata=meta)  # another q_len
    with pytest.raises(mla_core.MLAInputError, match="metadata"):
        run(case, None, metadata=meta)  # built from seq_lens, called without
    meta64 = mla_core.get_sparse_decode_metadata(case["query"], new_lens.clamp(max=64), 64)
    with pytest.raises(mla_core.MLAInputError, match="metadata"):
        run(case, new_lens, metadata=meta64)  # another top-k


def test_fp8_ds_mla_rows_match_float64_of_the_unpacked_values():
    """656-byte rows: the reference equals float64 math on layouts.unpack's values (code * block scale, bf16 rope)."""
    from mla_core import layouts
    g = torch.Generator().manual_seed(13)
    latent = torch.randn(6 * 16, WIDTH, generator=g) * torch.tensor([0.01, 1.0, 50.0, 3.0]).repeat_interleave(144)
    packed = layouts.pack_fp8_ds_mla(latent)
    query = torch.randn(2, 2, 4, WIDTH, generator=g).to(torch.bfloat16)
    indices = torch.randint(0, 96, (2, 2, 64), generator=g, dtype=torch.int32)
    indices[torch.rand(indices.shape, generator=g) < 0.2] = -1
    seq_lens = torch.tensor([40, 64], dtype=torch.int32)
    out, lse = mla_core.sparse_mla_fp8_decode(query, packed.view(6, 16, 656), None, 128, 512, 64, indices, seq_lens,
                                              0, 64, bmm1_scale=0.02, return_lse=True, backend="reference")
    exp_out, exp_lse = sparse_expected(query, layouts.unpack_fp8_ds_mla(packed), indices, seq_lens, 64, 0.02, 1.0)
    assert rel_l2(out, exp_out) < 1e-2 and rel_l2(lse, exp_lse) < 1e-5
    with pytest.raises(mla_core.MLAInputError, match="query: got dtype float8_e4m3fn, needs bfloat16"):
        mla_core.sparse_mla_fp8_decode(query.to(FP8), packed.view(6, 16, 656), None, 128, 512, 64, indices, seq_lens,
                                       0, 64, backend="reference")
    with pytest.raises(mla_core.MLAInputError, match="kv_cache: got last dimension 600"):
        mla_core.sparse_mla_fp8_decode(query, torch.zeros(6, 16, 600, dtype=torch.uint8), None, 128, 512, 64,
                                       indices, seq_lens, 0, 64, backend="reference")


def test_hand_built_metadata_with_wrong_valid_lens_is_refused():
    case = make_case(seed=15)
    seq_lens = torch.tensor([5, 5], dtype=torch.int32)
    for bad in (torch.zeros(0, dtype=torch.int32), torch.zeros(2, dtype=torch.int64), [5, 5]):
        meta = mla_core.SparseDecodeMetadata(2, 2, 4, 64, bad)
        with pytest.raises(mla_core.MLAInputError, match="metadata: got valid_lens"):
            run(case, seq_lens, metadata=meta)
