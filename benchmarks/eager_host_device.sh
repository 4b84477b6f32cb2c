#!/usr/bin/env bash
# Issue 11, one device call (<= 150 s): the eager decode step's host time on the H200 at this checkout.
#   MLA_COMMIT=<hash> bash benchmarks/eager_host_device.sh        (logs and JSON in $OUT)
# Installs this checkout (editable, as device_run.sh does), builds the cuda backend (the 128-head decode runs on
# it), then host_overhead.py (DeepSeek-V3 dims, L 8192, batch 1, the layer op and MLAAttention, full / metadata
# checks, with op counts) at 128 and 16 heads, then bench_layer.py's module table (MLAAttention eager full /
# metadata / graph against transformers' eager DeepseekV3Attention) at batch 1 and 32, then, while TOTAL_S (140)
# leaves time, the GPU tests of the module against transformers and of the decode step in a CUDA graph.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || tail -5 "$OUT/install.log"
python3 -c "import mla_core, torch, triton, transformers; print('mla_core at', mla_core.__file__, 'torch', torch.__version__,
'triton', triton.__version__, 'transformers', transformers.__version__, 'backends', sorted(mla_core.backends()))"
echo "commit ${MLA_COMMIT:-?} (the working tree copied to the device)"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
{ time timeout "${BUILD_TIMEOUT:-45}" python3 -c "from mla_core_cuda import build; print(build.build().__file__)"; } 2>&1 | tail -4
for heads in 128 16; do
  echo "=== host_overhead, $heads heads ($(date +%T))"
  timeout "${HOST_TIMEOUT:-30}" python3 benchmarks/host_overhead.py --device cuda --dims deepseek --heads "$heads" \
    --length 8192 --backend '' --count --repeats "${REPEATS:-9}" $([ "$heads" = 128 ] && echo --launch-costs) --json "$OUT/host_overhead_h$heads.json" 2>&1 \
    | tee "$OUT/host_overhead_h$heads.log"
done
echo "=== bench_layer module table ($(date +%T))"
timeout "${LAYER_TIMEOUT:-50}" python3 benchmarks/bench_layer.py --skip decode,prefill \
  --module-shapes "${MODULE_SHAPES:-128x1,16x1,128x32,16x32}" 2>&1 | tee "$OUT/bench_layer_module.log" | tail -12
left=$(( ${TOTAL_S:-140} - SECONDS ))
if [ "$left" -gt 25 ]; then   # the module against transformers on the GPU (bf16), and the decode step in a graph
  echo "=== GPU tests, ${left} s left ($(date +%T))"
  timeout "$left" python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_layer_gpu.py \
    -k "matches_transformers and False or cuda_graph" 2>&1 | tee "$OUT/gpu_tests_layer.log" | tail -4
fi
echo "=== done ($(date +%T), ${SECONDS} s)"
