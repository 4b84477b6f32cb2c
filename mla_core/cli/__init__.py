"""The ``mla-core`` command line: demo, backends, check (and the autotuner's warmup and cache commands)."""
from __future__ import annotations

import argparse
import json

import torch

from .. import __version__
from .table import table


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def cmd_backends(args) -> int:
    from ..plugins import registry
    reg = registry()
    infos = [b.info() for b in sorted(reg.backends.values(), key=lambda b: (-b.priority, b.name))]
    broken = [{"plugin": b.name, "reason": b.reason} for b in reg.broken]
    if args.json:
        print(json.dumps({"backends": infos, "broken_plugins": broken}, indent=2, default=str))
        return 0
    rows = []
    for info in infos:
        status = "available" if info["available"] else f"unavailable: {info['reason']}"
        ops = []
        for op, cap in info["ops"].items():
            fmts = {k: v for k, v in cap["limits"].items() if k.endswith(("_qdq", "_quant"))}
            fmt = " (" + "; ".join(f"{k}: {v}" for k, v in fmts.items()) + ")" if fmts else ""
            ops.append(op + fmt)
        rows.append([info["name"], info["version"], str(info["priority"]), ",".join(info["devices"]), status,
                     "\n".join(ops) or "none yet"])
    out = []
    for r in rows:  # ops one per line under their backend keep the table narrow
        first, *more = r[5].split("\n")
        out.append(r[:5] + [first])
        out.extend([["", "", "", "", "", m] for m in more])
    print(table(out, ["backend", "version", "priority", "devices", "status", "ops (quant formats)"]))
    for b in broken:
        print(f"broken plugin {b['plugin']}: {b['reason']}")
    return 0


def cmd_check(args) -> int:
    from .check import check
    device = args.device or _default_device()
    rows = check(device, args.backend or None)
    if args.json:
        print(json.dumps({"device": device, "results": rows}, indent=2))
    else:
        table = [[r["backend"], r["case"], r["status"], "-" if r["error"] is None else f"{r['error']:.2e}", r["reason"] or ""]
                 for r in rows]
        print(f"mla-core check on {device}: every available backend against the reference backend")
        print(table(table, ["backend", "case", "status", "rel L2 error", "note"]) if table else "no backend besides the reference")
    return 1 if any(r["status"] == "FAIL" for r in rows) else 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(args.device or _default_device(), as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mla-core",
        description="mla_core: Multi-head Latent Attention kernels behind one API. "
                    "Backends are plugins; the fastest valid one per shape is chosen and remembered.")
    parser.add_argument("--version", action="version", version=f"mla-core {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("demo", help="run a DeepSeek-shaped decode and prefill on a paged cache; show who served each op",
                       description="Runs a DeepSeek-V3-shaped absorbed decode (kv_lora_rank 512, rope 64) over a paged "
                                   "latent cache, a varlen prefill (192/128) split into two chunks merged with "
                                   "merge_attn_states, and prints the backend that served each op and its error "
                                   "against the reference backend.")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("backends", help="list backends: version, availability (or why not), ops and formats",
                       description="Lists every loaded backend plugin with its version, priority, devices, whether it "
                                   "can run here (or why not) and the ops and quant formats it declares; plugins that "
                                   "failed to load are listed with the reason.")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_backends)
    p = sub.add_parser("check", help="run every available backend against the reference on small random problems",
                       description="Runs each available backend on small random problems of every op it supports and "
                                   "compares with the reference backend (relative L2; fp32 < 1e-5, else < 1e-2). "
                                   "Exit code 1 when any check fails.")
    p.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    p.add_argument("--backend", action="append", help="check only this backend (repeatable)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_check)
    from . import autotune
    autotune.add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    return args.func(args)

