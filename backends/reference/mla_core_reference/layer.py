"""Reference fused MLA layer: the executable definition of :func:`mla_core.mla_forward` (docs/layer.md).

Per token ``t`` of request ``b`` at position ``pos = cache_offsets[b] + i``:

- the new cache row is ``[rmsnorm(kv_latent) * gamma, rope(kv_rope, pos)]``: RMSNorm and RoPE in float32 from
  the upcast inputs, rounded once to the cache dtype, written at ``block_table[b, pos // page_size]``,
  slot ``pos % page_size`` (a slot whose page index lies outside the cache or the table is never written; the
  write and the whole decode path never synchronize with the host, so a decode step can be captured in a CUDA
  graph when its attention backend can);
- ``q_rope`` is rotated in float32 at ``pos``; weights are dequantized exactly (FP8 code x block scale) to float32;
- decode (``max_seq_len == 1``): ``q_lat[h] = w_uk[h] @ q_nope[h]`` in float32, ``[q_lat, q_rope]`` rounded to
  the cache dtype, :func:`mla_core.mla_decode` over the request's ``pos + 1`` cached rows (output in the cache
  dtype, natural-log LSE), then ``out[h] = w_uv[h] @ o_lat[h]`` in float32;
- prefill: each request's cached rows ``0..cache_offsets[b] + len_b - 1`` give ``K = [w_k @ latent, k_rope]`` and
  ``V = w_uv @ latent`` (float32, FP8 block scales applied to each block's partial product, rounded to the cache
  dtype), ``Q = [q_nope, q_rope]`` rounded to the cache dtype, and :func:`mla_core.mla_prefill` runs bottom-right
  causal attention (query ``i`` of ``len_q`` sees keys ``j <= i + len_k - len_q``);
- sparse (``sparse_indices`` given, any ``max_seq_len``): the absorbed decode math for every token, over the cache
  rows its valid index slots select (in their order, as one-row pages; -1 and rows outside the cache are not keys);
- sinks scale each head's output by ``1 / (1 + exp(sink - lse))`` (an extra ``exp(sink)`` in the denominator);
- the output is cast to q's dtype.

The attention step runs on ``call.attention_backend`` (None: automatic dispatch); every backend computes the
attention ops' contract, so the layer's numerics do not depend on it beyond the attention tolerance.
"""
from __future__ import annotations

import contextlib

import torch

import mla_core
from mla_core import layer, numerics


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """RoPE of float32 ``x`` [..., rope] by angles with ``cos``/``sin`` [..., rope/2] (broadcast), float32.

    ``interleave`` rotates pairs ``(2i, 2i + 1)`` and keeps them in place; otherwise pairs ``(i, i + rope/2)``.
    """
    if interleave:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def mla_forward_reference(call: layer.LayerCall) -> torch.Tensor:
    """Run one validated layer call; returns out [tokens, heads, v_dim] in q's dtype (the cache is written)."""
    q, cache = call.q, call.latent_cache
    tokens, heads = q.shape[0], q.shape[1]
    device, cdtype = q.device, cache.dtype
    latent, rope, nope = call.kv_lora_rank, call.rope_dim, call.nope_dim
    page_size, width = cache.shape[1], call.block_table.shape[1]
    if tokens == 0:
        return torch.zeros(tokens, heads, call.v_dim, dtype=q.dtype, device=device)

    offsets = call.input_row_offsets.to(device, torch.int64)
    lens = offsets[1:] - offsets[:-1]
    batch = lens.shape[0]
    request = torch.repeat_interleave(torch.arange(batch, device=device), lens, output_size=tokens)   # [tokens]
    starts = call.cache_offsets.to(device, torch.int64)
    pos = starts[request] + torch.arange(tokens, device=device) - offsets[request]                   # [tokens]
    freqs = call.freqs_cis.float()[pos.clamp(0, call.freqs_cis.shape[0] - 1)]                         # [tokens, rope]
    cos, sin = freqs[:, 0::2], freqs[:, 1::2]

    # 1. the new cache rows, written where the table says (never outside the cache).
    kv = call.kv.float()
    lat = kv[:, :latent]
    lat = lat * torch.rsqrt(lat.pow(2).mean(dim=-1, keepdim=True) + call.epsilon) * call.kv_norm_gamma.float()
    rows = torch.cat((lat, rotate(kv[:, latent:], cos, sin, call.rope_interleave)), dim=-1).to(cdtype)
    table = call.block_table.to(torch.int64)
    page_col = pos // page_size
    page = table[request, page_col.clamp(0, width - 1)]
    ok = (page_col < width) & (page >= 0) & (page < cache.shape[0])
    _write_rows(cache, torch.where(ok, page, 0) * page_size + pos % page_size, ok, rows)

    # 2. queries and weights in float32.
    q32 = q.float()
    q_nope = q32[..., :nope]
    q_rope = rotate(q32[..., nope:], cos[:, None, :], sin[:, None, :], call.rope_interleave)
    block = call.weight_block_size
    kv_lens = starts + lens

    if call.decode or call.sparse_indices is not None:
        w_uk = layer.dequantize_weight(call.w_uk, call.w_uk_scale, block, "w_uk")                    # [H, latent, nope]
        w_uv = layer.dequantize_weight(call.w_uv, call.w_uv_scale, block, "w_uv")                    # [H, v, latent]
        q_lat = torch.einsum("thn,hln->thl", q_nope, w_uk)
        q_dec = torch.cat((q_lat, q_rope), dim=-1).to(cdtype)
        if call.sparse_indices is None:      # each token over its request's positions 0..pos
            keys, key_table, key_lens = cache, call.block_table[request], kv_lens[request]
        else:                                # each token over its selected rows: a cache of one-row pages
            keys = cache.view(-1, 1, cache.shape[-1])
            key_table, key_lens = _selected_rows(call.sparse_indices, call.topk_lengths, keys.shape[0])
        o_lat, lse = mla_core.mla_decode(
            q_dec, keys, key_table, key_lens, softmax_scale=call.softmax_scale, kv_lora_rank=latent,
            qk_rope_head_dim=rope, num_kv_splits="auto", return_lse=True, backend=call.attention_backend)
        o = torch.einsum("thl,hvl->thv", o_lat.float(), w_uv)
    else:
        cu_k = layer.cumulative_counts(kv_lens)
        k_pages, k_slots, k_ok = layer.key_coordinates(table, kv_lens, cu_k, int(cu_k[-1]), page_size, cache.shape[0])
        key_rows = torch.where(k_ok[:, None], cache[k_pages, k_slots].float(), 0.0)                  # [total_k, D]
        k_lat = key_rows[:, :latent]
        k_nope = _up_project(k_lat, call.w_k, call.w_k_scale, block, cdtype).view(-1, heads, nope)
        k_rope = key_rows[:, None, latent:].expand(-1, heads, rope)
        k = torch.cat((k_nope, k_rope), dim=-1).to(cdtype)
        v = _up_project(k_lat, call.w_uv, call.w_uv_scale, block, cdtype).view(-1, heads, call.v_dim).to(cdtype)
        q_pre = torch.cat((q_nope, q_rope), dim=-1).to(cdtype)
        o, lse = mla_core.mla_prefill(q_pre, k, v, offsets, cu_k, call.max_seq_len, call.softmax_scale, causal=True,
                                      return_lse=True, backend=call.attention_backend)
        o, lse = o.float(), lse.T                                                                    # lse [tokens, H]
    if call.attn_sinks is not None:
        o = o * numerics.sink_factor(lse, call.attn_sinks)[..., None]
    return o.to(q.dtype).contiguous()           # einsum may return permuted strides; the op's output is contiguous


