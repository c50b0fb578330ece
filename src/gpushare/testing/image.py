"""The gpushare image, built from the repository's Dockerfile with no registry (test tool).

:func:`build_image` runs ``scripts/build-image.sh`` (buildah on a base made from Debian's
packages; see the script and docs/install.md) and returns the :class:`ImageArchive` it wrote: a
docker-archive that ``ctr -n k8s.io images import`` reads. The script is idempotent: seconds when
the archive is up to date, about 8 minutes cold (the base and every dependency downloaded), so
tests call it unconditionally; it fails with the script's own message (never skips).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from gpushare.testing.controlplane import REPO_ROOT

__all__ = ["BUILD_SCRIPT", "ImageArchive", "ImageBuildError", "build_image"]

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-image.sh"


class ImageBuildError(RuntimeError):
    """The image could not be built (the script's exit status and last output included)."""


@dataclass(frozen=True)
class ImageArchive:
    """A docker-archive at ``path`` holding one image tagged ``reference``
    (``repository:tag``, e.g. ``gpushare/gpushare:0.1.0``; containerd names it
    ``docker.io/gpushare/gpushare:0.1.0`` on import)."""

    path: Path
    reference: str

    @property
    def repository(self) -> str:
        return self.reference.rsplit(":", 1)[0]

    @property
    def tag(self) -> str:
        return self.reference.rsplit(":", 1)[1]


def build_image(*, timeout_s: float = 1800.0) -> ImageArchive:
    """Build (or reuse) the image archive with ``scripts/build-image.sh``.

    Raises :class:`ImageBuildError` with the script's output when it fails or runs past
    ``timeout_s`` seconds (it needs root, Debian's buildah and mmdebstrap, which it installs with
    apt-get, and the package index for the base and the dependencies).
    """
    try:
        built = subprocess.run(
            ["bash", str(BUILD_SCRIPT)],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired as error:
        raise ImageBuildError(f"{BUILD_SCRIPT} ran past {timeout_s:.0f} s") from error
    if built.returncode != 0:
        raise ImageBuildError(
            f"{BUILD_SCRIPT} failed (exit {built.returncode}):\n{built.stderr[-4000:]}"
        )
    printed = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-path"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    path, reference = Path(printed[0]), printed[1]
    if not path.is_file():
        raise ImageBuildError(f"{BUILD_SCRIPT} succeeded but wrote no archive at {path}")
    return ImageArchive(path, reference)
