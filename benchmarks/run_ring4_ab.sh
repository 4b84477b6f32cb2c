#!/usr/bin/env bash
# One device call (~170-250 s; every step's limit is cut to CALL_LIMIT, default 275 s): the A/B of the cuda decode's
# four-slot ring (config {"kernel": "ring4"}, branch wip/ring4, round p; issue 9), A = A_DIR's csrc/ (main) with its
# default config, B = this tree with ring4, run from the root of B's tree:
#   1. build A's and B's extensions in parallel (device_clock.sh's build_ab; A lacks the two ring4 units, which
#      build.py's RING4_FILES lets it build without);
#   2. bench_decode_ab.py (run_decode_ab.sh's harness: one process, A B B A A B graph replays, L2 flushed, medians),
#      bf16 cache, page 64, auto splits, at H 64 / 128 x B 1 / 32 / 128 x L 8192 / 32768 (12 rows): A's default
#      against B's ring4; out and LSE bit-equal to A's at every row (exit 1 if not);
#   3. B's GPU tests: tests/test_cuda_decode.py -k "ring4 or every_config" (the ring against the reference, bit-equal
#      to the default, boundary lengths, splits, unaligned rows, a CUDA graph; every listed config) and the fused
#      layer's decode with ring4 (tests/test_layer_cuda_prep.py -k gpu_cuda_prep_every_kernel: layer_decode kernel 3);
#   4. if >= 25 s are left, compute-sanitizer memcheck of the ring's cases (mla_core_cuda.sanitize ring4);
#   5. if >= 45 s are left, a control: A's default against B's default at H64 / H128 x B 32 / 128 x L 8192 (the
#      noise of the B/A column; B's default has SASS identical to A's).
# The console ends with a SUMMARY: per-row B/A, the checks, and the merge rule's verdict (benchmarks/NOTES.md,
# "Decode: the four-slot ring ported to the split kernel, round (p)").
# Logs and JSON in $OUT: build_a.log, build_b.log, ab.log + bench_decode_ab_ring4.json, gpu_tests.log,
# ab_control.log + bench_decode_ab_control.json, memcheck.log.
# Preparation, in main's checkout (snapshots are untracked folders, so they travel):
#   bash benchmarks/prep_snapshots.sh "ab_base=main:csrc backends/cuda/mla_core_cuda" ab_ring4=wip/ring4
# Device command (timeout_s 300):
#   cd benchmarks/ab_ring4 && MLA_COMMIT=<wip/ring4 head> A_DIR=../ab_base OUT=$OUT bash benchmarks/run_ring4_ab.sh
# Mutants cuda#67-70 (MUTANT_INDICES 66-69), a call of their own (timeout_s 480; 66-68 deadlock or give wrong
# numbers, 69 launches the default kernel; cuda#71-72 are CPU mutants, killed on the CPU):
#   cd benchmarks/ab_ring4 && RUN_MUTANTS=1 CALL_LIMIT=470 A_DIR=../ab_base OUT=$OUT bash benchmarks/run_ring4_ab.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
LOGS=${OUT:-$(mktemp -d)}
DEFAULT_CALL_LIMIT=275
. benchmarks/device_clock.sh   # t0, stamp, left, cap, build_ab
MUTANTS_DEFAULT=66,67,68,69
ab_start ring4  # (benchmarks/device_clock.sh; RUN_MUTANTS=1 ends here)
[ -f "$A_DIR/csrc/mla_decode_wgmma.cu" ] || { echo "A_DIR holds no csrc/ (see the preparation above)"; exit 2; }
A_DIR=$(cd "$A_DIR" && pwd)
build_ab "$A_DIR/csrc"   # (benchmarks/device_clock.sh)

OUT=$LOGS timeout "$(cap "${AB_S:-100}")" python3 benchmarks/bench_decode_ab.py --src-a "$A_DIR/csrc" \
  --src-b "$PWD/csrc" --cases bf16 --config-b 'bf16={"kernel": "ring4"}' --heads 64,128 --batch 1,32,128 \
  --lengths 8192,32768 --name ring4 2>&1 | tee "$LOGS/ab.log" | tail -16
rab=${PIPESTATUS[0]}
stamp "A/B (rc $rab)"

