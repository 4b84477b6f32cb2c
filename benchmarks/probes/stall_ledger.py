"""Where a kernel's warps wait, per SASS instruction: a ledger of Nsight Compute's warp-state samples (the
SourceCounters section) from the report's source page,

    ncu --import r.ncu-rep --page source --csv --print-source sass > r_sass.csv
    python3 benchmarks/probes/stall_ledger.py r_sass.csv [--top 30] [--lines UNIT.cu:KERNEL_REGEX]

Prints the instructions with the most samples until they cover 90 % of them (at most --top), each with its share,
its SASS and its largest stall reasons where the page has per-reason columns, then the samples per opcode
(BAR.SYNC, SYNCS.*, WARPGROUP.*, HGMMA, ...). Column names differ between ncu versions: the sample column is the
one whose name holds "Sampling (All"; per-reason columns are the other numeric ones named "stall_*" or "... Stall
...". When it cannot find them it prints the header it saw and exits 1 (profile_kernels.sh SOURCE=1 runs it).
--lines compiles UNIT as the build does (or, given the extension's .so, extracts its cubins) and disassembles KERNEL
with its line info (sass_lines.py); when its opcodes
are the page's, one by one, each ledger row gets its source line and inlining chain, and the samples are also
summed per call site (the innermost csrc/ line outside hopper.cuh's one-instruction wrappers: which barrier, which
wait, which product).
"""
import argparse
import csv
import os
import re
import subprocess
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sass_lines  # noqa: E402


