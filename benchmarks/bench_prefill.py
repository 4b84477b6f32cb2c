"""Prefill benchmark on the GPU: triton vs reference, bf16 and the fp8 / nvfp4 fake-quant recipes.

    python benchmarks/bench_prefill.py [--quick] [--all-configs] [--shapes 4x4096 ...] [--recipes fp8 ...]

Shapes: causal, heads 128, dims 192/128, 4 x 4096 and 1 x 16384 (--quick: the reference runs only on
4 x 4096). Recipes: bf16 (no quantization), fp8 (Q/K/V/P FP8), nvfp4 (Q/K/V/P NVFP4). Triton times are
median µs of CUDA-graph replays with the L2 flushed before each, with eager (Python call) times beside;
the reference (unfused PyTorch, which reads cu_seqlens on the host and so cannot be captured) is timed
eagerly. TFLOP/s counts 2 * (192 + 128) FLOPs per visible (query, key) pair per head; "% mm" is the
percentage of the bf16 matmul rate measured in the same run. JSON goes to $OUT/bench_prefill.json.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

import mla_core  # noqa: E402
from mla_core import specs  # noqa: E402

HEADS, QK_DIM, V_DIM = 128, 192, 128
SHAPES = [(4, 4096), (1, 16384)]
RECIPES = {"bf16": None, "fp8": "fp8", "nvfp4": "nvfp4"}


def visible_pairs(batch: int, length: int) -> int:
    """Causal (query, key) pairs with len_q = len_k = length."""
    return batch * length * (length + 1) // 2


def make_call(batch: int, length: int, recipe: str):
    g = torch.Generator(device="cuda").manual_seed(0)
    total = batch * length
    q = torch.randn(total, HEADS, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(total, HEADS, QK_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(total, HEADS, V_DIM, device="cuda", dtype=torch.bfloat16, generator=g)
    cu = torch.arange(0, total + 1, length, device="cuda", dtype=torch.int32)
    fmt = RECIPES[recipe]
    kw = dict(q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt, q_amax=None, k_amax=None, p_amax=1.0, v_amax=None,
              sparsity_n=0, sparsity_m=4, dense_sink_tokens=0, dense_recent_tokens=64, block_m=64, block_n=64)
    return specs.validate_prefill(q, k, v, cu, cu, length, None, True, False, **kw)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="reference only on 4 x 4096; fewer iterations")
    ap.add_argument("--all-configs", action="store_true", help="time every triton config, not only the default")
    ap.add_argument("--shapes", nargs="*", default=[f"{b}x{n}" for b, n in SHAPES], help="BxL causal shapes")
    ap.add_argument("--recipes", nargs="*", default=list(RECIPES), choices=list(RECIPES))
    args = ap.parse_args()
    shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes]
    os.environ.setdefault("MLA_CORE_CHECKS", "metadata")  # no host reads of cu_seqlens inside timed calls

    from mla_core_triton import prefill as kernels

    ceilings = measure_ceilings()
    print(f"ceilings: bf16 matmul {ceilings['bf16_tflops']:.0f} TFLOP/s, copy {ceilings['copy_gbps']:.0f} GB/s",
          flush=True)
    iters = 10 if args.quick else 30
    rows = []
    for batch, length in shapes:
        flops = 2 * (QK_DIM + V_DIM) * visible_pairs(batch, length) * HEADS
        for recipe in args.recipes:
            problem, call = make_call(batch, length, recipe)
            configs = kernels.configs(problem)
            if not args.all_configs:
                configs = configs[:1]
            base = None
            for config in configs:
                fn = lambda: kernels.run(call, config)  # noqa: E731
                graph_us = time_graph(fn, iters=iters)
                eager_us = time_eager(fn, iters=max(3, iters // 3))
                row = dict(shape=f"{batch}x{length}", recipe=recipe, backend="triton",
                           config=",".join(f"{k}={v}" for k, v in config.items()), graph_us=graph_us, eager_us=eager_us,
                           tflops=flops / graph_us / 1e6)
                row["pct_mm"] = 100 * row["tflops"] / ceilings["bf16_tflops"]
                rows.append(row)
                base = row if base is None or graph_us < base["graph_us"] else base
                print(f"  {row['shape']} {recipe} triton {row['config']}: {graph_us:.0f} µs graph, "
                      f"{eager_us:.0f} µs eager, {row['tflops']:.1f} TFLOP/s", flush=True)
            if args.quick and (batch, length) != shapes[0]:
                continue
            def ref_fn():
                return mla_core.mla_prefill(call.q, call.k, call.v, call.cu_seqlens_q, call.cu_seqlens_k,
                                            call.max_seqlen_q, causal=True, q_quant=call.q_quant, k_quant=call.k_quant,
                                            p_quant=call.p_quant, v_quant=call.v_quant, backend="reference")
            try:
                ref_us = time_eager(ref_fn, iters=3, warmup=1)
            except torch.OutOfMemoryError:
                ref_us = None
            torch.cuda.empty_cache()
            rows.append(dict(shape=f"{batch}x{length}", recipe=recipe, backend="reference", config="-", graph_us=None,
                             eager_us=ref_us, tflops=None if ref_us is None else flops / ref_us / 1e6))
            if ref_us is not None:
                base["ref_ratio"] = ref_us / base["graph_us"]
    print()
    print_table(rows, COLUMNS)
    bf16 = {}  # the best bf16 time per shape
    for r in rows:
        if r["backend"] == "triton" and r["recipe"] == "bf16":
            bf16[r["shape"]] = min(r["graph_us"], bf16.get(r["shape"], float("inf")))
    for r in rows:
        if r["backend"] == "triton" and r["recipe"] != "bf16" and r["shape"] in bf16:
            ratio = r["graph_us"] / bf16[r["shape"]]
            print(f"{r['shape']} {r['recipe']} ({r['config']}): {ratio:.2f}x the best bf16 time")
    path = write_json("bench_prefill.json", {"device": device_info(), "ceilings": ceilings, "rows": rows})
    if path:
        print(f"wrote {path}")


COLUMNS = [("shape", "shape", "s"), ("recipe", "recipe", "s"), ("backend", "backend", "s"), ("config", "config", "s"),
           ("graph_us", "graph µs", ".0f"), ("eager_us", "eager µs", ".0f"), ("tflops", "TFLOP/s", ".1f"),
           ("pct_mm", "% mm", ".1f"), ("ref_ratio", "ref / triton", ".1f")]

if __name__ == "__main__":
    main()
