#!/usr/bin/env bash
# One device call (~150-220 s; the steps' limits are cut to CALL_LIMIT, default 280 s): the A/B of the cuda bf16
# prefill's persistent kernel (wip/ppers, issue 12), A = A_DIR's csrc/ and launcher (main), B = this tree, run from
# the root of B's tree:
#   1. build A's and B's extensions in parallel (~20-40 s, 16 cores);
#   2. bench_prefill_persistent_ab.py: at 4x4096, 1x16384, ragged16 (bf16, causal, 128 heads) A's {}, B's {} (the
#      control, SASS-identical to A's) and B's {"persistent": True} in graph replays, the order alternating by round
#      (A first / A last, both reported), cuDNN SDPA beside the dense cases; B's and P's outputs equal to A's bit for
#      bit (exit 1 if not);
#   3. B's GPU tests of tests/test_cuda_prefill.py (-k "$TESTS_K", default: the 6 persistent ones and the grid's
#      boundary, GQA, ragged and graph tests) with what is left;
#   4. compute-sanitizer memcheck of the persistent kernel's cases (mla_core_cuda.sanitize prefill_persistent) if
#      >= 30 s are left.
# Logs and JSON in $OUT: build_a.log, build_b.log, ab.log + bench_prefill_persistent_ab.json, gpu_tests.log,
# memcheck.log; the console ends with a per-case summary.
# Preparation, in main's checkout (snapshots are untracked folders, so they travel):
#   bash benchmarks/prep_snapshots.sh "ab_base=main:csrc backends/cuda/mla_core_cuda" ab_ppers=wip/ppers
# Device command (timeout_s 300):
#   cd benchmarks/ab_ppers && MLA_COMMIT=<wip/ppers head> A_DIR=../ab_base OUT=$OUT \
#     bash benchmarks/run_prefill_persistent_ab.sh
# Mutants 40-47, a call of their own (timeout_s 600; each must be killed, ~6-8 min):
#   cd benchmarks/ab_ppers && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=590 A_DIR=../ab_base OUT=$OUT \
#     bash benchmarks/run_prefill_persistent_ab.sh
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
pm=""
if [ "${RUN_MUTANTS:-0}" = 1 ]; then  # their builds beside the A/B (or instead of it: BENCH=0)
  export MUTANT_WORK=/tmp/mla_core_prefill_persistent_mutants MUTANT_INDICES=${MUTANT_INDICES:-40,41,42,43,44,45,46,47}
  python3 tests/mutation/mutants_cuda_prefill.py --prepare >"$LOGS/mutants.log" 2>&1 &
  pm=$!
fi
rab=skipped
if [ "${BENCH:-1}" = 1 ]; then
  OUT=$LOGS timeout "$(cap "${AB_S:-110}")" python3 benchmarks/bench_prefill_persistent_ab.py --base "$A_DIR" \
    --rounds "${ROUNDS:-6}" 2>&1 | tee "$LOGS/ab.log" | tail -12
  rab=${PIPESTATUS[0]}
  stamp "A/B (rc $rab)"
fi
rt=skipped
if [ "$(left)" -ge 20 ]; then
  timeout "$(cap "${TESTS_S:-70}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 \
    tests/test_cuda_prefill.py -k "${TESTS_K:-persistent or test_gpu_boundary_lengths or test_gpu_cached_prefix_and_gqa \
or test_gpu_ragged_batch_of_mostly_empty_blocks or test_gpu_cuda_graph_capture}" \
    2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
  rt=${PIPESTATUS[0]}
  stamp "tests (rc $rt)"
fi
rm_=skipped
if [ "$(left)" -ge 30 ]; then
  timeout "$(cap "${MEMCHECK_S:-40}")" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize prefill_persistent 2>&1 | tee "$LOGS/memcheck.log" | tail -5
  rm_=${PIPESTATUS[0]}
  stamp "memcheck (rc $rm_)"
fi
rmu=skipped
if [ -n "$pm" ]; then
  wait "$pm"
  stamp "mutant builds"
  MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-90} timeout "$(cap 600)" python3 tests/mutation/mutants_cuda_prefill.py \
    2>&1 | tee -a "$LOGS/mutants.log" | tail -12
  rmu=${PIPESTATUS[0]}
  stamp "mutants (rc $rmu)"
fi
echo "=== summary (commit ${MLA_COMMIT:-unknown}) ==="
[ -f "$LOGS/ab.log" ] && grep -E "^  (4x4096|1x16384|ragged16): " "$LOGS/ab.log" | sed -E 's/; A \[.*//' | cut -c1-230
echo "rc: A/B $rab (0 = every output bit-equal), tests $rt, memcheck $rm_, mutants $rmu"
{ [ "$rab" = 0 ] || [ "$rab" = skipped ]; } && { [ "$rt" = 0 ] || [ "$rt" = skipped ]; } \
  && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; } && { [ "$rmu" = 0 ] || [ "$rmu" = skipped ]; }
