"""Exhaustive CPU check (a few minutes on 2 cores) that qdq.cuh's round_e2m1_nonneg in its 5-instruction form (round
n, the prefill kernel's E2M1 rounding of P's quotients, which are >= +0 or NaN) equals mla_core.numerics.round_e2m1
on every non-negative float32 bit pattern (+0 .. +Inf and the positive NaNs), emulated in numpy float32 (IEEE, round
to nearest even):

    x6 = min.NaN(x, 6)                  (NaN stays NaN)
    e  = bits(max(x6, 1)) & 0x7f800000  (the power of two 1, 2 or 4 of x6's binade, clamped to [1, 4])
    r  = fma(e, 1.5 * 2^22, x6)         (one rounding of x6 + m, m = 1.5 * 2^(22 + log2 e) exact: = RN(x6 + m))
    r  = fma(-e, 1.5 * 2^22, r)         (r - m, exact)

The emulation takes m = e * 1.5 * 2^22 in float32 (exact: a power of two times 3 * 2^21) and the two fma as the
float32 sum and difference (each fma's exact product is m, so its one rounding is the float32 addition's).
Exits 1 on the first mismatching chunk (and prints it)."""
from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def device_formula(x: np.ndarray) -> np.ndarray:
    x6 = np.minimum(x, np.float32(6.0))  # numpy's minimum propagates NaN (min.NaN.f32)
    y = np.fmax(x6, np.float32(1.0))  # fmax drops NaN (FMNMX)
    e = (y.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32)
    m = (e * np.float32(6291456.0)).astype(np.float32)
    r = (x6 + m).astype(np.float32)
    return (r - m).astype(np.float32)


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
    print(f"round_e2m1_nonneg (5 instructions) == numerics.round_e2m1 on all {total} non-negative float32 bit patterns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
