#!/usr/bin/env bash
# Nsight Compute profile of the FP8-cache decode (issue 9: the FP8 cache moves ~1.5 TB/s of codes, the bf16 cache
# ~3.2 TB/s; benchmarks/NOTES.md, "FP8 cache: why the keys-as-M kernel missed (round i)"), one device call of
# <= ~150 s: builds A (main's csrc, A_SRC, default csrc/) and B (the branch wip/decode-fp8-cache-faster's csrc,
# B_SRC, default benchmarks/ab_fp8t_src/csrc) in parallel into separate caches, then ONE ncu run (--clock-control
# none: the clocks are left alone) of profile_fp8_cache.py, which profiles one launch each of: A's bf16-cache
# decode_wgmma_kernel, A's FP8-cache decode_wgmma_kernel (KF = kCodes: the producer converts in place), B's
# decode_t_kernel (keys as M, conversion in the consumers' registers), at H16 B32 L32768 page 64, auto splits
# (4 there; SPLITS=N to force). Before the call, here:
#   mkdir -p benchmarks/ab_fp8t_src && git archive wip/decode-fp8-cache-faster csrc | tar -x -C benchmarks/ab_fp8t_src
# Device command:
#   MLA_COMMIT=<hash> bash benchmarks/probes/profile_fp8_cache.sh
# Out: $OUT/fp8prof.tgz (ncu details, raw page CSV, SASS source page CSV, per-kernel stall files, build logs, the
# driver's log), $OUT/fp8prof.ncu-rep when under 15 MB, and a compact summary on stdout. Knobs: A_SRC, B_SRC, H,
# BATCH, LEN, SPLITS, CALL_LIMIT (140 s: the ncu step gets what the builds leave), BUILD_TIMEOUT (85 s).
set -uo pipefail
t0=$(date +%s)
cd "$(dirname "$0")/../.."
OUT=${OUT:-$(mktemp -d)}
NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
A_SRC=${A_SRC:-csrc}
B_SRC=${B_SRC:-benchmarks/ab_fp8t_src/csrc}
DRV=benchmarks/probes/profile_fp8_cache.py
echo "commit ${MLA_COMMIT:-unknown}"
for s in "$A_SRC" "$B_SRC"; do
  [ -f "$s/mla_decode_wgmma.cu" ] || { echo "no csrc at $s (see the header: git archive ... | tar -x)"; exit 2; }
done
A_SRC=$(cd "$A_SRC" && pwd); B_SRC=$(cd "$B_SRC" && pwd)
cat "$B_SRC"/mla_decode_wgmma.cu* | grep -q decode_t_kernel || echo "WARNING: B_SRC has no decode_t_kernel"
. benchmarks/checkout_first.sh
TMP=$(mktemp -d); W=$TMP/fp8prof; mkdir -p "$W"
SHAPE=(--heads "${H:-16}" --batch "${BATCH:-32}" --length "${LEN:-32768}" --splits "${SPLITS:-auto}")
RUN=(python3 "$DRV" run --src-a "$A_SRC" --cache-a "$TMP/cache_a" --src-b "$B_SRC" --cache-b "$TMP/cache_b" "${SHAPE[@]}")
timeout 20 "${RUN[@]}" --dry-run || exit 2

build() {  # $1: csrc, $2: cache, $3: log
  { time timeout "${BUILD_TIMEOUT:-85}" python3 "$DRV" build --src "$1" --cache "$2"; echo "rc=$?"; } >"$3" 2>&1
}
build "$A_SRC" "$TMP/cache_a" "$W/build_a.log" & pa=$!
build "$B_SRC" "$TMP/cache_b" "$W/build_b.log" & pb=$!
wait $pa; wait $pb
for l in "$W"/build_[ab].log; do echo "$(basename "$l"): $(grep -E '^(mla_core_cuda_ext|rc=|real)' "$l" | tr '\n' ' ')"; done
grep -q "^rc=0" "$W/build_a.log" && grep -q "^rc=0" "$W/build_b.log" || { tail -n 20 "$W"/build_[ab].log; exit 3; }

METRICS=dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum
METRICS+=,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
METRICS+=,sm__inst_executed_pipe_tensor_op_hmma.sum,smsp__inst_executed.sum,smsp__cycles_active.avg
METRICS+=,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_lsu.sum
METRICS+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis
          --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats
          --section SourceCounters)
NCU_BASE=("$NCU" --clock-control none --profile-from-start off --kernel-name "regex:decode_(wgmma|t)_kernel"
          --launch-count 3 --import-source no "${SECTIONS[@]}" -f)
left=$(( ${CALL_LIMIT:-140} - ($(date +%s) - t0) - 20 ))
echo "ncu with ${left} s left ($(( $(date +%s) - t0 )) s in)"
timeout "$(( left > 20 ? left : 20 ))" "${NCU_BASE[@]}" --metrics "$METRICS" -o "$W/fp8prof" "${RUN[@]}" \
  >"$W/ncu_run.log" 2>&1
echo "ncu rc=$?"
if [ ! -f "$W/fp8prof.ncu-rep" ] && grep -q "metric" "$W/ncu_run.log"; then  # an unknown metric: sections only
  left=$(( ${CALL_LIMIT:-140} - ($(date +%s) - t0) - 15 ))
  [ "$left" -gt 25 ] && timeout "$left" "${NCU_BASE[@]}" -o "$W/fp8prof" "${RUN[@]}" >"$W/ncu_run2.log" 2>&1
  echo "sections only: rc=$?"
fi
grep -E "^# |==PROF==|==ERROR==|==WARNING==" "$W/ncu_run.log" | head -12
if [ -f "$W/fp8prof.ncu-rep" ]; then
  R=("$NCU" --import "$W/fp8prof.ncu-rep")
  timeout 15 "${R[@]}" --print-details all >"$W/ncu_details.txt" 2>&1
  timeout 15 "${R[@]}" --page raw --csv --print-units base >"$W/ncu_raw.csv" 2>&1
  timeout 20 "${R[@]}" --page source --csv --print-source sass >"$W/ncu_sass.csv" 2>&1
  if [ "$(grep -c 'Warp Stall Sampling (All' "$W/ncu_sass.csv")" -lt 3 ]; then  # one result per export instead
    for i in 0 1 2; do
      timeout 10 "${R[@]}" --launch-skip $i --launch-count 1 --page source --csv --print-source sass
    done >"$W/ncu_sass.csv" 2>&1
  fi
  grep -E "decode_|Duration|DRAM Throughput|Memory Throughput|Issue Slots Busy|Eligible Warps|No Eligible" \
    "$W/ncu_details.txt" >"$W/ncu_details_short.txt"
  timeout 15 python3 "$DRV" summarize --raw "$W/ncu_raw.csv" --sass "$W/ncu_sass.csv" --out "$W" \
    >"$W/summary.txt" 2>&1
  head -45 "$W/summary.txt"
fi
sz=$(stat -c %s "$W/fp8prof.ncu-rep" 2>/dev/null || echo 0)
[ "$sz" -gt 0 ] && [ "$sz" -lt 15000000 ] && cp "$W/fp8prof.ncu-rep" "$OUT/"
tar -C "$TMP" -czf "$OUT/fp8prof.tgz" --exclude='*.ncu-rep' fp8prof
echo "report ${sz} B; tar $(stat -c %s "$OUT/fp8prof.tgz") B; $(( $(date +%s) - t0 )) s"