rt=skipped
if [ "$(left)" -ge 25 ]; then
  timeout "$(cap "${TESTS_S:-110}")" python3 -m pytest -m gpu -q -p no:cacheprovider -rfE --durations=3 \
    tests/test_cuda_decode.py tests/test_layer_cuda_prep.py \
    -k "ring4 or every_config or gpu_cuda_prep_every_kernel" 2>&1 | tee "$LOGS/gpu_tests.log" | tail -8
  rt=${PIPESTATUS[0]}
  stamp "tests (rc $rt)"
fi

rm_=skipped
if [ "$(left)" -ge 25 ]; then
  timeout "$(cap 40)" compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m mla_core_cuda.sanitize ring4 2>&1 | tee "$LOGS/memcheck.log" | tail -4
  rm_=${PIPESTATUS[0]}
  stamp "memcheck (rc $rm_)"
fi

rc_=skipped
if [ "$(left)" -ge 45 ]; then
  OUT=$LOGS timeout "$(cap 45)" python3 benchmarks/bench_decode_ab.py --src-a "$A_DIR/csrc" --src-b "$PWD/csrc" \
    --cases bf16 --heads 64,128 --batch 32,128 --lengths 8192 --name control 2>&1 | tee "$LOGS/ab_control.log" \
    | tail -3
  rc_=${PIPESTATUS[0]}
  stamp "control (rc $rc_)"
fi

echo "=== SUMMARY (commit ${MLA_COMMIT:-unknown}) ==="
python3 - "$LOGS" "$rab" "$rt" "$rc_" "$rm_" <<'EOF'
import json, os, sys
logs, rab, rt, rc_, rm_ = sys.argv[1:]
def rows(name):
    path = os.path.join(logs, f"bench_decode_ab_{name}.json")
    return json.load(open(path))["rows"] if os.path.exists(path) else []
ab, control = rows("ring4"), rows("control")
# the NOTES section's prediction per (H, B) (round m's numbers +- noise: the ring4 kernel's SASS is round m's)
predicted = {(64, 1): "0.99-1.01", (64, 32): "0.96-0.99", (64, 128): "0.95-0.98", (128, 1): "0.99-1.01",
             (128, 32): "0.98-1.00", (128, 128): "0.97-1.00"}
for r in ab:
    pred = predicted.get((r["heads"], r["batch"]), "?")
    print(f"H{r['heads']} B{r['batch']} L{r['length']} splits {r['splits_b']}: A {r['A']:.1f} us, ring4 "
          f"{r['B']:.1f} us, B/A {r['B_over_A']:.3f} (predicted {pred}), bit-equal {r['bitequal']}")
for r in control:
    print(f"control (B's default) H{r['heads']} B{r['batch']} L{r['length']}: B/A {r['B_over_A']:.3f}, "
          f"bit-equal {r['bitequal']}")
h64 = [r["B_over_A"] for r in ab if r["heads"] == 64 and r["batch"] >= 32]
complete = len(ab) == 12
bit_equal = complete and all(r["bitequal"] for r in ab) and all(r["bitequal"] for r in control)
fast = len(h64) == 4 and sum(x <= 0.98 for x in h64) >= 3
none_slow = complete and max(r["B_over_A"] for r in ab) <= 1.01
tests_ok = rt == "0" and rm_ in ("0", "skipped")
print(f"checks: A/B rc {rab} ({len(ab)} of 12 rows; 0 = all bit-equal), GPU tests rc {rt}, control rc {rc_}, "
      f"memcheck rc {rm_}")
print(f"merge rule (<= 0.98 at >= 3 of the 4 H64 B >= 32 rows: {sum(x <= 0.98 for x in h64)} of {len(h64)}; "
      f"none above 1.01: {none_slow}; bit-equal: {bit_equal}; tests pass: {tests_ok})")
verdict = "MERGE (ring4 listed after the default at >= 64 heads)" if fast and none_slow and bit_equal and tests_ok \
    else "DO NOT MERGE (record the numbers in the NOTES section; delete the pending patch)"
print(f"verdict: {verdict}")
EOF
[ "$rab" = 0 ] && [ "$rt" = 0 ] && { [ "$rm_" = 0 ] || [ "$rm_" = skipped ]; }
