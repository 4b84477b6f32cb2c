"""Mutation check: apply one plausible one-line bug at a time and see the tests notice it.

Every ``tests/mutation/mutants_*.py`` holds ``MUTANTS = [dict(file=..., old=..., new=..., tests=[...], why=...)]``:
``file`` is a path from the repository root, ``old`` text that occurs exactly once in it, ``new`` its
replacement (the bug), ``tests`` the pytest arguments that must fail with it (paths, ``path::test``, or
``"path -k expr"``), ``why`` what a test must notice. Optional ``gpu=True``: the tests need a CUDA device
(reported as not run elsewhere).

The repository is never touched: each worker copies the working tree (tracked files and untracked ones git
does not ignore, so uncommitted edits are included) into a temporary folder, puts that copy first on
``PYTHONPATH`` (the installed entry points then import the copy's backends), and applies each mutant there,
restoring the file after the run. Before the mutants, every distinct test selection runs once unmutated:
a selection that fails already cannot judge a mutant (reported as ERROR, never as killed).

    python3 tests/mutation/run.py                 # every mutant, one worker
    python3 tests/mutation/run.py --list          # what there is
    python3 tests/mutation/run.py --only numerics # ids or files containing "numerics" (fnmatch if * ? [)
    python3 tests/mutation/run.py -j 2 --timeout 300

Prints KILLED / SURVIVED / ERROR / NOT RUN per mutant and ``killed K / T``; exits 1 when a mutant survived
or could not be judged, 0 when every judged mutant was killed.
"""
from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import os
import queue
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
# source folders an editable install maps to import names (pyproject's package-dir): first on PYTHONPATH
SOURCE_PATHS = (".", "backends/reference", "backends/triton", "backends/cuda", "backends/musa_fp8", "backends/cudnn")
PACKAGES = ("mla_core", "mla_core_reference", "mla_core_triton")


@dataclass
class Mutant:
    id: str
    file: str
    old: str
    new: str
    tests: list[str]
    why: str
    gpu: bool = False
    problems: list[str] = field(default_factory=list)

    def pytest_args(self) -> list[str]:
        return [a for t in self.tests for a in shlex.split(t)]


def load_mutants(root: Path = ROOT) -> list[Mutant]:
    """Every mutant of every ``mutants_*.py``, checked: its file exists and ``old`` occurs exactly once."""
    out = []
    for path in sorted(HERE.glob("mutants_*.py")):
        area = path.stem[len("mutants_"):]
        spec = importlib.util.spec_from_file_location(f"_mutants_{area}", path)
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
            entries = list(module.MUTANTS)
        except Exception as exc:  # a broken list is reported, the others still run
            m = Mutant(f"{area}#?", str(path.relative_to(root)), "", "", [], "")
            m.problems.append(f"cannot load {path.name}: {type(exc).__name__}: {exc}")
            out.append(m)
            continue
        for i, entry in enumerate(entries, 1):
            m = Mutant(f"{area}#{i}", entry.get("file", ""), entry.get("old", ""), entry.get("new", ""),
                       list(entry.get("tests", [])), entry.get("why", ""), bool(entry.get("gpu", False)))
            # new may be "" (a deleted line); everything else must be there and non-empty
            missing = [k for k in ("file", "old", "new", "tests", "why")
                       if entry.get(k) is None or (k != "new" and not entry.get(k))]
            if missing:
                m.problems.append(f"missing {', '.join(missing)}")
            elif m.old == m.new:
                m.problems.append("new equals old")
            else:
                target = root / m.file
                if not target.is_file():
                    m.problems.append(f"{m.file} does not exist")
                else:
                    n = target.read_text().count(m.old)
                    if n != 1:
                        m.problems.append(f"old occurs {n} times in {m.file}, needs exactly once")
            out.append(m)
    return out


def select(mutants: list[Mutant], pattern: str | None) -> list[Mutant]:
    if not pattern:
        return mutants
    if any(c in pattern for c in "*?["):
        return [m for m in mutants if any(fnmatch.fnmatch(s, pattern) for s in (m.id, m.file))]
    return [m for m in mutants if pattern in m.id or pattern in m.file]


