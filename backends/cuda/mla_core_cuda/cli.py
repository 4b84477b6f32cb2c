"""``mla-core build``: build the CUDA kernels ahead of time (instead of on first use).

The CLI wires it with ``add_parser(subparsers)``; the handler returns the process exit code.
"""
from __future__ import annotations

import argparse
import sys


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register the ``build`` subcommand on an argparse ``subparsers`` object; returns its parser."""
    parser = subparsers.add_parser(
        "build", help="build the CUDA C++ kernels (csrc/) now, into the user cache",
        description="Compile csrc/ with ninja into $MLA_CORE_CACHE_DIR/build/<key> (~/.cache/mla_core by default); "
                    "a later process loads the cached build.")
    parser.add_argument("--verbose", action="store_true", help="show the compiler commands and output")
    parser.add_argument("--force", action="store_true", help="rebuild even when a build of this version exists")
    parser.set_defaults(func=handle)
    return parser


def handle(args: argparse.Namespace) -> int:
    """Build; print where the module is, or the compiler's first error. 0 on success, 1 on failure."""
    from . import build
    try:
        module = build.build(verbose=args.verbose, force=args.force)
    except (build.BuildError, OSError) as exc:
        print(f"mla-core build: failed: {exc}", file=sys.stderr)
        return 1
    print(f"mla-core build: ok, {module.__file__}")
    return 0
