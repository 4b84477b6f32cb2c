"""Reference fused RoPE + FP8 E4M3 quantization (:func:`mla_core.mla_rope_quantize_fp8`).

The rotation runs in float32 from the upcast inputs and the upcast cos/sin cache; each rotated (or
NOPE) value times its per-tensor scale is rounded to E4M3 by :func:`mla_core.numerics.round_e4m3`
(nearest even, saturating at ±448, NaN kept) and stored as ``torch.float8_e4m3fn``.

A position outside the cos/sin table (possible only when content checks are off) is masked, never
gathered: its cos and sin are 0, so that token's two rope outputs are 0; its NOPE outputs are quantized
as usual (the kernels do the same).
"""
from __future__ import annotations

import torch

from mla_core import numerics
from mla_core.specs import FP8, RopeQuantizeCall


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> torch.Tensor:
    """Rotate the last dimension of float32 ``x`` [..., rope] by cos/sin [..., rope/2] (broadcast).

    Neox pairs element i with i + rope/2; interleaved pairs 2i with 2i + 1. Pair i uses cos[i], sin[i]:
    ``(x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)``.
    """
    half = x.shape[-1] // 2
    if is_neox:
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)


def _store_fp8(x: torch.Tensor, scale: float, out: torch.Tensor | None) -> torch.Tensor:
    """E4M3 of float32 ``x * scale`` into ``out`` (any leading strides) or a new FP8 tensor."""
    # round_e4m3 returns E4M3 values in float32, so the cast below is exact.
    q = numerics.round_e4m3(x * scale).to(FP8)
    if out is None:
        return q
    out.copy_(q)
    return out


def rope_quantize_fp8_reference(call: RopeQuantizeCall):
    """Returns ``(q_rope_out [nnz, heads, rope], k_rope_out [nnz, rope], q_nope_out [nnz, heads, nope],
    k_nope_out [nnz, nope])``, FP8 E4M3; the call's buffers when given, else new tensors."""
    half = call.q_rope.shape[-1] // 2
    pos = call.pos_ids.long()
    inside = (pos >= 0) & (pos < call.cos_sin_cache.shape[0])
    table = call.cos_sin_cache
    if table.shape[0] == 0:  # no row to stand in: every position is outside
        table = torch.zeros(1, table.shape[1], dtype=table.dtype, device=table.device)
    rows = torch.where(inside[:, None], table[torch.where(inside, pos, 0)].float(), 0.0)  # [nnz, rope]; row 0 stands in
    cos, sin = rows[:, :half], rows[:, half:]
    q_rot = rotate(call.q_rope.float(), cos[:, None, :], sin[:, None, :], call.is_neox)
    k_rot = rotate(call.k_rope.float(), cos, sin, call.is_neox)
    return (_store_fp8(q_rot, call.quant_scale_q, call.q_rope_out),
            _store_fp8(k_rot, call.quant_scale_kv, call.k_rope_out),
            _store_fp8(call.q_nope.float(), call.quant_scale_q, call.q_nope_out),
            _store_fp8(call.k_nope.float(), call.quant_scale_kv, call.k_nope_out))
