#!/usr/bin/env python3
"""Makespan model of the cuda prefill's launch order (issue 12; NOTES "Prefill launch order (round n)"). CPU only.

    python3 benchmarks/probes/prefill_launch_order_model.py [--sms 132] [--tflops 660]

Per case of bench_prefill.py (causal, 128 heads, q/k 192, v 128): the CTAs (128 query rows, head, sequence), their
64-key tile counts (prefill::cta_tiles), the FLOP floor (2 x heads x (192 + 128) x visible pairs at --tflops) and a
two-term cost model fitted to the measured times given below (H200, graph replays, round n): a CTA costs
``a x tiles + b`` µs of one SM (a, b solved from 4x4096 and 1x16384; ragged16 is the check) and an empty CTA (a
block past its sequence's end) 0.4 µs. The launch is modelled as list scheduling: CTAs start in grid order, each
on the SM that frees first, one CTA per SM (208 KB of shared memory). Printed per order: the makespan above the
perfectly balanced time (the tail), without and with +-5 % per-CTA noise (mean of 5 seeds). Orders: main's
(x = blocks longest first, then heads: a head's blocks in turn, i.e. G = 1), ``launch_place`` of
csrc/mla_prefill_common.cuh with groups of G = 2, 4, 8 heads (transcribed below with head_group_log2, which picks
the kernel's G), and global longest-first (LPT: no L2 locality). The script also checks that launch_place visits
every (block, head) once for 1..40 heads x 1..300 blocks with the kernel's G.
"""
from __future__ import annotations

import argparse
import heapq
import random

HEADS, DQK, DV, BM, BN = 128, 192, 128, 128, 64
RAGGED16 = [round(128 * 64 ** (i / 15)) for i in range(16)]  # as bench_prefill.py
CASES = {"4x4096": [4096] * 4, "1x16384": [16384], "ragged16": RAGGED16}
MEASURED_US = {"4x4096": 5249.0, "1x16384": 18455.0, "ragged16": 12594.0}  # main's bf16 kernel, H200 (the brief)
EMPTY_US = 0.4


def tiles(q0: int, length: int) -> int | None:
    """prefill::cta_tiles for len_q = len_k = length (causal); None for a block past the end."""
    if q0 >= length:
        return None
    return min(length - 1, q0 + BM - 1) // BN + 1


def head_group_log2(blocks: int, heads: int) -> int:
    """csrc/mla_prefill_common.cuh's head_group_log2 (kGroupBlocks 256)."""
    g = 0
    while g < 3 and heads % (2 << g) == 0 and blocks << (g + 1) <= 256:
        g += 1
    return g


def launch_place(x: int, y: int, nx: int, g: int) -> tuple[int, int]:
    """(head, query block) of grid place (x, y): csrc/mla_prefill_common.cuh's launch_place."""
    low = (1 << g) - 1
    r = (y & low) * nx + x
    return (y & ~low) + (r & low), nx - 1 - (r >> g)


def grid_order(seqs: list[int], g: int) -> list[int | None]:
    """Tile counts of the CTAs in launch order (x fastest, then y = head, then z = sequence)."""
    nx = (max(seqs) + BM - 1) // BM
    return [tiles(launch_place(x, y, nx, g)[1] * BM, length)
            for length in seqs for y in range(HEADS) for x in range(nx)]


def makespan(costs: list[float], sms: int) -> float:
    free = [0.0] * sms
    for c in costs:
        heapq.heapreplace(free, free[0] + c)
    return max(free)


def check_bijection() -> int:
    bad = 0
    for heads in range(1, 41):
        for nx in range(1, 300, 7):
            g = head_group_log2(nx, heads)
            seen = {launch_place(x, y, nx, g) for y in range(heads) for x in range(nx)}
            bad += seen != {(h, mb) for h in range(heads) for mb in range(nx)}
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--tflops", type=float, default=660.0)
    args = ap.parse_args()
    print(f"launch_place visits every (head, block) once for 1..40 heads x 1..300 blocks: "
          f"{'yes' if check_bijection() == 0 else 'NO'}")
    per_sm = {}
    for case, seqs in CASES.items():
        order = grid_order(seqs, 0)
        real = [n for n in order if n is not None]
        pairs = sum(n * (n + 1) // 2 for n in seqs)
        flops = 2 * HEADS * (DQK + DV) * pairs
        tile_flops = 2 * BM * BN * (DQK + DV) * sum(real)
        per_sm[case] = (sum(real) / args.sms, len(real) / args.sms, (len(order) - len(real)) / args.sms)
        print(f"{case}: {len(real)} CTAs ({len(order) - len(real)} empty), {sum(real)} tiles "
              f"({per_sm[case][0]:.0f} an SM, {per_sm[case][1]:.1f} CTAs an SM); FLOP floor "
              f"{flops / 1e12:.3f} TFLOP = {flops / args.tflops / 1e6:.0f} µs at {args.tflops:.0f} TFLOP/s; "
              f"tiles as computed {tile_flops / 1e12:.3f} TFLOP = {tile_flops / args.tflops / 1e6:.0f} µs")
    (t4, c4, e4), (t16, c16, e16) = per_sm["4x4096"], per_sm["1x16384"]
    b = (MEASURED_US["4x4096"] - MEASURED_US["1x16384"] * t4 / t16) / (c4 - c16 * t4 / t16)
    a = (MEASURED_US["1x16384"] - b * c16) / t16
    tr, cr, er = per_sm["ragged16"]
    print(f"fit: a = {a:.4f} µs a tile (= {a * 1.98e3:.0f} cycles at 1.98 GHz), b = {b:.2f} µs a CTA; "
          f"ragged16 predicted {a * tr + b * cr + EMPTY_US * er:.0f} µs, measured {MEASURED_US['ragged16']:.0f}")
    for case, seqs in CASES.items():
        t, c, _ = per_sm[case]
        print(f"{case}: per-CTA term {b * c:.0f} µs = {b * c / MEASURED_US[case]:.1%} of main's time; "
              f"0.95x cuDNN needs ", end="")
        print({"4x4096": "<= 4,612 µs", "1x16384": "<= 18,013 µs", "ragged16": "(no cuDNN number)"}[case])
        cells = []
        g_kernel = head_group_log2((max(seqs) + BM - 1) // BM, HEADS)
        for name, g in (("main (G 1)", 0), ("G 2", 1), ("G 4", 2), ("G 8", 3), ("LPT", None)):
            tails = []
            for seed in (None, 0, 1, 2, 3, 4):
                rnd = random.Random(seed)
                order = grid_order(seqs, g or 0)
                costs = [EMPTY_US if n is None else (a * n + b) * (1 if seed is None else rnd.uniform(0.95, 1.05))
                         for n in order]
                if g is None:
                    costs.sort(reverse=True)
                tails.append(makespan(costs, args.sms) - sum(costs) / args.sms)
            cells.append(f"{name}{' (kernel)' if g == g_kernel else ''} +{tails[0]:.0f} / +{sum(tails[1:]) / 5:.0f}")
        print("   tail µs (exact / noisy): " + ", ".join(cells))


if __name__ == "__main__":
    main()
