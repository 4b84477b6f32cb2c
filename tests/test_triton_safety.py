"""Decode / prefill / merge on the reference and triton backends when the contents are not what validation
would accept, and inside other people's code (docs/decisions.md, "Out-of-range metadata, empty states, outputs").

- With content checks off (``MLA_CORE_CHECKS=metadata``, as serving runs) no kernel reads or writes outside
  the tensors it was given: lengths past the block table's capacity are clamped, page ids outside the cache
  are absent keys, ``cu_seqlens`` are clamped to q / k / v. The neighbours of every tensor (the rest of the
  storage a view was cut from) hold NaN or another request's data, so a read past an edge shows up; each
  backend equals the reference run on the clamped, valid call.
- ``merge_attn_states`` reads an input LSE of +inf (FlashAttention / FlashMLA / vLLM's empty row) as empty.
- Every op's new outputs are contiguous.
- No op depends on torch's global default dtype (bfloat16 here, as model loaders set it) or device (cuda:
  a GPU test).
The triton cases run under the interpreter on the CPU (conftest sets TRITON_INTERPRET=1).
"""
from __future__ import annotations

import math
import os

import pytest
import torch

import mla_core
from reference_math import rel_l2, same_lse

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
BACKENDS = ["reference", pytest.param("triton", marks=pytest.mark.skipif(
    not (INTERPRETED or torch.cuda.is_available()), reason="triton runs under the interpreter or on a GPU"))]
NAN = float("nan")


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every buffer the triton decode / prefill kernels write starts as NaN (an unwritten element fails)."""
    if not (INTERPRETED or torch.cuda.is_available()):
        return
    from mla_core_triton import decode, prefill
    for module in (decode, prefill):
        monkeypatch.setattr(module, "_new_output",
                            lambda shape, dtype, device: torch.full(shape, NAN, dtype=dtype, device=device))


@pytest.fixture
def metadata_checks(monkeypatch):
    monkeypatch.setenv("MLA_CORE_CHECKS", "metadata")


# ------------------------------------------------------------------------------------------------ decode
# rank 32 + rope 16, pages of 4 tokens; a 2-row table whose second row points at another request's pages


def _decode_case(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randn(6, 4, 48, generator=g).to(dtype)
    q = torch.randn(1, 3, 48, generator=g).to(dtype)
    storage = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    return q, cache, storage


def _decode(backend, q, cache, table, lens, **kw):
    return mla_core.mla_decode(q, cache, table, lens, softmax_scale=0.2, kv_lora_rank=32, qk_rope_head_dim=16,
                               backend=backend, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("splits", [1, 3])
def test_decode_length_past_the_table_is_clamped(backend, splits, metadata_checks):
    """The issue's case: ``bt = storage[:1]`` of a 2-row table (capacity 3 pages x 4 = 12), length 24. The
    kernel used to read the next row of the table's storage (another request's pages)."""
    q, cache, storage = _decode_case()
    table = storage[:1]
    out, lse = _decode(backend, q, cache, table, torch.tensor([24], dtype=torch.int32), num_kv_splits=splits)
    clamped = _decode("reference", q, cache, table, torch.tensor([12], dtype=torch.int32), num_kv_splits=splits)
    overrun = _decode("reference", q, cache, storage.reshape(1, 6), torch.tensor([24], dtype=torch.int32),
                      num_kv_splits=splits)
    assert rel_l2(out, clamped[0]) < 1e-5 and same_lse(lse, clamped[1], 1e-5)
    assert rel_l2(out, overrun[0]) > 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_int64_length_past_int32_and_negative_length(backend, metadata_checks):
    """2**32 + 5 would wrap to 5 in int32 (it used to); it is clamped to the capacity first. A negative
    length is an empty request: output 0, LSE -inf."""
    q, cache, storage = _decode_case(seed=1)
    q = q.expand(3, -1, -1).contiguous()
    table = storage[[0, 0, 1]]
    lens = torch.tensor([2 ** 32 + 5, -7, 2 ** 40], dtype=torch.int64)
    out, lse = _decode(backend, q, cache, table, lens, num_kv_splits=2)
    ref, ref_lse = _decode("reference", q, cache, table, torch.tensor([12, 0, 12], dtype=torch.int64),
                           num_kv_splits=2)
    assert rel_l2(out, ref) < 1e-5 and same_lse(lse, ref_lse, 1e-5)
    assert (out[1] == 0).all() and (lse[1] == -math.inf).all()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", [None, "nvfp4"])
def test_decode_page_ids_outside_the_cache_are_absent_keys(backend, recipe, metadata_checks):
    """Pages 10**6, -5 and 2**31 - 1 within the length: absent keys (score -inf, V 0 in its NVFP4 block);
    with no quantization the result is the call over the first page's 4 keys alone."""
    q, cache, _ = _decode_case(seed=2)
    table = torch.tensor([[0, 10 ** 6, -5, 2 ** 31 - 1]], dtype=torch.int32)
    kw = dict(k_qdq=recipe, v_qdq=recipe, p_qdq=recipe, num_kv_splits=2)
    out, lse = _decode(backend, q, cache, table, torch.tensor([16], dtype=torch.int32), **kw)
    ref, ref_lse = _decode("reference", q, cache, table, torch.tensor([16], dtype=torch.int32), **kw)
    assert rel_l2(out, ref) < 1e-5 and same_lse(lse, ref_lse, 1e-5)
    if recipe is None:
        first, first_lse = _decode("reference", q, cache, table[:, :1], torch.tensor([4], dtype=torch.int32), **kw)
        assert rel_l2(out, first) < 1e-5 and same_lse(lse, first_lse, 1e-5)


