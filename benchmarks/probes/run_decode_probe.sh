#!/usr/bin/env bash
# Build and run the WGMMA decode probe (benchmarks/probes/decode_wgmma_probe.cu) on a Hopper GPU (H100 / H200):
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_decode_probe.sh | tee $OUT/decode_probe.log
# Exit status: the probe's (0 when every correctness case passes; the timings run only then). NVCC and BIN
# override the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/decode_probe}
source ./common.sh
probe_build decode_wgmma_probe.cu
# ptxas: registers / spills / smem per kernel; wgmma serialization (C7510, C7520) and inserted warpgroup.arrive (C7519)
probe_kernels
echo "ptxas: $(grep -cE 'C7510|C7520' "$BIN.ptxas.log") C7510/C7520 (wgmma serialized), $(grep -c C7519 "$BIN.ptxas.log") C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  echo "SASS: $(cuobjdump -sass "$BIN" | grep -c 'HGMMA') HGMMA, $(cuobjdump -sass "$BIN" | grep -c 'LDGSTS') LDGSTS," \
       "$(cuobjdump -sass "$BIN" | grep -c 'BAR.SYNC\|BAR.RED') CTA barriers"
fi
timeout 100 "$BIN"
rc=$?
probe_clocks
exit $rc
