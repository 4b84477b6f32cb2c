"""The on-disk autotune cache: one human-readable JSON file per device (docs/autotune.md has the format).

Two places hold files named after the device (``NVIDIA_H200.json``, ``cpu.json``):

* the user cache, ``$MLA_CORE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``),
  written by tuning, ``mla-core warmup``, ``mla-core cache import`` and :func:`mla_core.autotune.sync`;
* the shipped cache, the ``autotune_cache/`` folder installed as package data, read only.

An entry is trusted only when every version it records (mla_core, backend, torch, triton, CUDA, device)
equals this process's; others are kept on disk but ignored (and dispatch also has the backend validate
the entry's config before using it). Writes take a file lock and replace the file atomically after
merging with what is on disk, so processes tuning at once lose nothing; the user folder is created
0700 and files 0600. A file is read only when it is a regular file of at most :data:`MAX_FILE_BYTES`,
owned by this user (or root) and not group/world-writable, in a folder that is neither: anything else
is ignored with a :class:`CacheWarning` (as ssh treats its keys). A user file that is not JSON of this
schema (truncated, garbage, too deep, too big, a FIFO, a symlink) is reported, moved aside and treated
as empty (a shipped file is only ignored, never moved); an entry that does not fit the schema (a
malformed key, a config that is not an object of plain values) is skipped. A directory that cannot be
written degrades to an in-process store with one warning. Nothing read is ever executed or unpickled.
"""
from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

import filelock
import torch

from .. import env
from ..problem import OPS, Problem

FORMAT = "mla_core-autotune"
SCHEMA = 1
ENV_DIR = env.CACHE_DIR
LOCK_TIMEOUT_S = 60.0
MAX_FILE_BYTES = 16 << 20
"""Largest cache file read (the shipped H200 file of 48 entries is ~100 KiB)."""
MAX_KEY_CHARS = 2048
DIR_MODE = 0o700
FILE_MODE = 0o600

_lock = threading.Lock()
_parsed: dict[Path, tuple[tuple[int, ...], dict[str, dict]]] = {}  # path -> (_stamp(stat), entries)
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
    """``$MLA_CORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``.

    Raises MLAInputError naming ``MLA_CORE_CACHE_DIR`` when it is set to a relative path.
    """
    explicit = env.cache_dir()
    if explicit is not None:
        return explicit
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


class Unreadable(ValueError):
    """A cache file that cannot be used; the message says why."""


def key_problem(key: Any) -> str | None:
    """Why ``key`` is not a well-formed problem key (``op|device|name=value|...`` as ``Problem.key()`` writes
    it), or None when it is one. Malformed keys are skipped on read and refused on import."""
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        return f"not a non-empty string of at most {MAX_KEY_CHARS} characters"
    if "|" not in key:
        return "has no '|' (needs op|device|name=value|...)"
    try:
        problem = Problem.from_key(key)
    except (ValueError, TypeError) as exc:
        return f"does not parse ({exc})"
    if problem.op not in OPS:
        return f"op {problem.op!r} is not one of {', '.join(OPS)}"
    if not re.fullmatch(r"[a-z][a-z0-9_]*", problem.device):
        return f"device type {problem.device!r} is not a device type name"
    if problem.key() != key:
        return f"is not in canonical form (expected {problem.key()!r})"
    return None


def _plain(value: Any, depth: int = 0) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return depth < 2 and isinstance(value, list) and all(_plain(v, depth + 1) for v in value)


def entry_problem(entry: Any) -> str | None:
    """Why ``entry`` does not fit the schema (docs/autotune.md), or None when it does."""
    if not isinstance(entry, dict):
        return f"is a {type(entry).__name__}, not an object"
    if not isinstance(entry.get("backend"), str) or not entry["backend"]:
        return "has no backend name"
    config = entry.get("config")
    if not isinstance(config, dict) or not all(isinstance(k, str) and _plain(v) for k, v in config.items()):
        return "config is not an object of plain values"
    versions = entry.get("versions")
    if not isinstance(versions, dict) or not all(isinstance(v, (str, type(None))) for v in versions.values()):
        return "versions is not an object of strings"
    return None


