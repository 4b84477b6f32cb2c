#!/usr/bin/env bash
# One device call for the cuda backend's FP8 sparse decode (issue 10): the csrc mutants build in the background
# beside the main build (device_run.sh build), then the GPU tests, the benchmark (SPARSE_ARGS), the mutants and a
# memcheck of the sparse workload, each under its own time limit so a slow step leaves the earlier logs. Logs in $OUT.
#   MLA_COMMIT=<hash> OUT=... bash benchmarks/cuda_sparse_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
. benchmarks/device_clock.sh   # t0, stamp, left, cap
MUTANTS=${MUTANTS:-1}  # 0: no mutants (a shorter call)
prep=
if [ "$MUTANTS" = 1 ]; then
  PYTHONPATH=$PWD/backends/cuda python3 tests/mutation/mutants_cuda_sparse.py --prepare >"$OUT/mutant_builds.log" 2>&1 &
  prep=$!
fi
bash benchmarks/device_run.sh build 2>&1 | tee "$OUT/build.log" | tail -6
stamp build
python3 -c "import sys, mla_core; r = mla_core.get_backend('cuda').unavailable_reason(); print('cuda backend:', r or 'available'); sys.exit(1 if r else 0)" || exit 1
timeout "${TESTS_S:-80}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 tests/test_cuda_sparse.py \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -15
stamp tests
OUT=$OUT timeout "${BENCH_S:-90}" python3 benchmarks/bench_sparse.py ${SPARSE_ARGS:-} 2>&1 | tee "$OUT/bench_sparse.log" | tail -22
stamp bench
if [ -n "$prep" ]; then
  wait $prep
  stamp "mutant builds"
  timeout "${MUTANTS_S:-80}" python3 tests/mutation/mutants_cuda_sparse.py 2>&1 | tee "$OUT/mutants.log" | tail -7
  stamp mutants
fi
[ $(( $(date +%s) - t0 )) -lt "${MEMCHECK_BEFORE_S:-200}" ] && timeout "${MEMCHECK_S:-30}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
  python3 -m mla_core_cuda.sanitize sparse 2>&1 | tee "$OUT/memcheck.log" | tail -5
stamp memcheck
