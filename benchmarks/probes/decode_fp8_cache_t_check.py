"""CPU check of the keys-as-M FP8-cache decode kernel (csrc/mla_decode_wgmma.cu: decode_t_kernel, s_t_product,
pv_t_product, t_qcol, t_pkey, t_off, the m64n16 fragment and accumulator layouts), no GPU.

    python3 benchmarks/probes/decode_fp8_cache_t_check.py

1. S^T: per consumer thread (warp w, lane 8 g + q ... lane = 4 g + q), the A fragments s_t_product builds from its
   two LDS.128 per 64-column block (codes of keys 16 w + g, + 8 at bytes 64 blk + 16 q ..) are placed at their
   logical (row, k) positions of m64k16 (a[0] = (r, 2q..), a[1] = (r + 8, 2q..), a[2] = (r, 2q + 8..), a[3] =
   (r + 8, 2q + 8..), pair = (low half, high half) = (byte 0, byte 1) of e4m3x4_to's pair); every position filled
   once; K_logical @ Q^T_logical (Q^T staged from column t_qcol(L)) equals the stage's K @ Q^T exactly.
2. O^T: pv_t_load's 4 LDS.128 per k16 step (slot j: key 16 u + 4 q + (j ^ (q & 1)), latent columns 16 (8 w + g) ..),
   pv_t_product's __byte_perm selectors and e4m3x4_to pairs give A fragments; P^T is written from the S^T
   accumulator layout (element i: key 16 w + g + 8 ((i / 2) % 2), head 8 (i / 4) + 2 q + i % 2) at logical key
   t_pkey(key); the products V^T_logical @ P^T_logical, read back through the accumulator layout and the epilogue's
   column map (o[8 mt + e] -> column 16 (8 w + g) + 2 mt, o[8 mt + e + 2] -> + 1), equal P^T-weighted V exactly.
3. t_off: 16-row slabs, a bijection onto [0, 9 x 2048) with the 128-byte swizzle of slab_off.
4. The online softmax of decode_t_kernel (two warpgroups over alternate 64-key steps, running max per step,
   merged at the end) emulated in float64 over random lengths / masks equals the plain softmax (1e-12).
5. Shared-memory wavefronts of each LDS.128 (per quarter warp, the most lanes on one 16-byte bank group): S^T's 4
   (conflict-free), pv_t_load's 8 (2-way: the least with 576-byte rows; every q on one row parity gave 16).
6. p_f16_bits: every bf16 value in [2^-14, 1] is exact in f16; below, f16 rounding is <= 2^-25 off.
7. q_scale_t (bf16 q on f16 tensor cores): per head f16(q * 2^s) stays below 65504, and (f16 Q^T . codes) * 2^-s
   equals q . codes exactly for heads of ordinary ranges (1e-30 .. 1e30, zero heads) and within 2^-38 of the
   head's |q|max . |codes| for heads with elements 2^-35 below their largest; inf / NaN stay non-finite.
Each part's own check catches a broken variant (wrong selector, t_qcol off by a pair, t_pkey's halves swapped,
the merge without f1, P·V's rows not flipped, q_scale_t a binade high).
"""
from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
from decode_fp8_cache_check import byte_perm, e4m3_value  # noqa: E402

KEYS, DIM, HEADS, SLAB_T = 64, 576, 16, 16 * 128


def t_qcol(L: int) -> int:
    x = L & 15
    return (L & ~63) + 16 * ((x & 7) >> 1) + 4 * ((L >> 4) & 3) + (x & 1) + 2 * (x >> 3)


def t_pkey(pk: int) -> int:
    q = (pk & 15) >> 2
    j = (pk & 3) ^ (q & 1)
    return (pk & ~15) + 2 * q + (j & 1) + 8 * (j >> 1)


def pv_row(u: int, q: int, j: int, flip: bool = True) -> int:
    """pv_t_load's slot j of thread q in k16 step u: the stage row it loads."""
    return 16 * u + 4 * q + (j ^ (q & 1) if flip else j)


def t_off(row: int, byte: int) -> int:
    return (byte >> 7) * SLAB_T + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


VALUES = np.array([e4m3_value(c) for c in range(256)])
FINITE = np.array([c for c in range(256) if not np.isnan(VALUES[c])], dtype=np.uint8)


def word(codes: np.ndarray, off: int) -> int:
    return int(codes[off]) | int(codes[off + 1]) << 8 | int(codes[off + 2]) << 16 | int(codes[off + 3]) << 24


