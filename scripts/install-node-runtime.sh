#!/usr/bin/env bash
# Install the container runtime of the real-node test tier (tests/node): containerd, runc, the
# CNI plugins, busybox-static (the userland of the test images) and iptables + conntrack (for
# kube-proxy), from the distribution's packages with apt-get.
#
# Why Debian packages and not containerd 2.x built from the Go module proxy: kubelet v1.37 runs
# on containerd 1.6 (Debian bookworm's 1.6.20; kubelet logs "RuntimeConfig Unimplemented" and
# carries on), the packages install in seconds where a containerd build costs ~3 more minutes of
# the 2-core CI budget, and runc/CNI plugins come from the same source either way. kubelet 1.38
# requires the CRI RuntimeConfig call: moving there means building containerd 2.x (see
# docs/testing.md).
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
    [containerd]=/usr/bin/containerd
    [runc]=/usr/sbin/runc
    [containernetworking-plugins]=/usr/lib/cni/bridge
    [busybox-static]=/bin/busybox
    [iptables]=/usr/sbin/iptables
    [conntrack]=/usr/sbin/conntrack
)

install_provided scripts/install-node-runtime.sh "$@"
