#!/usr/bin/env bash
# One device call (~150-200 s; the steps' limits are cut to CALL_LIMIT, default 280 s): an A/B of the cuda
# prefill's nvfp4 path, A = A_DIR's csrc/ and launcher (the base), B = this tree, run from the root of B's tree:
#   1. build A's and B's extensions in parallel (~20-40 s, 16 cores);
#   2. bench_prefill_nvfp4_ab.py $AB_ARGS (default --parts): the whole cuda launcher of A and B alternately in graph
#      replays, bf16 (the control), nvfp4 (p_fmt 3) and nvfp4-ieee (p_fmt 4) at 4x4096, 1x16384, ragged16, cuDNN SDPA
#      beside the dense nvfp4 rows; --parts: then the NVFP4 pre-pass launches alone; B's outputs equal to A's bit
#      for bit (exit 1 if not);
#   3. B's GPU tests of tests/test_cuda_prefill.py (-k "$TESTS_K", default "nvfp4 or q_codes") with what is left;
#   4. compute-sanitizer memcheck of the nvfp4 cases (mla_core_cuda.sanitize prefill_nvfp4) if >= 30 s are left.
# Logs and JSON in $OUT: build_a.log, build_b.log, ab.log + bench_prefill_nvfp4_ab.json, gpu_tests.log, memcheck.log;
# the console ends with a per-row summary.
# Preparation, in main's checkout (snapshots are untracked folders, so they travel; A must be B's own base: a build
# of main's csrc/ by an older tree's build.py misses the units it does not list):
#   bash benchmarks/prep_snapshots.sh "ab_base=<B's base>:csrc backends/cuda/mla_core_cuda" ab_b=<B's branch>
# Device command (timeout_s 300):
#   cd benchmarks/ab_b && MLA_COMMIT=<B's head> A_DIR=../ab_base OUT=$OUT bash benchmarks/run_prefill_nvfp4_ab.sh
# Mutants, a call of their own (timeout_s 480; mkdir $OUT's folder first):
#   cd benchmarks/ab_b && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=470 MUTANT_INDICES=... bash benchmarks/run_prefill_nvfp4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=280
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}, A ${A_DIR:?A_DIR}"
[ -f "$A_DIR/csrc/mla_prefill_wgmma.cu" ] && [ -f "$A_DIR/backends/cuda/mla_core_cuda/prefill.py" ] \
  || { echo "A_DIR holds no csrc/ and backends/cuda/mla_core_cuda/ (see the preparation above)"; exit 2; }
A_DIR=$(cd "$A_DIR" && pwd)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
build_ab "$A_DIR/csrc"   # (benchmarks/device_clock.sh)
OUT=$LOGS timeout "$(cap "${AB_S:-130}")" python3 benchmarks/bench_prefill_nvfp4_ab.py --base "$A_DIR" \
  --rounds "${ROUNDS:-3}" ${AB_ARGS---parts} 2>&1 | tee "$LOGS/ab.log" | tail -22
rab=${PIPESTATUS[0]}
stamp "A/B (rc $rab)"
rt=skipped
if [ "$(left)" -ge 20 ]; then
  timeout "$(cap "${TESTS_S:-60}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 \
    tests/test_cuda_prefill.py -k "${TESTS_K:-nvfp4 or q_codes}" 2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
  rt=${PIPESTATUS[0]}
  stamp "tests (rc $rt)"
fi
rm_=skipped
if [ "$(left)" -ge 30 ]; then
  timeout "$(cap "${MEMCHECK_S:-40}")" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize prefill_nvfp4 2>&1 | tee "$LOGS/memcheck.log" | tail -6
  rm_=${PIPESTATUS[0]}
  stamp "memcheck (rc $rm_)"
fi
echo "=== summary (commit ${MLA_COMMIT:-unknown}) ==="
grep -E "^  (4x4096|1x16384|ragged16) " "$LOGS/ab.log" | sed -E 's/; A \[.*//' | cut -c1-150
echo "rc: A/B $rab (0 = every row bit-equal), tests $rt, memcheck $rm_"
[ "$rab" = 0 ] && { [ "$rt" = 0 ] || [ "$rt" = skipped ]; } && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; }
