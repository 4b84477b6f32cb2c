"""Time diagnostic variants of the library's WGMMA decode kernel (csrc/mla_decode_wgmma.cu) on a Hopper GPU.

    python benchmarks/probes/wgmma_decode_variants.py [--variants base,nomask,noguard,all]

Each variant is a copy of csrc/ with text replacements (VARIANTS below), built through the extension's own
build (MLA_CORE_CUDA_SRC, a separate build directory per source hash) in parallel, then timed in one process:
the raw launcher (split kernel + combine) between CUDA events after a 256 MB flush, as the decode probe times
its kernels, and as `benchmarks/bench_decode.py` does (graph replay, L2 flushed). Every request at full length,
page 64, shuffled pages. Diagnostic variants are valid only for these inputs (page 64, every key valid); they
show where the time goes, they are not kernels to ship. The findings are in benchmarks/NOTES.md ("the seesaw
kernel"; a first variant, the row lookup by shift for page 64, gained 7 % and became the kernel's own path).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNEL = "mla_decode_wgmma.cuh"  # the WGMMA decode's kernels (instantiated by mla_decode_wgmma*.cu)
VARIANTS = {  # (file in csrc/, old, new)
    "base": [],
    # no validity bits read by the consumers (every key valid)
    "nomask": [(KERNEL, "      const float x = (valid >> key) & 1u ? sc[j] * p.qk_scale_log2 : -INFINITY;",
                "      const float x = sc[j] * p.qk_scale_log2;")],
    # no -inf guard on the running maxima (the seesaw kernels' shared helper)
    "noguard": [("seesaw.cuh",
                 "__device__ __forceinline__ float finite_or_zero(float m) { return m == -INFINITY ? 0.f : m; }",
                 "__device__ __forceinline__ float finite_or_zero(float m) { return m; }")],
}
VARIANTS["all"] = VARIANTS["nomask"] + VARIANTS["noguard"]
SHAPES = [(128, 32, 8192, 2), (128, 128, 8192, 1), (16, 32, 8192, 4), (128, 1, 8192, 32)]  # heads, batch, len, splits


def build_variant(name: str, work: Path) -> dict:
    src = work / name
    shutil.copytree(ROOT / "csrc", src)
    for file, old, new in VARIANTS[name]:
        text = (src / file).read_text()
        assert text.count(old) == 1, (name, old)
        (src / file).write_text(text.replace(old, new))
    env = dict(os.environ, MLA_CORE_CUDA_SRC=str(src))
    done = subprocess.run([sys.executable, "-c", "from mla_core_cuda import build; print(build.build().__file__)"],
                          env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"variant {name}: build failed: {done.stderr[-2000:]}")
    return env


def time_variant(name: str, env: dict) -> None:
    """Runs in a child process with the variant's MLA_CORE_CUDA_SRC: prints one line per shape."""
    code = f"""
import statistics, torch, math
from mla_core.bench import time_graph
from mla_core_cuda import build
module = build.build()
flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
for heads, batch, length, splits in {SHAPES!r}:
    g = torch.Generator(device="cuda").manual_seed(0)
    pages = batch * length // 64
    cache = (torch.rand(pages, 64, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    q = (torch.rand(batch, heads, 576, device="cuda", generator=g) * 2 - 1).to(torch.bfloat16)
    table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(batch, length // 64)
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    out = torch.empty(batch, heads, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(batch, heads, dtype=torch.float32, device="cuda")
    part_o = torch.empty(batch * heads * splits * 512, device="cuda") if splits > 1 else None
    part_lse = torch.empty(batch * heads * splits, device="cuda") if splits > 1 else None
    scale = 576 ** -0.5 * math.log2(math.e)
    run = lambda: module.decode_wgmma(q, cache, table, lens, out, lse, part_o, part_lse, splits, scale)
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(20):
        flush.fill_(1)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); run(); b.record()
        torch.cuda.synchronize()
        samples.append(a.elapsed_time(b) * 1e3)
    raw = statistics.median(samples)
    graph = time_graph(run, iters=20)
    tflops = 2 * batch * heads * length * 1088 / raw / 1e6
    print(f"{name:8s} H{{heads:<4d}} B{{batch:<4d}} L{{length}} splits {{splits:<3d}} raw {{raw:8.1f}} us ({{tflops:5.0f}} TFLOP/s)"
          f"  graph {{graph:8.1f}} us", flush=True)
"""
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", default="base,nomask,noguard,all")
    args = ap.parse_args()
    names = args.variants.split(",")
    work = Path(tempfile.mkdtemp(prefix="mla_core_variants_"))
    with ThreadPoolExecutor(max_workers=len(names)) as pool:
        envs = dict(zip(names, pool.map(lambda n: build_variant(n, work), names)))
    for name in names:
        time_variant(name, envs[name])
    return 0


if __name__ == "__main__":
    sys.exit(main())
