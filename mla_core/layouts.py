"""The two DeepSeek-V3.2 FP8 cache-row layouts of :func:`mla_core.sparse_mla_fp8_decode`, and conversions.

A latent row is 576 values: 512 latent (NOPE, also V) then 64 RoPE values.

``fp8`` (MATE, 576 bytes)
    576 FP8 E4M3 values, one per-tensor scale that the caller folds into ``bmm1_scale`` / ``bmm2_scale``
    (``pack_fp8(x, quant_scale)`` stores ``e4m3(x * quant_scale)``, the way ``mla_rope_quantize_fp8``
    writes a cache row).
``fp8_ds_mla`` (FlashMLA / vLLM, 656 bytes)
    bytes ``[0, 512)``: 512 E4M3 codes of the latent values; ``[512, 528)``: four float32 scales, scale j
    for latent values ``[128 j, 128 j + 128)``; ``[528, 656)``: the 64 RoPE values as bf16 (not quantized).
    A latent value is ``code * scale``. ``pack_fp8_ds_mla`` picks ``scale = amax(block) / 448`` (float32;
    1.0 for an all-zero block) and ``code = e4m3(x / scale)`` (correctly rounded division, nearest even).

Every function works on any leading shape (a single row, ``[tokens, 576]``, a paged cache
``[pages, page_size, 576]``) and on any device; unpacking returns float32.
"""
from __future__ import annotations

import torch

from . import numerics
from .specs import DS_MLA_ROW_BYTES, DS_MLA_SCALE_BLOCK, FP8, SPARSE_LATENT, SPARSE_ROPE

ROW = SPARSE_LATENT + SPARSE_ROPE
"""Values per latent row (512 + 64)."""
_SCALES = SPARSE_LATENT // DS_MLA_SCALE_BLOCK  # 4 float32 scales per fp8_ds_mla row
_SCALE_BYTES = slice(SPARSE_LATENT, SPARSE_LATENT + 4 * _SCALES)
_ROPE_BYTES = slice(SPARSE_LATENT + 4 * _SCALES, DS_MLA_ROW_BYTES)


def _check_width(name: str, x: torch.Tensor, width: int) -> None:
    if x.shape[-1] != width:
        raise ValueError(f"{name}: got last dimension {x.shape[-1]}, needs {width}")


def pack_fp8(latent: torch.Tensor, quant_scale: float = 1.0) -> torch.Tensor:
    """[..., 576] float rows -> [..., 576] FP8 E4M3 ``e4m3(x * quant_scale)`` (nearest even, saturating)."""
    _check_width("latent", latent, ROW)
    return numerics.round_e4m3(latent.float() * quant_scale).to(FP8)


def unpack_fp8(rows: torch.Tensor, descale: float = 1.0) -> torch.Tensor:
    """[..., 576] FP8 rows -> [..., 576] float32 values ``code * descale``."""
    _check_width("rows", rows, ROW)
    return rows.float() * descale


def pack_fp8_ds_mla(latent: torch.Tensor) -> torch.Tensor:
    """[..., 576] float rows -> [..., 656] uint8 fp8_ds_mla rows (module docstring)."""
    _check_width("latent", latent, ROW)
    lead = latent.shape[:-1]
    nope = latent[..., :SPARSE_LATENT].float().reshape(*lead, _SCALES, DS_MLA_SCALE_BLOCK)
    amax = nope.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / numerics.E4M3_MAX, 1.0).float()  # tensor / scalar: float32, per block
    codes = numerics.round_e4m3(nope / scale).to(FP8).reshape(*lead, SPARSE_LATENT)
    rope = latent[..., SPARSE_LATENT:].to(torch.bfloat16).contiguous()
    return torch.cat((codes.view(torch.uint8), scale.reshape(*lead, _SCALES).contiguous().view(torch.uint8),
                      rope.view(torch.uint8)), dim=-1)


def ds_mla_scales(rows: torch.Tensor) -> torch.Tensor:
    """[..., 656] fp8_ds_mla rows (uint8 or FP8) -> [..., 4] float32 block scales."""
    _check_width("rows", rows, DS_MLA_ROW_BYTES)
    return rows.view(torch.uint8)[..., _SCALE_BYTES].contiguous().view(torch.float32)


def unpack_fp8_ds_mla(rows: torch.Tensor) -> torch.Tensor:
    """[..., 656] fp8_ds_mla rows (uint8, or FP8 as FlashMLA types them) -> [..., 576] float32 values."""
    _check_width("rows", rows, DS_MLA_ROW_BYTES)
    raw = rows.view(torch.uint8)
    codes = raw[..., :SPARSE_LATENT].contiguous().view(FP8).float()
    scales = ds_mla_scales(raw).repeat_interleave(DS_MLA_SCALE_BLOCK, dim=-1)
    rope = raw[..., _ROPE_BYTES].contiguous().view(torch.bfloat16).float()
    return torch.cat((codes * scales, rope), dim=-1)


def unpack(rows: torch.Tensor) -> torch.Tensor:
    """Either layout, told apart by the last dimension (576: FP8 codes as they are, 656: fp8_ds_mla) -> float32."""
    return unpack_fp8_ds_mla(rows) if rows.shape[-1] == DS_MLA_ROW_BYTES else unpack_fp8(rows)
