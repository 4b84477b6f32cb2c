"""The autotuner's eager and CUDA-graph timings side by side: per shape and backend, the fastest config's µs in each.

    python benchmarks/tune_timing.py [--heads 16,128] [--batch 1,32] [--lengths 4096] [--budget-s 90] [--json FILE]

For each decode shape (bf16, LSE, 32 splits: the warm-up preset's keys) every candidate kernel is compiled
first in worker processes (``mla_core.autotune.precompile``), then the shape is tuned twice,
``timing="eager"`` and ``timing="auto"`` (graph where capturable), and the table lists each backend's
fastest config in both, how it was timed, and the winner of each. Shapes left when ``--budget-s``
seconds have passed are skipped (listed at the end).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from mla_core.autotune import precompile, tuner, warmup
from mla_core.cli.args import int_list
from mla_core.cli.table import table


def best_per_backend(result: tuner.TuneResult) -> dict[str, tuner.Candidate]:
    """Each backend's fastest fully timed candidate (warm-up estimates and failures left out)."""
    out: dict[str, tuner.Candidate] = {}
    for c in result.candidates:
        if c.us is not None and c.note is None and (c.backend not in out or c.us < out[c.backend].us):
            out[c.backend] = c
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int_list, default=(16, 128))
    p.add_argument("--batch", type=int_list, default=(1, 32))
    p.add_argument("--lengths", type=int_list, default=(4096,))
    p.add_argument("--budget-s", type=float, default=90.0)
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    started = time.perf_counter()
    problems = warmup.preset_problems(warmup.Grid(ops=("decode",), recipes=("bf16",), batches=args.batch,
                                                  lengths=args.lengths, heads=args.heads, device="cuda"))
    problems.sort(key=lambda q: (q["heads"], q["batch"]))  # 16 heads first: the shapes the question is about
    jobs = precompile.default_jobs()
    report = precompile.run(problems, jobs, f"cuda:{torch.cuda.current_device()}")
    print(report.describe(), flush=True)
    rows, skipped = [], []
    for problem in problems:
        if time.perf_counter() - started > args.budget_s:
            skipped.append(warmup.describe(problem))
            continue
        results = {mode: tuner.tune(problem, timing=mode) for mode in ("eager", "auto")}
        best = {mode: best_per_backend(r) for mode, r in results.items()}
        for backend in sorted(set(best["eager"]) | set(best["auto"])):
            e, g = best["eager"].get(backend), best["auto"].get(backend)
            rows.append({"shape": warmup.describe(problem), "backend": backend,
                         "eager_us": e.us if e else None, "eager_config": e.config if e else None,
                         "auto_us": g.us if g else None, "auto_timing": g.timing if g else None,
                         "auto_config": g.config if g else None, "capture_error": g.capture_error if g else None,
                         "winner_eager": results["eager"].winner.label() if results["eager"].winner else None,
                         "winner_auto": results["auto"].winner.label() if results["auto"].winner else None,
                         "tune_s": {m: round(r.wall_s, 2) for m, r in results.items()}})
        print(f"{warmup.describe(problem)}: tuned in {results['eager'].wall_s:.1f} s (eager), "
              f"{results['auto'].wall_s:.1f} s (auto)", flush=True)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"
    print(table([[r["shape"], r["backend"], fmt(r["eager_us"]), f"{fmt(r['auto_us'])} {r['auto_timing'] or ''}".strip(),
                  "-" if not (r["eager_us"] and r["auto_us"]) else f"{r['eager_us'] / r['auto_us']:.2f}",
                  r["winner_eager"], r["winner_auto"]] for r in rows],
                ["shape", "backend", "eager us", "auto us", "eager/auto", "winner (eager)", "winner (auto)"]))
    for r in rows:
        if r["capture_error"]:
            print(f"{r['shape']} {r['backend']}: {r['capture_error']}")
    if skipped:
        print(f"skipped after {args.budget_s:g} s: {', '.join(skipped)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "skipped": skipped}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
