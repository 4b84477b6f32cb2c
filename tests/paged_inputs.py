"""Paged-cache decode inputs shared by the decode tests of every backend."""
import torch


def paged_decode_inputs(lengths, heads, dim, page_size, dtype=torch.float32, q_dtype=None, seed=0, device="cpu"):
    """``[q [B, H, dim], cache [pages, page_size, dim], block_table [B, width], seq_lens [B]]``.

    Each request sits on its own shuffled pages. Cache rows no request reaches (the tail of each last
    page, two spare pages) hold NaN, and block-table entries past ceil(L / page_size) hold garbage
    (huge and negative page indices), so reading any of them shows up as a NaN or an index error.
    """
    g = torch.Generator().manual_seed(seed)
    pages_each = [-(-n // page_size) for n in lengths]
    width = max(pages_each + [0]) + 2
    num_pages = sum(pages_each) + 2
    cache = torch.full((num_pages, page_size, dim), float("nan"))
    order = torch.randperm(num_pages, generator=g)
    table = torch.empty(len(lengths), width, dtype=torch.int32)
    table[:, 0::2] = 2 ** 30
    table[:, 1::2] = -3
    used = 0
    for b, (n, pages) in enumerate(zip(lengths, pages_each)):
        ids = order[used:used + pages]
        used += pages
        table[b, :pages] = ids.to(torch.int32)
        for j, page in enumerate(ids.tolist()):
            rows = min(page_size, n - j * page_size)
            cache[page, :rows] = torch.randn(rows, dim, generator=g)
    q = torch.randn(len(lengths), heads, dim, generator=g).to(q_dtype or dtype)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    return [t.to(device) for t in (q, cache.to(dtype), table, seq_lens)]
