"""Mutants of the CUDA FP8 sparse decode (csrc/mla_sparse_wgmma.cu, backends/cuda/mla_core_cuda/sparse.py): each is
one plausible bug tests/test_cuda_sparse.py's GPU tests must notice. ``old`` occurs exactly once in ``file``.

On a GPU machine, ``python3 tests/mutation/mutants_cuda_sparse.py`` builds every csrc mutant in parallel (a copy of
csrc/ each, built through ``MLA_CORE_CUDA_SRC`` into a private cache), runs ``SELECTION`` once per mutant and prints
killed / SURVIVED; a Python mutant is applied in place and reverted by the exact reverse edit. ``--prepare`` only
builds (a device script starts it beside the main build and runs the tests later).
"""
from __future__ import annotations

SELECTION = ("-m gpu tests/test_cuda_sparse.py::test_gpu_boundary_lengths[False-128-2] "
             "tests/test_cuda_sparse.py::test_gpu_boundary_lengths[True-64-3] "
             "tests/test_cuda_sparse.py::test_gpu_every_split_count "
             "tests/test_cuda_sparse.py::test_gpu_indices_outside_the_cache_are_not_keys")
"""Fast cases covering the length edges, holes, both cache shapes, every split count and indices past the cache."""

MUTANTS = [
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="    if (slot < end) {",
         new="    if (slot <= end) {",
         tests=[SELECTION], gpu=True,
         why="off by one at a split's end: the slot at the valid length (a NaN row) or the next split's first "
             "slot is a key"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="      const float x = flag[8 * (j >> 2) + 2 * (t & 3) + (j & 1)] ? s[j] * p.scale_log2 : -INFINITY;",
         new="      const float x = s[j] * p.scale_log2;",
         tests=[SELECTION], gpu=True,
         why="wrong mask: -1 slots and slots past the length score 0 (zero rows) instead of -inf"),
    dict(file="backends/cuda/mla_core_cuda/sparse.py",
         old="call.bmm1_scale * math.log2(math.e)",
         new="call.bmm1_scale",
         tests=[SELECTION], gpu=True,
         why="wrong scale: scores left in natural-log units while the kernel exponentiates base 2"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="p.part_o + ((tok * p.num_splits + i) * p.heads + h) * kNope + c",
         new="p.part_o + (tok * p.num_splits * p.heads + h) * kNope + c",
         tests=[SELECTION], gpu=True,
         why="wrong index: the combine reads split 0's partial output for every split"),
    dict(file="csrc/mla_sparse_wgmma.cu",
         old="      scale_rows(o, a2_lo, a2_hi);\n",
         new="",
         tests=[SELECTION], gpu=True,
         why="no rescale between the two 32-key halves: P_0 V_0 kept against the old running maximum"),
]


def _run_on_gpu(prepare_only: bool = False) -> int:
    import os
    import shlex
    import shutil
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    work = Path(os.environ.get("MUTANT_WORK", "/tmp/mla_core_sparse_mutants"))
    work.mkdir(parents=True, exist_ok=True)
    base_env = dict(os.environ, MLA_CORE_CACHE_DIR=str(work / "cache"), PYTHONUNBUFFERED="1")

    def prepare(i, m):
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
            print(f"mutant {i}: build failed: {(done.stderr.strip().splitlines() or [''])[-1]}", flush=True)
        return env

    with ThreadPoolExecutor(max_workers=len(MUTANTS)) as pool:
        envs = list(pool.map(lambda im: prepare(*im), enumerate(MUTANTS)))
    if prepare_only:
        return 0
    survived = 0
    for i, (m, env) in enumerate(zip(MUTANTS, envs)):
        path = root / m["file"]
        original = path.read_text()
        if env is None:  # Python mutant: in place, reverted by the exact reverse edit; the unmutated build
            path.write_text(original.replace(m["old"], m["new"]))
            env = dict(os.environ, PYTHONUNBUFFERED="1")
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                                   *shlex.split(m["tests"][0])], env=env, cwd=root, capture_output=True, text=True)
        finally:
            path.write_text(original)  # not a reverse replace: the mutant's text may occur unmutated elsewhere
        killed = done.returncode not in (0, 5)
        survived += not killed
        last = (done.stdout.strip().splitlines() or [""])[-1]
        print(f"mutant {i} ({m['why'][:60]}...): {'killed' if killed else 'SURVIVED'} [{last}]", flush=True)
    print(f"{len(MUTANTS) - survived}/{len(MUTANTS)} killed")
    return 1 if survived else 0


if __name__ == "__main__":
    import sys
    raise SystemExit(_run_on_gpu(prepare_only="--prepare" in sys.argv))
