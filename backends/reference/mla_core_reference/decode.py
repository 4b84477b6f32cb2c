"""Reference decode: the executable definition of paged MLA decode numerics (docs/numerics.md).

Per request of length L, with the 576-wide cache rows as K and their first ``kv_lora_rank`` values as V:

- K is fake-quantized along features, V along tokens over the whole request (NVFP4 blocks of 16 at
  absolute positions, the open tail block holding only tokens < L);
- ``s = (q · K) * softmax_scale`` in float32 (q upcast: bf16/fp16, or the FP32 carrier);
- keys are cut into 32-key tiles at absolute positions and the tiles into tile-aligned splits
  (:func:`mla_core.numerics.decode_split_bounds`); per split the running maximum ``m`` restarts at
  -inf and is updated once per tile; ``P = exp(s - m_tile)``; the row sum uses the float32 P; P·V uses
  ``qdq_p(P)`` (rounded to the cache dtype, or FP8 / NVFP4);
- splits merge through their log-sum-exp: ``o = sum_i exp(lse_i - lse) * acc_i / l_i``.

An FP8 cache (float8_e4m3fn codes) holds the values ``float32(code) * kv_scale``
(:func:`mla_core.numerics.fp8_cache_values`); everything above then runs on those float32 values, with P
rounded to q's dtype (:func:`mla_core.numerics.decode_value_dtype`) and K / V fake quantization, when
asked, applied to the dequantized values.

Everything is vectorized over the batch and heads; only the running maximum walks the tiles.
float32 matmuls are meant as IEEE float32: on CUDA this assumes TF32 is off (torch's default).
"""
from __future__ import annotations

import torch

from mla_core import numerics, specs

_NEG_INF = float("-inf")


def _gather_rows(call: specs.DecodeCall, lens: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Cache rows of every request (``lens`` [batch] int64, clamped), padded to ``max_len`` tokens.

    Returns (rows [batch, max_len, dim] float32, zero where a key is absent; valid [batch, max_len] bool).
    An FP8 cache's rows are its values ``code * kv_scale``.
    A key is absent past the request's length, and where its page index lies outside the cache (the
    safety rule: never read outside the cache). Table entries past ceil(L / page_size) are never
    dereferenced: they are replaced by page 0 before the gather and their keys are masked.
    """
    cache, page_size = call.latent_cache, call.page_size
    batch, device = call.q.shape[0], cache.device
    num_pages = -(-max_len // page_size)
    table = call.block_table[:, :num_pages].to(torch.int64)
    used_pages = (lens + page_size - 1) // page_size
    cols = torch.arange(num_pages, device=device)
    page_ok = (cols[None, :] < used_pages[:, None]) & (table >= 0) & (table < cache.shape[0])
    safe_table = torch.where(page_ok, table, 0)
    rows = cache[safe_table].reshape(batch, num_pages * page_size, cache.shape[2])[:, :max_len]
    pos = torch.arange(max_len, device=device)
    valid = (pos[None, :] < lens[:, None]) & page_ok.repeat_interleave(page_size, dim=1)[:, :max_len]
    values = numerics.fp8_cache_values(rows, call.kv_scale) if call.kv_scale is not None else rows.float()
    # torch.where, not a multiply: rows the length does not reach may hold NaN or inf.
    return torch.where(valid[..., None], values, 0.0), valid


def _running_max(tile_max: torch.Tensor, split_start: torch.Tensor) -> torch.Tensor:
    """Running row maximum after each tile, restarted at each split's first tile.

    tile_max [batch, heads, tiles] float32; split_start [batch, tiles] bool. Returns [batch, heads, tiles].
    """
    running = torch.full_like(tile_max[..., 0], _NEG_INF)
    out = torch.empty_like(tile_max)
    for t in range(tile_max.shape[-1]):
        running = torch.where(split_start[:, None, t], tile_max[..., t], torch.maximum(running, tile_max[..., t]))
        out[..., t] = running
    return out


def mla_decode_reference(call: specs.DecodeCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one validated decode call.

    Returns (out [batch, heads, kv_lora_rank] in ``call.out_dtype``, lse [batch, heads] float32 natural log,
    or None when ``call.return_lse`` is False). A length-0 request gives output 0 and LSE -inf. Lengths
    are clamped to ``0..block_table.shape[1] * page_size`` (out of range only with content checks off): a
    longer request attends to the keys its table holds, as the kernels do (docs/decisions.md).
    """
    batch, heads = call.q.shape[0], call.q.shape[1]
    device = call.latent_cache.device
    capacity = call.block_table.shape[1] * call.page_size
    lens = call.seq_lens.to(device, torch.int64).clamp(0, capacity)
    max_len = int(lens.max()) if batch else 0
    if max_len == 0:
        out = torch.zeros(batch, heads, call.kv_lora_rank, dtype=torch.float32, device=device)
        lse = torch.full((batch, heads), _NEG_INF, dtype=torch.float32, device=device)
    else:
        out, lse = _decode_batch(call, lens, max_len, specs.decode_num_splits(call, {}))
    return out.to(call.out_dtype), (lse if call.return_lse else None)


