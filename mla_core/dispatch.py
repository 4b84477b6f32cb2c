"""Dispatch: which ``(backend, config)`` runs a problem.

Order (docs/architecture.md): an explicit override (the op's ``backend=`` argument, then
:func:`use_backend`, then ``MLA_CORE_BACKEND``) wins; else the in-memory choice for the problem;
else the first answer of the registered choice sources (:func:`add_choice_source`; the autotuner
registers the user cache, the shipped cache and tuning-on-a-miss, in that order); else the valid
backend with the highest priority. After the first call of a problem the answer is one dict lookup.
Dispatch imports neither the autotuner nor the CLI: they build on it.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from .backend import Backend
from .errors import NoBackendError
from . import plugins
from .plugins import backends, get_backend
from .problem import Problem

ENV_BACKEND = "MLA_CORE_BACKEND"

_override: contextvars.ContextVar[str | None] = contextvars.ContextVar("mla_core_backend", default=None)


@dataclass(frozen=True)
class Choice:
    """A dispatch decision: backend object, its config, and where the decision came from."""

    backend: Backend
    config: dict[str, Any]
    source: str  # "override" | "priority" | "cache" | "shipped" | "tuned" | "synced"


ChoiceSource = Callable[[Problem, "list[Backend]"], "Choice | None"]
"""Asked on an in-memory miss with the valid backends (highest priority first); None: no opinion."""

_memory: dict[tuple[str | None, Problem], Choice] = {}
_sources: list[ChoiceSource] = []


def clear_memory() -> None:
    """Forget every in-memory decision (after plugins or the cache change)."""
    _memory.clear()


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
    return explicit or _override.get() or os.environ.get(ENV_BACKEND) or None


def candidates(problem: Problem) -> tuple[list[Backend], dict[str, list[str]]]:
    """Backends that can run ``problem`` (highest priority first) and every other backend's reasons."""
    ok, reasons = [], {}
    for name, backend in backends().items():
        why = backend.why_not(problem)
        if why:
            reasons[name] = why
        else:
            ok.append(backend)
    ok.sort(key=lambda b: (-b.priority, b.name))
    return ok, reasons


def choose(problem: Problem, explicit: str | None = None) -> Choice:
    """The ``(backend, config)`` for ``problem``; raises NoBackendError when nothing can run it."""
    name = requested_backend(explicit)
    key = (name, problem)
    choice = _memory.get(key)
    if choice is not None:
        return choice
    if name is not None:
        backend = get_backend(name)
        why = backend.why_not(problem)
        if why:
            raise NoBackendError(problem, {name: why})
        choice = Choice(backend, backend.configs(problem)[0], "override")
    else:
        ok, reasons = candidates(problem)
        if not ok:
            for broken in plugins.registry().broken:
                reasons[broken.name] = [f"plugin failed to load: {broken.reason}"]
            raise NoBackendError(problem, reasons)
        choice = next((c for c in (source(problem, ok) for source in _sources) if c is not None), None)
        if choice is None:
            choice = Choice(ok[0], ok[0].configs(problem)[0], "priority")
    _memory[key] = choice
    logging.getLogger(__name__).info("%s -> %s %s (%s)", problem.key(), choice.backend.name, choice.config,
                                     choice.source)  # the first decision per problem (MLA_CORE_LOG=info)
    return choice


def explain(problem: Problem) -> dict[str, list[str]]:
    """Every loaded backend's reasons for ``problem`` (empty list: it can run it)."""
    return {name: b.why_not(problem) for name, b in backends().items()}
