"""Varlen MLA prefill attention with fused fake quantization (Triton, FlashAttention-2 style).

One program per (query tile, head, sequence) walks the key tiles of its sequence with an online
softmax. The kernel's key tile is the caller's ``block_n``, which is also the P tile of the numerics
(docs/numerics.md), so the running maximum is updated exactly once per P tile.

Quantized operands run on tensor cores at full accuracy: a fake-quantized value is ``code * f`` with a
per-tensor factor ``f`` (FP8: ``amax / 448``; NVFP4: the global scale ``g``) and a ``code`` (an E4M3
value, or an E2M1 value times an E4M3 block scale) that is exact in bf16 and in float16. The kernel
multiplies codes (in float16 when both operands of a dot are codes and the inputs are bf16: FP8 codes
convert to float16 in one instruction per pair) and applies ``f_q * f_k`` to the scores and
``f_p * f_v`` to the output. Q is quantized once per program on load, or by a pre-pass (config
``q_prepass``); K and V are quantized either on every read inside the attention loop, or once by a
pre-pass that writes their codes (config ``kv_prepass``). Configs never change numerics.

Every quotient that is rounded afterwards is the correctly rounded float32 quotient, computed without
a division instruction (``_div``: reciprocal product plus one fma correction, the fast path of the
GPU's ``div.rn`` without its per-element branch); E4M3 rounding runs on the hardware converter on the
GPU (round to nearest even, saturating) and in exact float arithmetic under the Triton interpreter,
whose FP8 cast rounds half-up; E2M1 rounding is one add / subtract of a power of two. The kernels'
``HW_FP8`` constexpr is a mode: bit 0 on the GPU (else the interpreter's exact emulations), bit 1
plain ``div_rn`` quotients for per-tensor factors whose reciprocals leave float32's normal range.
"""
from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from triton import knobs

from mla_core import numerics

LOG2E = 1.4426950408889634
LN2 = tl.constexpr(0.6931471805599453)
_FMT_CODE = {None: 0, "fp8": 1, "nvfp4": 2}

# fp32 round-to-nearest-even to an integer for 0 <= t < 2**22: adding 2**23 leaves no fraction bits.
_RNE_MAGIC = tl.constexpr(8388608.0)
# correctly rounded float32 1/6 (NVFP4 block scales divide the block maximum by 6)
_INV_SIX = tl.constexpr(float(np.float32(1.0) / np.float32(numerics.E2M1_MAX)))


# ------------------------------------------------------------------------------------------------
# device-side rounding


@triton.jit
def _fma(a, b, c, HW: tl.constexpr):
    """``a * b + c`` rounded once (the interpreter's fma rounds twice; float64 keeps ``a * b`` exact there)."""
    if HW & 1:
        return tl.fma(a, b, c)
    else:
        return (a.to(tl.float64) * b.to(tl.float64) + c.to(tl.float64)).to(tl.float32)


@triton.jit
def _div(x, d, r, HW: tl.constexpr):
    """Correctly rounded float32 ``x / d`` from ``r`` ~ 1/d, without a division instruction.

    ``q = x * r`` is within an ulp of x / d; one exact residual ``x - q * d`` (an fma) corrects it to
    the rounded quotient (Markstein). This is the fast path of the GPU's ``div.rn`` (which adds a
    range check and a slow-path call per element); it is exact for a correctly rounded ``r`` and for the
    Newton-refined reciprocal of :func:`_rcp`, with normal quotients and residuals. Quotients that
    could underflow here are far below the smallest FP8 / E2M1 step, where any nearby value rounds alike.
    HW bit 1 (per-tensor factors too small for that, see ``_hw_mode``): ``div_rn`` itself (0 where d is 0).
    """
    if HW & 2:
        return tl.math.div_rn(x, tl.where(d == 0.0, 1.0, d))
    q = x * r
    # negate d, not q: q * -d folds the sign into the fma (-q would cost a second product per element)
    return _fma(_fma(q, -d, x, HW), r, q, HW)


@triton.jit
def _rcp(d, HW: tl.constexpr):
    """Reciprocal of float32 d >= 0 for :func:`_div` (0 where d is 0): ``div.rn``'s approximate
    reciprocal and Newton step on the GPU, the exact reciprocal under the interpreter."""
    safe = tl.where(d == 0.0, 1.0, d)
    if HW & 1:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=f,f", [safe], dtype=tl.float32,
                                      is_pure=True, pack=1)
        y = _fma(_fma(-safe, y, tl.full(safe.shape, 1.0, tl.float32), HW), y, y, HW)
    else:
        y = 1.0 / safe
    return tl.where(d == 0.0, 0.0, y)


