#!/usr/bin/env bash
# The cuda decode's fused fake quantization on WGMMA (issue 9), one device call: build, the decode GPU tests,
# the benchmark (ratios to the cuda bf16 time), memcheck of the decode workload, the new WGMMA mutants (their
# builds start in the background after the main build). Logs in $OUT.
#   MLA_COMMIT=<hash> bash benchmarks/cuda_decode_qdq_device.sh
#   QDQ_QUICK=1: the build, a selection of the tests (QDQ_TESTS) and two benchmark shapes only (H16 / H128, B32, L8192).
set -u
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
# this checkout's sources first on the path, its entry points declared by hand (a warm machine may hold another
# tree's editable install: the first run of this script imported one and tested its older launcher)
. benchmarks/checkout_first.sh
{ time python3 -c "import mla_core_cuda; from mla_core_cuda import build; print(mla_core_cuda.__file__, build.build().__file__)"; } 2>&1 | tee "$LOGS/qdq_build.log" | tail -4
if [ "${QDQ_QUICK:-0}" = 1 ]; then
  timeout "${TEST_TIMEOUT:-30}" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line tests/test_cuda_decode.py \
    -k "${QDQ_TESTS:-agree or exact or calibrated or graph or (deepseek and (fp8-128-16 or fp8_p_nvfp4-16-64))}" \
    2>&1 | tee "$LOGS/qdq_gpu_tests_quick.log" | tail -12
  OUT=$LOGS timeout "${BENCH_TIMEOUT:-20}" python3 benchmarks/bench_decode_qdq_cuda.py --heads 16,128 --batch 32 \
    --lengths 8192 2>&1 | tee "$LOGS/qdq_bench_quick.log" | tail -7
  exit 0
fi
work=$(mktemp -d)
judge() {  # $1: prepare (build only) or judge
  WORK=$work MUTANT_INDICES=${QDQ_MUTANTS:-2,16,17,18,19,20,21,22} python3 - "$1" <<'PY'
import os, shlex, sys
from pathlib import Path
sys.path.insert(0, "tests/mutation")
import gpu_mutants, mutants_cuda as mc
sys.exit(gpu_mutants.run(mc.MUTANTS, lambda m: shlex.split(mc.QDQ_SELECTION), work=Path(os.environ["WORK"]),
                         prepare_only=sys.argv[1] == "prepare"))
PY
}
judge prepare >"$LOGS/qdq_mutant_builds.log" 2>&1 &
prep=$!
timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=5 tests/test_cuda_decode.py \
  tests/test_cuda_build.py 2>&1 | tee "$LOGS/qdq_gpu_tests.log" | tail -15
wait $prep
OUT=$LOGS timeout "${BENCH_TIMEOUT:-120}" python3 benchmarks/bench_decode_qdq_cuda.py --splits32 2>&1 | tee "$LOGS/qdq_bench.log" | tail -22
timeout "${MEMCHECK_TIMEOUT:-90}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck python3 -m mla_core_cuda.sanitize decode \
  2>&1 | tee "$LOGS/qdq_memcheck.log" | tail -3
MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-60} judge judge 2>&1 | tee "$LOGS/qdq_mutants.log" | tail -10
