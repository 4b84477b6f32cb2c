"""Cache warm-up: the problems a model will run, tuned ahead of time (``mla-core warmup``).

A preset lists a model's problem keys (:func:`preset_problems`): decode over a grid of batch sizes and
KV lengths, prefill over a grid of lengths, and the merge of prefill chunks, for each quant recipe
(``bf16``: none; ``fp8`` / ``nvfp4``: K, V and P in decode, Q, K, V and P in prefill, :func:`mla_core.numerics.
recipe_quant`). :func:`run` tunes each key missing from the cache (:func:`mla_core.autotune.tune`; a key only one ``(backend, config)`` can run is
recorded without timing), records it and returns one row per problem for the summary table; each shape's
memory goes back to the device before the next one is tuned (:func:`mla_core.autotune.tuner.release_memory`).
Under torch.distributed (e.g. ``torchrun``) every rank tunes its share on its own GPU, the results are
exchanged, and every rank records and uses all of them.
"""
from __future__ import annotations

import concurrent.futures
import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from .. import numerics
from ..problem import Problem
from . import cache, precompile, tuner

RECIPES = numerics.QUANT_RECIPES
"""Quant recipe name -> format; numerics.recipe_quant says which tensors each op quantizes."""


@dataclass(frozen=True)
class ModelShape:
    """The attention shape of a model at tensor-parallel size 1 and the grids warm-up covers."""

    name: str
    heads: int
    kv_lora_rank: int
    rope_dim: int
    qk_nope_dim: int
    v_head_dim: int
    page_size: int
    dtype: str
    decode_batches: tuple[int, ...]
    decode_lengths: tuple[int, ...]
    prefill_lengths: tuple[int, ...]
    prefill_cached: tuple[int, ...]
    """Cached tokens before a prefill chunk (0: a fresh prompt; else chunked prefill over a cached prefix)."""


MODELS = {
    "deepseek-v3": ModelShape(
        name="deepseek-v3", heads=128, kv_lora_rank=512, rope_dim=64, qk_nope_dim=128, v_head_dim=128, page_size=64,
        dtype="bfloat16", decode_batches=(1, 8, 32, 128), decode_lengths=(1024, 4096, 16384),
        prefill_lengths=(1024, 4096, 16384), prefill_cached=(0, 12288)),
}
"""Presets by ``--model`` name (DeepSeek-V2/V3/R1 share the MLA shape; V3.2 adds sparse decode)."""

TP_SIZES = (1, 2, 4, 8)
OPS = ("decode", "prefill", "merge")


@dataclass
class Grid:
    """What to warm up: one model shape, tensor-parallel sizes, recipes, grids (None: the model's defaults)."""

    model: str = "deepseek-v3"
    tp: tuple[int, ...] = (8,)
    recipes: tuple[str, ...] = ("bf16", "fp8", "nvfp4")
    ops: tuple[str, ...] = OPS
    batches: tuple[int, ...] | None = None
    lengths: tuple[int, ...] | None = None
    prefill_lengths: tuple[int, ...] | None = None
    prefill_cached: tuple[int, ...] | None = None
    num_kv_splits: tuple[Any, ...] = (32,)
    heads: tuple[int, ...] | None = None
    page_size: int | None = None
    dtype: str | None = None
    device: str = "cuda"