@triton.jit
def _e4m3(x, DST: tl.constexpr, HW: tl.constexpr):
    """float32 -> nearest-even FP8 E4M3 value saturating at ±448, returned in DST (exact there)."""
    if HW & 1:
        # one cvt.rn.satfinite.e4m3x2.f32 per two values: round to nearest even, saturating
        return x.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(DST)
    else:
        a = tl.minimum(tl.abs(x), 448.0)
        # spacing 2^(e-3) for a normal value of exponent e; subnormals share e = -6 (spacing 2^-9)
        e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6)
        quantum = ((e + 124) << 23).to(tl.float32, bitcast=True)
        inv_quantum = ((130 - e) << 23).to(tl.float32, bitcast=True)
        r = ((a * inv_quantum + _RNE_MAGIC) - _RNE_MAGIC) * quantum
        return tl.where(x < 0, -r, r).to(DST)


@triton.jit
def _e2m1_abs(a):
    """float32 a >= 0 -> nearest E2M1 value (ties to the even code), saturating at 6.

    E2M1's spacing is 2^(e-1) for a value of exponent e >= 0 and 0.5 below 1, and its even codes are
    the even multiples of the spacing. Adding c = 2^(22 + max(e, 0)), whose float32 ulp is that
    spacing, lets the add's round-to-nearest-even do the rounding; subtracting c again is exact.
    """
    a = tl.minimum(a, 6.0)
    c = (tl.maximum(a.to(tl.int32, bitcast=True) & 0x7F800000, 0x3F800000) + 0x0B000000).to(tl.float32,
                                                                                            bitcast=True)
    return (a + c) - c


@triton.jit
def _round_to(x, DT: tl.constexpr, HW: tl.constexpr):
    """float32 x rounded to DT (nearest even), returned as float32."""
    if (HW & 1) and DT == tl.bfloat16:
        # one cvt.rn.bf16x2.f32 per pair; each bf16 moved into the high half is its float32 value
        # (Triton converts one value per cvt when the bf16 goes straight back to float32)
        return tl.inline_asm_elementwise(
            "{ .reg .b32 t; cvt.rn.bf16x2.f32 t, $3, $2; shl.b32 $0, t, 16; and.b32 $1, t, 0xffff0000; }",
            "=r,=r,r,r", [x], dtype=tl.float32, is_pure=True, pack=2)
    elif DT == tl.bfloat16:
        # the interpreter's float32 -> bf16 cast truncates: round the bits to nearest even instead
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        return bits.to(tl.float32, bitcast=True)
    else:
        return x.to(DT).to(tl.float32)


@triton.jit
def _fp8_codes(x, scale, inv_scale, DST: tl.constexpr, HW: tl.constexpr):
    """FP8 codes ``e4m3(x / scale)`` of a float32 tile in DST; the value is ``code * scale``.

    inv_scale: the correctly rounded float32 1 / scale.
    """
    d, r = tl.full(x.shape, scale, tl.float32), tl.full(x.shape, inv_scale, tl.float32)
    return _e4m3(_div(x, d, r, HW), DST, HW)


