"""``flashinfer.rope.mla_rope_quantize_fp8`` on mla_core (same signature and defaults)."""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from ... import ops


def mla_rope_quantize_fp8(q_rope: torch.Tensor, k_rope: torch.Tensor, q_nope: torch.Tensor, k_nope: torch.Tensor,
                          cos_sin_cache: torch.Tensor, pos_ids: torch.Tensor, is_neox: bool = True,
                          quantize_dtype: Optional[torch.dtype] = None, quant_scale_q: float = 1.0,
                          quant_scale_kv: float = 1.0, q_rope_out: Optional[torch.Tensor] = None,
                          k_rope_out: Optional[torch.Tensor] = None, q_nope_out: Optional[torch.Tensor] = None,
                          k_nope_out: Optional[torch.Tensor] = None,
                          enable_pdl: bool = False) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """RoPE on the 64-value tails of Q [nnz, heads, 64] and K [nnz, 64], then FP8 E4M3 of all four parts.

    Arguments and results as :func:`mla_core.mla_rope_quantize_fp8` (FlashInfer's MLA layout: 2-D k_rope /
    k_nope); ``enable_pdl`` is accepted and ignored. Returns ``(q_rope_out, k_rope_out, q_nope_out, k_nope_out)``.
    """
    return ops.mla_rope_quantize_fp8(q_rope, k_rope, q_nope, k_nope, cos_sin_cache, pos_ids, is_neox, quantize_dtype,
                                     quant_scale_q, quant_scale_kv, q_rope_out, k_rope_out, q_nope_out, k_nope_out,
                                     enable_pdl)
