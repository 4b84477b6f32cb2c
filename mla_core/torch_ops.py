"""The public ops as ``torch.library`` custom ops, so ``torch.compile(fullgraph=True)`` traces around them.

Under ``torch.compile`` each public op in :mod:`mla_core.ops` calls ``torch.ops.mla_core.<op>`` instead of
running eagerly: the graph holds one opaque node per op whose fake (meta) implementation validates the
arguments' metadata and gives the output shapes; at run time the node runs the eager op (validation,
dispatch, kernel). Caller-owned output buffers are filled by a copy after the node, since a custom op
cannot return its inputs. Eager calls never pass through here (no extra cost on the hot path).
"""
from __future__ import annotations

from typing import Optional

import torch

from . import ops, specs

_EMPTY = (0,)


def _lse_or_empty(lse: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return lse if lse is not None else like.new_empty(_EMPTY, dtype=torch.float32)


@torch.library.custom_op("mla_core::decode", mutates_args=())
def decode(q: torch.Tensor, latent_cache: torch.Tensor, block_table: torch.Tensor, b_seq_len: torch.Tensor,
           softmax_scale: float, kv_lora_rank: int, qk_rope_head_dim: int, page_size: Optional[int],
           num_kv_splits: int,
           k_qdq: Optional[str], k_qdq_amax: Optional[float], v_qdq: Optional[str], v_qdq_amax: Optional[float],
           p_qdq: Optional[str], p_qdq_amax: float, return_lse: bool, out_dtype: Optional[torch.dtype],
           kv_scale: Optional[float], backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``mla_core.mla_decode``; ``num_kv_splits`` 0 means "auto"; lse is empty when not returned."""
    out, lse = ops.mla_attention_decode(
        q, latent_cache, block_table, b_seq_len, softmax_scale=softmax_scale, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim, page_size=page_size, num_kv_splits=num_kv_splits or specs.AUTO,
        k_qdq=k_qdq, k_qdq_amax=k_qdq_amax, v_qdq=v_qdq, v_qdq_amax=v_qdq_amax, p_qdq=p_qdq, p_qdq_amax=p_qdq_amax,
        return_lse=return_lse, out_dtype=out_dtype, kv_scale=kv_scale, backend=backend)
    return out, _lse_or_empty(lse, q)


@decode.register_fake
def _decode_fake(q, latent_cache, block_table, b_seq_len, softmax_scale, kv_lora_rank, qk_rope_head_dim, page_size,
                 num_kv_splits, k_qdq, k_qdq_amax, v_qdq, v_qdq_amax, p_qdq, p_qdq_amax, return_lse, out_dtype, kv_scale,
                 backend):
    _, call = specs.validate_decode(
        q, latent_cache, block_table, b_seq_len, softmax_scale=softmax_scale, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim, page_size=page_size, num_kv_splits=num_kv_splits or specs.AUTO, k_qdq=k_qdq,
        k_qdq_amax=k_qdq_amax, v_qdq=v_qdq, v_qdq_amax=v_qdq_amax, p_qdq=p_qdq, p_qdq_amax=p_qdq_amax,
        return_lse=return_lse, out_dtype=out_dtype, kv_scale=kv_scale)
    batch, heads = q.shape[0], q.shape[1]
    out = q.new_empty((batch, heads, kv_lora_rank), dtype=call.out_dtype)
    return out, q.new_empty((batch, heads) if return_lse else _EMPTY, dtype=torch.float32)


@torch.library.custom_op("mla_core::prefill", mutates_args=())
def prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor,
            max_seqlen_q: int, softmax_scale: Optional[float], causal: bool, return_lse: bool, q_quant: Optional[str],
            k_quant: Optional[str], p_quant: Optional[str], v_quant: Optional[str], q_amax: Optional[float],
            k_amax: Optional[float], p_amax: float, v_amax: Optional[float], sparsity_n: int, sparsity_m: int,
            dense_sink_tokens: int, dense_recent_tokens: int, block_m: int, block_n: int,
            backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``mla_core.mla_prefill`` returning ``(out, lse)``; lse is empty when not returned."""
    result = ops.mla_prefill_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse, q_quant=q_quant,
        k_quant=k_quant, p_quant=p_quant, v_quant=v_quant, q_amax=q_amax, k_amax=k_amax, p_amax=p_amax,
        v_amax=v_amax, sparsity_n=sparsity_n, sparsity_m=sparsity_m, dense_sink_tokens=dense_sink_tokens,
        dense_recent_tokens=dense_recent_tokens, block_m=block_m, block_n=block_n, backend=backend)
    out, lse = result if return_lse else (result, None)
    return out, _lse_or_empty(lse, q)


@prefill.register_fake
def _prefill_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse, q_quant,
                  k_quant, p_quant, v_quant, q_amax, k_amax, p_amax, v_amax, sparsity_n, sparsity_m, dense_sink_tokens,
                  dense_recent_tokens, block_m, block_n, backend):
    specs.validate_prefill(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse,
                           q_quant=q_quant, k_quant=k_quant, p_quant=p_quant, v_quant=v_quant, q_amax=q_amax,
                           k_amax=k_amax, p_amax=p_amax, v_amax=v_amax, sparsity_n=sparsity_n, sparsity_m=sparsity_m,
                           dense_sink_tokens=dense_sink_tokens, dense_recent_tokens=dense_recent_tokens,
                           block_m=block_m, block_n=block_n)
    out = v.new_empty((q.shape[0], q.shape[1], v.shape[2]))
    return out, q.new_empty((q.shape[1], q.shape[0]) if return_lse else _EMPTY, dtype=torch.float32)


