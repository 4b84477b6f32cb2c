"""Host-side helpers the kernel launchers share (decode, sparse decode, prefill): float32 rounding of the scalar
arguments, the division-free range of per-tensor factors, 16-byte aligned operands."""
from __future__ import annotations

import torch

EXACT_DIV_FREE_RANGE = (1e-12 / 2688, 5e20 / 448)
"""Per-tensor factors (amax / 448, amax / 2688) for which the kernels divide without a division instruction
(Markstein-corrected reciprocal, bitwise the IEEE quotient); outside it they use ``__fdiv_rn``."""


def f32(x: float) -> float:
    """``x`` rounded to float32 (as the kernel holds it)."""
    return float(torch.tensor(x, dtype=torch.float32))


def aligned(t: torch.Tensor, multiple: int) -> torch.Tensor:
    """``t`` itself when its data starts on a ``multiple``-byte boundary, else a fresh (aligned) copy."""
    return t if t.data_ptr() % multiple == 0 else t.clone()
