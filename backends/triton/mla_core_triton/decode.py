"""Triton MLA decode: split-KV over the paged latent cache with fused fake quantization.

Stage 1 (``_decode_split_kernel``), one program per (head group, split, request): loads 32-key tiles of
the latent cache through the block table, fake-quantizes K along features and V along tokens on read,
runs ``S = q·Kᵀ`` and ``acc += P·V`` on tensor cores for a group of ``block_h`` heads (one K/V read
feeds every head of the group), and keeps the online softmax with the running max updated once per
32-key tile (the contract's P schedule; ``sub_tiles`` unrolls several tiles per loop step without
changing it). Quantized operands enter the dots unscaled (FP8 codes, ``e2m1 * block code``), exact in
bf16/fp16; the per-tensor scales multiply the fp32 scores and the final accumulator.
Stage 2 (``_decode_combine_kernel``) merges the splits through their log-sum-exp; with one split,
stage 1 writes the output directly.

Configs that change speed, never numbers: ``prefetch_pages`` loads the next tile's block-table entries one
step ahead; ``v_split`` (small batch) gives each of ``v_split`` programs of a
(head group, split, request) the same scores and softmax and 1/v_split of the V / output columns (the
V QDQ is per column, so a slice quantizes alike). ``kv_prepass`` (quantized K or V, many heads) runs
``_kv_codes_kernel`` first: it quantizes every row a request reaches once, instead of once per head group,
into per-request code buffers of the dot dtype, ``[batch, block_table width * page_size, 576]`` for K and
``[..., 512]`` for V (FP8 V with K's scale reuses K's codes). Sized from metadata (no device sync), they
cost memory: batch 32 x 32768 tokens x 576 x 2 B = 1.2 GB for K plus 1.1 GB for V (fine on a 141 GB
H200; a server with long block tables should budget for it or leave the config to the tuner).

FP8 KV cache (float8_e4m3fn codes, passed as a uint8 view): each tile loads half the bytes of bf16; the codes
convert exactly to q's dtype (bf16 / fp16) for the dots, and ``kv_scale`` multiplies the fp32 scores
(with the softmax scale) and the final accumulator, as the per-tensor QDQ scales do. P rounds to q's
dtype. K / V fake quantization over an FP8 cache is the reference's only (the backend says why not).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from mla_core import numerics
from mla_core.specs import DEFAULT_SM_COUNT, DecodeCall, auto_split_choices, decode_num_splits, sm_count

from .quant import fp8_unscaled, nvfp4_unscaled, round_bf16_rne, split3_bf16

_FMT = {None: 0, "fp8": 1, "nvfp4": 2}
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453
_TILE = numerics.DECODE_P_TILE
_SMS = DEFAULT_SM_COUNT  # the machine configs() ranks for
TRITON_MAX_FILL = 64
"""The most splits "auto" fills to (two programs an SM): at batch 1 on the H200 64 splits ran 26.8 / 48.3 / 40.3 /
86.8 us (16 heads 8k / 32k, 128 heads 8k / 32k keys) against 33.7 / 44.0 / 64.9 / 112.2 at 128 (benchmarks/NOTES.md,
round u); a caller's or a tuned count may still be up to numerics.MAX_KV_SPLITS."""


