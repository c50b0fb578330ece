#!/usr/bin/env bash
# The soak: RUNS consecutive runs of the cluster and node tiers at one fixed commit, with BURNERS
# busy CPU loops beside them (two busy cores are CI's normal state), each run's summary line in
# a file. A run that fails does not stop the soak: the summary says which and its log keeps why.
#
# Usage (as root, after `make test` has built everything once):
#   scripts/soak.sh [COMMIT]           # default: HEAD
#   RUNS=20 BURNERS=1 OUT=/tmp/soak scripts/soak.sh HEAD
#   FIRST=15 RUNS=6 scripts/soak.sh 380706c   # runs 15..20 of a soak of that commit begun earlier
#
# The commit is checked out in a git worktree under $OUT (the checkout you edit can change
# meanwhile); its tests run with this checkout's .venv and the worktree's src/ first on the
# import path. Summary: $OUT/summary.txt ("run N rc=R SECONDS HH:MM <pytest's last line>");
# logs: $OUT/run-N.log, and each run's temporary directory (the control plane's and the
# extenders' full logs) $OUT/tmp-N. Only one soak (and no other node-tier run) at a time on a machine: the
# node tier takes the machine-wide real-node lock, and a second run waits for it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$(git -C "$ROOT" rev-parse --short "${1:-HEAD}")"
RUNS="${RUNS:-20}"
FIRST="${FIRST:-1}"
BURNERS="${BURNERS:-1}"
OUT="${OUT:-/tmp/gpushare-soak}"
TREE="$OUT/tree"

mkdir -p "$OUT"
if [[ -e "$TREE" ]]; then git -C "$ROOT" worktree remove --force "$TREE"; fi
git -C "$ROOT" worktree add --detach "$TREE" "$COMMIT" >/dev/null

burners=()
for _ in $(seq 1 "$BURNERS"); do
    python3 -c 'while True: pass' &
    burners+=($!)
done
cleanup() {
    if ((${#burners[@]})); then kill "${burners[@]}" 2>/dev/null || true; fi
}
trap cleanup EXIT

echo "commit $COMMIT, runs $FIRST..$((FIRST + RUNS - 1)), $BURNERS CPU burner(s), started $(date +%H:%M)" \
    >>"$OUT/summary.txt"
cd "$TREE"
for n in $(seq "$FIRST" $((FIRST + RUNS - 1))); do
    start=$(date +%s)
    rc=0
    # Its own --basetemp: pytest keeps only the last three of its default temporary directories,
    # so other pytest sessions on the machine would rotate a failed run's full logs away.
    rm -rf "$OUT/tmp-$n"
    PYTHONPATH="$TREE/src" timeout 3600 "$ROOT/.venv/bin/pytest" tests/cluster tests/node -q \
        -p no:cacheprovider --basetemp="$OUT/tmp-$n" >"$OUT/run-$n.log" 2>&1 || rc=$?
    echo "run $n rc=$rc $(($(date +%s) - start))s $(date +%H:%M) $(tail -1 "$OUT/run-$n.log")" \
        >>"$OUT/summary.txt"
done
