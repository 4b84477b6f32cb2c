#!/usr/bin/env bash
# A/B of two builds of csrc/ on the cuda FP8 sparse decode (issue 10; first used for the earlier stage release of
# branch wip/sparse-early-release), one device call of ~100-130 s (the limits below add to 145 s: builds 70, tests
# 30, bench 45): build A (the base's csrc/) and B (this checkout's csrc/) side by side, the sparse GPU tests on B
# (the whole file: 53 tests, ~10 s measured for 55 in round (f)), then bench_sparse_ab.py: both builds timed
# alternately on both row layouts at FlashMLA's four shapes x q_len 1 (AB_ARGS; "--q-lens 1,2" adds q_len 2 for
# ~25 s more), the ratios, and B's outputs compared with A's: bit for bit on 656-byte rows, within the contract's
# tolerance on 576-byte rows (round (l): f16 operands there round P differently; AB_ARGS="" makes every layout
# bit-equal again, for a change of synchronization only).
# A's sources: A_SRC (a csrc/ folder inside the tree, so it travels), else A_REV through git where the tree has its
# .git. Before the call, here:
#   mkdir -p benchmarks/ab_base && git archive main csrc | tar -x -C benchmarks/ab_base   # untracked: travels
#   MLA_COMMIT=<hash> A_SRC=benchmarks/ab_base/csrc bash benchmarks/run_sparse_ab.sh   (the device command)
# Logs and JSON in $OUT. AB_TESTS: a pytest -k selection (default: the whole file; "not ds_mla": 576-byte rows only).
# MEMCHECK=1: then, if >= 25 s of CALL_LIMIT are left, compute-sanitizer memcheck of B's sparse cases
# (mla_core_cuda.sanitize sparse, both row layouts; log memcheck.log).
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
if [ -z "${A_SRC:-}" ] && [ -n "${A_REV:-}" ]; then
  A_SRC=$(mktemp -d)/csrc && mkdir -p "$(dirname "$A_SRC")" && git archive "$A_REV" csrc | tar -x -C "$(dirname "$A_SRC")"
fi
if [ ! -f "${A_SRC:-/nonexistent}/mla_sparse_wgmma.cu" ]; then
  echo "A_SRC (${A_SRC:-unset}) holds no csrc/: set A_SRC, or A_REV where git works"; exit 2
fi
A_SRC=$(cd "$A_SRC" && pwd)
# this checkout first on the path (a warm machine may hold another install)
. benchmarks/checkout_first.sh
CACHE_A=${AB_CACHE_A:-$(mktemp -d)} CACHE_B=${AB_CACHE_B:-$(mktemp -d)}
build() {  # $1: csrc folder, $2: cache folder, $3: log name
  { time MLA_CORE_CUDA_SRC=$1 MLA_CORE_CACHE_DIR=$2 timeout "${BUILD_TIMEOUT:-70}" python3 -c \
      "from mla_core_cuda import build; m = build.build(); print(m.__name__, m.__file__)"; } >"$LOGS/$3" 2>&1
}
build "$A_SRC" "$CACHE_A" ab_build_a.log & pa=$!
build "$PWD/csrc" "$CACHE_B" ab_build_b.log & pb=$!
wait $pa; ra=$?; wait $pb; rb=$?
tail -n 4 "$LOGS/ab_build_a.log" "$LOGS/ab_build_b.log"
stamp "builds (A rc $ra, B rc $rb)"
[ "$rb" = 0 ] || exit 3
# GPU tests on B (the default source: this checkout's csrc/, built into CACHE_B above)
MLA_CORE_CACHE_DIR=$CACHE_B timeout "${TEST_TIMEOUT:-30}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE \
  --tb=line --durations=5 tests/test_cuda_sparse.py ${AB_TESTS:+-k "$AB_TESTS"} 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -12
stamp tests
[ "$ra" = 0 ] || exit 4
OUT=$LOGS timeout "${BENCH_TIMEOUT:-45}" python3 benchmarks/bench_sparse_ab.py --src-a "$A_SRC" --cache-a "$CACHE_A" \
  --src-b "$PWD/csrc" --cache-b "$CACHE_B" ${AB_ARGS---q-lens 1 --bitequal fp8_ds_mla} 2>&1 | tee "$LOGS/ab_bench.log" | tail -22
stamp bench
if [ "${MEMCHECK:-0}" = 1 ] && [ "$(left)" -ge 25 ]; then
  MLA_CORE_CACHE_DIR=$CACHE_B timeout "$(cap 60)" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize sparse 2>&1 | tee "$LOGS/memcheck.log" | tail -4
  stamp "memcheck (rc ${PIPESTATUS[0]})"
fi
