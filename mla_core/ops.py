"""mla_core's public operations: validate, dispatch, run.

Each op validates its arguments (:mod:`mla_core.specs`), reduces them to a
:class:`~mla_core.problem.Problem`, asks :mod:`mla_core.dispatch` for a ``(backend, config)`` and runs
it. ``backend=`` (keyword-only) forces a backend by name for one call.
"""
from __future__ import annotations

import torch

from . import dispatch, specs
from .specs import SparseDecodeMetadata


def _run(problem, call, backend):
    choice = dispatch.choose(problem, backend)
    return choice.backend.run(problem, call, choice.config)


def _compiling() -> bool:
    """Inside torch.compile tracing: ops go through their ``torch.ops.mla_core`` custom op (mla_core.torch_ops)."""
    return torch.compiler.is_compiling()


def _fill(buffer, value):
    """Copy a custom op's new output into a caller's buffer (a custom op cannot return its inputs)."""
    if buffer is None:
        return value
    buffer.copy_(value.view(buffer.shape))
    return buffer


def mla_attention_decode(q, latent_cache, block_table, b_seq_len, *, softmax_scale, kv_lora_rank=512,
                         qk_rope_head_dim=64, page_size=None, num_kv_splits=32, k_qdq=None, k_qdq_amax=None,
                         v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                         kv_scale=None, backend: str | None = None):
    """Decode one absorbed query token per request over a paged latent cache.

    The cache holds raw values; each product operand is fake-quantized once, on read, along its own
    contraction axis: K (all ``kv_lora_rank + qk_rope_head_dim`` features) along features, V (the first
    ``kv_lora_rank`` features) along tokens in blocks of 16 at absolute positions, P per 32-key tile
    after the row sum. Splits are tile-aligned and merged by log-sum-exp (docs/numerics.md).

    Args:
        q: [batch, heads, kv_lora_rank + qk_rope_head_dim] absorbed query, latent_cache's dtype, or
            float32 as the carrier of a caller-quantized Q; bf16 / fp16 over an FP8 cache.
        latent_cache: [num_pages, page_size, kv_lora_rank + qk_rope_head_dim] bf16 / fp16 / fp32, or
            float8_e4m3fn codes with ``kv_scale`` (the FP8 KV cache: half the bytes of bf16).
        block_table: [batch, max_pages] int32/int64 page indices; entries past ``ceil(len / page_size)`` are never read.
        b_seq_len: [batch] int32/int64 KV lengths, 0..max_pages * page_size (0 gives output 0 and LSE -inf).
        softmax_scale: scale of ``q·k`` before the softmax (required).
        kv_lora_rank, qk_rope_head_dim: latent (V / output) width and RoPE width.
        page_size: tokens per page (default and only accepted value: ``latent_cache.shape[1]``).
        num_kv_splits: 1..128 (default 32), or ``"auto"`` to let the tuner / GPU size choose. With
            ``p_qdq`` set, the split count changes results. Each split writes a float32 partial row per head
            (batch * heads * splits * 513 * 4 bytes, ~1.1 GB at batch 128, 128 heads, 32 splits), so at large
            batch and short lengths a fixed 32 costs more than the attention itself: prefer ``"auto"`` there.
        k_qdq, v_qdq, p_qdq: None, ``"fp8"`` or ``"nvfp4"``; ``*_amax``: per-tensor amax (None -> scale 1.0;
            ``p_qdq_amax`` default 1.0, the bound of unnormalized P).
        return_lse: also return the natural-log LSE.
        out_dtype: output dtype (default ``latent_cache.dtype``; q's dtype over an FP8 cache).
        kv_scale: per-tensor scale of a float8_e4m3fn cache, a positive python float (required with it, None
            otherwise): the cache holds ``float32(code) * kv_scale`` (docs/numerics.md, "FP8 KV cache").
        backend: mla_core backend name for this call (None: automatic).

    Returns:
        ``(out [batch, heads, kv_lora_rank] out_dtype, lse [batch, heads] float32 or None)``.
    """
    if _compiling():
        out, lse = torch.ops.mla_core.decode(
            q, latent_cache, block_table, b_seq_len, softmax_scale, kv_lora_rank, qk_rope_head_dim, page_size,
            0 if num_kv_splits == specs.AUTO else num_kv_splits, k_qdq, k_qdq_amax, v_qdq, v_qdq_amax, p_qdq,
            p_qdq_amax, return_lse, out_dtype, kv_scale, backend)
        return out, (lse if return_lse else None)
    problem, call = specs.validate_decode(
        q, latent_cache, block_table, b_seq_len, softmax_scale=softmax_scale, kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim, page_size=page_size, num_kv_splits=num_kv_splits, k_qdq=k_qdq,
        k_qdq_amax=k_qdq_amax, v_qdq=v_qdq, v_qdq_amax=v_qdq_amax, p_qdq=p_qdq, p_qdq_amax=p_qdq_amax,
        return_lse=return_lse, out_dtype=out_dtype, kv_scale=kv_scale)
    return _run(problem, call, backend)


