"""Triton prefill against the reference, one quantized operand at a time (GPU diagnosis).

    python benchmarks/prefill_error_breakdown.py [--len 1024] [--heads 16]

Prints the relative L2 error of the triton output against the reference backend for each operand
quantized alone and for the whole recipe, in bf16 and fp16, with per-tensor amax = max|x| (as the
autotuner's check uses) and with amax None. Shows which operand's on-GPU quantization departs from
the contract when a recipe misses the 1e-2 tolerance.
"""
from __future__ import annotations

import argparse

import torch

import mla_core
from mla_core.accuracy import rel_l2


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    args = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(0)
    n, h = args.len, args.heads
    cu = torch.tensor([0, n], dtype=torch.int32, device="cuda")
    for dtype in (torch.bfloat16, torch.float16):
        q, k = (torch.randn(n, h, 192, device="cuda", generator=g).to(dtype) for _ in range(2))
        v = torch.randn(n, h, 128, device="cuda", generator=g).to(dtype)
        amax = {"q": float(q.abs().max()), "k": float(k.abs().max()), "v": float(v.abs().max()), "p": 1.0}
        for fmt in ("fp8", "nvfp4"):
            for ops in ("q", "k", "v", "p", "kvp", "qkvp"):
                for with_amax in (False, True):
                    kw = {f"{o}_quant": fmt for o in ops}
                    if with_amax:
                        kw.update({f"{o}_amax": amax[o] for o in ops})
                    out = mla_core.mla_prefill(q, k, v, cu, cu, n, causal=True, backend="triton", **kw)
                    ref = mla_core.mla_prefill(q, k, v, cu, cu, n, causal=True, backend="reference", **kw)
                    print(f"{str(dtype)[6:]:8} {fmt:5} {ops:5} amax={'max' if with_amax else 'None':4} "
                          f"rel L2 {rel_l2(out, ref):.2e}", flush=True)


if __name__ == "__main__":
    main()