def _parse(text: str | bytes) -> tuple[dict[str, dict], dict[str, str]]:
    """``(entries, skipped)`` of a cache file's text: the usable entries, and why each other one was skipped.

    Raises :class:`Unreadable` when the text is not this schema (not JSON, nested too deep, wrong format).
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise Unreadable("JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:  # json.JSONDecodeError is a ValueError
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
        raise Unreadable(f"not an mla_core autotune cache (needs an object with format={FORMAT!r} and 'entries')")
    if data.get("schema") != SCHEMA:
        raise Unreadable(f"schema {data.get('schema')!r}, this mla_core reads schema {SCHEMA}")
    if "device" in data and not isinstance(data["device"], str):
        raise Unreadable("'device' is not a string")
    entries, skipped = {}, {}
    for key, entry in data["entries"].items():
        why = key_problem(key) or entry_problem(entry)
        if why:
            skipped[str(key)[:200]] = why
        else:
            entries[key] = entry
    return entries, skipped


def _trusted_owners() -> set[int]:
    """User ids that may own a cache file or folder mla_core reads: this user and root."""
    return {os.getuid(), 0}


def _untrusted(st: os.stat_result, what: str) -> str | None:
    """Why a file or folder with this ``stat`` may have been written by someone else (None: it cannot)."""
    if not hasattr(os, "getuid"):  # no POSIX owners (Windows): nothing to compare
        return None
    if st.st_uid not in _trusted_owners():
        return f"the {what} is owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"the {what} is group- or world-writable (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def folder_problem(folder: Path) -> str | None:
    """Why cache files in ``folder`` cannot be trusted (None when they can, or when it does not exist)."""
    try:
        st = folder.stat()
    except OSError:
        return None
    return _untrusted(st, f"folder {folder}")


class _Untrusted(Exception):
    """A cache file or its folder someone else could have written: ignored, never moved."""


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    """What must not change for a parsed file to be reused: contents (mtime, size, inode) and trust (mode, owner)."""
    return (st.st_mtime_ns, st.st_size, st.st_ino, st.st_mode, st.st_uid)


def _load(path: Path, *, follow_symlinks: bool) -> tuple[dict[str, dict], dict[str, str], tuple[int, ...]]:
    """``(entries, skipped, stamp)`` of one file; FileNotFoundError when missing.

    Opens without blocking (a FIFO never hangs) and, for user files, without following a symlink;
    only a regular file of at most :data:`MAX_FILE_BYTES`, trusted with its folder, is parsed.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if path.is_symlink():
            raise Unreadable("a symbolic link (cache files are read only as regular files)") from None
        raise Unreadable(f"{type(exc).__name__}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Unreadable("not a regular file")
        if st.st_size > MAX_FILE_BYTES:
            raise Unreadable(f"{st.st_size} bytes, over the {MAX_FILE_BYTES}-byte limit")
        why = _untrusted(st, "file") or folder_problem(path.parent)
        if why:
            raise _Untrusted(why)
        data = f.read(MAX_FILE_BYTES + 1)
    if len(data) > MAX_FILE_BYTES:
        raise Unreadable(f"over the {MAX_FILE_BYTES}-byte limit")
    entries, skipped = _parse(data)
    return entries, skipped, _stamp(st)


def _move_aside(path: Path, reason: str) -> None:
    """Report a corrupt user-cache file and rename it so the next write starts clean (never raises)."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    try:
        with _file_lock(path):
            try:  # another process may have replaced it with a good file meanwhile
                _load(path, follow_symlinks=False)
                return
            except (OSError, Unreadable, _Untrusted):
                pass
            os.replace(path, aside)  # renames a symlink itself, never its target
        where = f"moved aside to {aside.name}"
    except (OSError, filelock.Timeout) as exc:
        where = f"left in place ({type(exc).__name__}: {exc})"
    _warn_once(f"corrupt:{path}:{reason}", f"mla_core autotune cache {path} is unreadable ({reason}); {where}; "
                                           "continuing without it")


def read(path: Path, *, repair: bool = True) -> dict[str, dict]:
    """Entries of one cache file (empty when missing or unusable, with one CacheWarning saying why).

    ``repair`` (user files): a corrupt file is moved aside. Without it (shipped files) it is only
    ignored, and symlinks are followed (to a regular file, still size-capped).
    """
    try:
        st = os.stat(path, follow_symlinks=not repair)
    except OSError:
        return {}
    with _lock:
        hit = _parsed.get(path)
    if hit is not None and hit[0] == _stamp(st) and not folder_problem(path.parent):
        return hit[1]
    try:
        entries, skipped, stamp = _load(path, follow_symlinks=not repair)
    except FileNotFoundError:
        return {}
    except _Untrusted as exc:
        _warn_once(f"untrusted:{path}:{exc}", f"mla_core autotune cache {path} is ignored: {exc} (it must belong "
                                               "to you and be writable only by you, like its folder)")
        return {}
    except (OSError, Unreadable) as exc:
        reason = str(exc)
        if repair:
            _move_aside(path, reason)
        else:
            _warn_once(f"corrupt:{path}:{reason}", f"mla_core autotune cache {path} is unreadable ({reason}); ignored")
        return {}
    if skipped:
        first = next(iter(skipped.items()))
        _warn_once(f"skipped:{path}:{stamp}", f"mla_core autotune cache {path}: {len(skipped)} entries skipped "
                                              f"(e.g. key {first[0]!r}: {first[1]})")
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
    with filelock.FileLock(str(path) + ".lock", timeout=LOCK_TIMEOUT_S, mode=FILE_MODE):
        yield


def _write_atomic(path: Path, entries: dict[str, dict], device: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(dump(device, entries))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, FILE_MODE)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def store(device: str, new: dict[str, dict]) -> bool:
    """Merge ``new`` entries (key -> entry) into the user cache of ``device``; True when they reached the disk.

    Takes the file lock, re-reads the file (moving a corrupt one aside), merges and replaces it
    atomically. When the directory cannot be written, or could be written by someone else (group- or
    world-writable, another owner: its files are never read), the entries stay in this process only
    and one warning says so. Entries with a malformed key or schema are dropped.
    """
    why = {k: key_problem(k) or entry_problem(e) for k, e in new.items()}
    dropped = [(k, reason) for k, reason in why.items() if reason]
    if dropped:
        warnings.warn(f"mla_core autotune cache: {len(dropped)} entries not stored (e.g. key {str(dropped[0][0])[:200]!r}:"
                      f" {dropped[0][1]})", CacheWarning, stacklevel=2)
        new = {k: e for k, e in new.items() if not why[k]}
    if not new:
        return True
    path = user_file(device)
    try:
        path.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        why = folder_problem(path.parent)
        if why:
            raise PermissionError(f"{why}; mla_core neither reads nor writes cache files there")
        with _file_lock(path):
            try:
                on_disk = _load(path, follow_symlinks=False)[0]
            except FileNotFoundError:
                on_disk = {}
            except (OSError, Unreadable, _Untrusted) as exc:
                aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
                os.replace(path, aside)
                _warn_once(f"corrupt:{path}", f"mla_core autotune cache {path} was unusable ({exc}); moved aside "
                                              f"to {aside.name}")
                on_disk = {}
            on_disk.update(new)
            _write_atomic(path, on_disk, device)
    except (OSError, filelock.Timeout) as exc:
        _warn_once(f"readonly:{path.parent}", f"mla_core autotune cache directory {path.parent} is not writable "
                                              f"({type(exc).__name__}: {exc}); tuned choices stay in memory for "
                                              f"this process (set {ENV_DIR} to a folder of your own)")
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
        name = path.stem
        with contextlib.suppress(OSError, ValueError, RecursionError):
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as f:
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    head = f.read(MAX_FILE_BYTES + 1)
                    data = json.loads(head) if len(head) <= MAX_FILE_BYTES else None
                    if isinstance(data, dict) and isinstance(data.get("device"), str):
                        name = data["device"]
        names.append(name)
    return names


def load_export(text: str | bytes) -> tuple[str, dict[str, dict], dict[str, str]]:
    """``(device, entries, skipped)`` of an exported cache file's text (:class:`Unreadable`, a ValueError, when
    it is not one); ``skipped`` maps each entry that does not fit the schema to why."""
    if len(text) > MAX_FILE_BYTES:
        raise Unreadable(f"over the {MAX_FILE_BYTES}-byte limit")
    entries, skipped = _parse(text)
    device = json.loads(text).get("device")
    if not isinstance(device, str) or not device:
        raise Unreadable("the file names no device")
    return device, entries, skipped


def dump(device: str, entries: dict[str, dict]) -> str:
    """The JSON text of a cache file holding ``entries`` (what ``mla-core cache export`` writes)."""
    return json.dumps({"format": FORMAT, "schema": SCHEMA, "device": device,
                       "entries": {k: entries[k] for k in sorted(entries)}}, indent=1) + "\n"
