#!/usr/bin/env bash
# Build and run the WGMMA probe (benchmarks/probes/wgmma_probe.cu) on a Hopper GPU (H100 / H200):
#   bash benchmarks/probes/run_wgmma_probe.sh | tee $OUT/wgmma_probe.log
# Exit status: the probe's (0 when every correctness test passes). NVCC and BIN override the compiler and the
# binary's path. The -gencode form: with nvcc 13.0, `-arch=sm_90a` adds a plain compute_90 pass as well
# (the probe compiles there too, its sm_90a-only bodies as traps).
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/wgmma_probe}
echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; $("$NVCC" --version | tail -1)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader \
  2>/dev/null || true
if ! "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" wgmma_probe.cu \
    >"$BIN.ptxas.log" 2>&1; then
  cat "$BIN.ptxas.log"
  echo "BUILD FAILED"
  exit 2
fi
# ptxas: registers / spills per kernel; wgmma serialization (C7510) and compiler-inserted warpgroup.arrive (C7519)
grep -E "Compiling entry|Used [0-9]+ registers|spill stores" "$BIN.ptxas.log" \
  | grep -vE "0 bytes spill stores, 0 bytes spill loads" \
  | sed -E "s/.*Compiling entry function '([^']+)'.*/kernel \1:/; s/ptxas info *: //" | paste -d' ' - -
echo "ptxas: $(grep -c C7510 "$BIN.ptxas.log") C7510 (wgmma serialized), $(grep -c C7519 "$BIN.ptxas.log") C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  echo "SASS: $(cuobjdump -sass "$BIN" | grep -c 'HGMMA') HGMMA, $(cuobjdump -sass "$BIN" | grep -c 'QGMMA') QGMMA," \
       "$(cuobjdump -sass "$BIN" | grep -c 'UTMALDG') UTMALDG instructions"
fi
timeout 300 "$BIN"
rc=$?
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null || true
exit $rc
