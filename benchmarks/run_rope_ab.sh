#!/usr/bin/env bash
# A/B of the musa_fp8 RoPE + FP8 quantize kernel (issue 10, branch wip/rope-faster), one device call of ~60-80 s (the
# limits below add to <= 85 s): bench_rope_ab.py first (A = the base's rope.py at its default config, B = this
# checkout's at each config, timed alternately as CUDA-graph replays with the L2 flushed; the copy ceiling, the
# reference's time and its ratio to B; B's 576-byte rows compared with A's byte for byte), then the rope GPU tests on
# B (torch.compile's test left out: ~20 s of compiling that does not touch the kernel's launcher).
# A's package: A_DIR (a folder inside the tree, so it travels), else A_REV through git where the tree has its .git.
# Before the call, here:
#   mkdir -p benchmarks/ab_base_rope && git archive main backends/musa_fp8/mla_core_musa_fp8 | tar -x -C benchmarks/ab_base_rope
#   mkdir -p benchmarks/ab_v1_rope && git archive 01d2447 backends/musa_fp8/mla_core_musa_fp8 | tar -x -C benchmarks/ab_v1_rope  # optional
#   MLA_COMMIT=<hash> A_DIR=benchmarks/ab_base_rope AB_ARGS="--extra v1=benchmarks/ab_v1_rope" bash benchmarks/run_rope_ab.sh
#   (the device command; AB_ARGS optional: the extra times the branch's first kernel, 01d2447, at its first config)
# Logs and JSON in $OUT. AB_ARGS: extra bench_rope_ab.py arguments (e.g. --tokens 4096 --neox-tokens '').
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-/tmp}
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
if [ -z "${A_DIR:-}" ] && [ -n "${A_REV:-}" ]; then
  A_DIR=$(mktemp -d) && git archive "$A_REV" backends/musa_fp8/mla_core_musa_fp8 | tar -x -C "$A_DIR"
fi
if [ ! -f "${A_DIR:-/nonexistent}/backends/musa_fp8/mla_core_musa_fp8/rope.py" ]; then
  echo "A_DIR (${A_DIR:-unset}) holds no backends/musa_fp8/mla_core_musa_fp8/rope.py: set A_DIR, or A_REV where git works"
  exit 2
fi
# this checkout first on the path (a warm machine may hold another install); one Triton cache for bench and tests
. benchmarks/checkout_first.sh
export TRITON_CACHE_DIR=${AB_TRITON_CACHE:-$(mktemp -d)}
OUT=$LOGS timeout "${BENCH_TIMEOUT:-45}" python3 benchmarks/bench_rope_ab.py --base "$A_DIR" ${AB_ARGS:-} 2>&1 \
  | tee "$LOGS/ab_bench.log" | tail -16
rb=${PIPESTATUS[0]}
stamp "bench (rc $rb)"
timeout "${TEST_TIMEOUT:-40}" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --tb=line --durations=3 \
  tests/test_musa_fp8.py -k "${AB_TESTS:-rope and not compile}" 2>&1 | tee "$LOGS/ab_gpu_tests.log" | tail -8
stamp tests
exit "$rb"
