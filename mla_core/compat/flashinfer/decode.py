"""``flashinfer.decode.trtllm_batch_decode_with_kv_cache_mla`` on mla_core: the FP8 top-k sparse path.

Same parameter names, order and defaults as FlashInfer's (``sparse_mla_top_k > 0``; the dense path,
``sparse_mla_top_k = 0``, is :func:`mla_core.mla_decode`). MATE's semantics in every ``MLA_CORE_CHECKS``
mode: an index past the cache among the valid slots is skipped; a row with no valid key gets output 0 and
LSE +inf. Eager calls and CUDA-graph capture (with ``MLA_CORE_CHECKS=metadata``); under ``torch.compile`` use
:func:`mla_core.sparse_mla_fp8_decode`.
"""
from __future__ import annotations

from typing import List, Optional, Union

import torch

from ... import dispatch, specs
from ...errors import MLAInputError
from ...ops import FLASHINFER_BACKEND_NAMES


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
    """FP8 DeepSeek-V3.2 sparse MLA decode.

    Args:
        query: [batch, q_len, heads, 576]: FP8 E4M3 with 576-byte FP8 cache rows, bf16 with 656-byte
            fp8_ds_mla rows.
        kv_cache: [pages, page_size, 576 | 656] or [pages, 1, page_size, 576 | 656] (the last dimension
            names the layout: docs/sparse.md).
        block_tables: [batch, q_len, sparse_mla_top_k] int32 physical token rows, -1 = none; a row past
            the cache is skipped.
        seq_lens: [batch] int32 valid slots per request (None: every slot).
        sparse_mla_top_k: a positive multiple of 64.
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
    if isinstance(sparse_mla_top_k, int) and not isinstance(sparse_mla_top_k, bool) and sparse_mla_top_k == 0:
        raise MLAInputError("sparse_mla_top_k: got 0 (dense MLA), needs a positive multiple of 64: this surface "
                            "serves FlashInfer's sparse path; dense decode is mla_core.mla_decode")
    problem, call = specs.validate_sparse_decode(query, kv_cache, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                                                 block_tables, seq_lens, sparse_mla_top_k, out, bmm1_scale,
                                                 bmm2_scale, lse, return_lse, None, check_indices=False)
    name = None if backend is None or backend in FLASHINFER_BACKEND_NAMES else backend
    choice = dispatch.choose(problem, name)
    out_t, lse_t = choice.backend.run(problem, call, choice.config)
    lse_t.masked_fill_(lse_t == float("-inf"), float("inf"))  # empty rows: FlashMLA's / FlashInfer's +inf
    if lse is not None:
        lse_t = lse
    return (out_t, lse_t) if return_lse else out_t
