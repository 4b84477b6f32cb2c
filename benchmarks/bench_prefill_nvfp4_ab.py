"""A/B of the cuda prefill's nvfp4 recipe through its whole launcher (pre-pass + kernel; round (n)'s cheaper P step,
then wip/nvfuse's Q values in the kernel and cheaper pre-pass): one process, the same inputs, A (a snapshot's mla_core_cuda package
and csrc: main) and B (this checkout's) timed alternately, so clock and run-to-run drift fall on both alike.

    python benchmarks/bench_prefill_nvfp4_ab.py --base DIR_A [--cases 4x4096 1x16384 ragged16] [--rounds 3] [--parts]

DIR_A: a folder holding A's ``csrc/`` and ``backends/cuda/mla_core_cuda/`` (run_prefill_nvfp4_ab.sh says how); A's
launcher is imported from there under another package name. Cases as bench_prefill.py (causal, 128 heads, q/k 192, v
128, its randn inputs). Recipes: ``bf16`` (a control: the kernel instance B leaves SASS-identical, B / A ~1),
``nvfp4`` (calibrated amaxes q 4.5, k 5.0, v 4.25, p 1.0: P's division-free step, p_fmt 3) and ``nvfp4-ieee`` (p_amax
1e-13: g outside the division-free range, P's IEEE step, p_fmt 4, saturated block codes; timed too). Per case and
recipe: ``prefill.run`` of A and of B in CUDA-graph replays with the L2 flushed (median µs of 10), in the order A B B
A per round; B's output and LSE compared with A's bit for bit (exit 1 if any differs). Dense cases add cuDNN SDPA
(bf16) in the same rounds and print each build's nvfp4 time over it (issue 12's target: <= 1.4). JSON to
$OUT/bench_prefill_nvfp4_ab.json.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import CASES, make_inputs, sdpa_cudnn  # noqa: E402
from bench_prefill_fp8_prepass_ab import import_launcher  # noqa: E402
from common import device_info, load_cuda_extension, print_table, same_bits, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")

from mla_core import specs  # noqa: E402
from mla_core_cuda import prefill as prefill_b  # noqa: E402

AMAX = dict(q_amax=4.5, k_amax=5.0, v_amax=4.25, p_amax=1.0)
RECIPES = {"bf16": (None, dict(q_amax=None, k_amax=None, v_amax=None, p_amax=1.0)),
           "nvfp4": ("nvfp4", AMAX),
           "nvfp4-ieee": ("nvfp4", dict(AMAX, p_amax=1e-13))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="A: folder with csrc/ and backends/cuda/mla_core_cuda/")
    ap.add_argument("--cases", nargs="*", default=["4x4096", "1x16384", "ragged16"], choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--parts", action="store_true", help="also time each build's NVFP4 pre-pass launches alone")
    ap.add_argument("--alternate", action="store_true",
                    help="odd rounds in the order B A A B (even ones A B B A) and B / A of each order reported apart "
                         "(b_over_a_abba, b_over_a_baab: the medians of that order's rounds)")
    args = ap.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    mods = {"A": load_cuda_extension(os.path.join(args.base, "csrc")),
            "B": load_cuda_extension(os.path.join(here, "..", "csrc"))}
    launchers = {"A": import_launcher(args.base), "B": prefill_b}
    print(f"# {device_info()}\n# A = {args.base} ({mods['A'].__name__}), B = this checkout ({mods['B'].__name__})",
          flush=True)
    rows, mismatches = [], 0
    for case in args.cases:
        seqs = CASES[case]
        inputs = make_inputs(seqs)
        cudnn = None
        if not case.startswith("ragged"):
            try:
                _, cudnn = sdpa_cudnn(inputs, seqs)
            except Exception as e:  # noqa: BLE001 (reported; the A/B does not need it)
                print(f"  {case}: no cuDNN SDPA ({type(e).__name__})", flush=True)
        for recipe, (fmt, amax) in RECIPES.items():
            _, call = specs.validate_prefill(
                *inputs, None, True, True, q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt, sparsity_n=0,
                sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64, **amax)
            fns = {s: (lambda s=s: launchers[s].run(mods[s], call, {})) for s in "AB"}
            got = {s: fns[s]() for s in "AB"}
            same = all(same_bits(x, y) for x, y in zip(got["A"], got["B"]))
            mismatches += not same
            del got
            times = {s: [] for s in "AB"}
            by_order = {o: {s: [] for s in "AB"} for o in ("ABBA", "BAAB")}
            ref = []
            for rnd in range(args.rounds):
                order = "BAAB" if args.alternate and rnd % 2 else "ABBA"
                for s in order:
                    times[s].append(time_graph(fns[s], iters=10))
                    by_order[order][s].append(times[s][-1])
                if cudnn is not None and recipe == "nvfp4":
                    ref.append(time_graph(cudnn, iters=10))
            r = dict(case=case, recipe=recipe, same="yes" if same else "NO")
            for s in "AB":
                r[f"us_{s}"] = statistics.median(times[s])
            r["b_over_a"] = r["us_B"] / r["us_A"]
            r["saved_us"] = r["us_A"] - r["us_B"]
            r["spread"] = max(max(t) / min(t) - 1 for t in times.values())
            for o, t in by_order.items():
                if t["A"]:
                    r[f"b_over_a_{o.lower()}"] = statistics.median(t["B"]) / statistics.median(t["A"])
            if ref:
                r["cudnn_us"] = statistics.median(ref)
                r["x_cudnn_A"] = r["us_A"] / r["cudnn_us"]
                r["x_cudnn_B"] = r["us_B"] / r["cudnn_us"]
            rows.append(r)
            print(f"  {case} {recipe}: A {r['us_A']:.0f} µs, B {r['us_B']:.0f} µs, B/A {r['b_over_a']:.3f}"
                  + (f"; cuDNN {r['cudnn_us']:.0f} µs: A {r['x_cudnn_A']:.3f}x, B {r['x_cudnn_B']:.3f}x" if ref else "")
                  + (f"; by order ABBA {r['b_over_a_abba']:.3f} BAAB {r['b_over_a_baab']:.3f}"
                     if "b_over_a_baab" in r else "")
                  + f"; bit-equal {r['same']}; A {[round(t) for t in times['A']]} B {[round(t) for t in times['B']]}",
                  flush=True)
            torch.cuda.empty_cache()
        if args.parts:
            rows += prepass_parts(case, inputs, mods, launchers, args.rounds)
        del inputs, cudnn
        torch.cuda.empty_cache()
    print()
    print_table(rows, COLUMNS)
    mismatches += sum(r["same"] != "yes" for r in rows if r["recipe"].startswith("prepass"))
    print(f"\nsummary: {len(rows)} rows, {mismatches} not bit-equal")
    write_json("bench_prefill_nvfp4_ab.json", {"device": device_info(), "rows": rows, "amax": AMAX})
    if mismatches:
        raise SystemExit(1)


def prepass_parts(case, inputs, mods, launchers, rounds) -> list[dict]:
    """The nvfp4 pre-pass launches alone, each build's own on the same inputs (graph replays, A B B A): ``rows q+k``
    (Q and K in one launch: what A's recipe runs), ``rows k`` (K alone: B's, whose kernel makes Q's values) and
    ``keys v`` (V along keys); B's values equal to A's bit for bit."""
    q, k, v, _, cu_k, _ = inputs
    cu_k = cu_k.to(torch.int32)
    parts = {"prepass rows q+k": lambda s: [x for x, _ in launchers[s].nvfp4_rows(mods[s], [(q, AMAX["q_amax"]),
                                                                                          (k, AMAX["k_amax"])])],
             "prepass rows k": lambda s: [x for x, _ in launchers[s].nvfp4_rows(mods[s], [(k, AMAX["k_amax"])])],
             "prepass keys v": lambda s: [launchers[s].nvfp4_keys(mods[s], v, cu_k, AMAX["v_amax"])[0]]}
    out = []
    for name, fn in parts.items():
        got = {s: fn(s) for s in "AB"}
        same = all(same_bits(x, y) for x, y in zip(got["A"], got["B"]))
        del got
        times = {s: [] for s in "AB"}
        for _ in range(rounds):
            for s in "ABBA":
                times[s].append(time_graph(lambda s=s: fn(s), iters=10))
        r = dict(case=case, recipe=name, same="yes" if same else "NO", us_A=statistics.median(times["A"]),
                 us_B=statistics.median(times["B"]))
        r.update(b_over_a=r["us_B"] / r["us_A"], saved_us=r["us_A"] - r["us_B"],
                 spread=max(max(t) / min(t) - 1 for t in times.values()))
        print(f"  {case} {name}: A {r['us_A']:.0f} µs, B {r['us_B']:.0f} µs, B/A {r['b_over_a']:.3f}; "
              f"bit-equal {r['same']}", flush=True)
        out.append(r)
        torch.cuda.empty_cache()
    return out


COLUMNS = [("case", "case", "s"), ("recipe", "recipe", "s"), ("us_A", "A µs", ".0f"), ("us_B", "B µs", ".0f"),
           ("b_over_a", "B / A", ".3f"), ("saved_us", "A - B µs", ".0f"), ("spread", "max spread", ".3f"),
           ("cudnn_us", "cuDNN µs", ".0f"), ("x_cudnn_A", "A x cuDNN", ".3f"), ("x_cudnn_B", "B x cuDNN", ".3f"),
           ("same", "bit-equal", "s")]

if __name__ == "__main__":
    main()
