#!/usr/bin/env bash
# Issue 11, one device call (H200, <= 200 s): MLAAttention(cuda_graph_decode=True), the eager decode step replayed
# as a CUDA graph; benchmarks/NOTES.md "Eager decode step as a CUDA-graph replay (round n)" holds the prediction
# and the merge rule.
#   1. build the cuda extension (csrc/ unchanged from main; the 16-head step's attention and prep run there);
#   2. the GPU tests of tests/test_layer_graph_gpu.py (replayed output and cache rows bit-equal to the eager
#      module's for 16 steps at 16 / 128 heads, batch 1 / 3, full / metadata checks; bad input raising before any
#      replay; recapture after reset_cache), then test_layer_gpu.py's module-vs-transformers and CUDA-graph tests
#      (the refactored eager path);
#   3. bench_layer.py's module table at 128x1,16x1: eager full / metadata rows, the replayed step's full / metadata
#      rows, transformers in the same run;
#   4. optional, with A_DIR (a whole-tree snapshot of main: benchmarks/prep_snapshots.sh ab_base=main) and the time
#      left: A's module table in the same call (the default eager path before the refactor; the graph rows absent).
# Logs in $OUT: build.log, gpu_tests.log, gpu_tests_layer.log, bench_layer_module.log (+ .json), A_module.log.
# Device command (the lead's, from the root of this branch's checkout; timeout_s 210):
#   MLA_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/run_graphstep.sh
# With main's eager rows in the same call (CALL_LIMIT 280, timeout_s 290):
#   bash benchmarks/prep_snapshots.sh ab_base=main && \
#   MLA_COMMIT=... A_DIR=$PWD/benchmarks/ab_base CALL_LIMIT=280 bash benchmarks/run_graphstep.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=195
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
ROOT=$PWD
(
  . benchmarks/checkout_first.sh
  python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, \
'transformers', transformers.__version__)"
  timeout "$(cap "${BUILD_S:-120}")" python3 -c "from mla_core_cuda import build; m = build.build(); print(m.__file__)" \
    >"$LOGS/build.log" 2>&1
)
rb=$?
tail -2 "$LOGS/build.log"
stamp "build (rc $rb)"
[ "$rb" = 0 ] || exit 1
. benchmarks/checkout_first.sh
timeout "$(cap "${TESTS_S:-90}")" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_graph_gpu.py \
  >"$LOGS/gpu_tests.log" 2>&1
rt=$?
tail -4 "$LOGS/gpu_tests.log"
stamp "graph step GPU tests (rc $rt)"
timeout "$(cap 60)" python3 benchmarks/bench_layer.py --skip decode,prefill --module-shapes 128x1,16x1 \
  >"$LOGS/bench_layer_module.log" 2>&1
rm_=$?
[ -f "$LOGS/bench_layer.json" ] && mv "$LOGS/bench_layer.json" "$LOGS/bench_layer_module.json"
stamp "module table (rc $rm_)"
if [ "$(left)" -gt 25 ]; then
  timeout "$(cap 25)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_gpu.py \
    -k "matches_transformers or cuda_graph" >"$LOGS/gpu_tests_layer.log" 2>&1
  rl=$?
  stamp "layer GPU tests (rc $rl)"
else
  rl=skipped
fi
ra=skipped
if [ -n "${A_DIR:-}" ] && [ "$(left)" -gt 70 ]; then
  ( cd "$A_DIR" && . benchmarks/checkout_first.sh && \
    timeout "$(cap 60)" python3 benchmarks/bench_layer.py --skip decode,prefill --module-shapes 128x1,16x1 ) \
    >"$LOGS/A_module.log" 2>&1
  ra=$?
  [ -f "$LOGS/bench_layer.json" ] && mv "$LOGS/bench_layer.json" "$LOGS/A_module.json"
  stamp "A (main) module table (rc $ra)"
fi
echo "=== summary (commit ${MLA_COMMIT:-unknown}, +$(( $(date +%s) - t0 )) s)"
echo "graph step GPU tests rc $rt: $(tail -1 "$LOGS/gpu_tests.log")"
grep -E "^FAILED|^ERROR" "$LOGS/gpu_tests.log" | cut -c1-160 | head -6
echo "layer GPU tests rc $rl: $(tail -1 "$LOGS/gpu_tests_layer.log" 2>/dev/null)"
echo "B module table (rc $rm_), eager rows then the replayed rows:"
grep -o "^module H[0-9]* B[0-9]*\|graph-replayed step.*" "$LOGS/bench_layer_module.log" | paste - - | head -2
sed -n '/^# decode step of the whole/,$p' "$LOGS/bench_layer_module.log" | grep -v '^$' | head -14
if [ "$ra" != skipped ]; then
  echo "A (main) module table (rc $ra):"
  grep -E "^module H" "$LOGS/A_module.log"
fi
[ "$rt" = 0 ] && [ "$rm_" = 0 ]
