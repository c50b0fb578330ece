#!/usr/bin/env bash
# Install the rest of the real-node test tier's runtime (tests/node): runc, the CNI plugins,
# busybox-static (the userland of the test images) and iptables + conntrack (for kube-proxy),
# from the distribution's packages with apt-get. containerd itself is 2.x, built from the Go
# module proxy by scripts/build-containerd.sh (`make containerd`): kubelet gives containers their
# DRA devices as CDI device IDs, which Debian's containerd 1.6.20 does not read (docs/dra.md).
#
# Idempotent: installs only what is missing (no apt-get call at all when everything is there);
# apt runs under a machine-wide lock so that two checkouts running it at once do not collide.
#
# Usage: scripts/install-node-runtime.sh            install what is missing
#        scripts/install-node-runtime.sh --check    exit 1 listing what is missing, install nothing
set -euo pipefail

say() { printf '[node-runtime] %s\n' "$*" >&2; }
die() {
    printf '[node-runtime] ERROR: %s\n' "$*" >&2
    printf '[node-runtime] The real-node tests (tests/node) need these; they are not optional.\n' >&2
    exit 1
}

# shellcheck source=lib/apt.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/apt.sh"

# package -> a file it installs that the harness uses
declare -A PROVIDES=(
    [runc]=/usr/sbin/runc
    [containernetworking-plugins]=/usr/lib/cni/bridge
    [busybox-static]=/bin/busybox
    [iptables]=/usr/sbin/iptables
    [conntrack]=/usr/sbin/conntrack
)

install_provided scripts/install-node-runtime.sh "$@"
