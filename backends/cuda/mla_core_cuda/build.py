"""Build the CUDA C++ sources in ``csrc/`` on first use (ninja via ``torch.utils.cpp_extension``).

The extension lands in ``<cache>/build/<key>/`` where ``<cache>`` is ``$MLA_CORE_CACHE_DIR``, else
``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``; the folders this module creates are mode 0700
and a build folder that is group/world-writable or owned by another user is refused (a module loaded from
it would run as this user). ``key`` hashes everything that changes the binary: the sources, the compiler
flags, the target architecture, and the torch, CUDA and nvcc versions, so a stale build is never loaded.
A file lock serializes concurrent first use (one process per GPU); the others wait and load the result.

A failed build raises :class:`BuildError` carrying the compiler's first error line; the backend turns
it into its "unavailable" reason instead of crashing, and remembers it for the process.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import filelock

ARCH = "sm_90a"
"""The one target the kernels are written for: the WGMMA decode (mla_decode_wgmma*.cu), mla_sparse_wgmma.cu,
mla_prefill_wgmma.cu and mla_prefill_fp8.cu need sm_90a's wgmma (they refuse to compile for anything else); the
mma.sync kernel runs on it too."""
CUDA_FLAGS = ("-O3", "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo")
CXX_FLAGS = ("-O3",)
SOURCES = ("bindings.cpp", "mla_decode.cu", "mla_decode_bf16.cu", "mla_decode_fp16.cu", "mla_decode_wgmma.cu",
           *(f"mla_decode_wgmma_{t}_{kv}.cu" for t in ("bf16", "fp16")
             for kv in ("kv", "kv_fp8", "cache_fp8", "ring4")),
           "mla_sparse_wgmma.cu", "mla_prefill_wgmma.cu", "mla_prefill_persistent.cu", "mla_prefill_fp8.cu",
           "mla_prefill_nvfp4.cu", "mla_layer_prep.cu")
"""The translation units, compiled in parallel by ninja (``MAX_JOBS``, else ninja's default: the CPU count + 2; the
longest first). The decode kernels' instances are spread over several of them (csrc/mla_decode_mma.cuh: 8 kernels
over 2 units, csrc/mla_decode_wgmma.cuh: 24 over 9) so no unit holds the build's critical path alone
(benchmarks/NOTES.md, "CUDA build split for the TP 8 warm-up")."""
HEADERS = ("mla_decode.h", "mla_decode_split.cuh", "qdq.cuh", "mla_decode_mma.cuh", "mla_decode_wgmma.cuh",
           "mla_sparse.h", "mla_prefill.h", "mla_prefill_common.cuh", "mla_prefill_wgmma.cuh", "hopper.cuh",
           "seesaw.cuh", "mla_layer_prep.h")
PRE_SPLIT_SOURCES = ("mla_decode.cu", "mla_decode_wgmma.cu", "mla_sparse_wgmma.cu", "mla_prefill_wgmma.cu",
                     "mla_prefill_fp8.cu", "bindings.cpp")
"""The translation units of a csrc/ from before the split (no mla_decode_wgmma.cuh): an A/B harness's base snapshot
built through ``MLA_CORE_CUDA_SRC`` may be one (:func:`layout`)."""
LAYER_PREP_FILES = ("mla_layer_prep.cu", "mla_layer_prep.h")
"""The fused layer's decode prep (round m): a split csrc/ from before it (main's, as an A/B base) lacks these two files
and is built without them (its bindings have no ``layer_decode``: the layer then keeps the Triton prep)."""
PERSISTENT_PREFILL_FILES = ("mla_prefill_persistent.cu", "mla_prefill_wgmma.cuh")
"""The persistent bf16 prefill (round n, wip/ppers): a csrc/ from before it (an A/B base) lacks these two files and is
built without them (its binding has no ``work_counter``)."""
RING4_FILES = ("mla_decode_wgmma_bf16_ring4.cu", "mla_decode_wgmma_fp16_ring4.cu")
"""The WGMMA decode's four-slot ring (config ring4, round p): a csrc/ from before it (an A/B base) lacks these two units
and is built without them (its launcher never calls launch_decode_wgmma_ring4)."""
OPTIONAL_FILES = (LAYER_PREP_FILES, PERSISTENT_PREFILL_FILES, RING4_FILES)
"""Groups of files a split csrc/ may lack whole (each a later addition)."""
LOCK_TIMEOUT_S = 900.0
"""Longest wait for another process's build (a cold build takes 16 s on 16 cores, minutes on a few)."""

