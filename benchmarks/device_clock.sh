# Sourced by the device scripts, from the repository root: the call's clock, each step's time limit (so that
# a script stops its steps before the device call's own limit cuts it off) and the A/B scripts' parallel build.
#   stamp NAME   prints "--- NAME done at +S s" (seconds since the script started)
#   left         seconds left of CALL_LIMIT (the call's budget; default DEFAULT_CALL_LIMIT, set by the script)
#   cap S        S, or what is left when less (at least 5): a step's `timeout`
t0=$(date +%s)
stamp() { echo "--- $1 done at +$(( $(date +%s) - t0 )) s"; }
left() { echo $(( ${CALL_LIMIT:-${DEFAULT_CALL_LIMIT:-195}} - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
#   build_ab A_CSRC   builds A_CSRC's extension and this tree's csrc/ in parallel (logs $LOGS/build_a.log,
#                     build_b.log; the build cache keyed by the sources' contents); exits 3 if either fails
build_ab() {
  _build_one() {
    (cd benchmarks && timeout "$(cap "${BUILD_S:-75}")" python3 -c "import sys; from common import load_cuda_extension; \
print('built', load_cuda_extension(sys.argv[1]).__name__)" "$1") >"$2" 2>&1
  }
  _build_one "$1" "$LOGS/build_a.log" &
  local pa=$! ra rb
  _build_one "$PWD/csrc" "$LOGS/build_b.log"
  rb=$?
  wait $pa
  ra=$?
  tail -n 1 "$LOGS/build_a.log" "$LOGS/build_b.log"
  stamp "builds (A rc $ra, B rc $rb)"
  [ $ra = 0 ] && [ $rb = 0 ] || { tail -n 30 "$LOGS/build_a.log" "$LOGS/build_b.log"; exit 3; }
}
#   ab_start NAME     the A/B scripts' opening: prints the commit, A_DIR and the card's clocks, puts this tree's
#                     packages first; with RUN_MUTANTS=1 judges mutants_cuda.py's MUTANT_INDICES (default
#                     $MUTANTS_DEFAULT) with MUTANT_SELECTION=NAME (log $LOGS/mutants.log), prints the summary and
#                     exits with its status (0: every one killed)
ab_start() {
  echo "commit ${MLA_COMMIT:-unknown}, A ${A_DIR:?A_DIR}"
  nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader
  . benchmarks/checkout_first.sh  # this tree's packages first (a warm machine may hold another install)
  [ "${RUN_MUTANTS:-0}" = 1 ] || return 0
  MUTANT_SELECTION=$1 MUTANT_INDICES=${MUTANT_INDICES:-$MUTANTS_DEFAULT} MUTANT_TIMEOUT=${MUTANT_TIMEOUT:-90} \
    timeout "$(cap 600)" python3 tests/mutation/mutants_cuda.py 2>&1 | tee "$LOGS/mutants.log" | tail -8
  local rmu=${PIPESTATUS[0]}
  stamp "mutants (rc $rmu)"
  echo "=== SUMMARY (commit ${MLA_COMMIT:-unknown}) ==="
  grep -E "^mutant |killed$" "$LOGS/mutants.log" | cut -c1-200
  echo "mutants rc $rmu (0 = every one killed)"
  exit "$rmu"
}
