"""``mla-core build``: build every loaded backend that compiles something ahead of use (e.g. CUDA C++ extensions).

A backend opts in by defining ``build(verbose: bool) -> str | None``: it builds (or finds already built) what it
needs and returns None, or one line saying what failed and what to do. The core names no backend.
"""
from __future__ import annotations

import json
import time

from .table import table


def run_builds(only: list[str] | None = None, verbose: bool = False) -> list[dict]:
    """Call ``build(verbose)`` on every loaded backend that has one (or the named ones); one row per backend.

    ``status``: built / FAILED / nothing to build (the backend has no ``build`` method). A backend whose build
    raises is reported as FAILED with the exception, never fatal.
    """
    from ..plugins import backends, get_backend
    chosen = [get_backend(n) for n in only] if only else sorted(backends().values(), key=lambda b: b.name)
    rows = []
    for backend in chosen:
        build = getattr(backend, "build", None)
        if not callable(build):
            rows.append({"backend": backend.name, "status": "nothing to build", "seconds": None, "message": ""})
            continue
        start = time.perf_counter()
        try:
            error = build(verbose)
        except Exception as exc:  # a failing build is reported like a returned error line
            error = f"build raised {type(exc).__name__}: {exc}".splitlines()[0]
        rows.append({"backend": backend.name, "status": "FAILED" if error else "built",
                     "seconds": round(time.perf_counter() - start, 2), "message": error or ""})
    return rows


def cmd_build(args) -> int:
    rows = run_builds(args.backend, verbose=args.verbose)
    if args.json:
        print(json.dumps({"builds": rows}, indent=2))
    else:
        print(table([[r["backend"], r["status"], "-" if r["seconds"] is None else f"{r['seconds']:.1f}",
                      r["message"]] for r in rows], ["backend", "build", "seconds", "message"]))
        if not any(r["status"] != "nothing to build" for r in rows):
            print("no loaded backend builds anything ahead of use")
    return 1 if any(r["status"] == "FAILED" for r in rows) else 0


def add_parser(subparsers) -> None:
    """Add ``build`` to the ``mla-core`` subparsers."""
    p = subparsers.add_parser(
        "build", help="build the backends that compile code (CUDA extensions) now instead of at first use",
        description="Calls build(verbose) on every loaded backend that defines it (a backend returns None when built, "
                    "else one line saying what failed) and prints a table. Exit code 1 when any build fails.")
    p.add_argument("--backend", action="append", help="build only this backend (repeatable)")
    p.add_argument("--verbose", action="store_true", help="let the builds print their compiler output")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_build)
