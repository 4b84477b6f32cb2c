"""CPU emulation of the prefill kernel's P NVFP4 (csrc/mla_prefill_wgmma.cu, p_nvfp4): which accumulator registers
form a 16-key block, the bf16 pairs its maxima travel in, the quad's reduce-scatter, the owner lanes of the block
codes, the bf16 products, against mla_core.numerics (2 s).

One consumer warpgroup's 64 x 64 tile: thread t (0..127) of warp w = t // 32, lane l, holds element e (0..31) of row
16 w + l // 4 + 8 ((e // 2) % 2), key 8 (e // 4) + 2 (l % 4) + e % 2 (the wgmma m64n64 f32 accumulator). The
emulation follows p_nvfp4 step by step on 32-bit words (pairs of bf16 bit patterns, low half first): w[i] = P's
elements 2i, 2i + 1 rounded to bf16; max.u16x2 lane by lane (integers: a NaN pattern above all values); pr[ks] from
w[4 ks], w[4 ks + 2] and w[4 ks + 1], w[4 ks + 3] through __byte_perm 0x5410 / 0x7632; the reduce-scatter (xor 2:
lane q keeps pairs 2 (q / 2), + 1 and sends the other two; xor 1: pair q); lane q's codes of blocks 2q, 2q + 1 (low /
high half of its word); every lane reading block b's (code, code) pair, s and 1 / s from lane (l & ~3) | (b >> 1); the
values e2m1(p / s) with correctly rounded float32 quotients (div_rn's proven equality), paired in bf16 and multiplied
by (code, code) in bf16 (exact products; kP 3 since round (o): the rounding without its saturation, each bf16
pair clamped at (6, 6) by min.NaN.bf16x2 before the product), written to pa[ks][i] = elements 8 ks + 2 i, + 1. Compares the tile pa
holds with numerics.nvfp4_unscaled(P rounded to bf16) along the keys, and checks that the emulation tells three
layout bugs apart (the mutants of tests/mutation/mutants_cuda_prefill.py on these steps: the quad's shuffles over
the wrong lanes, row hi's values in row lo's block, the codes from the wrong owner lane, and the pair's clamp at 6
dropped). Exits 1 on a mismatch.
"""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, ".")
from mla_core import numerics  # noqa: E402


def bf16_bits(x: torch.Tensor) -> torch.Tensor:
    """float32 -> the bf16 bit pattern (round to nearest even), as int64 0..65535."""
    return x.to(torch.bfloat16).view(torch.int16).to(torch.int64) & 0xFFFF


def bits_bf16(b: torch.Tensor) -> torch.Tensor:
    """bf16 bit patterns (int64 0..65535) -> float32 (exact)."""
    return (b.to(torch.int32) << 16).view(torch.float32)


