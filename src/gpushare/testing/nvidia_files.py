"""A stand-in for what an NVIDIA driver puts on a node (the GPU being the one thing that cannot
exist here): device nodes, versioned libraries with their soname links, binaries, in a
temporary tree that ``gpushare.deviceplugin.cdifiles`` is pointed at (``CdiPaths``, or the
``--cdi-*`` flags of ``gpushare device-plugin``).

Device nodes are character devices with ``/dev/null``'s numbers (1:3: reading gives nothing,
writing is harmless) made with ``mknod`` (root), or, with ``device_nodes=False``, regular files
(for tests that do not run as root: discovery is then given ``is_device=Path.is_file``).
Libraries hold one line of text (``stand-in <file name>``); binaries are ``/bin/sh`` scripts
that print ``stand-in <name>``: a container can read the one and run the other.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.deviceplugin.cdifiles import SONAMES, CdiPaths

__all__ = ["StandInDriver", "stand_in_driver"]

VERSION = "580.159.04"


@dataclass(frozen=True, slots=True)
class StandInDriver:
    """The stand-in tree under ``root``: ``dev_root``, ``library_dir``, ``binary_dir`` and the
    driver ``version`` of its libraries."""

    root: Path
    dev_root: Path
    library_dir: Path
    binary_dir: Path
    version: str

    def paths(self, spec_dir: Path, toolkit_dirs: Sequence[Path] = ()) -> CdiPaths:
        """Discovery's paths for this tree; gpushare's spec goes into ``spec_dir``."""
        return CdiPaths(
            dev_root=self.dev_root,
            library_dirs=(self.library_dir,),
            binary_dirs=(self.binary_dir,),
            toolkit_dirs=tuple(toolkit_dirs),
            spec_dir=spec_dir,
        )

    def flags(self, cdi_dir: Path, mode: str = "auto") -> list[str]:
        """``gpushare device-plugin`` flags pointing discovery at this tree."""
        return [
            "--cdi", mode, "--cdi-dir", str(cdi_dir), "--cdi-dev-root", str(self.dev_root),
            "--cdi-library-dirs", str(self.library_dir),
            "--cdi-binary-dirs", str(self.binary_dir),
        ]  # fmt: skip


def _node(path: Path, device_nodes: bool) -> None:
    if device_nodes:
        os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        path.write_bytes(b"")


def stand_in_driver(
    root: Path,
    *,
    minors: Sequence[int] = (0, 1),
    control: Sequence[str] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"),
    libraries: Sequence[str] = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so"),
    binaries: Sequence[str] = ("nvidia-smi",),
    version: str = VERSION,
    links: bool = True,
    device_nodes: bool = True,
) -> StandInDriver:
    """A stand-in driver under ``root`` (module doc): ``/dev/nvidia<minor>`` per minor, the
    ``control`` nodes, each of ``libraries`` as ``<name>.<version>`` with (``links``) its
    soname link and, for ``libcuda.so``, the ``libcuda.so`` link, and ``binaries``."""
    dev, lib, bin_dir = root / "dev", root / "lib", root / "bin"
    for directory in (dev, lib, bin_dir):
        directory.mkdir(parents=True, exist_ok=True)
    for minor in minors:
        _node(dev / f"nvidia{minor}", device_nodes)
    for name in control:
        _node(dev / name, device_nodes)
    for name in libraries:
        file = lib / f"{name}.{version}"
        file.write_text(f"stand-in {file.name}\n")
        if links:
            (lib / SONAMES.get(name, f"{name}.1")).symlink_to(file.name)
            if name == "libcuda.so":
                (lib / name).symlink_to(f"{name}.1")
    for name in binaries:
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "stand-in {name}"\n')
        script.chmod(0o755)
    return StandInDriver(root, dev, lib, bin_dir, version)
