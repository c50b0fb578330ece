#!/usr/bin/env bash
# Build schedconfig (testenv/schedconfig) once per Kubernetes release it pins: a small program
# that decodes a kube-scheduler configuration strictly with that release's own configuration API
# (k8s.io/kube-scheduler config/v1beta2 and config/v1beta3). tests/test_deploy_manifests.py runs
# it on deploy/scheduler/kube-scheduler-config-v1beta2.yaml and -v1beta3.yaml.
#
# One binary per pinning module file testenv/schedconfig/k8s-<release>.mod (+ .sum, checked in),
# all from the same main.go (`go build -modfile=...`):
#   ${GPUSHARE_SCHEDCONFIG_CACHE:-$HOME/.cache/gpushare/schedconfig/<hash>}/schedconfig-k8s-<release>
# <hash> is a hash of this script, main.go and the module files: any change builds anew, into a
# directory of its own.
#
# Usage:
#   scripts/build-schedconfig.sh              build (or reuse) the binaries, print progress
#   scripts/build-schedconfig.sh --print-dir  print the binary directory and exit (no Go needed)
#
# Environment: GPUSHARE_SCHEDCONFIG_CACHE (binary directory), GOPROXY/GOMODCACHE/GOCACHE as usual
# for Go. Exit status is non-zero, with a message saying why, when Go or the module proxy is
# unavailable: the deploy tests need these binaries and are never skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/testenv/schedconfig"

say() { printf '[schedconfig] %s\n' "$*" >&2; }
die() {
    printf '[schedconfig] ERROR: %s\n' "$*" >&2
    printf '[schedconfig] The deploy tests (tests/test_deploy_manifests.py) need these binaries; they are not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/gobuild.sh
source "$ROOT/scripts/lib/gobuild.sh"

# The releases: k8s-1.23.mod -> 1.23, ...
RELEASES=()
for f in "$MOD"/k8s-*.mod; do
    [[ -f "$f" ]] || die "no pinning module file testenv/schedconfig/k8s-<release>.mod"
    f="${f##*/k8s-}"
    RELEASES+=("${f%.mod}")
done

fingerprint() {
    (cat "${BASH_SOURCE[0]}" "$ROOT/scripts/lib/gobuild.sh" && cd "$MOD" && cat main.go go.mod k8s-*.mod k8s-*.sum) \
        | sha256sum | cut -d' ' -f1
}
WANT="$(fingerprint)"
BIN_DIR="${GPUSHARE_SCHEDCONFIG_CACHE:-${HOME}/.cache/gpushare/schedconfig/$(printf '%s' "$WANT" | cut -c1-12)}"
STAMP="$BIN_DIR/.stamp"

if [[ "${1:-}" == "--print-dir" ]]; then
    printf '%s\n' "$BIN_DIR"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--print-dir])"
fi

cached() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] || return 1
    local r
    for r in "${RELEASES[@]}"; do [[ -x "$BIN_DIR/schedconfig-k8s-$r" ]] || return 1; done
}

say "releases: ${RELEASES[*]} (k8s.io/kube-scheduler $(for r in "${RELEASES[@]}"; do
    pinned "$MOD/k8s-$r.mod" k8s.io/kube-scheduler; echo; done | paste -sd" "))"
say "binary directory: $BIN_DIR"
if cached; then
    say "present and up to date; nothing to build"
    exit 0
fi

# ---- preconditions: a Go toolchain that can build the pinned modules ----------------------
require_go "$MOD/go.mod" "testenv/schedconfig"
lock_build_dir "$BIN_DIR"

for r in "${RELEASES[@]}"; do
    step "downloading modules for Kubernetes $r (testenv/schedconfig/k8s-$r.mod)"
    GOFLAGS="${GOFLAGS:-} -modfile=k8s-$r.mod" go_download "$MOD" "testenv/schedconfig/k8s-$r.mod"
    step "building schedconfig-k8s-$r"
    (cd "$MOD" && CGO_ENABLED=0 nice -n 19 go build -modfile="k8s-$r.mod" -trimpath -ldflags "-s -w" \
        -o "$PARTIAL/schedconfig-k8s-$r" .) \
        || die "go build of schedconfig for Kubernetes $r failed (output above)"
done

for r in "${RELEASES[@]}"; do
    mv -f "$PARTIAL/schedconfig-k8s-$r" "$BIN_DIR/schedconfig-k8s-$r"
done
printf '%s\n' "$WANT" >"$STAMP"
step "done: $(for r in "${RELEASES[@]}"; do printf 'schedconfig-k8s-%s (%s) ' "$r" \
    "$("$BIN_DIR/schedconfig-k8s-$r" --release)"; done)in $BIN_DIR"
