"""Two small Triton kernels that finish what cuDNN returns, driven by per-row flags computed on the device.

cuDNN leaves unspecified what a query row with no visible key holds (a sequence with no keys, or the
pieces of the causal split that hold queries but no keys), and torch returns the LSE as
``[tokens, heads, 1]``. The op defines such rows as output 0 and LSE -inf, and its LSE as
``[heads, tokens]``. The flags (one int8 per query row) come from ``cu_seqlens`` on the device, so
nothing here reads values on the host: both kernels can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H = 16


@triton.jit
def _mask_rows_kernel(out_ptr, lse_ptr, lse_out_ptr, ok_ptr, tokens, heads, dim, s_ot, s_oh, s_lt, s_lh,
                      HAS_LSE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (token, head block): rows flagged 0 get output 0 (in place) and LSE -inf; the LSE is
    copied from any strided [tokens, heads] view into a contiguous [heads, tokens] one."""
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    h64 = offs_h.to(tl.int64)
    ok = tl.load(ok_ptr + t)
    if HAS_LSE:
        lse = tl.load(lse_ptr + t * s_lt + h64 * s_lh, mask=mask_h, other=0.0)
        tl.store(lse_out_ptr + h64 * tokens + t, tl.where(ok != 0, lse, float("-inf")), mask=mask_h)
    if ok == 0:
        offs_d = tl.arange(0, BLOCK_D)
        ptrs = out_ptr + t * s_ot + h64[:, None] * s_oh + offs_d[None, :]
        tl.store(ptrs, tl.zeros((BLOCK_H, BLOCK_D), dtype=out_ptr.dtype.element_ty),
                 mask=mask_h[:, None] & (offs_d < dim)[None, :])


@triton.jit
def _merge_kernel(a_ptr, la_ptr, oka_ptr, b_ptr, lb_ptr, okb_ptr, out_ptr, lse_out_ptr, tokens, heads, dim,
                  s_at, s_ah, s_bt, s_bh, s_ot, s_oh, s_lat, s_lah, s_lbt, s_lbh,
                  HAS_LSE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (token, head block): merge two partial results over disjoint keys by their LSE.

    A part whose row flag is 0 is empty: neither its output nor its LSE is read (whatever cuDNN left
    there, NaN included, cannot leak). lse = logaddexp(a, b), out = exp(a - lse) * A + exp(b - lse) * B
    in float32; rows with both parts empty give output 0 and LSE -inf.
    """
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    h64 = offs_h.to(tl.int64)
    # per-head masks built from the row flags (a block mask, not a scalar one, which the interpreter needs)
    mask_ha = mask_h & (tl.load(oka_ptr + t) + tl.zeros_like(offs_h) != 0)
    mask_hb = mask_h & (tl.load(okb_ptr + t) + tl.zeros_like(offs_h) != 0)
    a = tl.load(la_ptr + t * s_lat + h64 * s_lah, mask=mask_ha, other=float("-inf"))
    b = tl.load(lb_ptr + t * s_lbt + h64 * s_lbh, mask=mask_hb, other=float("-inf"))
    mx = tl.maximum(a, b)
    has = mx > float("-inf")
    mx_safe = tl.where(has, mx, 0.0)
    ea = tl.exp(a - mx_safe)
    eb = tl.exp(b - mx_safe)
    total = tl.where(has, ea + eb, 1.0)
    wa = tl.where(has, ea / total, 0.0)
    wb = tl.where(has, eb / total, 0.0)
    if HAS_LSE:
        tl.store(lse_out_ptr + h64 * tokens + t, tl.where(has, mx_safe + tl.log(total), float("-inf")), mask=mask_h)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = (offs_d < dim)[None, :]
    m2 = mask_h[:, None] & mask_d
    oa = tl.load(a_ptr + t * s_at + h64[:, None] * s_ah + offs_d[None, :], mask=mask_ha[:, None] & mask_d, other=0.0)
    ob = tl.load(b_ptr + t * s_bt + h64[:, None] * s_bh + offs_d[None, :], mask=mask_hb[:, None] & mask_d, other=0.0)
    o = wa[:, None] * oa.to(tl.float32) + wb[:, None] * ob.to(tl.float32)
    tl.store(out_ptr + t * s_ot + h64[:, None] * s_oh + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=m2)


def _grid(tokens: int, heads: int) -> tuple[int, int]:
    return tokens, triton.cdiv(heads, BLOCK_H)


def mask_rows(out: torch.Tensor, lse: torch.Tensor | None, rows_ok: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Zero the rows of ``out`` [tokens, heads, dim] (in place) whose ``rows_ok`` [tokens] int8 is 0.

    ``lse``: None, or a [heads, tokens] float32 view with any strides; returned as a new contiguous
    [heads, tokens] tensor with -inf at those rows.
    """
    tokens, heads, dim = out.shape
    lse_out = None if lse is None else torch.empty((heads, tokens), dtype=torch.float32, device=out.device)
    if tokens:
        _mask_rows_kernel[_grid(tokens, heads)](
            out, out if lse is None else lse, out if lse is None else lse_out, rows_ok, tokens, heads, dim,
            out.stride(0), out.stride(1), 0 if lse is None else lse.stride(1), 0 if lse is None else lse.stride(0),
            HAS_LSE=lse is not None, BLOCK_H=BLOCK_H, BLOCK_D=triton.next_power_of_2(dim))
    return out, lse_out


def merge(out_a: torch.Tensor, lse_a: torch.Tensor, ok_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor,
          ok_b: torch.Tensor, need_lse: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Merge two partial results over disjoint key sets.

    out_a / out_b [tokens, heads, dim] (last dim contiguous); lse_a / lse_b [heads, tokens] float32 views
    with any strides; ok_a / ok_b [tokens] int8 (0: that part has no key for the row). Returns a new
    contiguous output in out_a's dtype and, when ``need_lse``, a contiguous [heads, tokens] LSE.
    """
    tokens, heads, dim = out_a.shape
    out = torch.empty_like(out_a, memory_format=torch.contiguous_format)
    lse_out = torch.empty((heads, tokens), dtype=torch.float32, device=out_a.device) if need_lse else None
    if tokens:
        _merge_kernel[_grid(tokens, heads)](
            out_a, lse_a, ok_a, out_b, lse_b, ok_b, out, out if lse_out is None else lse_out, tokens, heads, dim,
            out_a.stride(0), out_a.stride(1), out_b.stride(0), out_b.stride(1), out.stride(0), out.stride(1),
            lse_a.stride(1), lse_a.stride(0), lse_b.stride(1), lse_b.stride(0),
            HAS_LSE=need_lse, BLOCK_H=BLOCK_H, BLOCK_D=triton.next_power_of_2(dim))
    return out, lse_out
