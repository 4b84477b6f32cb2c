#!/usr/bin/env bash
# Issue 11, one device call: the eager decode step's host time on the H200 at this checkout, within TOTAL_S (90) s.
#   MLA_COMMIT=<hash> TOTAL_S=90 bash benchmarks/eager_host_device.sh        (logs and JSON in $OUT)
# Installs this checkout (editable, as device_run.sh does) and builds the cuda backend (the 128-head decode runs on
# it), then, most wanted first, each step cut at the time left: bench_layer.py's module table (MLAAttention eager
# full / metadata / graph against transformers' eager DeepseekV3Attention, MODULE_SHAPES), host_overhead.py
# (DeepSeek-V3 dims, L 8192, batch 1, the inner decode op, the layer op and MLAAttention in both check modes, op
# counts, per-op host costs) at 128 heads, the same at 16 heads, at 16 heads with the attention on the cuda
# backend (one extension call for triton's split + combine launches: the eager A/B of NOTES "cuda decode
# launcher"), then the GPU tests of the module against transformers and of the decode step in a CUDA graph.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
TOTAL_S=${TOTAL_S:-90}
cd "$(dirname "$0")/.."
left() { local l=$(( TOTAL_S - SECONDS )); echo $(( l > 1 ? l : 1 )); }   # (timeout 0 would mean none)
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
python3 -c "import mla_core, torch, triton, transformers; print('mla_core at', mla_core.__file__, 'torch', torch.__version__,
'triton', triton.__version__, 'transformers', transformers.__version__, 'backends', sorted(mla_core.backends()))"
echo "commit ${MLA_COMMIT:-?} (the working tree copied to the device)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
{ time timeout "$(left)" python3 -c "from mla_core_cuda import build; print(build.build().__file__)"; } 2>&1 | tail -4
echo "=== bench_layer module table, $(left) s left"
timeout "$(left)" python3 benchmarks/bench_layer.py --skip decode,prefill \
  --module-shapes "${MODULE_SHAPES:-128x1,16x1,128x32}" 2>&1 | tee "$OUT/bench_layer_module.log" | grep -v "^$" | tail -9
for run in 128: 16: 16:cuda; do    # heads:attention backend ('' automatic; cuda: the 16-head eager A/B)
  heads=${run%%:*} be=${run#*:}
  [ "$(left)" -gt 8 ] || break
  echo "=== host_overhead, $heads heads, attention ${be:-automatic}, $(left) s left"
  timeout "$(left)" python3 benchmarks/host_overhead.py --device cuda --dims deepseek --heads "$heads" --length 8192 \
    --backend "$be" --count --repeats "${REPEATS:-7}" $([ "$heads" = 128 ] && echo --launch-costs) \
    --json "$OUT/host_overhead_h$heads${be:+_$be}.json" 2>&1 | tee "$OUT/host_overhead_h$heads${be:+_$be}.log"
done
if [ "$(left)" -gt 20 ]; then
  echo "=== GPU tests, $(left) s left"
  timeout "$(left)" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_gpu.py \
    -k "matches_transformers or cuda_graph" 2>&1 | tee "$OUT/gpu_tests_layer.log" | tail -4
fi
echo "=== done, ${SECONDS} s"
