"""Compile the musa_fp8 RoPE + FP8 kernel for sm_90a without a GPU: registers, shared memory and each thread's order
of global loads, first uses and stores in each program kind (the SASS), per config, for this checkout and a base.

    python benchmarks/compile_report_rope.py [--base DIR] [--heads 128] [--neox]

The launcher ``rope.run`` is driven as on the device (tokens 4096, outputs as slices of 576-byte rows, bf16,
float32 cos/sin, int64 positions) on ``meta`` tensors, so the kernel compiles for the GPU path (``HW``) through
compile_report.py's stand-in instead of launching. DIR: a folder holding a base's
``backends/musa_fp8/mla_core_musa_fp8`` (as for bench_rope_ab.py). The order line, in SASS order, ``|`` between the
code paths that end in an unpredicated EXIT (main's kernel: query | key; this one: NOPE | RoPE | key programs):
``L<bits>`` a global load, ``S<bits>`` a store, ``c`` a run of E4M3 conversions, ``m`` a run of FP32 multiplies; a
``c``/``m`` between loads means the thread waits for an earlier load before issuing the later ones (one more memory
round trip). Must run WITHOUT ``TRITON_INTERPRET=1``.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("MLA_CORE_CHECKS", "metadata")  # no value checks: meta tensors hold no values
sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
from compile_report import _BIN, _CompileOnly, resource_usage  # noqa: E402
from bench_rope_ab import load_base  # noqa: E402

from mla_core import specs  # noqa: E402


def order(compiled) -> str:
    """The query branch's global loads / stores and the conversion / multiply runs between them, in SASS order."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    toks = []
    for line in sass.splitlines():
        if "*/" not in line or ";" not in line:
            continue
        words = line.split("*/", 1)[1].split(";", 1)[0].split()
        op = [w for w in words if not w.startswith("@")][:1]
        if not op:
            continue
        op = op[0]
        if op.startswith(("LDG", "STG")):
            width = op.split(".")[-1] if op.count(".") > 1 else "32"
            toks.append(("L" if op.startswith("LDG") else "S") + width)
        elif op.startswith("F2FP") or op.startswith("FMUL"):
            mark = "c" if op.startswith("F2FP") else "m"
            if not toks or toks[-1] != mark:
                toks.append(mark)
        elif op == "EXIT" and not words[0].startswith("@") and toks and toks[-1] != "|":
            toks.append("|")
    return " ".join(toks).rstrip(" |")


def report(rope, heads, neox, label):
    nnz = 4096
    dev = "meta"
    q_rope = torch.empty(nnz, heads, 64, dtype=torch.bfloat16, device=dev)
    k_rope = torch.empty(nnz, 64, dtype=torch.bfloat16, device=dev)
    q_nope = torch.empty(nnz, heads, 512, dtype=torch.bfloat16, device=dev)
    k_nope = torch.empty(nnz, 512, dtype=torch.bfloat16, device=dev)
    cos_sin = torch.empty(32768, 64, dtype=torch.float32, device=dev)
    pos = torch.empty(nnz, dtype=torch.int64, device=dev)
    q_rows = torch.empty(nnz, heads, 576, dtype=torch.float8_e4m3fn, device=dev)
    k_rows = torch.empty(nnz, 576, dtype=torch.float8_e4m3fn, device=dev)
    problem, call = specs.validate_rope_quantize(q_rope, k_rope, q_nope, k_nope, cos_sin, pos, neox, None, 0.5, 2.0,
                                                 q_rows[..., 512:], k_rows[:, 512:], q_rows[..., :512],
                                                 k_rows[:, :512])
    saved = rope._rope_quantize_kernel
    for config in rope.configs(problem):
        log = []
        rope._rope_quantize_kernel = _CompileOnly(saved, log)
        try:
            rope.run(call, config)
        finally:
            rope._rope_quantize_kernel = saved
        _, grid, compiled = log[0]
        regs, spill, shared = resource_usage(compiled)
        print(f"{label} {config} neox={int(neox)} grid={tuple(grid)} regs={regs} spill={spill} smem={shared}\n"
              f"    {order(compiled)}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", help="folder with a base's backends/musa_fp8/mla_core_musa_fp8")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--neox", action="store_true", help="NeoX pairs (default: interleaved, as bench_rope.py)")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET=1 (the interpreter replaces the jit functions)")
    from mla_core_musa_fp8 import rope
    versions = [("base", load_base(args.base))] if args.base else []
    for label, module in versions + [("this", rope)]:
        report(module, args.heads, args.neox, label)


if __name__ == "__main__":
    main()
