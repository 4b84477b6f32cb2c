"""``mla-core warmup`` and ``mla-core cache show|clear|export|import``: the autotuner's commands.

:func:`add_parsers` adds them to the ``mla-core`` subparsers; each handler takes the parsed args and
returns the exit code.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import sys
import tempfile
from pathlib import Path

import torch

from .. import plugins
from ..autotune import cache, precompile, tuner, warmup
from ..errors import MLAInputError
from ..problem import Problem
from .table import table as _table_rows
from .args import int_list, name_list, split_list

NO_GPU = ("mla-core warmup: no CUDA GPU is visible, so there is nothing to tune on. Run it on the machine that will "
          "serve the model, or pass --device cpu to tune the CPU backends (useful for tests).")


def _current_device_name(explicit: str | None) -> str:
    if explicit:
        return explicit
    return cache.device_name("cuda" if torch.cuda.is_available() else "cpu")


# --------------------------------------------------------------------------------------------------
# warmup


def cmd_warmup(args) -> int:
    device = args.device or ("cuda" if torch.cuda.is_available() else None)
    if device is None or (device == "cuda" and not torch.cuda.is_available()):
        print(NO_GPU, file=sys.stderr)
        return 2
    grid = warmup.Grid(model=args.model, tp=args.tp, recipes=args.recipes, ops=args.ops, batches=args.batch,
                       lengths=args.lengths, prefill_lengths=args.prefill_lengths,
                       prefill_cached=args.prefill_cached, num_kv_splits=args.num_kv_splits,
                       heads=args.heads, page_size=args.page_size, device=device)
    problems = warmup.preset_problems(grid)
    rank = int(os.environ.get("RANK", "0"))

    def progress(items):
        if args.no_progress or rank != 0:
            return items
        from tqdm import tqdm
        return tqdm(items, desc="mla-core warmup", unit="shape", file=sys.stderr)

    jobs = args.compile_jobs
    if jobs is None:
        jobs = precompile.default_jobs() if device == "cuda" else 0

    def message(text):
        if rank == 0 and not args.json:
            print(f"mla-core warmup: {text}", file=sys.stderr, flush=True)

    rows, wall = warmup.timed_run(problems, force=args.force, progress=progress, repeats=args.repeats,
                                  compile_jobs=jobs, message=message, timing=args.timing)
    agree = warmup.ranks_agree(problems)
    warmup.close_process_group()
    if rank != 0:
        return 0 if all(r.status != "failed" for r in rows) else 1
    dev_name = cache.device_name(device)
    if args.json:
        print(json.dumps({"device": dev_name, "wall_s": round(wall, 2), "cache_file": str(cache.user_file(dev_name)),
                          "ranks_agree": agree, "problems": [r.as_dict() for r in rows]}, indent=2))
    else:
        header, table = warmup.summary(rows)
        print(_table_rows(table, header))
        counts = {s: sum(r.status == s for r in rows) for s in ("tuned", "cached", "failed")}
        print(f"\n{len(rows)} shapes on {dev_name} in {wall:.1f} s: {counts['tuned']} tuned, {counts['cached']} already "
              f"cached, {counts['failed']} failed; cache: {cache.user_file(dev_name)}")
        if agree is not None:
            print(f"all ranks dispatch these shapes identically: {'yes' if agree else 'NO'}")
    return 0 if all(r.status != "failed" for r in rows) else 1


# --------------------------------------------------------------------------------------------------
# cache


def _entry_row(key: str, entry: dict, dev_name: str) -> dict:
    from ..plugins import backends
    backend = backends().get(entry.get("backend"))
    current = backend is not None and cache.is_current(entry, backend, dev_name)
    return {"problem": key, "backend": entry.get("backend"), "config": entry.get("config"), "us": entry.get("us"),
            "timing": entry.get("timing"), "speedup_over_default": entry.get("speedup"), "current": current,
            "versions": entry.get("versions"), "tuned_at": entry.get("tuned_at")}


def cmd_cache_show(args) -> int:
    try:
        devices = [args.device] if args.device else cache.devices()
        report = {"cache_dir": str(cache.user_dir()), "autotune": tuner.mode(), "devices": {}}
    except MLAInputError as exc:  # a bad MLA_CORE_* variable
        return _fail("show", str(exc))
    for dev_name in devices:
        entries = cache.user_entries(dev_name)
        report["devices"][dev_name] = {"file": str(cache.user_file(dev_name)),
                                       "entries": [_entry_row(k, e, dev_name) for k, e in sorted(entries.items())]}
        if args.shipped:
            shipped = cache.shipped_entries(dev_name)
            report["devices"][dev_name]["shipped"] = [_entry_row(k, e, dev_name) for k, e in sorted(shipped.items())]
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"autotune cache {report['cache_dir']} (MLA_CORE_AUTOTUNE={report['autotune']})")
    if not devices:
        print("no cached choices yet (run `mla-core warmup`)")
    for dev_name, info in report["devices"].items():
        for label, rows in (("user", info["entries"]), ("shipped", info.get("shipped"))):
            if rows is None:
                continue
            print(f"\n{dev_name} ({label}: {len(rows)} entries)")
            if rows:
                print(_table_rows([[r["problem"], r["backend"], json.dumps(r["config"], sort_keys=True),
                                    warmup.us_cell(r["us"], r["timing"]),
                                    "-" if not r["speedup_over_default"] else f"{r['speedup_over_default']:.2f}x",
                                    "current" if r["current"] else "stale (other versions: ignored)"] for r in rows],
                                  ["problem", "backend", "config", "us", "vs default", "status"]))
    return 0


def cmd_cache_clear(args) -> int:
    removed = cache.clear(args.device)
    if args.json:
        print(json.dumps({"removed": [str(p) for p in removed]}, indent=2))
    else:
        print("\n".join(f"removed {p}" for p in removed) or f"nothing to clear in {cache.user_dir()}")
    return 0


def _fail(action: str, message: str, code: int = 2) -> int:
    print(f"mla-core cache {action}: {message}", file=sys.stderr)
    return code


def cmd_cache_export(args) -> int:
    """Write one device's user cache to a file: never over an existing file without ``--force``, never through
    a symlink (``--force`` replaces the link itself), atomically (a temporary file renamed over the target)."""
    try:
        dev_name = _current_device_name(args.device)
        entries = cache.user_entries(dev_name)
    except MLAInputError as exc:
        return _fail("export", str(exc))
    if not entries:
        return _fail("export", f"no cached choices for {dev_name!r} in {cache.user_dir()} (nothing written)", 1)
    text = cache.dump(dev_name, entries)
    if args.path == "-":
        sys.stdout.write(text)
        return 0
    target = Path(args.path)
    folder = target.parent
    if not folder.is_dir():
        return _fail("export", f"folder {str(folder)!r} does not exist")
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        return _fail("export", f"cannot inspect {args.path}: {exc.strerror or exc}")
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            return _fail("export", f"{args.path} is a folder; give a file name, e.g. {target / cache.file_name(dev_name)}")
        if not args.force:
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "an existing file"
            return _fail("export", f"{args.path} is {kind}; pass --force to replace it")
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            return _fail("export", f"{args.path} is not a regular file; refusing to replace it")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.chmod(tmp, 0o644)  # an export is meant to be shared (e.g. autotune_cache/)
            os.replace(tmp, target)  # replaces a symlink itself, never writes through it
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except OSError as exc:
        return _fail("export", f"cannot write {args.path}: {exc.strerror or exc}")
    if args.json:
        print(json.dumps({"device": dev_name, "path": args.path, "entries": len(entries)}))
    else:
        print(f"exported {len(entries)} entries of {dev_name} to {args.path}")
    return 0


def _read_import(path: str) -> bytes:
    """The bytes of an import file: stdin, or a regular file of at most the cache's size cap (no FIFO hangs)."""
    if path == "-":
        data = sys.stdin.buffer.read(cache.MAX_FILE_BYTES + 1)
    else:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise cache.Unreadable("not a regular file")
            data = f.read(cache.MAX_FILE_BYTES + 1)
    if len(data) > cache.MAX_FILE_BYTES:
        raise cache.Unreadable(f"over the {cache.MAX_FILE_BYTES}-byte limit")
    return data


