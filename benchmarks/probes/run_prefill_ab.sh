#!/usr/bin/env bash
# A/B of two versions of the prefill kernel (prefill_ab.cu): the tree's csrc/ ("new", AB_NEW_FLAGS) against AB_OLD, a
# folder holding another mla_prefill_wgmma.cu with its mla_prefill.h and hopper.cuh ("old", AB_OLD_FLAGS; e.g. the
# files of an earlier commit); both built in parallel, then run alternately ROUNDS times (SM clock logged).
#   AB_OLD=<folder> [ROUNDS=2] bash benchmarks/probes/run_prefill_ab.sh
set -uo pipefail
cd "$(dirname "$0")"
NVCC=${NVCC:-nvcc}
flags="-O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a"
$NVCC $flags -DPREFILL_SRC="\"$AB_OLD/mla_prefill_wgmma.cu\"" ${AB_OLD_FLAGS:-} -o /tmp/ab_old prefill_ab.cu &
$NVCC $flags -DPREFILL_SRC='"../../csrc/mla_prefill_wgmma.cu"' ${AB_NEW_FLAGS:-} -o /tmp/ab_new prefill_ab.cu || exit 2
wait $! || exit 2
for r in $(seq "${ROUNDS:-2}"); do
  for v in new old; do
    nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null | sed "s/^/clock before $v: /"
    /tmp/ab_$v "$v.$r" || exit 3
  done
done
