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

HELM_VERSION="$(awk '($1 == "helm.sh/helm/v4" || ($1 == "require" && $2 == "helm.sh/helm/v4")) {
    print ($1 == "require" ? $3 : $2); exit }' "$MOD/go.mod")"
[[ -n "$HELM_VERSION" ]] || die "cannot find the pinned version of helm.sh/helm/v4 in $MOD/go.mod"
BIN_DIR="${GPUSHARE_HELM_CACHE:-${HOME}/.cache/gpushare/helm/${HELM_VERSION}}"

if [[ "${1:-}" == "--print-path" ]]; then
    printf '%s\n' "$BIN_DIR/helm"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--print-path])"
fi

fingerprint() {
    printf '%s\n' "$HELM_VERSION"
    (cat "${BASH_SOURCE[0]}" && cd "$MOD" && cat go.mod go.sum tools.go) | sha256sum | cut -d' ' -f1
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
command -v go >/dev/null 2>&1 \
    || die "Go is not installed (no 'go' on PATH). Install Go >= 1.26 (https://go.dev/dl/) and rerun."
GO_NEED="$(awk '$1 == "go" { print $2; exit }' "$MOD/go.mod")"
GO_HAVE="$(go env GOVERSION)"
GO_HAVE="${GO_HAVE#go}"
if [[ "$(printf '%s\n%s\n' "$GO_NEED" "$GO_HAVE" | sort -V | head -1)" != "$GO_NEED" ]]; then
    case "$(go env GOTOOLCHAIN)" in
        local*) die "Go $GO_HAVE is too old: testenv/helm needs Go >= $GO_NEED and GOTOOLCHAIN=local \
forbids fetching a newer toolchain. Install Go >= $GO_NEED or set GOTOOLCHAIN=auto." ;;
        *) say "Go $GO_HAVE < $GO_NEED: the go command will fetch a newer toolchain through the proxy" ;;
    esac
fi
say "using $(go version) (GOPROXY=$(go env GOPROXY))"

mkdir -p "$BIN_DIR"
# One build at a time per cache directory (concurrent `make test` runs).
if command -v flock >/dev/null 2>&1; then
    exec 9>"$BIN_DIR/.lock"
    flock 9
    if cached; then
        say "another build finished helm meanwhile; nothing to build"
        exit 0
    fi
fi
PARTIAL="$(mktemp -d "$BIN_DIR/.partial.XXXXXX")"
trap 'rm -rf "$PARTIAL"' EXIT

START=$SECONDS
step() { say "$1 (t+$((SECONDS - START))s)"; }

step "downloading modules for testenv/helm"
LOG="$(mktemp)"
if ! (cd "$MOD" && go mod download) >"$LOG" 2>&1; then
    cat "$LOG" >&2
    rm -f "$LOG"
    die "cannot download the Go modules for testenv/helm from GOPROXY=$(go env GOPROXY). \
The Go module proxy must be reachable (or the modules already in $(go env GOMODCACHE))."
fi
rm -f "$LOG"

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
