#!/usr/bin/env bash
# Build and run variants Z, Z3 and F (an FP8 cache) of the WGMMA decode probe (benchmarks/probes/decode_wgmma_probe_z.cu, which
# includes decode_wgmma_probe.cu for its helpers, variant Y and the float64 reference) on an H100 / H200:
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_decode_probe_z.sh | tee $OUT/decode_probe_z.log
# Exit status: the program's (0 when Y, Z, Z3 and F pass every correctness case), 124 when it ran past the timeout
# (a hang: the barriers are the suspect, see the protocol comment at the top of the source). NVCC and BIN override
# the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/decode_probe_z}
source ./common.sh
probe_build decode_wgmma_probe_z.cu
# ptxas: registers / spills per kernel (Z's and Z3's 168 are the 384-thread share; setmaxnreg gives the consumers
# 224); wgmma serialization (C7510, C7512, C7520) and inserted warpgroup.arrive (C7519) in Z / Z3 alone
probe_kernels
echo "ptxas (k_decode_zt<1>, <3>, <1, fp8>): $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -cE 'C7510|C7512|C7520') C7510/C7512/C7520 (wgmma serialized), $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -c C7519) C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  for fn in _Z11k_decode_ztILi1ELb0EEv12DecodeParams _Z11k_decode_ztILi3ELb0EEv12DecodeParams _Z11k_decode_ztILi1ELb1EEv12DecodeParams; do
    awk -v f="$fn" '/Function : /{p = index($0, f) > 0} p' "$BIN.sass" >"$BIN.fn.sass"
    echo "SASS of $fn: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
         "$(grep -c 'BAR.SYNC\|BAR.ARV\|BAR.RED' "$BIN.fn.sass") named/CTA barrier instructions," \
         "$(grep -c 'SYNCS' "$BIN.fn.sass") mbarrier ops, $(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops"
  done
fi
timeout 180 "$BIN"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 180 s: the program hung (the last line above shows where)"
probe_clocks
exit $rc
