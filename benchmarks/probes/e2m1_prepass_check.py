"""Exhaustive CPU check (~6 min on 2 cores) that the NVFP4 pre-pass's E2M1 rounding (qdq.cuh nvfp4_value, round n:
e2m1_signed = the sign select of round_e2m1_nonneg(|x|)) gives the bits of qdq.cuh's select-form round_e2m1 (what
the pre-pass used before, and what the decode kernels use) on every float32 bit pattern. Both forms are
`x < 0 ? -r(|x|) : r(|x|)` with the same select, so it suffices that r_old(a) == r_new(a) on all 2^31 non-negative
patterns a (+0 .. +Inf, the positive NaNs), emulated in numpy float32 (IEEE, nearest even):

    r_old(a): inv_step, step = (2, .5) if a < 2 else (1, 1) if a < 4 else (.5, 2);
              r = ((a * inv_step + 1.5 * 2^23) - 1.5 * 2^23) * step; r > 6 ? 6 : r
    r_new(a): round_e2m1_nonneg (benchmarks/probes/e2m1_nonneg5_check.py's device_formula)

Also checks both against mla_core.numerics.round_e2m1. Exits 1 on the first mismatching chunk (and prints it)."""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, ".")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2m1_nonneg5_check import device_formula  # noqa: E402
from mla_core import numerics  # noqa: E402

C = np.float32(12582912.0)  # 1.5 * 2^23


def select_form(a: np.ndarray) -> np.ndarray:
    """qdq.cuh round_e2m1's magnitude (a >= 0 or NaN): NaN compares false, so it takes the last branch."""
    inv_step = np.where(a < 2, np.float32(2), np.where(a < 4, np.float32(1), np.float32(0.5))).astype(np.float32)
    step = np.where(a < 2, np.float32(0.5), np.where(a < 4, np.float32(1), np.float32(2))).astype(np.float32)
    r = (((a * inv_step).astype(np.float32) + C).astype(np.float32) - C).astype(np.float32)
    r = (r * step).astype(np.float32)
    return np.where(r > 6, np.float32(6), r).astype(np.float32)


def main() -> int:
    chunk = 1 << 25
    total = 1 << 31
    for start in range(0, total, chunk):
        a = np.arange(start, start + chunk, dtype=np.uint32).view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            old, new = select_form(a), device_formula(a)
        want = numerics.round_e2m1(torch.from_numpy(a)).numpy()
        for name, got in (("new vs old", new), ("old vs numerics", old)):
            ref = old if name == "new vs old" else want
            same = (got == ref) | (np.isnan(got) & np.isnan(ref))
            if not same.all():
                i = int(np.argmin(same))
                print(f"MISMATCH ({name}) at a = {a[i]!r} ({a[i:i+1].view(np.uint32)[0]:#010x}): {got[i]!r} vs {ref[i]!r}")
                return 1
    print(f"e2m1_signed's magnitude == the select form == numerics.round_e2m1 on all {total} non-negative patterns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
