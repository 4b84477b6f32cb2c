"""Reference prefill: the executable definition of varlen MLA prefill numerics (docs/numerics.md).

Per sequence (``len_q`` queries, the suffix of ``len_k`` keys when causal), per head h on kv head
``h // (heads // kv_heads)``:

- Q and K fake-quantized along features, V along keys (NVFP4 blocks of 16 from the sequence's first key);
- ``s = (q · k) * softmax_scale`` in float32; causal: query i sees keys ``j <= i + len_k - len_q``;
- N:M sparsity after the causal mask (docs/decisions.md): per group of M keys keep the N largest
  scores (ties: lower index) or the dense ones (len_q == 1, sinks, recent keys);
- keys in P tiles of ``block_n`` from the sequence's first key; the running maximum is updated once
  per tile; ``P = exp(s - m_tile)``; the row sum uses the float32 P, P·V uses ``qdq_p(P)``.

A row with no visible key gives output 0 and LSE -inf. Vectorized over heads and query rows;
sequences are a Python loop and long ones are cut into query-row chunks to bound memory.
float32 matmuls are meant as IEEE float32: on CUDA this assumes TF32 is off (torch's default).
"""
from __future__ import annotations

import torch

from mla_core import numerics, specs

_NEG_INF = float("-inf")
_CHUNK_ELEMENTS = 1 << 26
"""Scores held at once (heads x rows x keys): rows are independent, so chunking changes nothing numerically."""


