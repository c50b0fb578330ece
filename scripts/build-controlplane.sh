#!/usr/bin/env bash
# Build the real Kubernetes programs used by the cluster-test tiers (tests/cluster, tests/node)
# from the Go module proxy, at the versions pinned by the Go modules under testenv/controlplane/
# (go.mod + go.sum, checked in):
#   control plane  etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kwok
#   node           kubelet, kube-proxy
#   client         kubectl (the tests run `kubectl inspect gpushare` with it)
# Every Kubernetes program comes from ONE `go build` invocation of the same pinned module set, so
# they share one build graph (a separate, concurrent kubelet build took 21 minutes on 2 cores).
#
# The binaries go to a cache directory outside the repository and are reused when present:
#   ${GPUSHARE_CONTROLPLANE_CACHE:-$HOME/.cache/gpushare/controlplane/<versions>_<hash>}
# <hash> is a hash of this script and the pinning modules, so two checkouts that pin different
# sets (branches built side by side on one machine) never overwrite each other's binaries.
#
# Usage:
#   scripts/build-controlplane.sh              build (or reuse) the binaries, print progress
#   scripts/build-controlplane.sh --print-dir  print the binary directory and exit (no Go needed)
#
# Environment: GPUSHARE_CONTROLPLANE_CACHE (binary directory), GOPROXY/GOMODCACHE/GOCACHE as
# usual for Go. Exit status is non-zero, with a message saying why, when Go or the module
# proxy is unavailable: the cluster tests must never be skipped silently.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODS="$ROOT/testenv/controlplane"
K8S_COMMANDS=(kube-apiserver kube-scheduler kube-controller-manager kubelet kube-proxy kubectl)
BINARIES=(etcd kwok "${K8S_COMMANDS[@]}")
# kwok >= 0.8 refuses to start without stages; these are the defaults kwokctl gives it.
KWOK_STAGES=(node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)

say() { printf '[controlplane] %s\n' "$*" >&2; }
die() {
    printf '[controlplane] ERROR: %s\n' "$*" >&2
    printf '[controlplane] The cluster tests (pytest -m cluster) need these binaries; they are not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/gobuild.sh
source "$ROOT/scripts/lib/gobuild.sh"

K8S_VERSION="$(pinned "$MODS/kubernetes/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(pinned "$MODS/etcd/go.mod" go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(pinned "$MODS/kwok/go.mod" sigs.k8s.io/kwok)"
KEY="k8s-${K8S_VERSION}_etcd-${ETCD_VERSION}_kwok-${KWOK_VERSION}"

# What the stamp records: the versions, this script and the exact pinning files.
fingerprint() {
    printf '%s\n' "$KEY"
    (cat "${BASH_SOURCE[0]}" "$ROOT/scripts/lib/gobuild.sh" && cd "$MODS" && cat kubernetes/go.mod kubernetes/go.sum kubernetes/tools.go \
        etcd/go.mod etcd/go.sum etcd/tools.go kwok/go.mod kwok/go.sum kwok/tools.go) \
        | sha256sum | cut -d' ' -f1
}
WANT="$(fingerprint)"
HASH="$(printf '%s' "$WANT" | sed -n 2p | cut -c1-12)"
BIN_DIR="${GPUSHARE_CONTROLPLANE_CACHE:-${HOME}/.cache/gpushare/controlplane/${KEY}_${HASH}}"
STAMP="$BIN_DIR/.stamp"

if [[ "${1:-}" == "--print-dir" ]]; then
    printf '%s\n' "$BIN_DIR"
    exit 0
elif [[ $# -gt 0 ]]; then
    die "unknown argument: $1 (usage: $0 [--print-dir])"
fi

cached() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]] || return 1
    local b
    for b in "${BINARIES[@]}"; do [[ -x "$BIN_DIR/$b" ]] || return 1; done
    [[ -s "$BIN_DIR/kwok-stages.yaml" ]]
}

say "versions: kubernetes $K8S_VERSION, etcd $ETCD_VERSION, kwok $KWOK_VERSION"
say "binary directory: $BIN_DIR"
if cached; then
    say "all binaries present and up to date; nothing to build"
    exit 0
fi

# ---- preconditions: a Go toolchain that can build the pinned modules --------------------
require_go "$MODS/kubernetes/go.mod" "these modules"
lock_build_dir "$BIN_DIR"

# ---- download (no-op when the module cache already holds everything) --------------------
for d in kubernetes etcd kwok; do
    step "downloading modules for $d"
    go_download "$MODS/$d" "testenv/controlplane/$d"
done

# ---- build -------------------------------------------------------------------------------
export CGO_ENABLED=0
# Run below the priority of everything else on the machine (builds are long on 2 cores).
NICE=(nice -n 19)

module_time() { (cd "$MODS/$1" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' "$2"); }

K8S_MINOR="${K8S_VERSION#v1.}"
K8S_MINOR="${K8S_MINOR%%.*}"
K8S_DATE="$(module_time kubernetes k8s.io/kubernetes)"
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$K8S_MINOR"
    K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=${K8S_DATE:-1970-01-01T00:00:00Z}"
done

PKGS=()
for c in "${K8S_COMMANDS[@]}"; do PKGS+=("k8s.io/kubernetes/cmd/$c"); done
step "building ${K8S_COMMANDS[*]} $K8S_VERSION in one go build (the long part on a cold cache)"
(cd "$MODS/kubernetes" && "${NICE[@]}" go build -trimpath -ldflags "$K8S_LDFLAGS" -o "$PARTIAL/" "${PKGS[@]}") \
    || die "go build of ${K8S_COMMANDS[*]} failed (output above)"

step "building etcd $ETCD_VERSION"
(cd "$MODS/etcd" && "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$PARTIAL/etcd" \
    go.etcd.io/etcd/server/v3) \
    || die "go build of etcd failed (output above)"

step "building kwok $KWOK_VERSION"
(cd "$MODS/kwok" && "${NICE[@]}" go build -trimpath -ldflags "-s -w" -o "$PARTIAL/kwok" \
    sigs.k8s.io/kwok/cmd/kwok) \
    || die "go build of kwok failed (output above)"

step "collecting kwok's default stages (node-initialize, heartbeat with lease, pod fast)"
KWOK_DIR="$(cd "$MODS/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
for f in "${KWOK_STAGES[@]}"; do
    [[ -f "$KWOK_DIR/kustomize/stage/$f" ]] || die "kwok $KWOK_VERSION has no stage file kustomize/stage/$f"
    printf -- '---\n# from sigs.k8s.io/kwok@%s kustomize/stage/%s\n' "$KWOK_VERSION" "$f"
    cat "$KWOK_DIR/kustomize/stage/$f"
done >"$PARTIAL/kwok-stages.yaml"

# ---- install atomically: binaries first, stamp last ----------------------------------------
for b in "${BINARIES[@]}" kwok-stages.yaml; do
    mv -f "$PARTIAL/$b" "$BIN_DIR/$b"
done
printf '%s\n' "$WANT" >"$STAMP"
say "built: $("$BIN_DIR/kube-apiserver" --version); kubectl \
$("$BIN_DIR/kubectl" version --client | sed -n 's/^Client Version: //p'); $("$BIN_DIR/etcd" --version | sed -n 1p)"
step "done: ${BINARIES[*]} kwok-stages.yaml in $BIN_DIR"
