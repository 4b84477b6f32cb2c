"""Backend plugins: the pluggy hookspec, the plugin manager, and the registry of loaded backends.

Built-in backends and third-party ones load the same way: an entry point in the group ``mla_core``
names a module (or object) holding a ``@mla_core.hookimpl``-decorated ``mla_core_backends()`` that
returns a list of :class:`~mla_core.backend.Backend` objects. A plugin that fails to import (even with
``SystemExit``), whose hook implementation matches no spec, whose hook raises, or whose backend does
not pass :func:`backend_problems` (attributes of the right types, a method for every declared op) is
recorded as a broken plugin with the reason; the others keep working. The built-in backend names
(:data:`RESERVED`) belong to mla-core's own entry points, which load first; a later plugin reusing a
taken name is the one listed broken. At call time :func:`why_not` and :func:`default_config` turn a
backend's exceptions into reasons. ``MLA_CORE_TRACE_PLUGINS=1`` prints every hook call.
"""
from __future__ import annotations

import importlib.metadata
import inspect
import sys
import threading
import traceback
from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import Any, Callable

import pluggy

from . import env
from .backend import Backend, OpCapability
from .problem import OPS, Problem

PROJECT = "mla_core"
"""pluggy project name and entry-point group."""
DISTRIBUTION = "mla-core"
"""The distribution whose entry points are the built-in backends."""
RESERVED = frozenset({"reference", "triton", "cuda", "musa_fp8", "cudnn"})
"""Backend names only the built-in entry points of :data:`DISTRIBUTION` may use."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpec:
    """Hook specifications of mla_core."""

    @hookspec
    def mla_core_backends(self) -> list[Backend]:
        """Return the backends this plugin provides (objects of :class:`~mla_core.backend.Backend` subclasses)."""


@dataclass
class BrokenPlugin:
    """A plugin that could not be loaded, and why; ``backends``: the backend names it tried to provide."""

    name: str
    reason: str
    backends: tuple[str, ...] = ()


def _describe(exc: BaseException) -> str:
    return traceback.format_exception_only(type(exc), exc)[-1].strip()[:500]


def backend_problems(backend: Any) -> list[str]:
    """Why ``backend`` cannot be registered (empty: it can): checked once, when its plugin loads.

    name a non-empty str, version a str, priority an int, device_types a set of str, capabilities a
    mapping of known op names to :class:`~mla_core.backend.OpCapability`, and a method for every op it declares.
    """
    if not isinstance(backend, Backend):
        return [f"returned {backend!r}, not a mla_core.Backend"]
    out = []
    try:
        name, version, priority = backend.name, backend.version, backend.priority
        devices, caps = backend.device_types, backend.capabilities
    except Exception as exc:
        return [f"reading its attributes raised {_describe(exc)}"]
    if not isinstance(name, str) or not name.strip():
        out.append(f"name {name!r} is not a non-empty str")
    if not isinstance(version, str):
        out.append(f"version {version!r} is not a str")
    if type(priority) is not int:
        out.append(f"priority {priority!r} is not an int")
    if not isinstance(devices, Set) or not all(isinstance(d, str) for d in devices):
        out.append(f"device_types {devices!r} is not a set of str")
    if not isinstance(caps, Mapping):
        out.append(f"capabilities is a {type(caps).__name__}, not a mapping of op name -> OpCapability")
        return out
    for op, cap in caps.items():
        if op not in OPS:
            out.append(f"capabilities names {op!r}, not an op ({', '.join(OPS)})")
        elif not isinstance(cap, OpCapability):
            out.append(f"capabilities[{op!r}] is a {type(cap).__name__}, not an OpCapability")
        elif not callable(getattr(backend, op, None)):
            out.append(f"declares {op!r} but has no {op}() method")
    return out


class Registry:
    """Loaded backends by name, and the plugins that failed to load."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(BackendSpec)
        if env.trace_plugins():
            self.pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[mla_core plugins] {msg}"))
            self.pm.enable_tracing()
        self.backends: dict[str, Backend] = {}
        self.owner: dict[str, str] = {}  # backend name -> name of the plugin that provided it
        self.broken: list[BrokenPlugin] = []

    def register(self, plugin: Any, name: str | None = None, *, builtin: bool = False) -> list[Backend]:
        """Register one plugin object or module and collect its backends; returns them.

        Raises nothing (KeyboardInterrupt aside): a bad plugin is recorded in :attr:`broken`. ``builtin``:
        the plugin is one of mla-core's own entry points, which alone may use the :data:`RESERVED` names.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        try:
            self.pm.register(plugin, name=name)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # signature mismatch against the spec, duplicate name
            self.broken.append(BrokenPlugin(name, _describe(exc)))
            return []
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            self.pm.unregister(plugin)
            self.broken.append(BrokenPlugin(name, f"hook implementation matches no spec: {exc}"))
            return []
        added = []
        for impl in self.pm.hook.mla_core_backends.get_hookimpls():
            if impl.plugin is not plugin:
                continue
            try:
                backends = list(impl.function())
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit, GeneratorExit: a plugin never ends the process
                self.broken.append(BrokenPlugin(name, f"mla_core_backends() raised {_describe(exc)}"))
                continue
            for backend in backends:
                label = getattr(backend, "name", None) if isinstance(backend, Backend) else None
                label = label if isinstance(label, str) else None
                problems = backend_problems(backend)
                if not problems and label in RESERVED and not builtin:
                    problems = [f"backend name {label!r} is reserved for mla-core's built-in backend"]
                if not problems and label in self.backends:
                    problems = [f"backend name {label!r} is already taken by plugin {self.owner.get(label, '?')!r}"]
                if problems:
                    what = f"backend {label!r}: " if label else ""
                    self.broken.append(BrokenPlugin(name, what + "; ".join(problems), (label,) if label else ()))
                else:
                    _guard(backend)
                    self.backends[label] = backend
                    self.owner[label] = name
                    added.append(backend)
        return added

    def load_entry_points(self) -> None:
        """Load every plugin in the ``mla_core`` entry-point group: mla-core's own first, then the others by name."""
        def own(ep) -> bool:
            dist = getattr(ep, "dist", None)
            return dist is not None and _normal(dist.name) == _normal(DISTRIBUTION)

        eps = sorted(importlib.metadata.entry_points(group=PROJECT), key=lambda e: (not own(e), e.name))
        for ep in eps:
            if self.pm.has_plugin(ep.name) or any(b.name == ep.name for b in self.broken):
                continue
            try:
                plugin = ep.load()
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit at import must not end the process
                self.broken.append(BrokenPlugin(ep.name, f"import of {ep.value} failed: {_describe(exc)}"))
                continue
            self.register(plugin, name=ep.name, builtin=own(ep))

    def broken_reason(self, backend_name: str) -> str | None:
        """Why the plugin that provides (or is named) ``backend_name`` is broken, or None."""
        for b in self.broken:
            if backend_name in b.backends or b.name == backend_name:
                return f"plugin {b.name!r} is broken: {b.reason}"
        return None


