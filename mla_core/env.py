"""Every ``MLA_CORE_*`` environment variable, read and validated in one place.

Each reader returns the parsed value, or raises :class:`~mla_core.errors.MLAInputError` with one
message naming the variable, the value it holds and the values it accepts. Readers are called where
the value is needed (the first op for ``MLA_CORE_CHECKS``, ``MLA_CORE_BACKEND``, ``MLA_CORE_AUTOTUNE``
and ``MLA_CORE_CACHE_DIR``; the first plugin load for ``MLA_CORE_TRACE_PLUGINS``), so a typo fails the
first call loudly instead of silently meaning a default. An unset or empty variable means the default.

=========================  ===========================================  ===================================
variable                   accepted values                              meaning
=========================  ===========================================  ===================================
``MLA_CORE_CHECKS``        ``full`` (default), ``metadata``             value checks of eager calls and
                                                                        result checks (``full``) or only
                                                                        shape/dtype/device checks
``MLA_CORE_BACKEND``       a loaded backend's name                      force that backend for every op
``MLA_CORE_AUTOTUNE``      ``off``, ``cached`` (default), ``on``        tuner mode (docs/autotune.md)
``MLA_CORE_TUNE_TIMING``   ``auto`` (default), ``graph``, ``eager``     how the tuner times candidates on
                                                                        a GPU (docs/autotune.md)
``MLA_CORE_CACHE_DIR``     an absolute folder path (``~`` expanded)     the user autotune cache
``MLA_CORE_TRACE_PLUGINS`` ``0`` (default), ``1`` (or false/true,       print every plugin hook call
                           no/yes, off/on)
``MLA_CORE_LOG``           ``off`` (default), ``debug``, ``info``,      level of the ``mla_core`` loggers
                           ``warning``, ``error``
=========================  ===========================================  ===================================
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable

from .errors import MLAInputError

CHECKS = "MLA_CORE_CHECKS"
BACKEND = "MLA_CORE_BACKEND"
AUTOTUNE = "MLA_CORE_AUTOTUNE"
TUNE_TIMING = "MLA_CORE_TUNE_TIMING"
CACHE_DIR = "MLA_CORE_CACHE_DIR"
TRACE_PLUGINS = "MLA_CORE_TRACE_PLUGINS"
LOG = "MLA_CORE_LOG"

CHECKS_MODES = ("full", "metadata")
_CHECKS_ALIASES = {"all": "full"}  # the name the default had before the modes were validated
AUTOTUNE_MODES = ("off", "cached", "on")
TUNE_TIMINGS = ("auto", "graph", "eager")
LOG_LEVELS = {"off": None, "debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
              "error": logging.ERROR}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")

VARIABLES = {
    CHECKS: "full (default; also spelled all) | metadata",
    BACKEND: "the name of a loaded mla_core backend (see `mla-core backends`)",
    AUTOTUNE: "off | cached (default) | on",
    TUNE_TIMING: "auto (default) | graph | eager",
    CACHE_DIR: "an absolute folder path (~ is expanded)",
    TRACE_PLUGINS: "0 (default) | 1 (also false/true, no/yes, off/on)",
    LOG: "off (default) | debug | info | warning | error",
}
"""Every variable mla_core reads, with the values it accepts (what the error messages say)."""


def invalid(name: str, value: str, accepted: str) -> MLAInputError:
    """The one error for a bad value of variable ``name``."""
    return MLAInputError(f"environment variable {name}={value!r} is not valid; accepted: {accepted}")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def _choice(name: str, allowed: Iterable[str], default: str) -> str:
    value = _raw(name)
    if not value:
        return default
    if value.lower() not in allowed:
        raise invalid(name, value, VARIABLES[name])
    return value.lower()


_checks_memo: tuple[str | None, str] = (None, "full")


_ENV_KEYS: dict[str, object] = {}


def _entry(name: str):
    """``name``'s raw entry in ``os.environ`` (None: unset), read from the mapping's own dict where it has one
    (``os.environ.get`` runs four Python frames; the variables below are read on every op call)."""
    environ = os.environ
    data = getattr(environ, "_data", None)
    if data is None:
        return environ.get(name)
    key = _ENV_KEYS.get(name)
    if key is None:
        key = _ENV_KEYS[name] = environ.encodekey(name)
    return data.get(key)


def checks_mode() -> str:
    """``MLA_CORE_CHECKS``: ``"full"`` (default) or ``"metadata"``. Cheap enough for every call (memoized on the raw text)."""
    global _checks_memo
    raw = _entry(CHECKS)
    if raw != _checks_memo[0]:
        _checks_memo = (raw, _CHECKS_ALIASES.get(_raw(CHECKS).lower()) or _choice(CHECKS, CHECKS_MODES, "full"))
    return _checks_memo[1]


_backend_memo: tuple[object, str | None] = (None, None)


def backend_name() -> str | None:
    """``MLA_CORE_BACKEND`` (None when unset); dispatch checks the name against the loaded backends."""
    global _backend_memo
    raw = _entry(BACKEND)
    if raw != _backend_memo[0]:
        _backend_memo = (raw, _raw(BACKEND) or None)
    return _backend_memo[1]


def unknown_backend(value: str, known: Iterable[str]) -> MLAInputError:
    """The error for ``MLA_CORE_BACKEND`` naming a backend that is not loaded."""
    return invalid(BACKEND, value, "the name of a loaded mla_core backend: " + (", ".join(sorted(known)) or "none"))


def autotune_mode() -> str:
    """``MLA_CORE_AUTOTUNE``: ``"off"``, ``"cached"`` (default) or ``"on"``."""
    return _choice(AUTOTUNE, AUTOTUNE_MODES, "cached")


def tune_timing() -> str:
    """``MLA_CORE_TUNE_TIMING``: ``"auto"`` (default: CUDA-graph replays where a candidate can be captured, else
    eager calls), ``"graph"`` (a candidate that cannot be captured fails) or ``"eager"``."""
    return _choice(TUNE_TIMING, TUNE_TIMINGS, "auto")


def cache_dir() -> Path | None:
    """``MLA_CORE_CACHE_DIR`` as an absolute path (``~`` expanded), or None when unset.

    A relative path is refused: it would make the cache depend on the working directory.
    """
    value = _raw(CACHE_DIR)
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_absolute():
        raise invalid(CACHE_DIR, value, VARIABLES[CACHE_DIR])
    return path


def trace_plugins() -> bool:
    """``MLA_CORE_TRACE_PLUGINS``: whether to print every plugin hook call."""
    value = _raw(TRACE_PLUGINS).lower()
    if not value or value in _FALSE:
        return False
    if value in _TRUE:
        return True
    raise invalid(TRACE_PLUGINS, _raw(TRACE_PLUGINS), VARIABLES[TRACE_PLUGINS])


def log_level() -> int | None:
    """``MLA_CORE_LOG`` as a :mod:`logging` level, or None for ``off`` / unset."""
    return LOG_LEVELS[_choice(LOG, LOG_LEVELS, "off")]


def problems(known_backends: Iterable[str] | None = None) -> list[str]:
    """The error message of every variable set to a bad value now (empty: all fine).

    ``known_backends``: names ``MLA_CORE_BACKEND`` may take (None: not checked).
    """
    out = []
    for read in (checks_mode, autotune_mode, tune_timing, cache_dir, trace_plugins, log_level):
        try:
            read()
        except MLAInputError as exc:
            out.append(str(exc))
    name = backend_name()
    if known_backends is not None and name is not None and name not in set(known_backends):
        out.append(str(unknown_backend(name, known_backends)))
    return out
