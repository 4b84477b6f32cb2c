#!/usr/bin/env bash
# A/B of the cuda decode over a bf16 cache at 16 heads (issue 9, round (l): the keys-as-M kernel decode_km_kernel,
# config {"kernel": "keys_m"}, branch wip/decode-ktb), one device call: build A (main's csrc/) and B (this
# checkout's) side by side, the CPU check of its layouts (benchmarks/probes/decode_keys_m_check.py, into
# ab_build_b.log), bench_decode_keys_m_bf16_ab.py (A = Q1 under the default WGMMA config, B = keys_m; A B B A
# A B graph replays; B's Q1 and FP8-cache outputs bit-equal to A's, keys_m within 1e-2 rel L2 / 1e-3 LSE of Q1), one
# fp16 row, then the GPU tests on B with the time left of CALL_LIMIT: the keys-as-M tests first, then the tests of the
# code they share (the FP8-cache keys-as-M kernel's end, km_merge; Q1 at 16 heads). Before the call, in main's root:
#   bash benchmarks/prep_snapshots.sh ab_base=main:csrc ab_ktb=wip/decode-ktb
# The device commands (main's root; each <= 300 s):
#   MLA_COMMIT=<hash> A_SRC=$PWD/benchmarks/ab_base/csrc bash benchmarks/ab_ktb/benchmarks/run_decode_keys_m_bf16_ab.sh
#   MLA_COMMIT=<hash> RUN_MUTANTS=1 bash benchmarks/ab_ktb/benchmarks/run_decode_keys_m_bf16_ab.sh
# RUN_MUTANTS=1: memcheck of sanitize.py's decode workload (keys_m cases included), then the keys-as-M mutants of
# tests/mutation/mutants_cuda.py (50-56) judged by KEYS_M_SELECTION, instead of the A/B. Six files (four) in $OUT.
set -u
t0=$(date +%s)
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
. benchmarks/checkout_first.sh
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  timeout "${MEMCHECK_TIMEOUT:-90}" /usr/local/cuda/bin/compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m mla_core_cuda.sanitize decode 2>&1 | tee "$LOGS/keys_m_memcheck.log" | tail -6
  MUTANT_SELECTION=keysm MUTANT_INDICES=${MUTANT_INDICES:-50,51,52,53,54,55,56} MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-60} \
    timeout "${MUTANT_TIMEOUT_ALL:-195}" python3 tests/mutation/mutants_cuda.py 2>&1 \
    | tee "$LOGS/keys_m_mutants.log" | tail -12
  exit 0
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_decode_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC (prep_snapshots.sh ab_base=main:csrc, see above)"; exit 2
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
limit=${CALL_LIMIT:-290}
python3 benchmarks/probes/decode_keys_m_check.py 2>&1 | tee -a "$LOGS/ab_build_b.log" | tail -1
timeout "${BENCH_TIMEOUT:-80}" python3 benchmarks/bench_decode_keys_m_bf16_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" \
  --heads 16 --batch "${AB_BATCH:-1,32,128}" --lengths 8192,32768 2>&1 | tee "$LOGS/ab_bench.log" | tail -12
OUT= timeout "${FP16_TIMEOUT:-15}" python3 benchmarks/bench_decode_keys_m_bf16_ab.py --src-a "$A_SRC" \
  --src-b "$PWD/csrc" --q-dtype fp16 --heads 16 --batch 32 --lengths 8192 2>&1 | tee "$LOGS/ab_bench_fp16.log" | tail -4
left() { echo $(( limit - ($(date +%s) - t0) )); }
echo "GPU tests (keys-as-M first, then km_merge's FP8-cache kernel and Q1 at 16 heads) with $(left) s left"
timeout "$(( $(left) > 20 ? $(left) : 20 ))" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line \
  tests/test_cuda_decode.py -k "${AB_TESTS:-keys_m}" 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
if [ -z "${AB_TESTS:-}" ] && [ "$(left)" -gt 15 ]; then
  echo "GPU tests (fp8_cache_few_heads, fp8_cache_codes_exact, deepseek bf16 at 16 heads) with $(left) s left"
  timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider --tb=line tests/test_cuda_decode.py \
    -k "fp8_cache_few_heads or fp8_cache_codes_exact or (deepseek and bf16-16)" 2>&1 \
    | tee -a "$LOGS/ab_gpu_tests.log" | tail -8
fi
