#!/usr/bin/env bash
# Nsight Compute profile of one WGMMA prefill probe kernel (default: variant BF16, the cp.async ping-pong kernel) at
# causal 4 x 4096, 128 heads, on a Firecracker H200 (--clock-control none leaves the clocks alone):
#   MLA_COMMIT=<hash> bash benchmarks/probes/profile_prefill_probe.sh     (writes $OUT/ncu_prefill*.txt, .ncu-rep)
# ncu matches the demangled base name, so --kernel-name k_prefill counts every variant's launches: 36 correctness
# launches (6 cases x 6 variants) and BF16 4x4096's 3 warm-ups come first; LAUNCH_SKIP=44 (the default) profiles
# that shape's 6th timed launch. Each variant times 46 launches (23 per shape), in the order BF16, P8, NOPP, TMA,
# TMAX, TMX8: LAUNCH_SKIP=$((36 + 46 * v + 8)) profiles variant v's (0-based) 4x4096 (TMAX: 228). (The first
# profile, at e7487f0 with 3 variants, took --launch-skip 26.)
# Question (benchmarks/NOTES.md, "WGMMA prefill probe: results and profile"): at 49-55 % of the 840 TFLOP/s floor
# and the ping-pong worth only 3.5 %, is the tensor pipe starved by the producer's cp.async issue, by L2 / shared
# memory, or by the consumers' softmax between turns? Stall reasons: per warp (the WarpStateStats ratios) and per
# SASS instruction (the SourceCounters samples, printed from the report's source page); the raw page has every
# collected metric (smsp__average_warps_issue_stalled_*_per_issue_active, smsp__pcsamp_warps_issue_stalled_*).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-$(mktemp -d)}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/prefill_probe}
[ -x "$BIN" ] || { source ./common.sh; probe_build prefill_wgmma_probe.cu; }
METRICS="sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum"
METRICS+=",l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"
METRICS+=",smsp__cycles_active.avg,dram__bytes_read.sum,lts__t_bytes.sum,lts__t_sector_hit_rate.pct"
METRICS+=",lts__t_sectors_srcunit_tex_op_read.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed"
METRICS+=",l1tex__m_xbar2l1tex_read_bytes.sum.per_second,smsp__inst_executed.sum"
METRICS+=",smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_lsu.sum"
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis"
SECTIONS+=" --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats"
SECTIONS+=" --section SourceCounters"
REP="$OUT/ncu_prefill"
timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none --kernel-name k_prefill --launch-skip "${LAUNCH_SKIP:-44}" --launch-count 1 \
  $SECTIONS --metrics "$METRICS" -o "$REP" -f "$BIN" >"$OUT/ncu_prefill_run.txt" 2>&1
rc=$?
echo "rc=$rc"
if [ ! -f "$REP.ncu-rep" ]; then  # a metric this ncu does not know fails the whole run: the sections alone
  tail -5 "$OUT/ncu_prefill_run.txt"
  timeout "${NCU_TIMEOUT:-200}" "$NCU" --clock-control none --kernel-name k_prefill --launch-skip "${LAUNCH_SKIP:-44}" --launch-count 1 \
    $SECTIONS -o "$REP" -f "$BIN" >"$OUT/ncu_prefill_run2.txt" 2>&1
  echo "sections only: rc=$?"
fi
grep -E "PROF|ERROR|BF16 causal" "$OUT/ncu_prefill_run.txt" | head
"$NCU" --import "$REP.ncu-rep" --print-details all >"$OUT/ncu_prefill.txt" 2>&1
"$NCU" --import "$REP.ncu-rep" --page raw --csv >"$OUT/ncu_prefill_raw.csv" 2>&1
"$NCU" --import "$REP.ncu-rep" --page source --csv --print-source sass >"$OUT/ncu_prefill_sass.csv" 2>&1 || true
grep -E "Duration|Throughput|hmma|wavefronts|bank_conflicts|issue_stalled|Issue|L2 Hit|lts__|dram__|Ipc|Eligible|Registers|Achieved" \
  "$OUT/ncu_prefill.txt" | head -80
wc -c "$OUT"/ncu_prefill*
# The stall reasons per issued instruction (cycles a warp spends per issue in each state) and the pc samples.
python3 - "$OUT/ncu_prefill_raw.csv" <<'PY' || true
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head = next(i for i, r in enumerate(rows) if r and r[0] == "ID")
names, vals = rows[head], rows[head + 2]
for n, v in zip(names, vals):
    if ("issue_stalled" in n and (n.endswith("per_issue_active.ratio") or "pcsamp" in n)) or "pcsamp_sample" in n:
        print(n, v)
PY
