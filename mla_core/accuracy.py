"""How mla_core judges a result against the reference backend: relative L2 error and the tolerance per dtype.

One definition, used by the autotuner (a fast but wrong candidate is rejected), ``mla-core check``,
``mla-core demo`` and :mod:`mla_core.testing`.
"""
from __future__ import annotations

import torch

REFERENCE = "reference"
"""Name of the backend whose output defines every op's numerics."""


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64 over finite reference entries; inf when out has a NaN there.

    Non-finite reference entries (LSE -inf of empty rows) must be matched exactly.
    """
    out, ref = out.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(ref)
    if not torch.equal(out[~finite].nan_to_num(), ref[~finite].nan_to_num()):
        return float("inf")
    o, r = out[finite], ref[finite]
    if torch.isnan(o).any():
        return float("inf")
    denom = r.norm().item()
    return (o - r).norm().item() / denom if denom else (o - r).norm().item()


def tolerance(dtype: torch.dtype) -> float:
    """Relative-L2 tolerance of an output in ``dtype`` against the reference.

    float32: the backends accumulate in float32 like the reference but in another order; the error of a
    float32 sum of n terms grows like sqrt(n) * 2^-24 ~ 1e-6 for the lengths tested, so 1e-5 leaves a
    10x margin and still catches any real bug (a dropped key is ~1e-2). bf16/fp16 outputs: one rounding
    of the output to 8 (bf16) significant bits is ~2^-9 = 2e-3 relative; P rounded to V's dtype per tile
    adds the same order; 1e-2 is the bound for both together. FP8 outputs (rope) are compared as float:
    one E4M3 step is 2^-3 relative at worst, ~3e-2 RMS over uniform mantissas, and a correct kernel
    matches the reference's rounding exactly, so 1e-2 still separates exact from off-by-one-step.
    """
    return 1e-5 if dtype == torch.float32 else 1e-2


def _as_tuple(result) -> tuple[torch.Tensor, ...]:
    if isinstance(result, torch.Tensor):
        return (result,)
    return tuple(t for t in result if t is not None)


def compare(result, expected) -> float:
    """Largest relative L2 error over the tensors two op results hold (FP8 tensors compared as float)."""
    errs = [rel_l2(o.float(), r.float()) for o, r in zip(_as_tuple(result), _as_tuple(expected))]
    return max(errs) if errs else 0.0


def output_dtype(result) -> torch.dtype:
    """The dtype of an op result's first tensor (what its tolerance is judged by)."""
    return _as_tuple(result)[0].dtype
