"""``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla`` on mla_core: the FP8 top-k sparse path, and the
dense path over a bf16 or FP8 paged cache.

Same parameter names, order and defaults as FlashInfer's. ``sparse_mla_top_k > 0``: MATE's semantics in every
``MLA_CORE_CHECKS`` mode: an index past the cache among the valid slots is skipped; a row with no valid key gets
output 0 and LSE +inf. ``sparse_mla_top_k = 0`` (dense, one query token per request): :func:`mla_core.mla_decode`
with ``scores = q·k * bmm1_scale`` and ``out = softmax · V * bmm2_scale`` over the cache as stored (an FP8 cache's
codes), i.e. ``kv_scale = bmm2_scale`` and ``softmax_scale = bmm1_scale / bmm2_scale`` for an FP8 cache. Eager
calls and CUDA-graph capture (with ``MLA_CORE_CHECKS=metadata``); under ``torch.compile`` use
:func:`mla_core.sparse_mla_fp8_decode` / :func:`mla_core.mla_decode`.
"""
from __future__ import annotations

from typing import List, Optional, Union

import torch

from ... import dispatch, specs
from ...errors import MLAInputError
from ...ops import FLASHINFER_BACKEND_NAMES, mla_attention_decode


def trtllm_batch_decode_with_kv_cache_mla(
        query: torch.Tensor, kv_cache: torch.Tensor, workspace_buffer: torch.Tensor, qk_nope_head_dim: int,
        kv_lora_rank: int, qk_rope_head_dim: int, block_tables: torch.Tensor, seq_lens: Optional[torch.Tensor],
        max_seq_len: int, sparse_mla_top_k: int = 0, out: Optional[torch.Tensor] = None,
        bmm1_scale: Union[float, torch.Tensor] = 1.0, bmm2_scale: Union[float, torch.Tensor] = 1.0,
        sinks: Optional[List[torch.Tensor]] = None, skip_softmax_threshold_scale_factor: Optional[float] = None,
        enable_pdl: Optional[bool] = None, backend: str = "auto", is_var_seq: bool = True,
        uses_shared_paged_kv_idx: bool = True, lse: Optional[torch.Tensor] = None, return_lse: bool = False,
        cute_dsl_impl: str = "auto", kv_scale_format: str = "auto", cum_seq_lens_q: Optional[torch.Tensor] = None,
        max_q_len: Optional[int] = None, multi_ctas_kv_counter_buffer: Optional[torch.Tensor] = None):
    """FP8 DeepSeek-V3.2 sparse MLA decode (``sparse_mla_top_k > 0``), or dense MLA decode (``sparse_mla_top_k = 0``).

    Args:
        query: [batch, q_len, heads, 576]: FP8 E4M3 with 576-byte FP8 cache rows, bf16 with 656-byte
            fp8_ds_mla rows.
        kv_cache: [pages, page_size, 576 | 656] or [pages, 1, page_size, 576 | 656] (the last dimension
            names the layout: docs/sparse.md).
        block_tables: [batch, q_len, sparse_mla_top_k] int32 physical token rows, -1 = none; a row past
            the cache is skipped.
        seq_lens: [batch] int32 valid slots per request (None: every slot).
        sparse_mla_top_k: a positive multiple of 64, or 0 for the dense path: query [batch, 1, heads, 576] bf16 /
            fp16, kv_cache bf16 / fp16 or float8_e4m3fn (codes; ``bmm2_scale`` is their scale), block_tables
            [batch, max_pages] int32 page indices, seq_lens [batch] KV lengths, bmm1_scale / bmm2_scale positive.
        out, lse, return_lse, bmm1_scale, bmm2_scale: as :func:`mla_core.sparse_mla_fp8_decode`.
        workspace_buffer, qk_nope_head_dim, max_seq_len, sinks, skip_softmax_threshold_scale_factor,
            enable_pdl, is_var_seq, uses_shared_paged_kv_idx, cute_dsl_impl, kv_scale_format,
            cum_seq_lens_q, max_q_len, multi_ctas_kv_counter_buffer: accepted and ignored (as MATE does).
        backend: FlashInfer's names ("auto", "trtllm-gen", "xqa", ...) mean automatic dispatch; an mla_core
            backend name forces that backend.

    Returns:
        out [batch, q_len, heads, 512] bf16, or ``(out, lse)`` with ``return_lse`` (LSE natural log, +inf for
        a row with no valid key, in the layout of the given ``lse`` buffer, else [batch, q_len, heads]).
    """
    name = None if backend is None or backend in FLASHINFER_BACKEND_NAMES else backend
    if isinstance(sparse_mla_top_k, int) and not isinstance(sparse_mla_top_k, bool) and sparse_mla_top_k == 0:
        return _dense(query, kv_cache, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens, out, bmm1_scale,
                      bmm2_scale, lse, return_lse, name)
    problem, call = specs.validate_sparse_decode(query, kv_cache, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                                                 block_tables, seq_lens, sparse_mla_top_k, out, bmm1_scale,
                                                 bmm2_scale, lse, return_lse, None, check_indices=False)
    choice = dispatch.choose(problem, name)
    out_t, lse_t = choice.backend.run(problem, call, choice.config)
    lse_t.masked_fill_(lse_t == float("-inf"), float("inf"))  # empty rows: FlashMLA's / FlashInfer's +inf
    if lse is not None:
        lse_t = lse
    return (out_t, lse_t) if return_lse else out_t


