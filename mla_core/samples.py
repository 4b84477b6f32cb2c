"""Random, valid inputs for every op: used by ``mla-core demo``, ``mla-core check``, the autotuner and tests.

Each builder returns a dict of keyword arguments for the public op. Inputs are random normal values
(never zeros); cache pages no request reaches and block-table entries past each length hold poison
(NaN pages, out-of-range page indices) so a kernel that reads outside what it should fails loudly.
"""
from __future__ import annotations

import torch

from . import specs


def _gen(seed: int, device) -> torch.Generator:
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _randn(shape, g, dtype, device, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)


def decode_inputs(lengths, heads=16, page_size=64, kv_lora_rank=512, rope_dim=64, dtype=torch.bfloat16,
                  q_dtype=None, device="cpu", seed=0, spare_pages=2) -> dict:
    """Arguments of :func:`mla_core.mla_decode` for requests of the given KV ``lengths``.

    Pages are shuffled across the cache; ``spare_pages`` extra pages and the slots past each length on
    a request's last page are NaN, and every block-table entry past a request's last page is an
    out-of-range index.
    """
    g = _gen(seed, device)
    batch, dim = len(lengths), kv_lora_rank + rope_dim
    pages_per_req = [-(-int(n) // page_size) for n in lengths]
    max_pages = max([1] + pages_per_req)
    used = sum(pages_per_req)
    num_pages = used + spare_pages
    cache = _randn((num_pages, page_size, dim), g, dtype, device)
    perm = torch.randperm(num_pages, generator=g)
    spare = perm[used:]
    cache[spare.to(device)] = float("nan")
    table = torch.full((batch, max_pages), num_pages + 1000, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_per_req):
        table[b, :n] = perm[start:start + n].to(torch.int32)
        start += n
        tail = int(lengths[b]) - (n - 1) * page_size  # tokens on the request's last page
        if n and tail < page_size:
            cache[int(table[b, n - 1]), tail:] = float("nan")
    q = _randn((batch, heads, dim), g, q_dtype or dtype, device)
    return dict(q=q, latent_cache=cache, block_table=table.to(device),
                b_seq_len=torch.tensor(list(lengths), dtype=torch.int32, device=device),
                softmax_scale=(128 + rope_dim) ** -0.5, kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim)


def prefill_inputs(q_lens, k_lens=None, heads=16, kv_heads=None, qk_dim=192, v_dim=128, dtype=torch.bfloat16,
                   device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.mla_prefill` for a varlen batch (``k_lens`` default: ``q_lens``)."""
    g = _gen(seed, device)
    k_lens = list(q_lens) if k_lens is None else list(k_lens)
    kv_heads = heads if kv_heads is None else kv_heads
    tq, tk = sum(q_lens), sum(k_lens)
    cu_q = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(k_lens).cumsum(0).tolist()), dtype=torch.int32, device=device)
    return dict(q=_randn((tq, heads, qk_dim), g, dtype, device), k=_randn((tk, kv_heads, qk_dim), g, dtype, device),
                v=_randn((tk, kv_heads, v_dim), g, dtype, device), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                max_seqlen_q=max([0] + list(q_lens)))


def merge_inputs(tokens, heads=16, head_dim=512, dtype=torch.bfloat16, device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.merge_attn_states` (a few rows have one or both LSEs at -inf)."""
    g = _gen(seed, device)
    lse_a = torch.randn((heads, tokens), generator=g) * 3
    lse_b = torch.randn((heads, tokens), generator=g) * 3
    if tokens:
        lse_a[:, 0] = float("-inf")
        lse_b[0, -1] = float("-inf")
        lse_a[0, -1] = float("-inf")
    return dict(prefix_output=_randn((tokens, heads, head_dim), g, dtype, device), prefix_lse=lse_a.to(device),
                suffix_output=_randn((tokens, heads, head_dim), g, dtype, device), suffix_lse=lse_b.to(device))


def rope_inputs(nnz, heads=16, rope_dim=64, nope_dim=512, max_pos=4096, dtype=torch.bfloat16,
                cos_dtype=torch.float32, device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.mla_rope_quantize_fp8` with a real cos/sin cache (base 10000)."""
    g = _gen(seed, device)
    half = rope_dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64) / half))
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cache = torch.cat([ang.cos(), ang.sin()], dim=1).to(cos_dtype).to(device)
    return dict(q_rope=_randn((nnz, heads, rope_dim), g, dtype, device), k_rope=_randn((nnz, rope_dim), g, dtype, device),
                q_nope=_randn((nnz, heads, nope_dim), g, dtype, device), k_nope=_randn((nnz, nope_dim), g, dtype, device),
                cos_sin_cache=cache, pos_ids=torch.randint(0, max_pos, (nnz,), generator=g).to(device))


def sparse_decode_inputs(batch, q_len=1, heads=16, top_k=64, num_pages=8, page_size=64, seq_lens=None,
                         device="cpu", seed=0) -> dict:
    """Arguments of :func:`mla_core.sparse_mla_fp8_decode` (some slots -1, garbage past each ``seq_lens``)."""
    g = _gen(seed, device)
    full = specs.SPARSE_LATENT + specs.SPARSE_ROPE
    rows = num_pages * page_size
    fp8 = specs.FP8
    query = (torch.randn((batch, q_len, heads, full), generator=g)).to(fp8).to(device)
    cache = (torch.randn((num_pages, page_size, full), generator=g)).to(fp8).to(device)
    idx = torch.randint(0, rows, (batch, q_len, top_k), generator=g, dtype=torch.int64).to(torch.int32)
    idx[..., ::7] = -1
    if seq_lens is None:
        seq_lens = [top_k - (b * 13) % top_k for b in range(batch)]
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    past = torch.arange(top_k)[None, None, :] >= lens[:, None, None]
    idx[past.expand_as(idx)] = rows + 12345
    return dict(query=query, kv_cache=cache, workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512,
                qk_rope_head_dim=64, block_tables=idx.to(device), seq_lens=lens.to(device), max_seq_len=rows,
                sparse_mla_top_k=top_k, bmm1_scale=full ** -0.5, bmm2_scale=1.0)