def pair(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """bf16x2_bits: the 32-bit word of two float32 values rounded to bf16 (lo in the low half)."""
    return bf16_bits(lo) | (bf16_bits(hi) << 16)


def halves(wd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return bits_bf16(wd & 0xFFFF), bits_bf16((wd >> 16) & 0xFFFF)


def max2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """max.u16x2 (bf16x2_max_nonneg): each half the larger as an unsigned 16-bit integer (u16_order_holds)."""
    return torch.maximum(a & 0xFFFF, b & 0xFFFF) | (torch.maximum(a >> 16, b >> 16) << 16)


def mul2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """mul.rn.bf16x2: lane by lane, the float32 product rounded to bf16."""
    (al, ah), (bl, bh) = halves(a), halves(b)
    return pair(al * bl, ah * bh)


def e2m1_unsat(x: torch.Tensor) -> torch.Tensor:
    """qdq.cuh round_e2m1_nonneg_unsat on float32 x >= 0 (or NaN; never +Inf): e = bits(max(x, 1)) & 0x7f800000, then
    fma(e, 1.5 * 2^22, x) (one rounding; emulated in float64, exact there) and fma(-e, 1.5 * 2^22, .) (exact)."""
    y = torch.where(x.isnan(), torch.ones_like(x), torch.clamp_min(x, 1.0))  # fmaxf drops NaN
    e = (y.view(torch.int32) & 0x7F800000).view(torch.float32).double()
    r = (x.double() + e * 6291456.0).float()
    return (r.double() - e * 6291456.0).float()


def min2_nan(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """min.NaN.bf16x2: lane-wise minimum of the bf16 values, NaN where either is NaN."""
    alo, ahi = halves(a)
    blo, bhi = halves(b)
    return pair(torch.minimum(alo, blo), torch.minimum(ahi, bhi))  # torch.minimum propagates NaN


def byte_perm(x: torch.Tensor, y: torch.Tensor, s: int) -> torch.Tensor:
    """__byte_perm(x, y, s): result byte i is byte (s >> 4 i) & 7 of the 8 bytes y:x (x's first)."""
    out = torch.zeros_like(x)
    for i in range(4):
        sel = (s >> (4 * i)) & 7
        src = x if sel < 4 else y
        out |= ((src >> (8 * (sel & 3))) & 0xFF) << (8 * i)
    return out


def lanes(t: torch.Tensor, f) -> torch.Tensor:
    """Thread t's source thread for a shuffle inside its warp: f(lane) -> lane."""
    return torch.tensor([(int(x) // 32) * 32 + f(int(x) % 32) for x in t])


def emulate(p: torch.Tensor, g: float, variant: str = "") -> torch.Tensor:
    """p [64, 64] float32 (rows, keys) -> the values p_nvfp4 leaves in P's A fragments, as a [64, 64] float32 tile.
    variant: "" the kernel; "xor4" the quad's shuffles 4x farther; "rows" row hi's pair in row lo's block maxima;
    "owner" the codes from lane (l & ~3) | (b & 3); "old" round (n)'s saturating float32 rounding (kP 4's); "noclamp"
    kP 3's rounding without the bf16 pair's clamp at 6."""
    t = torch.arange(128)
    regs = torch.zeros(128, 32)
    for th in range(128):
        w_, lane = divmod(th, 32)
        for e in range(32):
            regs[th, e] = p[16 * w_ + lane // 4 + 8 * ((e // 2) % 2), 8 * (e // 4) + 2 * (lane % 4) + e % 2]
    w = [pair(regs[:, 2 * i], regs[:, 2 * i + 1]) for i in range(16)]  # P rounded to bf16, pairs
    pr = []
    for ks in range(4):
        lo = max2(w[4 * ks], w[4 * ks + (1 if variant == "rows" else 2)])
        hi = max2(w[4 * ks + 1], w[4 * ks + 3])
        pr.append(max2(byte_perm(lo, hi, 0x5410), byte_perm(lo, hi, 0x7632)))
    q = t % 32 % 4
    upper, odd = (q & 2) != 0, (q & 1) != 0
    d2, d1 = (8, 4) if variant == "xor4" else (2, 1)
    k0 = torch.where(upper, pr[2], pr[0])
    k1 = torch.where(upper, pr[3], pr[1])
    p2 = lanes(t, lambda l: l ^ d2)
    k0 = max2(k0, torch.where(upper, pr[0], pr[2])[p2])
    k1 = max2(k1, torch.where(upper, pr[1], pr[3])[p2])
    m = max2(torch.where(odd, k1, k0), torch.where(odd, k0, k1)[lanes(t, lambda l: l ^ d1)])
    gs = float(torch.tensor(g, dtype=torch.float32))

    def code(x):  # e4m3(x / 6 / g), correctly rounded quotients (nvfp4_block_code(_div_free))
        return numerics.round_e4m3(numerics.divide(numerics.divide(x, 6.0), gs))

    own = [code(h) for h in halves(m)]
    own_s = [torch.where(c == 0, 1.0, c * gs) for c in own]
    own_c01 = pair(own[0], own[1])  # both codes in one word (round o: one shuffle for the owner's two blocks)
    tile = torch.zeros(64, 64)
    for b in range(8):
        src = lanes(t, (lambda l: (l & ~3) | (b & 3)) if variant == "owner" else (lambda l: (l & ~3) | (b >> 1)))
        c01 = own_c01[src]
        half = halves(c01)[b & 1]  # the word's half of block b, broadcast (HMUL2's .H0_H0 / .H1_H1 operand)
        cc = pair(half, half)
        s = own_s[b & 1][src]  # the owner's s (and 1 / s: the quotient below is the correctly rounded one)
        for j in range(2):
            e = 8 * (b >> 1) + 2 * (b & 1) + 4 * j
            plo, phi = halves(w[e >> 1])
            if variant == "old":  # round (n)'s form: the saturating rounding in float32
                v = pair(numerics.round_e2m1(plo / s), numerics.round_e2m1(phi / s))  # E2M1 values: exact in bf16
            else:  # kP 3 since round (o): the rounding without saturation, the bf16 pair clamped at (6, 6)
                v = pair(e2m1_unsat(plo / s), e2m1_unsat(phi / s))
                if variant != "noclamp":
                    v = min2_nan(v, pair(torch.full_like(plo, 6.0), torch.full_like(phi, 6.0)))
            vlo, vhi = halves(mul2(v, cc))  # pa[e >> 3][(e >> 1) & 3]: elements e, e + 1
            for th in range(128):
                w_, lane = divmod(th, 32)
                row = 16 * w_ + lane // 4 + 8 * ((e // 2) % 2)
                key = 8 * (e // 4) + 2 * (lane % 4)
                tile[row, key], tile[row, key + 1] = vlo[th], vhi[th]
    return tile


def u16_order_holds() -> bool:
    """max.u16x2 is the maximum of non-negative bf16 values, exhaustively: the patterns 0x0000 .. 0x7f80 (+0,
    subnormals, normals, +Inf) have strictly increasing values, and every NaN pattern (either sign) is above 0x7f80."""
    pos = bits_bf16(torch.arange(0, 0x7F81))
    nan = torch.tensor([b for b in range(0x10000) if bool(bits_bf16(torch.tensor([b]))[0].isnan())])
    return bool((pos[1:] > pos[:-1]).all()) and not pos.isnan().any() and bool((nan > 0x7F80).all())


def main() -> int:
    if not u16_order_holds():
        print("the unsigned order of bf16 patterns is not the values' order")
        return 1
    gen = torch.Generator().manual_seed(0)
    bad, caught = 0, {"xor4": 0, "rows": 0, "owner": 0, "noclamp": 0}
    for amax in (1.0, 0.05, 3.0):
        for trial in range(3):
            s = torch.randn(64, 64, generator=gen) * 3
            s[:, 40:] = float("-inf") if trial == 1 else s[:, 40:]  # masked keys (P = 0)
            p = torch.exp(s - s.amax(dim=1, keepdim=True).clamp_min(0))
            if trial == 2:  # a NaN P (a NaN score): its block NaN, as the reference's
                p[3, 5] = float("nan")
            g = numerics.nvfp4_global_scale(amax)
            want = numerics.nvfp4_unscaled(p.to(torch.bfloat16), amax, dim=-1)
            got = emulate(p, g)
            if not torch.equal(got.nan_to_num(7.0), emulate(p, g, "old").nan_to_num(7.0)):
                bad += 1
                print(f"amax {amax} trial {trial}: round (o)'s rounding differs from round (n)'s")
            same = torch.equal(got.isnan(), want.isnan()) and torch.equal(got.nan_to_num(7.0), want.nan_to_num(7.0))
            if not same:
                bad += 1
                print(f"MISMATCH amax {amax} trial {trial}: {int((got != want).sum())} of 4096 values")
            for v in caught:
                caught[v] += not torch.equal(emulate(p, g, v).nan_to_num(7.0), got.nan_to_num(7.0))
    print("p_nvfp4 emulation equals numerics.nvfp4_unscaled(P in bf16) on every tile" if not bad
          else f"{bad} tiles differ")
    print("layout bugs told apart (tiles of 9 differing): " + ", ".join(f"{k} {n}" for k, n in caught.items()))
    missed = [k for k, n in caught.items() if n == 0]
    if missed:
        print(f"NOT CAUGHT: {missed}")
    return 1 if bad or missed else 0


if __name__ == "__main__":
    sys.exit(main())
