"""CPU check of the WGMMA decode's FP8 KV cache path (csrc/mla_decode_wgmma.cu: produce_codes, codes_to_values,
e4m3x4_to), no GPU.

    python3 benchmarks/probes/decode_fp8_cache_check.py

1. Conversion: e4m3x4_to<T> emulated op by op on words holding all 256 codes in every byte position (mov.b32
   {a, b}: a = bytes 0-1; cvt.rn.f16x2.e4m3x2: byte 0 of the pair -> the low half, exact as the PTX ISA defines it;
   for bf16 each f16 widened to float32 exactly, then __byte_perm(x, y, 0x7632) byte by byte) and compared bit for
   bit with each code's value in T, written from the E4M3 format here (not torch's cast): every finite code, both
   T (NaN codes: NaN, sign not needed).
2. Layout: for each producer warp, the aligned copies (lane l: chunk l of the group's 4 rows, lanes 0-15 the rope
   chunks) and the byte path put each code of row r, column c at the same byte; group g's copies and the bytes
   its conversion reads lie inside the group's own 512 B of each slab, which its stores fill exactly, each value
   (row, column) at slab_off(row, 2 column) (the consumers' layout) and from the right code; every stage byte is
   stored once; no group's bytes meet another group's or warp's (so cp.async.wait_group 3 - g + __syncwarp cover
   the reads, and loads-then-__syncwarp-then-stores covers the in-place overwrite).
"""
from __future__ import annotations

import numpy as np

KEYS, DIM, SLAB = 64, 576, 64 * 128


def slab_off(row: int, byte: int) -> int:
    """seesaw.cuh slab_off: 128-byte slabs of 64 rows, 16-byte chunks swizzled by row % 8."""
    return (byte >> 7) * SLAB + row * 128 + ((((byte >> 4) & 7) ^ (row & 7)) << 4) + (byte & 15)


def consumer_off(row: int, byte: int) -> int:
    """Where the consumers' wgmma descriptors read byte `byte` of K row `row` (docs/cuda.md: 64-row slabs of
    128-byte rows, 16-byte chunk j of row r at chunk j ^ (r % 8)), written here independently of slab_off."""
    slab, within = divmod(byte, 128)
    chunk, rest = divmod(within, 16)
    return slab * SLAB + row * 128 + 16 * (chunk ^ (row % 8)) + rest


def code_off(w: int, g: int) -> int:
    return (16 * w + 4 * g) * 128 + 256


def e4m3_value(code: int) -> float:
    """The E4M3 (fn) value of a code: 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN."""
    s, e, m = code >> 7, (code >> 3) & 15, code & 7
    if e == 15 and m == 7:
        return float("nan")
    v = (m / 8) * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
    return -v if s else v


def f16_bits(v: float) -> int:
    h = np.float16(v)
    assert np.isnan(v) or float(h) == v, v  # every E4M3 value is exact in f16
    return int(h.view(np.uint16))


def byte_perm(x: int, y: int, sel: int) -> int:
    src = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    return sum(src[(sel >> (4 * i)) & 7] << (8 * i) for i in range(4))


def e4m3x4_to(word: int, dtype: str) -> tuple[int, int]:
    """The device function, op by op."""
    a, b = word & 0xFFFF, word >> 16
    f0 = f16_bits(e4m3_value(a & 0xFF)) | (f16_bits(e4m3_value(a >> 8)) << 16)
    f1 = f16_bits(e4m3_value(b & 0xFF)) | (f16_bits(e4m3_value(b >> 8)) << 16)
    if dtype == "fp16":
        return f0, f1

    def widen(h: int) -> int:  # f16 bits -> float32 bits, exactly
        return int(np.array([h], np.uint16).view(np.float16).astype(np.float32).view(np.uint32)[0])

    return (byte_perm(widen(f0 & 0xFFFF), widen(f0 >> 16), 0x7632),
            byte_perm(widen(f1 & 0xFFFF), widen(f1 >> 16), 0x7632))


def want_bits(code: int, dtype: str) -> int | None:
    v = e4m3_value(code)
    if np.isnan(v):
        return None
    if dtype == "fp16":
        return f16_bits(v)
    f = np.float32(v)
    bits = int(np.array([f]).astype(np.float32).view(np.uint32)[0])
    assert bits & 0xFFFF == 0 and float(f) == v  # exact in bf16
    return bits >> 16


