"""Python overhead of a cached dispatch: the public API against calling the chosen backend directly.

For tiny inputs (so the kernel itself costs next to nothing) it times, per call:

* ``dispatch.choose(problem)`` alone, once the key is in memory (the lookup every call pays);
* the op's validation alone (``specs.validate_*``: building the call object and the Problem key);
* the public op (``mla_core.merge_attn_states`` / ``mla_core.mla_decode``) end to end;
* the chosen backend's method on a pre-validated call (what the API adds its overhead to).

The overhead of a cached dispatch is API minus direct. On a GPU the loops only launch work (no sync
per call), so the numbers are host-side time per call, which is what the target (< 5 us beyond the
kernel launch) is about. Decode runs with ``MLA_CORE_CHECKS=metadata`` too, since its default content
checks copy ``b_seq_len`` to the host (a device sync on a GPU).

    python benchmarks/bench_dispatch.py [--device cpu|cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

import mla_core
from mla_core import dispatch, inputs, specs


def per_call_us(fn, device: torch.device, loop_s: float = 0.05, repeats: int = 7) -> float:
    """Median over ``repeats`` loops (each about ``loop_s`` long) of the host time per call, in microseconds."""
    start = time.perf_counter()
    for _ in range(20):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    calls = max(10, min(5000, int(loop_s / ((time.perf_counter() - start) / 20))))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return statistics.median(times)


def bench_merge(device: torch.device) -> list[dict]:
    kw = inputs.merge_inputs(4, heads=2, head_dim=16, dtype=torch.float32, device=device, seed=0)
    problem, call = specs.validate_merge(**kw, output=None, output_lse=None)
    choice = dispatch.choose(problem)
    rows = [
        ("merge: dispatch.choose (cached)", lambda: dispatch.choose(problem)),
        ("merge: validate_merge", lambda: specs.validate_merge(**kw, output=None, output_lse=None)),
        ("merge: mla_core.merge_attn_states", lambda: mla_core.merge_attn_states(**kw)),
        (f"merge: {choice.backend.name}.merge direct", lambda: choice.backend.merge(call, choice.config)),
    ]
    return [{"what": name, "backend": choice.backend.name, "us": per_call_us(fn, device)} for name, fn in rows]


def bench_decode(device: torch.device, checks: str) -> list[dict]:
    os.environ[specs.ENV_CHECKS] = checks
    kw = inputs.decode_inputs([64], heads=16, page_size=64, dtype=torch.bfloat16, device=device, seed=0)
    validate = lambda: specs.validate_decode(
        **kw, page_size=None, num_kv_splits=32, k_qdq=None, k_qdq_amax=None, v_qdq=None, v_qdq_amax=None, p_qdq=None,
        p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    problem, call = validate()
    choice = dispatch.choose(problem)
    rows = [
        (f"decode [{checks}]: dispatch.choose (cached)", lambda: dispatch.choose(problem)),
        (f"decode [{checks}]: validate_decode", validate),
        (f"decode [{checks}]: mla_core.mla_decode", lambda: mla_core.mla_decode(**kw)),
        (f"decode [{checks}]: {choice.backend.name}.decode direct", lambda: choice.backend.decode(call, choice.config)),
    ]
    return [{"what": name, "backend": choice.backend.name, "us": per_call_us(fn, device)} for name, fn in rows]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", help="also write the rows to this file")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = bench_merge(device)
    for checks in ("all", "metadata"):
        try:
            rows += bench_decode(device, checks)
        except Exception as exc:  # no backend for decode on this device yet: report, keep the merge numbers
            rows.append({"what": f"decode [{checks}]", "backend": None, "us": None,
                         "error": f"{type(exc).__name__}: {exc}".splitlines()[0]})
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(f"cached-dispatch overhead on {name} (torch {torch.__version__}); host microseconds per call, median")
    width = max(len(r["what"]) for r in rows)
    for r in rows:
        print(f"  {r['what']:<{width}}  " + (f"{r['us']:9.2f}" if r["us"] is not None else f"n/a ({r['error']})"))
    summary = {}
    for op, api, direct in (("merge", "mla_core.merge_attn_states", "merge direct"),
                            ("decode [all]", "mla_core.mla_decode", "decode direct"),
                            ("decode [metadata]", "mla_core.mla_decode", "decode direct")):
        pick = lambda tail: next((r["us"] for r in rows if r["what"].startswith(op) and r["what"].endswith(tail)
                                  and r["us"] is not None), None)
        if pick(api) is not None and pick(direct) is not None:
            summary[op] = pick(api) - pick(direct)
            print(f"  => {op}: API overhead over the direct backend call {summary[op]:.2f} us per call")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "torch": torch.__version__, "rows": rows, "overhead_us": summary}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