def _guard(backend: Backend) -> None:
    """Make ``backend.unavailable_reason()`` and ``backend.why_not()`` answer with a reason instead of raising, for
    every caller (dispatch, the CLI, tools): the class's method is looked up at each call, so it stays patchable."""
    for attr, as_reason in (("unavailable_reason", lambda text: text), ("why_not", lambda text: [text])):
        def safe(*args, _attr=attr, _as_reason=as_reason):
            try:
                return inspect.getattr_static(type(backend), _attr).__get__(backend, type(backend))(*args)
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # SystemExit, GeneratorExit included: a plugin never ends the process
                return _as_reason(f"{_attr}() raised {_describe(exc)}")
        try:
            setattr(backend, attr, safe)
        except (AttributeError, TypeError):  # __slots__ or a read-only attribute: plugins.why_not still guards
            pass


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


_registry: Registry | None = None
_lock = threading.Lock()
_listeners: list[Callable[[], None]] = []


def on_change(listener: Callable[[], None]) -> None:
    """Call ``listener()`` whenever the set of loaded backends changes (dispatch forgets its choices)."""
    _listeners.append(listener)


def _changed() -> None:
    for listener in _listeners:
        listener()


def registry() -> Registry:
    """The process-wide registry, loaded from entry points on first use."""
    global _registry
    if _registry is None:
        with _lock:
            if _registry is None:
                reg = Registry()
                reg.load_entry_points()
                _registry = reg
    return _registry


