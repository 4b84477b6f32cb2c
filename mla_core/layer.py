"""The fused MLA layer: one call that normalizes, rotates and caches the new latent rows, then runs decode or prefill.

:func:`mla_forward` follows MAX's ``mla_prefill_decode_graph_fp8`` in a Python signature (docs/layer.md):

1. the new latent rows ``kv`` [tokens, kv_lora_rank + rope] (before normalization) get RMSNorm on the latent part
   (``kv_norm_gamma``, ``epsilon``) and RoPE on the rope part at each token's position, and are written into the
   paged latent cache;
2. the rope part of ``q`` is rotated at the same positions;
3. ``max_seq_len == 1`` runs the absorbed decode: ``q_nope`` goes through ``w_uk`` into latent space, attention
   runs over the latent cache (:func:`mla_core.mla_decode`), the latent output goes through ``w_uv``;
   ``max_seq_len > 1`` runs prefill: each request's cached latent rows (prefix and new tokens) are up-projected
   by ``w_k`` / ``w_uv`` to K and V, and varlen causal attention runs over them (:func:`mla_core.mla_prefill`);
4. optional per-head attention sinks add ``exp(sink)`` to each softmax denominator.

Weights are FP8 E4M3 with float32 block scales (``weight_block_size``, 128 x 128 as DeepSeek-V3 ships) or plain
bf16 / fp16 / fp32 (no scale). This module validates the arguments, builds the :class:`LayerCall` backends
receive, and dispatches; the reference backend's ``layer`` method is the definition of the numerics.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from . import dispatch, numerics
from .errors import MLAInputError
from .problem import Problem, dtype_name
from .specs import (FLOAT_DTYPES, FP8, INDEX_DTYPES, check_contiguous, check_int, check_positive_float,
                    check_same_device, check_shape, check_tensor, content_checks_enabled)

DEFAULT_WEIGHT_BLOCK = (128, 128)
"""DeepSeek-V3's FP8 weight block: 128 output rows x 128 input columns share one float32 scale."""


@dataclass
class LayerCall:
    """Validated arguments of :func:`mla_forward`.

    q [tokens, heads, nope + rope]; kv [tokens, latent + rope]; input_row_offsets [batch + 1];
    freqs_cis [max_pos, rope] (interleaved cos/sin pairs); kv_norm_gamma [latent];
    latent_cache [num_pages, page_size, latent + rope] (written in place); block_table [batch, max_pages];
    cache_offsets [batch] (tokens already cached per request = position of its first new token);
    w_k [heads * nope, latent], w_uk [heads, latent, nope], w_uv [heads, v_dim, latent], each FP8 with a
    float32 ``*_scale`` (see :func:`weight_scale_shape`) or a float dtype with scale None; attn_sinks [heads]
    or None. ``decode`` is ``max_seq_len == 1``. sparse_indices [tokens, top_k] (cache rows ``page * page_size +
    slot``, -1 none) with topk_lengths [tokens] (None: every slot) select each token's keys (DeepSeek-V3.2).
    ``key_total`` is set by the content checks (eager, full mode).
    """

    q: torch.Tensor
    kv: torch.Tensor
    input_row_offsets: torch.Tensor
    freqs_cis: torch.Tensor
    kv_norm_gamma: torch.Tensor
    latent_cache: torch.Tensor
    block_table: torch.Tensor
    cache_offsets: torch.Tensor
    max_seq_len: int
    w_k: torch.Tensor
    w_k_scale: torch.Tensor | None
    w_uk: torch.Tensor
    w_uk_scale: torch.Tensor | None
    w_uv: torch.Tensor
    w_uv_scale: torch.Tensor | None
    weight_block_size: tuple[int, int]
    softmax_scale: float
    epsilon: float
    attn_sinks: torch.Tensor | None
    rope_interleave: bool
    attention_backend: str | None
    heads: int
    nope_dim: int
    rope_dim: int
    kv_lora_rank: int
    v_dim: int
    sparse_indices: torch.Tensor | None = None
    topk_lengths: torch.Tensor | None = None
    key_total: int | None = None
    """``sum(cache_offsets + request lengths)`` when the content checks read it on the host (None: not read)."""

    @property
    def decode(self) -> bool:
        return self.max_seq_len == 1


