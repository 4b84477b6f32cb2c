"""Fused RoPE + FP8 quantize benchmark: musa_fp8 against the copy bandwidth and the reference backend.

    python benchmarks/bench_rope.py [--tokens 4096,16384] [--heads 128,16]

Each token reads q_rope/q_nope [heads, 64 + 512] and k_rope/k_nope [64 + 512] in bf16 (2 B each), one
cos/sin row (64 float32) and its position, and writes the same values as FP8 (1 B each) into slices of
576-byte cache rows. Columns: median µs of CUDA-graph replays with the L2 flushed before each, GB/s of
bytes read + written, its % of the copy bandwidth (read + write) measured in the same run, and the
reference backend's time over ours (both through the public op, eager, checks off). JSON: $OUT/bench_rope.json.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from common import device_info, measure_ceilings, print_table, time_eager, time_graph, write_json  # noqa: E402

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")
os.environ.setdefault("MLA_CORE_AUTOTUNE", "off")

import mla_core  # noqa: E402
from mla_core import specs  # noqa: E402


def make_inputs(nnz, heads, max_pos=32768, is_neox=False):
    g = torch.Generator(device="cuda").manual_seed(0)
    bf = dict(device="cuda", dtype=torch.bfloat16, generator=g)
    q_rope, q_nope = torch.randn(nnz, heads, 64, **bf), torch.randn(nnz, heads, 512, **bf)
    k_rope, k_nope = torch.randn(nnz, 64, **bf), torch.randn(nnz, 512, **bf)
    ang = torch.arange(max_pos, device="cuda")[:, None] * 10000.0 ** (-torch.arange(0, 64, 2, device="cuda") / 64)
    cos_sin = torch.cat((ang.cos(), ang.sin()), dim=-1).float()
    pos = torch.randint(0, max_pos, (nnz,), device="cuda", generator=g)
    q_rows = torch.empty(nnz, heads, 576, dtype=torch.float8_e4m3fn, device="cuda")
    k_rows = torch.empty(nnz, 576, dtype=torch.float8_e4m3fn, device="cuda")
    outs = dict(q_rope_out=q_rows[..., 512:], k_rope_out=k_rows[:, 512:], q_nope_out=q_rows[..., :512],
                k_nope_out=k_rows[:, :512])
    return (q_rope, k_rope, q_nope, k_nope, cos_sin, pos), outs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default="4096,16384")
    ap.add_argument("--heads", default="128,16")
    ap.add_argument("--sweep", type=int, default=3)
    args = ap.parse_args()
    ceilings = measure_ceilings()
    info = device_info()
    print(info, {k: round(v, 1) for k, v in ceilings.items()}, flush=True)
    backend = mla_core.get_backend("musa_fp8")
    rows = []
    for heads in (int(h) for h in args.heads.split(",")):
        for nnz in (int(t) for t in args.tokens.split(",")):
            inputs, outs = make_inputs(nnz, heads)
            problem, call = specs.validate_rope_quantize(*inputs, False, None, 0.5, 2.0, *outs.values())
            times = {i: time_graph(lambda: backend.run(problem, call, c))
                     for i, c in enumerate(backend.configs(problem)[:args.sweep])}
            best = min(times, key=times.get)
            moved = nnz * (heads + 1) * 576 * (2 + 1) + nnz * (64 * 4 + 8)
            ours_eager = time_eager(lambda: mla_core.mla_rope_quantize_fp8(*inputs, is_neox=False, quant_scale_q=0.5,
                                                                           quant_scale_kv=2.0, backend="musa_fp8",
                                                                           **outs))
            ref_eager = time_eager(lambda: mla_core.mla_rope_quantize_fp8(*inputs, is_neox=False, quant_scale_q=0.5,
                                                                          quant_scale_kv=2.0, backend="reference",
                                                                          **outs), iters=10)
            row = dict(tokens=nnz, heads=heads, us_default=times[0], us=times[best],
                       best_config=backend.configs(problem)[best], gbps=moved / times[best] / 1e3,
                       us_eager=ours_eager, reference_us=ref_eager, reference_over_musa=ref_eager / ours_eager)
            row["pct_copy"] = 100 * row["gbps"] / ceilings["copy_gbps"]
            rows.append(row)
            print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    print()
    print_table(rows, [("tokens", "tokens", "d"), ("heads", "H", "d"), ("us_default", "µs(cfg0)", ".1f"),
                       ("us", "µs(best)", ".1f"), ("gbps", "GB/s", ".0f"), ("pct_copy", "%copy", ".0f"),
                       ("us_eager", "µs eager", ".1f"), ("reference_us", "ref µs", ".0f"),
                       ("reference_over_musa", "ref/ours", ".1f")])
    write_json("bench_rope.json", {"device": info, "ceilings": ceilings, "rows": rows})


if __name__ == "__main__":
    main()
