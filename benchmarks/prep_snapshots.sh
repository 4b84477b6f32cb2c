#!/usr/bin/env bash
# Snapshots of branches for one device call's A/B runs, made here before the call (the device keeps nothing and
# sees only the working tree: untracked, not-ignored folders travel with it, 64 MiB in all).
#
#   bash benchmarks/prep_snapshots.sh ab_base=main:csrc ab_ktb=wip/decode-keys-as-m-bf16 ...
#
# Each NAME=REV[:PATH] replaces benchmarks/NAME with `git archive REV [PATH]` (PATH: a folder of the tree, e.g. csrc
# for an A side; without it the whole tree, for a branch whose scripts run from the snapshot). Prints each
# snapshot's commit and size and the tree's total, and fails before the call rather than at the transfer when the
# total would pass 60 MiB. `bash benchmarks/prep_snapshots.sh --clean` removes every benchmarks/ab_* folder.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --clean ]; then
  rm -rf benchmarks/ab_*
  echo "removed benchmarks/ab_*"
  exit 0
fi
[ $# -gt 0 ] || { sed -n 2,10p "$0"; exit 2; }
for spec in "$@"; do
  name=${spec%%=*}; target=${spec#*=}
  rev=${target%%:*}; path=""
  [ "$target" != "$rev" ] && path=${target#*:}
  case "$name" in ab_*) ;; *) echo "$name: snapshot names start with ab_ (so --clean finds them)"; exit 2;; esac
  commit=$(git rev-parse --short "$rev^{commit}")
  rm -rf "benchmarks/$name" && mkdir -p "benchmarks/$name"
  # shellcheck disable=SC2086
  git archive "$commit" $path | tar -x -C "benchmarks/$name"
  echo "benchmarks/$name  $rev ($commit)${path:+ $path}  $(du -sh "benchmarks/$name" | cut -f1)"
done
total_kb=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | du -ck --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "working tree that travels: $((total_kb / 1024)) MiB"
[ "$total_kb" -le $((60 * 1024)) ] || { echo "over 60 MiB: remove a snapshot (or use REV:csrc)"; exit 1; }
