#!/usr/bin/env bash
# The real node on a lent GPU machine (docs/testing.md, "Real GPU node"), run there as root from
# the repository root with the bundles of bench/gpu/pack.py carried in .gpu-bundle/:
#
#   bash bench/gpu/node.sh [--dry-run] [--probe | unpack | device-plugin | dra | all]
#
#   unpack         unpack the bundles present into $GPUSHARE_NODE_ROOT (/tmp/gpushare-node) and
#                  say which are still missing (a call carries one bundle; what it leaves there
#                  lasts only while the machine stays held, about 30 s between calls)
#   --probe        only answer, in under 2 minutes: does runc run a container, does containerd
#                  2.x start with a working snapshotter (overlayfs, else native), does a
#                  container given /dev/nvidia* and the driver's files run nvidia-smi
#   device-plugin  the probe, then the node (bench/gpu/node_run.py): etcd, kube-apiserver,
#                  kube-scheduler and one with gpushare's extender entry, kubelet + containerd,
#                  `gpushare extender`, `gpushare device-plugin` (NVML, --mps-managed), a GPU pod
#   dra            the same with `gpushare dra-driver` (NVML, --mps) and a ResourceClaim
#   all            the probe, device-plugin, then dra (the default)
#   --dry-run      print the steps it would take; run nothing, need no bundle
#
# Everything it prints goes to $OUT/node.log (OUT: set by the device tool; ./out/gpu-node
# otherwise), with result-<mode>.json and logs-<mode>.tar.gz beside it. Exit status: 0 all
# passed, 1 a check failed (the message says which and why), 2 bad arguments, 3 bundles missing.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2

usage="usage: bash bench/gpu/node.sh [--dry-run] [--probe | unpack | device-plugin | dra | all]"
mode=all
dry=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry=1 ;;
        --probe | probe) mode=probe ;;
        unpack | device-plugin | dra | all) mode=$arg ;;
        -h | --help) echo "$usage"; exit 0 ;;
        *) echo "node.sh: unknown argument '$arg'; $usage" >&2; exit 2 ;;
    esac
done

OUT=${OUT:-./out/gpu-node}
ROOT=${GPUSHARE_NODE_ROOT:-/tmp/gpushare-node}
BUNDLES=${GPUSHARE_BUNDLE_DIR:-.gpu-bundle}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/node.log") 2>&1

say() { printf '[node %s] %s\n' "$(date -u +%T)" "$*"; }
fail() { say "FAILED: $*"; exit 1; }
# A step: its description printed, then the command run (unless --dry-run).
step() {
    say "step: $1"
    shift
    [[ $dry -eq 1 ]] || "$@"
}

case "$mode" in
    unpack) groups_needed="" ;;
    probe) groups_needed="runtime python" ;;
    *) groups_needed="runtime python kubernetes" ;;
esac
say "mode $mode; bundles from $BUNDLES into $ROOT; output in $OUT"

# ---- bundles ------------------------------------------------------------------------------
unpack() {
    mkdir -p "$ROOT"
    local bundle name
    for bundle in "$BUNDLES"/gpu-node-*.tar.xz; do
        [[ -f "$bundle" ]] || continue
        name=$(basename "$bundle")
        if [[ -f "$ROOT/manifest/$name.json" ]]; then
            say "$name: already unpacked"
        else
            tar -xJf "$bundle" -C "$ROOT" || fail "cannot unpack $bundle (tar -xJ: is xz installed?)"
            say "$name: unpacked ($(du -sh "$bundle" | cut -f1))"
        fi
    done
}

# Which groups the unpacked bundles hold, and which bundles are still missing.
check_bundles() {
    "$PYTHON" - "$ROOT" "$groups_needed" <<'EOF'
import json, sys
from pathlib import Path
root, needed = Path(sys.argv[1]), sys.argv[2].split()
manifests = [json.loads(p.read_text()) for p in sorted((root / "manifest").glob("*.json"))]
have = {g for m in manifests for g in m["groups"]}
names = {m["name"] for m in manifests}
count = manifests[0]["bundles"] if manifests else 0
missing = [f"gpu-node-{k}-of-{count}.tar.xz" for k in range(1, count + 1)
           if f"gpu-node-{k}-of-{count}.tar.xz" not in names]
print(f"[node] unpacked {len(names)} of {count or '?'} bundle(s); groups: {' '.join(sorted(have)) or 'none'}")
lacking = [g for g in needed if g not in have]
if lacking:
    print(f"[node] this mode needs {', '.join(lacking)}: carry "
          f"{', '.join('.gpu-bundle/' + m for m in missing) or 'the bundles (bench/gpu/pack.py)'} "
          "in the next call, within 30 s of this one (the machine keeps /tmp only while held)")
    sys.exit(3)
EOF
}