def read_page(path):
    """(header, rows) of the source page's table: the first row holding a 'Source' cell and a sampling cell."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f)]
    for i, row in enumerate(rows):
        if any(c.strip() == "Source" for c in row) and any("Sampling" in c for c in row):
            width = len(row)
            return row, [r for r in rows[i + 1:] if len(r) == width]
    return None, rows[:5]


def number(cell):
    try:
        return float(cell.replace(",", "")) if cell.strip() else 0.0
    except ValueError:
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=30)
    ap.add_argument("--lines", help="UNIT.cu:KERNEL_REGEX or EXTENSION.so:KERNEL_REGEX (sass_lines.py): each "
                    "instruction's source line")
    ap.add_argument("--roles", help="FILE:NAME=LO-HI,NAME=LO-HI,...: with --lines, the samples summed per warp role, an "
                    "instruction's role the first range of FILE (e.g. mla_decode_wgmma.cuh) its inlining chain passes "
                    "through (innermost first)")
    args = ap.parse_args(argv)
    header, rows = read_page(args.csv)
    if header is None:
        print("no source table found; the file starts with:")
        for r in rows:
            print("  ", r[:8])
        return 1
    src = header.index("Source") if "Source" in header else [c.strip() for c in header].index("Source")
    total_col = next((i for i, c in enumerate(header) if "Sampling (All" in c), None)
    if total_col is None:
        print("no 'Sampling (All ...' column; header:", header)
        return 1
    addr = next((i for i, c in enumerate(header) if c.strip() == "Address"), None)
    reason_cols = [i for i, c in enumerate(header)
                   if i not in (total_col, src) and "Sampling" not in c
                   and (c.lower().startswith("stall_") or re.search(r"\bstall", c, re.I))
                   and all(number(r[i]) is not None for r in rows[:50])]
    samples = [(number(r[total_col]) or 0.0, r) for r in rows]
    total = sum(s for s, _ in samples)
    if total <= 0:
        print(f"{len(rows)} instructions, no samples (was SourceCounters collected?)")
        return 1
    print(f"{len(rows)} SASS instructions, {total:.0f} warp-state samples; per-reason columns: "
          f"{[header[i] for i in reason_cols] or 'none on this page'}")
    lines = source_lines(args.lines, [r[src] for r in rows]) if args.lines else None
    print(f"{'address':>8s} {'samples':>8s} {'share':>6s} {'cum':>6s}  sass / largest reasons")
    cum = 0.0
    order = sorted(range(len(rows)), key=lambda i: -samples[i][0])
    for k, i in enumerate(order):
        s, r = samples[i]
        if k >= args.top or cum >= 0.9 * total:
            break
        cum += s
        reasons = sorted(((number(r[i]) or 0.0, header[i]) for i in reason_cols), reverse=True)[:3]
        why = ", ".join(f"{n} {v:.0f}" for v, n in reasons if v > 0)
        where = r[addr] if addr is not None else str(k)
        print(f"{where:>8s} {s:8.0f} {100 * s / total:5.1f}% {100 * cum / total:5.1f}%  {r[src].strip()[:90]}"
              + (f"  [{why}]" if why else "") + (f"\n{'':33s}at {sass_lines.where(lines[i])}" if lines else ""))
    by_op = Counter()
    for s, r in samples:
        by_op[sass_lines.opcode(r[src])] += s
    print("samples per opcode:")
    for op, s in by_op.most_common(15):
        print(f"  {op:40s} {s:8.0f} {100 * s / total:5.1f}%")
    if lines:
        by_site = Counter()
        for (s, _), frames in zip(samples, lines):
            by_site[call_site(frames)] += s
        print("samples per call site (csrc/ line, outside hopper.cuh's wrappers):")
        for site, s in by_site.most_common(20):
            print(f"  {site:40s} {s:8.0f} {100 * s / total:5.1f}%")
        if args.roles:
            print_roles(args.roles, samples, lines, header, reason_cols)
    return 0


def print_roles(spec, samples, lines, header, reason_cols):
    """Samples per warp role (--roles), with each role's largest stall reasons and call sites."""
    name, _, ranges = spec.partition(":")
    roles = [(r.split("=")[0], *map(int, r.split("=")[1].split("-"))) for r in ranges.split(",")]
    by_role, reasons, sites = Counter(), {}, {}
    for (s, r), frames in zip(samples, lines):
        own = [n for f, n in frames if f.endswith(name)]
        role = next((k for n in own for k, lo, hi in roles if lo <= n <= hi), "other")
        by_role[role] += s
        reasons.setdefault(role, Counter()).update({header[i]: number(r[i]) or 0.0 for i in reason_cols
                                                    if "Not Issued" not in header[i]})
        sites.setdefault(role, Counter())[call_site(frames)] += s
    total = sum(by_role.values())
    print(f"samples per warp role ({name}):")
    for role, s in by_role.most_common():
        why = ", ".join(f"{k} {v:.0f}" for k, v in reasons[role].most_common(4))
        where = ", ".join(f"{k} {v:.0f}" for k, v in sites[role].most_common(5))
        print(f"  {role:12s} {s:8.0f} {100 * s / total:5.1f}%  [{why}]\n{'':16s}at {where}")


def source_lines(spec, page_sass):
    """Per page row, the frames of the same instruction in this machine's build of UNIT (None, with the reason
    printed, when the two instruction streams differ)."""
    unit, _, regex = spec.partition(":")
    try:
        name, instrs = sass_lines.pick(sass_lines.parse(sass_lines.disassemble_any(unit)), regex)
    except (SystemExit, OSError, ImportError, subprocess.CalledProcessError) as e:
        print(f"--lines {spec}: no source lines ({type(e).__name__}: {e})")
        return None
    ours = [sass_lines.opcode(x) for _, x, _ in instrs]
    theirs = [sass_lines.opcode(x) for x in page_sass]
    same = sum(a == b for a, b in zip(ours, theirs))
    print(f"--lines {name[-80:]}: {len(ours)} instructions here, {len(theirs)} on the page, {same} opcodes equal")
    if len(ours) != len(theirs) or same < len(ours):
        print("  not the same instruction stream: no source lines (another nvcc, flags or source than the profile's)")
        return None
    return [frames for _, _, frames in instrs]


def call_site(frames):
    own = [(f, n) for f, n in frames if "csrc/" in f and not f.endswith("hopper.cuh")]
    return f"{own[0][0].rsplit('/', 1)[-1]}:{own[0][1]}" if own else sass_lines.where(frames)


if __name__ == "__main__":
    sys.exit(main())
