"""The cuda backend's decode with fused fake quantization (issue 9): each recipe's time over its own bf16 time.

    python benchmarks/bench_decode_qdq_cuda.py [--heads 16,128] [--batch 1,32,128] [--lengths 8192,32768]

Rows: heads x batch x length, page 64, every request at full length, bf16 cache and q, ``num_kv_splits="auto"``
(the split count the launcher picks for the config). Per row, CUDA-graph replays with the L2 flushed (median µs):
bf16 (the WGMMA kernel), the fp8 recipe (K/V/P FP8) and FP8 K/V + NVFP4 P on the config dispatch runs first
(the WGMMA kernel), the nvfp4 recipe (K/V/P NVFP4: the mma.sync kernel), and the fp8 recipe on the mma.sync
kernel's first shape (what ran it before); ratios over the bf16 time. ``--splits32`` adds the fp8 recipe at 32
splits on both kernels at heads 16/128, batch 32, length 8192 (triton's figures for those are in
benchmarks/NOTES.md). JSON to $OUT/bench_decode_qdq_cuda.json.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_decode import make_inputs  # noqa: E402
from common import device_info, print_table, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE = 512, 64
RECIPES = {"bf16": (None, None, None), "fp8": ("fp8", "fp8", "fp8"), "fp8_p_nvfp4": ("fp8", "fp8", "nvfp4"),
           "nvfp4": ("nvfp4", "nvfp4", "nvfp4")}


def _time(cuda, inputs, recipe, splits, which):
    """µs of one graph replay; ``which``: 0 the first config (dispatch's default), 1 the first mma.sync shape."""
    from mla_core_cuda.decode import num_splits
    k, v, p = RECIPES[recipe]
    problem, call = validate_decode(*inputs, softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK,
                                    qk_rope_head_dim=ROPE, page_size=None, num_kv_splits=splits, k_qdq=k,
                                    k_qdq_amax=None, v_qdq=v, v_qdq_amax=None, p_qdq=p, p_qdq_amax=1.0,
                                    return_lse=True, out_dtype=None)
    configs = cuda.configs(problem)
    config = configs[0] if which == 0 else next(c for c in configs if "head_tiles" in c)
    us = time_graph(lambda: cuda.run(problem, call, config), iters=20)
    return us, config.get("kernel", "mma.sync"), num_splits(call, config)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--splits32", action="store_true")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    cuda = mla_core.get_backend("cuda")
    assert cuda.unavailable_reason() is None, cuda.unavailable_reason()
    print(f"# {device_info()}", flush=True)
    rows = []
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                inputs = make_inputs(batch, heads, length)
                r = dict(heads=heads, batch=batch, length=length)
                for recipe in RECIPES:
                    us, kernel, used = _time(cuda, inputs, recipe, "auto", 0)
                    r[recipe], r[recipe + "_kernel"], r[recipe + "_splits"] = us, kernel, used
                r["fp8_mma"] = _time(cuda, inputs, "fp8", "auto", 1)[0]
                for recipe in ("fp8", "fp8_p_nvfp4", "nvfp4", "fp8_mma"):
                    r[recipe + "_x"] = r[recipe] / r["bf16"]
                rows.append(r)
                print(f"H={heads} B={batch} L={length}: bf16 {r['bf16']:.1f} us ({r['bf16_splits']} splits), fp8 "
                      f"{r['fp8']:.1f} ({r['fp8_x']:.2f}x, {r['fp8_kernel']}), fp8+nvfp4 P {r['fp8_p_nvfp4']:.1f} "
                      f"({r['fp8_p_nvfp4_x']:.2f}x), nvfp4 {r['nvfp4']:.1f} ({r['nvfp4_x']:.2f}x, "
                      f"{r['nvfp4_kernel']}), fp8 on mma.sync {r['fp8_mma']:.1f} ({r['fp8_mma_x']:.2f}x)", flush=True)
                del inputs
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("bf16_splits", "splits", "d"),
                       ("bf16", "bf16 us", ".1f"), ("fp8", "fp8 us", ".1f"), ("fp8_x", "fp8/bf16", ".2f"),
                       ("fp8_p_nvfp4", "fp8+P nvfp4 us", ".1f"), ("fp8_p_nvfp4_x", "fp8+P nvfp4/bf16", ".2f"),
                       ("nvfp4", "nvfp4 us", ".1f"), ("nvfp4_x", "nvfp4/bf16", ".2f"),
                       ("nvfp4_kernel", "nvfp4 kernel", "s"), ("fp8_mma", "fp8 mma.sync us", ".1f"),
                       ("fp8_mma_x", "fp8 mma.sync/bf16", ".2f")])
    extra = []
    if args.splits32:
        for heads in (16, 128):
            inputs = make_inputs(32, heads, 8192)
            for which in (0, 1):
                us, kernel, used = _time(cuda, inputs, "fp8", 32, which)
                extra.append(dict(heads=heads, kernel=kernel, us=us))
                print(f"32 splits, H={heads} B=32 L=8192 fp8 recipe on {kernel}: {us:.1f} us", flush=True)
            del inputs
            torch.cuda.empty_cache()
    path = write_json("bench_decode_qdq_cuda.json", {"device": device_info(), "rows": rows, "splits32": extra})
    if path:
        print(f"# wrote {path}")


if __name__ == "__main__":
    main()
