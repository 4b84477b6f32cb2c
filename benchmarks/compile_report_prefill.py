"""Compile-only report of the triton prefill kernel for sm_90a (no GPU needed).

    python benchmarks/compile_report_prefill.py [--recipe bf16|fp8|nvfp4 ...] [--absorbed] [--sass DIR]

For each recipe and each config of ``prefill.configs`` on the benchmark problem (causal, heads 128,
dims 192/128, bf16, block_n 64) and, with --absorbed, on the 576/512 shape, builds the attention kernel
with triton.compile for GPUTarget("cuda", 90, 32) -- pointer arguments and strides marked 16-divisible
as the launcher specializes them -- runs ptxas -v on the PTX and prints registers, spill bytes, shared memory, the
SASS instruction count of the whole kernel and of its key-tile loops (unmasked, masked), and an opcode
mix. With BLOCK_M 128 / 8 warps one loop iteration handles 32 P elements per thread.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from mla_core_triton import prefill

_BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
_TYPE = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32"}


def compile_kernel(fn, args: dict, constexprs: dict, num_warps: int, num_stages: int):
    """triton.compile ``fn`` for sm_90a; args maps each runtime argument to a tensor, int or float."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
            continue
        v = args[name]
        if isinstance(v, torch.Tensor):
            signature[name] = _TYPE[v.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            signature[name] = "i1"
        elif isinstance(v, int):
            signature[name] = "i32"
            if name.startswith("stride") or name.endswith("_stride_h"):
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32"
    src = ASTSource(fn, signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def ptxas_report(ptx: str, workdir: str) -> tuple[int, int, str]:
    """(registers, spill store bytes, SASS text) of one PTX module built with ptxas for sm_90a."""
    path = os.path.join(workdir, "k.ptx")
    with open(path, "w") as f:
        f.write(ptx)
    cubin = os.path.join(workdir, "k.cubin")
    res = subprocess.run([os.path.join(_BIN, "ptxas"), "-v", "--gpu-name", "sm_90a", path, "-o", cubin],
                         capture_output=True, text=True, check=True)
    regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    spills = int(re.search(r"(\d+) bytes spill stores", res.stderr).group(1))
    sass = subprocess.run([os.path.join(_BIN, "cuobjdump"), "-sass", cubin], capture_output=True, text=True,
                          check=True).stdout
    return regs, spills, sass


def sass_mix(sass: str) -> collections.Counter:
    """Opcode (first mnemonic, without modifiers) counts of a SASS listing."""
    mix = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            mix[m.group(1)] += 1
    return mix


class _Recorder:
    """Stands in for a Triton kernel: ``k[grid](*args, **kw)`` records the launch instead of running it."""

    def __init__(self, fn, launches: list):
        self.fn, self.launches = fn, launches

    def __getitem__(self, grid):
        def launch(*args, **kw):
            self.launches.append((self.fn, args, kw))
        return launch


def attention_launch(problem, call, config: dict):
    """(fn, runtime args by name, constexprs, num_warps, num_stages) of the attention kernel ``run`` launches."""
    launches = []
    saved = {name: getattr(prefill, name) for name in ("_prefill_kernel", "_k_codes_kernel", "_v_codes_kernel")}
    try:
        for name, fn in saved.items():
            setattr(prefill, name, _Recorder(fn, launches))
        prefill.run(call, config)
    finally:
        for name, fn in saved.items():
            setattr(prefill, name, fn)
    fn, args, kw = next(x for x in launches if x[0] is saved["_prefill_kernel"])
    kw = dict(kw, HW_FP8=int(kw["HW_FP8"]) | 1)  # built as on the GPU (bit 1, the division path, kept)
    num_warps, num_stages = kw.pop("num_warps"), kw.pop("num_stages")
    named = dict(zip(fn.arg_names, args))
    constexprs = {k: v for k, v in kw.items()}
    return fn, named, constexprs, num_warps, num_stages


def make_problem(recipe: str, qk_dim: int, v_dim: int, heads: int = 128, length: int = 256, block_n: int = 64):
    """A (cuda-device Problem, PrefillCall on CPU tensors) pair for the compile-only build."""
    import dataclasses

    from mla_core import specs
    q = torch.randn(length, heads, qk_dim, dtype=torch.bfloat16)
    k = torch.randn(length, heads if v_dim != 512 else 1, qk_dim, dtype=torch.bfloat16)
    v = torch.randn(length, k.shape[1], v_dim, dtype=torch.bfloat16)
    cu = torch.tensor([0, length], dtype=torch.int32)
    fmt = None if recipe == "bf16" else recipe
    problem, call = specs.validate_prefill(
        q, k, v, cu, cu, length, None, True, False, q_quant=fmt, k_quant=fmt, p_quant=fmt, v_quant=fmt,
        q_amax=None, k_amax=None, p_amax=1.0, v_amax=None, sparsity_n=0, sparsity_m=4, dense_sink_tokens=0,
        dense_recent_tokens=64, block_m=64, block_n=block_n)
    return dataclasses.replace(problem, device="cuda"), call


def loop_sizes(sass: str) -> list[int]:
    """Instruction counts of the kernel's loops (bodies over 200 instructions, between a backward branch
    and its target) in program order: for the attention kernel, the unmasked key-tile loop, then the
    masked one."""
    ins = []
    for line in sass.splitlines():
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", line)
        if m:
            ins.append((int(m.group(1), 16), m.group(2), m.group(3)))
    sizes = []
    for addr, op, rest in ins:
        target = re.search(r"0x([0-9a-f]+)", rest) if op == "BRA" else None
        if target and int(target.group(1), 16) < addr:
            n = sum(1 for a, _, _ in ins if int(target.group(1), 16) <= a <= addr)
            if n > 200:
                sizes.append(n)
    return sizes


KEYS = ("FFMA", "FMUL", "FADD", "FMNMX", "MUFU", "F2FP", "F2F", "HADD2", "PRMT", "LOP3", "IMAD", "IADD3", "SHF",
        "SHFL", "FSETP", "FSEL", "SEL", "BRA", "CALL", "BSSY", "LDS", "STS", "LDL", "STL", "HGMMA", "WARPGROUP")


def report(recipe: str, qk_dim: int, v_dim: int, configs=None, sass_dir: str | None = None) -> list[dict]:
    import tempfile
    problem, call = make_problem(recipe, qk_dim, v_dim)
    rows = []
    for i, config in enumerate(configs or prefill.configs(problem)):
        fn, named, constexprs, num_warps, num_stages = attention_launch(problem, call, config)
        kernel = compile_kernel(fn, named, constexprs, num_warps, num_stages)
        with tempfile.TemporaryDirectory() as tmp:
            regs, spills, sass = ptxas_report(kernel.asm["ptx"], tmp)
        if sass_dir:
            os.makedirs(sass_dir, exist_ok=True)
            with open(os.path.join(sass_dir, f"{recipe}_{qk_dim}_{i}.sass"), "w") as f:
                f.write(sass)
            with open(os.path.join(sass_dir, f"{recipe}_{qk_dim}_{i}.ttgir"), "w") as f:
                f.write(kernel.asm["ttgir"])
        mix, loops = sass_mix(sass), loop_sizes(sass)
        smem = kernel.metadata.shared
        rows.append(dict(recipe=recipe, dims=f"{qk_dim}/{v_dim}", config=config, regs=regs, spills=spills,
                         shared=smem, total=sum(mix.values()), loops=loops, mix={k: mix[k] for k in KEYS if mix[k]}))
        print(f"{recipe} {qk_dim}/{v_dim} {config}: {regs} regs, {spills} B spills, {smem // 1024} KiB shared, "
              f"{sum(mix.values())} SASS "
              f"instructions, loops {loops}; " + " ".join(f"{k}={mix[k]}" for k in KEYS if mix[k]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", nargs="*", default=["bf16", "fp8", "nvfp4"])
    ap.add_argument("--absorbed", action="store_true", help="also the 576/512 shape")
    ap.add_argument("--sass", help="write each kernel's SASS and TTGIR into this folder")
    args = ap.parse_args()
    for recipe in args.recipe:
        report(recipe, 192, 128, sass_dir=args.sass)
        if args.absorbed:
            report(recipe, 576, 512, sass_dir=args.sass)


if __name__ == "__main__":
    main()
