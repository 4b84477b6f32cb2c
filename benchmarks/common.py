"""Shared benchmark helpers: the timing and ceilings live in :mod:`mla_core.bench` (``mla-core bench`` uses the same);
this module adds what only the scripts need (tables, JSON under $OUT).

Every time is a median in microseconds over ``iters`` calls. Before each timed call a 256 MiB buffer is
overwritten so the call starts with a cold L2 (the H200 has 60 MB); the flush is outside the events.
"""
from __future__ import annotations

import json
import os

import torch

from mla_core.bench import device_info, flush_l2, measure_ceilings, time_eager, time_graph  # noqa: F401 (re-exported)


_EAGER: set = set()
"""Names of the calls a CUDA graph could not hold (timed eagerly from then on)."""


def timed(fn, name: str = "", iters: int = 10) -> tuple[float, str]:
    """(median µs, mode): CUDA-graph replays, or eager calls where capture fails (reported once per ``name``)."""
    if name not in _EAGER:
        try:
            return time_graph(fn, iters=iters), "graph"
        except Exception as e:  # noqa: BLE001 (reported; timed eagerly instead)
            torch.cuda.synchronize()
            _EAGER.add(name)
            print(f"  {name}: no CUDA graph ({type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}); "
                  "timing eagerly", flush=True)
    return time_eager(fn, iters=iters), "eager"


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print ``rows`` as an aligned table; columns are (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else format(r[k], f)) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)), flush=True)


def write_json(name: str, payload: dict) -> str | None:
    """Write ``payload`` to ``$OUT/<name>`` when $OUT is set; returns the path."""
    out_dir = os.environ.get("OUT")
    if not out_dir:
        return None
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path


def load_cuda_extension(src: str, cache: str | None = None):
    """The cuda backend's extension built from csrc folder ``src`` (an A/B's A or B) into build cache ``cache``
    (None: $MLA_CORE_CACHE_DIR). The build module hashes the sources once per process: reset before and after."""
    from mla_core_cuda import build
    os.environ["MLA_CORE_CUDA_SRC"] = os.path.abspath(src)
    if cache:
        os.environ["MLA_CORE_CACHE_DIR"] = os.path.abspath(cache)
    build._DEFAULT_KEY = None
    module = build.build()
    build._DEFAULT_KEY = None
    return module


def same_bits(a, b) -> bool:
    """Whether tensors ``a`` and ``b`` (float32 or a 16-bit float) hold the same bits (an A/B's equality check:
    NaNs of one payload compare equal, -0.0 and 0.0 do not)."""
    def bits(t):
        return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)
    return a.dtype == b.dtype and torch.equal(bits(a), bits(b))
