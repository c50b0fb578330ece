"""What a real node needs on the machine, checked up front with one clear message."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpushare.testing.controlplane import REPO_ROOT, ControlPlaneError

REQUIRED_COMMANDS = ("runc", "ip", "iptables", "umount")
INSTALL_SCRIPT = "scripts/install-node-runtime.sh"
CONTAINERD_SCRIPT = REPO_ROOT / "scripts" / "build-containerd.sh"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")


def containerd_dir() -> Path:
    """Where ``scripts/build-containerd.sh`` keeps containerd 2.x (``--print-path``; the node
    runs it: CDI for DRA claims, docs/dra.md). :class:`ControlPlaneError` when the script
    cannot say."""
    try:
        done = subprocess.run(
            ["bash", str(CONTAINERD_SCRIPT), "--print-path"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        raise ControlPlaneError(f"cannot run {CONTAINERD_SCRIPT} --print-path: {error}") from error
    return Path(done.stdout.strip())


def check_prerequisites() -> None:
    """Raise :class:`ControlPlaneError` naming everything missing (never a skip)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (kubelet, containerd and mounts need it)")
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        problems.append(f"commands not found: {', '.join(missing)}")
    built = containerd_dir()
    absent = [c for c in CONTAINERD_COMMANDS if not os.access(built / c, os.X_OK)]
    if absent:
        problems.append(
            f"containerd 2.x not built in {built} ({', '.join(absent)} missing): run "
            "scripts/build-containerd.sh (make containerd)"
        )
    for path in ("/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/loopback"):
        if not os.access(path, os.X_OK):
            problems.append(f"CNI plugin {path} missing")
    if not os.access("/bin/busybox", os.X_OK):
        problems.append("/bin/busybox missing (busybox-static: the test images' userland)")
    if problems:
        raise ControlPlaneError(
            "the real-node tier cannot run: " + "; ".join(problems) + f". Run {INSTALL_SCRIPT} "
            "(make test does); the node tests are never skipped."
        )
