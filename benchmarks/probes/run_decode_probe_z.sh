#!/usr/bin/env bash
# Build and run variants Z and Z3 of the WGMMA decode probe (benchmarks/probes/decode_wgmma_probe_z.cu, which
# includes decode_wgmma_probe.cu for its helpers, variant Y and the float64 reference) on an H100 / H200:
#   MLA_COMMIT=<hash> bash benchmarks/probes/run_decode_probe_z.sh | tee $OUT/decode_probe_z.log
# Exit status: the program's (0 when Y, Z and Z3 pass every correctness case), 124 when it ran past the timeout
# (a hang: the barriers are the suspect, see the protocol comment at the top of the source). NVCC and BIN override
# the compiler and the binary's path.
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
BIN=${BIN:-/tmp/decode_probe_z}
echo "commit ${MLA_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}; $("$NVCC" --version | tail -1)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,temperature.gpu --format=csv,noheader \
  2>/dev/null || true
if ! "$NVCC" -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Xptxas -v -o "$BIN" decode_wgmma_probe_z.cu \
    >"$BIN.ptxas.log" 2>&1; then
  cat "$BIN.ptxas.log"
  echo "BUILD FAILED"
  exit 2
fi
# ptxas: registers / spills per kernel (Z's and Z3's 168 are the 384-thread share; setmaxnreg gives the consumers
# 224); wgmma serialization (C7510, C7512, C7520) and inserted warpgroup.arrive (C7519) in Z / Z3 alone
grep -A3 "Compiling entry" "$BIN.ptxas.log" | grep -E "entry|registers|spill" \
  | sed -E "s/.*Compiling entry function '([^']+)'.*/kernel \1:/; s/ptxas info *: //; s/^ +//" | paste -d' ' - - -
echo "ptxas (k_decode_zt<1>, <3>): $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -cE 'C7510|C7512|C7520') C7510/C7512/C7520 (wgmma serialized), $(grep 'k_decode_zt' "$BIN.ptxas.log" | grep -c C7519) C7519 (warpgroup.arrive inserted)"
if command -v cuobjdump >/dev/null; then
  cuobjdump -sass "$BIN" >"$BIN.sass" 2>/dev/null || true
  for fn in _Z11k_decode_ztILi1EEv12DecodeParams _Z11k_decode_ztILi3EEv12DecodeParams; do
    awk -v f="$fn" '/Function : /{p = index($0, f) > 0} p' "$BIN.sass" >"$BIN.fn.sass"
    echo "SASS of $fn: $(grep -c 'HGMMA' "$BIN.fn.sass") HGMMA, $(grep -c 'LDGSTS' "$BIN.fn.sass") LDGSTS," \
         "$(grep -c 'BAR.SYNC\|BAR.ARV\|BAR.RED' "$BIN.fn.sass") named/CTA barrier instructions," \
         "$(grep -c 'SYNCS' "$BIN.fn.sass") mbarrier ops, $(grep -c 'STL\|LDL' "$BIN.fn.sass") local-memory ops"
  done
fi
timeout 120 "$BIN"
rc=$?
[ $rc -eq 124 ] && echo "TIMEOUT after 120 s: the program hung (the last line above shows where)"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null || true
exit $rc
