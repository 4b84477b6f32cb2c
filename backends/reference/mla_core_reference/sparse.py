"""Reference FP8 top-k sparse MLA decode (:func:`mla_core.sparse_mla_fp8_decode`).

Per query row: ``s = (q · k) * bmm1_scale`` over the selected cache rows (their float32 values: FP8
codes upcast for 576-byte rows; ``code * block scale`` and the bf16 RoPE values for fp8_ds_mla rows, as
:mod:`mla_core.layouts` unpacks them; the query upcast to float32), an exact float32 softmax over the
valid slots, ``out = softmax · V * bmm2_scale`` with V the
first 512 values of each row, cast to bf16; ``lse = logsumexp(s)`` (natural log). A slot is valid when
it is below the request's valid length, is not -1 and names a row inside the cache (anything else is
never read, as a kernel masks it). Duplicate indices are two keys. A row with no valid slot: 0 / -inf.
"""
from __future__ import annotations

import torch

from mla_core import layouts
from mla_core.specs import SPARSE_LATENT, SparseDecodeCall


def sparse_decode_reference(call: SparseDecodeCall):
    """Returns ``(out [batch, q_len, heads, 512] bf16, lse [batch, q_len, heads] float32)``.

    ``call.out`` / ``call.lse`` are written when given; a given lse in the [batch * q_len, heads]
    layout is returned as a [batch, q_len, heads] view of the same memory. No host synchronization: the
    valid lengths stay on the device (CUDA-graph capturable).
    """
    query, kv, idx = call.query, call.kv_cache, call.indices
    batch, q_len, heads, _ = query.shape
    top_k, rows = idx.shape[-1], kv.shape[0]
    out = call.out if call.out is not None else torch.empty(batch, q_len, heads, SPARSE_LATENT, dtype=torch.bfloat16,
                                                            device=query.device)
    lse = (call.lse.view(batch, q_len, heads) if call.lse is not None
           else torch.empty(batch, q_len, heads, dtype=torch.float32, device=query.device))
    slot = torch.arange(top_k, device=idx.device)
    valid_lens = call.metadata.valid_lens.to(idx.device)
    # One request at a time keeps the gathered float32 keys at q_len * top_k * 576 values.
    for b in range(batch):
        ib = idx[b].long()  # [q_len, top_k]
        valid = (slot[None, :] < valid_lens[b]) & (ib >= 0) & (ib < rows)
        if rows == 0:  # nothing can be valid, and an empty cache has no row to gather
            keys = torch.zeros(q_len, top_k, query.shape[-1], dtype=torch.float32, device=kv.device)
        else:
            # Invalid slots gather row 0 and are then zeroed: their values (NaN even) must not reach 0 * V.
            gathered = layouts.unpack(kv[torch.where(valid, ib, 0)])
            keys = torch.where(valid[..., None], gathered, 0.0)  # [q_len, top_k, 576]
        scores = torch.einsum("qhd,qkd->qhk", query[b].float(), keys) * call.bmm1_scale
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        m = scores.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isfinite(m), m, 0.0)  # all-masked rows: exp(-inf - 0) = 0, no NaN
        e = torch.exp(scores - m)
        total = e.sum(dim=-1, keepdim=True)
        p = e / torch.where(total > 0, total, 1.0)
        o = torch.einsum("qhk,qkd->qhd", p, keys[..., :SPARSE_LATENT]) * call.bmm2_scale
        out[b].copy_(o)
        lse[b].copy_((m + torch.log(total)).squeeze(-1))
    return out, lse