def copy_tree(dest: Path) -> None:
    """The working tree's tracked and non-ignored untracked files (as they are now) into ``dest``."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def environment(copy: Path) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(copy / p) for p in SOURCE_PATHS]
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # no stale bytecode of a mutated file
    env["MLA_CORE_CACHE_DIR"] = str(copy / ".mutation_cache")
    env["MLA_CORE_FUZZ_NO_SHRINK"] = "1"  # a failing fuzz example kills the mutant; no need to minimize it
    env.pop("MLA_CORE_CHECKS", None)
    env.pop("MLA_CORE_BACKEND", None)
    return env


def check_imports(copy: Path, env: dict[str, str]) -> str | None:
    """None when the packages and the plugins import from the copy; else what went wrong."""
    code = ("import importlib, mla_core\n"
            f"for name in {PACKAGES!r}:\n"
            "    print(importlib.import_module(name).__file__)\n"
            "b = mla_core.backends()\n"
            "print(sorted(b))\n"
            "print(b['reference'].__class__.__module__ and importlib.import_module(type(b['reference']).__module__).__file__)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=copy, env=env, capture_output=True, text=True, timeout=300)
    if r.returncode:
        return r.stderr.strip()[-2000:]
    files = [line for line in r.stdout.splitlines() if line.endswith(".py")]
    outside = [f for f in files if not Path(f).resolve().is_relative_to(copy.resolve())]
    return f"imported from outside the copy: {outside}" if outside else None


SUMMARY = re.compile(r"(\d+) (passed|failed|error|errors|skipped|deselected|xfailed|xpassed)")


def run_pytest(copy: Path, env, args: list[str], timeout: float) -> tuple[str, str, float]:
    """("failed" | "passed" | "none" | "timeout", tail of the output, seconds)."""
    t0 = time.time()
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    try:
        r = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        return "timeout", out[-1500:], time.time() - t0
    out = r.stdout + r.stderr
    passed = sum(int(n) for n, what in SUMMARY.findall(out.splitlines()[-1] if out.strip() else "")
                 if what == "passed")
    if r.returncode == 0:
        return ("passed" if passed else "none"), out[-1500:], time.time() - t0
    if r.returncode == 5:  # pytest: no test collected (or all deselected)
        return "none", out[-1500:], time.time() - t0
    # failures (1), errors in collection (2), an internal error (3), or the process killed by a signal (a
    # crash: an out-of-bounds read under the interpreter): the selection passed without the mutant, so the
    # mutant did it
    tail = out[-1500:] if r.returncode == 1 else f"pytest exit status {r.returncode}\n{out[-1500:]}"
    return "failed", tail, time.time() - t0


@dataclass
class Result:
    mutant: Mutant
    verdict: str  # KILLED, SURVIVED, ERROR, NOT RUN
    detail: str = ""
    seconds: float = 0.0


def judge(m: Mutant, copy: Path, env, timeout: float, baseline: dict, lock: threading.Lock,
          has_cuda: bool) -> Result:
    if m.problems:
        return Result(m, "ERROR", "; ".join(m.problems))
    if m.gpu and not has_cuda:
        return Result(m, "NOT RUN", "needs a CUDA device")
    key = tuple(m.pytest_args())
    with lock:
        base = baseline.get(key)
    if base is None:
        verdict, tail, _ = run_pytest(copy, env, list(key), timeout)
        base = (verdict, tail)
        with lock:
            baseline[key] = base
    if base[0] != "passed":
        what = "ran no test here" if base[0] == "none" else f"{base[0]} without the mutant"
        return Result(m, "NOT RUN" if base[0] == "none" else "ERROR", f"the selection {what}: {base[1][-300:]}")
    target = copy / m.file
    original = target.read_text()
    if original.count(m.old) != 1:
        return Result(m, "ERROR", f"old occurs {original.count(m.old)} times in the copy of {m.file}")
    target.write_text(original.replace(m.old, m.new, 1))
    try:
        verdict, tail, seconds = run_pytest(copy, env, list(key), timeout)
    finally:
        target.write_text(original)
    if verdict in ("failed", "timeout"):
        how = "timed out" if verdict == "timeout" else tail.split("\n")[0] if tail.startswith("pytest exit") else ""
        return Result(m, "KILLED", how, seconds)
    if verdict == "none":
        return Result(m, "NOT RUN", "no test ran with the mutant", seconds)
    return Result(m, "SURVIVED", "", seconds)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="list the mutants (and any problems) and exit")
    ap.add_argument("--only", metavar="PATTERN", help="mutants whose id or file contains PATTERN "
                                                      "(fnmatch when it has * ? [)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="workers, each with its own copy (default 1)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run (default 600)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies (their paths are printed)")
    args = ap.parse_args(argv)

    mutants = select(load_mutants(), args.only)
    if args.list:
        for m in mutants:
            flag = f"  PROBLEM: {'; '.join(m.problems)}" if m.problems else ""
            print(f"{m.id:16} {m.file}  [{' '.join(m.tests)}]{' (gpu)' if m.gpu else ''}\n{'':16} {m.why}{flag}")
        print(f"{len(mutants)} mutants")
        return 1 if any(m.problems for m in mutants) else 0
    if not mutants:
        print("no mutant matches")
        return 1

    try:
        import torch
        has_cuda = torch.cuda.is_available()
    except Exception:
        has_cuda = False
    jobs = max(1, min(args.jobs, len(mutants)))
    tmp = Path(tempfile.mkdtemp(prefix="mla_core_mutation_"))
    copies = []
    for i in range(jobs):
        copy = tmp / f"w{i}"
        copy_tree(copy)
        env = environment(copy)
        problem = check_imports(copy, env)
        if problem:
            print(f"the copy at {copy} does not import from itself: {problem}")
            return 2
        copies.append((copy, env))
    print(f"{len(mutants)} mutants, {jobs} worker(s), copies under {tmp}", flush=True)

    todo: queue.Queue = queue.Queue()
    for m in mutants:
        todo.put(m)
    results: list[Result] = []
    baseline: dict = {}
    lock = threading.Lock()

    def worker(copy, env):
        while True:
            try:
                m = todo.get_nowait()
            except queue.Empty:
                return
            r = judge(m, copy, env, args.timeout, baseline, lock, has_cuda)
            with lock:
                results.append(r)
                extra = f"  ({r.detail})" if r.detail else ""
                print(f"{r.verdict:9} {m.id:16} {r.seconds:6.1f}s  {m.file}: {m.why}{extra}", flush=True)

    threads = [threading.Thread(target=worker, args=c) for c in copies]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)

    by = {v: [r.mutant.id for r in results if r.verdict == v] for v in ("KILLED", "SURVIVED", "ERROR", "NOT RUN")}
    judged = len(by["KILLED"]) + len(by["SURVIVED"])
    print(f"\nkilled {len(by['KILLED'])} / {judged} judged ({len(results)} mutants; "
          f"{len(by['ERROR'])} error, {len(by['NOT RUN'])} not run here)")
    for verdict in ("SURVIVED", "ERROR", "NOT RUN"):
        if by[verdict]:
            print(f"{verdict.lower()}: {' '.join(sorted(by[verdict]))}")
    return 1 if by["SURVIVED"] or by["ERROR"] else 0


if __name__ == "__main__":
    sys.exit(main())
