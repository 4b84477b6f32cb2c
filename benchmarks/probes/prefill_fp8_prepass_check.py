"""CPU check of the prefill's one-launch FP8 pre-pass (csrc/mla_prefill_wgmma.cu, fp8_codes_kernel), no GPU.

    python3 benchmarks/probes/prefill_fp8_prepass_check.py

1. Numerics: codes_quotient<false> (q0 = x * rscale, the Markstein-corrected quotient, q0 itself where |q0| > 464
   or |q0| < 2^-20) then e4m3 (cvt.rn.satfinite.e4m3x2.f32 as the PTX ISA defines it), emulated over every bf16
   bit pattern for per-tensor factors across the division-free range (its two ends included), compared bit for
   bit (sign of zero included, NaN as NaN) with the reference rule e4m3(x / scale) (mla_core.numerics: IEEE
   quotient, clamp, torch's float8 cast), i.e. with what main's __fdiv_rn kernel was tested equal to. The fma is
   emulated exactly and E4M3 rounding is written from the format (decode_qdq_conversion_check.py's helpers).
2. Work split: for operand sizes (chunks of 16 B) and grids, every chunk of every operand is visited exactly once
   by the kernel's grid-stride loop (two chunks per thread per step) and its `locate` (operand, offset).
3. Q's codes in the prefill kernel (q_codes): warpgroup w's 128 threads convert every 16-byte chunk of its own Q
   rows (3 slabs of [64 rows x 128 B], the bytes its S reads) exactly once, and nothing outside them (not the other
   warpgroup's rows, which it may be reading in its first S: WG0 may start S(0) while WG1 still converts).
   The values are the pre-pass's (the same codes8), so part 1 covers them.
"""
from __future__ import annotations

import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from decode_qdq_conversion_check import e4m3_rne_sat, fma32  # noqa: E402

from mla_core import numerics  # noqa: E402

LO, HI = 1e-12 / 2688, 5e20 / 448  # backends/cuda/mla_core_cuda/launch_args.EXACT_DIV_FREE_RANGE


def emulate_quotient(x: np.ndarray, scale: np.float32) -> np.ndarray:
    """codes_quotient<false>: the division-free quotient with its two guards (float32 throughout)."""
    rscale = np.float32(np.float32(1.0) / scale)  # RN(1 / scale), as the host's _f32_reciprocal
    with np.errstate(over="ignore", invalid="ignore", under="ignore"):
        q0 = (x * rscale).astype(np.float32)
        q = fma32(fma32(-q0, np.full_like(x, scale), x), np.full_like(x, rscale), q0)
        a = np.abs(q0)
        return np.where((a > 464.0) | (a < 2.0 ** -20), q0, q)


def check_numerics() -> None:
    bits = np.arange(1 << 16, dtype=np.uint32)
    x = (bits << 16).view(np.float32)
    scales = [LO, LO * 1.0001, 1e-9, 2.0 ** -10, 0.0125 / 448, 3.7 / 448, 3.5 / 448, 1.0 / 448, 26.88 / 448, 0.37,
              1.0, 57.5 / 448, 1000.0 / 448, 3.0e4, 7.7e11, 1e18, HI / 1.0001, HI]
    for s in scales:
        s32 = np.float32(s)
        assert LO <= float(s32) <= HI or s in (LO, HI), s
        # +-Inf quotients clipped first: the helper's grid step is NaN at Inf (saturation is the same above 448)
        codes = e4m3_rne_sat(np.clip(emulate_quotient(x, s32), -1e6, 1e6))
        got = torch.from_numpy(codes).to(torch.bfloat16)
        ref = numerics.round_e4m3(numerics.divide(torch.from_numpy(x.copy()), float(s32))).to(torch.bfloat16)
        nan = ref.isnan()
        assert torch.equal(got.isnan(), nan), f"scale {s}: NaN positions differ"
        same = got[~nan].view(torch.int16) == ref[~nan].view(torch.int16)  # bits: -0 and +0 apart
        assert bool(same.all()), (f"scale {s}: {int((~same).sum())} codes differ, e.g. x = "
                                  f"{x[~nan.numpy()][~same.numpy()][:4]}")
    print(f"numerics: every bf16 value x {len(scales)} factors (the range's ends included): the guarded division-"
          "free quotient's E4M3 codes equal the reference's bit for bit (Inf -> +-448, -0 kept, NaN) ... OK")


def check_split() -> None:
    cases = [([5, 7, 3], 1, 4), ([50_331_648, 50_331_648, 33_554_432], 1056, 256), ([1, 0, 0], 2, 256),
             ([0, 9, 0], 1, 4), ([513, 1, 511], 3, 64), ([1000], 2, 32)]
    for sizes, blocks, threads in cases:
        n8 = (sizes + [0, 0])[:3]
        total = sum(n8)
        step = blocks * threads
        if total > 10_000_000:  # a large case: the pattern per thread, on a thinned thread set
            tids = np.arange(0, step, 97)
            i = tids[:, None] + 2 * step * np.arange(-(-total // (2 * step)) + 1)[None, :]
            both = np.concatenate([i.ravel(), (i + step).ravel()])
            both = both[both < total]
            assert len(np.unique(both)) == len(both), f"{sizes}: a chunk visited twice"
            continue
        seen = np.zeros(total, np.int64)
        for tid in range(step):
            for i in range(tid, total, 2 * step):
                for c in (i, i + step):
                    if c < total:
                        j = 0 if c < n8[0] else (1 if c < n8[0] + n8[1] else 2)
                        first = [0, n8[0], n8[0] + n8[1]][j]
                        assert 0 <= c - first < n8[j]
                        seen[c] += 1
        assert (seen == 1).all(), f"{sizes}, grid {blocks} x {threads}: chunks not visited exactly once"
    print(f"work split: {len(cases)} operand sets x grids: every chunk visited once, in its operand ... OK")


def check_q_codes() -> None:
    q_wg_bytes, slab = 64 * 192 * 2, 64 * 128  # kQWgBytes, kSlab
    for wg in range(2):
        base = wg * q_wg_bytes  # sqw = sq + wg * kQWgBytes
        s_reads = {base + c * slab + r * 128 + b for c in range(3) for r in range(64) for b in range(0, 128, 16)}
        seen: dict[int, int] = {}
        for t in range(128):
            for half in range(2):
                for u in range(6):
                    a = base + 16 * (t + 128 * (6 * half + u))
                    seen[a] = seen.get(a, 0) + 1
        assert set(seen) == s_reads and set(seen.values()) == {1}, f"warpgroup {wg}: chunks not its rows once"
    print("Q codes: each warpgroup converts its own 3 slabs' 1,536 chunks exactly once, nothing else ... OK")


if __name__ == "__main__":
    check_numerics()
    check_split()
    check_q_codes()
