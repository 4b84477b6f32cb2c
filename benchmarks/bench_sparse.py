"""FP8 top-k sparse MLA decode benchmark: musa_fp8 and cuda on both cache layouts against FlashMLA's figures.

    python benchmarks/bench_sparse.py [--sweep N] [--q-lens 1,2] [--layouts fp8,fp8_ds_mla]
                                      [--backends musa_fp8,cuda]
    python benchmarks/bench_sparse.py --compile-only     # no GPU needed; run without TRITON_INTERPRET=1

Rows: backend x layout (``fp8``: MATE's 576-byte rows, FP8 query; ``fp8_ds_mla``: 656-byte rows, bf16 query) x
q_len x (batch, heads) in FlashMLA's four published shapes (a backend that cannot run a row is left out: cuda runs
576-byte rows only) (top-k 2048 of a 32k-token cache, every slot valid).
Columns: median µs of CUDA-graph replays with the L2 flushed before each, for the first config and the
fastest of the first ``--sweep`` configs; TFLOP/s (2·B·q·H·top_k·(576+512)); GB/s of gathered KV bytes read
once per token (B·q·top_k·row bytes); their % of the bf16 matmul rate / copy bandwidth measured in the same
run; FlashMLA's time over ours at q_len 1 (its H200 figures, 656-byte rows, bf16 query, q_len 1: > 1 means
faster). The reference backend is timed eagerly at the smallest shape. JSON goes to $OUT/bench_sparse.json.
``--compile-only`` instead compiles every config's stage-1 kernel for sm_90a with Triton's ptxas (as
``compile_report.py`` does for the dense decode) and prints registers per thread, spilled bytes, shared memory
and SASS counts (MMAs, FP32, conversions, 16-byte loads): how the configs were ranked before measuring.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")  # no content checks (no device sync), graph capturable
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core import layouts, specs  # noqa: E402

FLASHMLA_US = {(32, 64): 52.7, (32, 128): 67.4, (128, 64): 121.5, (128, 128): 189.9}
"""FlashMLA's FP8 sparse decode on the lent H200 (656-byte rows, bf16 query, top-k 2048 of 32k, q_len 1)."""
TOKENS, TOP_K = 32768, 2048


