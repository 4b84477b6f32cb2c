"""Fused RoPE + per-tensor FP8 E4M3 quantization of MLA's Q and K (:func:`mla_core.mla_rope_quantize_fp8`).

One launch writes all four outputs, on a 1-D grid whose neighbouring programs touch neighbouring addresses.
Token ``t`` of the query owns ``nope_groups + rope_groups`` consecutive programs: each NOPE program quantizes
``block_r`` heads' NOPE values (a pure stream: load, scale, round, store; no dependent load), each RoPE program
``rope_r`` heads' RoPE values (the token's position first, then the values, then its cos/sin row, all before
its stores). The programs after the query's take ``block_r`` key rows (consecutive tokens) each, both parts.
A position outside cos/sin gets cos = sin = 0 (rope outputs 0; never a read outside the table). The rotation
runs in float32 exactly as the reference's (``x1 * cos - x2 * sin`` with no fused multiply-add: launched with
``enable_fp_fusion=False``), times the scale, rounded to E4M3 (nearest even, saturating). Interleaved pairs
``(2i, 2i + 1)`` travel as one contiguous row, split into their two halves and joined back in registers.
Outputs are written through their own strides, so they can be slices of caller-owned 576-byte cache rows.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mla_core.specs import RopeQuantizeCall

from .fp8bits import to_e4m3_bits


def _pow2(n: int) -> int:
    return max(1, triton.next_power_of_2(n))


def configs(problem) -> list[dict]:
    """NOPE rows per program (``block_r``), RoPE rows per program (``rope_r``) and warps, fastest measured first.

    32 NOPE values per thread (block_r = 2 x num_warps) and 8 RoPE values (rope_r = 4 x num_warps) compile to 32
    registers (a full SM) with a thread's four 16-byte NOPE loads issued together; 16 NOPE values per thread
    (block_r = num_warps) to 25. On the H200 all five run within 1.2 % of each other at 4,096-16,384 tokens x 128
    heads, (16, 64, 16) fastest at each (see benchmarks/NOTES.md, "rope + FP8: faster kernel").
    """
    top = _pow2(problem["heads"])
    ranked = [(16, 64, 16), (16, 32, 8), (8, 16, 4), (8, 32, 8), (4, 16, 4)]
    out = []
    for block_r, rope_r, warps in ranked:
        config = {"block_r": min(block_r, top), "rope_r": min(rope_r, top), "num_warps": warps}
        if config not in out:
            out.append(config)
    return out


@triton.jit
def _nope_rows(src, dst, s, d, rows, scale, BLOCK_R: tl.constexpr, NOPE: tl.constexpr, NOPE_P2: tl.constexpr,
               HW: tl.constexpr):
    """E4M3 of ``x * scale`` for ``rows`` (<= BLOCK_R) rows of NOPE values; ``s`` / ``d``: row strides (elements)."""
    r = tl.arange(0, BLOCK_R)
    n = tl.arange(0, NOPE_P2)
    mask = (r[:, None] < rows) & (n[None, :] < NOPE)
    x = tl.load(src + r[:, None] * s + n[None, :], mask=mask, other=0.0)
    tl.store(dst + r[:, None] * d + n[None, :], to_e4m3_bits(x.to(tl.float32) * scale, HW), mask=mask)


@triton.jit
def _rope_rows(src, dst, s, d, rows, pos, pos_step, cos_sin, max_pos, scale, BLOCK_R: tl.constexpr,
               HALF: tl.constexpr, HALF_P2: tl.constexpr, IS_NEOX: tl.constexpr, HW: tl.constexpr):
    """E4M3 of ``rope(x) * scale`` for ``rows`` (<= BLOCK_R) rows of RoPE values; ``s`` / ``d``: row strides.

    Row j's position is ``pos[j * pos_step]`` (one token's heads: step 0; key rows: step 1). Pair i is
    ``(i, i + HALF)`` (NeoX) or ``(2i, 2i + 1)`` (interleaved). Loads (position first: the cos/sin gather waits
    for it) all precede the stores.
    """
    r = tl.arange(0, BLOCK_R)
    rmask = r < rows
    p = tl.load(pos + r * pos_step, mask=rmask, other=-1).to(tl.int64)
    i = tl.arange(0, HALF_P2)
    if IS_NEOX:
        pmask = rmask[:, None] & (i[None, :] < HALF)
        x1 = tl.load(src + r[:, None] * s + i[None, :], mask=pmask, other=0.0).to(tl.float32)
        x2 = tl.load(src + r[:, None] * s + HALF + i[None, :], mask=pmask, other=0.0).to(tl.float32)
    else:
        c = tl.arange(0, 2 * HALF_P2)  # column c is element c % 2 of pair c // 2
        cpmask = rmask[:, None] & (c[None, :] < 2 * HALF)
        xr = tl.load(src + r[:, None] * s + c[None, :], mask=cpmask, other=0.0).to(tl.float32)
        x1, x2 = tl.split(tl.reshape(xr, (BLOCK_R, HALF_P2, 2)))
    inside = (p >= 0) & (p < max_pos)
    row = cos_sin + tl.where(inside, p, 0) * (2 * HALF)
    cmask = inside[:, None] & (i[None, :] < HALF)
    cos = tl.load(row[:, None] + i[None, :], mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(row[:, None] + HALF + i[None, :], mask=cmask, other=0.0).to(tl.float32)
    y1 = x1 * cos - x2 * sin
    y2 = x2 * cos + x1 * sin
    if IS_NEOX:
        tl.store(dst + r[:, None] * d + i[None, :], to_e4m3_bits(y1 * scale, HW), mask=pmask)
        tl.store(dst + r[:, None] * d + HALF + i[None, :], to_e4m3_bits(y2 * scale, HW), mask=pmask)
    else:
        y = tl.reshape(tl.join(y1, y2), (BLOCK_R, 2 * HALF_P2))
        tl.store(dst + r[:, None] * d + c[None, :], to_e4m3_bits(y * scale, HW), mask=cpmask)


@triton.jit
def _rope_quantize_kernel(q_rope, k_rope, q_nope, k_nope, cos_sin, pos_ids, q_rope_out, k_rope_out, q_nope_out,
                          k_nope_out, nnz, heads, nope_groups, rope_groups, max_pos, scale_q, scale_kv,
                          sq_rope_t, sq_rope_h, sk_rope_t, sq_nope_t, sq_nope_h, sk_nope_t,
                          dq_rope_t, dq_rope_h, dk_rope_t, dq_nope_t, dq_nope_h, dk_nope_t,
                          BLOCK_R: tl.constexpr, ROPE_R: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr,
                          NOPE: tl.constexpr, NOPE_P2: tl.constexpr, IS_NEOX: tl.constexpr, HW: tl.constexpr):
    pid = tl.program_id(0)
    per_token = nope_groups + rope_groups
    if pid < nnz * per_token:  # query: token pid // per_token; its NOPE groups, then its RoPE groups
        t = (pid // per_token).to(tl.int64)
        g = pid % per_token
        if g < nope_groups:
            h0 = g * BLOCK_R
            _nope_rows(q_nope + t * sq_nope_t + h0 * sq_nope_h, q_nope_out + t * dq_nope_t + h0 * dq_nope_h,
                       sq_nope_h, dq_nope_h, heads - h0, scale_q, BLOCK_R, NOPE, NOPE_P2, HW)
        else:
            h0 = (g - nope_groups) * ROPE_R
            _rope_rows(q_rope + t * sq_rope_t + h0 * sq_rope_h, q_rope_out + t * dq_rope_t + h0 * dq_rope_h,
                       sq_rope_h, dq_rope_h, heads - h0, pos_ids + t, 0, cos_sin, max_pos, scale_q,
                       ROPE_R, HALF, HALF_P2, IS_NEOX, HW)
    else:  # keys: tokens t0 .. t0 + BLOCK_R - 1, both parts
        t0 = (pid - nnz * per_token).to(tl.int64) * BLOCK_R
        _rope_rows(k_rope + t0 * sk_rope_t, k_rope_out + t0 * dk_rope_t, sk_rope_t, dk_rope_t, nnz - t0,
                   pos_ids + t0, 1, cos_sin, max_pos, scale_kv, BLOCK_R, HALF, HALF_P2, IS_NEOX, HW)
        _nope_rows(k_nope + t0 * sk_nope_t, k_nope_out + t0 * dk_nope_t, sk_nope_t, dk_nope_t, nnz - t0, scale_kv,
                   BLOCK_R, NOPE, NOPE_P2, HW)


def _out(buf: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return buf if buf is not None else torch.empty(like.shape, dtype=torch.float8_e4m3fn, device=like.device)


def run(call: RopeQuantizeCall, config: dict):
    """Returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)`` FP8 (the call's buffers when given)."""
    q_rope, k_rope, q_nope, k_nope = call.q_rope, call.k_rope, call.q_nope, call.k_nope
    outs = (_out(call.q_rope_out, q_rope), _out(call.k_rope_out, k_rope), _out(call.q_nope_out, q_nope),
            _out(call.k_nope_out, k_nope))
    nnz, heads, rope = q_rope.shape
    nope = q_nope.shape[2]
    if nnz == 0:
        return outs
    qro, kro, qno, kno = (o.view(torch.uint8) for o in outs)
    block_r = min(int(config.get("block_r", 8)), _pow2(heads))
    rope_r = min(int(config.get("rope_r", 32)), _pow2(heads))
    nope_groups = triton.cdiv(heads, block_r) if nope else 0
    rope_groups = triton.cdiv(heads, rope_r)
    grid = (nnz * (nope_groups + rope_groups) + triton.cdiv(nnz, block_r),)
    _rope_quantize_kernel[grid](
        q_rope, k_rope, q_nope, k_nope, call.cos_sin_cache, call.pos_ids, qro, kro, qno, kno,
        nnz, heads, nope_groups, rope_groups, call.cos_sin_cache.shape[0], call.quant_scale_q, call.quant_scale_kv,
        q_rope.stride(0), q_rope.stride(1), k_rope.stride(0), q_nope.stride(0), q_nope.stride(1), k_nope.stride(0),
        qro.stride(0), qro.stride(1), kro.stride(0), qno.stride(0), qno.stride(1), kno.stride(0),
        BLOCK_R=block_r, ROPE_R=rope_r, HALF=rope // 2, HALF_P2=_pow2(rope // 2), NOPE=nope, NOPE_P2=_pow2(nope),
        IS_NEOX=call.is_neox, HW=q_rope.device.type != "cpu", num_warps=int(config.get("num_warps", 8)),
        enable_fp_fusion=False)
    return outs