@triton.jit
def _mma(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ b in fp32. UPCAST: the interpreter's bf16 dot multiplies raw bits, so go through fp32."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def _qk(q_a, q_b, q_c, k, acc, Q_SPLIT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + q @ kᵀ; with Q_SPLIT the fp32 q arrives as three exact bf16 parts (three tensor-core dots)."""
    kt = tl.trans(k)
    acc = _mma(q_a, kt, acc, UPCAST, IEEE)
    if Q_SPLIT:
        acc = _mma(q_b, kt, acc, UPCAST, IEEE)
        acc = _mma(q_c, kt, acc, UPCAST, IEEE)
    return acc


@triton.jit
def _e4m3_to_dot(x, DOT_DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """uint8 E4M3 codes -> their exact values in the dot dtype. ``HW_CVT``: the hardware cvt (GPU); else bit
    arithmetic (the interpreter has no FP8 storage type): exponent bias 7, subnormals m * 2^-9, 0x7F NaN."""
    if HW_CVT:
        return x.to(tl.float8e4nv, bitcast=True).to(DOT_DTYPE)
    else:
        b = x.to(tl.int32)
        e = (b >> 3) & 15
        m = b & 7
        normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)
        f = tl.where(e == 0, m.to(tl.float32) * 0.001953125, normal)
        f = tl.where((b & 0x7F) == 0x7F, float("nan"), f)
        # the sign as a bit: code 0x80 is -0.0 (triton 3.6's interpreter negates 0.0 to +0.0)
        return (f.to(tl.int32, bitcast=True) | ((b & 0x80) << 24)).to(tl.float32, bitcast=True).to(DOT_DTYPE)


@triton.jit
def _k_codes(kn, kr, k_scale, k_inv_scale, TILE: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
             K_FMT: tl.constexpr, K_HAS_SCALE: tl.constexpr, K_G_POW2: tl.constexpr, DOT_DTYPE: tl.constexpr,
             HW_CVT: tl.constexpr):
    """K of a [TILE, 576] tile fake-quantized along the features, unscaled, in the dot dtype (exact).
    Nope and rope blocks never straddle (NOPE % 16 == 0); padding columns load 0."""
    if K_FMT == 1:
        kn_d = fp8_unscaled(kn.to(tl.float32), k_scale, K_HAS_SCALE, HW_CVT).to(DOT_DTYPE)
        kr_d = fp8_unscaled(kr.to(tl.float32), k_scale, K_HAS_SCALE, HW_CVT).to(DOT_DTYPE)
    elif K_FMT == 2:
        kn_d = nvfp4_unscaled(kn.to(tl.float32), k_scale, k_inv_scale, TILE, D_NOPE, 1, K_G_POW2,
                              HW_CVT).to(DOT_DTYPE)
        kr_d = nvfp4_unscaled(kr.to(tl.float32), k_scale, k_inv_scale, TILE, D_ROPE, 1, K_G_POW2,
                              HW_CVT).to(DOT_DTYPE)
    else:
        kn_d = kn.to(DOT_DTYPE)
        kr_d = kr.to(DOT_DTYPE)
    return kn_d, kr_d


@triton.jit
def _v_codes(vn, v_scale, v_inv_scale, TILE: tl.constexpr, D_V: tl.constexpr, V_FMT: tl.constexpr,
             V_HAS_SCALE: tl.constexpr, V_G_POW2: tl.constexpr, DOT_DTYPE: tl.constexpr, HW_CVT: tl.constexpr):
    """V of a [TILE, D_V] tile (TILE tokens from a multiple of 32) fake-quantized along the tokens (16-token
    blocks at absolute positions; absent tokens load 0 and never raise a block max), unscaled, dot dtype.
    Each column is quantized on its own, so any column slice gives the same codes as the whole tile."""
    if V_FMT == 1:
        v_d = fp8_unscaled(vn.to(tl.float32), v_scale, V_HAS_SCALE, HW_CVT)
    elif V_FMT == 2:
        v_d = nvfp4_unscaled(vn.to(tl.float32), v_scale, v_inv_scale, TILE, D_V, 0, V_G_POW2, HW_CVT)
    else:
        v_d = vn
    return v_d.to(DOT_DTYPE)


@triton.jit
def _kv_codes_kernel(
        cache_ptr, bt_ptr, lens_ptr, kcode_ptr, vcode_ptr,
        stride_cpage, stride_ctok, stride_btb, stride_btc, num_pages, capacity,
        k_scale, v_scale, k_inv_scale, v_inv_scale,
        NOPE: tl.constexpr, ROPE: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
        PAGE_SIZE: tl.constexpr, K_FMT: tl.constexpr, V_FMT: tl.constexpr,
        K_HAS_SCALE: tl.constexpr, V_HAS_SCALE: tl.constexpr, K_G_POW2: tl.constexpr, V_G_POW2: tl.constexpr,
        DOT_DTYPE: tl.constexpr, HW_CVT: tl.constexpr, TILE: tl.constexpr):
    """kv_prepass, one program per (TILE-token tile, request, K or V): codes of the tokens < length.

    kcode [batch, capacity, NOPE + ROPE] and vcode [batch, capacity, NOPE] (dot dtype) at row
    ``b * capacity + token``; rows at or past a length are neither read nor written, and only the table
    entries a length reaches are read. Absent keys (page outside the cache) get codes 0, as on read.
    """
    t = tl.program_id(0)
    b = tl.program_id(1)
    part = tl.program_id(2)  # 0: K codes, 1: V codes (separate programs: half the live registers each)
    # a length past the table's capacity (or below 0) is clamped: only this request's table row is read
    seq_len = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), capacity).to(tl.int32)
    tok = t * TILE + tl.arange(0, TILE)
    in_len = tok < seq_len
    offs_n = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    page = tl.load(bt_ptr + b.to(tl.int64) * stride_btb + (tok // PAGE_SIZE) * stride_btc, mask=in_len,
                   other=-1).to(tl.int64)
    valid = in_len & (page >= 0) & (page < num_pages)
    row = cache_ptr + page * stride_cpage + (tok % PAGE_SIZE).to(tl.int64) * stride_ctok
    kn = tl.load(row[:, None] + offs_n[None, :], mask=valid[:, None] & (offs_n[None, :] < NOPE), other=0.0)
    code_row = b.to(tl.int64) * capacity + tok
    if part == 0:
        kr = tl.load(row[:, None] + NOPE + offs_r[None, :], mask=valid[:, None] & (offs_r[None, :] < ROPE),
                     other=0.0)
        kn_d, kr_d = _k_codes(kn, kr, k_scale, k_inv_scale, TILE, D_NOPE, D_ROPE, K_FMT, K_HAS_SCALE, K_G_POW2,
                              DOT_DTYPE, HW_CVT)
        kdst = kcode_ptr + code_row[:, None] * (NOPE + ROPE)
        tl.store(kdst + offs_n[None, :], kn_d, mask=in_len[:, None] & (offs_n[None, :] < NOPE))
        tl.store(kdst + NOPE + offs_r[None, :], kr_d, mask=in_len[:, None] & (offs_r[None, :] < ROPE))
    else:
        v_d = _v_codes(kn, v_scale, v_inv_scale, TILE, D_NOPE, V_FMT, V_HAS_SCALE, V_G_POW2, DOT_DTYPE, HW_CVT)
        tl.store(vcode_ptr + code_row[:, None] * NOPE + offs_n[None, :], v_d,
                 mask=in_len[:, None] & (offs_n[None, :] < NOPE))


@triton.jit
def _decode_split_kernel(
        q_ptr, cache_ptr, bt_ptr, lens_ptr, part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, kcode_ptr, vcode_ptr,
        stride_qb, stride_qh, stride_cpage, stride_ctok, stride_btb, stride_btc,
        heads, num_pages, num_splits, capacity, qk_scale, k_scale, v_scale, p_scale, out_scale,
        k_inv_scale, v_inv_scale, p_inv_scale,
        NOPE: tl.constexpr, ROPE: tl.constexpr, D_NOPE: tl.constexpr, D_ROPE: tl.constexpr,
        PAGE_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, SUB_TILES: tl.constexpr,
        K_FMT: tl.constexpr, V_FMT: tl.constexpr, P_FMT: tl.constexpr,
        K_HAS_SCALE: tl.constexpr, V_HAS_SCALE: tl.constexpr,
        K_G_POW2: tl.constexpr, V_G_POW2: tl.constexpr, P_G_POW2: tl.constexpr,
        DOT_DTYPE: tl.constexpr, V_DTYPE: tl.constexpr, CACHE_FP8: tl.constexpr, Q_SPLIT: tl.constexpr,
        IEEE: tl.constexpr,
        UPCAST: tl.constexpr, HW_CVT: tl.constexpr, P_BF16_RNE: tl.constexpr, DIRECT: tl.constexpr,
        WRITE_LSE: tl.constexpr, V_SPLIT: tl.constexpr, KV_CODES: tl.constexpr, V_FROM_K: tl.constexpr,
        PREFETCH_PAGES: tl.constexpr):
    TILE: tl.constexpr = 32
    D_V: tl.constexpr = D_NOPE // V_SPLIT  # this program's slice of the V / output columns
    hg = tl.program_id(0) // V_SPLIT
    v_part = tl.program_id(0) % V_SPLIT  # neighbouring programs share K tiles (L2 hits)
    split = tl.program_id(1)
    b = tl.program_id(2)

    # a length past the table's capacity (or below 0) is clamped: only this request's table row is read
    seq_len = tl.minimum(tl.maximum(tl.load(lens_ptr + b), 0), capacity).to(tl.int32)
    tiles_total = tl.cdiv(seq_len, TILE)
    tiles_per_split = tl.cdiv(tiles_total, num_splits)
    lo = split * tiles_per_split * TILE
    hi = tl.minimum(lo + tiles_per_split * TILE, seq_len)

    offs_h = hg * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    offs_n = tl.arange(0, D_NOPE)
    offs_r = tl.arange(0, D_ROPE)
    offs_t = tl.arange(0, TILE)
    offs_v = v_part * D_V + tl.arange(0, D_V)
    mask_v = offs_v < NOPE

    q_row = q_ptr + b.to(tl.int64) * stride_qb + offs_h[:, None].to(tl.int64) * stride_qh
    q_nope = tl.load(q_row + offs_n[None, :], mask=mask_h[:, None] & (offs_n[None, :] < NOPE), other=0.0)
    q_rope = tl.load(q_row + NOPE + offs_r[None, :], mask=mask_h[:, None] & (offs_r[None, :] < ROPE), other=0.0)
    if Q_SPLIT:
        qn_a, qn_b, qn_c = split3_bf16(q_nope.to(tl.float32))
        qr_a, qr_b, qr_c = split3_bf16(q_rope.to(tl.float32))
    else:
        qn_a = q_nope.to(DOT_DTYPE)
        qr_a = q_rope.to(DOT_DTYPE)
        qn_b = qn_a
        qn_c = qn_a
        qr_b = qr_a
        qr_c = qr_a

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)  # running max of the log2-domain scores
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_btb
    code_base = b.to(tl.int64) * capacity

    if PREFETCH_PAGES:  # the first tile's page indices; each step then loads the next tile's
        page_next = tl.load(bt_row + ((lo + offs_t) // PAGE_SIZE) * stride_btc, mask=lo + offs_t < hi, other=-1)
    for start in range(lo, hi, TILE * SUB_TILES):
        for sub in tl.static_range(SUB_TILES):
            tok = start + sub * TILE + offs_t
            in_split = tok < hi
            # only table entries a length reaches are read; pages outside the cache are absent keys
            if PREFETCH_PAGES:  # one dependent DRAM round trip (table, then row) fewer per tile
                page = page_next.to(tl.int64)
                page_next = tl.load(bt_row + ((tok + TILE) // PAGE_SIZE) * stride_btc, mask=tok + TILE < hi,
                                    other=-1)
            else:
                page = tl.load(bt_row + (tok // PAGE_SIZE) * stride_btc, mask=in_split, other=-1).to(tl.int64)
            valid = in_split & (page >= 0) & (page < num_pages)
            row = cache_ptr + page * stride_cpage + (tok % PAGE_SIZE).to(tl.int64) * stride_ctok
            if KV_CODES:
                # codes from the pre-pass, addressed by (request, token): no table lookup in the load path
                krow = kcode_ptr + (code_base + tok) * (NOPE + ROPE)
                kn_d = tl.load(krow[:, None] + offs_n[None, :], mask=in_split[:, None] & (offs_n[None, :] < NOPE),
                               other=0.0)
                kr_d = tl.load(krow[:, None] + NOPE + offs_r[None, :],
                               mask=in_split[:, None] & (offs_r[None, :] < ROPE), other=0.0)
            else:
                kn = tl.load(row[:, None] + offs_n[None, :], mask=valid[:, None] & (offs_n[None, :] < NOPE),
                             other=0.0)
                kr = tl.load(row[:, None] + NOPE + offs_r[None, :], mask=valid[:, None] & (offs_r[None, :] < ROPE),
                             other=0.0)
                if CACHE_FP8:  # codes (K_FMT 0: the backend runs no K / V QDQ over an FP8 cache)
                    kn = _e4m3_to_dot(kn, DOT_DTYPE, HW_CVT)
                    kr = _e4m3_to_dot(kr, DOT_DTYPE, HW_CVT)
                kn_d, kr_d = _k_codes(kn, kr, k_scale, k_inv_scale, TILE, D_NOPE, D_ROPE, K_FMT, K_HAS_SCALE,
                                      K_G_POW2, DOT_DTYPE, HW_CVT)
            s = tl.zeros([BLOCK_H, TILE], tl.float32)
            s = _qk(qn_a, qn_b, qn_c, kn_d, s, Q_SPLIT, UPCAST, IEEE)
            s = _qk(qr_a, qr_b, qr_c, kr_d, s, Q_SPLIT, UPCAST, IEEE)
            s = tl.where(valid[None, :], s * qk_scale, float("-inf"))

            # online softmax, running max updated once per 32-key tile
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: no NaN from -inf - -inf
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            m_i = m_new

            # P quantized after the row sum (unscaled; the per-tensor P scale is in out_scale)
            if P_FMT == 1:
                p_d = fp8_unscaled(p, p_scale, True, HW_CVT)
            else:
                if P_BF16_RNE:
                    p_v = round_bf16_rne(p)
                else:
                    p_v = p.to(V_DTYPE).to(tl.float32)
                if P_FMT == 2:
                    p_d = nvfp4_unscaled(p_v, p_scale, p_inv_scale, BLOCK_H, TILE, 1, P_G_POW2, HW_CVT)
                else:
                    p_d = p_v
            # V = the first NOPE latent values (this program's D_V columns of them)
            if KV_CODES:
                if V_FROM_K and V_SPLIT == 1:
                    v_d = kn_d
                elif V_FROM_K:
                    v_d = tl.load(krow[:, None] + offs_v[None, :], mask=in_split[:, None] & mask_v[None, :],
                                  other=0.0)
                else:
                    v_d = tl.load(vcode_ptr + (code_base + tok)[:, None] * NOPE + offs_v[None, :],
                                  mask=in_split[:, None] & mask_v[None, :], other=0.0)
            else:
                if V_SPLIT == 1:
                    vn = kn
                else:  # the slice again from the rows just read (L1/L2 hits)
                    vn = tl.load(row[:, None] + offs_v[None, :], mask=valid[:, None] & mask_v[None, :], other=0.0)
                    if CACHE_FP8:
                        vn = _e4m3_to_dot(vn, DOT_DTYPE, HW_CVT)
                v_d = _v_codes(vn, v_scale, v_inv_scale, TILE, D_V, V_FMT, V_HAS_SCALE, V_G_POW2, DOT_DTYPE,
                               HW_CVT)
            acc = _mma(p_d.to(DOT_DTYPE), v_d.to(DOT_DTYPE), acc * alpha[:, None], UPCAST, IEEE)

    has_keys = l_i > 0
    l_safe = tl.where(has_keys, l_i, 1.0)
    o = acc * (out_scale / l_safe)[:, None]
    o = tl.where(has_keys[:, None], o, 0.0)
    lse = tl.where(has_keys, (m_i + tl.log2(l_safe)) * 0.6931471805599453, float("-inf"))
    mask_o = mask_h[:, None] & mask_v[None, :]
    # every v_part has the same LSE: one writes it (a vector comparison: triton 3.9's interpreter rejects
    # a mask made from a vector & a scalar bool)
    mask_lse = mask_h & (tl.full([BLOCK_H], v_part, tl.int32) == 0)
    if DIRECT:
        dst = out_ptr + (b * heads + offs_h[:, None]).to(tl.int64) * NOPE + offs_v[None, :]
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=mask_o)
        if WRITE_LSE:
            tl.store(lse_ptr + b * heads + offs_h, lse, mask=mask_lse)
    else:
        row_id = (b * heads + offs_h).to(tl.int64) * num_splits + split
        tl.store(part_o_ptr + row_id[:, None] * NOPE + offs_v[None, :], o, mask=mask_o)
        tl.store(part_lse_ptr + row_id, lse, mask=mask_lse)


@triton.jit
def _decode_combine_kernel(part_o_ptr, part_lse_ptr, out_ptr, lse_ptr, num_splits,
                           NOPE: tl.constexpr, D_NOPE: tl.constexpr, WRITE_LSE: tl.constexpr):
    """One program per (request, head): o = sum_i exp(lse_i - lse) * o_i, lse = logsumexp(lse_i)."""
    row = tl.program_id(0).to(tl.int64)  # b * heads + h
    offs = tl.arange(0, D_NOPE)
    mask = offs < NOPE
    lse_max = tl.full([], float("-inf"), tl.float32)
    for i in range(num_splits):
        lse_max = tl.maximum(lse_max, tl.load(part_lse_ptr + row * num_splits + i))
    safe_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([D_NOPE], tl.float32)
    for i in range(num_splits):
        w = tl.exp(tl.load(part_lse_ptr + row * num_splits + i) - safe_max)  # empty split: exp(-inf) = 0
        acc += w * tl.load(part_o_ptr + (row * num_splits + i) * NOPE + offs, mask=mask, other=0.0)
        total += w
    has = total > 0
    o = tl.where(has, acc / tl.where(has, total, 1.0), 0.0)
    tl.store(out_ptr + row * NOPE + offs, o.to(out_ptr.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        tl.store(lse_ptr + row, tl.where(has, safe_max + tl.log(tl.where(has, total, 1.0)), float("-inf")))


JIT_KERNELS = ("_kv_codes_kernel", "_decode_split_kernel", "_decode_combine_kernel")
"""Module-level names of the kernels ``run`` launches (benchmarks/compile_report.py swaps them)."""

_TL_DTYPE = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}


def _pow2(n: int, floor: int = 16) -> int:
    return max(floor, triton.next_power_of_2(n))


def _is_pow2(x: float) -> bool:
    """x is a power of two (dividing by it is an exact multiplication by its reciprocal)."""
    return x > 0 and math.frexp(x)[0] == 0.5


def configs(problem) -> list[dict]:
    """Launch choices: heads per program, 32-key tiles per loop step, warps, stages (+ splits for "auto")."""
    heads = problem["heads"]
    fp32_work = problem["dtype"] == "float32" or problem.get("q_dtype") == "float32"
    top = min(64, _pow2(heads))
    if fp32_work:
        top = min(top, 32)  # fp32 operands (or three q parts) need more registers per head
    quant = {problem.get("k_qdq"), problem.get("v_qdq"), problem.get("p_qdq")} - {None}
    # (block_h, sub_tiles, num_warps, num_stages), most promising first. Measured on the H200 and by
    # ptxas (benchmarks/NOTES.md): in-register QDQ of a 32x576 tile needs 8 warps to avoid spills, NVFP4
    # one stage; bf16 at 16 heads likes 3 stages; at 128 heads 64-head groups (wgmma) win.
    # Division-free QDQ (quant.py) cut the FP8 tile to 128 registers at 8 warps / 2 stages (2 CTAs per SM,
    # predicted first); NVFP4 still fills 255 registers (small spills) so it keeps one stage. bf16 at 16
    # heads: Triton single-buffers the K tile (56 KB smem for 3 or 4 stages), two 32-key sub-tiles per
    # step (94 KB, 249 registers at 8 warps) put two tiles in flight per CTA: predicted second.
    if top == 16:
        if "nvfp4" in quant:
            ranked = [(16, 1, 8, 1), (16, 1, 8, 2), (16, 1, 4, 2), (16, 1, 4, 1)]
        elif quant:
            ranked = [(16, 1, 8, 2), (16, 1, 8, 1), (16, 2, 8, 2), (16, 1, 4, 2)]
        else:
            ranked = [(16, 1, 4, 3), (16, 2, 8, 3), (16, 1, 4, 2), (16, 1, 8, 3), (16, 1, 4, 1), (16, 2, 4, 2)]
    elif "nvfp4" in quant:
        ranked = [(32, 1, 8, 1), (16, 1, 8, 1), (64, 1, 8, 2), (64, 1, 8, 1), (32, 1, 8, 2)]
    elif quant:
        ranked = [(64, 1, 8, 2), (32, 1, 8, 2), (16, 1, 8, 1), (64, 1, 8, 1), (32, 1, 8, 1)]
    else:
        ranked = [(64, 1, 8, 2), (32, 1, 8, 2), (16, 1, 4, 3), (64, 1, 8, 1), (64, 1, 8, 3), (32, 1, 4, 2),
                  (32, 2, 8, 2)]
    if fp32_work:  # fp32 tiles are twice the bytes: 3 stages asked for 252 KB of shared memory (228 KB on the H200)
        ranked = list(dict.fromkeys((bh, sub, warps, 1) for bh, sub, warps, _ in ranked))
    out = [{"block_h": bh, "sub_tiles": sub, "num_warps": warps, "num_stages": stages}
           for bh, sub, warps, stages in ranked if bh <= top]
    # kv_prepass (quantized K or V, >= 64 heads): quantize each reached row once instead of once per head
    # group; the main loop then is the bf16 kernel (64-head groups) plus P's QDQ.
    # FP8's in-loop QDQ is cheap (~6 instructions per element): at large batch the pre-pass's extra pass over
    # the cache about cancels its gain, so the in-loop kernel stays first there (benchmarks/NOTES.md).
    if heads >= 64 and ({problem.get("k_qdq"), problem.get("v_qdq")} - {None}):
        prepass = [{"block_h": bh, "sub_tiles": 1, "num_warps": 8, "num_stages": stages, "kv_prepass": True}
                   for bh, stages in ((64, 2), (32, 2), (16, 3)) if bh <= top]
        cheap_qdq = "nvfp4" not in {problem.get("k_qdq"), problem.get("v_qdq")}
        out = out[:1] + prepass + out[1:] if cheap_qdq and problem.get("batch", 1) >= 8 else prepass + out
    # v_split (small batch): too few (head group, split, request) programs for the 132 SMs, so each also
    # takes 1/v_split of the V / output columns (same scores, same softmax: same numbers).
    splits = problem.get("num_kv_splits")
    if not isinstance(splits, int):  # "auto" fills the GPU on its own unless the length caps it
        splits = min(numerics.MAX_KV_SPLITS, max(1, problem.get("max_len", 1) // _TILE))
    lead = []
    for config in out[:2]:
        programs = problem.get("batch", 1) * -(-heads // config["block_h"]) * splits
        v_split = 1
        while v_split < 4 and programs * v_split * 2 <= _SMS:
            v_split *= 2
        if v_split > 1:
            lead += [dict(config, v_split=v_split)]
    if lead and lead[0]["v_split"] == 4:
        lead.insert(1, dict(lead[0], v_split=2))
    # prefetch_pages: the next tile's block-table entries load one step ahead, so a tile waits for one DRAM
    # round trip (its rows) instead of two (table, then rows); predicted to help where the per-program
    # chain of tiles is the limit (batch 1) and where K bytes are (16 heads), not at compute-bound 128 heads
    # (not first for NVFP4 at 16 heads without v_split: the prefetched indices add to its spills, 88 -> 112 B)
    if lead or (top == 16 and "nvfp4" not in quant):
        lead.insert(0, dict((lead or out)[0], prefetch_pages=True))
    out = lead + out
    if problem.get("num_kv_splits") == "auto":
        out += [dict(out[0], num_kv_splits=s) for s in auto_split_choices(problem)]
    return out


LAST_RESOURCES: dict[str, int | None] = {}
"""Registers per thread and spilled bytes of the last stage-1 launch (benchmarks report them)."""


def _new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output or split buffer the kernels fully write (tests replace this to poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


_PLANS: dict[tuple, dict] = {}
"""Launch plans by everything :func:`_plan` reads (at most :data:`_PLANS_MAX` keys; cleared when full)."""
_PLANS_MAX = 256


def _plan(call: DecodeCall, config: dict, on_gpu: bool) -> dict:
    """Host constants of one decode's launches (split count, grids, scalar arguments, constexprs), cached.

    A pure function of the key below: the call's shapes, dtypes, scalars and quantization settings, the config
    and the multiprocessor count (the tensors' addresses, strides and page count are read at each launch).
    Raises ValueError for K / V QDQ over an FP8 cache (nothing is cached then).
    """
    q, cache = call.q, call.latent_cache
    sms = sm_count(q.device)
    key = (q.shape, q.dtype, cache.dtype, call.out_dtype, call.block_table.shape[1], call.page_size,
           call.kv_lora_rank, call.rope_dim, call.num_kv_splits, call.softmax_scale, call.k_qdq, call.k_amax,
           call.v_qdq, call.v_amax, call.p_qdq, call.p_amax, call.return_lse, call.kv_scale,
           tuple(config.items()), on_gpu, sms)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    batch, heads, _ = q.shape
    nope, rope = call.kv_lora_rank, call.rope_dim
    splits = decode_num_splits(call, config, sms, max_fill=TRITON_MAX_FILL)
    block_h = min(int(config.get("block_h", 16)), _pow2(heads))
    sub_tiles = int(config.get("sub_tiles", 1))

    cache_fp8 = cache.dtype == numerics.FP8_CACHE_DTYPE
    if cache_fp8 and (call.k_qdq is not None or call.v_qdq is not None):
        raise ValueError("k_qdq / v_qdq over an FP8 cache: run by the reference backend only")
    value_dtype = numerics.decode_value_dtype(cache.dtype, q.dtype)  # V's dtype in the dot, P's rounding
    kv_scale = call.kv_scale if cache_fp8 else 1.0
    q_split = q.dtype == torch.float32 and value_dtype == torch.bfloat16
    if value_dtype == torch.float32 or (q.dtype == torch.float32 and value_dtype == torch.float16):
        dot_dtype = tl.float32  # fp16 parts of an fp32 q could underflow: fall back to fp32 FMA dots
    else:
        dot_dtype = _TL_DTYPE[value_dtype]

    k_fmt, v_fmt, p_fmt = _FMT[call.k_qdq], _FMT[call.v_qdq], _FMT[call.p_qdq]
    k_scale = {0: 1.0, 1: numerics.fp8_scale(call.k_amax), 2: numerics.nvfp4_global_scale(call.k_amax)}[k_fmt]
    v_scale = {0: 1.0, 1: numerics.fp8_scale(call.v_amax), 2: numerics.nvfp4_global_scale(call.v_amax)}[v_fmt]
    p_scale = {0: 1.0, 1: numerics.fp8_scale(call.p_amax), 2: numerics.nvfp4_global_scale(call.p_amax)}[p_fmt]
    interpreting = not on_gpu

    v_split = int(config.get("v_split", 1))
    while v_split > 1 and _pow2(nope) // v_split < 16:  # a dot needs >= 16 columns
        v_split //= 2
    kv_codes = bool(config.get("kv_prepass")) and (k_fmt != 0 or v_fmt != 0)
    v_from_k = k_fmt == v_fmt == 1 and k_scale == v_scale  # FP8 V codes = K's first NOPE codes
    capacity = call.block_table.shape[1] * call.page_size
    common = dict(NOPE=nope, ROPE=rope, D_NOPE=_pow2(nope), D_ROPE=_pow2(rope), PAGE_SIZE=call.page_size,
                  K_FMT=k_fmt, V_FMT=v_fmt, K_HAS_SCALE=k_scale != 1.0, V_HAS_SCALE=v_scale != 1.0,
                  K_G_POW2=_is_pow2(k_scale), V_G_POW2=_is_pow2(v_scale), DOT_DTYPE=dot_dtype, HW_CVT=on_gpu)
    direct = splits == 1
    plan = dict(
        splits=splits, cache_fp8=cache_fp8, capacity=capacity, common=common, kv_codes=kv_codes, v_from_k=v_from_k,
        dot_torch={tl.bfloat16: torch.bfloat16, tl.float16: torch.float16, tl.float32: torch.float32}[dot_dtype],
        prepass_scalars=(k_scale, v_scale, 1.0 / k_scale, 1.0 / v_scale), direct=direct,
        grid=(triton.cdiv(heads, block_h) * v_split, splits, batch),
        scalars=(float(call.softmax_scale) * k_scale * _LOG2E * kv_scale, k_scale, v_scale, p_scale,
                 kv_scale * v_scale * p_scale, 1.0 / k_scale, 1.0 / v_scale, 1.0 / p_scale),
        constexprs=dict(
            common, BLOCK_H=block_h, SUB_TILES=sub_tiles, P_FMT=p_fmt, P_G_POW2=_is_pow2(p_scale),
            V_DTYPE=_TL_DTYPE[value_dtype], CACHE_FP8=cache_fp8, Q_SPLIT=q_split,
            IEEE=dot_dtype == tl.float32, UPCAST=interpreting and dot_dtype == tl.bfloat16,
            P_BF16_RNE=interpreting and value_dtype == torch.bfloat16, DIRECT=direct,
            WRITE_LSE=call.return_lse, V_SPLIT=v_split, KV_CODES=kv_codes, V_FROM_K=v_from_k,
            PREFETCH_PAGES=bool(config.get("prefetch_pages")), num_warps=int(config.get("num_warps", 4)),
            num_stages=int(config.get("num_stages", 2))),
        combine=dict(NOPE=nope, D_NOPE=_pow2(nope), WRITE_LSE=call.return_lse, num_warps=4))
    if len(_PLANS) >= _PLANS_MAX:
        _PLANS.clear()
    _PLANS[key] = plan
    return plan


def run(call: DecodeCall, config: dict, on_gpu: bool | None = None):
    """Decode: returns (out [batch, heads, kv_lora_rank] in ``call.out_dtype``, lse [batch, heads] fp32 or None).

    ``on_gpu`` (default: the tensors' device is CUDA) selects the GPU code paths; benchmarks/compile_report.py
    forces it to compile the GPU kernels from CPU tensors.
    """
    q, cache = call.q, call.latent_cache
    batch, heads, _ = q.shape
    nope = call.kv_lora_rank
    device = q.device
    if on_gpu is None:
        on_gpu = device.type == "cuda"
    out = _new_output((batch, heads, nope), call.out_dtype, device)
    lse = _new_output((batch, heads), torch.float32, device) if call.return_lse else None
    if batch == 0:
        return out, lse
    plan = _plan(call, config, on_gpu)
    splits = plan["splits"]
    if plan["cache_fp8"]:  # codes as bytes (the interpreter has no FP8 storage type); they enter q's dtype exactly
        cache = cache.view(torch.uint8)
    table = call.block_table
    if plan["kv_codes"]:
        capacity, dot_torch = plan["capacity"], plan["dot_torch"]
        kcode = torch.empty(batch, capacity, nope + call.rope_dim, dtype=dot_torch, device=device)
        vcode = kcode if plan["v_from_k"] else torch.empty(batch, capacity, nope, dtype=dot_torch, device=device)
        pre_tile = 16  # one NVFP4 V block: ~36 elements per thread at 8 warps
        _kv_codes_kernel[(triton.cdiv(capacity, pre_tile), batch, 1 if plan["v_from_k"] else 2)](
            cache, table, call.seq_lens, kcode, vcode, cache.stride(0), cache.stride(1),
            table.stride(0), table.stride(1), cache.shape[0], capacity,
            *plan["prepass_scalars"], **plan["common"], TILE=pre_tile,
            num_warps=8, num_stages=1)
    else:
        kcode = vcode = cache  # unused

    direct = plan["direct"]
    if direct:
        part_o = part_lse = out  # unused
    else:
        part_o = _new_output((batch * heads * splits * nope,), torch.float32, device)
        part_lse = _new_output((batch * heads * splits,), torch.float32, device)
    compiled = _decode_split_kernel[plan["grid"]](
        q, cache, table, call.seq_lens, part_o, part_lse, out, lse if lse is not None else out,
        kcode, vcode, q.stride(0), q.stride(1), cache.stride(0), cache.stride(1),
        table.stride(0), table.stride(1), heads, cache.shape[0], splits, plan["capacity"],
        *plan["scalars"], **plan["constexprs"])
    LAST_RESOURCES.update(regs=getattr(compiled, "n_regs", None), spills=getattr(compiled, "n_spills", None))
    if not direct:
        _decode_combine_kernel[(batch * heads,)](
            part_o, part_lse, out, lse if lse is not None else out, splits, **plan["combine"])
    return out, lse