_TF32_EXACT = (torch.bfloat16, torch.float16, torch.float8_e4m3fn)
"""Dtypes whose values TF32 holds exactly (at most 11 significant bits, float32's exponent range)."""


@contextlib.contextmanager
def _tf32_matmuls(allowed: bool):
    """CUDA float32 matmuls may use TF32 tensor cores inside (only where every operand value is exact in TF32)."""
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = allowed
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


def _up_project(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None, block: tuple[int, int],
                x_dtype: torch.dtype) -> torch.Tensor:
    """``x @ value(w)^T`` in float32: x [rows, K] (float32 holding ``x_dtype`` values), w [N, K] or [H, R, K].

    A float ``w`` is one product. FP8 codes are multiplied per column block and each partial product is scaled by
    its block's scale (``sum_kb (x_kb @ codes_kb^T) * scale[:, kb]``), so every product is of two values exact in
    TF32 when ``x_dtype`` is bf16 / fp16: CUDA then runs them on TF32 tensor cores with float32 accumulation,
    the float32 result up to summation order. Returns [rows, N] (N = all rows of ``w``).
    """
    codes = w.reshape(-1, w.shape[-1])
    exact = x.is_cuda and x_dtype in _TF32_EXACT and w.dtype in _TF32_EXACT
    with _tf32_matmuls(exact):
        if scale is None:
            return x @ codes.float().T
        row_scale = scale.float().repeat_interleave(block[0], dim=-2)[..., :w.shape[-2], :]
        row_scale = row_scale.reshape(-1, row_scale.shape[-1])                                   # [N, K blocks]
        out = None
        for kb in range(row_scale.shape[1]):
            cols = slice(kb * block[1], (kb + 1) * block[1])
            part = (x[:, cols] @ codes[:, cols].float().T) * row_scale[:, kb]
            out = part if out is None else out + part
        return out


def _selected_rows(indices: torch.Tensor, lengths: torch.Tensor | None, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's valid cache rows first, in their given order: (table [tokens, top_k] int64, count [tokens]).

    A slot is valid below the token's length (all slots without ``lengths``) and when it holds a row of the cache
    (-1 and rows outside the cache are not keys). Entries past the count are 0 and never read. No host sync.
    """
    top_k = indices.shape[1]
    idx = indices.to(torch.int64)
    slots = torch.arange(top_k, device=idx.device)
    valid = (idx >= 0) & (idx < rows)
    if lengths is not None:
        valid &= slots[None, :] < lengths.to(idx.device, torch.int64)[:, None]
    order = torch.sort((~valid).to(torch.int8), dim=1, stable=True).indices
    count = valid.sum(dim=1)
    table = torch.where(slots[None, :] < count[:, None], idx.gather(1, order), 0)
    return table, count


def _write_rows(cache: torch.Tensor, slot: torch.Tensor, ok: torch.Tensor, rows: torch.Tensor) -> None:
    """``cache`` row ``slot[t]`` (flat over pages x page slots) = ``rows[t]`` where ``ok[t]``; nothing else changes.

    No host synchronization (a CUDA graph can hold it): a row that must not be written is redirected to the slot
    of the first row that is written, with that row's value (the same value twice), or, when no row is written,
    to slot 0 with slot 0's own value.
    """
    flat = cache.view(-1, cache.shape[-1])
    first = torch.argmax(ok.to(torch.int8)).view(1)               # the first written row (0 when none is)
    any_ok = ok.any()                                             # (index_select: a 0-d index would sync)
    target = torch.where(ok, slot, torch.where(any_ok, slot.index_select(0, first), 0))
    spare = torch.where(any_ok, rows.index_select(0, first)[0], flat[0])
    flat.index_put_((target,), torch.where(ok[:, None], rows, spare[None, :]))
