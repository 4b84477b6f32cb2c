"""Compile the Triton decode for sm_90a on a machine without a GPU and report registers, spills, SASS mix.

    python benchmarks/compile_report.py [--heads 16,128] [--recipes bf16,fp8,nvfp4] [--batch 2] [--top 3] [--sass DIR]

For each (heads, recipe) the launcher ``mla_core_triton.decode.run`` is driven exactly as on the device
(same arguments, constexprs and launch options; ``on_gpu`` code paths), but every kernel launch compiles
through ``triton.compile`` for ``GPUTarget("cuda", 90, 32)`` with Triton's bundled ptxas instead of
running. Arguments are specialized the way the real launcher does (pointers and 16-divisible integers
get ``tt.divisibility=16``, integers equal to 1 become constants): without that, loads are scalar and
everything spills. Per kernel it prints registers per thread, spill stores/loads (bytes of local memory),
shared memory, and a SASS count: tensor-core MMAs (HGMMA/HMMA), FP32 ALU (FFMA/FMUL/FADD/FSETP/FSEL/
FMNMX/MUFU), conversions (F2F/F2FP/I2F/F2I), 16-byte global loads (LDG.E.128 / LDGSTS.128) and the
total. Must run WITHOUT ``TRITON_INTERPRET=1`` (the interpreter replaces ``@triton.jit`` functions).
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.runtime.jit import create_function_from_signature

TARGET = GPUTarget("cuda", 90, 32)
_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
SASS_GROUPS = {
    "mma": ("HGMMA", "HMMA", "QGMMA"),
    "fp32": ("FFMA", "FMUL", "FADD", "FSETP", "FSEL", "FMNMX", "MUFU", "FSET", "FCHK"),
    "cvt": ("F2F", "F2FP", "I2F", "F2I", "I2FP", "F2IP"),
    "int": ("IMAD", "IADD3", "LOP3", "SHF", "ISETP", "SEL", "LEA", "PRMT"),
}


def compile_sm90(jit_fn, args, kwargs):
    """Compile ``jit_fn(*args, **kwargs)`` for sm_90a as the JIT launcher would specialize it."""
    backend = make_backend(TARGET)
    binder = create_function_from_signature(jit_fn.signature, jit_fn.params, backend)
    kwargs = dict(kwargs, debug=False)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(jit_fn, signature, constexprs, attrs), target=TARGET, options=options.__dict__)


class _CompileOnly:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` compiles for sm_90a and records it."""

    def __init__(self, jit_fn, log):
        self.jit_fn, self.log = jit_fn, log

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            compiled = compile_sm90(self.jit_fn, args, kwargs)
            compiled.n_regs, compiled.n_spills = resource_usage(compiled)[:2]
            self.log.append((self.jit_fn.__name__, grid, compiled))
            return compiled
        return launch


def resource_usage(compiled):
    """(registers, spill bytes stored + loaded, shared bytes) of a compiled kernel, from cuobjdump."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-res-usage", f.name], capture_output=True,
                              text=True, check=True).stdout
    regs = int(re.search(r"REG:(\d+)", text).group(1))
    spill = sum(int(x) for x in re.findall(r"(?:STACK|LOCAL):(\d+)", text)[1:])  # LOCAL = spilled bytes
    shared = compiled.metadata.shared
    stack = int(re.search(r"STACK:(\d+)", text).group(1))
    return regs, max(spill, stack), shared


def sass_counts(compiled):
    """Opcode counts of the kernel's SASS, grouped (see SASS_GROUPS), plus 16-byte global loads."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops[m.group(1)] += 1
    out = {group: sum(n for op, n in ops.items() if op.split(".")[0] in names) for group, names in SASS_GROUPS.items()}
    out["ld128"] = sum(n for op, n in ops.items() if op.startswith(("LDG", "LDGSTS")) and ".128" in op)
    out["ldg"] = sum(n for op, n in ops.items() if op.startswith(("LDG", "LDGSTS")))
    out["total"] = sum(ops.values())
    return out, sass


def report_decode(heads, recipe, top=None, configs=None, sass_dir=None, batch=2, length=8192, splits=32):
    """Compile ``decode.run`` for one problem and each config (given, else the first ``top`` of
    ``configs(problem)``); returns one row of resource and SASS counts per compiled kernel."""
    from mla_core.specs import validate_decode
    from mla_core_triton import decode as kernels
    formats = {"bf16": None, "fp8": "fp8", "nvfp4": "nvfp4"}[recipe]
    rank, rope, page = 512, 64, 64
    pages = -(-length // page)
    cache = torch.randn(batch * pages, page, rank + rope, dtype=torch.bfloat16)
    table = torch.arange(batch * pages, dtype=torch.int32).view(batch, pages)
    q = torch.randn(batch, heads, rank + rope, dtype=torch.bfloat16)
    lens = torch.full((batch,), length, dtype=torch.int32)
    problem, call = validate_decode(
        q, cache, table, lens, softmax_scale=(rank + rope) ** -0.5, kv_lora_rank=rank, qk_rope_head_dim=rope,
        page_size=None, num_kv_splits=splits, k_qdq=formats, k_qdq_amax=None, v_qdq=formats, v_qdq_amax=None,
        p_qdq=formats, p_qdq_amax=1.0, return_lse=True, out_dtype=None)
    rows = []
    for config in configs or kernels.configs(problem)[:top]:
        log = []
        saved = {name: getattr(kernels, name) for name in kernels.JIT_KERNELS}
        try:
            for name in kernels.JIT_KERNELS:
                setattr(kernels, name, _CompileOnly(saved[name], log))
            kernels.run(call, config, on_gpu=True)
        finally:
            for name, fn in saved.items():
                setattr(kernels, name, fn)
        for kernel_name, grid, compiled in log:
            regs, spills, shared = resource_usage(compiled)
            counts, sass = sass_counts(compiled)
            rows.append(dict(heads=heads, recipe=recipe, config=config, kernel=kernel_name, grid=grid, regs=regs,
                             spills=spills, shared=shared, **counts))
            if sass_dir:
                os.makedirs(sass_dir, exist_ok=True)
                tag = "_".join(f"{k}{v}" for k, v in config.items())
                with open(os.path.join(sass_dir, f"h{heads}_{recipe}_{kernel_name}_{tag}.sass"), "w") as f:
                    f.write(sass)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", default="16,128")
    ap.add_argument("--recipes", default="bf16,fp8,nvfp4")
    ap.add_argument("--top", type=int, default=3, help="compile the first N configs of each problem")
    ap.add_argument("--batch", type=int, default=2, help="batch of the problem (configs() ranks by it)")
    ap.add_argument("--sass", default=None, help="write each kernel's SASS into this folder")
    args = ap.parse_args()
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("run without TRITON_INTERPRET=1 (the interpreter replaces the kernels)")
    print("heads recipe kernel           regs spill  smem   mma  fp32   cvt   int ld128/ldg total  config")
    for heads in (int(h) for h in args.heads.split(",")):
        for recipe in args.recipes.split(","):
            for r in report_decode(heads, recipe, top=args.top, sass_dir=args.sass, batch=args.batch):
                print(f"{heads:5d} {recipe:6s} {r['kernel'][:16]:16s} {r['regs']:4d} {r['spills']:5d} {r['shared']:5d} "
                      f"{r['mma']:5d} {r['fp32']:5d} {r['cvt']:5d} {r['int']:5d} {r['ld128']:5d}/{r['ldg']:<3d} "
                      f"{r['total']:5d}  {r['config']}", flush=True)


if __name__ == "__main__":
    main()