if [[ $dry -eq 1 ]]; then
    say "step: unpack $BUNDLES/gpu-node-*.tar.xz into $ROOT (tar -xJf), skipping those unpacked"
    say "step: check that the bundles hold: ${groups_needed:-nothing more}"
else
    unpack
    check_bundles
    status=$?
    [[ $status -eq 0 ]] || exit "$status"
fi
[[ "$mode" == unpack ]] && exit 0

# ---- the machine: what the node needs beside the bundles ---------------------------------
export PATH="$ROOT/bin:$PATH"
export PYTHONPATH="$ROOT/site:$PWD/src"
export PYTHONUNBUFFERED=1
export GPUSHARE_CONTROLPLANE_BIN="$ROOT/bin" GPUSHARE_CONTAINERD_CACHE="$ROOT/bin"

prepare_host() {
    [[ $EUID -eq 0 ]] || fail "needs root (runc, containerd, kubelet, mounts)"
    if ! runc --version >/dev/null 2>&1; then
        # runc from Debian loads libseccomp; the bundle carries it for a machine without it.
        echo "$ROOT/lib" >/etc/ld.so.conf.d/gpushare-node.conf && ldconfig
        runc --version >/dev/null 2>&1 || fail "runc does not start: $(runc --version 2>&1 | tail -2)"
    fi
    # The harness expects the CNI plugins in /usr/lib/cni and busybox at /bin/busybox.
    if [[ ! -x /usr/lib/cni/bridge ]]; then mkdir -p /usr/lib/cni && cp "$ROOT"/cni/* /usr/lib/cni/; fi
    [[ -x /bin/busybox ]] || cp "$ROOT/bin/busybox" /bin/busybox
    local tool
    for tool in ip umount mount; do
        command -v "$tool" >/dev/null || ln -sf busybox "$ROOT/bin/$tool"
    done
    say "runc: $(runc --version | head -1); containerd: $(containerd --version)"
    say "python: $("$PYTHON" --version 2>&1) at $(command -v "$PYTHON")"
}

cgroup_check() {
    local fs
    fs=$(stat -fc %T /sys/fs/cgroup 2>/dev/null) || fail "no /sys/fs/cgroup: runc and kubelet need cgroups mounted"
    case "$fs" in
        cgroup2fs) say "cgroups: v2 (controllers: $(cat /sys/fs/cgroup/cgroup.controllers))" ;;
        tmpfs) say "cgroups: v1 ($(find /sys/fs/cgroup -mindepth 1 -maxdepth 1 -printf '%f ' ))" ;;
        *) fail "/sys/fs/cgroup is $fs, neither cgroup v2 nor v1's tmpfs" ;;
    esac
}

# overlayfs when the machine mounts it on $ROOT's filesystem, else native (slower, always works).
choose_snapshotter() {
    local d="$ROOT/probe/overlay"
    rm -rf "$d" && mkdir -p "$d"/{lower,upper,work,merged}
    if mount -t overlay overlay -o "lowerdir=$d/lower,upperdir=$d/upper,workdir=$d/work" "$d/merged" 2>"$d/error"; then
        umount "$d/merged"
        SNAPSHOTTER=overlayfs
    else
        SNAPSHOTTER=native
        say "overlay mount refused ($(cat "$d/error")): containerd will use the native snapshotter"
    fi
    say "snapshotter: $SNAPSHOTTER"
}

probe_runc() {
    local b="$ROOT/probe/runc" out
    rm -rf "$b" && mkdir -p "$b/rootfs/bin"
    cp "$ROOT/bin/busybox" "$b/rootfs/bin/busybox" && ln -sf busybox "$b/rootfs/bin/sh"
    (cd "$b" && runc spec) || fail "runc spec failed"
    "$PYTHON" - "$b/config.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))
config["process"].update(terminal=False, args=["/bin/sh", "-c", "echo runc-runs-a-container"])
config["root"]["readonly"] = False
json.dump(config, open(sys.argv[1], "w"))
EOF
    out=$(timeout 30 runc --root "$ROOT/probe/runc-state" run --bundle "$b" "gpushare-probe-$$" 2>&1)
    [[ "$out" == *runc-runs-a-container* ]] \
        || fail "runc cannot run a container: $out (cgroups: see above; seccomp, namespaces or a read-only /sys refuse it here)"
    say "runc: ran a container"
}

CTR=()
start_containerd() {
    local d="$ROOT/probe/containerd"
    rm -rf "$d" && mkdir -p "$d"
    "$PYTHON" - "$d" "$ROOT/bin" "$SNAPSHOTTER" <<'EOF' || fail "cannot write containerd's configuration or the images (PYTHONPATH=$PYTHONPATH)"
import sys
from pathlib import Path
from gpushare.testing.node.containerd import containerd2_config
from gpushare.testing.node.images import write_image_archive
root, bins, snapshotter = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
(root / "config.toml").write_text(containerd2_config(root, bins, snapshotter))
write_image_archive(root / "images.tar", busybox=bins / "busybox")
EOF
    containerd --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
    CONTAINERD_PID=$!
    CTR=(ctr --address "$d/containerd.sock" -n gpushare-probe)
    local _
    for _ in $(seq 1 60); do
        "${CTR[@]}" version >/dev/null 2>&1 && break
        kill -0 "$CONTAINERD_PID" 2>/dev/null || fail "containerd exited: $(tail -5 "$d/containerd.log")"
        sleep 0.5
    done
    "${CTR[@]}" version >/dev/null 2>&1 || fail "containerd did not answer in 30 s: $(tail -5 "$d/containerd.log")"
    "${CTR[@]}" images import --snapshotter "$SNAPSHOTTER" "$d/images.tar" >/dev/null \
        || fail "ctr images import failed: $(tail -5 "$d/containerd.log")"
    local out
    out=$(timeout 60 "${CTR[@]}" run --rm --snapshotter "$SNAPSHOTTER" gpushare.test/busybox:1 \
        "probe-$$" sh -c 'echo containerd-runs-a-container' 2>&1)
    [[ "$out" == *containerd-runs-a-container* ]] \
        || fail "containerd cannot run a container with the $SNAPSHOTTER snapshotter: $out; $(tail -5 "$d/containerd.log")"
    say "containerd: ran a container ($SNAPSHOTTER snapshotter)"
}

stop_containerd() {
    [[ -n "${CONTAINERD_PID:-}" ]] || return 0
    kill "$CONTAINERD_PID" 2>/dev/null
    wait "$CONTAINERD_PID" 2>/dev/null
    local m
    awk -v r="$ROOT/probe/" 'index($5, r) == 1 {print $5}' /proc/self/mountinfo | sort -r \
        | while read -r m; do umount -l "$m" 2>/dev/null; done
    CONTAINERD_PID=
}

# A container given /dev/nvidia* and the driver's files (the machine's /usr, /lib*, and
# /usr/local/nvidia, read-only) runs nvidia-smi.
probe_gpu() {
    local smi args=() dev dir out
    smi=$(command -v nvidia-smi) || fail "no nvidia-smi on this machine's PATH"
    for dev in /dev/nvidia*; do [[ -c "$dev" ]] && args+=(--device "$dev"); done
    [[ ${#args[@]} -gt 0 ]] || fail "no /dev/nvidia* device nodes on this machine"
    for dir in /usr /lib /lib64 /usr/local/nvidia; do
        [[ -e "$dir" ]] && args+=(--mount "type=bind,src=$dir,dst=$dir,options=rbind:ro")
    done
    out=$(timeout 60 "${CTR[@]}" run --rm --snapshotter "$SNAPSHOTTER" "${args[@]}" \
        --env LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib \
        gpushare.test/busybox:1 "probe-gpu-$$" "$smi" -L 2>&1)
    [[ "$out" == *GPU\ 0:* ]] || fail "a container with ${args[*]} could not run $smi -L: $out"
    say "GPU in a container: $out"
}

probe() {
    step "root; runc starts (libseccomp from the bundle if missing); CNI plugins, busybox, ip" \
        prepare_host
    step "cgroups mounted (v1 or v2)" cgroup_check
    step "snapshotter: overlayfs if an overlay mount works in $ROOT, else native" \
        choose_snapshotter
    step "runc runs a busybox container" probe_runc
    step "containerd 2.x starts, imports the busybox image, runs a container" start_containerd
    trap stop_containerd EXIT
    step "a container given /dev/nvidia* and the driver runs nvidia-smi -L" probe_gpu
    step "containerd stopped" stop_containerd
    trap - EXIT
    [[ $dry -eq 1 ]] || say "probe passed: runc, containerd ($SNAPSHOTTER) and the GPU in a container"
}

run_node() {
    local which=$1
    say "step: $PYTHON bench/gpu/node_run.py $which --bin-dir $ROOT/bin --snapshotter ${SNAPSHOTTER:-overlayfs} --out $OUT"
    [[ $dry -eq 1 ]] && return 0
    "$PYTHON" bench/gpu/node_run.py "$which" --bin-dir "$ROOT/bin" --snapshotter "$SNAPSHOTTER" --out "$OUT" \
        || fail "the $which run (result: $OUT/result-$which.json, logs: $OUT/logs-$which.tar.gz)"
    say "$which: the pod ran on the GPU ($OUT/result-$which.json)"
}

SNAPSHOTTER=overlayfs
probe
case "$mode" in
    probe) ;;
    device-plugin | dra) run_node "$mode" ;;
    all) run_node device-plugin; run_node dra ;;
esac
if [[ $dry -eq 1 ]]; then say "dry run of $mode: nothing ran"; else say "done: $mode"; fi
