#!/usr/bin/env bash
# Build and run the sparse FP8 decode WGMMA probe (benchmarks/probes/sparse_wgmma_probe.cu) on a Hopper GPU (H100 / H200):
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_sparse_probe.sh | tee $OUT/sparse_probe.log
# Exit status: the probe's (0 when the conversion self-test and every case of variants B, B2 and S pass; a
# variant's timings run only when its cases pass), 124 when it ran past the timeout (a hang: variant S's
# barriers are the suspect, see its protocol comment; it runs last, so B's, B2's and E's lines are printed
# before). NVCC and BIN override the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/sparse_probe}
source ./common.sh
probe_build sparse_wgmma_probe.cu
# ptxas: registers / spills / smem per kernel (k_sparse_s's 168 is the 384-thread share; setmaxnreg gives the
# consumers 224); wgmma serialization (C7510, C7512, C7520) and inserted warpgroup.arrive (C7519)
probe_kernels
echo "ptxas: $(grep -cE 'C7510|C7512|C7520' "$BIN.ptxas.log") C7510/C7512/C7520 (wgmma serialized), $(grep -c C7519 "$BIN.ptxas.log") C7519 (warpgroup.arrive inserted); k_sparse_s alone: $(grep k_sparse_s "$BIN.ptxas.log" | grep -cE 'C75(10|12|19|20)')"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  echo "SASS: $(grep -c 'HGMMA' "$BIN.sass") HGMMA (bf16), $(grep -c 'QGMMA' "$BIN.sass") QGMMA (e4m3)," \
       "$(grep -c 'LDGSTS' "$BIN.sass") LDGSTS, $(grep -c 'BAR.SYNC\|BAR.RED' "$BIN.sass") CTA barriers"
  fn=_Z10k_sparse_s12SparseParams
  awk -v f="$fn" '/Function : /{p = index($0, f) > 0} p' "$BIN.sass" >"$BIN.fn.sass"
  echo "SASS of $fn: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
       "$(grep -c 'LDS.128' "$BIN.fn.sass") LDS.128, $(grep -c 'STS.128' "$BIN.fn.sass") STS.128," \
       "$(grep -c 'BAR.SYNC\|BAR.ARV\|BAR.RED' "$BIN.fn.sass") named/CTA barrier instructions," \
       "$(grep -c 'SYNCS' "$BIN.fn.sass") mbarrier ops, $(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops," \
       "$(grep -cE '\bLD\.E|\bST\.E' "$BIN.fn.sass") generic LD/ST"
fi
timeout 300 "$BIN"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 300 s: the program hung (the last line above shows where)"
probe_clocks
exit $rc