def _nm_keep(s: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """Whether each score is among the ``n`` largest of its group of ``m`` keys (ties: lower index).

    s [..., len_k] float32 (masked scores -inf); groups at key positions ``j // m``. Returns bool, s's shape.
    """
    len_k = s.shape[-1]
    groups = -(-len_k // m)
    padded = torch.nn.functional.pad(s, (0, groups * m - len_k), value=_NEG_INF)
    g = padded.view(*s.shape[:-1], groups, m)
    rank = torch.zeros(g.shape, dtype=torch.int32, device=s.device)
    pos = torch.arange(m, device=s.device)
    for a in range(m):
        other = g[..., a:a + 1]
        # key a ranks before key j when it is larger, or equal and earlier
        rank += ((other > g) | ((other == g) & (a < pos))).to(torch.int32)
    return (rank < n).view(*s.shape[:-1], groups * m)[..., :len_k]


def _attend_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor, call: specs.PrefillCall,
                 len_q: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of a chunk of query rows over one sequence's keys.

    q [kv_heads, group * rows, qk_dim] (fake-quantized, float32, head h = kv_head * group + g);
    k [kv_heads, len_k, qk_dim]; v [kv_heads, len_k, v_dim] (both fake-quantized float32);
    q_pos [rows] int64 absolute query positions. Returns (out [heads, rows, v_dim], lse [heads, rows]) float32.
    """
    kv_heads, len_k = k.shape[0], k.shape[1]
    rows = q_pos.shape[0]
    heads = q.shape[0] * q.shape[1] // rows
    device = q.device
    s = (torch.bmm(q, k.transpose(1, 2)) * call.softmax_scale).view(heads, rows, len_k)
    kv_pos = torch.arange(len_k, device=device)
    delta = q_pos[:, None] - kv_pos[None, :]                               # q_pos - kv_pos, [rows, len_k]
    if call.causal:
        s = torch.where(delta >= 0, s, _NEG_INF)
    if 0 < call.sparsity_n < call.sparsity_m:
        dense = (kv_pos[None, :] < call.dense_sink_tokens) | ((delta >= 0) & (delta < call.dense_recent_tokens))
        if len_q == 1:
            dense = torch.ones_like(dense)
        keep = _nm_keep(s, call.sparsity_n, call.sparsity_m) | dense
        s = torch.where(keep, s, _NEG_INF)

    # P tiles of block_n keys from the sequence's first key; the padded tail scores -inf (P = 0).
    tile = call.block_n
    num_tiles = -(-len_k // tile)
    s = torch.nn.functional.pad(s, (0, num_tiles * tile - len_k), value=_NEG_INF).view(heads, rows, num_tiles, tile)
    m = torch.cummax(s.amax(dim=-1), dim=-1).values                        # running max after each tile
    m_safe = torch.where(m == _NEG_INF, 0.0, m)                            # no visible key yet: P = 0
    p = torch.exp(s - m_safe[..., None])
    row_sum = p.sum(dim=-1)                                                # unquantized P
    p_q = numerics.qdq_p(p.view(heads, rows, -1), call.p_quant, call.p_amax, call.v.dtype, dim=-1)

    # Online softmax: acc = sum_t exp(m_t - m_last) * P_q,t · V_t and l = sum_t exp(m_t - m_last) * row_sum_t;
    # the rescaling is linear, so it runs as one P·V product with per-tile weights exp(m_t - m_last) / l.
    m_last = m_safe[..., -1:]
    rescale = torch.where(m == _NEG_INF, 0.0, torch.exp(m - m_last))
    l = (rescale * row_sum).sum(dim=-1)                                    # [heads, rows]
    tile_weight = torch.where(l[..., None] > 0, rescale / l[..., None], 0.0)
    weighted_p = (p_q.view(heads, rows, num_tiles, tile) * tile_weight[..., None]).view(heads, rows, -1)
    weighted_p = weighted_p[..., :len_k].reshape(kv_heads, -1, len_k)
    out = torch.bmm(weighted_p, v).view(heads, rows, v.shape[2])
    lse = torch.where(l > 0, m[..., -1] + torch.log(l), _NEG_INF)
    return out, lse


def sequence_ranges(cu_seqlens: torch.Tensor, total: int) -> list[tuple[int, int]]:
    """``[start, end)`` rows of each sequence, clamped into ``0..total`` with ``end >= start``.

    Validation makes ``cu_seqlens`` the packed tensors' cumulative lengths; with content checks off they may
    not be, and every backend then uses these clamped ranges (a decreasing entry gives an empty sequence),
    so nothing reads or writes outside q / k / v / out (docs/decisions.md).
    """
    cu = cu_seqlens.tolist()
    ranges = []
    for a, b in zip(cu[:-1], cu[1:]):
        start = min(max(a, 0), total)
        ranges.append((start, min(max(b, start), total)))
    return ranges


def mla_prefill_reference(call: specs.PrefillCall) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Run one validated prefill call.

    Returns (out [total_q, heads, v_dim] in v.dtype, lse [heads, total_q] float32 natural log, or None
    when ``call.return_lse`` is False). Sequences take :func:`sequence_ranges`; query rows no range covers
    give output 0 and LSE -inf.
    """
    total_q, heads, qk_dim = call.q.shape
    kv_heads, v_dim = call.k.shape[1], call.v.shape[2]
    group = heads // kv_heads
    device = call.q.device
    q_all = numerics.qdq(call.q, call.q_quant, call.q_amax, dim=-1)      # [total_q, heads, qk_dim]
    k_all = numerics.qdq(call.k, call.k_quant, call.k_amax, dim=-1)      # [total_k, kv_heads, qk_dim]
    out = torch.zeros(total_q, heads, v_dim, dtype=torch.float32, device=device)
    lse = torch.full((heads, total_q), _NEG_INF, dtype=torch.float32, device=device)
    ranges_k = sequence_ranges(call.cu_seqlens_k, call.k.shape[0])
    for (q0, q1), (k0, k1) in zip(sequence_ranges(call.cu_seqlens_q, total_q), ranges_k):
        len_q, len_k = q1 - q0, k1 - k0
        if len_q == 0 or len_k == 0:
            continue
        k = k_all[k0:k1].transpose(0, 1)                                   # [kv_heads, len_k, qk_dim]
        v = numerics.qdq(call.v[k0:k1], call.v_quant, call.v_amax, dim=0).transpose(0, 1)
        chunk = max(1, _CHUNK_ELEMENTS // (heads * len_k))
        for r0 in range(0, len_q, chunk):
            r1 = min(len_q, r0 + chunk)
            # [rows, heads, d] -> [kv_heads, group * rows, d], head h = kv_head * group + g
            q = q_all[q0 + r0:q0 + r1].permute(1, 0, 2).reshape(kv_heads, group * (r1 - r0), qk_dim)
            q_pos = torch.arange(r0, r1, device=device) + (len_k - len_q)
            o, l = _attend_rows(q, k, v, q_pos, call, len_q)
            out[q0 + r0:q0 + r1] = o.transpose(0, 1)
            lse[:, q0 + r0:q0 + r1] = l
    return out.to(call.v.dtype), (lse if call.return_lse else None)
