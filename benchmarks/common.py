"""Shared benchmark helpers: ceilings measured in the same run, CUDA-graph timing with the L2 flushed.

Every time is a median in microseconds over ``iters`` calls. Before each timed call a 256 MiB buffer is
overwritten so the call starts with a cold L2 (the H200 has 60 MB); the flush is outside the events.
"""
from __future__ import annotations

import json
import os
import statistics
from typing import Callable

import torch

_FLUSH_BYTES = 256 << 20
_flush_buf: torch.Tensor | None = None


def flush_l2() -> None:
    """Overwrite a buffer larger than the L2 so the next kernel reads from HBM."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()


def _median_us(run: Callable[[], None], iters: int, flush: bool) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if flush:
            flush_l2()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def time_eager(fn: Callable[[], object], iters: int = 20, warmup: int = 3, flush: bool = True) -> float:
    """Median µs of Python calls of ``fn`` (Python overhead included), L2 flushed before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _median_us(fn, iters, flush)


def time_graph(fn: Callable[[], object], iters: int = 30, warmup: int = 2, flush: bool = True) -> float:
    """Median µs of CUDA-graph replays of ``fn`` (captured once after warm-up), L2 flushed before each."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return _median_us(graph.replay, iters, flush)


def _matmul_tflops(mm: int) -> float:
    a = torch.randn(mm, mm, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(mm, mm, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(mm, mm, dtype=torch.bfloat16, device="cuda")
    us = time_graph(lambda: torch.matmul(a, b, out=c), iters=40, warmup=200, flush=False)
    return 2 * mm ** 3 / us / 1e6


def _copy_gbps(nbytes: int) -> dict[str, float]:
    src = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
    dst = torch.empty_like(src)
    us = {"memcpy_eager": time_eager(lambda: dst.copy_(src), iters=30, warmup=10, flush=False),
          "kernel_graph": time_graph(lambda: torch.neg(src, out=dst), iters=30, warmup=10, flush=False)}
    return {k: 2 * nbytes / v / 1e3 for k, v in us.items()}


def measure_ceilings(copy_bytes: int = 4 << 30, mm: int = 8192) -> dict[str, float]:
    """Device copy bandwidth (GB/s, read + write) and sustained bf16 matmul TFLOP/s, measured now.

    The matmuls run first and long enough (~0.5 s) to bring the clocks up. The copy is the faster of a
    memcpy timed eagerly and an elementwise copy kernel in a graph: a memcpy captured into a CUDA graph
    ran at only ~2.7 TB/s on the H200 (a copy-engine node, we think) where SM copies reach ~4.3.
    """
    tflops = _matmul_tflops(mm)
    copies = _copy_gbps(copy_bytes)
    torch.cuda.empty_cache()
    return {"copy_gbps": max(copies.values()), "bf16_tflops": tflops,
            **{f"copy_gbps_{k}": v for k, v in copies.items()}}


def print_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> None:
    """Print ``rows`` as an aligned table; columns are (key, header, format)."""
    cells = [[h for _, h, _ in columns]]
    for r in rows:
        cells.append([("-" if r.get(k) is None else format(r[k], f)) for k, _, f in columns])
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    for line in cells:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)), flush=True)


def device_info() -> dict[str, object]:
    import triton
    props = torch.cuda.get_device_properties(0)
    return {"gpu": props.name, "sms": props.multi_processor_count, "torch": torch.__version__,
            "triton": triton.__version__, "cuda": torch.version.cuda}


def write_json(name: str, payload: dict) -> str | None:
    """Write ``payload`` to ``$OUT/<name>`` when $OUT is set; returns the path."""
    out_dir = os.environ.get("OUT")
    if not out_dir:
        return None
    path = os.path.join(out_dir, name)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
    return path