def pair_values(w: int) -> tuple[tuple[float, float], tuple[float, float]]:
    """e4m3x4_to's (lo, hi): lo = values of bytes 0, 1 (low half first), hi = bytes 2, 3 (exact in T)."""
    b = [(w >> (8 * i)) & 0xFF for i in range(4)]
    return (VALUES[b[0]], VALUES[b[1]]), (VALUES[b[2]], VALUES[b[3]])


def place(A: np.ndarray, filled: np.ndarray, r: int, k: int, pair) -> None:
    for d in range(2):
        assert filled[r, k + d] == 0, ("filled twice", r, k + d)
        filled[r, k + d] += 1
        A[r, k + d] = pair[d]


def check_s(stage: np.ndarray, q: np.ndarray, qcol=t_qcol) -> bool:
    """stage: [64, 576] uint8 codes; q: [16, 576] float."""
    A = np.zeros((KEYS, DIM))
    filled = np.zeros((KEYS, DIM), dtype=int)
    flat = stage.reshape(-1)
    for w in range(4):
        for lane in range(32):
            g, qq = lane >> 2, lane & 3
            lo = (16 * w + g) * DIM + 16 * qq
            hi = lo + 8 * DIM
            for blk in range(DIM // 64):
                for u in range(4):
                    j = 4 * blk + u
                    plo, phi = pair_values(word(flat, lo + 64 * blk + 4 * u))
                    qlo, qhi = pair_values(word(flat, hi + 64 * blk + 4 * u))
                    r = 16 * w + g
                    place(A, filled, r, 16 * j + 2 * qq, plo)          # a[u][0]
                    place(A, filled, r + 8, 16 * j + 2 * qq, qlo)      # a[u][1]
                    place(A, filled, r, 16 * j + 2 * qq + 8, phi)      # a[u][2]
                    place(A, filled, r + 8, 16 * j + 2 * qq + 8, qhi)  # a[u][3]
    if not (filled == 1).all():
        return False
    qt = np.zeros((HEADS, DIM))
    for h in range(HEADS):
        for L in range(0, DIM, 2):
            pc = qcol(L)
            qt[h, L], qt[h, L + 1] = q[h, pc], q[h, pc + 1]
    got = A @ qt.T
    want = VALUES[stage] @ q.T
    return np.array_equal(got, want)


def check_pv(stage: np.ndarray, p: np.ndarray, pkey=t_pkey, sels=(0x5140, 0x7362), flip: bool = True) -> bool:
    """p: [64 keys (stage rows), 16 heads] float (P, already in T)."""
    flat = stage.reshape(-1)
    # P^T written from the S^T accumulator layout
    pt = np.full((HEADS, KEYS), np.nan)
    for w in range(4):
        for lane in range(32):
            g, qq = lane >> 2, lane & 3
            for i in range(8):
                pk = 16 * w + g + (8 if i & 2 else 0)
                hk = 8 * (i >> 2) + 2 * qq + (i & 1)
                assert np.isnan(pt[hk, pkey(pk)])
                pt[hk, pkey(pk)] = p[pk, hk]
    if np.isnan(pt).any():
        return False
    out = np.full((HEADS, 512), np.nan)
    # the A matrix of M tile mt over the whole warpgroup, then D through the accumulator layout
    for mt in range(8):
        A = np.zeros((64, KEYS))
        filled = np.zeros((64, KEYS), dtype=int)
        for w in range(4):
            for lane in range(32):
                g, qq = lane >> 2, lane & 3
                base = 16 * (8 * w + g) + 4 * qq * DIM
                r = 16 * w + g
                for u in range(4):
                    ws = [word(flat, base - 4 * qq * DIM + pv_row(u, qq, j, flip) * DIM + 4 * (mt >> 1))
                          for j in range(4)]
                    sel = sels[mt & 1]
                    a0, a1 = pair_values(byte_perm(ws[0], ws[1], sel))
                    a2, a3 = pair_values(byte_perm(ws[2], ws[3], sel))
                    place(A, filled, r, 16 * u + 2 * qq, a0)
                    place(A, filled, r + 8, 16 * u + 2 * qq, a1)
                    place(A, filled, r, 16 * u + 2 * qq + 8, a2)
                    place(A, filled, r + 8, 16 * u + 2 * qq + 8, a3)
        if not (filled == 1).all():
            return False
        D = A @ pt.T  # [64 rows, 16 heads]
        for w in range(4):
            for lane in range(32):
                g, qq = lane >> 2, lane & 3
                col0 = 16 * (8 * w + g)
                for i in range(8):
                    row = 16 * w + g + 8 * ((i >> 1) & 1)
                    hk = 8 * (i >> 2) + 2 * qq + (i & 1)
                    col = col0 + 2 * mt + ((i >> 1) & 1)  # the epilogue's o[8 mt + e] / o[8 mt + e + 2]
                    assert np.isnan(out[hk, col])
                    out[hk, col] = D[row, hk]
    want = p.T @ VALUES[stage][:, :512]
    return not np.isnan(out).any() and np.array_equal(out, want)


def wavefronts(addrs: list[int]) -> int:
    """Wavefronts of one LDS.128 over 32 lanes' byte addresses: per quarter warp (8 lanes), the most distinct
    16-byte chunks on one bank group (chunk address / 16 mod 8), summed over the 4 quarters."""
    total = 0
    for qw in range(4):
        groups: dict[int, set[int]] = {}
        for a in addrs[8 * qw:8 * qw + 8]:
            groups.setdefault((a // 16) % 8, set()).add(a // 16)
        total += max(len(c) for c in groups.values())
    return total


def check_banks(flip: bool = True) -> tuple[int, int]:
    """(max wavefronts of S^T's LDS.128, of pv_t_load's) over warps, blocks, steps and slots."""
    s_t = max(wavefronts([(16 * w + g + 8 * h) * DIM + 16 * q + 64 * blk for g in range(8) for q in range(4)])
              for w in range(4) for h in range(2) for blk in range(DIM // 64))
    pv = max(wavefronts([16 * (8 * w + g) + pv_row(u, q, j, flip) * DIM for g in range(8) for q in range(4)])
             for w in range(4) for u in range(4) for j in range(4))
    return s_t, pv


def check_p_f16() -> bool:
    """Every bf16 value in [2^-14, 1] converts to f16 exactly; below 2^-14 the f16 rounding is <= 2^-25 off."""
    bits = np.arange(0, 0x3F81, dtype=np.uint32) << 16  # bf16 0 .. 1.0 as float32
    v = bits.view(np.float32).astype(np.float64)
    h = v.astype(np.float16).astype(np.float64)
    big = v >= 2.0**-14
    return bool((h[big] == v[big]).all() and (np.abs(h - v) <= 2.0**-25).all())


def bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> the nearest-even bf16 value, as float64."""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16 << 16
    return b.astype(np.uint32).view(np.float32).astype(np.float64)


def q_scale_t(bits: int, inverse: bool, top: int = 142) -> float:
    s = min(max(top - (bits >> 7), top - 255), 126)
    return 2.0 ** (-s if inverse else s)


def check_q_scale(rng, top: int = 142) -> bool:
    codes = VALUES[rng.choice(FINITE, size=DIM)]
    ok = True
    for case in ("normal", "huge", "tiny", "subnormal", "zero", "spread", "inf", "nan"):
        q = rng.normal(size=DIM)
        q = {"huge": q * 1e30, "tiny": q * 1e-30, "subnormal": q * 1e-39, "zero": q * 0}.get(case, q)
        if case == "spread":
            q[::3] *= 2.0**-35
        if case in ("inf", "nan"):
            q[5] = np.inf if case == "inf" else np.nan
        with np.errstate(over="ignore", invalid="ignore"):
            q = bf16(q)
            bits = np.abs(q).astype(np.float32).view(np.uint32) >> 16  # bf16 bits without the sign
            big = int(np.nanmax(bits)) if not np.isnan(q).any() else 0x7FC0
            f = q_scale_t(big, False, top)
            assert 2.0**-126 <= f <= 2.0**127 and 2.0**-126 <= q_scale_t(big, True, top) <= 2.0**127
            qh = (q.astype(np.float32) * np.float32(f)).astype(np.float16).astype(np.float64)
            got = (qh @ codes) * q_scale_t(big, True, top)
            want = q @ codes
        if case in ("inf", "nan"):
            ok &= not np.isfinite(got) and not np.isfinite(want)
            continue
        ok &= bool(np.abs(qh).max() <= 65504)
        if case == "spread":
            ok &= abs(got - want) <= 2.0**-38 * np.abs(q).max() * np.abs(codes).sum()
        else:
            ok &= got == want
    return bool(ok)


def check_t_off() -> bool:
    offs = [t_off(r, b) for r in range(16) for b in range(0, 2 * DIM, 16)]
    ok = sorted(offs) == list(range(0, 9 * SLAB_T, 16))
    # the same swizzle as the 64-row slabs: chunk c of row r at chunk c ^ (r % 8) inside its 128-byte row
    ok &= all(t_off(r, b) % 128 == 16 * (((b % 128) // 16) ^ (r % 8)) for r in range(16) for b in range(0, 2 * DIM, 16))
    return ok


def softmax_t(s: np.ndarray, valid: np.ndarray, v: np.ndarray, merge_f1: bool = True):
    """decode_t_kernel's schedule in float64: s [n, 16] scores (log2 domain), valid [n], v [n, 512]. Steps of 64
    keys alternate between two warpgroups; each keeps m, l, o; merged at the end. Returns (o / l, lse2)."""
    n = s.shape[0]
    steps = (n + 63) // 64
    st = []
    for wg in range(2):
        m = np.full(HEADS, -np.inf)
        l = np.zeros(HEADS)
        o = np.zeros((HEADS, 512))
        for it in range(wg, steps, 2):
            ks = slice(64 * it, min(64 * it + 64, n))
            x = np.where(valid[ks, None], s[ks], -np.inf)
            mn = np.maximum(m, x.max(axis=0))
            z = np.where(np.isinf(mn), 0.0, mn)
            a = np.exp2(m - z)
            pm = np.exp2(x - z)
            l = l * a + pm.sum(axis=0)
            o = o * a[:, None] + pm.T @ v[ks]
            m = mn
        st.append((m, l, o))
    (m0, l0, o0), (m1, l1, o1) = st
    mt = np.maximum(m0, m1)
    zt = np.where(np.isinf(mt), 0.0, mt)
    f0, f1 = np.exp2(m0 - zt), np.exp2(m1 - zt) if merge_f1 else np.ones(HEADS)
    lt = l0 * f0 + l1 * f1
    o = o0 * f0[:, None] + o1 * f1[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lt[:, None] == 0, 0.0, o / lt[:, None]), np.where(lt == 0, -np.inf, mt + np.log2(lt))


def check_softmax(rng, merge_f1: bool = True) -> bool:
    for n in (1, 31, 64, 65, 127, 128, 129, 300, 1000):
        s = rng.normal(size=(n, HEADS)) * 8
        valid = rng.random(n) > 0.2
        v = rng.normal(size=(n, 512))
        o, lse2 = softmax_t(s, valid, v, merge_f1)
        x = np.where(valid[:, None], s, -np.inf)
        if not valid.any():
            if not (o == 0).all():
                return False
            continue
        mx = x.max(axis=0)
        e = np.exp2(x - mx)
        want = (e.T @ v) / e.sum(axis=0)[:, None]
        want_lse2 = mx + np.log2(e.sum(axis=0))
        if not (np.allclose(o, want, rtol=1e-12, atol=1e-12) and np.allclose(lse2, want_lse2, rtol=1e-12)):
            return False
    return True


def main() -> int:
    rng = np.random.default_rng(7)
    stage = rng.choice(FINITE, size=(KEYS, DIM))
    q = rng.integers(-64, 64, size=(HEADS, DIM)).astype(np.float64) / 8  # exact products and sums in float64
    p = rng.integers(0, 256, size=(KEYS, HEADS)).astype(np.float64) / 256
    results = {
        "S^T fragments + Q^T permutation": check_s(stage, q),
        "O^T fragments + P^T permutation + epilogue columns": check_pv(stage, p),
        "t_off 16-row slabs": check_t_off(),
        "LDS.128 wavefronts: S^T 4, P·V 8": check_banks() == (4, 8),
        "P^T as f16 (p_f16_bits)": check_p_f16(),
        "bf16 Q^T as f16 * 2^s (q_scale_t)": check_q_scale(np.random.default_rng(5)),
        "two-warpgroup online softmax + merge": check_softmax(rng),
    }
    # each check must catch a broken variant
    caught = {
        "t_qcol off by a pair": not check_s(stage, q, qcol=lambda L: t_qcol(L) ^ 2),
        "t_pkey halves swapped": not check_pv(stage, p, pkey=lambda pk: t_pkey(pk) ^ 8),
        "selectors swapped": not check_pv(stage, p, sels=(0x7362, 0x5140)),
        "P·V rows not flipped for odd q (t_pkey flipped)": not check_pv(stage, p, flip=False),
        "P·V rows not flipped: 16 wavefronts": check_banks(flip=False)[1] == 16,
        "q_scale_t one binade high": not check_q_scale(np.random.default_rng(5), top=143),
        "merge without f1": not check_softmax(np.random.default_rng(7), merge_f1=False),
    }
    for name, ok in results.items():
        print(f"{'OK  ' if ok else 'FAIL'} {name}")
    for name, ok in caught.items():
        print(f"{'OK  ' if ok else 'FAIL'} mutant caught: {name}")
    good = all(results.values()) and all(caught.values())
    print("ALL PASS" if good else "FAILED")
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
