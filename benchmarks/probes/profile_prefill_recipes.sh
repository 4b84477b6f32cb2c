#!/usr/bin/env bash
# Nsight Compute profile of the library's cuda prefill kernel (prefill_kernel, csrc/mla_prefill_wgmma.cu) at causal
# 4 x 4096, 128 heads, once per recipe (default: bf16 and nvfp4; RECIPES="bf16 nvfp4"). Question (benchmarks/NOTES.md,
# "Prefill nvfp4 at 4 x 4096: what binds it, round (p)"): with two consumer warpgroups in ping-pong, is the nvfp4
# kernel bound by the tensor pipe idling while both warpgroups run their P step (then a third consumer warpgroup
# would hide it), or by the issue slots (then only fewer instructions help)?
# One device call from the repository root (clocks left alone: --clock-control none; ~120-200 s):
#   OUT=$OUT bash benchmarks/probes/profile_prefill_recipes.sh
# Per recipe one ncu run of the 3rd prefill_kernel launch (two warm-up calls before it), --kill once profiled; the
# reports and their raw pages go to $OUT/profile_prefill_recipes.tar.gz; the summary (<= 40 lines) is printed.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
W=$(mktemp -d)
export MLA_CORE_CHECKS=metadata PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$W/install.log" 2>&1 || . benchmarks/checkout_first.sh
timeout 120 python3 -c "from mla_core_cuda import build; build.build()" >"$W/build.log" 2>&1 || { tail -5 "$W/build.log"; echo "BUILD FAILED"; }
cat >"$W/drive.py" <<'PY'
"""Three cuda prefill calls of one recipe at causal 4 x 4096 (bench_prefill.py's inputs)."""
import os, sys
import torch
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
from bench_prefill import CASES, make_inputs, recipe_kwargs  # noqa: E402
import mla_core  # noqa: E402
inputs = make_inputs(CASES["4x4096"])
for _ in range(3):
    mla_core.mla_prefill(*inputs, causal=True, backend="cuda", **recipe_kwargs(sys.argv[1]))
torch.cuda.synchronize()
PY
METRICS="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__cycles_active.avg"
METRICS+=",sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active"
METRICS+=",smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_xu.sum"
METRICS+=",smsp__inst_executed_pipe_lsu.sum,gpu__time_duration.sum"
SECTIONS="--section SpeedOfLight --section WarpStateStats --section SchedulerStats"
for r in ${RECIPES:-bf16 nvfp4}; do
  rep="$W/ncu_$r"
  timeout "${NCU_S:-90}" "$NCU" --clock-control none --kernel-name regex:prefill_kernel --launch-skip 2 \
    --launch-count 1 --kill yes $SECTIONS --metrics "$METRICS" -o "$rep" -f python3 "$W/drive.py" "$r" \
    >"$W/ncu_${r}_run.txt" 2>&1
  echo "ncu $r rc=$? ($(date +%T))"
  [ -f "$rep.ncu-rep" ] || { tail -6 "$W/ncu_${r}_run.txt"; continue; }
  timeout 30 "$NCU" --import "$rep.ncu-rep" --page raw --csv >"$W/ncu_${r}_raw.csv" 2>&1
done
timeout 30 python3 - "$W" ${RECIPES:-bf16 nvfp4} <<'PY' 2>&1 | tee "$W/summary.txt"
import csv, sys
w, recipes = sys.argv[1], sys.argv[2:]
def raw(r):
    try:
        rows = list(csv.reader(open(f"{w}/ncu_{r}_raw.csv")))
    except OSError:
        return {}
    head = next((i for i, row in enumerate(rows) if "ID" in row[:2] or "Kernel Name" in row), None)
    if head is None or head + 2 >= len(rows):
        return {}
    names, vals = rows[head], rows[head + 2]  # header, units, first kernel
    out = {}
    for n, v in zip(names, vals):
        try:
            out[n] = float(v.replace(",", ""))
        except ValueError:
            pass
    return out
data = {r: raw(r) for r in recipes}
keys = [("gpu__time_duration.sum", "duration ns"),
        ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor pipe active %"),
        ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue active % (per SMSP)"),
        ("sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active", "fma pipe active %"),
        ("sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active", "alu pipe active %"),
        ("smsp__inst_executed.sum", "instructions (warp)"),
        ("smsp__inst_executed_pipe_fma.sum", "  fma pipe"), ("smsp__inst_executed_pipe_alu.sum", "  alu pipe"),
        ("smsp__inst_executed_pipe_xu.sum", "  xu pipe"), ("smsp__inst_executed_pipe_lsu.sum", "  lsu pipe"),
        ("sm__inst_executed_pipe_tensor_op_hmma.sum", "  tensor (hmma)"), ("smsp__cycles_active.avg", "SMSP active cycles")]
print(f"{'metric':34s}" + "".join(f"{r:>16s}" for r in recipes))
for k, label in keys:
    print(f"{label:34s}" + "".join(f"{data[r].get(k, float('nan')):16.4g}" for r in recipes))
for r in recipes:  # the largest warp stall reasons (per issued instruction, cycles)
    stalls = {k.split("issue_stalled_")[1].split(".")[0]: v for k, v in data[r].items()
              if "average_warp_latency_issue_stalled" in k and k.endswith(".ratio")}
    top = sorted(stalls.items(), key=lambda kv: -kv[1])[:7]
    print(f"{r} stalls (cycles per issued instruction): " + ", ".join(f"{n} {v:.2f}" for n, v in top))
PY
tar -czf "$OUT/profile_prefill_recipes.tar.gz" -C "$W" . && cp "$W/summary.txt" "$OUT/" 2>/dev/null
