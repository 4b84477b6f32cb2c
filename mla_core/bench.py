"""Benchmark helpers shared by ``mla-core bench`` and the scripts in ``benchmarks/``.

* Timing: :func:`time_graph` (CUDA-graph replays) and :func:`time_eager` (Python calls), medians in
  microseconds with a 256 MiB buffer overwritten before each timed call so it starts with a cold L2 (the
  H200 has 60 MB; the flush is outside the timed events); :func:`time_cpu` (``perf_counter``) on a CPU.
* Ceilings measured in the same run (:func:`measure_ceilings`): device copy bandwidth and sustained bf16
  matmul rate, the roofline every result is quoted against.
* Workloads (:func:`workload`): public-op arguments for a shape given by its sizes (random values on the
  device, or ``materialize=False``: tiny stand-ins of the same shape that only validation sees, for
  ``mla-core explain``), with the FLOPs and bytes of the roofline: decode FLOPs ``2·B·H·L·(576+512)`` and
  KV bytes read once ``B·L·576·itemsize``; prefill ``2·H·pairs·(qk_dim+v_dim)`` with the causal pair count,
  q/k/v/out bytes; sparse decode ``2·B·q_len·H·top_k·(576+512)`` and the gathered FP8 rows; merge and rope
  their bytes in and out.
* :func:`plot_roofline`: the results against the measured roofline (matplotlib, the ``plot`` extra).
"""
from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import numerics, specs

_FLUSH_BYTES = 256 << 20
_flush_buf: torch.Tensor | None = None

RECIPES = numerics.QUANT_RECIPES
"""Quant recipe -> format; numerics.recipe_quant says which tensors each op quantizes (prefill: Q too)."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


# --------------------------------------------------------------------------------------------------
# timing


def flush_l2() -> None:
    """Overwrite a buffer larger than the L2 so the next kernel reads from HBM (the L2 is left holding dirty lines,
    written back as the next kernel's reads evict them, as after any kernel that wrote)."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.empty(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    _flush_buf.zero_()


def flush_l2_clean() -> None:
    """Read (not write) a buffer larger than the L2: the next kernel reads from HBM and evicts only clean lines."""
    global _flush_buf
    if _flush_buf is None:
        _flush_buf = torch.zeros(_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    _flush_buf.amax()


def _median_us(run: Callable[[], object], iters: int, flush: bool | Callable[[], None]) -> float:
    """``flush``: True for :func:`flush_l2`, False for none, or the function to call before each timed run."""
    flush_fn = flush_l2 if flush is True else (flush or None)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        if flush_fn is not None:
            flush_fn()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends))


