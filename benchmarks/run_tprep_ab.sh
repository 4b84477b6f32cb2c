#!/usr/bin/env bash
# Issue 11, one device call (<= 90 s): the Triton prefill prep with whole rope rows (wip/tprep) against main's
# stride-2 pair loads; benchmarks/NOTES.md "The Triton prefill prep's rope rows" holds the prediction and the rule.
#   1. bench_tprep_ab.py: `layer._prep` (COPY_NOPE, ROWS) at 128 heads, 4 x 4096, A = main's layer.py (snapshot),
#      B = this tree's, alternating rounds, CUDA events; q_pre / rows / cache bit-equal between the arms (rc 1 if not);
#   2. the CUDA extension (cached when this csrc/ was built on the machine before);
#   3. layer_parts_profile.py: the layer's kernels (the prefill's _prep_kernel line is the number);
#   4. the GPU tests of test_layer_triton (with the new q_pre bit-equality test), test_layer_cuda_prep (the CUDA
#      decode prep against the unchanged Triton decode form), test_layer_gpu.
# Logs in $OUT: ab.log, build.log, layer_parts.log, gpu_tests.log, triton_prep_kernel_*.ptx; summary = last lines.
# Device command (the lead's, from the root of this branch's tree, after
#   bash benchmarks/prep_snapshots.sh ab_tprep_base=main:backends/triton/mla_core_triton/layer.py ; timeout_s 100):
#   bash benchmarks/run_tprep_ab.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=90
. benchmarks/device_clock.sh   # t0, stamp, left, cap
A_LAYER=${A_LAYER:-benchmarks/ab_tprep_base/backends/triton/mla_core_triton/layer.py}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
if [ -f "$A_LAYER" ]; then
  timeout "$(cap 25)" python3 benchmarks/bench_tprep_ab.py --a "$A_LAYER" >"$LOGS/ab.log" 2>&1
  ra=$?
else
  echo "no A snapshot at $A_LAYER (run prep_snapshots.sh first)" >"$LOGS/ab.log"; ra=2
fi
stamp "A/B (rc $ra)"
timeout "$(cap 40)" python3 -c "from mla_core_cuda import build; m = build.build(); print(m.__file__)" \
  >"$LOGS/build.log" 2>&1
rb=$?
stamp "build (rc $rb)"
timeout "$(cap 25)" python3 benchmarks/probes/layer_parts_profile.py --steps 10 >"$LOGS/layer_parts.log" 2>&1
rp=$?
stamp "layer parts (rc $rp)"
timeout "$(cap 60)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_triton.py \
  tests/test_layer_cuda_prep.py tests/test_layer_gpu.py >"$LOGS/gpu_tests.log" 2>&1
rt=$?
stamp "gpu tests (rc $rt)"
i=0
for f in "${TRITON_CACHE_DIR:-$HOME/.triton/cache}"/*/_prep_kernel.ptx; do
  [ -f "$f" ] && cp "$f" "$LOGS/triton_prep_kernel_$i.ptx" && i=$((i + 1))
done
echo "=== summary (wip/tprep; A = main's Triton prefill prep, B = whole rope rows)"
grep -E "^(bit-equal|A:|B|B / A)" "$LOGS/ab.log" || tail -3 "$LOGS/ab.log"
grep -E "^# (decode|prefill)|_prep_kernel" "$LOGS/layer_parts.log" | cut -c1-100 || tail -3 "$LOGS/layer_parts.log"
grep -E "passed|failed|error" "$LOGS/gpu_tests.log" | tail -2
echo "rc: ab $ra build $rb parts $rp tests $rt; $i prep PTX kept; +$(( $(date +%s) - t0 )) s"
