"""Fused RoPE + per-tensor FP8 E4M3 quantization of MLA's Q and K (:func:`mla_core.mla_rope_quantize_fp8`).

One launch writes all four outputs. Program ``(token, group)``: groups ``0 .. ceil(heads / block_h) - 1``
take ``block_h`` query heads of the token (their 512 NOPE values and their 64 RoPE values); the last group
takes the token's key row. Each program gathers its token's cos/sin row once (``pos`` outside the table:
cos = sin = 0, so the rope outputs are 0; never a read outside the table), rotates in float32 exactly as
the reference does (``x1 * cos - x2 * sin`` with no fused multiply-add: launched with
``enable_fp_fusion=False``), multiplies by the scale and rounds to E4M3 (nearest even, saturating).
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
    """Heads per program and warps, most promising first. Measured on the H200 (benchmarks/NOTES.md): 8 heads
    x 4 warps reached 81 % of the copy bandwidth at 4,096 x 128, 16 heads 58 % (fewer programs in flight)."""
    top = _pow2(problem["heads"])
    ranked = [(8, 4), (16, 4), (4, 2), (32, 8)]
    out = []
    for block_h, warps in ranked:
        config = {"block_h": min(block_h, top), "num_warps": warps}
        if config not in out:
            out.append(config)
    return out


@triton.jit
def _rope_rows(src_rope, src_nope, dst_rope, dst_nope, s_rope, s_nope, d_rope, d_nope, rows, cos, sin, scale,
               ROWS: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr, NOPE: tl.constexpr,
               NOPE_P2: tl.constexpr, IS_NEOX: tl.constexpr, HW: tl.constexpr):
    """Quantize ``rows`` rows (<= ROWS) of one token: NOPE as is, RoPE rotated by ``cos``/``sin`` [HALF_P2].

    ``s_*`` / ``d_*``: the row strides (elements) of the sources / destinations; the last dimension is
    contiguous. Pair i is ``(i, i + HALF)`` (NeoX) or ``(2i, 2i + 1)`` (interleaved).
    """
    r = tl.arange(0, ROWS)
    rmask = r < rows
    n = tl.arange(0, NOPE_P2)
    nmask = rmask[:, None] & (n[None, :] < NOPE)
    x = tl.load(src_nope + r[:, None] * s_nope + n[None, :], mask=nmask, other=0.0).to(tl.float32)
    tl.store(dst_nope + r[:, None] * d_nope + n[None, :], to_e4m3_bits(x * scale, HW), mask=nmask)
    i = tl.arange(0, HALF_P2)
    if IS_NEOX:
        c1 = i
        c2 = i + HALF
    else:
        c1 = 2 * i
        c2 = 2 * i + 1
    pmask = rmask[:, None] & (i[None, :] < HALF)
    x1 = tl.load(src_rope + r[:, None] * s_rope + c1[None, :], mask=pmask, other=0.0).to(tl.float32)
    x2 = tl.load(src_rope + r[:, None] * s_rope + c2[None, :], mask=pmask, other=0.0).to(tl.float32)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst_rope + r[:, None] * d_rope + c1[None, :], to_e4m3_bits(y1 * scale, HW), mask=pmask)
    tl.store(dst_rope + r[:, None] * d_rope + c2[None, :], to_e4m3_bits(y2 * scale, HW), mask=pmask)


@triton.jit
def _rope_quantize_kernel(q_rope, k_rope, q_nope, k_nope, cos_sin, pos_ids, q_rope_out, k_rope_out, q_nope_out,
                          k_nope_out, heads, max_pos, scale_q, scale_kv,
                          sq_rope_t, sq_rope_h, sk_rope_t, sq_nope_t, sq_nope_h, sk_nope_t,
                          dq_rope_t, dq_rope_h, dk_rope_t, dq_nope_t, dq_nope_h, dk_nope_t,
                          BLOCK_H: tl.constexpr, HALF: tl.constexpr, HALF_P2: tl.constexpr, NOPE: tl.constexpr,
                          NOPE_P2: tl.constexpr, IS_NEOX: tl.constexpr, HW: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1)
    i = tl.arange(0, HALF_P2)
    pos = tl.load(pos_ids + t + i * 0).to(tl.int64)  # the token's position, once per pair
    cmask = (pos >= 0) & (pos < max_pos) & (i < HALF)
    row = cos_sin + tl.where(cmask, pos, 0) * (2 * HALF)
    cos = tl.load(row + i, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(row + HALF + i, mask=cmask, other=0.0).to(tl.float32)
    groups = tl.cdiv(heads, BLOCK_H)
    if g < groups:
        h0 = g * BLOCK_H
        _rope_rows(q_rope + t * sq_rope_t + h0 * sq_rope_h, q_nope + t * sq_nope_t + h0 * sq_nope_h,
                   q_rope_out + t * dq_rope_t + h0 * dq_rope_h, q_nope_out + t * dq_nope_t + h0 * dq_nope_h,
                   sq_rope_h, sq_nope_h, dq_rope_h, dq_nope_h, heads - h0, cos, sin, scale_q,
                   BLOCK_H, HALF, HALF_P2, NOPE, NOPE_P2, IS_NEOX, HW)
    else:
        _rope_rows(k_rope + t * sk_rope_t, k_nope + t * sk_nope_t, k_rope_out + t * dk_rope_t,
                   k_nope_out + t * dk_nope_t, 0, 0, 0, 0, 1, cos, sin, scale_kv,
                   1, HALF, HALF_P2, NOPE, NOPE_P2, IS_NEOX, HW)


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
    block_h = min(int(config.get("block_h", 8)), _pow2(heads))
    hw = q_rope.device.type != "cpu"
    grid = (nnz, triton.cdiv(heads, block_h) + 1)
    _rope_quantize_kernel[grid](
        q_rope, k_rope, q_nope, k_nope, call.cos_sin_cache, call.pos_ids, qro, kro, qno, kno,
        heads, call.cos_sin_cache.shape[0], call.quant_scale_q, call.quant_scale_kv,
        q_rope.stride(0), q_rope.stride(1), k_rope.stride(0), q_nope.stride(0), q_nope.stride(1), k_nope.stride(0),
        qro.stride(0), qro.stride(1), kro.stride(0), qno.stride(0), qno.stride(1), kno.stride(0),
        BLOCK_H=block_h, HALF=rope // 2, HALF_P2=_pow2(rope // 2), NOPE=nope, NOPE_P2=_pow2(nope), IS_NEOX=call.is_neox,
        HW=hw, num_warps=int(config.get("num_warps", 4)), enable_fp_fusion=False)
    return outs