@torch.library.custom_op("mla_core::merge_attn_states", mutates_args=())
def merge_attn_states(prefix_output: torch.Tensor, prefix_lse: torch.Tensor, suffix_output: torch.Tensor,
                      suffix_lse: torch.Tensor, backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``mla_core.merge_attn_states`` into new tensors."""
    return ops.merge_attn_states(prefix_output, prefix_lse, suffix_output, suffix_lse, backend=backend)


@merge_attn_states.register_fake
def _merge_fake(prefix_output, prefix_lse, suffix_output, suffix_lse, backend):
    specs.validate_merge(prefix_output, prefix_lse, suffix_output, suffix_lse, None, None)
    # contiguous, as every backend returns them (empty_like would keep a permuted input's strides)
    return (prefix_output.new_empty(prefix_output.shape),
            prefix_lse.new_empty(prefix_lse.shape, dtype=torch.float32))


@torch.library.custom_op("mla_core::rope_quantize_fp8", mutates_args=())
def rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: torch.Tensor, k_nope: torch.Tensor,
                      cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor, is_neox: bool, quant_scale_q: float,
                      quant_scale_kv: float, backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                             torch.Tensor]:
    """``mla_core.mla_rope_quantize_fp8`` into new FP8 tensors."""
    return tuple(ops.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                                           quant_scale_q=quant_scale_q, quant_scale_kv=quant_scale_kv, backend=backend))


@rope_quantize_fp8.register_fake
def _rope_fake(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quant_scale_q, quant_scale_kv, backend):
    specs.validate_rope_quantize(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, None, quant_scale_q,
                                 quant_scale_kv, None, None, None, None)
    return tuple(torch.empty_like(t, dtype=specs.FP8) for t in (q_rope, k_rope, q_nope, k_nope))


@torch.library.custom_op("mla_core::sparse_mla_fp8_decode", mutates_args=())
def sparse_decode(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: Optional[torch.Tensor], sparse_mla_top_k: int, bmm1_scale: float, bmm2_scale: float,
                  backend: Optional[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``mla_core.sparse_mla_fp8_decode`` returning new ``(out, lse [batch, q_len, heads])``."""
    return ops.sparse_mla_fp8_decode(query, kv_cache, None, 0, specs.SPARSE_LATENT, specs.SPARSE_ROPE, block_tables,
                                     seq_lens, 0, sparse_mla_top_k, bmm1_scale=bmm1_scale, bmm2_scale=bmm2_scale,
                                     backend=backend or "auto", return_lse=True)


@sparse_decode.register_fake
def _sparse_fake(query, kv_cache, block_tables, seq_lens, sparse_mla_top_k, bmm1_scale, bmm2_scale, backend):
    specs.validate_sparse_decode(query, kv_cache, 0, specs.SPARSE_LATENT, specs.SPARSE_ROPE, block_tables, seq_lens,
                                 sparse_mla_top_k, None, bmm1_scale, bmm2_scale, None, True, None)
    batch, q_len, heads = query.shape[:3]
    return (query.new_empty((batch, q_len, heads, specs.SPARSE_LATENT), dtype=torch.bfloat16),
            query.new_empty((batch, q_len, heads), dtype=torch.float32))


@torch.library.custom_op("mla_core::mla_forward", mutates_args=("latent_cache",))
def mla_forward(q: torch.Tensor, kv: torch.Tensor, input_row_offsets: torch.Tensor, freqs_cis: torch.Tensor,
                kv_norm_gamma: torch.Tensor, latent_cache: torch.Tensor, block_table: torch.Tensor,
                cache_offsets: torch.Tensor, max_seq_len: int, w_k: torch.Tensor, w_k_scale: Optional[torch.Tensor],
                w_uk: torch.Tensor, w_uk_scale: Optional[torch.Tensor], w_uv: torch.Tensor,
                w_uv_scale: Optional[torch.Tensor], weight_block_size: list[int], softmax_scale: float, epsilon: float,
                attn_sinks: Optional[torch.Tensor], rope_interleave: bool, sparse_indices: Optional[torch.Tensor],
                topk_lengths: Optional[torch.Tensor], attention_backend: Optional[str],
                backend: Optional[str]) -> torch.Tensor:
    """``mla_core.mla_forward``: writes the new rows into ``latent_cache`` and returns a new output."""
    from . import layer
    return layer.mla_forward(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table,
                             cache_offsets, max_seq_len=max_seq_len, w_k=w_k, w_uk=w_uk, w_uv=w_uv,
                             softmax_scale=softmax_scale, epsilon=epsilon, w_k_scale=w_k_scale, w_uk_scale=w_uk_scale,
                             w_uv_scale=w_uv_scale, weight_block_size=tuple(weight_block_size), attn_sinks=attn_sinks,
                             rope_interleave=rope_interleave, sparse_indices=sparse_indices,
                             topk_lengths=topk_lengths, attention_backend=attention_backend, backend=backend)


@mla_forward.register_fake
def _mla_forward_fake(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
                      max_seq_len, w_k, w_k_scale, w_uk, w_uk_scale, w_uv, w_uv_scale, weight_block_size, softmax_scale,
                      epsilon, attn_sinks, rope_interleave, sparse_indices, topk_lengths, attention_backend, backend):
    from . import layer
    _, call = layer.validate_layer(
        q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
        max_seq_len=max_seq_len, w_k=w_k, w_uk=w_uk, w_uv=w_uv, softmax_scale=softmax_scale, epsilon=epsilon,
        w_k_scale=w_k_scale, w_uk_scale=w_uk_scale, w_uv_scale=w_uv_scale, weight_block_size=tuple(weight_block_size),
        attn_sinks=attn_sinks, rope_interleave=rope_interleave, attention_backend=attention_backend,
        sparse_indices=sparse_indices, topk_lengths=topk_lengths)
    return q.new_empty((q.shape[0], call.heads, call.v_dim))
