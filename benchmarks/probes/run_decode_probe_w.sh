#!/usr/bin/env bash
# Build and run variant W of the WGMMA decode probe (benchmarks/probes/decode_wgmma_probe_w.cu, which includes
# decode_wgmma_probe.cu for its helpers, variant Y and the float64 reference) on an H100 / H200:
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_decode_probe_w.sh | tee $OUT/decode_probe_w.log
# Exit status: the program's (0 when Y and W pass every correctness case), 124 when it ran past the timeout (a
# hang: the barriers are the suspect, see the protocol comment at the top of the source). NVCC and BIN override
# the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/decode_probe_w}
source ./common.sh
probe_build decode_wgmma_probe_w.cu
# ptxas: registers / spills per kernel (W's 168 are the 384-thread share; setmaxnreg gives the consumers 224);
# wgmma serialization (C7510, C7512, C7520) and inserted warpgroup.arrive (C7519) in W alone
probe_kernels
echo "ptxas (k_decode_w): $(grep 'k_decode_w' "$BIN.ptxas.log" | grep -cE 'C7510|C7512|C7520') C7510/C7512/C7520 (wgmma serialized), $(grep 'k_decode_w' "$BIN.ptxas.log" | grep -c C7519) C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  awk '/Function : /{p = index($0, "_Z10k_decode_w12DecodeParams") > 0} p' "$BIN.sass" >"$BIN.fn.sass"
  echo "SASS of k_decode_w: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
       "$(grep -c 'BAR.SYNC\|BAR.ARV\|BAR.RED' "$BIN.fn.sass") named/CTA barrier instructions," \
       "$(grep -c 'SYNCS' "$BIN.fn.sass") mbarrier ops, $(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops"
fi
timeout 120 "$BIN"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 120 s: the program hung (the last line above shows where)"
probe_clocks
exit $rc
