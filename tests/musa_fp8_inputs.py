"""Sparse-decode inputs shared by the musa_fp8 and compat tests (no tests here): both row layouts, poisoned."""
import torch

from mla_core import layouts

FP8 = torch.float8_e4m3fn
LATENT, WIDTH = 512, 576


def sparse_inputs(batch, q_len, heads, top_k, lengths, *, layout="fp8", pages=6, page_size=16, seed=0,
                  four_d=False, device="cpu", minus_one=0.15):
    """``dict(query, kv_cache, indices, seq_lens, rows)``.

    Slots below ``lengths[b]`` hold cache rows or -1 (about ``minus_one`` of them); the slot at
    ``lengths[b]`` names the last cache row (never valid: a stale index), the slots after it garbage (huge and
    negative indices). Cache rows no valid slot names are all-0xFF bytes (NaN codes, NaN
    scales, NaN bf16 RoPE), so reading one shows up as a NaN. ``layout`` "fp8": FP8 query and 576-value
    rows; "fp8_ds_mla": bf16 query and 656-byte rows with per-block scales spread over 1e-2..1e2.
    """
    g = torch.Generator().manual_seed(seed)
    rows = pages * page_size
    # the last row is never selected by a valid slot: the slot just past each length names it (a stale index)
    indices = torch.randint(0, rows - 1, (batch, q_len, top_k), generator=g, dtype=torch.int32)
    indices[torch.rand(indices.shape, generator=g) < minus_one] = -1
    for b, n in enumerate(lengths):
        indices[b, :, n:] = 2 ** 31 - 1
        indices[b, :, n + 1::3] = -7
        indices[b, :, n:n + 1] = rows - 1
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    used = torch.zeros(rows, dtype=torch.bool)
    for b, n in enumerate(lengths):
        sel = indices[b, :, :n]
        used[sel[sel >= 0].long()] = True
    if layout == "fp8":
        query = (torch.randn(batch, q_len, heads, WIDTH, generator=g) * 0.5).to(FP8)
        flat = torch.randn(rows, WIDTH, generator=g).to(FP8).view(torch.uint8)
    else:
        query = torch.randn(batch, q_len, heads, WIDTH, generator=g).to(torch.bfloat16)
        block_scale = 10.0 ** (torch.rand(rows, 4, generator=g) * 4 - 2)
        latent = torch.randn(rows, WIDTH, generator=g)
        latent[:, :LATENT] *= block_scale.repeat_interleave(128, dim=1)
        flat = layouts.pack_fp8_ds_mla(latent)
    flat[~used] = 0xFF
    cache = flat.view(pages, page_size, -1)
    if layout == "fp8":
        cache = cache.view(FP8)
    if four_d:
        cache = cache.view(pages, 1, page_size, cache.shape[-1])
    return dict(query=query.to(device), kv_cache=cache.to(device), indices=indices.to(device),
                seq_lens=seq_lens.to(device), rows=rows, top_k=top_k)


def run_sparse(case, backend, seq_lens="given", **kw):
    """``sparse_mla_fp8_decode`` on a case from :func:`sparse_inputs` (``seq_lens=None`` reads every slot)."""
    import mla_core
    lens = case["seq_lens"] if isinstance(seq_lens, str) else seq_lens
    return mla_core.sparse_mla_fp8_decode(case["query"], case["kv_cache"], None, 128, 512, 64, case["indices"], lens,
                                          0, case["top_k"], backend=backend, **kw)
