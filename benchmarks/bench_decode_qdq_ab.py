"""A/B of two builds of the CUDA sources on the decode's fp8 recipe (issue 9): one process, the same inputs, the
two builds timed alternately (A B B A per shape and recipe), so clock and run-to-run drift fall on both alike.

    python benchmarks/bench_decode_qdq_ab.py --src-a DIR_A --src-b DIR_B [--heads 16,128] [--batch 1,32,128]
        [--lengths 8192,32768] [--dtype bf16]

DIR_A / DIR_B: csrc/ folders (each builds into the build cache under its own key; build both beforehand to keep
compile time out of the timed call: benchmarks/run_decode_qdq_ab.sh does). Rows: heads x batch x length, page 64,
full lengths, ``num_kv_splits="auto"``, the config dispatch runs first (the WGMMA kernel); per build the bf16 and
the fp8 recipe's µs (CUDA-graph replays, L2 flushed, the median of each build's two timings), fp8 / bf16 per
build, and B / A of the fp8 time. Each shape's outputs and LSE of B are compared with A's bit for bit (the branch
converts with the same instructions per element, so they must be equal). JSON to $OUT/bench_decode_qdq_ab.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import make_inputs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64
RECIPES = {"bf16": (None, None, None), "fp8": ("fp8", "fp8", "fp8")}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src-a", required=True)
    ap.add_argument("--src-b", required=True)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    from mla_core_cuda import decode
    mods = {"A": load_cuda_extension(args.src_a), "B": load_cuda_extension(args.src_b)}
    cuda = mla_core.get_backend("cuda")
    print(f"# {device_info()}\n# A = {args.src_a} ({mods['A'].__name__}), B = {args.src_b} ({mods['B'].__name__})",
          flush=True)
    rows, mismatches = [], 0
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                q, cache, table, lens = make_inputs(batch, heads, length)
                if args.dtype == "fp16":
                    q, cache = q.half(), cache.half()
                r = dict(heads=heads, batch=batch, length=length)
                for recipe, (k, v, p) in RECIPES.items():
                    problem, call = validate_decode(
                        q, cache, table, lens, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                        qk_rope_head_dim=ROPE, page_size=None, num_kv_splits="auto", k_qdq=k, k_qdq_amax=None,
                        v_qdq=v, v_qdq_amax=None, p_qdq=p, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
                    config = cuda.configs(problem)[0]
                    outs = {name: decode.run(mod, call, config) for name, mod in mods.items()}
                    same = all(same_bits(a, b) for a, b in zip(outs["A"], outs["B"]))
                    mismatches += not same
                    times = {"A": [], "B": []}
                    for name in ("A", "B", "B", "A"):
                        mod = mods[name]
                        times[name].append(time_graph(lambda mod=mod: decode.run(mod, call, config), iters=20))
                    for name in ("A", "B"):
                        r[f"{recipe}_{name}"] = statistics.median(times[name])
                    r[f"{recipe}_kernel"] = config.get("kernel", "mma.sync")
                    r[f"{recipe}_bitequal"] = same
                for name in ("A", "B"):
                    r[f"x_{name}"] = r[f"fp8_{name}"] / r[f"bf16_{name}"]
                r["fp8_B_over_A"] = r["fp8_B"] / r["fp8_A"]
                rows.append(r)
                print(f"H={heads} B={batch} L={length}: bf16 A {r['bf16_A']:.1f} B {r['bf16_B']:.1f} us; fp8 A "
                      f"{r['fp8_A']:.1f} ({r['x_A']:.2f}x) B {r['fp8_B']:.1f} ({r['x_B']:.2f}x); fp8 B/A "
                      f"{r['fp8_B_over_A']:.3f}; outputs B == A: bf16 {r['bf16_bitequal']}, fp8 {r['fp8_bitequal']}",
                      flush=True)
                del q, cache, table, lens
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"),
                       ("bf16_A", "bf16 A", ".1f"), ("bf16_B", "bf16 B", ".1f"), ("fp8_A", "fp8 A", ".1f"),
                       ("fp8_B", "fp8 B", ".1f"), ("x_A", "A x bf16", ".2f"), ("x_B", "B x bf16", ".2f"),
                       ("fp8_B_over_A", "fp8 B/A", ".3f")])
    print(f"outputs and LSE of B bit-equal to A's: {2 * len(rows) - mismatches} of {2 * len(rows)} (shape, recipe)")
    write_json("bench_decode_qdq_ab.json", dict(device=device_info(), src_a=args.src_a, src_b=args.src_b, rows=rows))
    return 1 if mismatches else 0


if __name__ == "__main__":
    sys.exit(main())
