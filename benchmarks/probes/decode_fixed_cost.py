"""Where the cuda decode's fixed cost goes (issue 9): time = F + tiles_per_CTA * t, measured, not fitted from two rows.

Round (j) fitted F ~ 22-24 us at 16 heads from the bf16 and FP8 rows of one A/B (benchmarks/NOTES.md, "Round (j),
the lead's device calls 6-7"), the same with one split (no combine) as with four: so it is not the combine. This
probe times the cuda backend's decode (graph replays, page 64, full lengths) over a ladder of lengths at fixed
heads x batch x splits, fits F and t by least squares on the tiles each CTA streams, and repeats that under three
ways of starting each timed replay:

* ``dirty``: the harness's flush (mla_core.bench.flush_l2: 256 MiB written, the L2 left full of dirty lines that
  the decode's first reads must write back);
* ``clean``: 256 MiB read instead (flush_l2_clean: the L2 holds clean lines, evicted for free);
* ``warm``: no flush (the cache and its table may still be in the L2 from the previous replay).

Plus the harness's floor: a graph of one 1-element kernel timed the same ways. F(dirty) - F(clean) is what the
dirty L2 costs every row; F(clean) - floor is the kernels' own fixed cost (launch of split + combine, prologue,
pipeline fill, epilogue). Run on the device (~60-90 s after the extension is built):

    MLA_COMMIT=<hash> python3 benchmarks/probes/decode_fixed_cost.py [--heads 16,128] [--batch 32] \
        [--splits auto] [--kv bf16,fp8] [--lengths 256,512,1024,2048,4096,8192]
"""
from __future__ import annotations

import argparse
import math
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

RANK, ROPE, PAGE, KEYS_PER_TILE = 512, 64, 64, 64


def least_squares(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the straight line through (xs, ys) by least squares."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="32")
    ap.add_argument("--splits", default="auto", help="'auto' or a split count for every row")
    ap.add_argument("--kv", default="bf16,fp8", help="bf16 and/or fp8 (FP8 cache with kv_scale)")
    ap.add_argument("--lengths", default="256,512,1024,2048,4096,8192")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731

    import torch
    from bench_decode import fp8_cache, make_inputs
    from common import device_info, print_table

    import mla_core
    from mla_core.bench import flush_l2, flush_l2_clean, time_graph
    from mla_core.specs import validate_decode
    from mla_core_cuda import build, decode

    module = build.build()
    cuda = mla_core.get_backend("cuda")
    modes = {"dirty": flush_l2, "clean": flush_l2_clean, "warm": False}
    print(f"# {device_info()}", flush=True)
    one = torch.zeros(1, device="cuda")
    floor = {m: time_graph(lambda: one.add_(0), iters=args.iters, flush=f) for m, f in modes.items()}
    print("# harness floor (one 1-element kernel in a graph): "
          + ", ".join(f"{m} {us:.1f} us" for m, us in floor.items()), flush=True)

    splits = "auto" if args.splits == "auto" else int(args.splits)
    rows = []
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for kv in args.kv.split(","):
                if kv == "fp8" and heads > 16:
                    continue  # the keys-as-M FP8 kernel is the one with the unexplained fixed cost
                points = {m: ([], []) for m in modes}
                for length in ints(args.lengths):
                    q, cache, table, lens = make_inputs(batch, heads, length)
                    scale = None
                    if kv == "fp8":
                        cache, scale = fp8_cache(cache)
                    problem, call = validate_decode(
                        q, cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                        qk_rope_head_dim=ROPE, page_size=None, num_kv_splits=splits, k_qdq=None, k_qdq_amax=None,
                        v_qdq=None, v_qdq_amax=None, p_qdq=None, p_qdq_amax=1.0, return_lse=True, out_dtype=None,
                        kv_scale=scale)
                    config = cuda.configs(problem)[0]
                    n_splits = decode.num_splits(call, config)
                    tiles = math.ceil(math.ceil(length / KEYS_PER_TILE) / n_splits)
                    row = dict(kv=kv, heads=heads, batch=batch, length=length, splits=n_splits, tiles=tiles)
                    for m, f in modes.items():
                        us = time_graph(lambda: decode.run(module, call, config), iters=args.iters, flush=f)
                        row[m] = us
                        points[m][0].append(tiles)
                        points[m][1].append(us)
                    rows.append(row)
                    print(f"  {kv} H{heads} B{batch} L{length} splits {n_splits} tiles/CTA {tiles}: "
                          + ", ".join(f"{m} {row[m]:.1f}" for m in modes), flush=True)
                    del q, cache, table, lens
                    torch.cuda.empty_cache()
                fit = {m: least_squares(*points[m]) for m in modes}
                rows.append(dict(kv=kv, heads=heads, batch=batch, length=-1, splits=-1, tiles=-1,
                                 **{m: fit[m][0] for m in modes}))
                print(f"# fit {kv} H{heads} B{batch}: "
                      + "; ".join(f"{m} F {fit[m][0]:.1f} us, t {fit[m][1]:.3f} us a tile" for m in modes)
                      + f"; F(dirty) - F(clean) {fit['dirty'][0] - fit['clean'][0]:.1f}, "
                        f"F(clean) - floor {fit['clean'][0] - floor['clean']:.1f}", flush=True)
    print("\n(length -1: the fitted F of the rows above)")
    print_table(rows, [("kv", "kv", "s"), ("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"),
                       ("splits", "splits", "d"), ("tiles", "tiles/CTA", "d"), ("dirty", "dirty us", ".1f"),
                       ("clean", "clean us", ".1f"), ("warm", "warm us", ".1f")])
    return 0


if __name__ == "__main__":
    sys.exit(main())
