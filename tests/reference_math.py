"""Independent float64 math for the reference backend's tests: naive loops, one request and one head at a time.

Written from docs/numerics.md and docs/decisions.md, not from the backend: it has its own tile and
split schedule and its own masking; it takes only the QDQ rounding functions from
``mla_core.numerics`` (tested on their own). QDQ results (float32) are upcast to float64.
"""
from __future__ import annotations

import math

import torch

from mla_core import numerics

NEG_INF = float("-inf")


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; inf when out holds a NaN; 0 when both are all zero."""
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return math.inf
    den = ref.norm().item()
    num = (out - ref).norm().item()
    return num if den == 0 else num / den


def same_lse(lse: torch.Tensor, ref: torch.Tensor, tol: float) -> bool:
    """Both -inf at the same places, and the finite entries within ``tol`` absolute (LSEs are O(1..10))."""
    lse, ref = lse.double(), ref.double()
    if torch.isnan(lse).any():
        return False
    ref_empty = ref == NEG_INF
    if not torch.equal(lse == NEG_INF, ref_empty):
        return False
    if ref_empty.all():
        return True
    return (lse[~ref_empty] - ref[~ref_empty]).abs().max().item() < tol


def _quant_p(p: torch.Tensor, fmt, amax: float, v_dtype: torch.dtype) -> torch.Tensor:
    """P of one tile (first key at a multiple of 16) as it enters P·V, float64."""
    return numerics.qdq_p(p, fmt, amax, v_dtype, dim=-1).double()


def _lse_merge(parts: list[tuple[torch.Tensor, float]], dim: int) -> tuple[torch.Tensor, float]:
    """Merge (normalized output, lse) pairs by log-sum-exp; none -> (0, -inf)."""
    if not parts:
        return torch.zeros(dim, dtype=torch.float64), NEG_INF
    top = max(lse for _, lse in parts)
    lse = top + math.log(sum(math.exp(x - top) for _, x in parts))
    out = torch.zeros(dim, dtype=torch.float64)
    for o, x in parts:
        out += math.exp(x - lse) * o
    return out, lse


def _online_softmax(scores: torch.Tensor, v: torch.Tensor, lo: int, hi: int, tile: int, p_fmt, p_amax: float,
                    v_dtype: torch.dtype) -> tuple[torch.Tensor, float] | None:
    """Online softmax over keys [lo, hi) of one row in tiles of ``tile`` keys starting at ``lo``.

    scores [n] float64 (-inf = masked); v [n, dv] float64 (already fake-quantized). Returns
    (acc / l, m + log l), or None when no key in the range is visible.
    """
    m, l = NEG_INF, 0.0
    acc = torch.zeros(v.shape[1], dtype=torch.float64)
    for t0 in range(lo, hi, tile):
        t1 = min(t0 + tile, hi)
        s = scores[t0:t1]
        m_new = max(m, s.max().item())
        if m_new == NEG_INF:
            continue  # nothing visible yet: the tile contributes nothing
        alpha = math.exp(m - m_new) if m != NEG_INF else 0.0
        p = torch.exp(s - m_new)
        l = l * alpha + p.sum().item()
        acc = acc * alpha + _quant_p(p, p_fmt, p_amax, v_dtype) @ v[t0:t1]
        m = m_new
    if m == NEG_INF:
        return None
    return acc / l, m + math.log(l)


# --------------------------------------------------------------------------------------------------
# decode


def decode_request_rows(latent_cache: torch.Tensor, block_table_row: torch.Tensor, length: int) -> torch.Tensor:
    """The ``length`` cache rows of one request, token by token through its block table: [length, dim]."""
    page_size = latent_cache.shape[1]
    rows = [latent_cache[int(block_table_row[pos // page_size]), pos % page_size] for pos in range(length)]
    if not rows:
        return latent_cache.new_zeros(0, latent_cache.shape[2])
    return torch.stack(rows)


def decode_math(q, latent_cache, block_table, seq_lens, *, softmax_scale, kv_lora_rank, num_kv_splits,
                k_qdq=None, k_amax=None, v_qdq=None, v_amax=None, p_qdq=None, p_amax=1.0):
    """Float64 decode: returns (out [batch, heads, kv_lora_rank], lse [batch, heads]) float64.

    Per request: K = the rows, fake-quantized along features; V = the first kv_lora_rank values,
    along tokens over the whole request. Per head: 32-key tiles, ``ceil(ceil(L/32) / splits)`` tiles
    per split, the running max restarted per split, splits merged by log-sum-exp.
    """
    batch, heads = q.shape[0], q.shape[1]
    tile = 32
    out = torch.zeros(batch, heads, kv_lora_rank, dtype=torch.float64)
    lse = torch.full((batch, heads), NEG_INF, dtype=torch.float64)
    for b in range(batch):
        length = int(seq_lens[b])
        rows = decode_request_rows(latent_cache, block_table[b], length)
        k = numerics.qdq(rows, k_qdq, k_amax, dim=-1).double()
        v = numerics.qdq(rows[:, :kv_lora_rank], v_qdq, v_amax, dim=0).double()
        num_tiles = -(-length // tile)
        tiles_per_split = -(-num_tiles // num_kv_splits)
        for h in range(heads):
            scores = (k @ q[b, h].double()) * softmax_scale
            parts = []
            for i in range(num_kv_splits):
                lo = i * tiles_per_split * tile
                hi = min((i + 1) * tiles_per_split * tile, length)
                if lo >= hi:
                    continue
                part = _online_softmax(scores, v, lo, hi, tile, p_qdq, p_amax, latent_cache.dtype)
                parts.append(part)
            out[b, h], lse[b, h] = _lse_merge(parts, kv_lora_rank)
    return out, lse


# --------------------------------------------------------------------------------------------------
# prefill


def _nm_kept(scores: list[float], n: int, m: int) -> list[bool]:
    """Per key: among the n largest of its group of m (groups at j // m; ties: lower index)."""
    kept = [False] * len(scores)
    for g0 in range(0, len(scores), m):
        members = list(range(g0, min(g0 + m, len(scores))))
        # sort by score descending, then index ascending
        ranked = sorted(members, key=lambda j: (-scores[j], j))
        for j in ranked[:n]:
            kept[j] = True
    return kept


def prefill_math(q, k, v, cu_seqlens_q, cu_seqlens_k, *, softmax_scale, causal, q_quant=None, k_quant=None,
                 p_quant=None, v_quant=None, q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0,
                 sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_n=64):
    """Float64 prefill: returns (out [total_q, heads, v_dim], lse [heads, total_q]) float64.

    Per sequence, head and query row: scores over the sequence's keys, causal mask (query i sees keys
    j <= i + len_k - len_q), N:M selection plus dense keys, then an online softmax in ``block_n``-key
    P tiles from the sequence's first key.
    """
    total_q, heads, _ = q.shape
    kv_heads, v_dim = k.shape[1], v.shape[2]
    group = heads // kv_heads
    qq = numerics.qdq(q, q_quant, q_amax, dim=-1).double()
    kq = numerics.qdq(k, k_quant, k_amax, dim=-1).double()
    out = torch.zeros(total_q, heads, v_dim, dtype=torch.float64)
    lse = torch.full((heads, total_q), NEG_INF, dtype=torch.float64)
    cu_q, cu_k = [int(x) for x in cu_seqlens_q], [int(x) for x in cu_seqlens_k]
    sparse = 0 < sparsity_n < sparsity_m
    for b in range(len(cu_q) - 1):
        q0, k0 = cu_q[b], cu_k[b]
        len_q, len_k = cu_q[b + 1] - q0, cu_k[b + 1] - k0
        if len_q == 0 or len_k == 0:
            continue
        vq = numerics.qdq(v[k0:k0 + len_k], v_quant, v_amax, dim=0).double()   # [len_k, kv_heads, v_dim]
        for h in range(heads):
            kvh = h // group
            keys, values = kq[k0:k0 + len_k, kvh], vq[:, kvh]
            for i in range(len_q):
                q_pos = i + len_k - len_q
                scores = ((keys @ qq[q0 + i, h]) * softmax_scale).tolist()
                if causal:
                    scores = [s if j <= q_pos else NEG_INF for j, s in enumerate(scores)]
                if sparse:
                    kept = _nm_kept(scores, sparsity_n, sparsity_m)
                    for j in range(len_k):
                        dense = (len_q == 1 or j < dense_sink_tokens or 0 <= q_pos - j < dense_recent_tokens)
                        if not (kept[j] or dense):
                            scores[j] = NEG_INF
                part = _online_softmax(torch.tensor(scores, dtype=torch.float64), values, 0, len_k, block_n,
                                       p_quant, p_amax, v.dtype)
                if part is not None:
                    out[q0 + i, h], lse[h, q0 + i] = part
    return out, lse


# --------------------------------------------------------------------------------------------------
# merge


def merge_math(prefix_output, prefix_lse, suffix_output, suffix_lse):
    """Float64 LSE merge, element by element over (token, head); an LSE of +inf or -inf is an empty state
    (FlashAttention / FlashMLA / vLLM report an empty row as +inf); both empty -> (0, -inf)."""
    tokens, heads, dim = prefix_output.shape
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    lse = torch.full((heads, tokens), NEG_INF, dtype=torch.float64)
    for t in range(tokens):
        for h in range(heads):
            a, b = (NEG_INF if x == math.inf else x for x in (float(prefix_lse[h, t]), float(suffix_lse[h, t])))
            top = max(a, b)
            if top == NEG_INF:
                continue
            total = top + math.log(math.exp(a - top) + math.exp(b - top))
            out[t, h] = (math.exp(a - total) * prefix_output[t, h].double()
                         + math.exp(b - total) * suffix_output[t, h].double())
            lse[h, t] = total
    return out, lse
