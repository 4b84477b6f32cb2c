"""Argument types shared by the CLI commands: comma-separated lists of ints, of names, of split counts."""
from __future__ import annotations

import argparse
from typing import Callable, Iterable

from ..numerics import MAX_KV_SPLITS


def int_list(text: str) -> tuple[int, ...]:
    """``"1,32,128"`` -> ``(1, 32, 128)``; at least one integer."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")
    return values


def name_list(allowed: Iterable[str]) -> Callable[[str], tuple[str, ...]]:
    """A parser of ``"a,b"`` into names, each one of ``allowed``."""
    allowed = tuple(allowed)

    def parse(text: str) -> tuple[str, ...]:
        names = tuple(v.strip() for v in text.split(",") if v.strip())
        if not names or any(n not in allowed for n in names):
            raise argparse.ArgumentTypeError(f"got {text!r}; choose from {', '.join(allowed)} (comma-separated)")
        return names
    return parse


def split_list(text: str) -> tuple:
    """``"1,32,auto"`` -> ``(1, 32, "auto")``: decode split counts, 1..128 (MAX_KV_SPLITS) or auto."""
    out = []
    for v in text.split(","):
        v = v.strip()
        if v == "auto":
            out.append("auto")
        elif v.isdigit() and 1 <= int(v) <= MAX_KV_SPLITS:
            out.append(int(v))
        else:
            raise argparse.ArgumentTypeError(f"num_kv_splits: got {v!r}, needs 1..{MAX_KV_SPLITS} or auto")
    return tuple(out)
