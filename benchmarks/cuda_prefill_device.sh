#!/usr/bin/env bash
# One device call for the cuda backend's prefill (issue 12): the csrc mutants build in the background beside the main
# build, then the GPU tests, memcheck of the prefill workload (sanitize.py prefill), the benchmark (PREFILL_ARGS), the
# fp8 recipe's parts (prefill_fp8_parts.py), then the mutants; each step under its own time limit so a slow step
# leaves the earlier logs (MEMCHECK_S / PARTS_S 0: step left out). Logs in $OUT.
#   MLA_COMMIT=<hash> OUT=... bash benchmarks/cuda_prefill_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
. benchmarks/device_clock.sh   # t0, stamp, left, cap
prep=
if [ "${MUTANTS:-1}" = 1 ]; then
  PYTHONPATH=$PWD/backends/cuda nice -n 10 python3 tests/mutation/mutants_cuda_prefill.py --prepare >/tmp/prefill_mutant_builds.log 2>&1 &
  prep=$!
fi
OUT=$(mktemp -d) bash benchmarks/device_run.sh build 2>&1 | tee "$OUT/build.log" | tail -6  # (its logs.tgz not in $OUT: 8 files come back)
stamp build
python3 -c "import sys, mla_core; r = mla_core.get_backend('cuda').unavailable_reason(); print('cuda backend:', r or 'available'); sys.exit(1 if r else 0)" || exit 1
timeout "${TESTS_S:-60}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 tests/test_cuda_prefill.py \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -15
stamp tests
if [ "${MEMCHECK_S:-0}" -gt 0 ]; then
  timeout "$MEMCHECK_S" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m mla_core_cuda.sanitize prefill 2>&1 | tee "$OUT/memcheck.log" | tail -8
  stamp memcheck
fi
OUT=$OUT timeout "${BENCH_S:-55}" python3 benchmarks/bench_prefill.py ${PREFILL_ARGS:---quick --cases 4x4096 1x16384 --recipes bf16 fp8} \
  2>&1 | tee "$OUT/bench_prefill.log" | tail -24
stamp bench
if [ "${PARTS_S:-0}" -gt 0 ]; then
  timeout "$PARTS_S" python3 benchmarks/prefill_fp8_parts.py 2>&1 | tee "$OUT/fp8_parts.log" | tail -12
  stamp "fp8 parts"
fi
if [ -n "$prep" ]; then
  wait $prep
  stamp "mutant builds"; tail -3 /tmp/prefill_mutant_builds.log
  timeout "${MUTANTS_S:-60}" python3 tests/mutation/mutants_cuda_prefill.py 2>&1 | tee "$OUT/mutants.log" | tail -10
  stamp mutants
fi