def test_decode_content_checks_still_refuse_what_metadata_mode_clamps():
    q, cache, storage = _decode_case()
    with pytest.raises(mla_core.MLAInputError, match="^b_seq_len: got a length 24"):
        _decode("reference", q, cache, storage[:1], torch.tensor([24], dtype=torch.int32))
    with pytest.raises(mla_core.MLAInputError, match="^b_seq_len: got a length 4294967301"):
        _decode("reference", q, cache, storage[:1], torch.tensor([2 ** 32 + 5]))


# ------------------------------------------------------------------------------------------------ prefill


def _prefill_case(dtype=torch.float32, seed=0):
    """q [7 of 9 rows], k / v [9 of 14 rows] views whose storage continues with NaN rows."""
    g = torch.Generator().manual_seed(seed)
    q_store = torch.randn(9, 2, 16, generator=g)
    k_store = torch.randn(14, 1, 16, generator=g)
    v_store = torch.randn(14, 1, 16, generator=g)
    q_store[7:] = NAN
    k_store[9:] = NAN
    v_store[9:] = NAN
    return [t.to(dtype) for t in (q_store, k_store, v_store)]


def _prefill(backend, q, k, v, cu_q, cu_k, max_q, **kw):
    return mla_core.mla_prefill(q, k, v, torch.tensor(cu_q), torch.tensor(cu_k), max_q, causal=True,
                                return_lse=True, backend=backend, block_n=16, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("recipe", [None, "nvfp4"])
def test_prefill_cu_seqlens_past_the_tensors_are_clamped(backend, recipe, metadata_checks):
    """The issue's case: ``k[:9]`` with ``cu_seqlens_k = [0, 4, 14]`` (triton read rows 9..13), and q's end
    past q too: the second sequence is the clamped one (4..9 keys, 3..7 queries)."""
    q_store, k_store, v_store = _prefill_case()
    q, k, v = q_store[:7], k_store[:9], v_store[:9]
    kw = dict.fromkeys(("q_quant", "k_quant", "p_quant", "v_quant"), recipe)
    out, lse = _prefill(backend, q, k, v, [0, 3, 7], [0, 4, 14], 4, **kw)
    ref, ref_lse = _prefill("reference", q, k, v, [0, 3, 7], [0, 4, 9], 4, **kw)
    assert rel_l2(out, ref) < 1e-5 and same_lse(lse, ref_lse, 1e-5)
    q5 = q_store[:5]  # q's end past q: rows 3..4 form the second sequence
    out, lse = _prefill(backend, q5, k, v, [0, 3, 7], [0, 4, 14], 4, **kw)
    ref, ref_lse = _prefill("reference", q5, k, v, [0, 3, 5], [0, 4, 9], 4, **kw)
    assert rel_l2(out, ref) < 1e-5 and same_lse(lse, ref_lse, 1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_negative_huge_and_decreasing_cu_seqlens(backend, metadata_checks):
    """int64 entries past int32 and below 0 are clamped; a decreasing entry gives an empty sequence. Rows
    two overlapping sequences cover are unspecified (docs/decisions.md): only the others are compared."""
    q_store, k_store, v_store = _prefill_case(seed=1)
    q, k, v = q_store[:7], k_store[:9], v_store[:9]
    cu_q = torch.tensor([0, 3, 2, 7], dtype=torch.int64)        # sequence 1 empty, 2 overlaps row 2
    cu_k = torch.tensor([-4, 4, 2 ** 40, 2 ** 33], dtype=torch.int64)
    out, lse = mla_core.mla_prefill(q, k, v, cu_q, cu_k, 9, causal=True, return_lse=True, backend=backend,
                                    block_n=16)
    # sequence 0: q rows 0..2 over keys 0..3; sequence 2: q rows 2..6 over no key (9..9)
    ref, ref_lse = _prefill("reference", q, k, v, [0, 3, 7], [0, 4, 4], 4)
    rows = [0, 1, 3, 4, 5, 6]
    assert not torch.isnan(out[rows]).any()
    assert rel_l2(out[rows], ref[rows]) < 1e-5 and same_lse(lse[:, rows], ref_lse[:, rows], 1e-5)
    assert (out[3:] == 0).all() and (lse[:, 3:] == -math.inf).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_max_seqlen_past_q_adds_nothing(backend, metadata_checks):
    """max_seqlen_q = 2**31 - 1 (the int32 limit) with 7 query rows: the grid stops at q's rows."""
    q_store, k_store, v_store = _prefill_case(seed=2)
    q, k, v = q_store[:7], k_store[:9], v_store[:9]
    out, lse = _prefill(backend, q, k, v, [0, 3, 7], [0, 4, 9], 2 ** 31 - 1)
    ref, ref_lse = _prefill("reference", q, k, v, [0, 3, 7], [0, 4, 9], 4)
    assert rel_l2(out, ref) < 1e-5 and same_lse(lse, ref_lse, 1e-5)


# ------------------------------------------------------------------------------------------------ merge


@pytest.mark.parametrize("backend", BACKENDS)
def test_merge_reads_plus_inf_lse_as_an_empty_state(backend):
    """An input LSE of +inf (FlashAttention / FlashMLA / vLLM's empty row) contributes nothing, like -inf:
    the merged row is the other state, or output 0 and LSE -inf when both are empty."""
    g = torch.Generator().manual_seed(3)
    pre, suf = torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)
    a, b = torch.randn(2, 4, generator=g), torch.randn(2, 4, generator=g)
    a[:, 0] = math.inf                                   # prefix empty (+inf)
    b[:, 1] = math.inf                                   # suffix empty (+inf)
    a[:, 2], b[:, 2] = math.inf, -math.inf               # both empty, either convention
    out, lse = mla_core.merge_attn_states(pre, a, suf, b, backend=backend)
    assert torch.equal(out[0], suf[0]) and torch.equal(lse[:, 0], b[:, 0])
    assert torch.equal(out[1], pre[1]) and torch.equal(lse[:, 1], a[:, 1])
    assert (out[2] == 0).all() and (lse[:, 2] == -math.inf).all()
    minus = torch.where(torch.isposinf(a), -math.inf, a), torch.where(torch.isposinf(b), -math.inf, b)
    ref, ref_lse = mla_core.merge_attn_states(pre, minus[0], suf, minus[1], backend=backend)
    assert torch.equal(out, ref) and torch.equal(lse, ref_lse)


# ------------------------------------------------------------------------------------------------ outputs


@pytest.mark.parametrize("backend", BACKENDS)
def test_new_outputs_are_contiguous_whatever_the_input_strides(backend):
    """The issue's case: merge returned strides (128, 1280, 1) for [10, 128]-token inputs; ``o.view(10, -1)``
    failed. Inputs here are permuted / sliced views (dense in the last dimension, as validation needs)."""
    g = torch.Generator().manual_seed(4)
    pre = torch.randn(8, 10, 16, generator=g).transpose(0, 1)          # [10, 8, 16], strides (16, 160, 1)
    suf = torch.randn(10, 8, 16, generator=g)
    a = torch.randn(8, 20, generator=g)[:, :10]                         # [8, 10] with row stride 20
    b = torch.randn(8, 10, generator=g)
    out, lse = mla_core.merge_attn_states(pre, a, suf, b, backend=backend)
    assert out.is_contiguous() and lse.is_contiguous()
    assert out.view(10, -1).shape == (10, 128)

    q_store, k_store, v_store = _prefill_case(seed=5)
    q = q_store[:7].transpose(0, 1).contiguous().transpose(0, 1)        # [7, 2, 16], strides (16, 112, 1)
    out, lse = _prefill(backend, q, k_store[:9], v_store[:9], [0, 3, 7], [0, 4, 9], 4)
    assert out.is_contiguous() and lse.is_contiguous()

    qd, cache, storage = _decode_case()
    qd = torch.randn(3, 1, 48, generator=g).transpose(0, 1)             # [1, 3, 48], strides (48, 48, 1)
    out, lse = _decode(backend, qd, cache, storage[:1], torch.tensor([9], dtype=torch.int32))
    assert out.is_contiguous() and lse.is_contiguous()


# ------------------------------------------------------------------------------------------------ torch defaults


def _all_ops(backend, device="cpu"):
    """(decode out, lse), (prefill out, lse), (merge out, lse) on fixed float32 inputs made on the CPU (with an
    explicit device, whatever the default) and moved to ``device``."""
    g = torch.Generator().manual_seed(6)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float32, device="cpu").to(device)

    def ints(values):
        return torch.tensor(values, dtype=torch.int32, device="cpu").to(device)

    q, cache = randn(2, 3, 48), randn(6, 4, 48)
    dec = _decode(backend, q, cache, ints([[0, 1, 2], [3, 4, 5]]), ints([9, 12]), num_kv_splits=2,
                  k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4")
    pre = mla_core.mla_prefill(randn(7, 2, 16), randn(9, 1, 16), randn(9, 1, 16), ints([0, 3, 7]), ints([0, 4, 9]), 4,
                               return_lse=True, backend=backend, block_n=16, v_quant="nvfp4")
    merged = mla_core.merge_attn_states(pre[0], pre[1], pre[0].flip(0).contiguous(), pre[1].flip(1).contiguous(),
                                        backend=backend)
    return dec, pre, merged


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_under_a_meta_default_device(backend, monkeypatch):
    """The CPU stand-in for torch.set_default_device("cuda"): any tensor an op makes without naming its device
    would land on the meta device (no data) and fail. Content checks on (the decode check's arange)."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "full")
    expected = _all_ops(backend)
    torch.set_default_device("meta")
    try:
        got = _all_ops(backend)
    finally:
        torch.set_default_device(None)
    for (o, l), (eo, el) in zip(got, expected):
        assert torch.equal(o, eo) and torch.equal(l, el)


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_op_under_a_bfloat16_default_dtype(backend):
    """Model loaders call torch.set_default_dtype(torch.bfloat16); the reference decode's scatter failed."""
    expected = _all_ops(backend)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        got = _all_ops(backend)
    finally:
        torch.set_default_dtype(previous)
    for (o, l), (eo, el) in zip(got, expected):
        assert o.dtype == torch.float32 and l.dtype == torch.float32
        assert torch.equal(o, eo) and torch.equal(l, el)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_every_op_under_a_cuda_default_device(backend, monkeypatch):
    """torch.set_default_device("cuda") (or ``with torch.device("cuda")``) with the checks on: the decode
    content check's arange used to land on the GPU beside the CPU copy of the lengths."""
    monkeypatch.setenv("MLA_CORE_CHECKS", "full")
    expected = _all_ops(backend, "cuda")
    torch.set_default_device("cuda")
    try:
        got = _all_ops(backend, "cuda")
        with torch.device("cuda"):
            got_ctx = _all_ops(backend, "cuda")
    finally:
        torch.set_default_device(None)
    for run in (got, got_ctx):
        for (o, l), (eo, el) in zip(run, expected):
            assert torch.equal(o, eo) and torch.equal(l, el)


# ------------------------------------------------------------------------------------------------ GPU memcheck

MEMCHECK_SCRIPT = r'''
import os
os.environ["MLA_CORE_CHECKS"] = "metadata"
import torch
import mla_core

dev = "cuda"
def randn(*shape):  # each tensor its own allocation of exactly its size (no caching allocator: see the env)
    return torch.randn(*shape, device=dev, dtype=torch.bfloat16)

for backend in ("triton", "reference"):
    # decode: a 1-row table whose length (24) is past its capacity (3 pages x 4 = 12); then page ids outside
    # the cache within the length and an int64 length past int32
    cache, q = randn(6, 4, 576), randn(1, 16, 576)
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32, device=dev)
    for lens, tab in ((torch.tensor([24], dtype=torch.int32, device=dev), table),
                      (torch.tensor([2 ** 32 + 5], device=dev),
                       torch.tensor([[0, 10 ** 6, -5, 2 ** 31 - 1]], dtype=torch.int32, device=dev))):
        for splits in (1, 4):
            out, lse = mla_core.mla_decode(q, cache, tab, lens, softmax_scale=0.04, num_kv_splits=splits,
                                           k_qdq="nvfp4", v_qdq="nvfp4", p_qdq="nvfp4", backend=backend)
            torch.cuda.synchronize()
            assert torch.isfinite(out.float()).all()
    # prefill: cu_seqlens ends past q and k / v, a negative start, a decreasing entry
    q, k, v = randn(5, 16, 192), randn(9, 16, 192), randn(9, 16, 128)
    for cu_q, cu_k in (([0, 3, 7], [0, 4, 14]), ([0, 3, 2, 7], [-4, 4, 2 ** 40, 2 ** 33])):
        for kw in ({}, dict(q_quant="nvfp4", k_quant="nvfp4", p_quant="nvfp4", v_quant="nvfp4")):
            mla_core.mla_prefill(q, k, v, torch.tensor(cu_q, device=dev), torch.tensor(cu_k, device=dev), 7,
                                 causal=True, return_lse=True, backend=backend, **kw)
            torch.cuda.synchronize()
print("memcheck script done")
'''


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_out_of_range_metadata_under_compute_sanitizer(tmp_path):
    """Decode and prefill (triton and reference) with lengths past the table, page ids outside the cache and
    cu_seqlens past the tensors, MLA_CORE_CHECKS=metadata, every tensor its own exact-size allocation: CUDA's
    compute-sanitizer memcheck reports 0 errors."""
    import shutil
    import subprocess
    import sys
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not os.path.exists(tool):
        pytest.skip("compute-sanitizer not found")
    script = tmp_path / "memcheck_bounds.py"
    script.write_text(MEMCHECK_SCRIPT)
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    r = subprocess.run([tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, str(script)],
                       capture_output=True, text=True, env=env, timeout=600)
    print(r.stdout[-3000:], r.stderr[-3000:])
    assert r.returncode == 0 and "memcheck script done" in r.stdout and "ERROR SUMMARY: 0 errors" in r.stdout
