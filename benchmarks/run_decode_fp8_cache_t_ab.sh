#!/usr/bin/env bash
# A/B of two builds of the cuda decode over bf16 and FP8 caches (issue 9; first for the keys-as-M FP8-cache kernel,
# branch wip/decode-fp8-cache-faster), one device call: build A (main's csrc/) and B (this checkout's) side by side, the
# two CPU checks (conversion / layout of both FP8 paths), bench_decode_fp8_cache_t_ab.py (bf16 and FP8 cache on A and B
# alternately; bf16 B == A bit for bit everywhere, FP8 B == A at 128 heads, FP8 B within 1e-2 of A at 16), one fp16-q
# shape, then the FP8-cache GPU tests on B with the time left of CALL_LIMIT: first those that reach decode_t_kernel's
# paths (the bulk copies of a page's run and of single rows, zero-filled tails, the byte path, 1-16 heads), then the
# rest. Before the call, in main's repository root (the snapshots are untracked: they travel):
#   rm -rf benchmarks/ab_base benchmarks/ab_fp8t2 && mkdir -p benchmarks/ab_base benchmarks/ab_fp8t2
#   git archive main csrc | tar -x -C benchmarks/ab_base
#   git archive wip/decode-fp8-cache-faster | tar -x -C benchmarks/ab_fp8t2
# The device command (main's root):
#   MLA_COMMIT=<hash> AB_QUICK=1 A_SRC=$PWD/benchmarks/ab_base/csrc \
#     bash benchmarks/ab_fp8t2/benchmarks/run_decode_fp8_cache_t_ab.sh
# Logs and JSON in $OUT. AB_QUICK=1 (<= ~190 s): H16 x B32,128 x L8192,32768, the fp16 row at H16 only, CALL_LIMIT
# 185; else H16,128 x B1,32,128 x L8192,32768 within 290 s. RUN_MUTANTS=1 (a separate call, <= 300 s): memcheck
# of sanitize.py's decode workload (the new kernel's cases included), then the FP8-cache mutants of
# tests/mutation/mutants_cuda.py for the new kernel (33-49) instead of the A/B.
set -u
t0=$(date +%s)
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
. benchmarks/checkout_first.sh
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  timeout "${MEMCHECK_TIMEOUT:-90}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m mla_core_cuda.sanitize decode 2>&1 | tee "$LOGS/fp8_cache_t_memcheck.log" | tail -6
  MUTANT_SELECTION=fp8cache MUTANT_INDICES=${MUTANT_INDICES:-33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49} \
    timeout "${MUTANT_TIMEOUT_ALL:-190}" python3 tests/mutation/mutants_cuda.py 2>&1 \
    | tee "$LOGS/fp8_cache_t_mutants.log" | tail -20
  exit 0
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_decode_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC (git archive main csrc, see above)"; exit 2
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
{ python3 benchmarks/probes/decode_fp8_cache_check.py; python3 benchmarks/probes/decode_fp8_cache_t_check.py
  python3 benchmarks/probes/decode_fp8_cache_t_emulation.py; } \
  2>&1 | tee "$LOGS/fp8_cache_checks.log" | grep -E "ALL PASS|FAIL"
if [ "${AB_QUICK:-0}" = 1 ]; then
  shape=(--heads 16 --batch 32,128 --lengths 8192,32768); fp16_heads=16; limit=${CALL_LIMIT:-185}; bench_s=75
else
  shape=(); fp16_heads=16,128; limit=${CALL_LIMIT:-290}; bench_s=110
fi
timeout "${BENCH_TIMEOUT:-$bench_s}" python3 benchmarks/bench_decode_fp8_cache_t_ab.py --src-a "$A_SRC" \
  --src-b "$PWD/csrc" "${shape[@]}" 2>&1 | tee "$LOGS/ab_bench.log" | tail -18
mkdir -p "$LOGS/fp16" && OUT=$LOGS/fp16 timeout "${FP16_TIMEOUT:-15}" \
  python3 benchmarks/bench_decode_fp8_cache_t_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" --q-dtype fp16 \
  --heads $fp16_heads --batch 32 --lengths 8192 2>&1 \
  | tee "$LOGS/ab_bench_fp16.log" | tail -5
left() { echo $(( limit - ($(date +%s) - t0) )); }
first="(fp8_cache and not 128) or fp8_cache_codes_exact or fp8_cache_unaligned"
echo "GPU tests (decode_t_kernel's paths first) with $(left) s left"
timeout "$(( $(left) > 20 ? $(left) : 20 ))" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line \
  tests/test_cuda_decode.py -k "${AB_TESTS:-$first}" 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
if [ -z "${AB_TESTS:-}" ] && [ "$(left)" -gt 15 ]; then
  echo "GPU tests (the other FP8-cache tests) with $(left) s left"
  timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line tests/test_cuda_decode.py \
    -k "fp8_cache and not ($first)" 2>&1 | tee "$LOGS/ab_gpu_tests_rest.log" | tail -8
fi
