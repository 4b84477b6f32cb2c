"""Exhaustive CPU check (about 2-4 min on 2 cores) that qdq.cuh's round_e2m1_nonneg (the prefill kernel's E2M1 rounding
of P's quotients, which are >= +0) equals mla_core.numerics.round_e2m1 on every non-negative float32 bit pattern
(+0 .. +Inf and the positive NaNs), emulated in numpy float32 (IEEE, round to nearest even, as the device's FADD /
FSETP): m = x < 2 ? 1.5 * 2^22 : (x < 4 ? 1.5 * 2^23 : 1.5 * 2^24); r = (x + m) - m; r > 6 ? 6 : r.
Exits 1 on the first mismatching chunk (and prints it)."""
from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def device_formula(x: np.ndarray) -> np.ndarray:
    m = np.where(x < np.float32(2.0), np.float32(6291456.0),
                 np.where(x < np.float32(4.0), np.float32(12582912.0), np.float32(25165824.0))).astype(np.float32)
    r = (x + m).astype(np.float32) - m
    return np.where(r > np.float32(6.0), np.float32(6.0), r).astype(np.float32)  # NaN stays NaN (the compare fails)


def main() -> int:
    chunk = 1 << 25
    total = 1 << 31  # bit patterns 0x00000000 .. 0x7fffffff: +0, positive subnormals, normals, +Inf, NaNs
    for start in range(0, total, chunk):
        bits = np.arange(start, start + chunk, dtype=np.uint32)
        x = bits.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            got = device_formula(x)
        want = numerics.round_e2m1(torch.from_numpy(x)).numpy()
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        if not same.all():
            i = int(np.argmin(same))
            print(f"MISMATCH at bits {int(bits[i]):#010x} (x = {x[i]!r}): device {got[i]!r}, numerics {want[i]!r}")
            return 1
    print(f"round_e2m1_nonneg == numerics.round_e2m1 on all {total} non-negative float32 bit patterns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
