#!/usr/bin/env bash
# Build and run the WGMMA prefill probe (benchmarks/probes/prefill_wgmma_probe.cu) on an H100 / H200:
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_prefill_probe.sh | tee $OUT/prefill_probe.log
# First the CPU protocol check (prefill_wgmma_emulation.py), then the build with ptxas's report, then the program:
# correctness of the variants (bf16 P, FP8 P, bf16 without ping-pong; the TMA producer, with tree row maxima, and
# that with FP8 P) against the float64 contract, then causal timing at 4x4096 and 1x16384 (128 heads). Exit status: the program's (0 when every correctness case passes), 124 when it ran past
# the timeout (a hang: the barriers are the suspect, see the protocol comment at the top of the source).
# NVCC and BIN override the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/prefill_probe}
python3 prefill_wgmma_emulation.py | tail -1
source ./common.sh
probe_build prefill_wgmma_probe.cu
# ptxas: registers / spills per kernel (168 is the 384-thread share; setmaxnreg gives the consumers 208, the producer 80);
# wgmma serialization (C7510, C7512, C7514, C7520) and inserted warpgroup.arrive (C7519)
probe_kernels
echo "ptxas: $(grep -cE 'C7510|C7512|C7514|C7520' "$BIN.ptxas.log") wgmma serialization warnings, $(grep -c C7519 "$BIN.ptxas.log") C7519"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  for fn in $(grep -o "_Z9k_prefill[A-Za-z0-9_]*" "$BIN.ptxas.log" | sort -u); do
    awk -v f="$fn" '/Function : /{p = index($0, f) > 0} p' "$BIN.sass" >"$BIN.fn.sass"
    echo "SASS of $fn: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
         "$(grep -c 'WARPGROUP.DEPBAR' "$BIN.fn.sass") wgmma waits, $(grep -c 'MUFU.EX2' "$BIN.fn.sass") MUFU.EX2," \
         "$(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops"
  done
fi
timeout 300 "$BIN"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 300 s: the program hung (the last line above shows where)"
probe_clocks
exit $rc
