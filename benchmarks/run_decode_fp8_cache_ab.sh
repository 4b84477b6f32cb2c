#!/usr/bin/env bash
# A/B of the FP8 KV cache on the cuda WGMMA decode (issue 9, branch wip/decode-wgmma-fp8-cache), one device call of
# <= 300 s: build A (main's csrc/) and B (this checkout's) side by side, the CPU layout / conversion check,
# bench_decode_fp8_cache_ab.py (bf16 cache on A and B, FP8 cache on B, alternately; B's bf16 bit-equal to A's),
# one fp16-q shape, (AB_TRITON=1) triton's FP8 cache at two shapes, then the FP8-cache GPU tests on B with the
# time left of CALL_LIMIT (290 s from the start). Before the call, here:
#   mkdir -p benchmarks/ab_base && git archive main csrc | tar -x -C benchmarks/ab_base   # untracked: travels
#   MLA_COMMIT=<hash> A_SRC=benchmarks/ab_base/csrc bash benchmarks/run_decode_fp8_cache_ab.sh   (the device command)
# Logs and JSON in $OUT. AB_QUICK=1: H16 / H128 x B32 x L8192 only. RUN_MUTANTS=1 (a separate call, <= 300 s
# with MUTANT_TIMEOUT_ALL=200): memcheck of sanitize.py's decode workload (FP8-cache cases included), then the 8
# FP8-cache mutants of tests/mutation/mutants_cuda.py (indices 23-30) instead of the A/B.
set -u
t0=$(date +%s)
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
# this checkout first on the path (a warm machine may hold another install)
. benchmarks/checkout_first.sh
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  timeout "${MEMCHECK_TIMEOUT:-90}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m mla_core_cuda.sanitize decode 2>&1 | tee "$LOGS/fp8_cache_memcheck.log" | tail -6
  MUTANT_SELECTION=fp8cache MUTANT_INDICES=${MUTANT_INDICES:-23,24,25,26,27,28,29,30} \
    timeout "${MUTANT_TIMEOUT_ALL:-200}" python3 tests/mutation/mutants_cuda.py 2>&1 | tee "$LOGS/fp8_cache_mutants.log" | tail -12
  exit 0
fi
if [ -z "${A_SRC:-}" ] && [ -n "${A_REV:-}" ]; then
  A_SRC=$(mktemp -d)/csrc && mkdir -p "$(dirname "$A_SRC")" && git archive "$A_REV" csrc | tar -x -C "$(dirname "$A_SRC")"
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_decode_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC, or A_REV where git works"; exit 2
fi
A_SRC=$(cd "$A_SRC" && pwd)
export MLA_CORE_CACHE_DIR=${AB_CACHE:-$(mktemp -d)}  # one fresh cache: the two builds differ in key
build() {  # $1: csrc folder, $2: log name
  { time MLA_CORE_CUDA_SRC=$1 timeout "${BUILD_TIMEOUT:-110}" python3 -c \
      "from mla_core_cuda import build; m = build.build(); print(m.__name__, m.__file__)"; } >"$LOGS/$2" 2>&1
}
build "$A_SRC" ab_build_a.log & pa=$!
build "$PWD/csrc" ab_build_b.log & pb=$!
wait $pa; wait $pb
tail -n 4 "$LOGS/ab_build_a.log" "$LOGS/ab_build_b.log"
python3 benchmarks/probes/decode_fp8_cache_check.py 2>&1 | tee "$LOGS/fp8_cache_check.log" | tail -1
if [ "${AB_QUICK:-0}" = 1 ]; then shape=(--batch 32 --lengths 8192); else shape=(); fi
timeout "${BENCH_TIMEOUT:-85}" python3 benchmarks/bench_decode_fp8_cache_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" \
  "${shape[@]}" 2>&1 | tee "$LOGS/ab_bench.log" | tail -18
mkdir -p "$LOGS/fp16" && OUT=$LOGS/fp16 timeout "${FP16_TIMEOUT:-12}" python3 benchmarks/bench_decode_fp8_cache_ab.py \
  --src-a "$A_SRC" --src-b "$PWD/csrc" --q-dtype fp16 --heads 16,128 --batch 32 --lengths 8192 2>&1 \
  | tee "$LOGS/ab_bench_fp16.log" | tail -4
if [ "${AB_TRITON:-0}" = 1 ]; then
  mkdir -p "$LOGS/triton" && OUT=$LOGS/triton timeout "${TRITON_TIMEOUT:-40}" python3 \
    benchmarks/bench_decode_fp8_cache_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" --triton --heads 16,128 --batch 32 \
    --lengths 8192 2>&1 | tee "$LOGS/ab_bench_triton.log" | tail -4
fi
# the GPU tests last, with whatever the call has left (CALL_LIMIT: the device call's limit less a margin)
left=$(( ${CALL_LIMIT:-290} - ($(date +%s) - t0) ))
echo "GPU tests with ${left} s left"
timeout "$(( left > 20 ? left : 20 ))" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line \
  tests/test_cuda_decode.py -k "${AB_TESTS:-fp8_cache}" 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
