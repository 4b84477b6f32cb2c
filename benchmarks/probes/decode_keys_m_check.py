"""CPU check of the keys-as-M decode over a bf16 / fp16 cache (csrc/mla_decode_wgmma.cu: decode_km_kernel), no GPU.

    python3 benchmarks/probes/decode_keys_m_check.py

Shared memory is emulated as bytes holding element labels; wgmma operands are read back through the descriptors
by the canonical 128-byte-swizzle layouts (docs/cuda.md, "Descriptors"; CUTLASS's GMMA layout atoms): K-major,
element (row r, k) at (r % 8) 128 + (r / 8) SBO + 2 k; MN-major, element (mn, k) at 2 (mn % 64) + (mn / 64) LBO +
(k % 8) 128 + (k / 8) SBO; then the swizzle (bits 4-6 ^= bits 7-9 of the address; slabs 1024-aligned).
1. S^T = K Q^T: A (kmajor_desc of the stage's slabs, produce_rows' slab_off layout) is K's m64k16 block of k16
   step ks, B (t_desc of Q^T written at t_off) Q^T's; every step.
2. O^T = V^T P^T: A (mnmajor_desc(slab mt, 16 u), the transpose-A read) is V^T's m64k16 block (latent columns
   64 mt.., keys 16 u..), B (t_desc of P^T written at t_off(head, 2 key) from the S^T accumulator layout) P^T's.
3. The m64n16 accumulator layout through km_store's column map (o[8 mt + e] -> latent 64 mt + 16 w + g, e + 2 ->
   + 8; head t_head(k, q), e = 8 (k / 2) / 2 + k % 2) gives O = P V for every head and column, once each; the
   rescale's head index ((j >> 1) & 2) | (j & 1) is t_head's k of element j % 8.
A variant that breaks each part (transpose bit off, SBO 2048, P^T keys g / g + 8 swapped, km_store's + 8 as + 1)
is checked to fail.
"""
from __future__ import annotations

import numpy as np

KEYS, DIM, NOPE, HEADS, SLAB, SLAB_T = 64, 576, 512, 16, 64 * 128, 16 * 128


def swz(a):
    return a ^ (((a >> 7) & 7) << 4)


def slab_off(row, byte):  # seesaw.cuh
    return (byte >> 7) * SLAB + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def t_off(row, byte):  # decode_t_kernel's 16-row slabs
    return (byte >> 7) * SLAB_T + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def t_head(k, q):
    return 8 * (k >> 1) + 2 * q + (k & 1)


def read_kmajor(mem, start, rows, sbo=1024):
    """[rows x 16] operand, K-major (LBO unused: 16 elements stay in one 128-byte row)."""
    return np.array([[mem[swz(start + (r % 8) * 128 + (r // 8) * sbo + 2 * k) // 2] for k in range(16)]
                     for r in range(rows)])


def read_mnmajor(mem, start, lbo, sbo=1024):
    """[64 (M or N) x 16 (K)] operand, MN-major."""
    return np.array([[mem[swz(start + 2 * (mn % 64) + (mn // 64) * lbo + (k % 8) * 128 + (k // 8) * sbo) // 2]
                      for k in range(16)] for mn in range(64)])


def check(transpose=True, sbo=1024, swap_p=False, store_plus=8):
    rng = np.random.default_rng(0)
    kmat = rng.standard_normal((KEYS, DIM))
    qmat = rng.standard_normal((HEADS, DIM))
    stage = np.full(2 * 9 * SLAB // 2, np.nan)  # element labels by 2-byte address
    for r in range(KEYS):
        for c in range(DIM):
            stage[slab_off(r, 2 * c) // 2] = kmat[r, c]
    sqt = np.full(9 * SLAB_T // 2, np.nan)
    for h in range(HEADS):
        for c in range(DIM):
            sqt[t_off(h, 2 * c) // 2] = qmat[h, c]
    # 1. S^T
    st = np.zeros((KEYS, HEADS))
    for ks in range(DIM // 16):
        kb = 32 * ks
        a = read_kmajor(stage, (kb >> 7) * SLAB + (kb & 127), KEYS)
        b = read_kmajor(sqt, (kb >> 7) * SLAB_T + (kb & 127), HEADS)  # [n x k]
        st += a @ b.T
    ok1 = np.allclose(st, kmat @ qmat.T, rtol=0, atol=1e-9)
    # 2. P^T from the S^T accumulator layout (any values: P = S^T here), O^T
    pmat = st.T.copy()  # [heads x keys]
    spt = np.full(SLAB_T // 2, np.nan)
    for w in range(4):
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            for i in range(8):
                key = 16 * w + g + (8 if i & 2 else 0)
                hk = t_head((i >> 2) * 2 + (i & 1), q)
                spt[t_off(hk, 2 * (key ^ 8 if swap_p else key)) // 2] = st[key, hk]
    ot = np.zeros((NOPE, HEADS))
    for mt in range(NOPE // 64):
        for u in range(KEYS // 16):
            start = mt * SLAB + 16 * u * 128
            a = read_mnmajor(stage, start, SLAB, sbo) if transpose else read_kmajor(stage, start, 64)
            b = read_kmajor(spt, 32 * u, HEADS)
            ot[64 * mt:64 * mt + 64] += a @ b.T
    ok2 = np.allclose(ot, kmat[:, :NOPE].T @ pmat.T, rtol=0, atol=1e-9)
    # 3. the accumulator layout through km_store
    out = np.full((HEADS, NOPE), np.nan)
    for w in range(4):
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            o = np.zeros(64)
            for mt in range(8):
                for i in range(8):
                    o[8 * mt + i] = ot[64 * mt + 16 * w + g + (8 if i & 2 else 0), 8 * (i >> 2) + 2 * q + (i & 1)]
            for k in range(4):
                hk, e = t_head(k, q), (k >> 1) * 4 + (k & 1)
                for mt in range(8):
                    out[hk, 64 * mt + 16 * w + g] = o[8 * mt + e]
                    out[hk, 64 * mt + 16 * w + g + store_plus] = o[8 * mt + e + 2]
    ok3 = not np.isnan(out).any() and np.allclose(out, ot.T, rtol=0, atol=1e-9)
    ok3 &= all((((j >> 1) & 2) | (j & 1)) == ((j & 7) >> 2) * 2 + (j & 1) for j in range(64))
    return ok1, ok2, ok3


def main():
    results = {"kernel": check(), "transpose bit off": check(transpose=False), "SBO 2048": check(sbo=2048),
               "P^T keys swapped": check(swap_p=True), "km_store + 1": check(store_plus=1)}
    good = all(results["kernel"]) and all(not all(r) for name, r in results.items() if name != "kernel")
    for name, r in results.items():
        print(f"{name}: S^T {r[0]}, O^T {r[1]}, store {r[2]}")
    print("ALL PASS" if good else "FAIL")
    return 0 if good else 1


if __name__ == "__main__":
    raise SystemExit(main())