def import_problems(key: str, entry: dict) -> list[str]:
    """Why an imported entry must not enter the cache: its backend, loaded here, refuses its config."""
    backend = plugins.backends().get(entry["backend"])
    if backend is None:
        return []  # not loaded here: checked by its backend when (if) it is ever used
    return plugins.validate_config(backend, Problem.from_key(key), entry["config"])


def cmd_cache_import(args) -> int:
    """Merge an exported file into the user cache; entries with a malformed key or schema, or a config their
    backend refuses, are rejected (listed on stderr, exit 1); the others are imported."""
    try:
        dev_name, entries, skipped = cache.load_export(_read_import(args.path))
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        return _fail("import", f"{args.path} is not an mla_core autotune cache file ({reason})")
    rejected = dict(skipped)
    for key, entry in list(entries.items()):
        why = import_problems(key, entry)
        if why:
            rejected[key] = "; ".join(why)
            del entries[key]
    for key, why in rejected.items():
        print(f"mla-core cache import: rejected {key!r}: {why}", file=sys.stderr)
    try:
        written = cache.store(dev_name, entries)
        file = cache.user_file(dev_name)
    except MLAInputError as exc:
        return _fail("import", str(exc))
    if args.json:
        print(json.dumps({"device": dev_name, "entries": len(entries), "rejected": len(rejected), "file": str(file),
                          "written": written}))
    else:
        print(f"imported {len(entries)} entries for {dev_name} into {file}"
              + (f"; rejected {len(rejected)}" if rejected else "")
              + ("" if written else " (directory not writable: kept in memory only)"))
    return 0 if written and not rejected else 1


