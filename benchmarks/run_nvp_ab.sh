#!/usr/bin/env bash
# One device call (timeout_s 290; ~200-260 s, every step cut to CALL_LIMIT, default 280): round (o)'s cheaper P step
# of the cuda prefill's nvfp4 recipe (branch wip/nvp; kP 3: 474 -> 428 SASS instructions a 64-key tile), A = A_DIR's
# csrc/ and launcher (main), B = this tree, run from the root of B's snapshot:
#   1-4. benchmarks/run_prefill_nvfp4_ab.sh (the existing harness: A's and B's builds in parallel, then
#        bench_prefill_nvfp4_ab.py --alternate with ROUNDS 6: bf16 control, nvfp4 (p_fmt 3), nvfp4-ieee (p_fmt 4) at
#        4x4096, 1x16384, ragged16, graph replays, L2 flushed, rounds alternately in the orders A B B A and B A A B
#        with B / A of each order reported; cuDNN SDPA beside the dense nvfp4 rows; B's output and LSE equal to A's bit
#        for bit or exit 1; then B's GPU tests -k "nvfp4 or q_codes" (20) and memcheck of the nvfp4 cases);
#   5.   with what is left (>= 150 s after step 4): mutants 33, 34, 48, 49, 50 (P's rounding and its clamp, the code pair,
#        an empty block's s), each must be killed; else the mutants' own call below;
#   6.   SUMMARY (the last console lines): per case and recipe B / A (all rounds, ABBA rounds, BAAB rounds), bit-equal,
#        x cuDNN, the return codes and the merge rule's verdict.
# Logs in $OUT: build_a.log, build_b.log, ab.log, bench_prefill_nvfp4_ab.json, gpu_tests.log, memcheck.log(,
# mutants.log).
# Preparation, in main's checkout:
#   bash benchmarks/prep_snapshots.sh "ab_base=main:csrc backends/cuda/mla_core_cuda" ab_nvp=wip/nvp
# Device command (timeout_s 290):
#   cd benchmarks/ab_nvp && MLA_COMMIT=<wip/nvp head> A_DIR=../ab_base OUT=$OUT bash benchmarks/run_nvp_ab.sh
# Mutants alone, if step 5 had no time (timeout_s 480):
#   cd benchmarks/ab_nvp && RUN_MUTANTS=1 BENCH=0 CALL_LIMIT=470 MUTANT_INDICES=33,34,48,49,50 \
#     TESTS_K="nvfp4" bash benchmarks/run_prefill_nvfp4.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
export OUT=${OUT:-$(mktemp -d)}
LOGS=$OUT
export CALL_LIMIT=${CALL_LIMIT:-280}
DEFAULT_CALL_LIMIT=$CALL_LIMIT
. benchmarks/device_clock.sh   # t0, stamp, left, cap
AB_ARGS=${AB_ARGS---alternate} ROUNDS=${ROUNDS:-6} AB_S=${AB_S:-150} TESTS_K=${TESTS_K:-"nvfp4 or q_codes"} \
  bash benchmarks/run_prefill_nvfp4_ab.sh
rall=$?
stamp "run_prefill_nvfp4_ab.sh (rc $rall)"
rmu=skipped
if [ "${RUN_MUTANTS:-1}" = 1 ] && [ "$(left)" -ge 150 ]; then
  . benchmarks/checkout_first.sh
  export MUTANT_WORK=/tmp/mla_core_nvp_mutants MUTANT_INDICES=${MUTANT_INDICES:-33,34,48,49,50} MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-45}
  timeout "$(cap 600)" python3 tests/mutation/mutants_cuda_prefill.py 2>&1 | tee "$LOGS/mutants.log" | tail -8
  rmu=${PIPESTATUS[0]}
  stamp "mutants (rc $rmu)"
fi
echo "=== SUMMARY (commit ${MLA_COMMIT:-unknown}; wall $(( $(date +%s) - t0 )) s) ==="
python3 - "$LOGS/bench_prefill_nvfp4_ab.json" "$rall" "$rmu" <<'PY'
import json, sys
path, rall, rmu = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    rows = json.load(open(path))["rows"]
except Exception as e:  # noqa: BLE001
    print(f"no A/B json ({type(e).__name__}): verdict NOT MERGED (no measurement)")
    sys.exit(0)
get = {(r["case"], r["recipe"]): r for r in rows}
for r in rows:
    if r["recipe"].startswith("prepass"):
        continue
    x = f", B x cuDNN {r['x_cudnn_B']:.3f} (A {r['x_cudnn_A']:.3f})" if "x_cudnn_B" in r else ""
    print(f"{r['case']:>8} {r['recipe']:<10} A {r['us_A']:8.0f} us  B {r['us_B']:8.0f} us  B/A {r['b_over_a']:.3f}"
          f" (ABBA {r.get('b_over_a_abba', float('nan')):.3f}, BAAB {r.get('b_over_a_baab', float('nan')):.3f})"
          f"  bit-equal {r['same']}{x}")
def orders(case, recipe):
    r = get.get((case, recipe))
    return [] if r is None else [r.get("b_over_a_abba", r["b_over_a"]), r.get("b_over_a_baab", r["b_over_a"])]
bits = all(r["same"] == "yes" for r in rows)
dense = orders("4x4096", "nvfp4")
others = orders("1x16384", "nvfp4") + orders("ragged16", "nvfp4")
control = sum((orders(c, "bf16") for c in ("4x4096", "1x16384", "ragged16")), [])
checks = {"every row bit-equal (output, LSE)": bits and rall in ("0",),
          "GPU tests and memcheck pass (run_prefill_nvfp4_ab.sh rc 0)": rall == "0",
          "4x4096 nvfp4 B/A <= 0.98 in both orders": bool(dense) and max(dense) <= 0.98,
          "1x16384 and ragged16 nvfp4 B/A <= 1.00 in both orders": bool(others) and max(others) <= 1.00,
          "bf16 control within 1.00 +- 0.02 in both orders": bool(control) and max(abs(c - 1) for c in control) <= 0.02}
for k, v in checks.items():
    print(f"  {'ok  ' if v else 'FAIL'} {k}")
print(f"  mutants 33, 34, 48, 49, 50: rc {rmu} (0 = all killed; skipped = their own call, see the script's header)")
print(f"  the brief's stricter line, 4x4096 B/A <= 0.97 in both orders: {'met' if dense and max(dense) <= 0.97 else 'not met'}")
if all(checks.values()):
    print("VERDICT: MERGE" + ("" if rmu == "0" else " after the mutants' call kills 33, 34, 48, 49, 50"))
elif not checks["bf16 control within 1.00 +- 0.02 in both orders"] and all(
        v for k, v in checks.items() if not k.startswith("bf16")):
    print("VERDICT: RE-RUN (the control drifted more than the band)")
else:
    print("VERDICT: NOT MERGED")
PY