def reload() -> Registry:
    """Forget loaded plugins and load the entry points again (after installing a plugin)."""
    global _registry
    with _lock:
        _registry = None
    _changed()
    return registry()


def backends() -> dict[str, Backend]:
    """Loaded backends by name (available or not: ask ``why_not``)."""
    return registry().backends


def get_backend(name: str, argument: str = "backend") -> Backend:
    """The backend called ``name``; an unknown name is an MLAInputError naming ``argument``, saying why a
    broken plugin of that name is broken, and listing the known backends."""
    from .errors import MLAInputError
    try:
        return backends()[name]
    except (KeyError, TypeError):
        known = ", ".join(sorted(backends())) or "none"
        broken = registry().broken_reason(name) if isinstance(name, str) else None
        if argument == env.BACKEND:
            raise env.unknown_backend(name, backends()) from None
        if broken:
            raise MLAInputError(f"{argument}: got {name!r}, whose {broken} (working backends: {known})") from None
        raise MLAInputError(f"{argument}: got {name!r}, which is not a loaded mla_core backend (known: {known})") from None


def _call(what: str, fn: Callable[[], Any]) -> tuple[Any, str | None]:
    """``(fn(), None)``, or ``(None, reason)`` when a plugin's ``fn`` raised (KeyboardInterrupt aside)."""
    try:
        return fn(), None
    except KeyboardInterrupt:
        raise
    except BaseException as exc:
        return None, f"{what} raised {_describe(exc)}"


def why_not(backend: Backend, problem: Problem) -> list[str]:
    """``backend.why_not(problem)`` as a list of str; an exception or a malformed answer is itself the reason."""
    got, error = _call("why_not()", lambda: backend.why_not(problem))
    if error:
        return [error]
    if isinstance(got, str):
        return [got] if got else []
    if got is None:
        return []
    if not isinstance(got, (list, tuple)) or not all(isinstance(r, str) for r in got):
        return [f"why_not() returned {type(got).__name__} {got!r:.80}, not a list of str"]
    return list(got)


def default_config(backend: Backend, problem: Problem) -> tuple[dict[str, Any] | None, str | None]:
    """``(first of backend.configs(problem), None)``, or ``(None, reason)`` when configs() raised or gave none."""
    got, error = _call("configs()", lambda: backend.configs(problem))
    if error:
        return None, error
    if not isinstance(got, (list, tuple)) or not got or not isinstance(got[0], Mapping):
        return None, f"configs() returned {got!r:.80}, not a non-empty list of dicts"
    return dict(got[0]), None


def validate_config(backend: Backend, problem: Problem, config: Any) -> list[str]:
    """``backend.validate_config(problem, config)`` as a list of str; an exception is itself the reason."""
    got, error = _call("validate_config()", lambda: backend.validate_config(problem, config))
    if error:
        return [error]
    if not isinstance(got, (list, tuple)) or not all(isinstance(r, str) for r in got):
        return [f"validate_config() returned {got!r:.80}, not a list of str"]
    return list(got)


def register_plugin(plugin: Any, name: str | None = None) -> list[Backend]:
    """Register a plugin object or module at run time (what an entry point does at load)."""
    added = registry().register(plugin, name)
    _changed()
    return added
