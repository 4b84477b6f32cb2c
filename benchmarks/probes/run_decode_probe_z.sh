#!/usr/bin/env bash
# Build and run variants Z, F and FS (an FP8 cache: consumers / producer convert) of the WGMMA decode probe
# (benchmarks/probes/decode_wgmma_probe_z.cu, which includes decode_wgmma_probe.cu for its helpers, variant Y and the
# float64 reference) on an H100 / H200; Z3 too with PROBE_ARGS=--with-z3:
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_decode_probe_z.sh | tee $OUT/decode_probe_z.log
# Exit status: the program's (0 when every variant run passes every correctness case), 124 when it ran past the timeout
# (a hang: the barriers are the suspect, see the protocol comment at the top of the source). NVCC and BIN override
# the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/decode_probe_z}
source ./common.sh
probe_build decode_wgmma_probe_z.cu
# ptxas: registers / spills per kernel (the k_decode_zt kernels' 168 are the 384-thread share; setmaxnreg gives the
# consumers 224); wgmma serialization (C7510, C7512, C7520) and inserted warpgroup.arrive (C7519) in them alone
probe_kernels
echo "ptxas (k_decode_zt: Z, Z3, F, FS at pages 64, 1, 48): $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -cE 'C7510|C7512|C7520') C7510/C7512/C7520 (wgmma serialized), $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -c C7519) C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  for fn in _Z11k_decode_ztILi1ELi0ELi64EEv12DecodeParams _Z11k_decode_ztILi1ELi1ELi64EEv12DecodeParams \
            _Z11k_decode_ztILi1ELi2ELi64EEv12DecodeParams; do
    awk -v f="$fn" '/Function : /{p = index($0, f) > 0} p' "$BIN.sass" >"$BIN.fn.sass"
    echo "SASS of $fn: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
         "$(grep -c 'BAR.SYNC\|BAR.ARV\|BAR.RED' "$BIN.fn.sass") named/CTA barrier instructions," \
         "$(grep -c 'SYNCS' "$BIN.fn.sass") mbarrier ops, $(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops," \
         "$(grep -c 'LDS.128' "$BIN.fn.sass") LDS.128, $(grep -c 'STS.128' "$BIN.fn.sass") STS.128," \
         "$(grep -cE '\bST\.E|\bLD\.E' "$BIN.fn.sass") generic LD/ST"
  done
fi
timeout 180 "$BIN" ${PROBE_ARGS:-}
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 180 s: the program hung (the last line above shows where)"
probe_clocks
exit $rc
