#!/usr/bin/env bash
# One device call for the cuda backend's prefill (issue 12): the main build, then the csrc mutants build in the
# background while the GPU tests and the benchmark run (cuda / cudnn / triton at 4x4096 and 1x16384, bf16 and the fp8
# recipe), then the mutants; each step under its own time limit so a slow step leaves the earlier logs. Logs in $OUT.
#   MLA_COMMIT=<hash> OUT=... bash benchmarks/cuda_prefill_device.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
t0=$(date +%s)
stamp() { echo "--- $1 done at +$(( $(date +%s) - t0 )) s"; }
bash benchmarks/device_run.sh build 2>&1 | tee "$OUT/build.log" | tail -6
stamp build
python3 -c "import sys, mla_core; r = mla_core.get_backend('cuda').unavailable_reason(); print('cuda backend:', r or 'available'); sys.exit(1 if r else 0)" || exit 1
prep=
if [ "${MUTANTS:-1}" = 1 ]; then
  PYTHONPATH=$PWD/backends/cuda nice -n 10 python3 tests/mutation/mutants_cuda_prefill.py --prepare >"$OUT/mutant_builds.log" 2>&1 &
  prep=$!
fi
timeout "${TESTS_S:-45}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 tests/test_cuda_prefill.py \
  2>&1 | tee "$OUT/gpu_tests.log" | tail -15
stamp tests
OUT=$OUT timeout "${BENCH_S:-55}" python3 benchmarks/bench_prefill.py ${PREFILL_ARGS:---quick --cases 4x4096 1x16384 --recipes bf16 fp8} \
  2>&1 | tee "$OUT/bench_prefill.log" | tail -24
stamp bench
if [ -n "$prep" ]; then
  wait $prep
  stamp "mutant builds"
  timeout "${MUTANTS_S:-60}" python3 tests/mutation/mutants_cuda_prefill.py 2>&1 | tee "$OUT/mutants.log" | tail -10
  stamp mutants
fi
