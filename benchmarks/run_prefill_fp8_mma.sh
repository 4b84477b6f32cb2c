#!/usr/bin/env bash
# One device call (~330 s expected; the step limits stop it by 415 s) for branch wip/prefill-fp8 (round (l): the fp8
# recipe's prefill on FP8 wgmma, config {"mma": "fp8"}, csrc/mla_prefill_fp8.cu), run from the root of B's tree:
#   1. build A's (main's csrc, with main's own build module) and B's extensions in parallel (~60-75 s, 16 cores);
#      then the mutants 14-22's builds start in the background (tests/mutation/mutants_cuda_prefill.py --prepare);
#   2. bench_prefill_fp8_mma.py: today's fp8 path (A and B, bit-equal), the new config, bf16 (A and B) and
#      cuDNN SDPA at 4x4096, 1x16384, ragged16 in graph replays (median µs, TFLOP/s, x cudnn, x today's fp8),
#      the pre-passes alone, the new config's accuracy against today's fp8 path (exit 1 on a failed check);
#   3. B's prefill GPU tests (tests/test_cuda_prefill.py -m gpu: the new config's ten among them);
#   4. compute-sanitizer memcheck of B's prefill workload (mla_core_cuda.sanitize prefill: the new config's 2 cases);
#   5. the new mutants 14-22 judged (MUTANT_INDICES; each must be killed).
# Logs in $OUT (6 files: build_a.log, build_b.log, bench.log + bench_prefill_fp8_mma.json, gpu_tests.log,
# memcheck.log, mutants.log). Preparation, in main's checkout (snapshots are untracked folders: they travel):
#   bash benchmarks/prep_snapshots.sh ab_base=main:csrc ab_pf8m=wip/prefill-fp8
#   (ab_base needs backends/cuda/mla_core_cuda too: A's launcher and build module; prep_snapshots' REV:PATH takes
#   one folder, so instead: rm -rf benchmarks/ab_base && mkdir -p benchmarks/ab_base &&
#   git archive main csrc backends/cuda/mla_core_cuda | tar -x -C benchmarks/ab_base)
# Device command (the lead's; <hash> = git rev-parse --short wip/prefill-fp8):
#   cd benchmarks/ab_pf8m && MLA_COMMIT=<hash> A_DIR=../ab_base bash benchmarks/run_prefill_fp8_mma.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=415
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}, A ${A_DIR:?A_DIR}"
[ -f "$A_DIR/csrc/mla_prefill_wgmma.cu" ] && [ -f "$A_DIR/backends/cuda/mla_core_cuda/prefill.py" ] \
  || { echo "A_DIR holds no csrc/ and backends/cuda/mla_core_cuda/ (see the preparation above)"; exit 2; }
A_DIR=$(cd "$A_DIR" && pwd)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
(cd benchmarks && timeout "${BUILD_S:-100}" python3 -c "import sys, bench_prefill_fp8_mma as b; \
print('built', b.load_a(sys.argv[1])[1].__name__)" "$A_DIR") >"$LOGS/build_a.log" 2>&1 &
pa=$!
(cd benchmarks && timeout "${BUILD_S:-100}" python3 -c "import sys; from common import load_cuda_extension; \
print('built', load_cuda_extension(sys.argv[1]).__name__)" "$PWD/../csrc") >"$LOGS/build_b.log" 2>&1
rb=$?
wait $pa
ra=$?
tail -n 1 "$LOGS/build_a.log" "$LOGS/build_b.log"
stamp "builds (A rc $ra, B rc $rb)"
[ $ra = 0 ] && [ $rb = 0 ] || { tail -n 30 "$LOGS/build_a.log" "$LOGS/build_b.log"; exit 3; }
export MUTANT_WORK=/tmp/mla_core_prefill_fp8_mutants MUTANT_INDICES=${MUTANT_INDICES:-14,15,16,17,18,19,20,21,22}
python3 tests/mutation/mutants_cuda_prefill.py --prepare >"$LOGS/mutants.log" 2>&1 &
pm=$!
OUT=$LOGS timeout "${AB_S:-90}" python3 benchmarks/bench_prefill_fp8_mma.py --base "$A_DIR" \
  --rounds "${ROUNDS:-3}" 2>&1 | tee "$LOGS/bench.log" | tail -22
rab=${PIPESTATUS[0]}
stamp "bench (rc $rab)"
timeout "${TESTS_S:-100}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 \
  tests/test_cuda_prefill.py 2>&1 | tee "$LOGS/gpu_tests.log" | tail -10
rt=${PIPESTATUS[0]}
stamp "tests (rc $rt)"
timeout "${MEMCHECK_S:-60}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m mla_core_cuda.sanitize \
  prefill 2>&1 | tee "$LOGS/memcheck.log" | tail -8
rm_=${PIPESTATUS[0]}
stamp "memcheck (rc $rm_)"
wait $pm
stamp "mutant builds"
budget=$(left)
[ "$budget" -gt 20 ] || budget=20
MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-60} timeout "$budget" python3 tests/mutation/mutants_cuda_prefill.py \
  2>&1 | tee -a "$LOGS/mutants.log" | tail -12
rmu=${PIPESTATUS[0]}
stamp "mutants (rc $rmu, limit $budget s)"
echo "rc: bench $rab, tests $rt, memcheck $rm_, mutants $rmu"
[ "$rab" = 0 ] && [ "$rt" = 0 ] && [ "$rm_" = 0 ] && [ "$rmu" = 0 ]