def weight_scale_shape(name: str, weight_shape, block: tuple[int, int]) -> tuple[int, ...]:
    """Shape of the float32 block scales of one layer weight.

    Blocks cover the weight's last two dimensions: ``block = (b_out, b_in)`` rows x columns of ``w_k``
    [heads * nope, latent] and of each head of ``w_uv`` [heads, v_dim, latent]; ``w_uk`` [heads, latent, nope]
    is the per-head transpose of ``w_k``'s rows, so its blocks are ``(b_in, b_out)``, and its scales the per-head
    transpose of ``w_k``'s (a checkpoint's ``kv_b_proj`` scales split without re-quantizing).
    """
    rows_block, cols_block = (block[1], block[0]) if name == "w_uk" else block
    *lead, rows, cols = weight_shape
    return (*lead, -(-rows // rows_block), -(-cols // cols_block))


def dequantize_weight(w: torch.Tensor, scale: torch.Tensor | None, block: tuple[int, int],
                      name: str = "w_k") -> torch.Tensor:
    """The float32 value of a layer weight: FP8 code times its block scale (correctly rounded); a float weight upcast.

    ``w`` [..., rows, cols]; ``scale`` [..., ceil(rows / b_rows), ceil(cols / b_cols)] float32 with the block of
    ``name`` (:func:`weight_scale_shape`), or None for a float weight. The same rule dequantizes any 2-D
    block-scaled FP8 matrix (a checkpoint's ``weight`` with its ``weight_scale_inv``) with ``name="w_k"``.
    """
    if scale is None:
        return w.float()
    rows_block, cols_block = (block[1], block[0]) if name == "w_uk" else block
    rows, cols = w.shape[-2], w.shape[-1]
    full = scale.float().repeat_interleave(rows_block, dim=-2)[..., :rows, :]
    full = full.repeat_interleave(cols_block, dim=-1)[..., :cols]
    return w.float() * full


def cumulative_counts(counts: torch.Tensor) -> torch.Tensor:
    """``[0, c0, c0 + c1, ...]``: cumulative int64 offsets [n + 1] of ``counts`` [n] (on their device)."""
    cu = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
    torch.cumsum(counts.to(torch.int64), 0, out=cu[1:])
    return cu


def key_coordinates(table: torch.Tensor, kv_lens: torch.Tensor, cu_k: torch.Tensor, total: int, page_size: int,
                    num_pages: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cache coordinates of every request's keys ``0..kv_lens[b] - 1``, packed in request order.

    table [batch, width] page ids; kv_lens [batch] int64 and cu_k = :func:`cumulative_counts` of it; ``total`` =
    ``cu_k[-1]`` (a host int: it sizes the result). Returns (page [total] int64, slot [total], ok [total] bool:
    the page index lies inside the table and the cache). A key that is not ``ok`` points at page 0; the caller
    zeroes it, so nothing outside the cache is ever read.
    """
    batch, width = table.shape
    request = torch.repeat_interleave(torch.arange(batch, device=table.device), kv_lens, output_size=total)
    pos = torch.arange(total, device=table.device) - cu_k[request]
    col = pos // page_size
    page = table[request, col.clamp(0, width - 1)].to(torch.int64)
    ok = (col < width) & (page >= 0) & (page < num_pages)
    return torch.where(ok, page, 0), pos % page_size, ok


def _check_weight(name: str, w: Any, scale: Any, shape: tuple, block: tuple[int, int]) -> None:
    check_tensor(name, w, len(shape), (FP8, *FLOAT_DTYPES))
    check_shape(name, w, shape)
    scale_name = f"{name}_scale"
    if w.dtype == FP8:
        if scale is None:
            raise MLAInputError(f"{scale_name}: got None for an FP8 {name}, needs its float32 block scales")
        check_tensor(scale_name, scale, len(shape), (torch.float32,))
        check_shape(scale_name, scale, weight_scale_shape(name, w.shape, block))
    elif scale is not None:
        raise MLAInputError(f"{scale_name}: got a tensor for a {dtype_name(w.dtype)} {name}, needs None "
                            "(block scales belong to FP8 weights)")


def _check_block(block: Any) -> tuple[int, int]:
    if (not isinstance(block, (tuple, list)) or len(block) != 2
            or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in block)):
        raise MLAInputError(f"weight_block_size: got {block!r}, needs two positive ints (rows, columns)")
    return int(block[0]), int(block[1])


_SMALL_TABLE = 512
"""Block tables of at most this many entries are range-checked in Python (fewer host ops than the torch path)."""


def _host_index_tensors(*tensors: torch.Tensor) -> list[torch.Tensor]:
    """The int32 / int64 ``tensors`` (1-D) on the host, values and dtypes unchanged, in one device op and one read.

    They travel as int32 words: an int64 tensor as a view of its words (no cast; a copy only for a one-element
    tensor with a stride other than 1), int64 ones first so each starts 8-byte aligned in the host buffer and is
    viewed back as int64 there.
    """
    order = sorted(range(len(tensors)), key=lambda i: tensors[i].dtype != torch.int64)
    wide = [tensors[i].dtype == torch.int64 for i in order]
    words = torch.cat([(t if t.stride(-1) == 1 else t.clone(memory_format=torch.contiguous_format)).view(torch.int32)
                       if w else t for t, w in zip((tensors[i] for i in order), wide)]).to("cpu")
    host = [None] * len(tensors)
    chunks = words.split_with_sizes([tensors[i].numel() * (2 if w else 1) for i, w in zip(order, wide)])
    for i, w, chunk in zip(order, wide, chunks):
        host[i] = chunk.view(torch.int64) if w else chunk
    return host


def _content_checks(call: LayerCall) -> None:
    """Value checks (eager calls, unless ``MLA_CORE_CHECKS=metadata``): offsets, lengths, pages, positions.

    One host read (offsets, cache_offsets and the block table in one transfer, whatever mix of int32 / int64
    they come in: one device op, :func:`_host_index_tensors`), then Python arithmetic.
    """
    batch, width = call.block_table.shape
    offsets_h, starts_h, table_h = _host_index_tensors(call.input_row_offsets, call.cache_offsets,
                                                        call.block_table.reshape(-1))
    offsets = offsets_h.tolist()
    tokens = call.q.shape[0]
    if offsets[0] != 0:
        raise MLAInputError(f"input_row_offsets: got first entry {offsets[0]}, needs 0")
    lens = [b - a for a, b in zip(offsets, offsets[1:])]
    if lens and min(lens) < 0:
        raise MLAInputError(f"input_row_offsets: got decreasing entries {offsets[:16]}, needs non-decreasing")
    if offsets[-1] != tokens:
        raise MLAInputError(f"input_row_offsets: got last entry {offsets[-1]}, needs the token count {tokens}")
    if not lens:
        return
    longest = max(lens)
    if longest > call.max_seq_len:
        raise MLAInputError(f"max_seq_len: got {call.max_seq_len}, needs at least the longest request ({longest})")
    starts = starts_h.tolist()
    if min(starts) < 0:
        raise MLAInputError(f"cache_offsets: got {min(starts)}, needs >= 0")
    ends = [s + n for s, n in zip(starts, lens)]
    call.key_total = sum(ends)                # a prefill sizes its keys with it (no second host read)
    page_size = call.latent_cache.shape[1]
    capacity = width * page_size
    if max(ends) > capacity:
        raise MLAInputError(f"cache_offsets: got a request ending at token {max(ends)}, needs <= {capacity} "
                            f"(block_table.shape[1] * page_size = {width} * {page_size})")
    if tokens and max(e for e, n in zip(ends, lens) if n > 0) > call.freqs_cis.shape[0]:
        last = max(e for e, n in zip(ends, lens) if n > 0)
        raise MLAInputError(f"freqs_cis: got {call.freqs_cis.shape[0]} positions, needs one per position up to "
                            f"{last - 1} (cache_offsets + request lengths)")
    if call.sparse_indices is not None and tokens:
        _sparse_content_checks(call, page_size)
    used = [(e + page_size - 1) // page_size for e in ends]
    num_pages = call.latent_cache.shape[0]
    if max(used) > 0:
        if batch * width <= _SMALL_TABLE:       # the reached entries of each row, in Python
            rows = table_h.tolist()
            reached = [page for b, u in enumerate(used) for page in rows[b * width:b * width + u]]
            low, high = min(reached), max(reached)
        else:                   # (torch.where, not a boolean index: that is ~100x slower on a busy CPU)
            reached = torch.arange(width)[None, :] < torch.tensor(used)[:, None]
            low, high = (int(v) for v in torch.aminmax(torch.where(reached, table_h.view(batch, width), 0)))
        if low < 0 or high >= num_pages:
            bad = low if low < 0 else high
            raise MLAInputError(f"block_table: got page index {bad} within a request's length, needs "
                                f"0..{num_pages - 1} (the latent_cache page count)")


def _sparse_content_checks(call: LayerCall, page_size: int) -> None:
    top_k = call.sparse_indices.shape[1]
    tokens = call.sparse_indices.shape[0]
    counts = torch.full((tokens,), top_k, dtype=torch.int64, device="cpu") if call.topk_lengths is None else call.topk_lengths.to("cpu", torch.int64)
    if int(counts.min()) < 0 or int(counts.max()) > top_k:
        bad = int(counts.min()) if int(counts.min()) < 0 else int(counts.max())
        raise MLAInputError(f"topk_lengths: got {bad}, needs 0..{top_k} (sparse_indices.shape[1])")
    idx = call.sparse_indices.to("cpu", torch.int64)
    used = idx[(torch.arange(top_k, device="cpu")[None, :] < counts[:, None]) & (idx != -1)]
    rows = call.latent_cache.shape[0] * page_size
    if used.numel() and (int(used.min()) < 0 or int(used.max()) >= rows):
        bad = int(used.min()) if int(used.min()) < 0 else int(used.max())
        raise MLAInputError(f"sparse_indices: got cache row {bad}, needs -1 or 0..{rows - 1} "
                            "(num_pages * page_size rows of latent_cache)")


def validate_layer(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets, *,
                   max_seq_len, w_k, w_uk, w_uv, softmax_scale, epsilon, w_k_scale, w_uk_scale, w_uv_scale,
                   weight_block_size, attn_sinks, rope_interleave, attention_backend, sparse_indices=None,
                   topk_lengths=None) -> tuple[Problem, LayerCall]:
    """Check every argument of :func:`mla_forward` (raising :class:`MLAInputError` naming it) and build the call."""
    problem, call = _validate_metadata(
        q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
        max_seq_len=max_seq_len, w_k=w_k, w_uk=w_uk, w_uv=w_uv, softmax_scale=softmax_scale, epsilon=epsilon,
        w_k_scale=w_k_scale, w_uk_scale=w_uk_scale, w_uv_scale=w_uv_scale, weight_block_size=weight_block_size,
        attn_sinks=attn_sinks, rope_interleave=rope_interleave, attention_backend=attention_backend,
        sparse_indices=sparse_indices, topk_lengths=topk_lengths)
    if content_checks_enabled(input_row_offsets, q):
        _content_checks(call)
    return problem, call


def _validate_metadata(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
                       *, max_seq_len, w_k, w_uk, w_uv, softmax_scale, epsilon, w_k_scale, w_uk_scale, w_uv_scale,
                       weight_block_size, attn_sinks, rope_interleave, attention_backend, sparse_indices,
                       topk_lengths) -> tuple[Problem, LayerCall]:
    """:func:`validate_layer` without the content checks: shapes, dtypes, devices, strides and scalars only."""
    check_tensor("latent_cache", latent_cache, 3, FLOAT_DTYPES)
    check_contiguous("latent_cache", latent_cache)
    dtype = latent_cache.dtype
    check_tensor("q", q, 3, (dtype,))
    check_tensor("kv", kv, 2, (dtype,))
    check_tensor("input_row_offsets", input_row_offsets, 1, INDEX_DTYPES)
    check_tensor("freqs_cis", freqs_cis, 2, FLOAT_DTYPES)
    check_tensor("kv_norm_gamma", kv_norm_gamma, 1, FLOAT_DTYPES)
    check_tensor("block_table", block_table, 2, INDEX_DTYPES)
    check_tensor("cache_offsets", cache_offsets, 1, INDEX_DTYPES)
    rope = freqs_cis.shape[1]
    if rope < 2 or rope % 2:
        raise MLAInputError(f"freqs_cis: got {rope} columns, needs an even RoPE width >= 2 (cos/sin pairs)")
    check_tensor("w_uk", w_uk, 3, (FP8, *FLOAT_DTYPES))
    heads, nope = w_uk.shape[0], w_uk.shape[2]            # [heads, kv_lora_rank, qk_nope]
    if heads < 1 or nope < 1:
        raise MLAInputError(f"w_uk: got shape {list(w_uk.shape)}, needs [heads >= 1, kv_lora_rank, qk_nope >= 1]")
    check_shape("q", q, (None, heads, nope + rope))
    tokens = q.shape[0]
    latent = w_uk.shape[1]
    if latent < 1:
        raise MLAInputError(f"w_uk: got shape {list(w_uk.shape)}, needs kv_lora_rank >= 1")
    check_shape("kv_norm_gamma", kv_norm_gamma, (latent,))
    check_shape("kv", kv, (tokens, latent + rope))
    check_shape("latent_cache", latent_cache, (None, None, latent + rope))
    if latent_cache.shape[1] < 1:
        raise MLAInputError("latent_cache: got page size 0, needs at least 1")
    if input_row_offsets.shape[0] < 1:
        raise MLAInputError("input_row_offsets: got an empty tensor, needs [batch + 1] entries")
    batch = input_row_offsets.shape[0] - 1
    check_shape("block_table", block_table, (batch, None))
    check_shape("cache_offsets", cache_offsets, (batch,))
    if isinstance(max_seq_len, torch.SymInt):      # torch.compile made it dynamic: the path depends on its value
        max_seq_len = int(max_seq_len)
    check_int("max_seq_len", max_seq_len, 0)
    block = _check_block(weight_block_size)
    _check_weight("w_k", w_k, w_k_scale, (heads * nope, latent), block)
    check_tensor("w_uv", w_uv, 3, (FP8, *FLOAT_DTYPES))
    v_dim = w_uv.shape[1]
    if v_dim < 1:
        raise MLAInputError("w_uv: got v_head_dim 0, needs [heads, v_head_dim >= 1, kv_lora_rank]")
    _check_weight("w_uk", w_uk, w_uk_scale, (heads, latent, nope), block)
    _check_weight("w_uv", w_uv, w_uv_scale, (heads, v_dim, latent), block)
    softmax_scale = check_positive_float("softmax_scale", softmax_scale)
    epsilon = check_positive_float("epsilon", epsilon)
    if attn_sinks is not None:
        check_tensor("attn_sinks", attn_sinks, 1, FLOAT_DTYPES)
        check_shape("attn_sinks", attn_sinks, (heads,))
    if not isinstance(rope_interleave, bool):
        raise MLAInputError(f"rope_interleave: got {rope_interleave!r}, needs a bool")
    if sparse_indices is not None:
        check_tensor("sparse_indices", sparse_indices, 2, INDEX_DTYPES)
        check_shape("sparse_indices", sparse_indices, (tokens, None))
        if sparse_indices.shape[1] < 1:
            raise MLAInputError("sparse_indices: got top_k 0, needs [tokens, top_k >= 1]")
        if topk_lengths is not None:
            check_tensor("topk_lengths", topk_lengths, 1, INDEX_DTYPES)
            check_shape("topk_lengths", topk_lengths, (tokens,))
    elif topk_lengths is not None:
        raise MLAInputError("topk_lengths: got a tensor without sparse_indices, needs None (or pass sparse_indices)")
    if attention_backend is not None and not isinstance(attention_backend, str):
        raise MLAInputError(f"attention_backend: got {attention_backend!r}, needs a backend name or None")
    device = check_same_device(q=q, kv=kv, input_row_offsets=input_row_offsets, freqs_cis=freqs_cis,
                               kv_norm_gamma=kv_norm_gamma, latent_cache=latent_cache, block_table=block_table,
                               cache_offsets=cache_offsets, w_k=w_k, w_k_scale=w_k_scale, w_uk=w_uk,
                               w_uk_scale=w_uk_scale, w_uv=w_uv, w_uv_scale=w_uv_scale, attn_sinks=attn_sinks,
                               sparse_indices=sparse_indices, topk_lengths=topk_lengths)
    call = LayerCall(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
                     max_seq_len, w_k, w_k_scale, w_uk, w_uk_scale, w_uv, w_uv_scale, block, softmax_scale, epsilon,
                     attn_sinks, rope_interleave, attention_backend, heads, nope, rope, latent, v_dim,
                     sparse_indices, topk_lengths)
    features = {"sinks"} if attn_sinks is not None else set()
    if sparse_indices is not None:
        features.add("sparse")
    weight_formats = {w.dtype == FP8 for w in (w_k, w_uk, w_uv)}
    if True in weight_formats:
        features.add("fp8_weights")
    mode = "sparse" if sparse_indices is not None else "decode" if call.decode else "prefill"
    problem = Problem.make(
        "layer", device.type, features, dtype=dtype_name(dtype), heads=heads, nope_dim=nope, rope_dim=rope,
        kv_lora_rank=latent, v_dim=v_dim, page_size=latent_cache.shape[1], mode=mode,
        batch=numerics.bucket_pow2(batch), max_seq_len=numerics.bucket_pow2(max_seq_len))
    return problem, call


_VALIDATED: dict[tuple, tuple] = {}
"""Metadata-checked layer calls by the metadata of their arguments (each tensor's type, shape, dtype, device and
strides; each scalar's type and value: True is not 1): (Problem, the LayerCall's fields other than its tensors). At most
:data:`_VALIDATED_MAX` keys; cleared when full."""
_VALIDATED_MAX = 256
_CALL_SCALARS = ("max_seq_len", "weight_block_size", "softmax_scale", "epsilon", "rope_interleave",
                 "attention_backend", "heads", "nope_dim", "rope_dim", "kv_lora_rank", "v_dim")


def _block_key(block: Any) -> tuple:
    """``weight_block_size`` as a key entry: its type and each item's type and value (True is not 1)."""
    if isinstance(block, (tuple, list)):
        return type(block), tuple([(type(x), x) for x in block])
    return type(block), block


def mla_forward(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets, *,
                max_seq_len, w_k, w_uk, w_uv, softmax_scale, epsilon=1e-6, w_k_scale=None, w_uk_scale=None,
                w_uv_scale=None, weight_block_size=DEFAULT_WEIGHT_BLOCK, attn_sinks=None, rope_interleave=True,
                sparse_indices=None, topk_lengths=None, attention_backend: str | None = None,
                backend: str | None = None):
    """The fused MLA layer (MAX's ``mla_prefill_decode_graph_fp8``): cache the new latent rows, then decode or prefill.

    Request ``b`` owns tokens ``input_row_offsets[b]:input_row_offsets[b + 1]`` of ``q`` and ``kv``; its token
    ``i`` sits at position ``cache_offsets[b] + i`` (the first ``cache_offsets[b]`` positions are already in the
    cache), which picks its RoPE row and its cache slot ``block_table[b, pos // page_size]``, ``pos % page_size``.
    The new rows ``[rmsnorm(kv_latent) * kv_norm_gamma, rope(kv_rope)]`` are written into ``latent_cache`` first;
    then each token attends causally to its request's cached positions ``0..pos``.

    Args:
        q: [tokens, heads, qk_nope + qk_rope] bf16 / fp16 / fp32 (latent_cache's dtype); the rope part is rotated here.
        kv: [tokens, kv_lora_rank + qk_rope] new latent rows before normalization and RoPE (latent_cache's dtype).
        input_row_offsets: [batch + 1] int32/int64 cumulative token counts (0 first, tokens last).
        freqs_cis: [max_pos, qk_rope] float, row ``pos`` holding ``(cos_0, sin_0, cos_1, sin_1, ...)`` of the
            rotation by frequency ``i`` (RoPE scaling such as YaRN's mscale folded in).
        kv_norm_gamma: [kv_lora_rank] RMSNorm weight of the latent part.
        latent_cache: [num_pages, page_size, kv_lora_rank + qk_rope] contiguous, written in place.
        block_table: [batch, max_pages] int32/int64 page indices.
        cache_offsets: [batch] int32/int64 tokens already cached per request.
        max_seq_len: the longest request's token count in this call: 1 selects decode, more selects prefill.
        w_k: [heads * qk_nope, kv_lora_rank] K up-projection (prefill).
        w_uk: [heads, kv_lora_rank, qk_nope] absorption of q_nope into latent space (decode).
        w_uv: [heads, v_head_dim, kv_lora_rank] V up-projection (prefill) / output projection of the latent (decode).
        softmax_scale: scale of ``q·k`` before the softmax.
        epsilon: RMSNorm epsilon (default 1e-6, DeepSeek-V3's).
        w_k_scale, w_uk_scale, w_uv_scale: float32 block scales of FP8 E4M3 weights (:func:`weight_scale_shape`);
            None for bf16 / fp16 / fp32 weights. A weight's value is ``code * scale`` of its block.
        weight_block_size: ``(rows, columns)`` of one scale block (default 128 x 128).
        attn_sinks: optional [heads] per-head sink logits (units of the scaled scores): each softmax
            denominator gains ``exp(sink)``, so ``out = attention * 1 / (1 + exp(sink - lse))``.
        rope_interleave: True rotates pairs ``(2i, 2i + 1)`` (DeepSeek's layout); False rotates ``(i, i + rope/2)``.
        sparse_indices: optional [tokens, top_k] int32/int64 cache rows (``page * page_size + slot``; -1 = none)
            each token attends to instead of its request's positions (DeepSeek-V3.2's top-k selection; the new
            rows are written first, so a token may select itself); the absorbed path runs for every token.
        topk_lengths: optional [tokens] valid slots of each token's indices (0..top_k; None: all).
        attention_backend: backend name for the inner mla_decode / mla_prefill call (None: automatic).
        backend: backend name for the layer itself (None: automatic).

    Returns:
        out [tokens, heads, v_head_dim] in q's dtype. A request with no visible key (none: every token sees
        itself) would give 0. Inference only: it runs as under ``torch.no_grad()`` (weights that require grad,
        such as an ``nn.Module``'s parameters, are fine; the output does not require grad).
    """
    if torch.compiler.is_compiling():
        return torch.ops.mla_core.mla_forward(
            q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
            max_seq_len, w_k, w_k_scale, w_uk, w_uk_scale, w_uv, w_uv_scale, list(weight_block_size),
            softmax_scale, epsilon, attn_sinks, rope_interleave, sparse_indices, topk_lengths, attention_backend,
            backend)
    problem, call = checked_call(
        q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
        max_seq_len=max_seq_len, w_k=w_k, w_uk=w_uk, w_uv=w_uv, softmax_scale=softmax_scale, epsilon=epsilon,
        w_k_scale=w_k_scale, w_uk_scale=w_uk_scale, w_uv_scale=w_uv_scale, weight_block_size=weight_block_size,
        attn_sinks=attn_sinks, rope_interleave=rope_interleave, sparse_indices=sparse_indices,
        topk_lengths=topk_lengths, attention_backend=attention_backend)
    choice = dispatch.choose(problem, backend)
    if not torch.is_grad_enabled():
        return choice.backend.run(problem, call, choice.config)
    with torch.no_grad():  # an inference op (the cache is written in place): no autograd graph, on any backend
        return choice.backend.run(problem, call, choice.config)


def checked_call(q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets, *,
                 max_seq_len, w_k, w_uk, w_uv, softmax_scale, epsilon=1e-6, w_k_scale=None, w_uk_scale=None,
                 w_uv_scale=None, weight_block_size=DEFAULT_WEIGHT_BLOCK, attn_sinks=None, rope_interleave=True,
                 sparse_indices=None, topk_lengths=None,
                 attention_backend: str | None = None) -> tuple[Problem, LayerCall]:
    """Every check :func:`mla_forward` runs before it launches anything (its arguments, less ``backend``): the
    metadata checks (memoized per key) and, unless ``MLA_CORE_CHECKS=metadata``, the content checks. Raises
    :class:`MLAInputError`; reads no tensor but the index tensors (one host read, full checks only)."""
    tensors = (q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets, w_k,
               w_k_scale, w_uk, w_uk_scale, w_uv, w_uv_scale, attn_sinks, sparse_indices, topk_lengths)
    try:
        key = (tuple([None if t is None else (type(t), t.shape, t.dtype, t.device, t.stride()) for t in tensors]),
               type(max_seq_len), max_seq_len, type(softmax_scale), softmax_scale, type(epsilon), epsilon,
               _block_key(weight_block_size), type(rope_interleave), rope_interleave, type(attention_backend),
               attention_backend)
        hit = _VALIDATED.get(key)
    except (AttributeError, TypeError, RuntimeError):     # not a tensor, an unhashable argument: validate it
        key = hit = None
    if hit is None:
        problem, call = _validate_metadata(
            q, kv, input_row_offsets, freqs_cis, kv_norm_gamma, latent_cache, block_table, cache_offsets,
            max_seq_len=max_seq_len, w_k=w_k, w_uk=w_uk, w_uv=w_uv, softmax_scale=softmax_scale, epsilon=epsilon,
            w_k_scale=w_k_scale, w_uk_scale=w_uk_scale, w_uv_scale=w_uv_scale, weight_block_size=weight_block_size,
            attn_sinks=attn_sinks, rope_interleave=rope_interleave, attention_backend=attention_backend,
            sparse_indices=sparse_indices, topk_lengths=topk_lengths)
        if key is not None:
            if len(_VALIDATED) >= _VALIDATED_MAX:
                _VALIDATED.clear()
            _VALIDATED[key] = problem, {f: getattr(call, f) for f in _CALL_SCALARS}
    else:
        problem, scalars = hit
        call = LayerCall(*tensors[:8], w_k=w_k, w_k_scale=w_k_scale, w_uk=w_uk, w_uk_scale=w_uk_scale, w_uv=w_uv,
                         w_uv_scale=w_uv_scale, attn_sinks=attn_sinks, sparse_indices=sparse_indices,
                         topk_lengths=topk_lengths, **scalars)
    if content_checks_enabled(input_row_offsets, q):
        _content_checks(call)
    return problem, call
