"""Each SASS instruction of one kernel with the source line it came from and the calls it was inlined through, from
this machine's nvcc (the build's flags, -lineinfo included) and nvdisasm -gi. The device's nvcc is the same 13.0, so
the instruction stream is the one an ncu report of the device's build shows (stall_ledger.py checks that opcode by
opcode before it uses the lines).

    python3 benchmarks/probes/sass_lines.py csrc/mla_decode_wgmma_bf16_kv.cu 'decode_wgmma_kernelI13__nv_bfloat16Li0ELi0E'
    python3 benchmarks/probes/sass_lines.py ~/.cache/mla_core/build/<key>/mla_core_cuda_ext_<key>.so 'REGEX'

(a built binary, the extension's .so or an object file: its cubins are extracted with cuobjdump, so the lines are
those of exactly what ran) prints offset, innermost csrc/ frame first (then the frames it was inlined into), SASS. REGEX picks one kernel
among the unit's mangled names (without it the names are listed). nvdisasm: $NVDISASM, else beside nvcc, else the
copy Triton ships.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

FRAME = re.compile(r'"([^"]+)", line (\d+)')
INSTR = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;?\s*(/\*.*\*/)?\s*$")


def nvdisasm_path(nvcc):
    candidates = [os.environ.get("NVDISASM"), os.path.join(os.path.dirname(nvcc or ""), "nvdisasm"),
                  shutil.which("nvdisasm"),
                  *glob.glob(os.path.join(sys.prefix, "lib", "python3*", "site-packages", "triton", "backends",
                                          "nvidia", "bin", "nvdisasm"))]
    try:
        import triton
        candidates.append(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm"))
    except ImportError:
        pass
    return next((c for c in candidates if c and os.path.isfile(c) and os.access(c, os.X_OK)), None)


def disassemble(unit):
    """nvdisasm -gi text of the unit compiled as the build compiles it (its CUDA_FLAGS, csrc/ on the include path)."""
    from mla_core_cuda import build
    nvcc = build.nvcc_path()
    nvdisasm = nvdisasm_path(nvcc)
    if nvcc is None or nvdisasm is None:
        raise SystemExit(f"needs nvcc ({nvcc}) and nvdisasm ({nvdisasm})")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "unit.cubin")
        subprocess.run([nvcc, *build.CUDA_FLAGS, "-I", os.path.dirname(os.path.abspath(unit)), "-cubin", "-o", cubin,
                        unit], check=True)
        return subprocess.run([nvdisasm, "-gi", "-c", cubin], check=True, capture_output=True, text=True).stdout


def disassemble_binary(path):
    """nvdisasm -gi text of every cubin inside a built object (the extension's .so, or a .o): what ran, whatever
    flags built it."""
    from mla_core_cuda import build
    nvcc = build.nvcc_path()
    nvdisasm = nvdisasm_path(nvcc)
    cuobjdump = next((c for c in (os.path.join(os.path.dirname(nvdisasm or ""), "cuobjdump"),
                                  os.path.join(os.path.dirname(nvcc or ""), "cuobjdump"), shutil.which("cuobjdump"))
                      if c and os.path.isfile(c)), None)
    if nvdisasm is None or cuobjdump is None:
        raise SystemExit(f"needs cuobjdump ({cuobjdump}) and nvdisasm ({nvdisasm})")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([cuobjdump, "-xelf", "all", os.path.abspath(path)], cwd=tmp, check=True, capture_output=True)
        return "\n".join(subprocess.run([nvdisasm, "-gi", "-c", os.path.join(tmp, f)], check=True, capture_output=True,
                                        text=True).stdout for f in sorted(os.listdir(tmp)) if f.endswith(".cubin"))


def disassemble_any(path):
    """A .cu / .cuh unit is compiled here (disassemble); anything else is a built binary (disassemble_binary)."""
    return disassemble(path) if path.endswith((".cu", ".cuh")) else disassemble_binary(path)


def parse(text):
    """{mangled kernel name: [(offset, sass, frames)]}; frames innermost first, each (file, line); an instruction
    without its own line info keeps the previous one's (nvdisasm prints a line only when it changes)."""
    kernels, current, pending, last = {}, None, [], []
    for line in text.splitlines():
        m = re.match(r"^\.text\.(\S+):$", line)
        if m:
            current, pending, last = m.group(1), [], []
            kernels[current] = []
            continue
        if current is None:
            continue
        if line.lstrip().startswith("//## File"):
            pending.append([(f, int(n)) for f, n in FRAME.findall(line)])
            continue
        m = INSTR.match(line)
        if m:
            if pending:  # "A inlined at B", "B inlined at C", "C": the chain A < B < C
                last = []
                for frames in pending:
                    last += [f for f in frames if f not in last]
            kernels[current].append((int(m.group(1), 16), m.group(2).strip(), last))
            pending = []
    return kernels


def pick(kernels, regex):
    names = [k for k in kernels if re.search(regex, k)]
    if len(names) != 1:
        raise SystemExit(f"{len(names)} kernels match {regex!r}: " + ", ".join(names or kernels))
    return names[0], kernels[names[0]]


def where(frames, root="csrc/"):
    """'seesaw.cuh:120 < mla_decode_wgmma.cuh:598': the frames inside the project (toolkit headers dropped)."""
    own = [f"{os.path.basename(f)}:{n}" for f, n in frames if root in f]
    return " < ".join(own) if own else (f"{os.path.basename(frames[0][0])}:{frames[0][1]}" if frames else "?")


def opcode(sass):
    words = sass.split()
    while words and words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else "?"


def main(argv):
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    kernels = parse(disassemble_any(argv[0]))
    if len(argv) < 2:
        print("\n".join(kernels))
        return 0
    name, instrs = pick(kernels, argv[1])
    print(f"{name}: {len(instrs)} instructions")
    for off, sass, frames in instrs:
        print(f"{off:6x}  {where(frames):50s} {sass}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
