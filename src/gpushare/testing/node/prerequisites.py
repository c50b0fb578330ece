"""What a real node needs on the machine, checked up front with one clear message."""

from __future__ import annotations

import os
import shutil

from gpushare.testing.controlplane import ControlPlaneError

REQUIRED_COMMANDS = ("containerd", "ctr", "runc", "ip", "iptables", "umount")
INSTALL_SCRIPT = "scripts/install-node-runtime.sh"


def check_prerequisites() -> None:
    """Raise :class:`ControlPlaneError` naming everything missing (never a skip)."""
    problems = []
    if os.geteuid() != 0:
        problems.append("not running as root (kubelet, containerd and mounts need it)")
    missing = [c for c in REQUIRED_COMMANDS if shutil.which(c) is None]
    if missing:
        problems.append(f"commands not found: {', '.join(missing)}")
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
