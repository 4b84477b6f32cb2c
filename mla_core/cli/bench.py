"""``mla-core bench OP [shape options]``: time every valid backend on your shapes against the measured roofline.

On a GPU each backend is timed as CUDA-graph replays with the L2 flushed before each (the reference backend,
which reads lengths on the host, eagerly only) and as eager calls of the public op (Python overhead
included, ``MLA_CORE_CHECKS=metadata`` as a serving loop runs it); the copy bandwidth and bf16 matmul rate
are measured in the same run and every result is quoted as a % of them. On a CPU the eager calls are
timed with ``perf_counter`` and no ceiling is claimed.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any, Iterator

import torch

from .. import bench
from ..accuracy import REFERENCE
from ..explain import explain_problem, public_function, validate
from .explain import SHAPE_OPTIONS, add_shape_options, shapes
from .table import table


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


def _progress(text: str, quiet: bool) -> None:
    if not quiet:
        print(text, file=sys.stderr, flush=True)


def _time_backend(w: bench.Workload, problem, call, backend, config: dict[str, Any], device: str,
                  iters: int) -> dict[str, Any]:
    """Graph and eager median µs of one backend on one workload (None where it cannot be timed, with a note)."""
    fn = public_function(w.op)
    eager_call = lambda: fn(**w.kwargs, backend=backend.name)  # noqa: E731
    slow = backend.name == REFERENCE
    out: dict[str, Any] = {"graph_us": None, "eager_us": None, "note": ""}
    if device == "cuda":
        if slow:
            out["note"] = "reference: eager only (reads lengths on the host)"
        else:
            try:
                out["graph_us"] = bench.time_graph(lambda: backend.run(problem, call, config), iters=iters)
            except Exception as exc:  # a backend that cannot be captured is still timed eagerly
                out["note"] = f"no CUDA graph: {type(exc).__name__}: {exc}".splitlines()[0][:120]
                torch.cuda.synchronize()
        out["eager_us"] = bench.time_eager(eager_call, iters=3 if slow else max(5, iters // 2), warmup=1 if slow else 3)
    else:
        out["eager_us"] = bench.time_cpu(eager_call, iters=3 if slow else 5)
    return out


def run_bench(op: str, args, device: str, quiet: bool = False) -> dict[str, Any]:
    """Time every valid backend (or ``args.backend``) on every shape; returns the JSON report."""
    from ..plugins import get_backend
    only = [get_backend(n) for n in args.backend] if args.backend else None  # unknown names fail first
    ceilings = None
    if device == "cuda":
        _progress("measuring the ceilings (copy bandwidth, bf16 matmul) ...", quiet)
        ceilings = bench.measure_ceilings()
    todo = shapes(op, args)
    rows: list[dict[str, Any]] = []
    with _env("MLA_CORE_CHECKS", "metadata"):
        for n, shape in enumerate(todo, 1):
            w = bench.workload(op, device=device, **shape)  # one shape's tensors at a time
            problem, call, _ = validate(w.op, **w.kwargs)
            choice = explain_problem(problem)
            names = [b.name for b in only] if only else choice.valid
            if only:
                for b in only:
                    why = b.why_not(problem)
                    if why:
                        rows.append({"shape": w.label, "backend": b.name, "skipped": "; ".join(why)})
                names = [b.name for b in only if not b.why_not(problem)]
            shape_rows = []
            for name in names:
                backend = get_backend(name)
                config = choice.config if name == choice.backend else backend.configs(problem)[0]
                _progress(f"[{n}/{len(todo)}] {w.label}: {name} ...", quiet)
                try:
                    times = _time_backend(w, problem, call, backend, config, device, args.iters)
                except Exception as exc:  # one crashing backend is a row, not the end of the run
                    times = {"graph_us": None, "eager_us": None,
                             "note": f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:160]}
                us = times["graph_us"] if times["graph_us"] is not None else times["eager_us"]
                shape_rows.append({"shape": w.label, "op": w.op, "backend": name, "config": config,
                                   "dispatch_pick": name == choice.backend, "us": us, **times,
                                   "flops": w.flops, "bytes": w.nbytes, "intensity": w.intensity,
                                   **bench.roofline_row(w, us, ceilings)})
            best = min((r["us"] for r in shape_rows if r["us"]), default=None)
            for r in shape_rows:
                r["x_fastest"] = r["us"] / best if best and r["us"] else None
            rows.extend(shape_rows)
            del w, call
            if device == "cuda":
                torch.cuda.empty_cache()
    timing = ("CUDA-graph replays, L2 flushed before each; eager = public op calls" if device == "cuda" else
              "perf_counter medians of eager calls on the CPU; no ceilings measured, so no % of roofline is claimed")
    return {"op": op, "device": device, "device_info": bench.device_info(), "ceilings": ceilings, "timing": timing,
            "rows": rows}


def _fmt(v: Any, spec: str) -> str:
    if v is None:
        return "-"
    if spec == "rate":  # GB/s, TFLOP/s: whole numbers on a GPU, three digits for the small CPU rates
        return f"{v:.0f}" if v >= 100 else f"{v:.1f}" if v >= 1 else f"{v:.3g}"
    return format(v, spec)


def print_report(report: dict[str, Any]) -> None:
    info, ceil = report["device_info"], report["ceilings"]
    where = info["gpu"] if report["device"] == "cuda" else "cpu"
    print(f"mla-core bench {report['op']} on {where} (torch {info['torch']}, triton {info['triton']}, "
          f"CUDA {info['cuda']})")
    if ceil:
        print(f"ceilings measured now: copy {ceil['copy_gbps']:.0f} GB/s (read + write), bf16 matmul "
              f"{ceil['bf16_tflops']:.0f} TFLOP/s")
    print(f"timing: {report['timing']}")
    rows = [r for r in report["rows"] if "skipped" not in r]
    body = [[r["shape"], r["backend"] + (" *" if r["dispatch_pick"] else ""), _fmt(r["graph_us"], ".1f"),
             _fmt(r["eager_us"], ".1f"), _fmt(r["gbps"], "rate"), _fmt(r["pct_copy"], ".0f"), _fmt(r["tflops"], "rate"),
             _fmt(r["pct_matmul"], ".0f"), _fmt(r["x_fastest"], ".2f"), r["note"]] for r in rows]
    print(table(body, ["shape", "backend", "graph us", "eager us", "GB/s", "%copy", "TFLOP/s", "%matmul",
                       "x fastest", "note"]))
    print("* = the backend dispatch picks for this shape; GB/s and TFLOP/s from the graph time where there is one")
    for r in report["rows"]:
        if "skipped" in r:
            print(f"skipped {r['backend']} for {r['shape']}: {r['skipped']}")


def cmd_bench(args) -> int:
    from . import UsageError, resolve_device
    device = resolve_device(args.device)
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'mla-core[plot]' (or pip install matplotlib)") \
                from None
    report = run_bench(args.op, args, device, quiet=args.quiet)
    if args.plot:
        bench.plot_roofline(report["rows"], report["ceilings"], args.plot,
                            title=f"mla-core bench {args.op} on "
                                  f"{report['device_info']['gpu'] or 'cpu (no ceilings measured)'}")
        report["plot"] = args.plot
    if args.output:
        bench.write_json(args.output, report)
    if args.json:
        print(json.dumps(report, indent=1, default=str))
    else:
        print_report(report)
        if args.plot:
            print(f"roofline plot: {args.plot}")
        if args.output:
            print(f"JSON: {args.output}")
    failed = [r for r in report["rows"] if r.get("note", "").startswith("failed")]
    return 1 if failed else 0


def add_parser(subparsers) -> None:
    """Add ``bench`` (one sub-command per op) to the ``mla-core`` subparsers."""
    p = subparsers.add_parser(
        "bench", help="time every valid backend on your shapes: µs, GB/s, TFLOP/s, %% of the measured roofline",
        description="Times every backend that can run each shape (CUDA-graph replays with the L2 flushed, and "
                    "eager calls), measures the copy bandwidth and bf16 matmul rate in the same run and prints "
                    "median µs, GB/s, TFLOP/s, their %% of those ceilings and each backend's time over the "
                    "fastest. On a CPU: perf_counter timings, no ceilings. Example: mla-core bench decode "
                    "--heads 128 --batch 32 --length 8192 --recipe bf16,nvfp4 --plot roofline.png")
    ops = p.add_subparsers(dest="op", metavar="OP", required=True)
    for op, (text, _) in SHAPE_OPTIONS.items():
        q = ops.add_parser(op, help=text, description=f"Benchmark {text}. Every shape option takes a "
                                                      "comma-separated list; every combination is timed.")
        add_shape_options(q, op)
        q.add_argument("--device", choices=("cpu", "cuda"), help="where to run (default: cuda when available)")
        q.add_argument("--backend", action="append", help="time only this backend (repeatable)")
        q.add_argument("--iters", type=int, default=30, help="timed graph replays per backend (default 30)")
        q.add_argument("--json", action="store_true", help="print the report as JSON")
        q.add_argument("--output", metavar="FILE.json", help="also write the JSON report to this file")
        q.add_argument("--plot", metavar="FILE.png", nargs="?", const=f"mla-core-bench-{op}.png",
                       help=f"draw the results against the roofline (needs matplotlib; default file "
                            f"mla-core-bench-{op}.png)")
        q.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
        q.set_defaults(func=cmd_bench)
