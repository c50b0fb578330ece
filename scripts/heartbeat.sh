#!/usr/bin/env bash
# Run a long command and, while it runs, say every HEARTBEAT_S seconds (default 60) that it
# still works, with the time since it started: a cold `make controlplane` spends 10-25 minutes
# in one silent `go build`. The command's output and exit status are its own.
#
# Usage: scripts/heartbeat.sh LABEL COMMAND [ARG...]
set -uo pipefail

label="$1"
shift
start=$(date +%s)
(
    # the sleep holds no copy of the output: a pipe reading it closes when the command ends
    while sleep "${HEARTBEAT_S:-60}" </dev/null >/dev/null 2>&1; do
        printf '[%s] still working (t+%ds)\n' "$label" $(($(date +%s) - start)) >&2
    done
) &
ticker=$!
trap 'kill "$ticker" 2>/dev/null' EXIT
"$@"
