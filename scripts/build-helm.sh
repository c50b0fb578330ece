#!/usr/bin/env bash
# Build helm from the Go module proxy, at the version pinned by testenv/helm (go.mod + go.sum,
# checked in). It renders the chart in deploy/helm/gpushare: scripts/render-manifests.sh and the
# deploy tests (tests/test_deploy_manifests.py, tests/cluster/test_deploy_chart.py) use it.
#
# The binary goes to a cache directory outside the repository and is reused when present:
#   ${GPUSHARE_HELM_CACHE:-$HOME/.cache/gpushare/helm/<version>}/helm
# A stamp file records the version and a hash of this script and the pinning module; any change
# rebuilds.
#
# Usage:
#   scripts/build-helm.sh               build (or reuse) helm, print progress
#   scripts/build-helm.sh --print-path  print the path of the helm binary and exit (no Go needed)
#
# Environment: GPUSHARE_HELM_CACHE (binary directory), GOPROXY/GOMODCACHE/GOCACHE as usual for
# Go. Exit status is non-zero, with a message saying why, when Go or the module proxy is
# unavailable: the deploy tests need helm and are never skipped.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/testenv/helm"

say() { printf '[helm] %s\n' "$*" >&2; }
die() {
    printf '[helm] ERROR: %s\n' "$*" >&2
    printf '[helm] The deploy tests (tests/test_deploy_manifests.py) need this binary; it is not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/gobuild.sh
source "$ROOT/scripts/lib/gobuild.sh"

HELM_VERSION="$(pinned "$MOD/go.mod" helm.sh/helm/v4)"
BIN_DIR="${GPUSHARE_HELM_CACHE:-${HOME}/.cache/gpushare/helm/${HELM_VERSION}}"

if [[ "${1:-}" == "--print-path" ]]; then
    printf '%s\n' "$BIN_DIR/helm"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--print-path])"
fi

fingerprint() {
    printf '%s\n' "$HELM_VERSION"
    (cat "${BASH_SOURCE[0]}" "$ROOT/scripts/lib/gobuild.sh" && cd "$MOD" && cat go.mod go.sum tools.go) | sha256sum | cut -d' ' -f1
}
WANT="$(fingerprint)"
STAMP="$BIN_DIR/.stamp"
cached() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" && -x "$BIN_DIR/helm" ]]; }

say "version: helm $HELM_VERSION"
say "binary: $BIN_DIR/helm"
if cached; then
    say "present and up to date; nothing to build"
    exit 0
fi

# ---- preconditions: a Go toolchain that can build the pinned module ----------------------
require_go "$MOD/go.mod" "testenv/helm"
lock_build_dir "$BIN_DIR"

step "downloading modules for testenv/helm"
go_download "$MOD" "testenv/helm"

# The same stamps as helm's own Makefile for a tagged release.
PKG=helm.sh/helm/v4/internal/version
LDFLAGS="-s -w -X $PKG.version=$HELM_VERSION -X $PKG.metadata= -X $PKG.gitTreeState=clean"
step "building helm $HELM_VERSION (helm.sh/helm/v4/cmd/helm)"
(cd "$MOD" && CGO_ENABLED=0 nice -n 19 go build -trimpath -ldflags "$LDFLAGS" -o "$PARTIAL/helm" \
    helm.sh/helm/v4/cmd/helm) \
    || die "go build of helm failed (output above)"

mv -f "$PARTIAL/helm" "$BIN_DIR/helm"
printf '%s\n' "$WANT" >"$STAMP"
step "done: $("$BIN_DIR/helm" version --short) in $BIN_DIR"
