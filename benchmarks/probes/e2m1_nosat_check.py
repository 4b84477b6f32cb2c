"""Exhaustive CPU check (~10 min on 2 cores) of the prefill kernel's P rounding for kP 3 in its round (o) form
(csrc/qdq.cuh round_e2m1_nonneg_unsat, then the pair's clamp in bf16 in csrc/mla_prefill_wgmma.cu p_nvfp4):

    e  = bits(max(x, 1)) & 0x7f800000   (the power of two of x's binade, at least 1; NOT clamped at 4)
    r  = fma(e, 1.5 * 2^22, x)          (one rounding of x + m, m = 1.5 * 2^22 * e exact in the fma: = RN(x + m))
    r  = fma(-e, 1.5 * 2^22, r)         (r - m: exact, or +Inf where the first fma overflowed)
    v  = min.NaN.bf16x2(bf16(r), 6)     (after the pair's cvt.rn.bf16x2.f32: the saturation at 6, two values at once)

against mla_core.numerics.round_e2m1 on every float32 bit pattern 0x00000000 .. 0x7fffffff except +Inf (0x7f800000):
+0, positive subnormals, normals and the positive NaNs. (+Inf gives NaN here: e = +Inf, Inf - Inf. The kernel's kP 3
quotient is never +Inf: P is in [0, 1] or NaN and 1 / s <= 2^61 for the division-free range of g.)
The fma are emulated in float64 (the product e * 1.5 * 2^22 and the sum are exact there: at most 48 significant bits)
then rounded to float32 (overflow -> +Inf as the fma's). Exits 1 on the first mismatching chunk (and prints it)."""
from __future__ import annotations

import sys

import numpy as np
import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def device_formula(x: np.ndarray) -> np.ndarray:
    y = np.fmax(x, np.float32(1.0))  # fmax drops NaN (FMNMX): e = 1 for NaN
    e = (y.view(np.uint32) & np.uint32(0x7F800000)).view(np.float32).astype(np.float64)
    m = e * 6291456.0  # exact in float64
    r = (x.astype(np.float64) + m).astype(np.float32)  # fma(e, M, x): one rounding (overflow -> +Inf)
    r = (r.astype(np.float64) - m).astype(np.float32)  # fma(-e, M, r): exact (or +Inf)
    rb = torch.from_numpy(r).to(torch.bfloat16)  # cvt.rn.bf16x2.f32 (NaN stays NaN)
    six = torch.tensor(6.0, dtype=torch.bfloat16)
    v = torch.where(torch.isnan(rb), rb, torch.minimum(rb, six))  # min.NaN.bf16x2
    return v.float().numpy()


def main() -> int:
    chunk = 1 << 25
    total = 1 << 31
    for start in range(0, total, chunk):
        bits = np.arange(start, start + chunk, dtype=np.uint32)
        bits = bits[bits != np.uint32(0x7F800000)]
        x = bits.view(np.float32)
        with np.errstate(invalid="ignore", over="ignore"):
            got = device_formula(x)
        want = numerics.round_e2m1(torch.from_numpy(x)).numpy()
        same = (got == want) | (np.isnan(got) & np.isnan(want))
        if not same.all():
            i = int(np.argmin(same))
            print(f"MISMATCH at bits {int(bits[i]):#010x} (x = {x[i]!r}): device {got[i]!r}, numerics {want[i]!r}")
            return 1
    print(f"round_e2m1_nonneg_unsat + bf16 clamp == numerics.round_e2m1 on all {total - 1} non-negative float32 bit "
          "patterns except +Inf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
