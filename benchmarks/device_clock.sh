# Sourced by the device scripts, from the repository root: the call's clock and each step's time limit, so that
# a script stops its steps before the device call's own limit cuts it off.
#   stamp NAME   prints "--- NAME done at +S s" (seconds since the script started)
#   left         seconds left of CALL_LIMIT (the call's budget; default DEFAULT_CALL_LIMIT, set by the script)
#   cap S        S, or what is left when less (at least 5): a step's `timeout`
t0=$(date +%s)
stamp() { echo "--- $1 done at +$(( $(date +%s) - t0 )) s"; }
left() { echo $(( ${CALL_LIMIT:-${DEFAULT_CALL_LIMIT:-195}} - ($(date +%s) - t0) )); }
cap() { local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo $(( l > 5 ? l : 5 )); }
