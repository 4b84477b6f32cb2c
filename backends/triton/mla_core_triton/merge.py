"""Triton ``merge_attn_states``: one kernel merging two partial attention results by their LSE."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from mla_core.specs import MergeCall


@triton.jit
def _merge_kernel(pre_o_ptr, pre_lse_ptr, suf_o_ptr, suf_lse_ptr, out_ptr, out_lse_ptr,
                  tokens, heads, dim,
                  s_pt, s_ph, s_st, s_sh, s_ot, s_oh, s_plh, s_slh, s_olh,
                  BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (token, head block): lse = logaddexp(a, b); out = exp(a - lse) * pre + exp(b - lse) * suf.

    An LSE of -inf or +inf is an empty state; rows where both are empty give output 0 and LSE -inf.
    Math in fp32, output in out's dtype.
    """
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = offs_h < heads
    a = tl.load(pre_lse_ptr + offs_h * s_plh + t, mask=mask_h, other=float("-inf"))
    b = tl.load(suf_lse_ptr + offs_h * s_slh + t, mask=mask_h, other=float("-inf"))
    # +inf marks an empty state as -inf does (FlashAttention / FlashMLA / vLLM; numerics.empty_state_lse)
    a = tl.where(a == float("inf"), float("-inf"), a)
    b = tl.where(b == float("inf"), float("-inf"), b)
    mx = tl.maximum(a, b)
    mx_safe = tl.where(mx == float("-inf"), 0.0, mx)
    ea = tl.exp(a - mx_safe)
    eb = tl.exp(b - mx_safe)
    total = ea + eb
    has = total > 0
    inv = 1.0 / tl.where(has, total, 1.0)
    wa = tl.where(has, ea * inv, 0.0)
    wb = tl.where(has, eb * inv, 0.0)
    tl.store(out_lse_ptr + offs_h * s_olh + t, tl.where(has, mx_safe + tl.log(tl.where(has, total, 1.0)),
                                                         float("-inf")), mask=mask_h)
    h64 = offs_h.to(tl.int64)[:, None]
    for d0 in range(0, dim, BLOCK_D):
        offs_d = d0 + tl.arange(0, BLOCK_D)
        m = mask_h[:, None] & (offs_d[None, :] < dim)
        po = tl.load(pre_o_ptr + t * s_pt + h64 * s_ph + offs_d[None, :], mask=m, other=0.0).to(tl.float32)
        so = tl.load(suf_o_ptr + t * s_st + h64 * s_sh + offs_d[None, :], mask=m, other=0.0).to(tl.float32)
        o = wa[:, None] * po + wb[:, None] * so
        tl.store(out_ptr + t * s_ot + h64 * s_oh + offs_d[None, :], o.to(out_ptr.dtype.element_ty), mask=m)


def configs(problem) -> list[dict]:
    """Launch choices: heads per program and warps."""
    return [{"block_h": 4, "num_warps": 4}, {"block_h": 1, "num_warps": 4}, {"block_h": 8, "num_warps": 8},
            {"block_h": 16, "num_warps": 8}]


def run(call: MergeCall, config: dict):
    """Returns (output [tokens, heads, dim], output_lse [heads, tokens] fp32), written in place when given."""
    pre, suf = call.prefix_output, call.suffix_output
    tokens, heads, dim = pre.shape
    # a new output is contiguous whatever pre's strides (empty_like would copy a permuted layout)
    out = call.output if call.output is not None else torch.empty(pre.shape, dtype=pre.dtype, device=pre.device)
    out_lse = call.output_lse if call.output_lse is not None else torch.empty(
        heads, tokens, dtype=torch.float32, device=pre.device)
    if tokens == 0 or dim == 0:
        return out, out_lse
    block_h = min(int(config.get("block_h", 4)), triton.next_power_of_2(heads))
    block_d = min(triton.next_power_of_2(dim), max(64, 4096 // block_h))
    grid = (tokens, triton.cdiv(heads, block_h))
    _merge_kernel[grid](
        pre, call.prefix_lse, suf, call.suffix_lse, out, out_lse, tokens, heads, dim,
        pre.stride(0), pre.stride(1), suf.stride(0), suf.stride(1), out.stride(0), out.stride(1),
        call.prefix_lse.stride(0), call.suffix_lse.stride(0), out_lse.stride(0),
        BLOCK_H=block_h, BLOCK_D=block_d, num_warps=int(config.get("num_warps", 4)))
    return out, out_lse
