"""CPU emulation of the prefill kernel's P NVFP4 (csrc/mla_prefill_wgmma.cu, p_nvfp4): which accumulator registers
form a 16-key block, the quad shuffles, the owner lanes of the block codes, against mla_core.numerics (1 s).

One consumer warpgroup's 64 x 64 tile: thread t (0..127) of warp w = t // 32, lane l, holds element e (0..31) of row
16 w + l // 4 + 8 ((e // 2) % 2), key 8 (e // 4) + 2 (l % 4) + e % 2 (the wgmma m64n64 f32 accumulator). The
emulation follows p_nvfp4 step by step (bf16 rounding, the per-thread block maxima of sc[8 ks + {0,1,4,5}] and
sc[8 ks + {2,3,6,7}], xor shuffles 1 and 2, lane q's codes of blocks 2q and 2q + 1, every lane reading block b's
code from lane (l & ~3) | (b >> 1), the values e2m1(p / (c·g))·c with correctly rounded float32 quotients) and
compares the tile it writes with numerics.nvfp4_unscaled(P rounded to bf16) along the keys. Exits 1 on a mismatch.
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def emulate(p: torch.Tensor, g: float) -> torch.Tensor:
    """p [64, 64] float32 (rows, keys) -> the values p_nvfp4 leaves in the accumulator, as a [64, 64] tile."""
    regs = torch.zeros(128, 32)
    for t in range(128):
        w, lane = divmod(t, 32)
        for e in range(32):
            row = 16 * w + lane // 4 + 8 * ((e // 2) % 2)
            key = 8 * (e // 4) + 2 * (lane % 4) + e % 2
            regs[t, e] = p[row, key]
    regs = regs.to(torch.bfloat16).float()  # bf16x2_bits then back
    bmax = torch.zeros(128, 8)
    for ks in range(4):
        bmax[:, 2 * ks] = regs[:, [8 * ks, 8 * ks + 1, 8 * ks + 4, 8 * ks + 5]].amax(dim=1)
        bmax[:, 2 * ks + 1] = regs[:, [8 * ks + 2, 8 * ks + 3, 8 * ks + 6, 8 * ks + 7]].amax(dim=1)
    for d in (1, 2):  # __shfl_xor_sync within each warp
        partner = torch.tensor([(t // 32) * 32 + ((t % 32) ^ d) for t in range(128)])
        bmax = torch.maximum(bmax, bmax[partner])
    gs = torch.tensor(g, dtype=torch.float32)

    def code(m):  # e4m3(m / 6 / g), correctly rounded quotients
        return numerics.round_e4m3(numerics.divide(numerics.divide(m, 6.0), float(gs)))
    q = torch.tensor([t % 4 for t in range(128)])
    own = torch.stack([code(bmax[torch.arange(128), 2 * q]), code(bmax[torch.arange(128), 2 * q + 1])], dim=1)
    out = regs.clone()
    for b in range(8):
        owner = torch.tensor([(t // 32) * 32 + ((t % 32) & ~3 | (b >> 1)) for t in range(128)])
        c = own[owner, b & 1]
        s = torch.where(c == 0, torch.ones_like(c), c * gs)
        e0 = 8 * (b >> 1) + 2 * (b & 1)
        for i in range(4):
            e = e0 + (i & 1) + 4 * (i >> 1)
            out[:, e] = numerics.round_e2m1(regs[:, e] / s) * c
    tile = torch.zeros(64, 64)
    for t in range(128):
        w, lane = divmod(t, 32)
        for e in range(32):
            tile[16 * w + lane // 4 + 8 * ((e // 2) % 2), 8 * (e // 4) + 2 * (lane % 4) + e % 2] = out[t, e]
    return tile


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    bad = 0
    for amax in (1.0, 0.05, 3.0):
        for trial in range(3):
            s = torch.randn(64, 64, generator=gen) * 3
            s[:, 40:] = float("-inf") if trial == 1 else s[:, 40:]  # masked keys (P = 0)
            p = torch.exp(s - s.amax(dim=1, keepdim=True).clamp_min(0))
            got = emulate(p, numerics.nvfp4_global_scale(amax))
            want = numerics.nvfp4_unscaled(p.to(torch.bfloat16), amax, dim=-1)
            if not torch.equal(got, want):
                bad += 1
                print(f"MISMATCH amax {amax} trial {trial}: {int((got != want).sum())} of 4096 values")
    print("p_nvfp4 emulation equals numerics.nvfp4_unscaled(P in bf16) on every tile" if not bad else f"{bad} tiles differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
