"""Where the control-plane programs are: :class:`Binaries` and the build script's cache."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpushare.testing.controlplane.errors import ControlPlaneError

REPO_ROOT = Path(__file__).resolve().parents[4]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
BINARY_NAMES = (
    "etcd",
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kwok",
    "kubelet",
    "kube-proxy",
    "kubectl",
)
"""What the build script builds: the control plane, the node (kubelet, kube-proxy) and kubectl
of the same Kubernetes release (the tests run ``kubectl inspect gpushare`` through the real
kubectl's plugin lookup)."""
KWOK_STAGES = "kwok-stages.yaml"  # kwok >= 0.8 needs stages; the build script collects defaults


@dataclass(frozen=True)
class Binaries:
    """Paths of the control-plane programs, kubectl and kwok's stages file, in one directory."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @classmethod
    def locate(cls) -> Binaries:
        """The binaries ``scripts/build-controlplane.sh`` built, or a clear error.

        ``GPUSHARE_CONTROLPLANE_BIN`` overrides the directory; otherwise the script says where
        its cache is (``--print-dir`` needs no Go). Missing binaries are an error, never a skip:
        ``make test`` builds them first (``make controlplane``).
        """
        override = os.environ.get("GPUSHARE_CONTROLPLANE_BIN")
        if override:
            directory = Path(override)
        else:
            try:
                done = subprocess.run(
                    ["bash", str(BUILD_SCRIPT), "--print-dir"],
                    check=True,
                    capture_output=True,
                    text=True,
                )
            except (OSError, subprocess.CalledProcessError) as exc:
                raise ControlPlaneError(f"cannot run {BUILD_SCRIPT} --print-dir: {exc}") from exc
            directory = Path(done.stdout.strip())
        missing = [n for n in BINARY_NAMES if not os.access(directory / n, os.X_OK)]
        if not (directory / KWOK_STAGES).is_file():
            missing.append(KWOK_STAGES)
        if missing:
            raise ControlPlaneError(
                f"control-plane binaries missing in {directory}: {', '.join(missing)}. "
                "Build them with `make controlplane` (scripts/build-controlplane.sh; needs Go "
                ">= 1.26 and the Go module proxy). The cluster tests are never skipped."
            )
        return cls(directory)
