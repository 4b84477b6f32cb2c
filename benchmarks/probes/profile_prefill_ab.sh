#!/usr/bin/env bash
# Nsight Compute profile of two versions of the prefill kernel, side by side, at causal 4 x 4096 bf16, 128 heads
# (prefill_ab.cu's first case): "new" = the csrc of a whole-tree snapshot (NEW_TREE, default
# benchmarks/ab_new_prefill: `git archive <branch>` there), "old" = AB_OLD (default benchmarks/ab_base_prefill/csrc:
# `git archive main csrc`). Question (benchmarks/NOTES.md, "Prefill 256-thread register relief: why it was slower
# (round i)"): where the 256-thread kernel's extra ~15 % goes (warp states, scheduler, tensor pipe, per-instruction
# stall samples). One device call, run from the repository root (clocks left alone: --clock-control none):
#   MLA_COMMIT=<hash> OUT=$OUT bash benchmarks/probes/profile_prefill_ab.sh
# Builds both binaries with the snapshot's run_prefill_ab.sh (AB_BUILD_ONLY=1; -lineinfo -Xptxas -v, which change
# no SASS), then per version one ncu run of the 6th launch of prefill_kernel (4x4096 bf16: 2 warm-ups + 3 timed
# before it), --kill once profiled. Writes ONE file, $OUT/profile_prefill_ab.tar.gz (reports, details, raw and SASS
# source pages as csv, SASS dumps, build log), and prints a summary of <= 50 lines. Steps under `timeout`:
# BUILD_S (60), NCU_S (45 each), EXPORT_S (15 each); expected ~80-120 s in all (the build ~10-20 s).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$(mktemp -d)}
NEW_TREE=$(cd "${NEW_TREE:-benchmarks/ab_new_prefill}" && pwd) || { echo "no NEW_TREE snapshot"; exit 2; }
AB_OLD=$(cd "${AB_OLD:-benchmarks/ab_base_prefill/csrc}" && pwd) || { echo "no AB_OLD csrc"; exit 2; }
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
W=$(mktemp -d)  # everything goes here, then into the one tar
t0=$(date +%s)
stamp() { echo "--- $1 at +$(( $(date +%s) - t0 )) s"; }
echo "commit ${MLA_COMMIT:-?}; new $NEW_TREE/csrc, old $AB_OLD; $("$NCU" --version 2>/dev/null | tail -1)"
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null

rm -f /tmp/prefill_ab_new /tmp/prefill_ab_old  # a warm machine's binaries of an earlier call
timeout "${BUILD_S:-60}" env AB_BUILD_ONLY=1 AB_OLD="$AB_OLD" AB_NEW_FLAGS="-lineinfo -Xptxas -v" \
  AB_OLD_FLAGS="-lineinfo -Xptxas -v" bash "$NEW_TREE/benchmarks/probes/run_prefill_ab.sh" >"$W/build.log" 2>&1
rc=$?
echo "ptxas (count x): $(grep -oE "Used [0-9]+ registers|[0-9]+ bytes spill stores" "$W/build.log" | sort | uniq -c \
  | tr -s ' ' | tr '\n' ';')"
[ $rc = 0 ] && [ -x /tmp/prefill_ab_new ] && [ -x /tmp/prefill_ab_old ] || {
  tail -20 "$W/build.log"; echo "BUILD FAILED rc=$rc"; tar -czf "$OUT/profile_prefill_ab.tar.gz" -C "$W" .; exit 2; }
stamp build
for v in new old; do timeout 20 cuobjdump -sass /tmp/prefill_ab_$v >"$W/sass_$v.txt" 2>&1; done

METRICS="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum"
METRICS+=",smsp__cycles_active.avg,sm__cycles_elapsed.avg.per_second,smsp__inst_executed.sum"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_xu.sum"
METRICS+=",smsp__inst_executed_pipe_uniform.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
METRICS+=",lts__t_sector_hit_rate.pct,dram__bytes_read.sum"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats --section ComputeWorkloadAnalysis"
SECTIONS+=" --section LaunchStats --section Occupancy --section SourceCounters"
for v in new old; do
  rep="$W/ncu_$v"
  nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null | sed "s/^/clock before $v: /"
  timeout "${NCU_S:-45}" "$NCU" --clock-control none --kernel-name regex:prefill_kernel --launch-skip 5 \
    --launch-count 1 --kill yes $SECTIONS --metrics "$METRICS" -o "$rep" -f /tmp/prefill_ab_$v "prof.$v" \
    >"$W/ncu_${v}_run.txt" 2>&1
  echo "ncu $v rc=$?"
  if [ ! -f "$rep.ncu-rep" ]; then  # an unknown metric fails the whole run: then the sections alone
    tail -4 "$W/ncu_${v}_run.txt"
    timeout "${NCU_S:-45}" "$NCU" --clock-control none --kernel-name regex:prefill_kernel --launch-skip 5 \
      --launch-count 1 --kill yes $SECTIONS -o "$rep" -f /tmp/prefill_ab_$v "prof.$v" >"$W/ncu_${v}_run2.txt" 2>&1
    echo "ncu $v (sections only) rc=$?"
  fi
  if [ -f "$rep.ncu-rep" ]; then
    timeout "${EXPORT_S:-15}" "$NCU" --import "$rep.ncu-rep" --print-details all >"$W/ncu_${v}.txt" 2>&1
    timeout "${EXPORT_S:-15}" "$NCU" --import "$rep.ncu-rep" --page raw --csv >"$W/ncu_${v}_raw.csv" 2>&1
    timeout "${EXPORT_S:-15}" "$NCU" --import "$rep.ncu-rep" --page source --csv --print-source sass \
      >"$W/ncu_${v}_sass.csv" 2>&1
  fi
  stamp "ncu $v"
