"""Compile the Triton layer prep (``layer._prep_kernel``) for sm_90a without a GPU; print its vector widths.

    python benchmarks/probes/prep_compile_report.py [--heads 128] [--interleave 1] [--copy-nope 1] [--dump DIR]

Drives ``layer._prep`` as the prefill (COPY_NOPE, ROWS) or the decode launch does, on CPU tensors shaped like
bench_layer's inputs (nope 128, rope 64, latent 512, bf16), each launch compiled by ``compile_report.compile_sm90``
(pointers and 16-multiple integers specialized as the JIT launcher does). Prints registers, spills and counts of
global loads / stores by width (PTX ``ld.global[.vN].bM``) and SASS totals. Run WITHOUT ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import sys
import types

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import compile_report  # noqa: E402


def _call(heads, tokens, interleave, nope=128, rope=64, latent=512, page=64):
    pages = -(-tokens // page)
    angles = torch.rand(tokens + 1, rope // 2) * 6.28
    return types.SimpleNamespace(
        q=torch.randn(tokens, heads, nope + rope).bfloat16(), kv=torch.randn(tokens, latent + rope).bfloat16(),
        latent_cache=torch.zeros(pages, page, latent + rope).bfloat16(),
        block_table=torch.arange(pages, dtype=torch.int32).view(1, pages),
        input_row_offsets=torch.tensor([0, tokens], dtype=torch.int32),
        cache_offsets=torch.zeros(1, dtype=torch.int32),
        freqs_cis=torch.stack((angles.cos(), angles.sin()), -1).flatten(1),
        kv_norm_gamma=torch.ones(latent).bfloat16(), epsilon=1e-6, nope_dim=nope, rope_dim=rope,
        kv_lora_rank=latent, rope_interleave=interleave)


def ptx_memory_ops(ptx: str) -> dict:
    """Counts of PTX global loads / stores by instruction form (``ld.global.v4.b32`` ...)."""
    ops = collections.Counter(m.group(1) for m in re.finditer(r"^\s*(?:@%p\d+\s+)?((?:ld|st)\.global[.\w]*)",
                                                                ptx, re.M))
    return dict(sorted(ops.items()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--interleave", type=int, default=1)
    ap.add_argument("--copy-nope", type=int, default=1)
    ap.add_argument("--dump", default=None)
    a = ap.parse_args()
    from mla_core_triton import layer
    call = _call(a.heads, 64, bool(a.interleave))
    nope, rope, latent = call.nope_dim, call.rope_dim, call.kv_lora_rank
    log = []
    saved = layer._prep_kernel
    layer._prep_kernel = compile_report._CompileOnly(saved, log)
    try:
        if a.copy_nope:
            q_pre = torch.empty(64, a.heads, nope + rope, dtype=torch.bfloat16)
            rows = torch.empty(64, latent + rope, dtype=torch.bfloat16)
            layer._prep(call, q_pre, nope, True, None, None, {"num_warps": 4}, rows=rows)
        else:
            q_dec = torch.empty(64, a.heads, latent + rope, dtype=torch.bfloat16)
            layer._prep(call, q_dec, latent, False, None, torch.empty(64, dtype=torch.int32), {"num_warps": 4})
    finally:
        layer._prep_kernel = saved
    for _, grid, compiled in log:
        regs, spills, shared = compile_report.resource_usage(compiled)
        counts, sass = compile_report.sass_counts(compiled)
        print(f"heads {a.heads} interleave {a.interleave} copy_nope {a.copy_nope} grid {grid}: regs {regs} "
              f"spills {spills} shared {shared}")
        print("  ptx:", ptx_memory_ops(compiled.asm["ptx"]))
        print("  sass:", counts)
        if a.dump:
            os.makedirs(a.dump, exist_ok=True)
            tag = f"h{a.heads}_i{a.interleave}_c{a.copy_nope}"
            for kind in ("ptx", "ttgir"):
                with open(os.path.join(a.dump, f"prep_{tag}.{kind}"), "w") as f:
                    f.write(compiled.asm[kind])
            with open(os.path.join(a.dump, f"prep_{tag}.sass"), "w") as f:
                f.write(sass)


if __name__ == "__main__":
    main()
