#!/usr/bin/env bash
# A/B of the WGMMA decode's schedules Q1 / Q1p (issue 9, branch wip/decode-128-heads-w), one device call of
# ~300 s (the limits below add to <= 400 s): build A (main's csrc/ snapshot) and B (this checkout's csrc/) side by
# side; the GPU decode tests on B with MLA_CORE_CUDA_DECODE_SCHEDULE=q1 (every unquantized WGMMA case then runs Q1
# against the reference; test_schedule_q1_bit_equal compares q1 and q1p with the seesaw bit for bit; the
# quantized cases run the unchanged instances), a shorter set under q1p; then bench_decode_w_ab.py: A (seesaw),
# q1 and q1p timed alternately, each / A and / FlashMLA, outputs against A's bit for bit. A's sources: A_SRC (a
# csrc/ folder inside the tree, so it travels), else A_REV through git where the tree has its .git. Before the
# call, here:
#   mkdir -p benchmarks/ab_base && git archive a733cdd csrc | tar -x -C benchmarks/ab_base   # untracked: travels
#   MLA_COMMIT=<hash> A_SRC=benchmarks/ab_base/csrc bash benchmarks/run_decode_w_ab.sh   (the device command)
# Logs and JSON in $OUT. AB_QUICK=1: H128 x B32 x L8192 only. Run it with timeout_s 420.
set -u
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
echo "commit ${MLA_COMMIT:-unknown}"
if [ -z "${A_SRC:-}" ] && [ -n "${A_REV:-}" ]; then
  A_SRC=$(mktemp -d)/csrc && mkdir -p "$(dirname "$A_SRC")" && git archive "$A_REV" csrc | tar -x -C "$(dirname "$A_SRC")"
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_decode_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC, or A_REV where git works"; exit 2
fi
A_SRC=$(cd "$A_SRC" && pwd)
# this checkout first on the path (a warm machine may hold another install)
. benchmarks/checkout_first.sh
export MLA_CORE_CACHE_DIR=${AB_CACHE:-$(mktemp -d)}  # one fresh cache: the two builds differ in key
build() {  # $1: csrc folder, $2: log name
  { time MLA_CORE_CUDA_SRC=$1 timeout "${BUILD_TIMEOUT:-110}" python3 -c \
      "from mla_core_cuda import build; m = build.build(); print(m.__name__, m.__file__)"; } >"$LOGS/$2" 2>&1
}
build "$A_SRC" ab_build_a.log & pa=$!
build "$PWD/csrc" ab_build_b.log & pb=$!
wait $pa; wait $pb
tail -n 4 "$LOGS/ab_build_a.log" "$LOGS/ab_build_b.log"
MLA_CORE_CUDA_DECODE_SCHEDULE=q1 timeout "${TEST_TIMEOUT:-150}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  --tb=line tests/test_cuda_decode.py \
  -k "${AB_TESTS:-q1 or (deepseek and bf16) or heads_and_out or fp16_cache or caller or strides or odd_page or unchecked or (graph and bf16) or compile}" \
  2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
MLA_CORE_CUDA_DECODE_SCHEDULE=q1p timeout "${TEST2_TIMEOUT:-60}" python3 -m pytest -m gpu -q -p no:cacheprovider \
  --tb=line tests/test_cuda_decode.py -k "${AB_TESTS2:-(deepseek and bf16) or heads_and_out or (graph and bf16)}" \
  2>&1 | tee "$LOGS/ab_gpu_tests_q1p.log" | tail -4
if [ "${AB_QUICK:-0}" = 1 ]; then shape=(--heads 128 --batch 32 --lengths 8192); else shape=(); fi
timeout "${BENCH_TIMEOUT:-75}" python3 benchmarks/bench_decode_w_ab.py --src-a "$A_SRC" --src-b "$PWD/csrc" \
  "${shape[@]}" 2>&1 | tee "$LOGS/ab_bench.log" | tail -14
mkdir -p "$LOGS/fp16" && OUT=$LOGS/fp16 timeout "${FP16_TIMEOUT:-15}" python3 benchmarks/bench_decode_w_ab.py \
  --src-a "$A_SRC" --src-b "$PWD/csrc" --dtype fp16 --heads 128 --batch 32 --lengths 8192 2>&1 \
  | tee "$LOGS/ab_bench_fp16.log" | tail -4
