#!/usr/bin/env bash
# Issue 11, one device call (H200, <= 200 s): the eager decode step with the layer's prep inside the cuda decode's
# one extension call (csrc/mla_layer_prep.cu, bindings.cpp layer_decode) against the Triton prep; benchmarks/NOTES.md
# "Eager decode: the prep inside the cuda call (round m, pending)" holds the prediction and the merge rule.
#   1. build the extension (the new unit included; ~20 s on 16 cores);
#   2. the 35 GPU tests of tests/test_layer_cuda_prep.py (bit-equality of cache rows, absorbed query, key counts and
#      outputs against the Triton prep: 16 / 128 heads, pages 64 / 37, batch 1 / 3, page edges, layouts, the three
#      kernels; its CPU tests need the Triton interpreter: run here on the CPU), later the layer's other GPU tests
#      that now take the new path (test_layer_gpu.py: the module against transformers, the step in a CUDA graph);
#   3. bench_layer_prep_ab.py: the eager MLAAttention step at 128 and 16 heads, batch 1, L 8192, Triton prep vs CUDA
#      prep, both check modes, event-timed and host-clock, alternating rounds in one process (exit 1 unless both
#      arms are bit-equal and the CUDA arm ran);
#   4. bench_layer.py's module table at 128x1,16x1 (the CUDA prep on, the default): transformers' eager step in the
#      same run, the ratio the issue asks for;
#   5. with the time left: host_overhead.py at 128 heads with MLA_CORE_LAYER_CUDA_PREP=0 and =1 (op counts).
# Logs in $OUT: build.log, gpu_tests.log, triton_prep_kernel_*.ptx (the device Triton's PTX of the prep, to read
# its summation order if a bit-equality test fails; then the script also tries the CUDA prep's three summation
# orders, MLA_CORE_LAYER_PREP_ORDER=S, on the 2,048-row and the 128-head page-64 cases: order_S.log), ab.log + bench_layer_prep_ab.json, bench_layer_module.log,
# gpu_tests_layer.log, host_*.log.
# Device command (the lead's, from the root of a checkout with this patch applied; timeout_s 210):
#   MLA_COMMIT=<hash> bash benchmarks/run_layer_prep_ab.sh
# Mutants, a later call (timeout_s 480; the csrc mutants 57-64 are 8 full builds in parallel):
#   RUN_MUTANTS=1 CALL_LIMIT=470 bash benchmarks/run_layer_prep_ab.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=195
. benchmarks/device_clock.sh   # t0, stamp, left, cap
echo "commit ${MLA_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
. benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
timeout "$(cap "${BUILD_S:-120}")" python3 -c "from mla_core_cuda import build; m = build.build(); \
print(m.__file__, 'layer_decode' in dir(m))" >"$LOGS/build.log" 2>&1
rb=$?
tail -3 "$LOGS/build.log"
stamp "build (rc $rb)"
[ "$rb" = 0 ] || exit 1
if [ "${RUN_MUTANTS:-0}" = 1 ]; then
  # seven full builds at once: MAX_JOBS bounds each one's nvcc processes (memory)
  MAX_JOBS=${MAX_JOBS:-4} MUTANT_SELECTION=layerprep MUTANT_INDICES=${MUTANT_INDICES:-57,58,59,60,61,62,63,64} \
    timeout "$(cap 400)" python3 tests/mutation/mutants_cuda.py 2>&1 | tee "$LOGS/mutants.log" | tail -12
  timeout "$(cap 120)" python3 tests/mutation/run.py --only 'cuda_launcher#10' --timeout 110 2>&1 \
    | tee -a "$LOGS/mutants.log" | tail -3
  stamp mutants
  exit 0
fi
timeout "$(cap "${TESTS_S:-80}")" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_cuda_prep.py \
  >"$LOGS/gpu_tests.log" 2>&1
rt=$?
tail -4 "$LOGS/gpu_tests.log"
stamp "layer cuda prep tests (rc $rt)"
# the device Triton's own PTX of the prep (its summation order and fusions: what the CUDA prep must match)
i=0
for f in "${TRITON_CACHE_DIR:-$HOME/.triton/cache}"/*/_prep_kernel.ptx; do
  [ -f "$f" ] && cp "$f" "$LOGS/triton_prep_kernel_$i.ptx" && i=$((i + 1))
done
echo "$i Triton prep PTX files kept"
if [ "$rt" != 0 ] && grep -qE "bit_equal|many_rows" "$LOGS/gpu_tests.log"; then
  # a bit-equality failure: which sum_order of the CUDA prep equals this Triton (no rebuild needed)
  for order in 0 1 2; do
    [ "$(left)" -gt 60 ] || break
    MLA_CORE_LAYER_PREP_ORDER=$order timeout "$(cap 25)" python3 -m pytest -m gpu -x -q -p no:cacheprovider \
      tests/test_layer_cuda_prep.py -k "many_rows or (bit_equal and 128-64)" >"$LOGS/order_$order.log" 2>&1
    echo "MLA_CORE_LAYER_PREP_ORDER=$order: rc $? ($(tail -1 "$LOGS/order_$order.log"))"
  done
  stamp "order search"
fi
timeout "$(cap "${AB_S:-60}")" python3 benchmarks/bench_layer_prep_ab.py --heads 128,16 --length 8192 \
  --rounds "${ROUNDS:-3}" 2>&1 | tee "$LOGS/ab.log" | tail -5
ra=${PIPESTATUS[0]}
stamp "A/B (rc $ra)"
if [ "$(left)" -gt 25 ]; then
  timeout "$(cap 45)" python3 benchmarks/bench_layer.py --skip decode,prefill --module-shapes 128x1,16x1 2>&1 \
    | tee "$LOGS/bench_layer_module.log" | grep -v "^$" | tail -9
  stamp "bench_layer module table"
fi
if [ "$(left)" -gt 25 ]; then
  timeout "$(cap 25)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_gpu.py \
    -k "matches_transformers or cuda_graph" 2>&1 | tee "$LOGS/gpu_tests_layer.log" | tail -3
  stamp "layer GPU tests"
fi
for arm in 0 1; do
  [ "$(left)" -gt 12 ] || break
  MLA_CORE_LAYER_CUDA_PREP=$arm timeout "$(cap 12)" python3 benchmarks/host_overhead.py --device cuda --dims deepseek \
    --heads 128 --length 8192 --backend "" --count --repeats 5 --json "$LOGS/host_h128_prep$arm.json" \
    >"$LOGS/host_h128_prep$arm.log" 2>&1
  tail -6 "$LOGS/host_h128_prep$arm.log"
  stamp "host_overhead 128 heads, MLA_CORE_LAYER_CUDA_PREP=$arm"
done
echo "=== done at +$(( $(date +%s) - t0 )) s; tests rc $rt, A/B rc $ra"
[ "$rt" = 0 ] && [ "$ra" = 0 ]
