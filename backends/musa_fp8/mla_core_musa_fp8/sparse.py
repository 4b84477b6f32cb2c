"""FP8 top-k sparse MLA decode (:func:`mla_core.sparse_mla_fp8_decode`) on both DeepSeek-V3.2 row layouts.

Stage 1 (``_sparse_split_kernel``), one program per (head group, split, query token): walks its share of
the token's valid index slots in tiles of ``block_n``, gathers those cache rows (a slot past the valid
length, -1, or outside the cache is masked: never read, score -inf), and runs ``S = q·Kᵀ`` and
``acc += P·V`` for ``block_h`` heads at once on tensor cores, with an online softmax in float32.
- 576-byte rows (FP8 query): Q and K are E4M3 codes, exact in bf16, so the bf16 dots are exact products
  with float32 accumulation; ``bmm1_scale`` multiplies the float32 scores.
- 656-byte fp8_ds_mla rows (bf16 query): the four 128-value blocks of the latent part each have a float32
  scale; the scale stays out of the dots (``s = sum_j scale_j * (q_j · codes_j) + q_rope · k_rope``, the
  codes exact in bf16) and enters P·V as ``(P * scale_j) · codes_j``. So scores are exact up to float32
  accumulation for any scale value.
P enters P·V rounded to bf16 (the row sum uses the float32 P): relative error <= 2^-9 per weight, inside
the bf16 output's own rounding; the reference keeps P in float32 (docs/sparse.md, "Numerics").
Splits (``num_splits``) divide the token's tiles; stage 2 (``_sparse_combine_kernel``) merges them by
log-sum-exp. With one split, stage 1 writes the output and LSE directly. A token with no valid slot gives
output 0 and LSE -inf.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mla_core.specs import KV_LAYOUT_DS_MLA, SPARSE_LATENT, SPARSE_ROPE, SparseDecodeCall, sm_count

from .fp8bits import bf16_out, e4m3_bits_to_dot, mma, to_dot_bf16

_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453


def _pow2(n: int) -> int:
    return max(1, triton.next_power_of_2(n))


def configs(problem) -> list[dict]:
    """Heads per program, keys per tile, warps and stages, most promising first (the first is the default).

    64 heads x 64 keys per tile is FlashMLA's sparse tiling (one gathered K tile feeds 64 heads). Measured on
    the H200 (benchmarks/NOTES.md): 64 x 64 at 8 warps / 2 stages is the fastest for 576-byte rows, 64 x 32 at
    one stage for 656-byte rows. Fewer heads per program for small head counts. ``num_splits`` is chosen at
    launch from the SM count unless the config names one.
    """
    heads = problem["heads"]
    top = min(64, max(16, _pow2(heads)))
    ranked = [(64, 64, 8, 2), (64, 32, 8, 1), (64, 32, 8, 2), (32, 64, 4, 2), (16, 64, 4, 2), (16, 32, 4, 2)]
    if problem.get("kv_layout") == KV_LAYOUT_DS_MLA:
        ranked.insert(0, ranked.pop(1))
    return [{"block_h": bh, "block_n": bn, "num_warps": w, "num_stages": st} for bh, bn, w, st in ranked if bh <= top]


@triton.jit
def _sparse_split_kernel(
        q_ptr, kv_codes, kv_scales, kv_rope, idx_ptr, valid_ptr, part_o, part_lse, out_ptr, lse_ptr,
        rows, heads, q_len, top_k, num_splits, s_codes, s_scales, s_rope, qk_scale, bmm2_scale,
        DS_MLA: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NOPE: tl.constexpr,
        ROPE: tl.constexpr, DIRECT: tl.constexpr, HW: tl.constexpr):
    """``qk_scale`` = bmm1_scale * log2(e): scores live in log2 units (exp2), LSE is converted back to natural log.

    kv_codes [rows, s_codes] uint8 (the first NOPE bytes are E4M3 latent codes; for 576-byte rows the next
    ROPE bytes are the RoPE codes); fp8_ds_mla: kv_scales [rows, s_scales] float32 view (scales at columns
    NOPE/4 ..), kv_rope [rows, s_rope] bf16 view (RoPE at columns (NOPE + 16) / 2 ..).
    """
    hg = tl.program_id(0)
    split = tl.program_id(1)
    tok = tl.program_id(2).to(tl.int64)
    b = tok // q_len
    valid = tl.minimum(tl.maximum(tl.load(valid_ptr + b), 0), top_k)
    tiles = tl.cdiv(valid, BLOCK_N)
    per_split = tl.cdiv(tiles, num_splits)
    lo = split * per_split * BLOCK_N
    hi = tl.minimum(lo + per_split * BLOCK_N, valid)

    h = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = h < heads
    q_row = q_ptr + (tok * heads + h) * (NOPE + ROPE)
    BLK: tl.constexpr = 128  # fp8_ds_mla scale block; the 576-byte path uses it only to split the loads
    c = tl.arange(0, BLK)
    r = tl.arange(0, ROPE)
    if DS_MLA:
        q0 = tl.load(q_row[:, None] + c[None, :], mask=hmask[:, None], other=0.0)
        q1 = tl.load(q_row[:, None] + BLK + c[None, :], mask=hmask[:, None], other=0.0)
        q2 = tl.load(q_row[:, None] + 2 * BLK + c[None, :], mask=hmask[:, None], other=0.0)
        q3 = tl.load(q_row[:, None] + 3 * BLK + c[None, :], mask=hmask[:, None], other=0.0)
        qr = tl.load(q_row[:, None] + NOPE + r[None, :], mask=hmask[:, None], other=0.0)
        if not HW:  # the interpreter's bf16 dot multiplies raw bits: exact float32 instead
            q0, q1, q2, q3, qr = q0.to(tl.float32), q1.to(tl.float32), q2.to(tl.float32), q3.to(tl.float32), \
                qr.to(tl.float32)
    else:
        q0 = e4m3_bits_to_dot(tl.load(q_row[:, None] + c[None, :], mask=hmask[:, None], other=0), HW)
        q1 = e4m3_bits_to_dot(tl.load(q_row[:, None] + BLK + c[None, :], mask=hmask[:, None], other=0), HW)
        q2 = e4m3_bits_to_dot(tl.load(q_row[:, None] + 2 * BLK + c[None, :], mask=hmask[:, None], other=0), HW)
        q3 = e4m3_bits_to_dot(tl.load(q_row[:, None] + 3 * BLK + c[None, :], mask=hmask[:, None], other=0), HW)
        qr = e4m3_bits_to_dot(tl.load(q_row[:, None] + NOPE + r[None, :], mask=hmask[:, None], other=0), HW)

    m = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc0 = tl.zeros((BLOCK_H, BLK), tl.float32)
    acc1 = tl.zeros((BLOCK_H, BLK), tl.float32)
    acc2 = tl.zeros((BLOCK_H, BLK), tl.float32)
    acc3 = tl.zeros((BLOCK_H, BLK), tl.float32)
    n = tl.arange(0, BLOCK_N)
    idx_row = idx_ptr + tok * top_k
    for start in range(lo, hi, BLOCK_N):
        slot = start + n
        in_len = slot < hi
        idx = tl.load(idx_row + slot, mask=in_len, other=-1)
        kmask = in_len & (idx >= 0) & (idx < rows)
        key = tl.where(kmask, idx, 0).to(tl.int64)
        krow = kv_codes + key * s_codes
        km = kmask[:, None]
        k0 = e4m3_bits_to_dot(tl.load(krow[:, None] + c[None, :], mask=km, other=0), HW)
        k1 = e4m3_bits_to_dot(tl.load(krow[:, None] + BLK + c[None, :], mask=km, other=0), HW)
        k2 = e4m3_bits_to_dot(tl.load(krow[:, None] + 2 * BLK + c[None, :], mask=km, other=0), HW)
        k3 = e4m3_bits_to_dot(tl.load(krow[:, None] + 3 * BLK + c[None, :], mask=km, other=0), HW)
        zero = tl.zeros((BLOCK_H, BLOCK_N), tl.float32)
        if DS_MLA:
            srow = kv_scales + key * s_scales + NOPE // 4
            sc0 = tl.load(srow, mask=kmask, other=0.0)
            sc1 = tl.load(srow + 1, mask=kmask, other=0.0)
            sc2 = tl.load(srow + 2, mask=kmask, other=0.0)
            sc3 = tl.load(srow + 3, mask=kmask, other=0.0)
            kr = tl.load(kv_rope + key[:, None] * s_rope + (NOPE + 16) // 2 + r[None, :], mask=km, other=0.0)
            if not HW:
                kr = kr.to(tl.float32)
            s = mma(qr, tl.trans(kr), zero, HW)
            s += mma(q0, tl.trans(k0), zero, HW) * sc0[None, :]
            s += mma(q1, tl.trans(k1), zero, HW) * sc1[None, :]
            s += mma(q2, tl.trans(k2), zero, HW) * sc2[None, :]
            s += mma(q3, tl.trans(k3), zero, HW) * sc3[None, :]
        else:
            kr = e4m3_bits_to_dot(tl.load(krow[:, None] + NOPE + r[None, :], mask=km, other=0), HW)
            s = mma(q0, tl.trans(k0), zero, HW)
            s = mma(q1, tl.trans(k1), s, HW)
            s = mma(q2, tl.trans(k2), s, HW)
            s = mma(q3, tl.trans(k3), s, HW)
            s = mma(qr, tl.trans(kr), s, HW)
        s = tl.where(kmask[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: nothing to subtract (no -inf - -inf)
        alpha = tl.exp2(m - m_use)
        p = tl.exp2(s - m_use[:, None])
        l = l * alpha + tl.sum(p, axis=1)
        m = m_new
        a = alpha[:, None]
        if DS_MLA:
            acc0 = mma(to_dot_bf16(p * sc0[None, :], HW), k0, acc0 * a, HW)
            acc1 = mma(to_dot_bf16(p * sc1[None, :], HW), k1, acc1 * a, HW)
            acc2 = mma(to_dot_bf16(p * sc2[None, :], HW), k2, acc2 * a, HW)
            acc3 = mma(to_dot_bf16(p * sc3[None, :], HW), k3, acc3 * a, HW)
        else:
            pb = to_dot_bf16(p, HW)
            acc0 = mma(pb, k0, acc0 * a, HW)
            acc1 = mma(pb, k1, acc1 * a, HW)
            acc2 = mma(pb, k2, acc2 * a, HW)
            acc3 = mma(pb, k3, acc3 * a, HW)

    empty = l == 0.0
    inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l))
    lse = tl.where(empty, float("-inf"), (m + tl.log2(tl.where(empty, 1.0, l))) * 0.6931471805599453)
    if DIRECT:
        o_row = out_ptr + (tok * heads + h) * NOPE
        w = inv * bmm2_scale
        om = hmask[:, None]
        tl.store(o_row[:, None] + c[None, :], bf16_out(acc0 * w[:, None], HW), mask=om)
        tl.store(o_row[:, None] + BLK + c[None, :], bf16_out(acc1 * w[:, None], HW), mask=om)
        tl.store(o_row[:, None] + 2 * BLK + c[None, :], bf16_out(acc2 * w[:, None], HW), mask=om)
        tl.store(o_row[:, None] + 3 * BLK + c[None, :], bf16_out(acc3 * w[:, None], HW), mask=om)
        tl.store(lse_ptr + tok * heads + h, lse, mask=hmask)
    else:
        part = (tok * heads + h) * num_splits + split
        o_row = part_o + part * NOPE
        om = hmask[:, None]
        tl.store(o_row[:, None] + c[None, :], acc0 * inv[:, None], mask=om)
        tl.store(o_row[:, None] + BLK + c[None, :], acc1 * inv[:, None], mask=om)
        tl.store(o_row[:, None] + 2 * BLK + c[None, :], acc2 * inv[:, None], mask=om)
        tl.store(o_row[:, None] + 3 * BLK + c[None, :], acc3 * inv[:, None], mask=om)
        tl.store(part_lse + part, lse, mask=hmask)


@triton.jit
def _sparse_combine_kernel(part_o, part_lse, out_ptr, lse_ptr, num_splits, bmm2_scale,
                           SPLITS_P2: tl.constexpr, NOPE: tl.constexpr, HW: tl.constexpr):
    """One program per (token, head): ``out = sum_i exp(lse_i - lse) o_i * bmm2``, ``lse = logsumexp(lse_i)``."""
    row = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, SPLITS_P2)
    lses = tl.load(part_lse + row * num_splits + i, mask=i < num_splits, other=float("-inf"))
    top = tl.max(lses, axis=0)
    top_use = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(lses - top_use)  # empty splits (-inf) weigh 0
    total = tl.sum(w, axis=0)
    empty = total == 0.0
    d = tl.arange(0, NOPE)
    o = tl.load(part_o + (row * num_splits + i[:, None]) * NOPE + d[None, :], mask=(i < num_splits)[:, None],
                other=0.0)
    res = tl.sum(o * w[:, None], axis=0) * (tl.where(empty, 0.0, bmm2_scale / tl.where(empty, 1.0, total)))
    tl.store(out_ptr + row * NOPE + d, bf16_out(res, HW))
    tl.store(lse_ptr + row, tl.where(empty, float("-inf"), top_use + tl.log(tl.where(empty, 1.0, total))))


def num_splits_for(tokens: int, heads: int, top_k: int, config: dict, sms: int) -> int:
    """Splits of each token's slots: the config's, else enough for ~2 programs per SM, at most one per tile."""
    block_h, block_n = int(config.get("block_h", 64)), int(config.get("block_n", 64))
    tiles = triton.cdiv(top_k, block_n)
    if "num_splits" in config:
        return max(1, min(int(config["num_splits"]), tiles))
    programs = tokens * triton.cdiv(heads, block_h)
    splits = 1
    while splits * 2 <= tiles and programs * splits < 2 * sms:
        splits *= 2
    return splits


def run(call: SparseDecodeCall, config: dict, on_gpu: bool | None = None):
    """Returns ``(out [batch, q_len, heads, 512] bf16, lse [batch, q_len, heads] float32)``; writes the call's
    ``out`` / ``lse`` buffers when given (LSE as a [batch, q_len, heads] view of the caller's buffer).

    ``on_gpu`` (default: the tensors are not on the CPU) selects the hardware code paths; a compile-only
    report forces it to build the GPU kernels from CPU tensors."""
    query, kv, idx = call.query, call.kv_cache, call.indices
    batch, q_len, heads, _ = query.shape
    top_k = idx.shape[-1]
    device = query.device
    out = call.out if call.out is not None else torch.empty(batch, q_len, heads, SPARSE_LATENT, dtype=torch.bfloat16,
                                                            device=device)
    lse = (call.lse.view(batch, q_len, heads) if call.lse is not None
           else torch.empty(batch, q_len, heads, dtype=torch.float32, device=device))
    tokens = batch * q_len
    if tokens == 0 or heads == 0:
        return out, lse
    hw = device.type != "cpu" if on_gpu is None else on_gpu
    block_h = min(int(config.get("block_h", 64)), max(16, _pow2(heads)))
    block_n = int(config.get("block_n", 64))
    splits = num_splits_for(tokens, heads, top_k, config, sm_count(device))
    rows = kv.shape[0]
    ds_mla = call.kv_layout == KV_LAYOUT_DS_MLA
    codes = kv.view(torch.uint8)
    if ds_mla and rows:
        scales, rope = codes.view(torch.float32), codes.view(torch.bfloat16)
    else:
        scales, rope = codes, codes  # unused
    q = query if ds_mla else query.view(torch.uint8)
    direct = splits == 1
    if direct:
        part_o = part_lse = out  # unused
    else:
        part_o = torch.empty(tokens * heads * splits * SPARSE_LATENT, dtype=torch.float32, device=device)
        part_lse = torch.empty(tokens * heads * splits, dtype=torch.float32, device=device)
    _sparse_split_kernel[(triton.cdiv(heads, block_h), splits, tokens)](
        q, codes, scales, rope, idx, call.metadata.valid_lens, part_o, part_lse, out, lse,
        rows, heads, q_len, top_k, splits, codes.stride(0), scales.stride(0), rope.stride(0),
        call.bmm1_scale * _LOG2E, call.bmm2_scale,
        DS_MLA=ds_mla, BLOCK_H=block_h, BLOCK_N=block_n, NOPE=SPARSE_LATENT, ROPE=SPARSE_ROPE, DIRECT=direct, HW=hw,
        num_warps=int(config.get("num_warps", 8)), num_stages=int(config.get("num_stages", 2)))
    if not direct:
        _sparse_combine_kernel[(tokens * heads,)](part_o, part_lse, out, lse, splits, call.bmm2_scale,
                                                   SPLITS_P2=_pow2(splits), NOPE=SPARSE_LATENT, HW=hw,
                                                   num_warps=4)
    return out, lse
