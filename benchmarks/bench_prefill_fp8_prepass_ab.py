"""A/B of the cuda prefill's fp8 recipe through its whole launcher (pre-pass + kernel; branch wip/prefill-fp8-prepass):
one process, the same inputs, A (a snapshot's mla_core_cuda package and csrc) and B (this checkout's) timed
alternately, so clock and run-to-run drift fall on both alike.

    python benchmarks/bench_prefill_fp8_prepass_ab.py --base DIR_A [--cases 4x4096 1x16384 ragged16] [--rounds 3]

DIR_A: a folder holding A's ``csrc/`` and ``backends/cuda/mla_core_cuda/`` (git archive of main: run_prefill_fp8_
prepass_ab.sh says how); A's launcher is imported from there under another package name, its extension built from
its csrc (build both beforehand to keep compile time out of the call). Cases as bench_prefill.py (causal, 128
heads, q/k 192, v 128, its randn inputs); recipes bf16 and fp8 (Q/K/V/P FP8 with calibrated amaxes q 4.5, k 5.0,
v 4.25, p 1.0: per-tensor factors that are not powers of two, so the division-free quotient is exercised). Per
case and recipe: ``prefill.run`` of A and of B in CUDA-graph replays with the L2 flushed (median µs of 10), in the
order A B B A per round; B's output and LSE compared with A's bit for bit (the codes are the same values). The
fp8 rows add A's pre-pass alone (three launches over Q, K, V) and B's (one launch over K and V). Table: medians
over rounds, B / A, the fp8 recipe over the bf16 one per build. JSON to $OUT/bench_prefill_fp8_prepass_ab.json.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_prefill import CASES, make_inputs  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")

from mla_core import specs  # noqa: E402
from mla_core_cuda import prefill as prefill_b  # noqa: E402

AMAX = dict(q_amax=4.5, k_amax=5.0, v_amax=4.25, p_amax=1.0)
RECIPES = {"bf16": None, "fp8": "fp8"}


def import_launcher(root: str):
    """A's ``mla_core_cuda.prefill`` from ``root/backends/cuda/mla_core_cuda``, as package ``mla_core_cuda_ab_a``."""
    pkg = os.path.join(os.path.abspath(root), "backends", "cuda", "mla_core_cuda")
    spec = importlib.util.spec_from_file_location("mla_core_cuda_ab_a", os.path.join(pkg, "__init__.py"),
                                                  submodule_search_locations=[pkg])
    module = importlib.util.module_from_spec(spec)
    sys.modules["mla_core_cuda_ab_a"] = module
    spec.loader.exec_module(module)
    return importlib.import_module("mla_core_cuda_ab_a.prefill")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="A: folder with csrc/ and backends/cuda/mla_core_cuda/")
    ap.add_argument("--cases", nargs="*", default=["4x4096", "1x16384", "ragged16"], choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    mods = {"A": load_cuda_extension(os.path.join(args.base, "csrc")),
            "B": load_cuda_extension(os.path.join(here, "..", "csrc"))}
    launchers = {"A": import_launcher(args.base), "B": prefill_b}
    print(f"# {device_info()}\n# A = {args.base} ({mods['A'].__name__}), B = this checkout ({mods['B'].__name__})",
          flush=True)
    rows, mismatches = [], 0
    for case in args.cases:
        inputs = make_inputs(CASES[case])
        for recipe, fmt in RECIPES.items():
            _, call = specs.validate_prefill(
                *inputs, None, True, True, q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt, sparsity_n=0,
                sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64, **AMAX)
            fns = {s: (lambda s=s: launchers[s].run(mods[s], call, {})) for s in "AB"}
            got = {s: fns[s]() for s in "AB"}
            same = all(same_bits(x, y) for x, y in zip(got["A"], got["B"]))
            mismatches += not same
            del got
            parts = {}
            if fmt:
                qa, ka, va = ((x, AMAX[f"{n}_amax"]) for x, n in zip(inputs[:3], "qkv"))
                parts = {"A": lambda: [launchers["A"].fp8_codes(mods["A"], *xa) for xa in (qa, ka, va)],
                         "B": lambda: launchers["B"].fp8_codes(mods["B"], [ka, va])}
            times = {s: [] for s in "AB"}
            pre = {s: [] for s in "AB"}
            for _ in range(args.rounds):
                for s in "ABBA":
                    times[s].append(time_graph(fns[s], iters=10))
                    if parts:
                        pre[s].append(time_graph(parts[s], iters=10))
            r = dict(case=case, recipe=recipe, same="yes" if same else "NO")
            for s in "AB":
                r[f"us_{s}"] = statistics.median(times[s])
                if parts:
                    r[f"pre_{s}"] = statistics.median(pre[s])
            r["b_over_a"] = r["us_B"] / r["us_A"]
            r["spread"] = max(max(t) / min(t) - 1 for t in times.values())
            rows.append(r)
            print(f"  {case} {recipe}: A {r['us_A']:.0f} µs, B {r['us_B']:.0f} µs, B/A {r['b_over_a']:.3f}"
                  + (f"; pre-pass A {r['pre_A']:.0f} µs, B {r['pre_B']:.0f} µs" if parts else "")
                  + f"; bit-equal {r['same']}; A {[round(t) for t in times['A']]} B {[round(t) for t in times['B']]}",
                  flush=True)
            torch.cuda.empty_cache()
        torch.cuda.empty_cache()
    bf16 = {(r["case"]): r for r in rows if r["recipe"] == "bf16"}
    for r in rows:
        if r["recipe"] == "fp8" and r["case"] in bf16:
            r["fp8_over_bf16_A"] = r["us_A"] / bf16[r["case"]]["us_A"]
            r["fp8_over_bf16_B"] = r["us_B"] / bf16[r["case"]]["us_B"]
    print()
    print_table(rows, COLUMNS)
    print(f"\nsummary: {len(rows)} rows, {mismatches} not bit-equal")
    write_json("bench_prefill_fp8_prepass_ab.json", {"device": device_info(), "rows": rows, "amax": AMAX})
    if mismatches:
        raise SystemExit(1)


COLUMNS = [("case", "case", "s"), ("recipe", "recipe", "s"), ("us_A", "A µs", ".0f"), ("us_B", "B µs", ".0f"),
           ("b_over_a", "B / A", ".3f"), ("spread", "max spread", ".3f"), ("pre_A", "A pre-pass µs", ".0f"),
           ("pre_B", "B pre-pass µs", ".0f"), ("fp8_over_bf16_A", "A fp8/bf16", ".3f"),
           ("fp8_over_bf16_B", "B fp8/bf16", ".3f"), ("same", "bit-equal", "s")]

if __name__ == "__main__":
    main()