def check_conversion() -> int:
    bad = 0
    for dtype in ("bf16", "fp16"):
        for shift in range(4):  # every code in every byte position of the word
            for code in range(256):
                others = [(code * 7 + 13 * i) & 0xFF for i in range(4)]
                others[shift] = code
                word = sum(c << (8 * i) for i, c in enumerate(others))
                lo, hi = e4m3x4_to(word, dtype)
                got = [lo & 0xFFFF, lo >> 16, hi & 0xFFFF, hi >> 16]
                for i, c in enumerate(others):
                    w = want_bits(c, dtype)
                    if w is None:
                        if (got[i] & 0x7FFF) <= (0x7C00 if dtype == "fp16" else 0x7F80):
                            bad += 1  # a NaN code must stay NaN
                    elif got[i] != w:
                        bad += 1
    print(f"conversion: {'OK' if not bad else f'{bad} WRONG'} (256 codes x 4 byte positions x bf16 / fp16)")
    return bad


def aligned_copies(w: int, g: int) -> dict[int, tuple[int, int]]:
    """Stage byte -> (row, column) of the code that produce_codes' aligned copies of group g put there."""
    out = {}
    dst = code_off(w, g)
    for lane in range(32):
        for r in range(4):
            for i in range(16):
                out[dst + (lane >> 2) * SLAB + 64 * r + 16 * (lane & 3) + i] = (16 * w + 4 * g + r, 16 * lane + i)
        if lane < 16:
            r = (lane >> 2) & 3
            for i in range(16):
                out[dst + 8 * SLAB + 64 * r + 16 * (lane & 3) + i] = (16 * w + 4 * g + r, 16 * (32 + (lane & 3)) + i)
    return out


def byte_path(w: int) -> dict[int, tuple[int, int]]:
    out = {}
    for i in range(16 * DIM):
        r, c = i // DIM, i % DIM
        out[code_off(w, r >> 2) + (c >> 6) * SLAB + 64 * (r & 3) + (c & 63)] = (16 * w + r, c)
    return out


def check_layout() -> int:
    problems = []
    stored = {}
    for w in range(4):
        path = byte_path(w)
        for g in range(4):
            copies = aligned_copies(w, g)
            if len(copies) != 4 * DIM:
                problems.append(f"warp {w} group {g}: {len(copies)} code bytes copied, not {4 * DIM}")
            group_bytes = {k * SLAB + (16 * w + 4 * g) * 128 + x for k in range(9) for x in range(512)}
            if not set(copies) <= group_bytes:
                problems.append(f"warp {w} group {g}: copies outside the group's bytes")
            if any(path.get(b) != rc for b, rc in copies.items()):
                problems.append(f"warp {w} group {g}: byte path and copies disagree")
            writes = {}
            for lane in range(32):
                row = 16 * w + 4 * g + (lane >> 3)
                for k in range(9):
                    src = code_off(w, g) + k * SLAB + 8 * lane
                    codes = [copies.get(src + i) for i in range(8)]
                    for i in range(8):
                        col = 64 * k + 8 * (lane & 7) + i
                        if codes[i] != (row, col):
                            problems.append(f"warp {w} group {g} lane {lane} slab {k}: reads {codes[i]}, "
                                            f"stores ({row}, {col})")
                        kernel = slab_off(row, 16 * (lane & 7)) + k * SLAB + 2 * i  # codes_to_values' store
                        if kernel != consumer_off(row, 2 * col):
                            problems.append(f"warp {w} group {g} lane {lane} slab {k}: ({row}, {col}) stored at "
                                            f"{kernel}, read at {consumer_off(row, 2 * col)}")
                        for byte in (kernel, kernel + 1):
                            writes[byte] = writes.get(byte, 0) + 1
                            stored[byte] = stored.get(byte, 0) + 1
            if set(writes) != group_bytes or any(n != 1 for n in writes.values()):
                problems.append(f"warp {w} group {g}: stores do not fill the group's bytes once each")
    if len(stored) != KEYS * DIM * 2 or any(n != 1 for n in stored.values()):
        problems.append("the stage is not stored exactly once")
    print(f"layout: {'OK' if not problems else 'WRONG'} (4 warps x 4 row groups x 9 slabs, aligned and byte path)")
    for p in problems[:10]:
        print("  ", p)
    return len(problems)


if __name__ == "__main__":
    failed = check_conversion() + check_layout()
    print("ALL PASS" if not failed else "FAILED")
    raise SystemExit(1 if failed else 0)
