"""The on-disk autotune cache: one human-readable JSON file per device (docs/autotune.md has the format).

Two places hold files named after the device (``NVIDIA_H200.json``, ``cpu.json``):

* the user cache, ``$MLA_CORE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``),
  written by tuning, ``mla-core warmup``, ``mla-core cache import`` and :func:`mla_core.autotune.sync`;
* the shipped cache, the ``autotune_cache/`` folder installed as package data, read only.

An entry is trusted only when every version it records (mla_core, backend, torch, triton, CUDA, device)
equals this process's; others are kept on disk but ignored. Writes take a file lock and replace the
file atomically after merging with what is on disk, so processes tuning at once lose nothing. A file
that is not valid JSON of this schema is reported, moved aside and treated as empty; a directory that
cannot be written degrades to an in-process store with one warning. Nothing read is ever executed.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import filelock
import torch

FORMAT = "mla_core-autotune"
SCHEMA = 1
ENV_DIR = "MLA_CORE_CACHE_DIR"
LOCK_TIMEOUT_S = 60.0

_lock = threading.Lock()
_parsed: dict[Path, tuple[tuple[int, int], dict[str, dict]]] = {}  # path -> ((mtime_ns, size), entries)
_unsaved: dict[tuple[str, str], dict[str, Any]] = {}  # (device name, key) -> entry a read-only dir could not take
_warned: set[str] = set()


class CacheWarning(UserWarning):
    """Something in the autotune cache was unusable (corrupt file, unwritable directory); mla_core carried on."""


def _warn_once(tag: str, message: str) -> None:
    if tag not in _warned:
        _warned.add(tag)
        warnings.warn(message, CacheWarning, stacklevel=3)


# --------------------------------------------------------------------------------------------------
# where and for what


def user_dir() -> Path:
    """``$MLA_CORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``."""
    explicit = os.environ.get(ENV_DIR)
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mla_core"


def shipped_dir() -> Path | None:
    """The installed ``autotune_cache`` folder (package data), or the source tree's when running from a checkout."""
    package = Path(__file__).resolve().parent.parent  # mla_core/
    for candidate in (package / "autotune_cache", package.parent / "autotune_cache"):
        if candidate.is_dir():
            return candidate
    return None


def device_name(device_type: str, index: int | None = None) -> str:
    """The name files and entries are kept under: the GPU's marketing name (``NVIDIA H200``), or ``cpu``."""
    if device_type == "cuda" and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.cuda.current_device() if index is None else index)
    return device_type


def file_name(device: str) -> str:
    """``NVIDIA H200`` -> ``NVIDIA_H200.json``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", device).strip("_") + ".json"


def _package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions(backend, device: str) -> dict[str, str | None]:
    """What an entry tuned now for ``backend`` on ``device`` records (and must match to be trusted later)."""
    from .. import __version__
    return {"mla_core": __version__, "backend": str(backend.version), "torch": torch.__version__,
            "triton": _package_version("triton"), "cuda": torch.version.cuda, "device": device}


# --------------------------------------------------------------------------------------------------
# reading


def _valid_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("backend"), str)
            and isinstance(entry.get("config"), dict) and isinstance(entry.get("versions"), dict))


def _parse(text: str) -> dict[str, dict]:
    """The entries of a cache file's text; ValueError when it is not this schema."""
    data = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise ValueError(f"not an mla_core autotune cache (needs an object with format={FORMAT!r} and 'entries')")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"schema {data.get('schema')!r}, this mla_core reads schema {SCHEMA}")
    return {k: v for k, v in data["entries"].items() if isinstance(k, str) and _valid_entry(v)}


