#!/usr/bin/env python3
"""CPU check: q1_step's P publication by stmatrix (store_p_stsm, csrc/mla_decode_wgmma.cuh) writes every P value
to the byte store_p (csrc/seesaw.cuh) wrote it to, for all 4 warps of WG0, both 32-key halves and both k16 steps.

stmatrix.sync.aligned.m8n8.x4.shared.b16 (PTX ISA): matrix i's row r is stored at the address lane 8 i + r gives;
thread l's register i holds matrix i's elements (row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1), the lower
column in the low 16 bits. Prints OK or the first mismatch; exits 1 on a mismatch.
"""
import sys

K_SLAB = 64 * 128


def slab_off(row, byte):  # seesaw.cuh
    return (byte >> 7) * K_SLAB + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def main():
    for t in range(128):
        w, lane = t >> 5, t & 31
        row_lo = 16 * w + ((t & 31) >> 2)
        for key0 in (0, 32):
            for ks in range(2):
                # store_p: (register index i, low/high half) -> byte address
                key = key0 + 16 * ks + 2 * (t & 3)
                ref = {(0, 0): slab_off(row_lo, 2 * key), (1, 0): slab_off(row_lo + 8, 2 * key),
                       (2, 0): slab_off(row_lo, 2 * key + 16), (3, 0): slab_off(row_lo + 8, 2 * key + 16)}
                for i in range(4):
                    ref[(i, 1)] = ref[(i, 0)] + 2
                # stmatrix: the address lane 8 i + r of this warp gives (store_p_stsm's formula)
                def addr(l):
                    row = 16 * w + (l & 7) + 8 * ((l >> 3) & 1)
                    x = (l >> 4) ^ (l & 7)
                    return row * 128 + ((x ^ (key0 // 8 + 2 * ks)) << 4)
                for i in range(4):
                    for half in range(2):
                        r, col = lane // 4, 2 * (lane % 4) + half
                        got = addr(8 * i + r) + 2 * col
                        if got != ref[(i, half)]:
                            print(f"MISMATCH t={t} key0={key0} ks={ks} reg={i} half={half}: {got} != {ref[(i, half)]}")
                            return 1
    # every byte of the 64 x 128-byte slab written exactly once
    seen = set()
    for t in range(128):
        w, lane = t >> 5, t & 31
        for key0 in (0, 32):
            for ks in range(2):
                for i in range(4):
                    l = 8 * i + (lane & 7)
                    row = 16 * w + (l & 7) + 8 * ((l >> 3) & 1)
                    x = (l >> 4) ^ (l & 7)
                    seen.add(row * 128 + ((x ^ (key0 // 8 + 2 * ks)) << 4))
    if len(seen) != 64 * 8:
        print(f"MISMATCH: {len(seen)} distinct 16-byte rows, 512 expected")
        return 1
    print("OK: store_p_stsm == store_p for 128 threads x 2 halves x 2 k16 steps x 4 registers; 512 rows of 16 B")
    return 0


if __name__ == "__main__":
    sys.exit(main())
