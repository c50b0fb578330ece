#!/usr/bin/env bash
# Build containerd 2.x (the daemon, containerd-shim-runc-v2 and ctr) from the Go module proxy, at
# the version pinned by testenv/containerd (go.mod + go.sum, checked in). The real-node tier's
# DRA tests run it: kubelet v1.37 passes a claim's CDI device IDs only in the CRI field
# `CDI_devices`, which Debian's containerd 1.6.20 does not read and containerd 2.x reads by
# default (CDI specs from /etc/cdi and /var/run/cdi; docs/dra.md).
#
# The binaries go to a cache directory outside the repository and are reused when present:
#   ${GPUSHARE_CONTAINERD_CACHE:-$HOME/.cache/gpushare/containerd/<version>}/{containerd,...}
# A stamp file records the version and a hash of this script and the pinning module; any change
# rebuilds. runc, the CNI plugins and the rest of the node's runtime stay Debian's
# (scripts/install-node-runtime.sh).
#
# Usage:
#   scripts/build-containerd.sh               build (or reuse), print progress
#   scripts/build-containerd.sh --print-path  print the directory of the binaries and exit
#
# Environment: GPUSHARE_CONTAINERD_CACHE, GOPROXY/GOMODCACHE/GOCACHE as usual for Go. Exit status
# is non-zero, with a message saying why, when Go or the module proxy is unavailable.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOD="$ROOT/testenv/containerd"
COMMANDS=(containerd containerd-shim-runc-v2 ctr)

say() { printf '[containerd] %s\n' "$*" >&2; }
die() {
    printf '[containerd] ERROR: %s\n' "$*" >&2
    printf '[containerd] The real-node DRA tests (tests/node) need it; it is not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/gobuild.sh
source "$ROOT/scripts/lib/gobuild.sh"

VERSION="$(pinned "$MOD/go.mod" github.com/containerd/containerd/v2)"
BIN_DIR="${GPUSHARE_CONTAINERD_CACHE:-${HOME}/.cache/gpushare/containerd/${VERSION}}"

case "${1:-}" in
    --print-path) printf '%s\n' "$BIN_DIR"; exit 0 ;;
    "") ;;
    *) die "unknown argument: $1 (usage: $0 [--print-path])" ;;
esac

WANT="$(printf '%s\n' "$VERSION"; (cat "${BASH_SOURCE[0]}" "$ROOT/scripts/lib/gobuild.sh" \
    && cd "$MOD" && cat go.mod go.sum tools.go) | sha256sum | cut -d' ' -f1)"
STAMP="$BIN_DIR/.stamp"
cached() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] || return 1
    local command
    for command in "${COMMANDS[@]}"; do [[ -x "$BIN_DIR/$command" ]] || return 1; done
}

say "version: containerd $VERSION in $BIN_DIR"
if cached; then
    say "present and up to date; nothing to build"
    exit 0
fi

require_go "$MOD/go.mod" "testenv/containerd"
lock_build_dir "$BIN_DIR"

step "downloading modules for testenv/containerd"
go_download "$MOD" "testenv/containerd"

# The version stamps of containerd's own Makefile; the shim is static (it runs in the
# container's namespaces), as the release builds it.
PKG=github.com/containerd/containerd/v2/version
LDFLAGS="-s -w -X $PKG.Version=$VERSION -X $PKG.Revision=gpushare-testenv -X $PKG.Package=github.com/containerd/containerd/v2"
for command in "${COMMANDS[@]}"; do
    step "building $command"
    cgo=1
    [[ "$command" == containerd-shim-runc-v2 ]] && cgo=0
    (cd "$MOD" && CGO_ENABLED=$cgo nice -n 19 go build -trimpath -tags "no_btrfs no_zfs" \
        -ldflags "$LDFLAGS" -o "$PARTIAL/$command" "github.com/containerd/containerd/v2/cmd/$command") \
        || die "go build of $command failed (output above)"
done

for command in "${COMMANDS[@]}"; do mv -f "$PARTIAL/$command" "$BIN_DIR/$command"; done
printf '%s\n' "$WANT" >"$STAMP"
step "done: $("$BIN_DIR/containerd" --version)"
