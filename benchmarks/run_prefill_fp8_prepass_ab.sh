#!/usr/bin/env bash
# One device call (~150 s expected; the step limits add to 190 s) for branch wip/prefill-fp8-prepass (the fp8 recipe's
# pre-pass: K and V in one launch at full width, Q's codes in the prefill kernel), run from the root of B's tree:
#   1. build A's and B's extensions in parallel (A = A_DIR's csrc, B = this tree's; ~60 s, 16 cores);
#   2. bench_prefill_fp8_prepass_ab.py: the whole cuda launcher of A and B (pre-pass + kernel) alternately in graph
#      replays, bf16 and fp8 at 4x4096, 1x16384, ragged16, B's outputs equal to A's bit for bit (exit 1 if not);
#   3. B's prefill GPU tests (tests/test_cuda_prefill.py -m gpu);
#   4. compute-sanitizer memcheck of B's prefill workload (mla_core_cuda.sanitize prefill: fp8 cases included).
# Logs and JSON in $OUT. Preparation, in main's checkout (both snapshots untracked folders, so they travel):
#   rm -rf benchmarks/ab_base benchmarks/ab_pf8 && mkdir -p benchmarks/ab_base benchmarks/ab_pf8
#   git archive main csrc backends/cuda/mla_core_cuda | tar -x -C benchmarks/ab_base
#   git archive wip/prefill-fp8-prepass | tar -x -C benchmarks/ab_pf8
# Device command (the lead's; <hash> = git rev-parse --short wip/prefill-fp8-prepass, evaluated there):
#   cd benchmarks/ab_pf8 && MLA_COMMIT=<hash> A_DIR=../ab_base OUT=$OUT bash benchmarks/run_prefill_fp8_prepass_ab.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}, A ${A_DIR:?A_DIR}"
[ -f "$A_DIR/csrc/mla_prefill_wgmma.cu" ] && [ -f "$A_DIR/backends/cuda/mla_core_cuda/prefill.py" ] \
  || { echo "A_DIR holds no csrc/ and backends/cuda/mla_core_cuda/ (see the preparation above)"; exit 2; }
A_DIR=$(cd "$A_DIR" && pwd)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
build_ab "$A_DIR/csrc"   # (benchmarks/device_clock.sh)
OUT=$LOGS timeout "${AB_S:-40}" python3 benchmarks/bench_prefill_fp8_prepass_ab.py --base "$A_DIR" \
  --rounds "${ROUNDS:-3}" 2>&1 | tee "$LOGS/ab.log" | tail -12
rab=${PIPESTATUS[0]}
stamp "A/B (rc $rab)"
timeout "${TESTS_S:-40}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 tests/test_cuda_prefill.py \
  2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
stamp tests
timeout "${MEMCHECK_S:-35}" compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m mla_core_cuda.sanitize \
  prefill 2>&1 | tee "$LOGS/memcheck.log" | tail -6
stamp memcheck
exit "$rab"
