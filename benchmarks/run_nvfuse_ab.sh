#!/usr/bin/env bash
# One device call (~200 s expected; the steps' limits are cut to CALL_LIMIT = 280 s) for wip/nvfuse (issue 12: the
# nvfp4 prefill without Q's pre-pass round trip: Q's NVFP4 values made in the bf16-wgmma kernel's P-NVFP4 instances,
# the pre-pass's Q / K / V rounding in 7 instructions instead of ~13, its grid one resident wave), run from the root
# of B's tree (a snapshot of wip/nvfuse):
#   1. build A's and B's extensions in parallel (A = A_DIR's csrc: main's; B = this tree's; ~20-40 s, 16 cores);
#   2. bench_prefill_nvfp4_ab.py --parts: the whole cuda launcher of A and B alternately in graph replays, bf16
#      (control: SASS-identical kernel), nvfp4 (p_fmt 3, q_fmt 3) and nvfp4-ieee (p_fmt 4) at 4x4096, 1x16384,
#      ragged16, cuDNN SDPA beside the dense nvfp4 rows; then the pre-pass launches alone (rows q+k, rows k, keys v:
#      each build's own); B's outputs equal to A's bit for bit (exit 1 if not);
#   3. B's nvfp4 GPU tests of tests/test_cuda_prefill.py (-k "nvfp4 or q_codes": 17 + 3 cases) with what is left;
#   4. compute-sanitizer memcheck of the nvfp4 cases (mla_core_cuda.sanitize prefill_nvfp4) if >= 30 s are left.
# Logs and JSON in $OUT: build_a.log, build_b.log, ab.log + bench_prefill_nvfp4_ab.json, gpu_tests.log, memcheck.log.
# Preparation, in main's checkout (both snapshots untracked folders, so they travel):
#   bash benchmarks/prep_snapshots.sh "ab_base=main:csrc backends/cuda/mla_core_cuda" ab_nvfuse=wip/nvfuse
# Device command (the lead's; timeout_s 300):
#   cd benchmarks/ab_nvfuse && MLA_COMMIT=$(git rev-parse --short wip/nvfuse) A_DIR=../ab_base OUT=$OUT \
#     bash benchmarks/run_nvfuse_ab.sh
# Mutants 35-39 (and 27 moved to qdq.cuh), a call of their own (timeout_s 480):
#   cd benchmarks/ab_nvfuse && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=470 MUTANT_INDICES=27,35,36,37,38,39 \
#     bash benchmarks/run_prefill_nvfp4.sh
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
build() {  # $1: a csrc folder, $2: its log (the build cache is the default one, keyed by the sources' contents)
  (cd benchmarks && timeout "$(cap "${BUILD_S:-75}")" python3 -c "import sys; from common import load_cuda_extension; \
print('built', load_cuda_extension(sys.argv[1]).__name__)" "$1") >"$2" 2>&1
}
build "$A_DIR/csrc" "$LOGS/build_a.log" &
pa=$!
build "$PWD/csrc" "$LOGS/build_b.log"
rb=$?
wait $pa
ra=$?
tail -n 1 "$LOGS/build_a.log" "$LOGS/build_b.log"
stamp "builds (A rc $ra, B rc $rb)"
[ $ra = 0 ] && [ $rb = 0 ] || { tail -n 30 "$LOGS/build_a.log" "$LOGS/build_b.log"; exit 3; }
OUT=$LOGS timeout "$(cap "${AB_S:-130}")" python3 benchmarks/bench_prefill_nvfp4_ab.py --base "$A_DIR" \
  --rounds "${ROUNDS:-3}" --parts 2>&1 | tee "$LOGS/ab.log" | tail -22
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