def time_eager(fn: Callable[[], object], iters: int = 20, warmup: int = 3,
               flush: bool | Callable[[], None] = True) -> float:
    """Median µs of Python calls of ``fn`` on the GPU (Python overhead included), L2 flushed before each."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return _median_us(fn, iters, flush)


def time_graph(fn: Callable[[], object], iters: int = 30, warmup: int = 2,
               flush: bool | Callable[[], None] = True) -> float:
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


def time_cpu(fn: Callable[[], object], iters: int = 5, warmup: int = 1, budget_s: float = 10.0) -> float:
    """Median µs of ``fn`` by ``time.perf_counter`` (a CPU: no caches flushed); stops early past ``budget_s``."""
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
        if time.perf_counter() - started > budget_s:
            break
    return statistics.median(samples)


# --------------------------------------------------------------------------------------------------
# ceilings


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

    The matmuls run first and long enough (~0.5 s on an H200) to bring the clocks up. The copy is the
    faster of a memcpy timed eagerly and an elementwise copy kernel in a graph: a memcpy captured into a
    CUDA graph ran at only ~2.7 TB/s on the H200 (a copy-engine node) where SM copies reach ~4.3. The copy
    buffers are capped at a quarter of the free device memory.
    """
    free, _ = torch.cuda.mem_get_info()
    copy_bytes = max(64 << 20, min(copy_bytes, free // 4))
    tflops = _matmul_tflops(mm)
    copies = _copy_gbps(copy_bytes)
    torch.cuda.empty_cache()
    return {"copy_gbps": max(copies.values()), "bf16_tflops": tflops,
            **{f"copy_gbps_{k}": v for k, v in copies.items()}}


def device_info() -> dict[str, Any]:
    """GPU name and SM count, torch / triton / CUDA versions (``gpu: None`` without CUDA)."""
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info = {"gpu": None, "sms": None, "torch": torch.__version__, "triton": triton_version, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sms=props.multi_processor_count)
    return info


# --------------------------------------------------------------------------------------------------
# workloads


@dataclass
class Workload:
    """One benchmark shape: the public op's keyword arguments and its roofline counts.

    ``op``: the Problem op name; ``label``: a short shape description; ``kwargs``: arguments of the public op
    (``backend=`` not included); ``flops``: floating-point operations of one call; ``nbytes``: bytes one call
    must move at least (the roofline's denominator, as the module docstring defines per op).
    """

    op: str
    label: str
    kwargs: dict[str, Any]
    flops: float
    nbytes: float
    shape: dict[str, Any] = field(default_factory=dict)

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.nbytes if self.nbytes else 0.0


class _Tensors:
    """Random tensors on a device, or (``materialize=False``) zero-stride CPU stand-ins that pass validation."""

    def __init__(self, device: str, materialize: bool, seed: int):
        self.device = torch.device(device if materialize else "cpu")
        self.materialize = materialize
        self.gen = torch.Generator(device=self.device)
        self.gen.manual_seed(seed)

    def normal(self, shape, dtype, scale: float = 1.0) -> torch.Tensor:
        if not self.materialize:  # only the last dimension is real: no memory for a DeepSeek-sized cache
            return torch.zeros(*([1] * (len(shape) - 1)), shape[-1], dtype=dtype, device="cpu").expand(*shape)
        x = torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32)
        return (x * scale).to(dtype)

    def dense(self, shape, dtype) -> torch.Tensor:
        """A contiguous tensor (ops that require one); zeros when not materialized."""
        if not self.materialize:
            return torch.zeros(shape, dtype=dtype, device="cpu")
        return torch.randn(shape, generator=self.gen, device=self.device, dtype=torch.float32).to(dtype)

    def ints(self, lo: int, hi: int, shape) -> torch.Tensor:
        if not self.materialize:
            return torch.full(shape, lo, dtype=torch.int64, device="cpu")
        return torch.randint(lo, hi + 1, shape, generator=self.gen, device=self.device)

    def tensor(self, values, dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype, device=self.device)


def _recipe(recipe: str, op: str) -> dict[str, str | None]:
    """``op``'s fake-quantization keywords under ``recipe`` (an unknown recipe: MLAInputError)."""
    if recipe not in RECIPES:
        raise specs.MLAInputError(f"recipe: got {recipe!r}, needs one of {', '.join(RECIPES)}")
    return numerics.recipe_quant(recipe, op)


def _dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise specs.MLAInputError(f"dtype: got {name!r}, needs one of {', '.join(DTYPES)}")
    return DTYPES[name]


def decode_workload(t: _Tensors, batch: int, heads: int, length: int, page_size: int = 64, recipe: str = "bf16",
                    num_kv_splits: int | str = 32, dtype: str = "bf16", kv_lora_rank: int = 512,
                    rope_dim: int = 64) -> Workload:
    """Absorbed decode: ``batch`` requests of ``length`` cached tokens each, pages shuffled across the cache."""
    quant, dt = _recipe(recipe, "decode"), _dtype(dtype)
    dim = kv_lora_rank + rope_dim
    pages = max(1, math.ceil(length / page_size))
    if t.materialize:
        cache = t.normal((batch * pages, page_size, dim), dt)
        table = torch.randperm(batch * pages, generator=t.gen, device=t.device).to(torch.int32).view(batch, pages)
    else:  # one page, every entry pointing at it: the problem (and so the dispatch) is the same
        cache = t.normal((1, page_size, dim), dt)
        table = torch.zeros((batch, pages), dtype=torch.int32, device="cpu")
    kwargs = dict(q=t.normal((batch, heads, dim), dt), latent_cache=cache, block_table=table,
                  b_seq_len=t.tensor([length] * batch, torch.int32), softmax_scale=(128 + rope_dim) ** -0.5,
                  kv_lora_rank=kv_lora_rank, qk_rope_head_dim=rope_dim, num_kv_splits=num_kv_splits,
                  **quant)
    itemsize = dt.itemsize
    return Workload("decode", f"decode B={batch} H={heads} L={length} {recipe}", kwargs,
                    flops=2.0 * batch * heads * length * (dim + kv_lora_rank),
                    nbytes=float(batch * length * dim * itemsize),
                    shape=dict(batch=batch, heads=heads, length=length, page_size=page_size, recipe=recipe,
                               num_kv_splits=num_kv_splits, dtype=dtype))


def causal_pairs(q_len: int, k_len: int, causal: bool) -> int:
    """Query-key pairs one sequence attends: all of them, or causally (query i sees keys ``j <= i + k_len - q_len``)."""
    if not causal:
        return q_len * k_len
    return sum(min(k_len, max(0, i + k_len - q_len + 1)) for i in range(q_len))


def prefill_workload(t: _Tensors, batch: int, heads: int, length: int, kv_length: int | None = None,
                     kv_heads: int | None = None, qk_dim: int = 192, v_dim: int = 128, causal: bool = True,
                     recipe: str = "bf16", dtype: str = "bf16") -> Workload:
    """Varlen prefill: ``batch`` sequences of ``length`` queries over ``kv_length`` keys (default: ``length``)."""
    quant, dt = _recipe(recipe, "prefill"), _dtype(dtype)
    kv_length = length if kv_length is None else kv_length
    kv_heads = heads if kv_heads is None else kv_heads
    cu_q = t.tensor([i * length for i in range(batch + 1)], torch.int32)
    cu_k = t.tensor([i * kv_length for i in range(batch + 1)], torch.int32)
    kwargs = dict(q=t.normal((batch * length, heads, qk_dim), dt), k=t.normal((batch * kv_length, kv_heads, qk_dim), dt),
                  v=t.normal((batch * kv_length, kv_heads, v_dim), dt), cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                  max_seqlen_q=length, causal=causal, **quant)
    itemsize = dt.itemsize
    pairs = batch * causal_pairs(length, kv_length, causal)
    elems = batch * (length * heads * (qk_dim + v_dim) + kv_length * kv_heads * (qk_dim + v_dim))
    return Workload("prefill", f"prefill B={batch} H={heads} L={length}" + (f"/{kv_length}" if kv_length != length
                                                                             else "") + f" {recipe}"
                    + ("" if causal else " non-causal"), kwargs,
                    flops=2.0 * heads * pairs * (qk_dim + v_dim), nbytes=float(elems * itemsize),
                    shape=dict(batch=batch, heads=heads, length=length, kv_length=kv_length, kv_heads=kv_heads,
                               qk_dim=qk_dim, v_dim=v_dim, causal=causal, recipe=recipe, dtype=dtype))


def merge_workload(t: _Tensors, tokens: int, heads: int, head_dim: int = 128, dtype: str = "bf16") -> Workload:
    """Merge of two partial results [tokens, heads, head_dim] by their LSEs."""
    dt = _dtype(dtype)
    kwargs = dict(prefix_output=t.normal((tokens, heads, head_dim), dt), prefix_lse=t.normal((heads, tokens),
                                                                                             torch.float32, 3.0),
                  suffix_output=t.normal((tokens, heads, head_dim), dt), suffix_lse=t.normal((heads, tokens),
                                                                                             torch.float32, 3.0))
    itemsize = dt.itemsize
    nbytes = 3 * tokens * heads * head_dim * itemsize + 3 * heads * tokens * 4
    return Workload("merge", f"merge T={tokens} H={heads} D={head_dim}", kwargs,
                    flops=4.0 * tokens * heads * head_dim, nbytes=float(nbytes),
                    shape=dict(tokens=tokens, heads=heads, head_dim=head_dim, dtype=dtype))


def rope_workload(t: _Tensors, tokens: int, heads: int, rope_dim: int = 64, nope_dim: int = 512,
                  dtype: str = "bf16") -> Workload:
    """RoPE + FP8 quantization of Q [tokens, heads, rope+nope] and K [tokens, rope+nope]."""
    dt = _dtype(dtype)
    max_pos = max(16, 2 * tokens)
    half = rope_dim // 2
    inv_freq = 1.0 / (10000 ** (torch.arange(half, dtype=torch.float64, device=t.device) / half))
    angle = torch.arange(max_pos, dtype=torch.float64, device=t.device)[:, None] * inv_freq[None, :]
    cos_sin = torch.cat([angle.cos(), angle.sin()], dim=1).float().to(t.device)
    kwargs = dict(q_rope=t.normal((tokens, heads, rope_dim), dt), k_rope=t.normal((tokens, rope_dim), dt),
                  q_nope=t.normal((tokens, heads, nope_dim), dt), k_nope=t.normal((tokens, nope_dim), dt),
                  cos_sin_cache=cos_sin, pos_ids=t.ints(0, max_pos - 1, (tokens,)))
    itemsize = dt.itemsize
    elems = tokens * (heads + 1) * (rope_dim + nope_dim)
    return Workload("rope_quantize_fp8", f"rope T={tokens} H={heads}", kwargs,
                    flops=float(6 * tokens * (heads + 1) * rope_dim + 2 * elems), nbytes=float(elems * (itemsize + 1)),
                    shape=dict(tokens=tokens, heads=heads, rope_dim=rope_dim, nope_dim=nope_dim, dtype=dtype))


def sparse_workload(t: _Tensors, batch: int, heads: int, q_len: int = 1, top_k: int = 2048,
                    page_size: int = 64) -> Workload:
    """FP8 top-k sparse decode: every query row attends ``top_k`` cache rows drawn from a cache of ``batch·top_k``."""
    full = specs.SPARSE_LATENT + specs.SPARSE_ROPE
    pages = max(1, math.ceil(batch * top_k / page_size)) if t.materialize else 1
    rows = pages * page_size
    query = t.dense((batch, q_len, heads, full), torch.float32).to(specs.FP8)
    cache = t.dense((pages, page_size, full), torch.float32).to(specs.FP8)
    index = t.ints(0, rows - 1, (batch, q_len, top_k)).to(torch.int32).contiguous()
    kwargs = dict(query=query, kv_cache=cache, workspace_buffer=None, qk_nope_head_dim=128, kv_lora_rank=512,
                  qk_rope_head_dim=64, block_tables=index, seq_lens=t.tensor([top_k] * batch, torch.int32),
                  max_seq_len=rows, sparse_mla_top_k=top_k, bmm1_scale=full ** -0.5, bmm2_scale=1.0,
                  return_lse=True)
    return Workload("sparse_decode", f"sparse B={batch} H={heads} q_len={q_len} top_k={top_k}", kwargs,
                    flops=2.0 * batch * q_len * heads * top_k * (full + specs.SPARSE_LATENT),
                    nbytes=float(batch * q_len * (top_k * full + heads * full)),
                    shape=dict(batch=batch, heads=heads, q_len=q_len, top_k=top_k))


WORKLOADS: dict[str, Callable[..., Workload]] = {
    "decode": decode_workload, "prefill": prefill_workload, "merge": merge_workload, "rope": rope_workload,
    "sparse": sparse_workload}
"""CLI op name -> workload builder (the builder's keyword arguments are the shape options)."""


def workload(op: str, *, device: str = "cpu", materialize: bool = True, seed: int = 0, **shape: Any) -> Workload:
    """The :class:`Workload` of CLI op ``op`` (decode, prefill, merge, rope, sparse) with sizes ``shape``.

    ``materialize=False`` builds zero-stride stand-ins on the CPU that validate to the same problem (for
    explaining a dispatch without the memory, or the device, of the real call).
    """
    if op not in WORKLOADS:
        raise specs.MLAInputError(f"op: got {op!r}, needs one of {', '.join(WORKLOADS)}")
    return WORKLOADS[op](_Tensors(device, materialize, seed), **shape)


# --------------------------------------------------------------------------------------------------
# results


def roofline_row(w: Workload, us: float | None, ceilings: dict[str, float] | None) -> dict[str, Any]:
    """GB/s, TFLOP/s and (with ceilings) their % of the measured copy bandwidth and matmul rate."""
    if us is None or us <= 0:
        return {"gbps": None, "tflops": None, "pct_copy": None, "pct_matmul": None}
    gbps, tflops = w.nbytes / us / 1e3, w.flops / us / 1e6
    return {"gbps": gbps, "tflops": tflops,
            "pct_copy": 100 * gbps / ceilings["copy_gbps"] if ceilings else None,
            "pct_matmul": 100 * tflops / ceilings["bf16_tflops"] if ceilings else None}


def plot_roofline(rows: list[dict[str, Any]], ceilings: dict[str, float] | None, path: str, title: str = "") -> str:
    """Draw each result (intensity FLOP/byte, achieved TFLOP/s) against the roofline of the measured ceilings.

    ``rows``: dicts with ``shape``, ``backend``, ``intensity``, ``tflops``. Without ceilings (a CPU) only the
    points are drawn. Raises ImportError when matplotlib is not installed (``pip install 'mla-core[plot]'``).
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    points = [r for r in rows if r.get("tflops")]
    xs = [r["intensity"] for r in points] or [1.0]
    lo, hi = min(xs) / 4, max(xs) * 4
    if ceilings:
        bw, peak = ceilings["copy_gbps"] / 1e3, ceilings["bf16_tflops"]  # TB/s x FLOP/B = TFLOP/s
        knee = peak / bw
        lo, hi = min(lo, knee / 8), max(hi, knee * 8)
        grid = [lo * (hi / lo) ** (i / 200) for i in range(201)]
        ax.plot(grid, [min(peak, bw * x) for x in grid], color="black", lw=1.5,
                label=f"roofline: copy {ceilings['copy_gbps']:.0f} GB/s, bf16 matmul {peak:.0f} TFLOP/s")
    markers = "osD^v<>p*h"
    by_backend = sorted({r["backend"] for r in points})
    for i, backend in enumerate(by_backend):
        mine = [r for r in points if r["backend"] == backend]
        ax.scatter([r["intensity"] for r in mine], [r["tflops"] for r in mine], marker=markers[i % len(markers)],
                   s=40, label=backend, zorder=3)
        for r in mine:
            ax.annotate(r["shape"], (r["intensity"], r["tflops"]), fontsize=6, xytext=(3, 3),
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title or "mla-core bench against the roofline measured in the same run")
    ax.grid(True, which="both", lw=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return path


def write_json(path: str, payload: dict[str, Any]) -> str:
    """Write ``payload`` as indented JSON to ``path``; returns it."""
    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=str)
    return path

