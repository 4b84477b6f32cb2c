#!/usr/bin/env bash
# One device call for issue 11's eager 16-head dispatch (NOTES "eager 16-head dispatch (round h)"): install and build
# (device_run.sh build), the probe of a first Triton launch inside a capture (in a fresh process), the GPU tests of
# tests/test_dispatch_capture.py, then host_overhead at 16 heads, automatic dispatch. Logs in $OUT.
#   MLA_COMMIT=<hash> bash benchmarks/dispatch_capture_device.sh          (~90-150 s with the cuda build)
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-$(mktemp -d)}
export OUT
cd "$(dirname "$0")/.."
bash benchmarks/device_run.sh build
echo "=== probe ($(date +%T))"
timeout 120 python3 benchmarks/probes/triton_first_launch_in_capture.py 2>&1 \
  | tee "$OUT/probe_triton_first_launch.log" | tail -3
echo "=== GPU tests ($(date +%T))"
timeout 240 python3 -m pytest -m gpu -q -p no:cacheprovider -rfE tests/test_dispatch_capture.py 2>&1 \
  | tee "$OUT/gpu_tests_dispatch_capture.log" | tail -15
echo "=== host_overhead, 16 heads, automatic ($(date +%T))"
timeout 240 python3 benchmarks/host_overhead.py --device cuda --dims deepseek --heads 16 --length 8192 --backend '' \
  --count --repeats 7 --json "$OUT/host_overhead_h16_auto.json" 2>&1 | tee "$OUT/host_overhead_h16_auto.log"
echo "=== done ($(date +%T))"
