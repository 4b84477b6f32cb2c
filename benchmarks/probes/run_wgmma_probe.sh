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
source ./common.sh
probe_build wgmma_probe.cu
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
probe_clocks
exit $rc
