"""Backend plugins: the pluggy hookspec, the plugin manager, and the registry of loaded backends.

Built-in backends and third-party ones load the same way: an entry point in the group ``mla_core``
names a module (or object) holding a ``@mla_core.hookimpl``-decorated ``mla_core_backends()`` that
returns a list of :class:`~mla_core.backend.Backend` objects. A plugin that fails to import, whose
hook implementation matches no spec, or whose hook raises is recorded as a broken plugin with the
reason; the others keep working. ``MLA_CORE_TRACE_PLUGINS=1`` prints every hook call.
"""
from __future__ import annotations

import importlib.metadata
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import pluggy

from .backend import Backend

PROJECT = "mla_core"
"""pluggy project name and entry-point group."""

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class BackendSpec:
    """Hook specifications of mla_core."""

    @hookspec
    def mla_core_backends(self) -> list[Backend]:
        """Return the backends this plugin provides (objects of :class:`~mla_core.backend.Backend` subclasses)."""


@dataclass
class BrokenPlugin:
    """A plugin that could not be loaded, and why."""

    name: str
    reason: str


class Registry:
    """Loaded backends by name, and the plugins that failed to load."""

    def __init__(self) -> None:
        self.pm = pluggy.PluginManager(PROJECT)
        self.pm.add_hookspecs(BackendSpec)
        if os.environ.get("MLA_CORE_TRACE_PLUGINS"):
            self.pm.trace.root.setwriter(lambda msg: sys.stderr.write(f"[mla_core plugins] {msg}"))
            self.pm.enable_tracing()
        self.backends: dict[str, Backend] = {}
        self.broken: list[BrokenPlugin] = []

    def register(self, plugin: Any, name: str | None = None) -> list[Backend]:
        """Register one plugin object or module and collect its backends; returns them.

        Raises nothing: a bad plugin is recorded in :attr:`broken`.
        """
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        try:
            self.pm.register(plugin, name=name)
        except Exception as exc:  # signature mismatch against the spec, duplicate name
            self.broken.append(BrokenPlugin(name, f"{type(exc).__name__}: {exc}"))
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
            except Exception as exc:
                self.broken.append(BrokenPlugin(name, f"mla_core_backends() raised {type(exc).__name__}: {exc}"))
                continue
            for backend in backends:
                if not isinstance(backend, Backend):
                    self.broken.append(BrokenPlugin(name, f"returned {backend!r}, not a mla_core.Backend"))
                elif backend.name in self.backends:
                    self.broken.append(BrokenPlugin(name, f"backend name {backend.name!r} is already taken"))
                else:
                    self.backends[backend.name] = backend
                    added.append(backend)
        return added

    def load_entry_points(self) -> None:
        """Load every plugin in the ``mla_core`` entry-point group, built-ins included."""
        for ep in sorted(importlib.metadata.entry_points(group=PROJECT), key=lambda e: e.name):
            if self.pm.has_plugin(ep.name) or any(b.name == ep.name for b in self.broken):
                continue
            try:
                plugin = ep.load()
            except Exception as exc:
                last = traceback.format_exception_only(type(exc), exc)[-1].strip()
                self.broken.append(BrokenPlugin(ep.name, f"import of {ep.value} failed: {last}"))
                continue
            self.register(plugin, name=ep.name)


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


def get_backend(name: str) -> Backend:
    """The backend called ``name``; an unknown name is an MLAInputError listing the known ones."""
    from .errors import MLAInputError
    try:
        return backends()[name]
    except KeyError:
        known = ", ".join(sorted(backends())) or "none"
        raise MLAInputError(f"backend: got {name!r}, which is not a loaded mla_core backend (known: {known})") from None


def register_plugin(plugin: Any, name: str | None = None) -> list[Backend]:
    """Register a plugin object or module at run time (what an entry point does at load)."""
    added = registry().register(plugin, name)
    _changed()
    return added