def mla_prefill_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale=None, causal=True,
                          return_lse=False, *, q_quant=None, k_quant=None, p_quant=None, v_quant=None, q_amax=None,
                          k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
                          dense_recent_tokens=64, block_m=64, block_n=64, backend: str | None = None):
    """Varlen MLA prefill attention with fused Q/K/P/V fake quantization.

    Args:
        q: [total_q, heads, qk_dim] packed queries (bf16 / fp16 / fp32).
        k: [total_k, kv_heads, qk_dim] packed keys (NOPE ++ RoPE); ``heads % kv_heads == 0`` (GQA / MQA).
        v: [total_k, kv_heads, v_dim] packed values.
        cu_seqlens_q, cu_seqlens_k: [batch + 1] int32/int64 cumulative lengths (an empty sequence is allowed).
        max_seqlen_q: longest query sequence (grid sizing).
        softmax_scale: default ``qk_dim ** -0.5``.
        causal: queries are the suffix of their KV span (query i sees keys ``j <= i + len_k - len_q``);
            cached-context chunks use ``causal=False``.
        return_lse: also return the natural-log LSE [heads, total_q] (the layout merge_attn_states takes).
        q_quant, k_quant: None / ``"fp8"`` / ``"nvfp4"`` (NVFP4 blocks along features).
        p_quant, v_quant: same formats; NVFP4 blocks along keys, at absolute key positions.
        q_amax, k_amax, v_amax: per-tensor amax (None -> scale 1.0); p_amax default 1.0.
        sparsity_n, sparsity_m: N:M score sparsity along keys (n = 0: off; m 4 or 8), applied after the
            causal mask; ``dense_sink_tokens`` leading keys and ``dense_recent_tokens`` keys behind each
            query stay dense, and so does every score of a sequence whose query length is 1.
        block_m: query tile (speed only). block_n: key tile, which is also the P tile of the numerics.
        backend: mla_core backend name for this call (None: automatic).

    Returns:
        out [total_q, heads, v_dim] in v.dtype; with ``return_lse`` the tuple ``(out, lse [heads, total_q] float32)``.
    """
    if _compiling():
        out, lse = torch.ops.mla_core.prefill(
            q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse, q_quant, k_quant,
            p_quant, v_quant, q_amax, k_amax, p_amax, v_amax, sparsity_n, sparsity_m, dense_sink_tokens,
            dense_recent_tokens, block_m, block_n, backend)
        return (out, lse) if return_lse else out
    problem, call = specs.validate_prefill(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, softmax_scale, causal, return_lse, q_quant=q_quant,
        k_quant=k_quant, p_quant=p_quant, v_quant=v_quant, q_amax=q_amax, k_amax=k_amax, p_amax=p_amax,
        v_amax=v_amax, sparsity_n=sparsity_n, sparsity_m=sparsity_m, dense_sink_tokens=dense_sink_tokens,
        dense_recent_tokens=dense_recent_tokens, block_m=block_m, block_n=block_n)
    out, lse = _run(problem, call, backend)
    return (out, lse) if return_lse else out


