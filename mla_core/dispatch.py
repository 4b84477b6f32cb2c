"""Dispatch: which ``(backend, config)`` runs a problem.

Order (docs/architecture.md): an explicit override (the op's ``backend=`` argument, then
:func:`use_backend`, then ``MLA_CORE_BACKEND``) wins; else the in-memory choice for the problem;
else the first answer of the registered choice sources (:func:`add_choice_source`; the autotuner
registers the user cache, the shipped cache and tuning-on-a-miss, in that order); else the valid
backend with the highest priority for the problem (``Backend.priority_for``). After the first call
of a problem the answer is two dict lookups (its choice, and that no capture chose otherwise: no
capture-state query). Dispatch imports neither the autotuner nor the CLI: they build on it.

Eager calls and CUDA-graph captures are remembered apart (:func:`capturing`): a backend's ``priority_for`` may
answer differently while the current CUDA stream captures (the cuda backend prefers its one-launch decode for
eager calls, whose time is the host's, and leaves captured ones to triton: docs/plugins.md, "Priority"). A capture
of a problem already called eagerly reuses the eager choice: the replay runs the kernels the eager calls ran and
computes what they did, and no backend's first launch (Triton loads a kernel's module then) lands inside a capture.
(A first Triton launch inside a capture did work on the H200 with torch 2.11 / triton 3.6: benchmarks/NOTES.md,
"Round (h), the lead's last device call"; the guard costs graphs captured after an eager warm-up 2.4-4.7 us a layer
at 16 heads and L <= 4k.)

A plugin's mistakes stay its own: an exception from ``why_not`` / ``unavailable_reason`` / ``configs`` /
``priority_for`` makes that backend unusable for the problem (the exception is the reason) and the others
are asked.
Results are checked against the op's spec in ``full`` checks mode (:meth:`mla_core.backend.Backend.run`).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from . import env, plugins
from .backend import Backend, BackendOutputError, check_result, result_checks
from .errors import NoBackendError
from .plugins import backends, get_backend
from .problem import Problem

ENV_BACKEND = env.BACKEND
__all__ = ["BackendOutputError", "Choice", "ChoiceSource", "add_choice_source", "candidates", "capturing",
           "check_result", "choose", "clear_memory", "explain", "requested_backend", "result_checks", "use_backend"]

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("mla_core_backend", default=None)


@dataclass(frozen=True)
class Choice:
    """A dispatch decision: backend object, its config, and where the decision came from."""

    backend: Backend
    config: dict[str, Any]
    source: str  # "override" | "priority" | "cache" | "shipped" | "tuned" | "synced"


ChoiceSource = Callable[[Problem, "list[Backend]"], "Choice | None"]
"""Asked on an in-memory miss with the valid backends (highest ``priority_for`` first); None: no opinion."""

_memory: dict[tuple[str | None, Problem], Choice] = {}
"""Choices of eager calls by (override name, problem)."""
_captured: dict[tuple[str | None, Problem], Choice] = {}
"""Choices of calls made while the current CUDA stream captures a graph, by the same key."""
_sources: list[ChoiceSource] = []


def clear_memory() -> None:
    """Forget every in-memory decision (after plugins or the cache change)."""
    _memory.clear()
    _captured.clear()


def capturing(problem: Problem) -> bool:
    """Whether a call of ``problem`` made now is captured into a CUDA graph: a CUDA problem while the current
    CUDA stream captures (``torch.cuda.is_current_stream_capturing()``; never asked for other devices, nor before
    CUDA is initialized). Dispatch remembers eager and captured choices apart; a backend's ``priority_for`` may
    call this to rank itself differently for the two (its time is the host's launch cost eagerly, the GPU's in
    a graph's replay)."""
    return problem.device == "cuda" and torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


plugins.on_change(clear_memory)


def add_choice_source(source: ChoiceSource) -> None:
    """Append ``source`` to the ordered list dispatch asks after its memory and before the priority rule."""
    if source not in _sources:
        _sources.append(source)
        clear_memory()


@contextlib.contextmanager
def use_backend(name: str | None) -> Iterator[None]:
    """Run every mla_core op inside the block on backend ``name`` (None: back to automatic choice)."""
    if name is not None:
        get_backend(name)  # unknown names fail here, not at the first op
    token = _override.set(name)
    try:
        yield
    finally:
        _override.reset(token)


def requested_backend(explicit: str | None) -> str | None:
    """The override in force: the argument, else the context, else ``MLA_CORE_BACKEND``, else None."""
    return explicit or _override.get() or env.backend_name()


def _reasons(backend: Backend, problem: Problem) -> list[str]:
    """``why_not``, plus a ``configs()`` that raises or lists nothing (a plugin's exception is a reason)."""
    why = plugins.why_not(backend, problem)
    if not why:
        why = [r for r in [plugins.default_config(backend, problem)[1]] if r]
    return why


def priority_for(backend: Backend, problem: Problem) -> tuple[int | None, str | None]:
    """``(backend.priority_for(problem), None)``, or ``(None, reason)`` when it raised or is not an int."""
    got, error = plugins._call("priority_for()", lambda: backend.priority_for(problem))
    if error:
        return None, error
    if type(got) is not int:
        return None, f"priority_for() returned {got!r:.80}, not an int"
    return got, None


def candidates(problem: Problem) -> tuple[list[Backend], dict[str, list[str]]]:
    """Backends that can run ``problem`` (highest ``priority_for(problem)`` first) and every other backend's reasons."""
    ranked, reasons = [], {}
    for name, backend in backends().items():
        why = _reasons(backend, problem)
        priority, error = (None, None) if why else priority_for(backend, problem)
        if why or error:
            reasons[name] = why or [error]
        else:
            ranked.append((-priority, backend.name, backend))
    ranked.sort(key=lambda t: t[:2])
    return [b for _, _, b in ranked], reasons


_log = logging.getLogger(__name__)
_log_configured = False


def _configure_logging() -> None:
    """Apply ``MLA_CORE_LOG`` once: a stderr handler on the ``mla_core`` logger at that level (off: untouched)."""
    global _log_configured
    level = env.log_level()  # a bad value is an MLAInputError naming the variable, at the first op
    _log_configured = True
    if level is None:
        return
    root = logging.getLogger("mla_core")
    root.setLevel(level)
    if not any(getattr(h, "_mla_core", False) for h in root.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        handler._mla_core = True
        root.addHandler(handler)


def choose(problem: Problem, explicit: str | None = None) -> Choice:
    """The ``(backend, config)`` for ``problem``; raises NoBackendError when nothing can run it.

    An unknown override is an MLAInputError naming where it came from (the ``backend`` argument or
    ``MLA_CORE_BACKEND``) and, for a plugin that failed to load, why.
    """
    name = requested_backend(explicit)
    key = (name, problem)
    eager = _memory.get(key)
    if eager is not None and key not in _captured:
        return eager  # eager call, or a capture of a problem called eagerly (it replays the eager choice)
    if capturing(problem):  # asked only where the two states can answer differently
        choice = _captured.get(key)
        if choice is None:
            choice = _captured[key] = _decide(problem, name, explicit)
        return choice
    if eager is None:
        eager = _memory[key] = _decide(problem, name, explicit)
    return eager


def _decide(problem: Problem, name: str | None, explicit: str | None) -> Choice:
    """:func:`choose` on a miss of its memory: the override, else the choice sources, else the priority rule."""
    if not _log_configured:
        _configure_logging()
    if name is not None:
        from_env = not explicit and _override.get() is None
        backend = get_backend(name, env.BACKEND if from_env else "backend")
        why = _reasons(backend, problem)
        if why:
            raise NoBackendError(problem, {name: why})
        choice = Choice(backend, plugins.default_config(backend, problem)[0], "override")
    else:
        ok, reasons = candidates(problem)
        if not ok:
            for broken in plugins.registry().broken:
                reasons[broken.name] = [f"plugin failed to load: {broken.reason}"]
            raise NoBackendError(problem, reasons)
        choice = next((c for c in (source(problem, ok) for source in _sources) if c is not None), None)
        if choice is None:
            choice = Choice(ok[0], plugins.default_config(ok[0], problem)[0], "priority")
    _log.info("%s -> %s %s (%s)", problem.key(), choice.backend.name, choice.config, choice.source)
    return choice