done

# Summary: the same figures for both versions (new / old), then the top SASS lines by stall samples of each.
timeout 30 python3 - "$W" <<'PY' 2>&1 | tee "$W/summary.txt"
import csv, os, re, sys
from collections import Counter
w = sys.argv[1]

def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return None

def raw(v):  # the raw page: metric name -> value (first profiled kernel)
    p = f"{w}/ncu_{v}_raw.csv"
    if not os.path.exists(p):
        return {}
    rows = [r for r in csv.reader(open(p)) if r]
    head = next((i for i, r in enumerate(rows) if r[0] == "ID"), None)
    return {} if head is None or len(rows) < head + 3 else dict(zip(rows[head], rows[head + 2]))

R = {v: raw(v) for v in ("new", "old")}
show = [("gpu__time_duration.sum", "duration"), ("smsp__cycles_active.avg", "SMSP active cycles"),
        ("sm__cycles_elapsed.avg.per_second", "SM clock /s"), ("launch__registers_per_thread", "registers"),
        ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
        ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active %"),
        ("smsp__inst_executed.sum", "warp instructions"), ("smsp__inst_executed_pipe_xu.sum", "XU (MUFU) instr"),
        ("smsp__inst_executed_pipe_uniform.sum", "uniform instr"),
        ("smsp__warps_active.avg.per_cycle_active", "active warps / scheduler"),
        ("smsp__warps_eligible.avg.per_cycle_active", "eligible warps / scheduler"),
        ("smsp__issue_inst0.avg.pct_of_peak_sustained_active", "no-eligible cycles %"),
        ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "smem bank conflicts"),
        ("lts__t_sector_hit_rate.pct", "L2 hit %")]
print(f"{'metric':34s} {'new':>14s} {'old':>14s} {'new/old':>8s}")
for key, name in show:
    a, b = num(R["new"].get(key)), num(R["old"].get(key))
    if a is None and b is None:
        continue
    ratio = f"{a / b:8.3f}" if a is not None and b else ""
    print(f"{name:34s} {a if a is not None else '-':>14} {b if b is not None else '-':>14} {ratio}")
# warp states: cycles a warp spends per issued instruction in each state, largest first (new's order)
st = lambda d: {k.split("issue_stalled_")[1].split("_per_issue_active")[0]: num(x) for k, x in d.items()
                if "issue_stalled_" in k and k.endswith("_per_issue_active.ratio") and "not_issued" not in k
                and num(x) is not None}
sn, so = st(R["new"]), st(R["old"])
if sn:
    top = sorted(sn, key=lambda k: -sn[k])[:9]
    print("stall cycles / issue (new | old): " + ", ".join(f"{k} {sn[k]:.2f}|{so.get(k, 0):.2f}" for k in top))

def source(v):  # SASS source page: (instruction, samples, {reason: samples}) per line
    p = f"{w}/ncu_{v}_sass.csv"
    if not os.path.exists(p):
        return []
    rows = list(csv.reader(open(p)))
    h = next((i for i, r in enumerate(rows) if "Source" in r and "Warp Stall Sampling (All Samples)" in r), None)
    if h is None:
        return []
    hd = rows[h]
    iS, iN = hd.index("Source"), hd.index("Warp Stall Sampling (All Samples)")
    rs = [(j, c[6:]) for j, c in enumerate(hd) if c.startswith("stall_")]
    out = []
    for k, r in enumerate(rows[h + 1:]):
        if len(r) > iN and num(r[iN]) is not None:
            out.append((k, r[iS].strip(), num(r[iN]), {c: num(r[j]) or 0 for j, c in rs}))
    return out

for v in ("new", "old"):
    s = source(v)
    if not s:
        print(f"{v}: no source page")
        continue
    tot = sum(x[2] for x in s) or 1
    by = Counter()
    for _, ins, n, _ in s:
        t = ins.split()
        by[(t[1] if t and t[0].startswith("@") and len(t) > 1 else (t[0] if t else "?")).split(".")[0]] += n
    print(f"{v}: {tot:.0f} samples; by opcode " + ", ".join(f"{o} {100 * n / tot:.1f}%" for o, n in by.most_common(8)))
    for k, ins, n, why in sorted(s, key=lambda x: -x[2])[:7]:
        r3 = " ".join(f"{c}:{100 * x / n:.0f}%" for c, x in sorted(why.items(), key=lambda y: -y[1])[:2] if x)
        print(f"  {v} #{k:<5d} {100 * n / tot:5.1f}%  {ins[:44]:44s} {r3}")
PY
stamp summary
# one file back (16 MiB at most): gzip'd; past 15 MiB without the SASS dumps (the reports hold the SASS too)
tar -czf "$OUT/profile_prefill_ab.tar.gz" -C "$W" .
[ "$(stat -c %s "$OUT/profile_prefill_ab.tar.gz")" -gt 15000000 ] \
  && tar -czf "$OUT/profile_prefill_ab.tar.gz" -C "$W" --exclude='sass_*.txt' --exclude='*_sass.csv' .
ls -l "$OUT/profile_prefill_ab.tar.gz" && rm -rf "$W"