def preset_problems(grid: Grid) -> list[Problem]:
    """Every problem key of ``grid``, in a stable order without duplicates.

    The keys are built exactly as the ops' validation builds them for the model's calls: decode with
    the API defaults (LSE returned, ``num_kv_splits`` from the grid: 32 unless asked), prefill causal
    with and without LSE, of one sequence of each length after each cached-prefix size (0: a fresh
    prompt; else a chunk over a cached prefix, bottom-right causal), merge of [tokens, heads, v_head_dim]
    chunks.
    """
    shape = MODELS[grid.model]
    dtype = grid.dtype or shape.dtype
    page = grid.page_size or shape.page_size
    heads_list = grid.heads or tuple(shape.heads // tp for tp in grid.tp)
    out: list[Problem] = []
    for heads in heads_list:
        for recipe in grid.recipes:
            if "decode" in grid.ops:
                for batch in _buckets(grid.batches or shape.decode_batches):
                    for length in _buckets(grid.lengths or shape.decode_lengths):
                        for splits in grid.num_kv_splits:
                            out.append(Problem.make(
                                "decode", grid.device, {"lse"}, dtype=dtype, q_dtype=dtype, out_dtype=dtype,
                                heads=heads, kv_lora_rank=shape.kv_lora_rank, rope_dim=shape.rope_dim,
                                page_size=page, num_kv_splits=splits, **numerics.recipe_quant(recipe, "decode"),
                                batch=batch, max_len=max(length, page)))
            if "prefill" in grid.ops:
                for length in _buckets(grid.prefill_lengths or shape.prefill_lengths):
                    for cached in _cached(grid.prefill_cached or shape.prefill_cached):
                        for features in ((), ("lse",)):
                            out.append(Problem.make(
                                "prefill", grid.device, features, dtype=dtype, heads=heads, kv_heads=heads,
                                qk_dim=shape.qk_nope_dim + shape.rope_dim, v_dim=shape.v_head_dim, causal=1,
                                **numerics.recipe_quant(recipe, "prefill"),
                                block_n=numerics.DEFAULT_PREFILL_BLOCK_N, sparsity_m=0, batch=1, dense_batch=1,
                                max_seqlen_q=length, total_k=numerics.bucket_pow2(length + cached)))
        if "merge" in grid.ops:
            for length in _buckets(grid.prefill_lengths or shape.prefill_lengths):
                out.append(Problem.make("merge", grid.device, dtype=dtype, out_dtype=dtype, heads=heads,
                                        head_dim=shape.v_head_dim, tokens=length))
    return list(dict.fromkeys(out))


def _buckets(values: Iterable[int]) -> list[int]:
    return sorted({numerics.bucket_pow2(int(v)) for v in values})


def _cached(values: Iterable[int]) -> list[int]:
    """Cached-prefix sizes, sorted and without duplicates (each must be >= 0)."""
    values = sorted({int(v) for v in values})
    if values and values[0] < 0:
        raise ValueError(f"prefill cached-prefix sizes must be >= 0, got {values[0]}")
    return values


def describe(problem: Problem) -> str:
    """A short shape label for tables: ``decode b=32 L=4096 h=16 kvp=fp8``."""
    p = problem
    if p.op == "decode":
        same = p["k_qdq"] == p["v_qdq"] == p["p_qdq"]
        quant = (p["k_qdq"] or "bf16") if same else f"kvp={p['k_qdq']}/{p['v_qdq']}/{p['p_qdq']}"
        splits = "" if p["num_kv_splits"] == 32 else f" splits={p['num_kv_splits']}"
        return f"decode b={p['batch']} L={p['max_len']} h={p['heads']} {quant}{splits}"
    if p.op == "prefill":
        same = p["q_quant"] == p["k_quant"] == p["v_quant"] == p["p_quant"]
        quant = (p["k_quant"] or "bf16") if same else "mixed quant"
        lse = " lse" if "lse" in p.features else ""
        keys = f" kv={p['total_k']}" if p["total_k"] > p["max_seqlen_q"] else ""
        return f"prefill b={p['batch']} L={p['max_seqlen_q']}{keys} h={p['heads']} {quant}{lse}"
    if p.op == "merge":
        return f"merge t={p['tokens']} h={p['heads']} d={p['head_dim']}"
    return p.key()


@dataclass
class Row:
    """One warm-up summary row: the problem and what was decided.

    ``status``: tuned (timed), recorded (the only valid candidate, stored without timing), cached (already
    in the cache) or failed.
    """

    problem: Problem
    status: str
    entry: dict[str, Any] | None = None
    note: str = ""
    wall_s: float | None = None
    """Tuning seconds (tuned rows), of which ``first_call_s`` in the candidates' first calls (compilation) and
    ``check_s`` checking the fastest against the reference."""
    first_call_s: float | None = None
    check_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        entry = self.entry or {}
        runner = _runner_up(entry)
        return {"problem": self.problem.key(), "shape": describe(self.problem), "status": self.status,
                "winner": _label(entry) if entry else None, "us": entry.get("us"), "timing": _timing(entry),
                "runner_up": _label(runner) if runner else None, "runner_up_us": runner.get("us") if runner else None,
                "runner_up_timing": runner.get("timing") if runner else None,
                "default": _label(entry["default"]) if entry.get("default") else None,
                "speedup_over_default": entry.get("speedup"), "rejected": entry.get("rejected", []),
                "note": self.note}


def _label(entry: dict[str, Any]) -> str:
    from .tuner import Candidate
    return Candidate(entry["backend"], entry.get("config") or {}).label()


def _timing(entry: dict[str, Any]) -> str | None:
    """How an entry's winner was timed (``graph`` | ``eager``; None for entries from before the field, or untimed)."""
    return entry.get("timing") if entry.get("us") is not None else None


def us_cell(us: float | None, timing: str | None) -> str:
    """A table cell for a time and how it was measured: ``43.1 graph``, ``243.0 eager``, ``12.0`` (unknown), ``-``."""
    return "-" if us is None else f"{us:.1f}" + (f" {timing}" if timing else "")


def _runner_up(entry: dict[str, Any]) -> dict[str, Any] | None:
    skip = [(entry.get("backend"), entry.get("config"))] + [(r["backend"], r.get("config")) for r in entry.get("rejected", [])]
    rest = [c for c in entry.get("candidates", []) if c.get("us") is not None and (c["backend"], c.get("config")) not in skip]
    return min(rest, key=lambda c: c["us"]) if rest else None


def _dist():
    """``(torch.distributed, rank, world)`` when a process group is (or, under torchrun, can be) running."""
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        return None, 0, 1
    if not dist.is_initialized():
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None, 0, 1
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist, dist.get_rank(), dist.get_world_size()


def run(problems: list[Problem], *, force: bool = False, progress: Callable[[Iterable], Iterable] | None = None,
        warmup: int = 3, repeats: int = 7, compile_jobs: int = 0,
        message: Callable[[str], None] | None = None, timing: str | None = None) -> list[Row]:
    """Tune every problem not already in the cache (all of them with ``force``); record and use the winners.

    ``progress`` wraps the iterable of this rank's problems (e.g. ``tqdm``). ``timing``: how candidates
    are timed on a GPU (:func:`mla_core.autotune.tune`; default ``MLA_CORE_TUNE_TIMING``, else ``auto``). ``compile_jobs`` > 1 first
    runs every candidate kernel once in that many processes (:mod:`mla_core.autotune.precompile`), so
    the timing loads compiled kernels, while backends with a slow :meth:`~mla_core.backend.Backend.prepare`
    (the cuda build) prepare in background threads, joined before the timing; ``message`` receives
    their one-line reports. Under
    torch.distributed each rank tunes every world-size-th problem, then all results are exchanged so
    every rank records the same entries and dispatches alike. Returns one :class:`Row` per problem, in order.
    """
    dist, rank, world = _dist()
    mine = [(i, p) for i, p in enumerate(problems) if i % world == rank]
    results: dict[int, dict[str, Any]] = {}
    if compile_jobs > 1:
        todo = [p for _, p in mine if force or not _cached_usable(p)]
        device = todo[0].device if todo else "cpu"
        if device == "cuda":
            import torch
            device = f"cuda:{torch.cuda.current_device()}"
        preparing = prepare_in_background(message) if todo else {}
        report = precompile.run(todo, compile_jobs, device, progress=message, skip=frozenset(preparing))
        if message:
            message(report.describe())
        join_prepared(preparing, message)
    bar = (progress or (lambda it: it))(mine)
    for i, problem in bar:
        if hasattr(bar, "set_postfix_str"):  # a tqdm bar names the shape it is on
            bar.set_postfix_str(describe(problem))
        dev_name = cache.device_name(problem.device)
        entry = cache.user_entries(dev_name).get(problem.key())
        if not force and _cached_usable(problem):
            results[i] = {"status": "cached", "entry": entry}
            continue
        only = _only_candidate(problem)
        if only is not None:
            cache.store(dev_name, {problem.key(): only})
            results[i] = {"status": "recorded", "entry": only, "note": "only valid candidate: recorded without timing"}
            continue
        try:
            result = tuner.tune(problem, warmup=warmup, repeats=repeats, timing=timing)
        except Exception as exc:  # one unbuildable or failing shape must not end a long warm-up
            results[i] = {"status": "failed", "note": f"{type(exc).__name__}: {exc}".splitlines()[0]}
            result = None
        if result is None:  # its traceback is gone now; what it held goes back to the device before the next shape
            tuner.release_memory(problem.device, collect=True)
            continue
        if result.winner is None:
            errors = sorted({c.error for c in result.candidates if c.error} | {r["reason"] for r in result.rejected})
            results[i] = {"status": "failed", "note": "; ".join(errors) or "no backend can run it"}
            continue
        entry = result.entry()
        cache.store(result.device, {problem.key(): entry})  # saved as it goes: an interrupted warm-up keeps its work
        results[i] = {"status": "tuned", "entry": entry, "wall_s": result.wall_s, "first_call_s": result.first_call_s,
                      "check_s": result.check_s,
                      "note": f"{result.wall_s:.1f} s ({result.first_call_s:.1f} s in first calls, "
                              f"{result.check_s:.1f} s checking)"}
    tuner.release_shared_reference()
    if mine:
        tuner.release_memory(mine[-1][1].device)
    if dist is not None and world > 1:
        results = {int(i): r for part in tuner.all_gather_json(results) for i, r in part.items()}
    tuned = {problems[i].key(): r["entry"] for i, r in results.items() if r["status"] in ("tuned", "recorded", "cached")}
    tuner.install(tuned, source="tuned")
    if dist is not None and world > 1:
        tuner.sync()  # rank 0's view wins for anything a rank held differently (e.g. its own older cache)
    return [Row(problems[i], results[i]["status"], results[i].get("entry"), results[i].get("note", ""),
                results[i].get("wall_s"), results[i].get("first_call_s"), results[i].get("check_s"))
            for i in range(len(problems))]


@dataclass
class Preparing:
    """A backend's :meth:`~mla_core.backend.Backend.prepare` running in a thread since ``started`` (perf_counter);
    ``future`` gives the perf_counter time it finished."""

    future: concurrent.futures.Future
    started: float


def _finished_at(fn: Callable[[], Any]) -> float:
    fn()
    return time.perf_counter()


def prepare_in_background(message: Callable[[str], None] | None = None) -> dict[str, Preparing]:
    """Start :meth:`~mla_core.backend.Backend.prepare` of every loaded backend that overrides it (the cuda backend
    builds its kernels: ninja's compilers, CPU-bound, overlapping the compile-ahead processes), each in a thread.

    Returns them by backend name, for :func:`join_prepared`; until then nothing may ask those backends anything
    (the compile-ahead skips them), or it waits for the preparation.
    """
    from ..backend import Backend
    from ..plugins import backends
    slow = [b for b in backends().values() if type(b).prepare is not Backend.prepare]
    out: dict[str, Preparing] = {}
    for backend in slow:
        pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"mla_core-prepare-{backend.name}")
        started = time.perf_counter()
        out[backend.name] = Preparing(pool.submit(_finished_at, backend.prepare), started)
        pool.shutdown(wait=False)  # the thread ends when prepare() returns
    if out and message:
        message(f"preparing {', '.join(out)} in the background (meanwhile compiling ahead without it)")
    return out