_DENSE_NAMES = {"q": "query", "latent_cache": "kv_cache", "block_table": "block_tables", "b_seq_len": "seq_lens"}
"""mla_decode's argument names -> this surface's."""


def _dense(query, kv_cache, kv_lora_rank, qk_rope_head_dim, block_tables, seq_lens, out, bmm1_scale, bmm2_scale,
           lse, return_lse, backend):
    """The dense path on :func:`mla_core.mla_decode`; returns like the sparse path (LSE +inf for an empty row)."""
    specs.check_tensor("query", query, 4)
    if query.shape[1] != 1:
        raise MLAInputError(f"query: got q_len {query.shape[1]} (shape {list(query.shape)}), needs 1 on the dense "
                            "path (sparse_mla_top_k = 0): one query token per request")
    cache = specs.check_tensor("kv_cache", kv_cache, (3, 4))
    if cache.dim() == 4:
        specs.check_shape("kv_cache", cache, (None, 1, None, None))
        cache = cache.squeeze(1)
    b1 = specs.check_positive_float("bmm1_scale", specs._host_scalar("bmm1_scale", bmm1_scale))
    b2 = specs.check_positive_float("bmm2_scale", specs._host_scalar("bmm2_scale", bmm2_scale))
    fp8 = cache.dtype == specs.FP8
    try:
        o, lse_new = mla_attention_decode(
            query[:, 0], cache, block_tables, seq_lens, softmax_scale=b1 / b2 if fp8 else b1,
            kv_lora_rank=kv_lora_rank, qk_rope_head_dim=qk_rope_head_dim, kv_scale=b2 if fp8 else None,
            return_lse=True, out_dtype=torch.bfloat16 if fp8 or b2 == 1.0 else torch.float32, backend=backend)
    except MLAInputError as exc:  # name the argument as this surface calls it
        name, colon, rest = str(exc).partition(":")
        raise MLAInputError(_DENSE_NAMES.get(name, name) + colon + rest) from None
    o = (o if fp8 or b2 == 1.0 else o * b2).to(torch.bfloat16).unsqueeze(1)  # [batch, 1, heads, kv_lora_rank]
    lse_new = lse_new.masked_fill(lse_new == float("-inf"), float("inf")).unsqueeze(1)
    if out is not None:
        out.copy_(o.view(out.shape))
        o = out
    if lse is not None:
        lse.copy_(lse_new.view(lse.shape))
        lse_new = lse
    return (o, lse_new) if return_lse else o