def make_case(layout, batch, q_len, heads, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    latent = torch.randn(TOKENS, 576, device="cuda", generator=g)
    if layout == "fp8":
        cache = layouts.pack_fp8(latent).view(TOKENS // 64, 64, 576)
        query = (torch.randn(batch, q_len, heads, 576, device="cuda", generator=g) * 0.5).to(torch.float8_e4m3fn)
    else:
        cache = layouts.pack_fp8_ds_mla(latent).view(TOKENS // 64, 64, 656)
        query = torch.randn(batch, q_len, heads, 576, device="cuda", generator=g).to(torch.bfloat16)
    # top-k distinct tokens per query row, as an indexer picks them
    idx = torch.argsort(torch.rand(batch * q_len, TOKENS, device="cuda", generator=g), dim=1)[:, :TOP_K]
    indices = idx.to(torch.int32).view(batch, q_len, TOP_K).contiguous()
    seq_lens = torch.full((batch,), TOP_K, dtype=torch.int32, device="cuda")
    return query, cache, indices, seq_lens


def compile_only(layouts_arg: str) -> None:
    """Registers / spills / shared memory / SASS mix of every config's stage-1 kernel on sm_90a (no GPU)."""
    from compile_report import _CompileOnly, resource_usage, sass_counts
    from mla_core_musa_fp8 import sparse as kernels
    print("layout     regs spill   smem   mma  fp32   cvt   int ld128/ldg total  config")
    for layout in layouts_arg.split(","):
        width, dtype = (576, torch.float8_e4m3fn) if layout == "fp8" else (656, torch.uint8)
        query = torch.zeros(32, 1, 128, 576, dtype=torch.float8_e4m3fn if layout == "fp8" else torch.bfloat16)
        cache = torch.zeros(TOKENS // 64, 64, width, dtype=dtype)
        indices = torch.zeros(32, 1, TOP_K, dtype=torch.int32)
        seq_lens = torch.full((32,), TOP_K, dtype=torch.int32)
        problem, call = specs.validate_sparse_decode(query, cache, 128, 512, 64, indices, seq_lens, TOP_K, None,
                                                     576 ** -0.5, 1.0, None, False, None)
        for config in kernels.configs(problem):
            log = []
            saved = kernels._sparse_split_kernel
            kernels._sparse_split_kernel = _CompileOnly(saved, log)
            try:
                kernels.run(call, dict(config, num_splits=1), on_gpu=True)
            finally:
                kernels._sparse_split_kernel = saved
            for _, _, compiled in log:
                regs, spills, shared = resource_usage(compiled)
                c, _ = sass_counts(compiled)
                print(f"{layout:10s} {regs:4d} {spills:5d} {shared:6d} {c['mma']:5d} {c['fp32']:5d} {c['cvt']:5d} "
                      f"{c['int']:5d} {c['ld128']:5d}/{c['ldg']:<3d} {c['total']:5d}  {config}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compile-only", action="store_true", help="sm_90a registers/spills per config, no GPU")
    ap.add_argument("--layouts", default="fp8,fp8_ds_mla")
    ap.add_argument("--backends", default="musa_fp8,cuda")
    ap.add_argument("--q-lens", default="1,2")
    ap.add_argument("--sweep", type=int, default=3, help="time the first N configs, report the fastest")
    ap.add_argument("--iters", type=int, default=30)
    args = ap.parse_args()
    if args.compile_only:
        if os.environ.get("TRITON_INTERPRET") == "1":
            sys.exit("run without TRITON_INTERPRET=1 (the interpreter replaces the kernels)")
        compile_only(args.layouts)
        return
    ceilings = measure_ceilings()
    info = device_info()
    print(info, {k: round(v, 1) for k, v in ceilings.items()}, flush=True)
    rows = []
    for name, layout in ((b, lay) for lay in args.layouts.split(",") for b in args.backends.split(",")):
        backend = mla_core.get_backend(name)
        row_bytes = 576 if layout == "fp8" else 656
        for q_len in (int(x) for x in args.q_lens.split(",")):
            for (batch, heads), flashmla in FLASHMLA_US.items():
                query, cache, indices, seq_lens = make_case(layout, batch, q_len, heads)
                out = torch.empty(batch, q_len, heads, 512, dtype=torch.bfloat16, device="cuda")
                problem, call = specs.validate_sparse_decode(query, cache, 128, 512, 64, indices, seq_lens, TOP_K,
                                                             out, 576 ** -0.5, 1.0, None, False, None)
                if backend.why_not(problem):
                    continue
                times = {}
                for i, config in enumerate(backend.configs(problem)[:args.sweep]):
                    times[i] = time_graph(lambda: backend.run(problem, call, config), iters=args.iters)
                best = min(times, key=times.get)
                us = times[best]
                flops = 2 * batch * q_len * heads * TOP_K * (576 + 512)
                kv_bytes = batch * q_len * TOP_K * row_bytes
                row = dict(backend=name, layout=layout, q_len=q_len, batch=batch, heads=heads, us_default=times[0],
                           us=us, best_config=backend.configs(problem)[best], tflops=flops / us / 1e6,
                           gbps=kv_bytes / us / 1e3, flashmla_us=flashmla if q_len == 1 else None,
                           speedup=(flashmla / us) if q_len == 1 else None)
                row["pct_mma"] = 100 * row["tflops"] / ceilings["bf16_tflops"]
                row["pct_copy"] = 100 * row["gbps"] / ceilings["copy_gbps"]
                if batch == 32 and heads == 64 and q_len == 1 and name == "musa_fp8":
                    def ref():
                        return mla_core.sparse_mla_fp8_decode(query, cache, None, 128, 512, 64, indices, seq_lens, 0,
                                                              TOP_K, bmm1_scale=576 ** -0.5, backend="reference")
                    row["reference_over_musa"] = time_eager(ref, iters=5, warmup=1) / us
                rows.append(row)
                print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    print()
    print_table(rows, COLUMNS)
    write_json("bench_sparse.json", {"device": info, "ceilings": ceilings, "rows": rows})


COLUMNS = [("backend", "backend", "s"), ("layout", "layout", "s"), ("q_len", "q", "d"), ("batch", "B", "d"),
           ("heads", "H", "d"),
           ("us_default", "µs(cfg0)", ".1f"), ("us", "µs(best)", ".1f"), ("tflops", "TFLOP/s", ".0f"),
           ("pct_mma", "%mma", ".0f"), ("gbps", "GB/s", ".0f"), ("pct_copy", "%copy", ".0f"),
           ("flashmla_us", "FlashMLA µs", ".1f"), ("speedup", "FlashMLA/ours", ".2f"),
           ("reference_over_musa", "ref/ours", ".0f")]

if __name__ == "__main__":
    main()