def join_prepared(preparing: dict[str, Preparing], message: Callable[[str], None] | None = None) -> None:
    """Wait for every preparation :func:`prepare_in_background` started; report how long each took and how long
    this wait was. One that raised is reported and left to its backend's :meth:`unavailable_reason`."""
    for name, prep in preparing.items():
        waited = time.perf_counter()
        try:
            finished, error = prep.future.result(), None
        except Exception as exc:  # noqa: BLE001 (a plugin's bug; its availability is asked again when used)
            finished, error = time.perf_counter(), f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if message:
            message(f"{name} prepared in {finished - prep.started:.1f} s (then waited for: "
                    f"{max(0.0, finished - waited):.1f} s)" if error is None else f"{name}: prepare() raised {error}")


def _only_candidate(problem: Problem) -> dict[str, Any] | None:
    """The cache entry of ``problem`` when exactly one ``(backend, config)`` can run it (nothing to time), else None.

    Timing a lone candidate decides nothing (the reference on a CPU took 14 s per DeepSeek shape).
    """
    from ..dispatch import candidates
    valid = candidates(problem)[0]
    if len(valid) != 1:
        return None
    configs = tuner.candidate_configs(valid[0], problem)
    if len(configs) != 1:
        return None
    dev_name = cache.device_name(problem.device)
    return {"backend": valid[0].name, "config": configs[0], "us": None, "versions": cache.versions(valid[0], dev_name),
            "default": None, "speedup": None, "candidates": [{"backend": valid[0].name, "config": configs[0]}],
            "rejected": [], "check": "only valid candidate: not timed",
            "tuned_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def ranks_agree(problems: list[Problem]) -> bool | None:
    """Whether every rank dispatches ``problems`` to the same (backend, config); None outside torch.distributed."""
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    from ..dispatch import choose
    mine = [(p.key(), choose(p).backend.name, sorted(choose(p).config.items())) for p in problems
            if _runnable(p)]
    everyone = tuner.all_gather_json([[key, name, [list(kv) for kv in config]] for key, name, config in mine])
    return all(theirs == everyone[0] for theirs in everyone)


def close_process_group() -> None:
    """End the process group the warm-up CLI started under torchrun (nothing outside torch.distributed)."""
    import torch.distributed as dist
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def _runnable(problem: Problem) -> bool:
    from ..dispatch import candidates
    return bool(candidates(problem)[0])


def _cached_usable(problem: Problem) -> bool:
    """Whether the user cache holds an entry for ``problem`` that warm-up may keep."""
    dev_name = cache.device_name(problem.device)
    entry = cache.user_entries(dev_name).get(problem.key())
    return entry is not None and _usable(problem, entry, dev_name)


def _usable(problem: Problem, entry: dict[str, Any], dev_name: str) -> bool:
    """A cached entry warm-up may keep: its backend is loaded, its versions current and its config valid."""
    from .. import plugins
    backend = plugins.backends().get(entry["backend"])
    return (backend is not None and cache.is_current(entry, backend, dev_name)
            and not plugins.validate_config(backend, problem, entry["config"]))


def summary(rows: list[Row]) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the summary table: shape, status, winner, time (and how it was measured: graph or
    eager), runner-up, speed-up over the default, and the seconds tuning took (of which in first calls:
    compilation; and checking the fastest against the reference)."""
    header = ["shape", "status", "winner", "us", "runner-up", "us", "vs default", "tuning s (1st calls, check)"]
    table = []
    for row in rows:
        d = row.as_dict()
        table.append([d["shape"], d["status"], d["winner"] or row.note or "-", us_cell(d["us"], d["timing"]),
                      d["runner_up"] or "-", us_cell(d["runner_up_us"], d["runner_up_timing"]),
                      "-" if d["speedup_over_default"] is None else f"{d['speedup_over_default']:.2f}x",
                      "-" if row.wall_s is None else
                      f"{row.wall_s:.1f} ({row.first_call_s:.1f}, {row.check_s or 0.0:.1f})"])
    return header, table


def timed_run(problems: list[Problem], **kwargs) -> tuple[list[Row], float]:
    """:func:`run` and its wall time in seconds."""
    start = time.perf_counter()
    rows = run(problems, **kwargs)
    return rows, time.perf_counter() - start