_LOADED: dict[str, object] = {}
_FAILED: dict[str, str] = {}
_DEFAULT_KEY: str | None = None


class BuildError(RuntimeError):
    """The extension could not be built; ``str()`` is the compiler's first error line (or the cause)."""


def source_dir() -> Path:
    """``$MLA_CORE_CUDA_SRC`` (a developer's or mutation test's copy of csrc/), else ``csrc/`` of the source
    tree (editable install / checkout), else the copy installed as package data."""
    here = Path(__file__).resolve().parent
    override = os.environ.get("MLA_CORE_CUDA_SRC")
    candidates = [Path(override)] if override else [here.parents[2] / "csrc", here / "csrc"]
    for candidate in candidates:
        if layout(candidate) is not None:
            return candidate
    if override:
        raise BuildError(f"CUDA sources not found in MLA_CORE_CUDA_SRC={override}")
    raise BuildError(f"CUDA sources not found (looked for {', '.join(SOURCES)} in {here.parents[2] / 'csrc'} "
                     f"and {here / 'csrc'})")


def layout(directory: Path) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """(translation units, headers) of the csrc/ folder ``directory``, None when it is not one: SOURCES and HEADERS
    less any group of OPTIONAL_FILES the copy lacks whole, or for a copy from before the decode kernels' split (no
    mla_decode_wgmma.cuh) PRE_SPLIT_SOURCES and the headers it has of HEADERS, so an A/B against an older snapshot
    still builds."""
    absent = {name for group in OPTIONAL_FILES if not any((directory / n).exists() for n in group) for name in group}
    if all((directory / name).is_file() for name in SOURCES + HEADERS if name not in absent):
        return tuple(n for n in SOURCES if n not in absent), tuple(n for n in HEADERS if n not in absent)
    if (not (directory / "mla_decode_wgmma.cuh").exists()
            and all((directory / name).is_file() for name in PRE_SPLIT_SOURCES)):
        return PRE_SPLIT_SOURCES, tuple(name for name in HEADERS if (directory / name).is_file())
    return None


def cache_root() -> Path:
    """``$MLA_CORE_CACHE_DIR``, else ``$XDG_CACHE_HOME/mla_core``, else ``~/.cache/mla_core``."""
    explicit = os.environ.get("MLA_CORE_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "mla_core"


def nvcc_path() -> str | None:
    """The nvcc torch's extension builder will run (``$CUDA_HOME/bin/nvcc``), else the one on PATH."""
    from torch.utils import cpp_extension
    home = cpp_extension.CUDA_HOME
    if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK):
        return os.path.join(home, "bin", "nvcc")
    return shutil.which("nvcc")


def _nvcc_version() -> str:
    nvcc = nvcc_path()
    if nvcc is None:
        return "none"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    match = re.search(r"release [\d.]+, V[\d.]+", out)
    if match:
        return match.group(0)
    lines = out.strip().splitlines()
    return lines[-1] if lines else "unknown"