# --------------------------------------------------------------------------------------------------


def add_parsers(subparsers) -> None:
    """Add ``warmup`` and ``cache`` to the ``mla-core`` subparsers (handlers in ``func``, returning an exit code)."""
    p = subparsers.add_parser(
        "warmup", help="tune a model's shapes ahead of time and fill the autotune cache",
        description="Tunes every (backend, config) for a model's decode / prefill / merge shapes and records the "
                    "fastest correct one in the autotune cache, then prints a table (shape, winner, runner-up, "
                    "speed-up over the priority default). Under torchrun the ranks split the shapes and share "
                    "the results. Needs a GPU unless --device cpu is given.")
    p.add_argument("--model", default="deepseek-v3", choices=sorted(warmup.MODELS), help="model preset")
    p.add_argument("--tp", type=int_list, default=(8,), help="tensor-parallel sizes, e.g. 8 or 1,2,4,8 (heads = 128/tp)")
    p.add_argument("--heads", type=int_list, help="explicit head counts (instead of --tp)")
    p.add_argument("--recipes", type=name_list(tuple(warmup.RECIPES)), default=tuple(warmup.RECIPES),
                   help="quant recipes: bf16, fp8, nvfp4 (decode: K/V/P fake-quantized; prefill: Q/K/V/P); default all")
    p.add_argument("--ops", type=name_list(warmup.OPS), default=warmup.OPS, help="ops to tune (default decode,prefill,merge)")
    p.add_argument("--batch", type=int_list, help="decode batch sizes (default: the preset's grid)")
    p.add_argument("--lengths", type=int_list, help="decode KV lengths (default: the preset's grid)")
    p.add_argument("--prefill-lengths", type=int_list, help="prefill / merge token counts (default: the preset's grid)")
    p.add_argument("--prefill-cached", type=int_list,
                   help="cached tokens before each prefill chunk, 0 = a fresh prompt (default: the preset's, 0,12288)")
    p.add_argument("--num-kv-splits", type=split_list, default=(32,),
                   help="decode split counts the model passes (default 32, the API default; 'auto' lets the tuner pick)")
    p.add_argument("--page-size", type=int, help="KV cache page size (default: the preset's, 64)")
    p.add_argument("--device", choices=("cuda", "cpu"), help="where to tune (default cuda; cpu only when asked)")
    p.add_argument("--force", action="store_true", help="re-tune shapes already in the cache")
    p.add_argument("--repeats", type=int, default=7, help="timed repeats per candidate (median kept)")
    p.add_argument("--timing", choices=tuner.TIMINGS, default=None,
                   help="how candidates are timed on a GPU: auto (replays of a CUDA graph of the calls, as serving "
                        "engines run decode; eager calls for a candidate that cannot be captured), graph (a "
                        "candidate that cannot be captured fails), eager (Python calls back to back: includes "
                        "host overhead). Default: $MLA_CORE_TUNE_TIMING, else auto. The us columns say which")
    p.add_argument("--compile-jobs", type=int, default=None, metavar="N",
                   help="processes that compile every candidate kernel before the timing (default on a GPU: "
                        f"three quarters of the CPUs, at most {precompile.MAX_JOBS}; 0 or 1: compile while timing)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=cmd_warmup)

    p = subparsers.add_parser("cache", help="show, clear, export or import the autotune cache",
                              description="The autotune cache: one JSON file per device under $MLA_CORE_CACHE_DIR "
                                          "(default $XDG_CACHE_HOME/mla_core or ~/.cache/mla_core).")
    actions = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    a = actions.add_parser("show", help="list cached choices (stale entries from other versions are marked)")
    a.add_argument("--device", help="device name, e.g. 'NVIDIA H200' or cpu (default: every cached device)")
    a.add_argument("--shipped", action="store_true", help="also list the choices shipped with mla_core")
    a.add_argument("--json", action="store_true", help="print machine-readable JSON")
    a.set_defaults(func=cmd_cache_show)
    a = actions.add_parser("clear", help="delete the user cache (one device or all)")
    a.add_argument("--device", help="device name (default: every device)")
    a.add_argument("--json", action="store_true", help="print machine-readable JSON")
    a.set_defaults(func=cmd_cache_clear)
    a = actions.add_parser("export", help="write one device's cache to a file (e.g. autotune_cache/NVIDIA_H200.json)")
    a.add_argument("path", help="output file, or - for stdout")
    a.add_argument("--device", help="device name (default: this machine's GPU, else cpu)")
    a.add_argument("--force", action="store_true", help="replace an existing file (or symlink: the link itself)")
    a.add_argument("--json", action="store_true", help="print a machine-readable summary")
    a.set_defaults(func=cmd_cache_export)
    a = actions.add_parser("import", help="merge an exported cache file into the user cache")
    a.add_argument("path", help="a file written by `mla-core cache export`, or - for stdin")
    a.add_argument("--json", action="store_true", help="print a machine-readable summary")
    a.set_defaults(func=cmd_cache_import)
