"""The GPU mutant runner shared by the CUDA mutant lists (mutants_cuda.py, mutants_cuda_sparse.py).

Every csrc mutant is a copy of csrc/ with one edit, built through ``MLA_CORE_CUDA_SRC`` into a private cache, in
parallel; a Python mutant is applied in place and the original file written back after its run. Then each
mutant's test selection runs once (``pytest -m gpu -q -x``): killed when it fails, SURVIVED when it passes or
selects nothing (exit status 5; but a mutant not marked ``gpu=True`` whose selection holds no GPU test is reported
"not judged here": tests/mutation/run.py judges it on the CPU). A mutant that fails to build is killed at compile
time (reported as such); one whose tests run past ``MUTANT_TIMEOUT`` seconds (default 300: a dropped barrier can
hang a kernel) is killed by the timeout (reported as such). ``MUTANT_INDICES=5,6,7`` judges only those mutants of
the list.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[2]


def run(mutants: list[dict], selection: Callable[[dict], list[str]], *, work: Path | None = None,
        prepare_only: bool = False, workers: int = 8, root: Path = ROOT) -> int:
    """Build and judge ``mutants``; ``selection(m)`` gives the pytest arguments of mutant m. ``work``: a folder
    whose builds are reused (``prepare_only`` builds and stops); ``root``: the checkout the files are relative
    to. Prints one line per mutant; 1 if any survived."""
    only = {int(i) for i in os.environ.get("MUTANT_INDICES", "").split(",") if i.strip()}
    mutants = [(i, m) for i, m in enumerate(mutants) if not only or i in only]
    timeout_s = float(os.environ.get("MUTANT_TIMEOUT", "300"))
    work = work or Path(tempfile.mkdtemp(prefix="mla_core_mutants_"))
    work.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ, MLA_CORE_CACHE_DIR=str(work / "cache"), PYTHONUNBUFFERED="1")

    def prepare(i: int, m: dict) -> dict | None:
        text = (root / m["file"]).read_text()
        assert text.count(m["old"]) == 1, (i, m["old"])
        if not m["file"].startswith("csrc/"):
            return None
        src = work / f"m{i}"
        if not src.exists():
            shutil.copytree(root / "csrc", src)
            (src / Path(m["file"]).name).write_text(text.replace(m["old"], m["new"]))
        env = dict(base_env, MLA_CORE_CUDA_SRC=str(src))
        done = subprocess.run([sys.executable, "-c", "from mla_core_cuda import build; build.build()"], env=env,
                              capture_output=True, text=True)
        if done.returncode:
            print(f"mutant {i}: build failed (killed at compile time): "
                  f"{(done.stderr.strip().splitlines() or [''])[-1]}", flush=True)
        return env

    with ThreadPoolExecutor(max_workers=workers) as pool:
        envs = list(pool.map(lambda im: prepare(*im), mutants))
    if prepare_only:
        return 0
    survived = skipped = 0
    for (i, m), env in zip(mutants, envs):
        path = root / m["file"]
        original = path.read_text()
        if env is None:
            path.write_text(original.replace(m["old"], m["new"]))
            env = base_env
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-x", "-p", "no:cacheprovider",
                                   *selection(m)], env=env, cwd=root, capture_output=True, text=True,
                                  timeout=timeout_s)
            killed, last = done.returncode not in (0, 5), (done.stdout.strip().splitlines() or [""])[-1]
            unjudged = done.returncode == 5 and not m.get("gpu")  # a CPU mutant's tests: tests/mutation/run.py
        except subprocess.TimeoutExpired:
            killed, unjudged, last = True, False, f"timed out after {timeout_s:g} s: the tests hung"
        finally:
            path.write_text(original)  # not a reverse replace: the mutant's text may occur unmutated elsewhere
        if unjudged:
            skipped += 1
            print(f"mutant {i} ({m['why'][:60]}...): not judged here, no GPU test selected (tests/mutation/run.py "
                  f"judges it on the CPU)", flush=True)
            continue
        survived += not killed
        print(f"mutant {i} ({m['why'][:60]}...): {'killed' if killed else 'SURVIVED'} [{last}]", flush=True)
    judged = len(mutants) - skipped
    print(f"{judged - survived}/{judged} killed" + (f" ({skipped} not judged here)" if skipped else ""))
    return 1 if survived else 0