def _move_aside(path: Path, reason: str) -> None:
    """Report a corrupt user-cache file and rename it so the next write starts clean (never raises)."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        with _file_lock(path):
            try:  # another process may have replaced it with a good file meanwhile
                _parse(path.read_text())
                return
            except (OSError, ValueError):
                pass
            os.replace(path, aside)
        where = f"moved aside to {aside.name}"
    except (OSError, filelock.Timeout) as exc:
        where = f"left in place ({type(exc).__name__}: {exc})"
    _warn_once(f"corrupt:{path}:{reason}", f"mla_core autotune cache {path} is unreadable ({reason}); {where}; "
                                           "continuing without it")


def read(path: Path, *, repair: bool = True) -> dict[str, dict]:
    """Entries of one cache file (empty when missing); a corrupt file is reported and, with ``repair``, moved aside."""
    try:
        st = path.stat()
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    with _lock:
        hit = _parsed.get(path)
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        entries = _parse(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # json.JSONDecodeError is a ValueError
        reason = f"{type(exc).__name__}: {exc}"
        if repair:
            _move_aside(path, reason)
        else:
            _warn_once(f"corrupt:{path}:{reason}", f"mla_core autotune cache {path} is unreadable ({reason}); ignored")
        return {}
    with _lock:
        _parsed[path] = (stamp, entries)
    return entries


def user_file(device: str) -> Path:
    return user_dir() / file_name(device)


def shipped_file(device: str) -> Path | None:
    folder = shipped_dir()
    return folder / file_name(device) if folder is not None else None


def user_entries(device: str) -> dict[str, dict]:
    """The user cache of ``device`` plus entries an unwritable directory kept in memory."""
    entries = dict(read(user_file(device)))
    entries.update({k: e for (d, k), e in _unsaved.items() if d == device})
    return entries


def shipped_entries(device: str) -> dict[str, dict]:
    path = shipped_file(device)
    return read(path, repair=False) if path is not None else {}


def is_current(entry: dict, backend, device: str) -> bool:
    """Whether ``entry`` was tuned with exactly this process's versions of everything and this ``backend``."""
    return entry.get("backend") == backend.name and entry.get("versions") == versions(backend, device)


# --------------------------------------------------------------------------------------------------
# writing


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with filelock.FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S):
        yield


def _write_atomic(path: Path, entries: dict[str, dict], device: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dump(device, entries))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(device: str, new: dict[str, dict]) -> bool:
    """Merge ``new`` entries (key -> entry) into the user cache of ``device``; True when they reached the disk.

    Takes the file lock, re-reads the file (moving a corrupt one aside), merges and replaces it
    atomically. When the directory cannot be written the entries stay in this process only and one
    warning says so.
    """
    if not new:
        return True
    path = user_file(device)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with _file_lock(path):
            try:
                on_disk = _parse(path.read_text()) if path.exists() else {}
            except (OSError, UnicodeDecodeError, ValueError) as exc:
                aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
                os.replace(path, aside)
                _warn_once(f"corrupt:{path}", f"mla_core autotune cache {path} was unreadable "
                                              f"({type(exc).__name__}: {exc}); moved aside to {aside.name}")
                on_disk = {}
            on_disk.update(new)
            _write_atomic(path, on_disk, device)
    except (OSError, filelock.Timeout) as exc:
        _warn_once(f"readonly:{path.parent}", f"mla_core autotune cache directory {path.parent} is not writable "
                                              f"({type(exc).__name__}: {exc}); tuned choices stay in memory for "
                                              f"this process (set {ENV_DIR} to a writable folder)")
        for key, entry in new.items():
            _unsaved[(device, key)] = entry
        return False
    for key in new:
        _unsaved.pop((device, key), None)
    return True


def clear(device: str | None = None) -> list[Path]:
    """Delete the user cache file of ``device`` (None: every device); returns the files removed."""
    folder = user_dir()
    paths = [user_file(device)] if device else sorted(folder.glob("*.json")) if folder.is_dir() else []
    removed = []
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            with _file_lock(path):
                path.unlink()
            removed.append(path)
        with contextlib.suppress(OSError):
            Path(str(path) + ".lock").unlink()
    for key in [k for k in _unsaved if device is None or k[0] == device]:
        del _unsaved[key]
    return removed


def devices() -> list[str]:
    """Device names with a user cache file (from each file's ``device`` field)."""
    folder = user_dir()
    names = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            data = json.loads(path.read_text())
            names.append(data["device"] if isinstance(data, dict) and isinstance(data.get("device"), str) else path.stem)
        except (OSError, ValueError):
            names.append(path.stem)
    return names


def load_export(text: str) -> tuple[str, dict[str, dict]]:
    """``(device, entries)`` of an exported cache file's text (ValueError when it is not one)."""
    entries = _parse(text)
    device = json.loads(text).get("device")
    if not isinstance(device, str) or not device:
        raise ValueError("the file names no device")
    return device, entries


def dump(device: str, entries: dict[str, dict]) -> str:
    """The JSON text of a cache file holding ``entries`` (what ``mla-core cache export`` writes)."""
    return json.dumps({"format": FORMAT, "schema": SCHEMA, "device": device,
                       "entries": {k: entries[k] for k in sorted(entries)}}, indent=1) + "\n"