def _decode_batch(call: specs.DecodeCall, lens: torch.Tensor, max_len: int,
                  splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode with ``splits`` splits; ``lens`` [batch] int64 clamped lengths, the longest ``max_len`` > 0.

    Returns (out [batch, heads, kv_lora_rank], lse [batch, heads]) float32.
    """
    q, cache = call.q, call.latent_cache
    tile = numerics.DECODE_P_TILE
    batch, heads = q.shape[0], q.shape[1]
    rank, device = call.kv_lora_rank, cache.device
    rows, valid = _gather_rows(call, lens, max_len)

    k = numerics.qdq(rows, call.k_qdq, call.k_amax, dim=-1)               # [B, L, 576] along features
    v = numerics.qdq(rows[..., :rank], call.v_qdq, call.v_amax, dim=1)    # [B, L, 512] along tokens
    s = torch.bmm(q.float(), k.transpose(1, 2)) * call.softmax_scale      # [B, H, L]
    s = torch.where(valid[:, None, :], s, _NEG_INF)

    # 32-key tiles at absolute positions; the padded tail scores -inf, so its P is 0.
    num_tiles = -(-max_len // tile)
    s = torch.nn.functional.pad(s, (0, num_tiles * tile - max_len), value=_NEG_INF)
    s = s.view(batch, heads, num_tiles, tile)

    # Tile-aligned splits per request: tile t belongs to split t // tiles_per_split; tiles past the
    # request's length go to a discarded extra split (index `splits`).
    req_tiles = (lens + tile - 1) // tile
    tiles_per_split = ((req_tiles + splits - 1) // splits).clamp_min(1)
    t_idx = torch.arange(num_tiles, device=device)
    split_of_tile = torch.where(t_idx[None, :] < req_tiles[:, None], t_idx[None, :] // tiles_per_split[:, None], splits)
    split_start = (t_idx[None, :] % tiles_per_split[:, None]) == 0

    m = _running_max(s.amax(dim=-1), split_start)                          # [B, H, T], after each tile
    m_safe = torch.where(m == _NEG_INF, 0.0, m)                            # a tile with no key yet: P = 0
    p = torch.exp(s - m_safe[..., None])                                   # [B, H, T, 32] float32
    row_sum = p.sum(dim=-1)                                                # unquantized P
    p_q = numerics.qdq_p(p.view(batch, heads, -1), call.p_qdq, call.p_amax,
                         numerics.decode_value_dtype(cache.dtype, q.dtype), dim=-1)

    # Per split i: M_i = its final running max (the maximum is monotone within a split),
    # l_i = sum_t exp(m_t - M_i) * row_sum_t, acc_i = sum_t exp(m_t - M_i) * P_q,t · V_t, and
    # lse_i = M_i + log(l_i). The LSE merge o = sum_i exp(lse_i - lse) * acc_i / l_i is linear in
    # the acc_i, so it runs as one P·V product with per-tile weights exp(m_t - M_i) * exp(lse_i - lse) / l_i.
    index = split_of_tile[:, None, :].expand(batch, heads, num_tiles)
    split_max = torch.full((batch, heads, splits + 1), _NEG_INF, dtype=torch.float32, device=device)
    split_max = split_max.scatter_reduce(2, index, m, reduce="amax")
    m_final = split_max.gather(2, index)
    rescale = torch.where(m == _NEG_INF, 0.0, torch.exp(m - torch.where(m_final == _NEG_INF, 0.0, m_final)))
    split_sum = torch.zeros(batch, heads, splits + 1, dtype=torch.float32, device=device)
    split_sum = split_sum.scatter_add(2, index, rescale * row_sum)
    split_lse = (split_max + torch.log(split_sum))[..., :splits]           # empty splits: -inf
    lse = torch.logsumexp(split_lse, dim=-1)                               # all -inf stays -inf
    lse_safe = torch.where(lse == _NEG_INF, 0.0, lse)
    split_weight = torch.where(split_sum[..., :splits] > 0,
                               torch.exp(split_lse - lse_safe[..., None]) / split_sum[..., :splits], 0.0)
    split_weight = torch.nn.functional.pad(split_weight, (0, 1))           # the discarded split weighs 0
    tile_weight = rescale * split_weight.gather(2, index)
    weighted_p = (p_q.view(batch, heads, num_tiles, tile) * tile_weight[..., None]).view(batch, heads, -1)
    out = torch.bmm(weighted_p[..., :max_len], v)                          # [B, H, 512]
    return out, lse
