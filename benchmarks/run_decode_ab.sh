#!/usr/bin/env bash
# One device call: an A/B of the cuda decode (issue 9) between A = a base's csrc/ (A_SRC) and B = this checkout's,
# then B's GPU tests. Builds A and B side by side, runs benchmarks/bench_decode_ab.py with AB_ARGS (its docstring: the
# cases, per-case configs, --allow-diff), then tests/test_cuda_decode.py -k "$AB_TESTS" on B with the time left of
# CALL_LIMIT (skipped when AB_TESTS is unset). RUN_MUTANTS=1 instead: memcheck of sanitize.py's decode workload,
# then tests/mutation/mutants_cuda.py with MUTANT_SELECTION / MUTANT_INDICES (its docstring). Before the call, in
# main's root (snapshots travel with the tree; a branch's scripts run from inside its snapshot):
#   bash benchmarks/prep_snapshots.sh ab_base=main:csrc ab_x=wip/x
#   MLA_COMMIT=<hash> A_SRC=$PWD/benchmarks/ab_base/csrc AB_ARGS="--cases bf16 --config-b bf16='{\"kernel\": \"x\"}'" \
#     AB_TESTS="x" bash benchmarks/ab_x/benchmarks/run_decode_ab.sh
# Logs in $OUT: ab_build_{a,b}.log, ab_bench.log, bench_decode_ab.json, ab_gpu_tests.log (or memcheck / mutants).
set -u
export PYTHONUNBUFFERED=1
t0=$(date +%s)
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  timeout "${MEMCHECK_TIMEOUT:-90}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m mla_core_cuda.sanitize decode 2>&1 | tee "$LOGS/decode_memcheck.log" | tail -6
  MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-60} timeout "${MUTANT_TIMEOUT_ALL:-195}" python3 tests/mutation/mutants_cuda.py 2>&1 \
    | tee "$LOGS/decode_mutants.log" | tail -12
  exit 0
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_decode_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC (prep_snapshots.sh ab_base=main:csrc, see above)"; exit 2
fi
A_SRC=$(cd "$A_SRC" && pwd)
export MLA_CORE_CACHE_DIR=${AB_CACHE:-$(mktemp -d)}  # one cache: the two builds differ in key
build() {  # $1: csrc folder, $2: log name
  { time MLA_CORE_CUDA_SRC=$1 timeout "${BUILD_TIMEOUT:-110}" python3 -c \
      "from mla_core_cuda import build; m = build.build(); print(m.__name__, m.__file__)"; } >"$LOGS/$2" 2>&1
}
build "$A_SRC" ab_build_a.log & pa=$!
build "$PWD/csrc" ab_build_b.log & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
tail -n 4 "$LOGS/ab_build_a.log" "$LOGS/ab_build_b.log"
echo "--- builds (A rc $ra, B rc $rb) at +$(( $(date +%s) - t0 )) s"
[ "$ra" = 0 ] && [ "$rb" = 0 ] || exit 3
eval "set -- ${AB_ARGS:-}"  # AB_ARGS may quote JSON configs
timeout "${BENCH_TIMEOUT:-120}" python3 benchmarks/bench_decode_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" "$@" 2>&1 \
  | tee "$LOGS/ab_bench.log" | tail -30
echo "--- bench at +$(( $(date +%s) - t0 )) s"
[ -n "${AB_TESTS:-}" ] || exit 0
left=$(( ${CALL_LIMIT:-290} - ($(date +%s) - t0) ))
echo "GPU tests (-k \"$AB_TESTS\") with $left s left"
timeout "$(( left > 20 ? left : 20 ))" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line \
  tests/test_cuda_decode.py -k "$AB_TESTS" 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