@triton.jit
def _nvfp4_codes(x, g, inv_g, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, DST: tl.constexpr,
                 NONNEG: tl.constexpr, HW: tl.constexpr):
    """NVFP4 codes of a float32 [R, C] tile in DST, blocks of 16 along AXIS (0 or 1) from index 0.

    code = e2m1(x / s) * e4m3(bmax / 6 / g) with s = e4m3(bmax / 6 / g) * g, so the value is ``code * g``
    (0 where s is 0). inv_g: the correctly rounded float32 1 / g. NONNEG: x >= 0 (P), no sign handling.
    Padding elements must be 0 (they never raise a block maximum).
    """
    a = x if NONNEG else tl.abs(x)
    if AXIS == 1:
        a3 = tl.reshape(a, (R, C // 16, 16))
        bmax = tl.max(a3, axis=2)
    else:
        a3 = tl.reshape(a, (R // 16, 16, C))
        bmax = tl.max(a3, axis=1)
    six, inv_six = tl.full(bmax.shape, 6.0, tl.float32), tl.full(bmax.shape, _INV_SIX, tl.float32)
    g_t, inv_g_t = tl.full(bmax.shape, g, tl.float32), tl.full(bmax.shape, inv_g, tl.float32)
    block = _e4m3(_div(_div(bmax, six, inv_six, HW), g_t, inv_g_t, HW), tl.float32, HW)
    s = block * g_t
    r = _rcp(s, HW)
    if AXIS == 1:
        s3, r3, b3 = s[:, :, None], r[:, :, None], block[:, :, None]
    else:
        s3, r3, b3 = s[:, None, :], r[:, None, :], block[:, None, :]
    # r3 is 0 where s is 0, so x / s comes out 0 there
    # E2M1 value times block code has at most 6 significant bits: exact in DST, so multiply there
    # (two values per instruction in a 16-bit DST)
    e = _e2m1_abs(_div(a3, s3, r3, HW))
    if HW & 1:
        y = tl.reshape(e.to(DST) * b3.to(DST), (R, C))
        if not NONNEG:
            y = tl.where(x < 0, -y, y)
    else:  # the interpreter's bf16 arithmetic works on raw bits: product and sign in float32 (exact there too)
        y = tl.reshape(e * b3, (R, C))
        if not NONNEG:
            y = tl.where(x < 0, -y, y)
        y = y.to(DST)
    return y


# ------------------------------------------------------------------------------------------------
# attention kernel


@triton.jit
def _codes(x, FMT: tl.constexpr, f, rf, R: tl.constexpr, C: tl.constexpr, AXIS: tl.constexpr, DST: tl.constexpr,
           HW_FP8: tl.constexpr):
    """Quantization codes in DST of a float32 [R, C] tile in format FMT (0 none, 1 fp8, 2 nvfp4).

    f: the per-tensor factor (the value is ``code * f``), rf: its correctly rounded float32 reciprocal.
    NVFP4 blocks run along AXIS from index 0 of the tile.
    """
    if FMT == 1:
        return _fp8_codes(x, f, rf, DST, HW_FP8)
    elif FMT == 2:
        return _nvfp4_codes(x, f, rf, R, C, AXIS, DST, False, HW_FP8)
    else:
        return x.to(DST)


@triton.jit
def _dot(a, b, acc, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """``acc + a @ b`` in float32 (acc None: ``a @ b``). UPCAST (interpreter, bf16 operands): the interpreter's bf16 dot
    multiplies raw bit patterns, so both operands go through float32 (bf16 products are exact there)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc, input_precision=DOT_PREC)


@triton.jit
def _nm_keep(s, q_pos, kv_pos, q_len, sink, recent, SPARSE_N: tl.constexpr, SPARSE_M: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Which scores of a [BLOCK_M, BLOCK_N] tile survive N:M sparsity (keys grouped by kv_pos // M).

    A score's rank in its group = scores strictly larger + equal scores at a lower index; it is kept
    when its rank is below N or it is dense (q length 1, a sink key, or a recent key).
    """
    s3 = tl.reshape(s, (BLOCK_M, BLOCK_N // SPARSE_M, SPARSE_M))
    idx = tl.arange(0, SPARSE_M)[None, None, :]
    rank = tl.zeros((BLOCK_M, BLOCK_N // SPARSE_M, SPARSE_M), tl.int32)
    for j in tl.static_range(SPARSE_M):
        sj = tl.max(tl.where(idx == j, s3, float("-inf")), axis=2)[:, :, None]
        rank += ((sj > s3) | ((sj == s3) & (idx > j))).to(tl.int32)
    keep = tl.reshape(rank, (BLOCK_M, BLOCK_N)) < SPARSE_N
    dist = q_pos[:, None] - kv_pos[None, :]
    dense = (kv_pos[None, :] < sink) | ((dist >= 0) & (dist < recent)) | (q_len == 1)
    return keep | dense


@triton.jit
def _seq_range(cu_ptr, seq, total):
    """(start, length) of sequence ``seq``: ``[start, end)`` clamped into ``0..total`` with ``end >= start``
    (the reference's ``sequence_ranges``), so cu_seqlens that do not describe the tensors (possible with
    content checks off) never move a load or store outside them; int32 after the clamp."""
    start = tl.minimum(tl.maximum(tl.load(cu_ptr + seq), 0), total)
    end = tl.minimum(tl.maximum(tl.load(cu_ptr + seq + 1), start), total)
    return start.to(tl.int32), (end - start).to(tl.int32)


@triton.jit
def _attend_tile(acc, l_i, m_i, q_a, q_b, k_ptrs_a, k_ptrs_b, v_ptrs, n0, offs_n, offs_m, len_k, shift, len_q,
                 stride_kt, stride_vt, score_scale, k_f, v_f, p_f, k_rf, v_rf, p_rf, sink, recent,
                 da_mask, db_mask, dv_mask,
                 DT: tl.constexpr, QK_DT: tl.constexpr, PV_DT: tl.constexpr, DOT_PREC: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 DA: tl.constexpr, DB: tl.constexpr, DVP: tl.constexpr,
                 K_FMT: tl.constexpr, V_FMT: tl.constexpr, P_FMT: tl.constexpr, MASKED: tl.constexpr,
                 CAUSAL: tl.constexpr, SPARSE_N: tl.constexpr, SPARSE_M: tl.constexpr, HW_FP8: tl.constexpr,
                 UPCAST: tl.constexpr):
    """One key tile [n0, n0 + BLOCK_N) of the online softmax; returns the updated (acc, l, m).

    QK_DT / PV_DT: the dtype of the operands of each dot (DT, or float16 where both are codes).
    UPCAST: bf16 dots through float32 (the interpreter; see :func:`_dot`).
    """
    kv_pos = n0 + offs_n
    k_in = kv_pos < len_k
    tok = kv_pos.to(tl.int64)
    if MASKED:
        k_a = tl.load(k_ptrs_a + tok[:, None] * stride_kt, mask=k_in[:, None] & da_mask[None, :], other=0.0)
    else:
        k_a = tl.load(k_ptrs_a + tok[:, None] * stride_kt, mask=da_mask[None, :], other=0.0)
    if K_FMT != 0:  # raw operands go straight from the load to the dot, so the loads pipeline
        k_a = _codes(k_a.to(tl.float32), K_FMT, k_f, k_rf, BLOCK_N, DA, 1, QK_DT, HW_FP8)
    qk = _dot(q_a, tl.trans(k_a), None, DOT_PREC, UPCAST)
    if DB > 0:
        if MASKED:
            k_b = tl.load(k_ptrs_b + tok[:, None] * stride_kt, mask=k_in[:, None] & db_mask[None, :], other=0.0)
        else:
            k_b = tl.load(k_ptrs_b + tok[:, None] * stride_kt, mask=db_mask[None, :], other=0.0)
        if K_FMT != 0:
            k_b = _codes(k_b.to(tl.float32), K_FMT, k_f, k_rf, BLOCK_N, DB, 1, QK_DT, HW_FP8)
        qk = _dot(q_b, tl.trans(k_b), qk, DOT_PREC, UPCAST)
    s = qk * score_scale
    if MASKED:
        visible = k_in[None, :]
        if CAUSAL:
            visible = visible & (kv_pos[None, :] <= offs_m[:, None] + shift)
        s = tl.where(visible, s, float("-inf"))
        if SPARSE_N < SPARSE_M:
            keep = _nm_keep(s, offs_m + shift, kv_pos, len_q, sink, recent, SPARSE_N, SPARSE_M, BLOCK_M, BLOCK_N)
            s = tl.where(keep, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no valid key yet: contribute nothing, no NaN
    p = tl.math.exp2(s - m_use[:, None])
    alpha = tl.math.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    if P_FMT == 1:
        p_op = _fp8_codes(p, p_f, p_rf, PV_DT, HW_FP8)
    elif P_FMT == 2:
        p_op = _nvfp4_codes(_round_to(p, DT, HW_FP8), p_f, p_rf, BLOCK_M, BLOCK_N, 1, PV_DT, True, HW_FP8)
    elif HW_FP8 & 1:
        p_op = p.to(DT)
    else:
        p_op = _round_to(p, DT, HW_FP8).to(DT)  # the interpreter's bf16 cast truncates: round first
    if MASKED:
        v = tl.load(v_ptrs + tok[:, None] * stride_vt, mask=k_in[:, None] & dv_mask[None, :], other=0.0)
    else:
        v = tl.load(v_ptrs + tok[:, None] * stride_vt, mask=dv_mask[None, :], other=0.0)
    if V_FMT != 0:
        v = _codes(v.to(tl.float32), V_FMT, v_f, v_rf, BLOCK_N, DVP, 0, PV_DT, HW_FP8)
    acc = acc * alpha[:, None]
    acc = _dot(p_op, v, acc, DOT_PREC, UPCAST)
    return acc, l_i, m_new


@triton.jit
def _prefill_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr, total_q, total_k,
                    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                    lse_stride_h, score_scale, out_scale, q_f, k_f, v_f, p_f, q_rf, k_rf, v_rf, p_rf, sink, recent,
                    HEAD_GROUP: tl.constexpr, DQK: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr,
                    DV: tl.constexpr, DVP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    CAUSAL: tl.constexpr, Q_FMT: tl.constexpr, K_FMT: tl.constexpr, V_FMT: tl.constexpr,
                    P_FMT: tl.constexpr, SPARSE_N: tl.constexpr, SPARSE_M: tl.constexpr,
                    RETURN_LSE: tl.constexpr, DOT_PREC: tl.constexpr, QK16: tl.constexpr, PV16: tl.constexpr,
                    HW_FP8: tl.constexpr, UPCAST: tl.constexpr):
    """Grid (query tiles, heads, sequences). Writes out [total_q, heads, DV] and lse [heads, total_q].

    q_f..p_f: per-tensor factors, q_rf..p_rf their float32 reciprocals. QK16 / PV16: run that dot on
    float16 codes (both operands quantized, so exact in float16: no conversion of FP8 codes to bf16).
    """
    # causal: the last query tiles see the most keys; start them first so the short ones fill the tail
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    head = tl.program_id(1)
    seq = tl.program_id(2)
    q_start, len_q = _seq_range(cu_q_ptr, seq, total_q)
    m0 = pid_m * BLOCK_M
    if m0 >= len_q:
        return
    k_start, len_k = _seq_range(cu_k_ptr, seq, total_k)
    shift = len_k - len_q  # query i sits at key position i + shift
    kv_head = head // HEAD_GROUP
    DT = out_ptr.dtype.element_ty  # the inputs' dtype (q may hold float16 codes from the Q pre-pass)
    if QK16:
        QK_DT: tl.constexpr = tl.float16
    else:
        QK_DT: tl.constexpr = DT
    if PV16:
        PV_DT: tl.constexpr = tl.float16
    else:
        PV_DT: tl.constexpr = DT

    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_da = tl.arange(0, DA)
    da_mask = offs_da < DQK
    offs_dv = tl.arange(0, DVP)
    dv_mask = offs_dv < DV
    q_in = offs_m < len_q
    q_rows = q_ptr + (q_start + offs_m).to(tl.int64)[:, None] * stride_qt + head * stride_qh
    q_a = tl.load(q_rows + offs_da[None, :], mask=q_in[:, None] & da_mask[None, :], other=0.0)
    q_a = _codes(q_a.to(tl.float32), Q_FMT, q_f, q_rf, BLOCK_M, DA, 1, QK_DT, HW_FP8)
    k_base = k_ptr + k_start.to(tl.int64) * stride_kt + kv_head * stride_kh
    k_ptrs_a = k_base + offs_da
    if DB > 0:
        offs_db = DA + tl.arange(0, DB)
        db_mask = offs_db < DQK
        q_b = tl.load(q_rows + offs_db[None, :], mask=q_in[:, None] & db_mask[None, :], other=0.0)
        q_b = _codes(q_b.to(tl.float32), Q_FMT, q_f, q_rf, BLOCK_M, DB, 1, QK_DT, HW_FP8)
        k_ptrs_b = k_base + offs_db
    else:
        db_mask = da_mask
        q_b = q_a
        k_ptrs_b = k_ptrs_a
    v_ptrs = v_ptr + k_start.to(tl.int64) * stride_vt + kv_head * stride_vh + offs_dv

    acc = tl.zeros((BLOCK_M, DVP), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)

    # Key tiles every row of this query tile sees in full need no mask; the rest (the causal
    # diagonal, the ragged last tile, any tile under N:M sparsity) do. Tiles past the last key
    # any row sees are skipped: they would contribute nothing.
    if CAUSAL:
        hi = tl.minimum(len_k, m0 + BLOCK_M + shift)
        full_hi = tl.minimum(len_k, m0 + 1 + shift)
    else:
        hi = len_k
        full_hi = len_k
    full_hi = tl.maximum(full_hi, 0) // BLOCK_N * BLOCK_N
    if SPARSE_N < SPARSE_M:
        full_hi = 0
    for n0 in range(0, full_hi, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q_a, q_b, k_ptrs_a, k_ptrs_b, v_ptrs, n0, offs_n, offs_m, len_k,
                                     shift, len_q, stride_kt, stride_vt, score_scale, k_f, v_f, p_f, k_rf, v_rf,
                                     p_rf, sink, recent, da_mask, db_mask, dv_mask, DT, QK_DT, PV_DT, DOT_PREC,
                                     BLOCK_M, BLOCK_N, DA, DB, DVP, K_FMT, V_FMT, P_FMT, False, CAUSAL, SPARSE_N,
                                     SPARSE_M, HW_FP8, UPCAST)
    for n0 in range(full_hi, hi, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q_a, q_b, k_ptrs_a, k_ptrs_b, v_ptrs, n0, offs_n, offs_m, len_k,
                                     shift, len_q, stride_kt, stride_vt, score_scale, k_f, v_f, p_f, k_rf, v_rf,
                                     p_rf, sink, recent, da_mask, db_mask, dv_mask, DT, QK_DT, PV_DT, DOT_PREC,
                                     BLOCK_M, BLOCK_N, DA, DB, DVP, K_FMT, V_FMT, P_FMT, True, CAUSAL, SPARSE_N,
                                     SPARSE_M, HW_FP8, UPCAST)

    has_key = l_i > 0.0
    inv_l = tl.math.div_rn(tl.full((BLOCK_M,), out_scale, tl.float32), tl.where(has_key, l_i, 1.0))
    o = tl.where(has_key[:, None], acc * inv_l[:, None], 0.0)
    o_rows = out_ptr + (q_start + offs_m).to(tl.int64)[:, None] * stride_ot + head * stride_oh
    if not (HW_FP8 & 1):
        o = _round_to(o, out_ptr.dtype.element_ty, HW_FP8)  # exact bf16 rounding under the interpreter
    tl.store(o_rows + offs_dv[None, :], o.to(out_ptr.dtype.element_ty), mask=q_in[:, None] & dv_mask[None, :])
    if RETURN_LSE:
        lse = tl.where(has_key, (m_i + tl.math.log2(tl.where(has_key, l_i, 1.0))) * LN2, float("-inf"))
        tl.store(lse_ptr + head.to(tl.int64) * lse_stride_h + q_start + offs_m, lse, mask=q_in)


# ------------------------------------------------------------------------------------------------
# K / V pre-pass: quantization codes written once


@triton.jit
def _k_codes_kernel(k_ptr, c_ptr, total_k, stride_kt, stride_kh, stride_ct, stride_ch, k_f, k_rf,
                    DQK: tl.constexpr, DA: tl.constexpr, DB: tl.constexpr, BLOCK_T: tl.constexpr,
                    K_FMT: tl.constexpr, HW_FP8: tl.constexpr):
    """Grid (token blocks, kv heads): codes of K along features, written in c's dtype."""
    tok = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    head = tl.program_id(1)
    t_in = tok < total_k
    rows_k = k_ptr + tok.to(tl.int64)[:, None] * stride_kt + head * stride_kh
    rows_c = c_ptr + tok.to(tl.int64)[:, None] * stride_ct + head * stride_ch
    offs_a = tl.arange(0, DA)
    mask_a = t_in[:, None] & (offs_a < DQK)[None, :]
    x = tl.load(rows_k + offs_a[None, :], mask=mask_a, other=0.0).to(tl.float32)
    tl.store(rows_c + offs_a[None, :], _codes(x, K_FMT, k_f, k_rf, BLOCK_T, DA, 1, c_ptr.dtype.element_ty, HW_FP8),
             mask=mask_a)
    if DB > 0:
        offs_b = DA + tl.arange(0, DB)
        mask_b = t_in[:, None] & (offs_b < DQK)[None, :]
        x = tl.load(rows_k + offs_b[None, :], mask=mask_b, other=0.0).to(tl.float32)
        tl.store(rows_c + offs_b[None, :], _codes(x, K_FMT, k_f, k_rf, BLOCK_T, DB, 1, c_ptr.dtype.element_ty, HW_FP8),
                 mask=mask_b)


@triton.jit
def _v_codes_kernel(v_ptr, c_ptr, cu_k_ptr, total_k, stride_vt, stride_vh, stride_ct, stride_ch, v_f, v_rf,
                    DV: tl.constexpr, DVP: tl.constexpr, BLOCK_T: tl.constexpr, V_FMT: tl.constexpr,
                    HW_FP8: tl.constexpr):
    """Grid (key blocks, kv heads, sequences): codes of V along keys, blocks from each sequence's first key."""
    t0 = tl.program_id(0) * BLOCK_T
    head = tl.program_id(1)
    seq = tl.program_id(2)
    k_start, len_k = _seq_range(cu_k_ptr, seq, total_k)
    if t0 >= len_k:
        return
    pos = t0 + tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, DVP)
    mask = (pos < len_k)[:, None] & (offs_d < DV)[None, :]
    tok = (k_start + pos).to(tl.int64)[:, None]
    x = tl.load(v_ptr + tok * stride_vt + head * stride_vh + offs_d[None, :], mask=mask, other=0.0).to(tl.float32)
    y = _codes(x, V_FMT, v_f, v_rf, BLOCK_T, DVP, 0, c_ptr.dtype.element_ty, HW_FP8)
    tl.store(c_ptr + tok * stride_ct + head * stride_ch + offs_d[None, :], y, mask=mask)


# ------------------------------------------------------------------------------------------------
# host side


def _factor(fmt: str | None, amax: float | None) -> float:
    """Per-tensor factor that turns codes into values: FP8 scale, NVFP4 global scale, or 1.

    Rounded to float32 here, as the reference divides by it (products of factors are formed from
    the rounded values, which matters only where a factor is a float32 subnormal).
    """
    if fmt == "fp8":
        return float(np.float32(numerics.fp8_scale(amax)))
    if fmt == "nvfp4":
        return float(np.float32(numerics.nvfp4_global_scale(amax)))
    return 1.0


def _recip(f: float) -> float:
    """Correctly rounded float32 reciprocal of the float32 nearest f (IEEE float32 division; inf when
    it overflows, for factors that ``_hw_mode`` sends to the division path)."""
    with np.errstate(over="ignore", divide="ignore"):
        return float(np.float32(1.0) / np.float32(f))


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _split_dim(d: int) -> tuple[int, int]:
    """Split a head dim into two power-of-two tile widths (>= 16 each): 192 -> (128, 64), 576 -> (512, 64)."""
    da = max(16, 1 << (d.bit_length() - 1))
    rest = d - da
    return da, (max(16, _pow2_at_least(rest)) if rest > 0 else 0)


def _interpreting() -> bool:
    return bool(knobs.runtime.interpret)


def _hw_mode(on_gpu: bool, factors: list[tuple[int, float]]) -> int:
    """The kernels' HW_FP8 constexpr: bit 0 on the GPU, bit 1 quotients by ``div_rn``.

    factors: (format code, per-tensor factor) of the quantized operands. The reciprocal-product
    quotients need the divisors (FP8 scale; NVFP4 block scales, >= 2^-9 g) and their reciprocals to
    be far from float32's subnormal and overflow ranges; amaxes beyond that (FP8 below ~4e-16, NVFP4
    below ~1e-12, either above ~5e20) take the division path.
    """
    smallest = min((f / 512.0 if fmt == 2 else f for fmt, f in factors if fmt), default=1.0)
    largest = max((f for fmt, f in factors if fmt), default=1.0)
    return int(on_gpu) | (2 if smallest < 2.0 ** -60 or largest > 2.0 ** 60 else 0)


def configs(problem) -> list[dict]:
    """Launch choices for one prefill problem, the predicted fastest first (the first is the default).

    BLOCK_M: query rows per program; num_warps / num_stages: Triton launch options; kv_prepass: write
    K/V codes once before the attention loop instead of re-quantizing them in every query tile;
    q_prepass: the same for Q (the kernel then loads Q codes instead of holding the ones it computed
    in registers); codes_fp16: run dots whose operands are both codes in float16 (bf16 inputs). None of
    these changes numerics.
    """
    if problem.device != "cuda":
        return [{"BLOCK_M": 32, "num_warps": 4, "num_stages": 1, "kv_prepass": True},
                {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1, "kv_prepass": False}]
    wide = max(problem.get("qk_dim", 0), problem.get("v_dim", 0)) > 256
    block_n = problem.get("block_n", numerics.DEFAULT_PREFILL_BLOCK_N)
    quantized = any(problem.get(f"{op}_quant") for op in "qkv")
    if wide:
        # 576/512: the accumulator and Q of a 64-row tile overflow 255 registers per thread (ptxas,
        # sm_90a: 1184 B spilled at 64 rows / 8 warps, 24 B at 32 rows / 8 warps); K + V tiles leave
        # shared memory for one stage only
        out = [{"BLOCK_M": 32, "num_warps": 8, "num_stages": 1},
               {"BLOCK_M": 16, "num_warps": 4, "num_stages": 1},
               {"BLOCK_M": 64, "num_warps": 8, "num_stages": 1}]
    elif quantized:
        # A 128-row CTA's two warpgroups meet at a barrier every key tile (the K/V pipeline), so one's
        # softmax / P quantization cannot overlap the other's MMA; two independent 64-row CTAs per SM
        # (255 registers x 128 threads, 104 KiB shared each) can.
        out = [{"BLOCK_M": 64, "num_warps": 4, "num_stages": 2},
               {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2, "q_prepass": True},
               {"BLOCK_M": 128, "num_warps": 8, "num_stages": 2},
               {"BLOCK_M": 128, "num_warps": 8, "num_stages": 3, "q_prepass": True},
               {"BLOCK_M": 128, "num_warps": 8, "num_stages": 2, "q_prepass": True}]
    else:
        out = [{"BLOCK_M": 128, "num_warps": 8, "num_stages": 2},  # measured 375-417 TFLOP/s
               {"BLOCK_M": 64, "num_warps": 4, "num_stages": 2},
               {"BLOCK_M": 128, "num_warps": 8, "num_stages": 3}]
    if block_n >= 128:
        out = [dict(c, BLOCK_M=min(c["BLOCK_M"], 64)) for c in out]
    out = [dict(c, kv_prepass=True) for c in out]
    if quantized and problem.get("dtype") == "bfloat16":
        out.append(dict(out[0], codes_fp16=False))  # the bf16 dots on codes this path replaced, for comparison
    if problem.get("k_quant") or problem.get("v_quant"):
        out.append(dict(out[0], kv_prepass=False))
    unique = []
    for c in out:
        if c not in unique:
            unique.append(c)
    return unique


def _prepass_k(k: torch.Tensor, fmt: int, factor: float, hw_fp8: bool, dtype: torch.dtype) -> torch.Tensor:
    """K's codes [total_k, kv_heads, dqk] in dtype."""
    total_k, kv_heads, dqk = k.shape
    codes = torch.empty((total_k, kv_heads, dqk), dtype=dtype, device=k.device)
    da, db = _split_dim(dqk)
    block_t = 32
    if total_k:
        _k_codes_kernel[(triton.cdiv(total_k, block_t), kv_heads)](
            k, codes, total_k, k.stride(0), k.stride(1), codes.stride(0), codes.stride(1), factor,
            _recip(factor), DQK=dqk, DA=da, DB=db, BLOCK_T=block_t, K_FMT=fmt, HW_FP8=hw_fp8, num_warps=4)
    return codes


def _prepass_v(v: torch.Tensor, cu_k: torch.Tensor, batch: int, fmt: int, factor: float, hw_fp8: bool,
               dtype: torch.dtype) -> torch.Tensor:
    """V's codes [total_k, kv_heads, dv] in dtype (blocks along each sequence's keys)."""
    total_k, kv_heads, dv = v.shape
    codes = torch.empty((total_k, kv_heads, dv), dtype=dtype, device=v.device)
    block_t = 32
    if total_k and batch:
        # No sequence is longer than total_k; reading the real maximum would synchronize with the GPU.
        _v_codes_kernel[(triton.cdiv(total_k, block_t), kv_heads, batch)](
            v, codes, cu_k, total_k, v.stride(0), v.stride(1), codes.stride(0), codes.stride(1), factor,
            _recip(factor), DV=dv, DVP=max(16, _pow2_at_least(dv)), BLOCK_T=block_t, V_FMT=fmt, HW_FP8=hw_fp8,
            num_warps=4)
    return codes


def _new_output(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Allocate an output the kernel fully writes (tests replace this to poison it with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


def run(call, config: dict):
    """Run one validated :class:`mla_core.specs.PrefillCall`.

    Returns ``(out [total_q, heads, v_dim] in v.dtype, lse [heads, total_q] float32 or None)``.
    """
    q, k, v = call.q, call.k, call.v
    total_q, heads, dqk = q.shape
    kv_heads, dv = k.shape[1], v.shape[2]
    batch = call.cu_seqlens_q.shape[0] - 1
    out = _new_output((total_q, heads, dv), v.dtype, q.device)
    lse = _new_output((heads, total_q), torch.float32, q.device) if call.return_lse else None
    if total_q == 0 or batch == 0 or call.max_seqlen_q == 0:
        return out, lse

    block_m = int(config.get("BLOCK_M", call.block_m))
    block_n = call.block_n
    q_fmt, k_fmt = _FMT_CODE[call.q_quant], _FMT_CODE[call.k_quant]
    v_fmt, p_fmt = _FMT_CODE[call.v_quant], _FMT_CODE[call.p_quant]
    q_f, k_f = _factor(call.q_quant, call.q_amax), _factor(call.k_quant, call.k_amax)
    v_f, p_f = _factor(call.v_quant, call.v_amax), _factor(call.p_quant, call.p_amax)
    hw_fp8 = _hw_mode(q.is_cuda and not _interpreting(), [(q_fmt, q_f), (k_fmt, k_f), (v_fmt, v_f), (p_fmt, p_f)])
    # bf16 dots whose two operands are codes (exact in float16) run in float16: FP8 codes convert to
    # float16 in one instruction per pair, to bf16 only through float32
    codes16 = bool(config.get("codes_fp16", True)) and q.dtype == torch.bfloat16
    qk16, pv16 = codes16 and bool(q_fmt and k_fmt), codes16 and bool(p_fmt and v_fmt)
    prepass = bool(config.get("kv_prepass", True))
    if prepass and k_fmt:
        k, k_fmt = _prepass_k(k, k_fmt, k_f, hw_fp8, torch.float16 if qk16 else k.dtype), 0
    if prepass and v_fmt:
        v, v_fmt = _prepass_v(v, call.cu_seqlens_k, batch, v_fmt, v_f, hw_fp8, torch.float16 if pv16 else v.dtype), 0
    if config.get("q_prepass", False) and q_fmt:
        # Q's codes from the same feature-axis pre-pass as K: the kernel then loads Q like a bf16 Q
        # instead of holding codes it computed in registers
        q, q_fmt = _prepass_k(q, q_fmt, q_f, hw_fp8, torch.float16 if qk16 else q.dtype), 0
    sparse = 0 < call.sparsity_n < call.sparsity_m  # n == 0 is off, n == m keeps every score
    sparse_n, sparse_m = (call.sparsity_n, call.sparsity_m) if sparse else (0, 0)
    da, db = _split_dim(dqk)
    # no (clamped) sequence is longer than q: a max_seqlen_q past it adds no work
    grid = (triton.cdiv(min(call.max_seqlen_q, total_q), block_m), heads, batch)
    _prefill_kernel[grid](
        q, k, v, out, out if lse is None else lse, call.cu_seqlens_q, call.cu_seqlens_k, total_q, k.shape[0],
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0), out.stride(1),
        total_q, call.softmax_scale * LOG2E * q_f * k_f, p_f * v_f, q_f, k_f, v_f, p_f,
        _recip(q_f), _recip(k_f), _recip(v_f), _recip(p_f),
        call.dense_sink_tokens, call.dense_recent_tokens,
        HEAD_GROUP=heads // kv_heads, DQK=dqk, DA=da, DB=db, DV=dv, DVP=max(16, _pow2_at_least(dv)),
        BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=call.causal, Q_FMT=q_fmt, K_FMT=k_fmt, V_FMT=v_fmt,
        P_FMT=p_fmt, SPARSE_N=sparse_n, SPARSE_M=sparse_m, RETURN_LSE=call.return_lse,
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", QK16=qk16, PV16=pv16, HW_FP8=hw_fp8,
        UPCAST=q.dtype == torch.bfloat16 and not (hw_fp8 & 1),
        num_warps=int(config.get("num_warps", 4)), num_stages=int(config.get("num_stages", 2)))
    return out, lse
