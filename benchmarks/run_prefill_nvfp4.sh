#!/usr/bin/env bash
# One device call (~190 s expected; the step limits are cut to CALL_LIMIT = 275 s) for branch wip/nvfp4 (round (m):
# the nvfp4 recipe of the prefill on cuda: the NVFP4 pre-pass (csrc/mla_prefill_nvfp4.cu) + the bf16-wgmma kernel
# with P's NVFP4 in registers (p_fmt 3 / 4)), run from the root of the branch's tree:
#   1. build the extension (~60-75 s cold, 16 cores); with RUN_MUTANTS=1 the mutants 23-39's builds then start in
#      the background (tests/mutation/mutants_cuda_prefill.py --prepare);
#   2. bench_prefill_nvfp4.py: sdpa-cudnn (bf16), cuda bf16, cuda fp8 (FP8 wgmma), triton nvfp4, cuda nvfp4 at 4x4096,
#      1x16384 and ragged16 in graph replays (median µs, TFLOP/s, x cudnn, x triton), the pre-pass alone, cuda's and
#      triton's nvfp4 against the reference on 8 heads (exit 1 when cuda nvfp4 misses the gate);
#   3. the nvfp4 GPU tests of tests/test_cuda_prefill.py (14), with the bf16-wgmma kernel's fp8 (3) and tile-edge (2)
#      ones (the kernel is shared; its other instances are SASS-identical to main's);
#   4. compute-sanitizer memcheck of the nvfp4 cases (mla_core_cuda.sanitize prefill_nvfp4), if >= 30 s are left;
#   5. RUN_MUTANTS=1 only: the mutants 23-39 judged (each must be killed; ~5 min: a call of its own, see below).
# Logs in $OUT: build.log, bench.log + bench_prefill_nvfp4.json, gpu_tests.log, memcheck.log (, mutants.log).
# Preparation, in main's checkout (snapshots are untracked folders: they travel with the tree):
#   bash benchmarks/prep_snapshots.sh ab_base=main ab_pn4=wip/nvfp4
# Device command (the lead's; timeout_s 290; <hash> = git rev-parse --short wip/nvfp4):
#   cd benchmarks/ab_pn4 && MLA_COMMIT=<hash> bash benchmarks/run_prefill_nvfp4.sh
# Mutants, a later call (timeout_s 480):
#   cd benchmarks/ab_pn4 && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=470 bash benchmarks/run_prefill_nvfp4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=275
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
(cd benchmarks && timeout "$(cap "${BUILD_S:-120}")" python3 -c "import sys; from common import load_cuda_extension; \
print('built', load_cuda_extension(sys.argv[1]).__name__)" "$PWD/../csrc") >"$LOGS/build.log" 2>&1
rb=$?
tail -n 1 "$LOGS/build.log"
stamp "build (rc $rb)"
[ $rb = 0 ] || { tail -n 30 "$LOGS/build.log"; exit 3; }
pm=""
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  export MUTANT_WORK=/tmp/mla_core_prefill_nvfp4_mutants MUTANT_INDICES=${MUTANT_INDICES:-23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39}
  python3 tests/mutation/mutants_cuda_prefill.py --prepare >"$LOGS/mutants.log" 2>&1 &
  pm=$!
fi
rab=0
if [ "${BENCH:-1}" = 1 ]; then
  OUT=$LOGS timeout "$(cap "${BENCH_S:-100}")" python3 benchmarks/bench_prefill_nvfp4.py --rounds "${ROUNDS:-3}" 2>&1 \
    | tee "$LOGS/bench.log" | tail -26
  rab=${PIPESTATUS[0]}
  stamp "bench (rc $rab)"
fi
TESTS_K=${TESTS_K:-"nvfp4 or (test_gpu_fp8 and not fp8_mma and not tile_images) or (boundary_lengths and not fp8_mma)"}
timeout "$(cap "${TESTS_S:-80}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=5 \
  tests/test_cuda_prefill.py -k "$TESTS_K" 2>&1 | tee "$LOGS/gpu_tests.log" | tail -10
rt=${PIPESTATUS[0]}
stamp "tests (rc $rt)"
rm_=skipped
if [ "$(left)" -ge 30 ] || [ "${RUN_MUTANTS:-0}" = 1 ]; then
  timeout "$(cap "${MEMCHECK_S:-45}")" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize prefill_nvfp4 2>&1 | tee "$LOGS/memcheck.log" | tail -6
  rm_=${PIPESTATUS[0]}
  stamp "memcheck (rc $rm_)"
fi
rmu=skipped
if [ -n "$pm" ]; then
  wait "$pm"
  stamp "mutant builds"
  MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-60} timeout "$(cap 600)" python3 tests/mutation/mutants_cuda_prefill.py \
    2>&1 | tee -a "$LOGS/mutants.log" | tail -12
  rmu=${PIPESTATUS[0]}
  stamp "mutants (rc $rmu)"
fi
echo "rc: bench $rab, tests $rt, memcheck $rm_, mutants $rmu"
[ "$rab" = 0 ] && [ "$rt" = 0 ] && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; } \
  && { [ "$rmu" = 0 ] || [ "$rmu" = skipped ]; }
