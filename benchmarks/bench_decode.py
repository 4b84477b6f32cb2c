"""MLA decode benchmark: triton vs reference on the GPU, against ceilings measured in the same run.

    python benchmarks/bench_decode.py [--quick] [--sweep N] [--splits 32,auto] [--kv-dtypes bf16,fp8]

Rows: heads × batch × length × recipe (bf16; fp8 = K/V/P FP8; nvfp4 = K/V/P NVFP4) × split count (the
default 32, and "auto" at batch 1). Page size 64, every request at full length, bf16 cache and q.
Columns: median µs of CUDA-graph replays with the L2 flushed before each (eager Python-call time beside
it), GB/s of KV bytes read once (B·L·576·2), TFLOP/s (2·B·H·L·(576+512)), their % of the measured copy
bandwidth / bf16 matmul rate, the recipe's time over the same shape's bf16 time, and the reference
backend's time over triton's. The reference syncs with the device (it reads the lengths), so it is timed
eagerly only, and only up to --ref-max-tokens cached tokens (B·L). JSON goes to $OUT/bench_decode.json.
When the cuda backend is available (--cuda auto, the default), each row also times it (graph replay, same
inputs and L2 flush): its µs, % of the copy bandwidth / matmul rate, its recipe time over its own bf16 time,
triton's time over it, and its time over FlashMLA's figure for that shape (bf16, page 64, measured on an
H200 beside mla_core 6ed19c9; FLASHMLA_US below).
``--kv-dtypes bf16,fp8`` also times each shape over an FP8 KV cache (float8_e4m3fn codes of the same values,
per-tensor ``kv_scale = amax / 448``; recipe bf16 = no fake quantization, the only recipe triton runs over an
FP8 cache besides P QDQ): bytes are then ``B·L·576·1``, and "x bf16 kv" is its time over the bf16 cache's.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")   # eager times: no content checks (no device sync)
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core.specs import validate_decode  # noqa: E402

RANK, ROPE, PAGE = 512, 64, 64
RECIPES = {"bf16": (None, None, None), "fp8": ("fp8", "fp8", "fp8"), "nvfp4": ("nvfp4", "nvfp4", "nvfp4")}
# FlashMLA 9241ae3e dense bf16 decode on the lent H200, µs (CUDA graph, L2 flushed, page 64), by (heads, batch, length).
FLASHMLA_US = {
    (16, 1, 1024): 15.7, (16, 1, 8192): 29.1, (16, 1, 32768): 49.2, (16, 32, 1024): 26.0, (16, 32, 8192): 95.3,
    (16, 32, 32768): 318.0, (16, 128, 1024): 52.6, (16, 128, 8192): 316.7, (16, 128, 32768): 1177.8,
    (128, 1, 1024): 18.4, (128, 1, 8192): 30.7, (128, 1, 32768): 46.4, (128, 32, 1024): 38.7, (128, 32, 8192): 133.0,
    (128, 32, 32768): 484.5, (128, 128, 1024): 75.9, (128, 128, 8192): 509.4, (128, 128, 32768): 1945.7,
}


def make_inputs(batch, heads, length, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = -(-length // PAGE)
    cache = torch.randn(batch * pages_per, PAGE, RANK + ROPE, device="cuda", generator=g, dtype=torch.bfloat16)
    table = torch.randperm(batch * pages_per, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    q = torch.randn(batch, heads, RANK + ROPE, device="cuda", generator=g, dtype=torch.bfloat16)
    lens = torch.full((batch,), length, dtype=torch.int32, device="cuda")
    return q, cache, table, lens


def fp8_cache(cache):
    """The FP8 KV cache of a bf16 cache's values: codes ``e4m3(x / s)`` and ``kv_scale s = amax / 448``."""
    kv_scale = float(cache.abs().max().float()) / 448
    return (cache.float() / kv_scale).clamp(-448, 448).to(torch.float8_e4m3fn), kv_scale


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="heads 16/128 × batch 1/32 × length 1024/8192")
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--batch", default="1,32,128")
    ap.add_argument("--lengths", default="1024,8192,32768")
    ap.add_argument("--recipes", default="bf16,fp8,nvfp4")
    ap.add_argument("--kv-dtypes", default="bf16", help="bf16 and/or fp8 (an FP8 KV cache with kv_scale)")
    ap.add_argument("--splits", default=None, help="split counts for every shape (default: 32, plus auto at batch 1)")
    ap.add_argument("--sweep", type=int, default=1, help="time the first N triton configs, report the fastest")
    ap.add_argument("--ref-max-tokens", type=int, default=32 * 8192)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--cuda", choices=("auto", "off"), default="auto",
                    help="auto: also time the cuda backend where it is available")
    args = ap.parse_args()
    if args.quick:
        args.batch, args.lengths = "1,32", "1024,8192"
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731

    from mla_core_triton import decode as kernels
    cuda = mla_core.get_backend("cuda") if args.cuda == "auto" and "cuda" in mla_core.backends() else None
    if cuda is not None and cuda.unavailable_reason() is not None:
        print(f"# cuda backend not timed: {cuda.unavailable_reason()}")
        cuda = None
    ceil = measure_ceilings()
    print(f"# {device_info()}")
    print(f"# ceilings: copy {ceil['copy_gbps']:.0f} GB/s (read+write; eager memcpy {ceil['copy_gbps_memcpy_eager']:.0f}, "
          f"copy kernel in a graph {ceil['copy_gbps_kernel_graph']:.0f}), bf16 matmul {ceil['bf16_tflops']:.0f} TFLOP/s",
          flush=True)
    rows = []
    for heads in ints(args.heads):
        for batch in ints(args.batch):
            for length in ints(args.lengths):
                q, bf16_cache, table, lens = make_inputs(batch, heads, length)
                splits_list = args.splits.split(",") if args.splits else (["32", "auto"] if batch == 1 else ["32"])
                bf16_us = {}
                for kv_dtype, recipe in [(kv, r) for kv in args.kv_dtypes.split(",") for r in args.recipes.split(",")]:
                    k, v, p = RECIPES[recipe]
                    if kv_dtype == "fp8" and (k or v):
                        continue  # K / V QDQ over an FP8 cache: reference only
                    cache, kv_scale = fp8_cache(bf16_cache) if kv_dtype == "fp8" else (bf16_cache, None)
                    for splits in splits_list:
                        nsplit = "auto" if splits == "auto" else int(splits)
                        kw = dict(softmax_scale=(RANK + ROPE) ** -0.5, kv_lora_rank=RANK, qk_rope_head_dim=ROPE,
                                  num_kv_splits=nsplit, k_qdq=k, v_qdq=v, p_qdq=p, kv_scale=kv_scale)
                        problem, call = validate_decode(
                            q, cache, table, lens, page_size=None, k_qdq_amax=None, v_qdq_amax=None,
                            p_qdq_amax=1.0, return_lse=True, out_dtype=None, **kw)
                        best = None
                        for config in kernels.configs(problem)[:args.sweep]:
                            us = time_graph(lambda: kernels.run(call, config), iters=args.iters)
                            res = dict(kernels.LAST_RESOURCES)
                            if args.sweep > 1:
                                print(f"  config {config}: {us:.1f} us, regs {res.get('regs')}, spills {res.get('spills')}",
                                      flush=True)
                            if best is None or us < best[0]:
                                best = (us, dict(config, **{k: v for k, v in res.items() if v is not None}))
                        us, config = best
                        eager = time_eager(lambda: mla_core.mla_attention_decode(q, cache, table, lens,
                                                                                   backend="triton", **kw),
                                           iters=max(5, args.iters // 3))
                        ref_us = None
                        if batch * length <= args.ref_max_tokens:
                            ref_us = time_eager(lambda: mla_core.mla_attention_decode(
                                q, cache, table, lens, backend="reference", **kw), iters=3, warmup=1)
                        cuda_us = cuda_config = cuda_splits = None
                        if cuda is not None and not cuda.why_not(problem):
                            from mla_core_cuda.decode import num_splits as cuda_num_splits
                            for c_config in cuda.configs(problem)[:args.sweep]:
                                c_us = time_graph(lambda: cuda.run(problem, call, c_config), iters=args.iters)
                                if args.sweep > 1:
                                    print(f"  cuda config {c_config}: {c_us:.1f} us", flush=True)
                                if cuda_us is None or c_us < cuda_us:
                                    cuda_us, cuda_config = c_us, c_config
                                    cuda_splits = cuda_num_splits(call, c_config)
                        if recipe == "bf16" and kv_dtype == "bf16":
                            bf16_us[splits] = us
                            bf16_us["cuda", splits] = cuda_us
                        gbps = batch * length * (RANK + ROPE) * cache.element_size() / us / 1e3
                        tflops = 2 * batch * heads * length * (RANK + ROPE + RANK) / us / 1e6
                        rows.append(dict(
                            heads=heads, batch=batch, length=length, kv=kv_dtype, recipe=recipe, splits=splits,
                            used_splits=kernels.decode_num_splits(call, config, kernels.sm_count(q.device)),
                            us=us, eager_us=eager, gbps=gbps, pct_bw=100 * gbps / ceil["copy_gbps"],
                            tflops=tflops, pct_tc=100 * tflops / ceil["bf16_tflops"],
                            vs_bf16=us / bf16_us[splits] if splits in bf16_us and kv_dtype == "bf16" else None,
                            vs_bf16_kv=us / bf16_us[splits] if splits in bf16_us and kv_dtype != "bf16" else None,
                            ref_us=ref_us, ref_over_triton=ref_us / us if ref_us else None,
                            config=",".join(f"{k}={v}" for k, v in config.items()),
                            cuda_us=cuda_us, cuda_splits=cuda_splits,
                            cuda_pct_bw=100 * gbps * us / cuda_us / ceil["copy_gbps"] if cuda_us else None,
                            cuda_pct_tc=100 * tflops * us / cuda_us / ceil["bf16_tflops"] if cuda_us else None,
                            cuda_vs_bf16=cuda_us / bf16_us["cuda", splits]
                            if cuda_us and bf16_us.get(("cuda", splits)) else None,
                            triton_over_cuda=us / cuda_us if cuda_us else None,
                            cuda_over_flashmla=cuda_us / FLASHMLA_US[heads, batch, length]
                            if cuda_us and (heads, batch, length) in FLASHMLA_US else None,
                            cuda_config=",".join(f"{k}={v}" for k, v in (cuda_config or {}).items())))
                        r = rows[-1]
                        print(f"H={heads} B={batch} L={length} kv={kv_dtype} {recipe} splits={splits}({r['used_splits']}): "
                              f"{us:.1f} us, {gbps:.0f} GB/s, {tflops:.0f} TFLOP/s"
                              + (f", ref {ref_us:.0f} us" if ref_us else "") + f" [{r['config']}]"
                              + (f"; cuda {cuda_us:.1f} us [{r['cuda_config']}]" if cuda_us else ""), flush=True)
                del q, cache, bf16_cache, table, lens
                torch.cuda.empty_cache()
    print()
    print_table(rows, [("heads", "H", "d"), ("batch", "B", "d"), ("length", "L", "d"), ("kv", "kv", "s"),
                       ("recipe", "recipe", "s"),
                       ("splits", "splits", "s"), ("used_splits", "used", "d"), ("us", "graph us", ".1f"),
                       ("eager_us", "eager us", ".1f"), ("gbps", "GB/s", ".0f"), ("pct_bw", "%copy", ".0f"),
                       ("tflops", "TFLOP/s", ".0f"), ("pct_tc", "%mm", ".0f"), ("vs_bf16", "x bf16", ".2f"),
                       ("vs_bf16_kv", "x bf16 kv", ".2f"),
                       ("ref_us", "ref us (eager)", ".0f"), ("ref_over_triton", "ref/triton", ".1f"),
                       ("config", "config", "s")]
                + ([("cuda_us", "cuda us", ".1f"), ("cuda_splits", "cuda used", "d"), ("cuda_pct_bw", "cuda %copy", ".0f"),
                    ("cuda_pct_tc", "cuda %mm", ".0f"),
                    ("cuda_vs_bf16", "cuda x bf16", ".2f"), ("triton_over_cuda", "triton/cuda", ".2f"),
                    ("cuda_over_flashmla", "cuda/FlashMLA", ".2f"), ("cuda_config", "cuda config", "s")]
                   if cuda is not None else []))
    print(f"(reference timed only where B*L <= {args.ref_max_tokens}; '-' elsewhere)")
    path = write_json("bench_decode.json", {"device": device_info(), "ceilings": ceil, "rows": rows})
    if path:
        print(f"# wrote {path}")


if __name__ == "__main__":
    main()
