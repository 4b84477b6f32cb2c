#!/usr/bin/env bash
# One device call (~200-280 s; every step's limit is cut to CALL_LIMIT, default 290 s): the A/B of the cuda decode's
# TMA producer (round r, issue 9: a producer warp whose 16 rows are present loads them as 9 TMA boxes instead of 36
# cp.async a lane), A = A_DIR's csrc/ (main), B = this tree, both with their default config, run from B's root:
#   1. build A's and B's extensions in parallel (device_clock.sh's build_ab);
#   2. bench_decode_ab.py (A B B A A B graph replays, L2 flushed, medians), bf16 cache, page 64, auto splits, at
#      H 16 / 64 / 128 x B 1 / 32 / 128 x L 8192 / 32768 (18 rows), then config ring4 on both sides at H 64 / 128
#      x B 32 / 128 x L 8192; out and LSE bit-equal to A's at every row (exit 1 if not);
#   3. B's GPU tests of the paths the producer serves (tests/test_cuda_decode.py: the TMA boxes over pages 32 / 256
#      and padded pages, odd pages, ring4, every config, strides, absent keys, bf16 at pages 1 / 16 / 64, graphs);
#   4. if >= 25 s are left, compute-sanitizer memcheck of the WGMMA decode cases (mla_core_cuda.sanitize decode).
# Preparation, in main's checkout: bash benchmarks/prep_snapshots.sh "ab_base=main:csrc backends/cuda/mla_core_cuda"
# Device command (timeout_s 320): MLA_COMMIT=<head> A_DIR=benchmarks/ab_base OUT=$OUT bash benchmarks/run_tma_ab.sh
# Mutants cuda#73-76 (MUTANT_INDICES 72-75), a call of their own (timeout_s 480):
#   RUN_MUTANTS=1 CALL_LIMIT=470 A_DIR=benchmarks/ab_base OUT=$OUT bash benchmarks/run_tma_ab.sh
# RECIPE=fp8 (round s: K = V FP8 on the TMA boxes): the cases fp8 (K, V, P FP8) and fp8_p_nvfp4 (P NVFP4) instead
# of bf16, at H 16 / 64 / 128 x B 1 / 32 / 128 x L 8192 and H 128 B 32 L 32768; no ring4 block (unquantized only);
# the fake-quant GPU tests (the FP8 recipes' TMA and fallback test, DeepSeek FP8 edges, calibrated amaxes, the
# agreement with mma.sync, graphs); with RUN_MUTANTS=1 mutants cuda#77-80 (MUTANT_INDICES 76-79, selection kfp8tma).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=290
. benchmarks/device_clock.sh   # t0, stamp, left, cap, build_ab
MUTANTS_DEFAULT=72,73,74,75
SELECTION=tma CASES=bf16 GRID="--heads 16,64,128 --batch 1,32,128 --lengths 8192,32768"
TESTS_K="tma_boxes or odd_page or ring4 or every_config or index_dtypes or unchecked or (deepseek and bf16) or graph"
if [ "${RECIPE:-bf16}" = fp8 ]; then
  MUTANTS_DEFAULT=76,77,78,79 SELECTION=kfp8tma CASES=fp8,fp8_p_nvfp4 GRID="--heads 16,64,128 --batch 1,32,128 --lengths 8192"
  TESTS_K="fp8_recipe_tma or (deepseek and fp8) or calibrated or recipes_agree or exact_division or (graph and fp8)"
fi
ab_start $SELECTION  # (benchmarks/device_clock.sh; RUN_MUTANTS=1 ends here)
[ -f "$A_DIR/csrc/mla_decode_wgmma.cu" ] || { echo "A_DIR holds no csrc/ (see the preparation above)"; exit 2; }
A_DIR=$(cd "$A_DIR" && pwd)
build_ab "$A_DIR/csrc"   # (benchmarks/device_clock.sh)

# shellcheck disable=SC2086  # GRID: the grid's arguments
OUT=$LOGS timeout "$(cap "${AB_S:-110}")" python3 benchmarks/bench_decode_ab.py --src-a "$A_DIR/csrc" \
  --src-b "$PWD/csrc" --cases $CASES $GRID --name tma 2>&1 | tee "$LOGS/ab.log" | tail -22
rab=${PIPESTATUS[0]}
stamp "A/B (rc $rab)"
rar=0
if [ "${RECIPE:-bf16}" = fp8 ]; then  # the one long row (the ring4 block's place)
  OUT=$LOGS timeout "$(cap "${AB_RING_S:-45}")" python3 benchmarks/bench_decode_ab.py --src-a "$A_DIR/csrc" \
    --src-b "$PWD/csrc" --cases $CASES --heads 128 --batch 32 --lengths 32768 --name tma_long 2>&1 \
    | tee "$LOGS/ab_long.log" | tail -4
  rar=${PIPESTATUS[0]}
  stamp "A/B L 32768 (rc $rar)"
else
  OUT=$LOGS timeout "$(cap "${AB_RING_S:-45}")" python3 benchmarks/bench_decode_ab.py --src-a "$A_DIR/csrc" \
    --src-b "$PWD/csrc" --cases bf16 --config-a 'bf16={"kernel": "ring4"}' --config-b 'bf16={"kernel": "ring4"}' \
    --heads 64,128 --batch 32,128 --lengths 8192 --name tma_ring4 2>&1 | tee "$LOGS/ab_ring4.log" | tail -8
  rar=${PIPESTATUS[0]}
  stamp "A/B ring4 (rc $rar)"
fi

rt=skipped
if [ "$(left)" -ge 25 ]; then
  timeout "$(cap "${TESTS_S:-120}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 -n 8 \
    tests/test_cuda_decode.py -k "$TESTS_K" 2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
  rt=${PIPESTATUS[0]}
  stamp "tests (rc $rt)"
fi

rm_=skipped
if [ "$(left)" -ge 25 ]; then
  timeout "$(cap 60)" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize decode 2>&1 | tee "$LOGS/memcheck.log" | tail -4
  rm_=${PIPESTATUS[0]}
  stamp "memcheck (rc $rm_)"
fi
echo "=== SUMMARY (commit ${MLA_COMMIT:-unknown}) ==="
python3 - "$LOGS" <<'PY'
import json, os, sys
for name in ("tma", "tma_ring4", "tma_long"):
    path = os.path.join(sys.argv[1], f"bench_decode_ab_{name}.json")
    for r in json.load(open(path))["rows"] if os.path.exists(path) else []:
        print(f"{name:9s} {r['case']:11s} H{r['heads']:<3d} B{r['batch']:<3d} L{r['length']:<5d} splits {r['splits_b']}: A {r['A']:8.1f} us, "
              f"B {r['B']:8.1f} us, B/A {r['B_over_A']:.3f}, bit-equal {r['bitequal']}")
PY
echo "A/B rc $rab, ring4 A/B rc $rar, tests rc $rt, memcheck rc $rm_"
[ "$rab" = 0 ] && [ "$rar" = 0 ] && [ "$rt" = 0 ] && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; }
