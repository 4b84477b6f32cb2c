"""Compile ahead: every kernel a warm-up will time, built by parallel worker processes before the timing.

On a fresh machine a warm-up spends most of its time compiling: each ``(backend, config)`` of a shape is
a Triton specialization compiled by its first call, one after another on one core, while the timing
itself takes milliseconds. :func:`run` first lists the distinct candidates (:func:`units`: one per
problem *kind*, i.e. the problem without its size parameters, backend and config, run on the smallest
problem of that kind), then runs each once in ``jobs`` ``spawn``-ed processes (a CUDA context each), so
the compiled kernels land in Triton's on-disk cache (and a csrc build in its build folder); the serial
timing that follows loads them instead of compiling. Nothing is timed, compared or recorded here: a
unit that fails costs only its time, and the serial phase meets the same error and reports it.
"""
from __future__ import annotations

import concurrent.futures
import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..problem import Problem

SIZE_PARAMS = frozenset({"batch", "max_len", "max_seqlen_q", "total_k", "tokens", "dense_batch"})
"""Problem parameters that size the inputs; kernels of one kind and config rarely specialize on them."""
MAX_JOBS = 16
"""Most worker processes :func:`default_jobs` picks (each holds a CUDA context, ~0.5 GB, and one problem's inputs at
a time; each takes ~8 s to start: torch and CUDA)."""


def default_jobs() -> int:
    """Worker processes for a GPU warm-up: three quarters of the CPUs this process may use (shared by the local ranks
    under torchrun), at most :data:`MAX_JOBS`; the other quarter serves the main process and a kernel build
    (:meth:`~mla_core.backend.Backend.prepare`) running meanwhile. 16 CPUs: 12 (TP 8 preset on the H200: 114
    configs in 31.4 s with 8 processes, 110 in 22.9 s with 12)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    cpus = max(1, cpus // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)))
    return max(1, min(MAX_JOBS, cpus - cpus // 4))


@dataclass(frozen=True)
class Unit:
    """One candidate to run once: the problem key it runs on, the backend's name and the config."""

    key: str
    backend: str
    config: dict[str, Any] = field(hash=False, compare=False)


@dataclass
class Report:
    """What :func:`run` did: units run, failures (unit label -> first error line), workers, wall seconds."""

    units: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    jobs: int = 0
    wall_s: float = 0.0

    def describe(self) -> str:
        if not self.units:
            return "nothing to compile ahead"
        failed = f", {len(self.failed)} failed (the timing reports them)" if self.failed else ""
        return f"ran {self.units} kernel configs once in {self.jobs} processes in {self.wall_s:.1f} s{failed}"


def _int_class(value: Any) -> str:
    """How Triton specializes an integer argument: equal to 1, divisible by 16, or neither."""
    if not isinstance(value, int) or isinstance(value, bool):
        return repr(value)
    return "1" if value == 1 else ("16n" if value % 16 == 0 else "n")


def _size(problem: Problem) -> int:
    size = 1
    for name in SIZE_PARAMS:
        value = problem.get(name)
        if isinstance(value, int) and value > 0:
            size *= value
    return size


def units(problems: list[Problem], skip: frozenset[str] = frozenset()) -> list[Unit]:
    """The distinct ``(kind, backend, config)`` candidates of ``problems``, each on its smallest problem.

    Every backend that can run a problem counts except the reference (nothing to compile) and those named
    in ``skip``, which are not even asked (a backend still preparing in another thread: asking would wait
    for it); configs are the tuner's own (:func:`mla_core.autotune.tuner.candidate_configs`).
    """
    from ..accuracy import REFERENCE
    from ..plugins import backends, why_not
    from .tuner import candidate_configs
    chosen: dict[tuple, tuple[int, Unit]] = {}
    for problem in problems:
        kind = (problem.op, problem.device, problem.features,
                tuple((k, _int_class(v) if k in SIZE_PARAMS else v) for k, v in problem.params))
        for backend in backends().values():
            if backend.name == REFERENCE or backend.name in skip or why_not(backend, problem):
                continue
            try:
                configs = candidate_configs(backend, problem)
            except Exception:  # noqa: BLE001 (the tuner reports a failing configs())
                continue
            for config in configs:
                ident = (kind, backend.name, json.dumps(config, sort_keys=True))
                size = _size(problem)
                if ident not in chosen or size < chosen[ident][0]:
                    chosen[ident] = (size, Unit(problem.key(), backend.name, config))
    return [unit for _, unit in chosen.values()]


_worker_call: tuple[str, Any] | None = None
"""The last inputs a worker built (problem key, call): consecutive units of one problem reuse them."""


def run_unit(unit: Unit, device: str) -> str | None:
    """Run ``unit`` once on ``device`` (in a worker process); the first line of its error, or None."""
    global _worker_call
    import torch

    from .. import inputs, plugins
    try:
        problem = Problem.from_key(unit.key)
        if _worker_call is None or _worker_call[0] != unit.key:
            _worker_call = None
            _worker_call = (unit.key, inputs.make_call(problem, torch.device(device), 0))
        plugins.backends()[unit.backend].run(problem, _worker_call[1], unit.config)
        if device.startswith("cuda"):
            torch.cuda.synchronize(device)
        return None
    except Exception as exc:  # noqa: BLE001 (reported; the serial phase meets it again)
        return f"{type(exc).__name__}: {exc}".splitlines()[0][:300]


def _init_worker(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.set_device(torch.device(device))


def run(problems: list[Problem], jobs: int, device: str,
        progress: Callable[[str], None] | None = None, skip: frozenset[str] = frozenset()) -> Report:
    """Run every unit of ``problems`` once in ``jobs`` worker processes on ``device`` (e.g. ``"cuda:0"``).

    ``jobs`` <= 1 or no unit: nothing runs. ``skip``: backends left out (:func:`units`). A worker process
    that dies (e.g. a device-side assert) ends the phase early; the serial timing still runs everything.
    """
    report = Report(jobs=jobs)
    todo = units(problems, skip) if jobs > 1 else []
    if not todo:
        return report
    started = time.perf_counter()
    report.units = len(todo)
    if progress:
        progress(f"compiling ahead: {len(todo)} kernel configs in {jobs} processes")
    context = multiprocessing.get_context("spawn")
    done = 0
    try:
        with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                                                    initargs=(device,)) as pool:
            futures = {pool.submit(run_unit, unit, device): unit for unit in todo}
            for future in concurrent.futures.as_completed(futures):
                unit, done = futures[future], done + 1
                error = future.result()
                if error:
                    report.failed[f"{unit.backend} {json.dumps(unit.config, sort_keys=True)} on {unit.key}"] = error
                if progress and (done % 10 == 0 or done == len(todo)):
                    progress(f"compiled {done}/{len(todo)} ({time.perf_counter() - started:.0f} s)")
    except concurrent.futures.process.BrokenProcessPool as exc:
        report.failed["worker process"] = f"a worker died ({exc}); compiled {done} of {len(todo)}"
    report.wall_s = time.perf_counter() - started
    return report
