"""The ``mla-core`` command line: demo, backends, check, explain, bench, build, new-backend (and the autotuner's
warmup and cache commands).

Every command returns its exit code: 0 success, 1 a check or an op failed, 2 a usage error. A usage error
(unknown backend, ``--device cuda`` without CUDA, a bad argument, a file that cannot be written) is one line
on stderr saying what to do, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from .. import __version__
from ..errors import MLAInputError, NoBackendError
from .table import table

DEVICES = ("cpu", "cuda")


class UsageError(ValueError):
    """A command cannot run as asked; the message says what to do instead."""


class Parser(argparse.ArgumentParser):
    """argparse with one-line errors: ``mla-core check: argument --device: ...; see mla-core check --help``."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}; see `{self.prog} --help`\n")


def cuda_available() -> bool:
    return torch.cuda.is_available()


def resolve_device(device: str | None) -> str:
    """The device a command runs on: the one asked for (cuda only when visible), else cuda when available, else cpu."""
    if device is None:
        return "cuda" if cuda_available() else "cpu"
    if device == "cuda" and not cuda_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise UsageError(f"--device cuda: no CUDA device is visible here (torch {torch.__version__}, {built}); run it "
                         "on a GPU machine, or pass --device cpu")
    return device


def runnable_device_types() -> set[str]:
    """Device types this machine can run kernels on: cpu, cuda when a GPU is visible (and others torch reports)."""
    out = {"cpu"}
    for name in ("cuda", "xpu", "mps", "musa"):
        module = getattr(torch, name, None)
        try:
            if module is not None and module.is_available():
                out.add(name)
        except Exception:  # a half-installed device runtime: not runnable
            pass
    return out


def backend_status(backend) -> tuple[bool, str]:
    """``(can run here, status text)``: "available"; "installed; no CUDA device" for a backend that loads but
    whose devices are absent here; "unavailable: <reason>" for one that cannot run at all."""
    here = runnable_device_types() & set(backend.device_types)
    reason = backend.unavailable_reason()
    if not here and (reason is None or "device" in reason.lower()):
        missing = " or ".join(sorted(t.upper() for t in backend.device_types)) or "supported"
        return False, f"installed; no {missing} device"
    if reason:
        return False, f"unavailable: {reason}"
    return True, "available"


def cmd_backends(args) -> int:
    from ..plugins import registry
    reg = registry()
    ordered = sorted(reg.backends.values(), key=lambda b: (-b.priority, b.name))
    infos = []
    for b in ordered:
        runs, status = backend_status(b)
        infos.append({**b.info(), "runs_here": runs, "status": status})
    broken = [{"plugin": b.name, "reason": b.reason} for b in reg.broken]
    if args.json:
        print(json.dumps({"backends": infos, "broken_plugins": broken}, indent=2, default=str))
        return 0
    out = []
    for info in infos:
        ops = []
        for op, cap in info["ops"].items():
            fmts = {k: v for k, v in cap["limits"].items() if k.endswith(("_qdq", "_quant"))}
            ops.append(op + (" (" + "; ".join(f"{k}: {v}" for k, v in fmts.items()) + ")" if fmts else ""))
        first, *more = ops or ["none yet"]
        out.append([info["name"], info["version"], str(info["priority"]), ",".join(info["devices"]), info["status"],
                    first])
        out.extend([["", "", "", "", "", m] for m in more])  # ops one per line keep the table narrow
    print(table(out, ["backend", "version", "priority", "devices", "status", "ops (quant formats)"]))
    for b in broken:
        print(f"broken plugin {b['plugin']}: {b['reason']}")
    return 0


def cmd_demo(args) -> int:
    from .demo import run_demo
    return run_demo(resolve_device(args.device), as_json=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
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
    p.add_argument("--device", choices=DEVICES, help="where to run (default: cuda when available, else cpu)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_demo)
    p = sub.add_parser("backends", help="list backends: version, availability (or why not), ops and formats",
                       description="Lists every loaded backend plugin with its version, priority, devices, whether it "
                                   "can run here ('available'; 'installed; no CUDA device' when it loads but its "
                                   "devices are absent; 'unavailable: why' otherwise) and the ops and quant formats it "
                                   "declares; plugins that failed to load are listed with the reason.")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_backends)
    from . import autotune, bench, build, check, explain, new_backend
    check.add_parser(sub)
    explain.add_parser(sub)
    bench.add_parser(sub)
    build.add_parser(sub)
    new_backend.add_parser(sub)
    autotune.add_parsers(sub)
    return parser


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, NoBackendError):
        why = "; ".join(f"{name}: {', '.join(r)}" for name, r in exc.reasons.items())
        return (f"no backend can run this {exc.problem.op} problem ({why}); change the shape or options, or install "
                "a backend that supports it (`mla-core backends`)")
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    prog = f"mla-core {args.command}"
    try:
        return args.func(args)
    except (UsageError, MLAInputError, NoBackendError, ValueError, OSError) as exc:
        print(f"{prog}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except torch.cuda.OutOfMemoryError:
        print(f"{prog}: out of GPU memory; choose smaller shapes (batch, length, heads) or free the GPU",
              file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