def merge_attn_states(prefix_output, prefix_lse, suffix_output, suffix_lse, output=None, output_lse=None, *,
                      backend: str | None = None):
    """Merge two partial attention results over disjoint key sets by their log-sum-exp.

    ``lse = log(exp(prefix_lse) + exp(suffix_lse))``; ``output = exp(prefix_lse - lse) * prefix_output +
    exp(suffix_lse - lse) * suffix_output``. Rows where both LSEs are -inf give output 0 and LSE -inf.

    Args:
        prefix_output, suffix_output: [tokens, heads, dim] (same dtype).
        prefix_lse, suffix_lse: [heads, tokens] float32, natural log (as mla_prefill returns it).
        output: optional [tokens, heads, dim] buffer to write (default: new, prefix_output's dtype).
        output_lse: optional [heads, tokens] float32 buffer to write.
        backend: mla_core backend name for this call (None: automatic).

    Returns:
        ``(output, output_lse)``.
    """
    if _compiling():
        out, lse = torch.ops.mla_core.merge_attn_states(prefix_output, prefix_lse, suffix_output, suffix_lse, backend)
        return _fill(output, out), _fill(output_lse, lse)
    problem, call = specs.validate_merge(prefix_output, prefix_lse, suffix_output, suffix_lse, output, output_lse)
    return _run(problem, call, backend)


def mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox=True, quantize_dtype=None,
                          quant_scale_q=1.0, quant_scale_kv=1.0, q_rope_out=None, k_rope_out=None, q_nope_out=None,
                          k_nope_out=None, enable_pdl=False, *, backend: str | None = None):
    """Apply RoPE to the rope parts of Q and K and quantize all four parts to FP8 E4M3.

    The rotation runs in float32 with ``cos = cos_sin_cache[pos, :rope/2]``, ``sin = cos_sin_cache[pos, rope/2:]``.
    ``is_neox=True`` rotates the two contiguous halves ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``;
    False rotates adjacent even/odd pairs the same way. Then ``out = e4m3(clamp(x * quant_scale, ±448))``
    (round to nearest even, saturating), with ``quant_scale_q`` for Q parts and ``quant_scale_kv`` for K parts.

    Args:
        q_rope: [nnz, heads, rope] bf16/fp16; k_rope: [nnz, rope]; q_nope: [nnz, heads, nope]; k_nope: [nnz, nope].
        cos_sin_cache: [max_pos, rope] float32 or bf16, contiguous.
        pos_ids: [nnz] int32/int64, each in 0..max_pos-1.
        quantize_dtype: only torch.float8_e4m3fn (None: from the first output buffer, else float8_e4m3fn).
        quant_scale_q, quant_scale_kv: finite positive multipliers applied before the cast.
        q_rope_out, k_rope_out, q_nope_out, k_nope_out: optional FP8 buffers (strided leading dims allowed).
        enable_pdl: accepted for FlashInfer compatibility and ignored.
        backend: mla_core backend name for this call (None: automatic).

    Returns:
        ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``; given buffers are returned as they are.
    """
    if _compiling():
        outs = torch.ops.mla_core.rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                                                    quant_scale_q, quant_scale_kv, backend)
        return tuple(_fill(buf, o) for buf, o in zip((q_rope_out, k_rope_out, q_nope_out, k_nope_out), outs))
    problem, call = specs.validate_rope_quantize(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox,
                                                 quantize_dtype, quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out,
                                                 q_nope_out, k_nope_out)
    return _run(problem, call, backend)


FLASHINFER_BACKEND_NAMES = frozenset({"auto", "trtllm-gen", "xqa", "cute-dsl", "cutlass", "fa2", "fa3", "cudnn"})
"""FlashInfer's backend names, which ``sparse_mla_fp8_decode`` treats as ``"auto"`` (automatic dispatch)."""


def get_sparse_decode_metadata(query, seq_lens, sparse_mla_top_k) -> SparseDecodeMetadata:
    """Prepare reusable metadata for :func:`sparse_mla_fp8_decode` (FlashInfer/MATE ``get_batch_decode_metadata_mla``).

    Args:
        query: [batch, q_len, heads, 576] FP8 E4M3 or bf16 (only its shape and device are used).
        seq_lens: [batch] int32 valid sparse lengths (0..top_k), or None when every index slot is valid.
        sparse_mla_top_k: index capacity, a positive multiple of 64.

    Returns:
        A :class:`~mla_core.specs.SparseDecodeMetadata`; reuse it while seq_lens, the query shape and top-k stay the same.
    """
    return specs.validate_sparse_metadata(query, seq_lens, sparse_mla_top_k)


get_batch_decode_metadata_mla = get_sparse_decode_metadata


