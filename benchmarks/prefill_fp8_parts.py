"""Where the cuda prefill's fp8 recipe spends its time over bf16 (issue 12): the kernel and the QDQ pre-pass apart.

    python benchmarks/prefill_fp8_parts.py [--cases 4x4096 1x16384]

Causal, 128 heads, q/k 192, v 128 (bench_prefill.py's inputs). Rows, each a CUDA graph replayed with the L2 flushed
before it (median µs of 10): the kernel with bf16 P; the kernel with FP8 P on Q/K/V codes made beforehand; the same
with Q's codes made in the kernel (q_fmt 1, the recipe's kernel part); the pre-pass over K and V (one launch, the
recipe's) and over Q alone, each with its bytes moved (read + write) per second.
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_prefill import CASES, HEADS, make_inputs  # noqa: E402
from common import time_graph  # noqa: E402

from mla_core_cuda import build  # noqa: E402
from mla_core_cuda.prefill import _f32_reciprocal, fp8_codes  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", nargs="*", default=["4x4096", "1x16384"], choices=list(CASES))
    args = ap.parse_args()
    module, reason = build.load_or_reason()
    assert module is not None, reason
    for case in args.cases:
        q, k, v, cu_q, cu_k, max_q = make_inputs(CASES[case])
        out = torch.empty(q.shape[0], HEADS, 128, dtype=torch.bfloat16, device="cuda")
        (qc, sq), (kc, sk), (vc, sv) = fp8_codes(module, [(q, None), (k, None), (v, None)])
        ps = 1 / 448
        log2e = math.log2(math.e) * 192 ** -0.5

        def kernel(qx, kx, vx, p_fmt, scale_log2, q_fmt=0):
            return lambda: module.prefill_wgmma(qx, kx, vx, cu_q, cu_k, max_q, out, None, True, scale_log2, 1.0,
                                                p_fmt, ps if p_fmt else 1.0, _f32_reciprocal(ps) if p_fmt else 1.0,
                                                q_fmt, sq, _f32_reciprocal(sq))
        rows = {
            "kernel, bf16 P": kernel(q, k, v, 0, log2e),
            "kernel, fp8 P, Q/K/V codes given": kernel(qc, kc, vc, 1, log2e * sq * sk),
            "kernel, fp8 P, Q's codes in it": kernel(q, kc, vc, 1, log2e * sq * sk, q_fmt=1),
            "pre-pass K + V": lambda: fp8_codes(module, [(k, None), (v, None)]),
            "pre-pass Q": lambda: fp8_codes(module, [(q, None)]),
        }
        moved = {"pre-pass K + V": 2 * (k.numel() + v.numel()) * 2, "pre-pass Q": 2 * q.numel() * 2}
        for name, fn in rows.items():
            us = time_graph(fn, iters=10)
            extra = f", {moved[name] / us / 1e3:.0f} GB/s" if name in moved else ""
            print(f"{case:8s} {name:34s} {us:9.0f} µs{extra}", flush=True)
        del q, k, v, qc, kc, vc, out
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