def build_key(sources: dict[str, bytes] | None = None, *, torch_version: str | None = None,
              cuda_version: str | None = None, nvcc_version: str | None = None) -> str:
    """16 hex digits naming one build: sources + flags + arch + torch, CUDA and nvcc versions.

    Arguments default to the real sources and this machine's versions (tests pass their own).
    """
    global _DEFAULT_KEY
    import torch
    default = sources is None and torch_version is None and cuda_version is None and nvcc_version is None
    if default and _DEFAULT_KEY is not None:
        return _DEFAULT_KEY
    if sources is None:
        src = source_dir()
        units, headers = layout(src)
        sources = {name: (src / name).read_bytes() for name in units + headers}
    h = hashlib.sha256()
    for name in sorted(sources):
        h.update(name.encode() + b"\0" + hashlib.sha256(sources[name]).digest())
    parts = ("flags", *CUDA_FLAGS, "cxx", *CXX_FLAGS, "arch", ARCH,
             "torch", torch_version if torch_version is not None else torch.__version__,
             "cuda", cuda_version if cuda_version is not None else str(torch.version.cuda),
             "nvcc", nvcc_version if nvcc_version is not None else _nvcc_version(),
             "python", f"{sys.version_info.major}.{sys.version_info.minor}")
    h.update("\0".join(parts).encode())
    key = h.hexdigest()[:16]
    if default:  # sources and toolchain do not change under a running process: hash once
        _DEFAULT_KEY = key
    return key


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) with mode 0700; refuse one another user owns or others can write."""
    missing = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise BuildError(f"{path} is not a directory")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise BuildError(f"{path} belongs to another user (uid {st.st_uid}); refusing to build or load there")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise BuildError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                         "refusing to build or load there (chmod 700 it)")
    return path


def build_dir(key: str | None = None) -> Path:
    """``<cache>/build/<key>``, created private (0700)."""
    root = private_dir(cache_root())
    return private_dir(private_dir(root / "build") / (key or build_key()))


_ERROR_LINE = re.compile(r"(\berror\b|fatal)", re.IGNORECASE)


def first_error(log: str) -> str:
    """The compiler's first error line in a build log (ninja's ``FAILED:`` lines skipped), else its first line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    for line in lines:
        if _ERROR_LINE.search(line) and not line.startswith(("FAILED:", "ninja:", "Error building extension", "[")):
            return line[:500]
    return (lines[0] if lines else "build failed with no output")[:500]


def _module_name(key: str) -> str:
    return f"mla_core_cuda_ext_{key}"


def _load_built(directory: Path, name: str):
    """Import an already-built extension from ``directory`` (None when it is not there)."""
    candidates = sorted(directory.glob(f"{name}*.so"))
    if not candidates:
        return None
    import torch  # noqa: F401  (the extension links against libtorch: load it first)
    spec = importlib.util.spec_from_file_location(name, candidates[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build(verbose: bool = False, *, force: bool = False):
    """Build (or load the cached build of) the extension module and return it.

    Prints a progress line to stderr while a build runs. ``force`` rebuilds even when a build of this key
    exists. Raises :class:`BuildError` with the compiler's first error line when the build fails.
    """
    key = build_key()
    if key in _LOADED and not force:
        return _LOADED[key]
    if key in _FAILED and not force:  # torch's loader would not retry a failed build in this process either
        raise BuildError(_FAILED[key])
    directory = build_dir(key)
    name = _module_name(key)
    with filelock.FileLock(str(directory / "build.lock"), timeout=LOCK_TIMEOUT_S):
        module = None if force else _load_built(directory, name)
        if module is None:
            try:
                module = _compile(directory, name, verbose)
            except BuildError as exc:
                _FAILED[key] = str(exc)
                raise
    _LOADED[key] = module
    _FAILED.pop(key, None)
    return module


def _compile(directory: Path, name: str, verbose: bool):
    from torch.utils import cpp_extension
    if nvcc_path() is None:
        raise BuildError("nvcc not found (set CUDA_HOME or put nvcc on PATH)")
    src = source_dir()
    print(f"mla_core: building the CUDA kernels for {ARCH} into {directory} (16 s on 16 cores, minutes on a few; "
          "once per version)...", file=sys.stderr, flush=True)
    start = time.monotonic()
    try:
        module = cpp_extension.load(
            name=name, sources=[str(src / s) for s in layout(src)[0]], extra_cflags=list(CXX_FLAGS),
            extra_cuda_cflags=list(CUDA_FLAGS), extra_include_paths=[str(src)], build_directory=str(directory),
            verbose=False, with_cuda=True)  # quiet: the compiler's output then rides in the exception
    except Exception as exc:  # RuntimeError from ninja, OSError, ...
        log = str(exc)
        (directory / "build_error.log").write_text(log)
        if verbose:
            print(log, file=sys.stderr)
        raise BuildError(first_error(log)) from exc
    print(f"mla_core: CUDA kernels built in {time.monotonic() - start:.0f} s", file=sys.stderr, flush=True)
    if verbose:
        print(f"mla_core: ninja file {directory / 'build.ninja'}", file=sys.stderr)
    return module


def load_or_reason():
    """(module, None) when the extension builds or loads; (None, reason) when it does not (remembered per key)."""
    try:
        key = build_key()
    except BuildError as exc:
        return None, str(exc)
    try:
        return build(), None
    except (BuildError, filelock.Timeout, OSError) as exc:
        return None, f"build failed: {exc}"
