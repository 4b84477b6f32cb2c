#!/usr/bin/env python3
"""WG0's critical chain in schedule Q1 (q1_step), counted in SASS: from the S wait (the first
`WARPGROUP.DEPBAR.LE gsb0, 0x0` after the 36 m64n64k16 HGMMA of the loop) to the P0F arrive (`BAR.ARV 0x2`).

Usage: python3 benchmarks/probes/wg0_chain_ledger.py CUBIN [FUNCTION_SUBSTRING]
(default function: the bf16 Q1 instance decode_wgmma_kernel<bf16, kNoQuant, kNoQuant>, `Li0ELi0E`).

The chain is straight-line code in main; with the all-valid fast path it holds one branch (`@!P BRA` right after the
wait) and a `BRA` joining the two paths: both paths are counted (`masked` = fall-through, `all valid` = the branch
target). Pipe classes (sm_90, per SM sub-partition, one warp): fma (FMUL / FADD / FFMA / IMAD*: 1 warp instr a clk),
alu (FMNMX / FSEL / FSETP / LOP3 / IADD3 / SHF / LEA / ISETP / PLOP3 / VIADD ...: 16 lanes, 2 clk), mufu (MUFU:
4 lanes, 8 clk), mio (SHFL / STS / STSM / ST / LD / LDS / MEMBAR / FENCE / BAR / VOTE), uniform (U* / R2UR), other.
"""
import collections
import os
import re
import subprocess
import sys

CUOBJDUMP = os.environ.get("CUOBJDUMP") or "cuobjdump"


def sass(cubin, fn_sub):
    out = subprocess.run([CUOBJDUMP, "-sass", cubin], capture_output=True, text=True, check=True).stdout
    funcs = re.split(r"\n\s*Function : ", out)
    for f in funcs[1:]:
        name = f.split("\n", 1)[0]
        if fn_sub in name:
            ins = []
            for line in f.split("\n"):
                m = re.match(r"\s*/\*([0-9a-f]+)\*/\s+(.*?)\s*;", line)
                if m:
                    ins.append((int(m.group(1), 16), m.group(2)))
            return name, ins
    raise SystemExit("no function matching " + fn_sub)


def opcode(text):
    t = text.split()
    if t[0].startswith("@"):
        t = t[1:]
    return t[0]


def pipe(op):
    base = op.split(".")[0]
    if base == "MUFU":
        return "mufu"
    if base in ("FMUL", "FADD", "FFMA", "IMAD", "FMUL2", "FADD2", "FFMA2", "HFMA2", "MOV", "F2FP"):
        return "fma" if base not in ("MOV", "F2FP") else ("alu" if base == "F2FP" else "fma")
    if base in ("SHFL", "STS", "STSM", "ST", "LD", "LDS", "MEMBAR", "FENCE", "BAR", "VOTE", "S2R", "LDSM"):
        return "mio"
    if base.startswith("U") or base == "R2UR":
        return "uniform"
    if base in ("BRA", "WARPGROUP", "PLOP3", "NOP"):
        return "other"
    return "alu"


def chain(ins):
    # the loop's S: the last HGMMA.64x64x16 with gsb0 that is followed by a DEPBAR 0x0 before any other HGMMA
    s_end = [i for i, (_, t) in enumerate(ins) if "HGMMA.64x64x16" in t and "gsb0" in t]
    start = None
    for i in s_end:
        for j in range(i + 1, len(ins)):
            if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in ins[j][1]:
                start = j
                break
            if "HGMMA" in ins[j][1]:
                break
        if start is not None:
            break
    end = next(j for j in range(start, len(ins)) if "BAR.ARV 0x2" in ins[j][1])
    seg = ins[start:end + 1]
    addr = {a: k for k, (a, _) in enumerate(seg)}
    # paths: follow fall-through; a conditional branch inside the segment gives two paths
    paths = {}
    br = next((k for k, (_, t) in enumerate(seg) if opcode(t) == "BRA" and t.startswith("@")), None)
    if br is None:
        paths["straight"] = seg
    else:
        tgt = int(seg[br][1].split()[-1], 16)
        join = next(k for k, (_, t) in enumerate(seg) if opcode(t) == "BRA" and not t.startswith("@") and k > br)
        jt = int(seg[join][1].split()[-1], 16)
        paths["masked (fall-through)"] = seg[:br + 1] + seg[br + 1:join + 1] + seg[addr[jt]:]
        paths["all valid (branch)"] = seg[:br + 1] + seg[addr[tgt]:addr[jt]] + seg[addr[jt]:]
    return paths


def main():
    cubin = sys.argv[1]
    fn = sys.argv[2] if len(sys.argv) > 2 else "decode_wgmma_kernelI13__nv_bfloat16Li0ELi0E"
    name, ins = sass(cubin, fn)
    print(name)
    for label, seg in chain(ins).items():
        ops = collections.Counter(opcode(t) for _, t in seg if not opcode(t).startswith("@"))
        ops = collections.Counter()
        for _, t in seg:
            if "@!PT" in t:
                continue  # never-executed padding (@!PT LDS)
            ops[opcode(t)] += 1
        pipes = collections.Counter()
        for op, n in ops.items():
            pipes[pipe(op)] += n
        total = sum(ops.values())
        print(f"\n[{label}] {total} instructions")
        print("  pipes: " + ", ".join(f"{k} {v}" for k, v in sorted(pipes.items())))
        print(f"  floors (clk, one warp a sub-partition): issue {total}, alu {2 * pipes['alu']}, mufu {8 * pipes['mufu']}")
        for op, n in ops.most_common():
            print(f"    {n:4d} {op}")


if __name__ == "__main__":
    main()
