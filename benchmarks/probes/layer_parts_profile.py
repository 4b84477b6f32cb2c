"""Where the fused layer's GPU time goes: each kernel of one step (torch.profiler, CUPTI), at the shapes where
bench_layer.py misses a target (round n: decode 128 heads batch 1, layer / parts 1.20 > 1.15; prefill 128 heads 4 x
4096, 67.4 % < 70 % of the attention kernel's TFLOP/s).

    python3 benchmarks/probes/layer_parts_profile.py [--steps 20]

Per case: every kernel's name, launches per step and µs per step (GPU time, summed), their sum, and the step's
graph-replay time (decode) or eager event time (prefill) in the same process: step − sum = the gaps between kernels.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from bench_layer import _checks, layer_inputs  # noqa: E402
from common import time_eager, time_graph  # noqa: E402

import mla_core  # noqa: E402


def kernels(fn, steps):
    """{kernel name: (launches, total µs)} per step of ``fn`` under torch.profiler (after two warm-up calls)."""
    fn(), fn()
    torch.cuda.synchronize()
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    table = collections.defaultdict(lambda: [0, 0.0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            table[ev.name][0] += 1
            table[ev.name][1] += ev.device_time_total if hasattr(ev, "device_time_total") else ev.cuda_time_total
    return {k: (n / steps, us / steps) for k, (n, us) in table.items()}


def report(title, fn, steps, graph):
    per = kernels(fn, steps)
    step_us = time_graph(fn, iters=20, warmup=2) if graph else time_eager(fn, iters=10, warmup=2)
    print(f"\n# {title}: step {step_us:.1f} µs ({'graph replay' if graph else 'eager, event-timed'})")
    print(f"{'µs/step':>9} {'launches':>8}  kernel")
    for name, (n, us) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        print(f"{us:9.1f} {n:8.1f}  {name[:110]}")
    total = sum(us for _, us in per.values())
    print(f"{total:9.1f} {'':8}  sum of kernels; step - sum = {step_us - total:.1f} µs (gaps, launch latency)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    print("device", torch.cuda.get_device_name(), "torch", torch.__version__)
    with _checks("metadata"):
        a = layer_inputs(128, 1, 8192, 1, "cuda")
        report("decode 128 heads, batch 1, L 8192 (metadata checks)",
               lambda: mla_core.mla_forward(**a), args.steps, graph=True)
        a = layer_inputs(128, 4, 4096, 4096, "cuda")
        report("prefill 128 heads, 4 x 4096 (metadata checks)",
               lambda: mla_core.mla_forward(**a), max(2, args.steps // 5), graph=False)


if __name__ == "__main__":
    main()
