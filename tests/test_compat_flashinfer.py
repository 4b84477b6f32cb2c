"""mla_core.compat.flashinfer: FlashInfer's names, signatures and defaults; MATE's behaviour in every checks mode."""
import importlib.util
import inspect
import math

import pytest
import torch

import mla_core
from mla_core.compat.flashinfer import decode, mla, rope
from musa_fp8_inputs import run_sparse, sparse_inputs
from test_reference_rope import make_inputs

_ = inspect.Parameter.empty
# Written down from FlashInfer's published API docs (docs.flashinfer.ai, flashinfer.rope.mla_rope_quantize_fp8).
FLASHINFER_ROPE = [("q_rope", _), ("k_rope", _), ("q_nope", _), ("k_nope", _), ("cos_sin_cache", _), ("pos_ids", _),
                   ("is_neox", True), ("quantize_dtype", None), ("quant_scale_q", 1.0), ("quant_scale_kv", 1.0),
                   ("q_rope_out", None), ("k_rope_out", None), ("q_nope_out", None), ("k_nope_out", None),
                   ("enable_pdl", False)]
# flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla as the docs publish it (re-exported by flashinfer.decode) ...
FLASHINFER_DECODE = [("query", _), ("kv_cache", _), ("workspace_buffer", _), ("qk_nope_head_dim", _),
                     ("kv_lora_rank", _), ("qk_rope_head_dim", _), ("block_tables", _), ("seq_lens", _),
                     ("max_seq_len", _), ("sparse_mla_top_k", 0), ("out", None), ("bmm1_scale", 1.0),
                     ("bmm2_scale", 1.0), ("sinks", None), ("skip_softmax_threshold_scale_factor", None),
                     ("enable_pdl", None), ("backend", "auto")]
# ... and the parameters newer releases (and MATE's wrapper of it) append, in their order.
FLASHINFER_DECODE_NEWER = [("is_var_seq", True), ("uses_shared_paged_kv_idx", True), ("lse", None),
                           ("return_lse", False), ("cute_dsl_impl", "auto"), ("kv_scale_format", "auto"),
                           ("cum_seq_lens_q", None), ("max_q_len", None), ("multi_ctas_kv_counter_buffer", None)]


def params(fn):
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


def test_signatures_match_flashinfer_published_ones():
    assert params(rope.mla_rope_quantize_fp8) == FLASHINFER_ROPE
    assert params(decode.trtllm_batch_decode_with_kv_cache_mla) == FLASHINFER_DECODE + FLASHINFER_DECODE_NEWER
    assert mla.trtllm_batch_decode_with_kv_cache_mla is decode.trtllm_batch_decode_with_kv_cache_mla
    # MATE's native interface (seed) has the same parameters plus its metadata
    assert params(mla_core.sparse_mla_fp8_decode)[:-1] == FLASHINFER_DECODE + FLASHINFER_DECODE_NEWER


@pytest.mark.skipif(importlib.util.find_spec("flashinfer") is None, reason="flashinfer is not installed here")
def test_signatures_match_installed_flashinfer():
    import flashinfer
    assert params(rope.mla_rope_quantize_fp8) == params(flashinfer.rope.mla_rope_quantize_fp8)
    theirs = params(flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla)
    ours = params(decode.trtllm_batch_decode_with_kv_cache_mla)
    n = min(len(theirs), len(ours))
    assert ours[:n] == theirs[:n]


def call_decode(case, **kw):
    return decode.trtllm_batch_decode_with_kv_cache_mla(case["query"], case["kv_cache"], None, 128, 512, 64,
                                                        case["indices"], case["seq_lens"], 4096,
                                                        sparse_mla_top_k=case["top_k"], **kw)


@pytest.mark.parametrize("checks", ["full", "metadata"])
@pytest.mark.parametrize("layout", ["fp8", "fp8_ds_mla"])
def test_index_past_cache_is_skipped_and_empty_rows_get_plus_inf(checks, layout, monkeypatch):
    """MATE's own tests: ``kv_len + 5`` among valid slots is skipped; an empty row's LSE is +inf."""
    monkeypatch.setenv("MLA_CORE_CHECKS", checks)
    case = sparse_inputs(3, 2, 4, 64, [64, 0, 20], layout=layout, seed=4)
    case["indices"][0, 0, 5] = case["rows"] + 5
    case["indices"][2, 1, :20] = -1  # an all -1 row
    lse_buf = torch.full((6, 4), float("nan"))
    out, lse = call_decode(case, bmm1_scale=0.05, lse=lse_buf, return_lse=True, backend="trtllm-gen")
    assert lse is lse_buf
    skipped = dict(case, indices=case["indices"].clone())
    skipped["indices"][0, 0, 5] = -1
    monkeypatch.setenv("MLA_CORE_CHECKS", "full")
    want_out, want_lse = run_sparse(skipped, "reference", return_lse=True, bmm1_scale=0.05)
    lse3 = lse.view(3, 2, 4)
    empty = want_lse == -math.inf
    assert empty[1].all() and empty[2, 1].all() and not empty[0].any()
    assert (lse3[empty] == math.inf).all() and (out[empty] == 0).all()
    assert torch.allclose(lse3[~empty], want_lse[~empty], rtol=1e-5, atol=1e-5)
    assert float((out.double() - want_out.double()).norm() / want_out.double().norm()) < 1e-2
    # the native API keeps -inf for the same rows, and refuses the index in full checks mode
    with pytest.raises(mla_core.MLAInputError, match="block_tables"):
        run_sparse(case, "auto", return_lse=True)


def test_swapping_the_import_serves_a_flashinfer_style_step():
    """One engine step written against flashinfer.rope / flashinfer.decode, with the import swapped."""
    q_rope, k_rope, q_nope, k_nope, cos_sin, pos = make_inputs(nnz=2, heads=4, seed=1)
    q_fp8 = torch.empty(2, 4, 576, dtype=torch.float8_e4m3fn)
    cache = torch.zeros(1, 64, 576, dtype=torch.float8_e4m3fn)
    rope.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, is_neox=False,
                               q_rope_out=q_fp8[..., 512:], k_rope_out=cache[0, :2, 512:], q_nope_out=q_fp8[..., :512],
                               k_nope_out=cache[0, :2, :512])
    indices = torch.full((2, 1, 64), -1, dtype=torch.int32)
    indices[0, 0, 0] = 0
    indices[1, 0, :2] = torch.tensor([0, 1])
    out = decode.trtllm_batch_decode_with_kv_cache_mla(q_fp8.view(2, 1, 4, 576), cache, None, 128, 512, 64, indices,
                                                       torch.tensor([1, 2], dtype=torch.int32), 64, 64,
                                                       bmm1_scale=576 ** -0.5)
    assert out.shape == (2, 1, 4, 512) and out.dtype == torch.bfloat16
    assert torch.equal(out[0, 0, 0].float(), cache[0, 0, :512].float().to(torch.bfloat16).float())  # one key: V


def test_dense_top_k_zero_takes_the_dense_path():
    """sparse_mla_top_k = 0 is FlashInfer's dense path (tests/test_kv_fp8.py): sparse-shaped arguments are refused there."""
    case = sparse_inputs(1, 1, 4, 64, [10])
    with pytest.raises(mla_core.MLAInputError, match="query: got dtype float8_e4m3fn"):
        decode.trtllm_batch_decode_with_kv_cache_mla(case["query"], case["kv_cache"], None, 128, 512, 64,
                                                     case["indices"], case["seq_lens"], 64)