def sparse_mla_fp8_decode(query, kv_cache, workspace_buffer, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                          block_tables, seq_lens, max_seq_len, sparse_mla_top_k=0, out=None, bmm1_scale=1.0,
                          bmm2_scale=1.0, sinks=None, skip_softmax_threshold_scale_factor=None, enable_pdl=None,
                          backend="auto", is_var_seq=True, uses_shared_paged_kv_idx=True, lse=None, return_lse=False,
                          cute_dsl_impl="auto", kv_scale_format="auto", cum_seq_lens_q=None, max_q_len=None,
                          multi_ctas_kv_counter_buffer=None, metadata=None):
    """FP8 DeepSeek-V3.2 top-k sparse MLA decode (MATE / FlashInfer signature).

    ``scores = (q · k) * bmm1_scale`` over the selected cache rows (q, k: the 576 FP8 values),
    ``out = softmax(scores) · V * bmm2_scale`` with V the first 512 values of each selected row; the
    softmax is exact (float32). Index slots past ``seq_lens[b]`` and slots holding -1 are never read; a
    query row with no valid slot gives output 0 and LSE -inf.

    Args:
        query: [batch, q_len, heads, 576] contiguous: FP8 E4M3 with 576-wide cache rows, bf16 with 656-byte rows.
        kv_cache: [pages, page_size, W] or [pages, 1, page_size, W], contiguous; the last dimension names the
            layout (docs/sparse.md): W = 576, FP8 E4M3 values (MATE); W = 656, fp8_ds_mla rows (FlashMLA /
            vLLM: 512 E4M3 codes, 4 float32 scales per 128 values, 64 bf16 RoPE values), uint8 or FP8 typed.
        workspace_buffer, qk_nope_head_dim, max_seq_len, sinks, skip_softmax_threshold_scale_factor,
            enable_pdl, is_var_seq, uses_shared_paged_kv_idx, cute_dsl_impl, kv_scale_format,
            cum_seq_lens_q, max_q_len, multi_ctas_kv_counter_buffer: accepted for FlashInfer
            compatibility and ignored.
        kv_lora_rank, qk_rope_head_dim: must be 512 and 64.
        block_tables: [batch, q_len, top_k] int32 physical token rows (page * page_size + offset), -1 = none.
        seq_lens: [batch] int32 valid slots per request (None: all top_k).
        sparse_mla_top_k: index capacity, a positive multiple of 64.
        out: optional [batch, q_len, heads, 512] bf16 buffer.
        bmm1_scale, bmm2_scale: host scalars (Q/K descales and softmax scale; V descale and output scale).
        backend: an mla_core backend name, or ``"auto"`` / a FlashInfer backend name for automatic dispatch.
        lse: optional float32 buffer [batch * q_len, heads] or [batch, q_len, heads].
        return_lse: return ``(out, lse)``.
        metadata: from :func:`get_sparse_decode_metadata` (None: prepared for this call); refused when built
            for another shape, q_len, top-k or seq_lens-given-ness, and (content checks on) other seq_lens values.

    Returns:
        out [batch, q_len, heads, 512] bf16, or ``(out, lse [batch, q_len, heads] float32)`` with return_lse
        (the given ``out`` / ``lse`` buffers themselves when passed, ``lse`` in the layout it was given).
    """
    name = None if backend is None or backend in FLASHINFER_BACKEND_NAMES else backend
    if _compiling():
        if metadata is not None:
            raise specs.MLAInputError("metadata: got a metadata object under torch.compile, needs None "
                                      "(pass seq_lens; the compiled graph prepares it)")
        o, lse_new = torch.ops.mla_core.sparse_mla_fp8_decode(query, kv_cache, block_tables, seq_lens, sparse_mla_top_k,
                                                              float(bmm1_scale), float(bmm2_scale), name)
        o, lse_new = _fill(out, o), _fill(lse, lse_new)
        return (o, lse_new) if return_lse else o
    problem, call = specs.validate_sparse_decode(query, kv_cache, qk_nope_head_dim, kv_lora_rank, qk_rope_head_dim,
                                                 block_tables, seq_lens, sparse_mla_top_k, out, bmm1_scale, bmm2_scale,
                                                 lse, return_lse, metadata)
    out, lse_out = _run(problem, call, name)
    if lse is not None:  # the caller's buffer, in the layout it was given (a backend may return a 3-D view of it)
        lse_out = lse
    return (out, lse_out) if return_lse else out


mla_decode = mla_attention_decode
mla_prefill = mla_prefill_attention
