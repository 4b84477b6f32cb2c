#!/usr/bin/env bash
# One device call (~150 s expected; the steps' limits are cut to CALL_LIMIT = 195 s) for the pending patch
# benchmarks/pending/prefill-nvfp4-p-step.patch (P's cheaper NVFP4 step in the bf16-wgmma prefill kernel), run from the
# root of B's tree (main with the patch applied):
#   1. build A's and B's extensions in parallel (A = A_DIR's csrc: main's; B = this tree's; ~20-40 s, 16 cores);
#   2. bench_prefill_nvfp4_ab.py: the whole cuda launcher of A and B alternately in graph replays, bf16 (control),
#      nvfp4 (p_fmt 3) and nvfp4-ieee (p_fmt 4) at 4x4096, 1x16384, ragged16, cuDNN SDPA beside the dense nvfp4 rows;
#      B's outputs equal to A's bit for bit (exit 1 if not);
#   3. B's nvfp4 GPU tests of tests/test_cuda_prefill.py (-k nvfp4: 14 cases) with what time is left (>= 20 s);
#   4. compute-sanitizer memcheck of the nvfp4 cases (mla_core_cuda.sanitize prefill_nvfp4) if >= 30 s are left.
# Logs and JSON in $OUT: build_a.log, build_b.log, ab.log + bench_prefill_nvfp4_ab.json, gpu_tests.log, memcheck.log.
# Preparation, in main's checkout (both snapshots untracked folders, so they travel):
#   rm -rf benchmarks/ab_base benchmarks/ab_pstep && mkdir -p benchmarks/ab_base benchmarks/ab_pstep
#   git archive main csrc backends/cuda/mla_core_cuda | tar -x -C benchmarks/ab_base
#   git archive main | tar -x -C benchmarks/ab_pstep
#   (cd benchmarks/ab_pstep && patch -p1 -s < ../pending/prefill-nvfp4-p-step.patch)   (GNU patch: git apply inside
#     main's work tree would take the paths from the repository's root)
# Device command (the lead's; timeout_s 200):
#   cd benchmarks/ab_pstep && MLA_COMMIT=<main's hash>+p-step A_DIR=../ab_base OUT=$OUT bash benchmarks/run_prefill_nvfp4_ab.sh
# Mutants 31-34 (and 23, 24, 30 moved to the new code), a call of their own (timeout_s 480):
#   cd benchmarks/ab_pstep && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=470 MUTANT_INDICES=23,24,30,31,32,33,34 \
#     bash benchmarks/run_prefill_nvfp4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=195
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
OUT=$LOGS timeout "$(cap "${AB_S:-110}")" python3 benchmarks/bench_prefill_nvfp4_ab.py --base "$A_DIR" \
  --rounds "${ROUNDS:-3}" 2>&1 | tee "$LOGS/ab.log" | tail -14
rab=${PIPESTATUS[0]}
stamp "A/B (rc $rab)"
rt=skipped
if [ "$(left)" -ge 20 ]; then
  timeout "$(cap "${TESTS_S:-60}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 \
    tests/test_cuda_prefill.py -k "${TESTS_K:-nvfp4}" 2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
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
echo "rc: A/B $rab, tests $rt, memcheck $rm_"
[ "$rab" = 0 ] && { [ "$rt" = 0 ] || [ "$rt" = skipped ]; } && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; }
