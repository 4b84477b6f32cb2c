"""Launcher of the CUDA FP8 top-k sparse decode (csrc/mla_sparse_wgmma.cu): buffers, split count, configs.

It serves :func:`mla_core.sparse_mla_fp8_decode` on MATE's 576-byte rows (FP8 query and cache, per-tensor scales in
``bmm1_scale`` / ``bmm2_scale``) and on FlashMLA's / vLLM's 656-byte fp8_ds_mla rows (bf16 query, four float32
block scales per row) for heads a multiple of 64 (one CTA per 64 heads); the musa_fp8 and reference backends run
the other head counts. Numerics: docs/sparse.md (Q·K of exact bf16 products on tensor cores with float32
accumulation, 656-byte rows' block scales outside the dot, exact softmax in float32, P rounded to bf16 for P·V,
times the block scale first on 656-byte rows).
"""
from __future__ import annotations

import math

import torch

from mla_core.specs import KV_LAYOUT_DS_MLA, KV_LAYOUT_FP8, SPARSE_LATENT, SparseDecodeCall, sm_count

from .launch_args import aligned

HEADS_PER_CTA = 64
TILE = 64
"""Slots per tile: a split is a run of whole tiles."""
MAX_SPLITS = 32
SPLIT_CHOICES = (1, 2, 4, 8)
"""Split counts the tuner may time beside the default (``{}``: chosen from the SM count at launch)."""


def configs(problem) -> list[dict]:
    """The default (``{}``: the split count from the SM count) first, then fixed split counts for the tuner."""
    return [{}] + [{"num_splits": s} for s in SPLIT_CHOICES]


def num_splits_for(tokens: int, heads: int, top_k: int, sms: int, config: dict) -> int:
    """The config's split count, else the largest power of two that keeps the CTAs within one wave (at least 1,
    at most one split per tile and ``MAX_SPLITS``): one CTA per SM, so a second wave costs a whole CTA time."""
    tiles = -(-top_k // TILE)
    if "num_splits" in config:
        return max(1, min(int(config["num_splits"]), tiles, MAX_SPLITS))
    ctas = tokens * (heads // HEADS_PER_CTA)
    splits = 1
    while splits * 2 <= min(tiles, MAX_SPLITS) and ctas * splits * 2 <= sms:
        splits *= 2
    return splits


def run(module, call: SparseDecodeCall, config: dict):
    """Sparse decode with the built extension ``module``.

    Returns ``(out [batch, q_len, heads, 512] bf16, lse [batch, q_len, heads] float32)``, written into the call's
    ``out`` / ``lse`` when given (LSE as a [batch, q_len, heads] view of the caller's buffer). A query or cache
    whose data does not start 16-byte aligned (a view at an odd offset) is copied first (cp.async and 16-byte loads).
    """
    query, kv, idx = call.query, call.kv_cache, call.indices
    batch, q_len, heads, _ = query.shape
    if call.kv_layout not in (KV_LAYOUT_FP8, KV_LAYOUT_DS_MLA) or heads % HEADS_PER_CTA:
        raise ValueError(f"cuda sparse_decode: needs 576- or 656-byte rows and heads a multiple of {HEADS_PER_CTA} "
                         f"(got kv_layout {call.kv_layout}, {heads} heads)")
    device = query.device
    out = call.out if call.out is not None else torch.empty(batch, q_len, heads, SPARSE_LATENT, dtype=torch.bfloat16,
                                                            device=device)
    lse = (call.lse.view(batch, q_len, heads) if call.lse is not None
           else torch.empty(batch, q_len, heads, dtype=torch.float32, device=device))
    tokens = batch * q_len
    if tokens == 0:
        return out, lse
    top_k = idx.shape[-1]
    splits = num_splits_for(tokens, heads, top_k, sm_count(device), config)
    if splits > 1:
        part_o = torch.empty(tokens * splits * heads * SPARSE_LATENT, dtype=torch.float32, device=device)
        part_lse = torch.empty(tokens * splits * heads, dtype=torch.float32, device=device)
    else:
        part_o = part_lse = None
    dst = out if out.data_ptr() % 4 == 0 else torch.empty_like(out)  # bf16 pairs are stored as 4-byte words
    module.sparse_decode_wgmma(aligned(query, 16), aligned(kv, 16), idx, call.metadata.valid_lens, dst, lse,
                               part_o, part_lse, splits, call.bmm1_scale * math.log2(math.e), call.bmm2_scale)
    if dst is not out:
        out.copy_(dst)
    return out, lse
