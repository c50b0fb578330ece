"""The node side of CDI (``gpushare.deviceplugin.cdi``, which decides and builds): find the
NVIDIA driver's device nodes, libraries and binaries, find the NVIDIA container toolkit's own
spec, and write gpushare's spec. Used by ``gpushare device-plugin`` and ``gpushare dra-driver``
at start (:func:`node_gpu_cdi`); every path is a parameter, so that tests point it at a tree of
stand-in files (``gpushare.testing.nvidia_files``).

* Device nodes: ``<dev_root>/nvidia<minor>`` per GPU (the minor number NVML reports) and the
  control nodes ``<dev_root>/nvidiactl`` (required), ``nvidia-uvm``, ``nvidia-uvm-tools``,
  ``nvidia-modeset`` (where present); each must be a character device (``is_device``).
* Libraries: in the first of ``library_dirs`` (in order) that has ``<name>.<driver version>``
  for each name of ``DRIVER_LIBRARIES``; the driver version is NVML's
  (``nvmlSystemGetDriverVersion``) or, without NVML, the highest ``libcuda.so.<version>`` found.
  Its link names are the symbolic links in the same directory that resolve to the same file
  (``libcuda.so.1``, ``libcuda.so``), plus the soname the driver installs (``libcuda.so.1``,
  ``libnvidia-nvvm.so.4``, :data:`SONAMES`) when the directory lacks that link.
* Binaries: the first of ``binary_dirs`` that has each of ``DRIVER_BINARIES``.
* The toolkit's spec: a ``*.yaml``/``*.yml``/``*.json`` file of ``toolkit_dirs`` (``/etc/cdi``
  and ``/var/run/cdi``) whose ``kind`` is ``nvidia.com/gpu``; a file that cannot be read is
  logged and skipped.
"""

from __future__ import annotations

import json
import logging
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpushare.deviceplugin.cdi import (
    CONTROL_NODES,
    DRIVER_BINARIES,
    DRIVER_LIBRARIES,
    REQUIRED_LIBRARIES,
    SPEC_FILE_NAME,
    TOOLKIT_KIND,
    CdiChoice,
    CdiMode,
    DeviceNode,
    DriverLibrary,
    GpuNode,
    NodeDriver,
    ToolkitSpec,
    choose_cdi,
    gpu_spec,
)

__all__ = [
    "DEFAULT_BINARY_DIRS",
    "DEFAULT_LIBRARY_DIRS",
    "DEFAULT_TOOLKIT_DIRS",
    "SONAMES",
    "CdiPaths",
    "find_driver",
    "find_toolkit_spec",
    "is_character_device",
    "node_gpu_cdi",
    "write_spec",
]

log = logging.getLogger(__name__)

DEFAULT_LIBRARY_DIRS = (
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/usr/lib64"),
    Path("/usr/local/nvidia/lib64"),
    Path("/usr/local/nvidia/lib"),
)
DEFAULT_BINARY_DIRS = (Path("/usr/bin"), Path("/usr/local/nvidia/bin"))
DEFAULT_TOOLKIT_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
SONAMES = {"libnvidia-nvvm.so": "libnvidia-nvvm.so.4"}
"""The soname of a library when it is not ``<name>.1`` (``libnvidia-gpucomp.so`` and the
``pkcs11`` ones carry the full version in theirs: none added)."""
_FULL_VERSION_SONAME = (
    "libnvidia-gpucomp.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
)
_VERSION = re.compile(r"\d+(\.\d+)+")


def is_character_device(path: Path) -> bool:
    """Whether ``path`` is a character device (not following a missing path: False)."""
    try:
        return stat.S_ISCHR(path.stat().st_mode)
    except OSError:
        return False


@dataclass(frozen=True, slots=True)
class CdiPaths:
    """Where the driver is looked for (module doc): ``dev_root`` (host path of ``/dev``),
    ``library_dirs`` and ``binary_dirs`` in search order, ``toolkit_dirs`` for the toolkit's
    spec, ``spec_dir`` where gpushare's spec is written (``--cdi-dir``)."""

    dev_root: Path = Path("/dev")
    library_dirs: tuple[Path, ...] = DEFAULT_LIBRARY_DIRS
    binary_dirs: tuple[Path, ...] = DEFAULT_BINARY_DIRS
    toolkit_dirs: tuple[Path, ...] = DEFAULT_TOOLKIT_DIRS
    spec_dir: Path = Path("/var/run/cdi")

    @property
    def spec_path(self) -> Path:
        return self.spec_dir / SPEC_FILE_NAME


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def _installed_version(library_dirs: Iterable[Path]) -> str | None:
    """The highest ``libcuda.so.<version>`` among ``library_dirs``."""
    found = []
    for directory in library_dirs:
        try:
            entries = list(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            suffix = entry.name.removeprefix("libcuda.so.")
            if suffix != entry.name and _VERSION.fullmatch(suffix) and entry.is_file():
                found.append(suffix)
    return max(found, key=_version_key, default=None)


def _library(name: str, version: str, library_dirs: Iterable[Path]) -> DriverLibrary | None:
    for directory in library_dirs:
        path = directory / f"{name}.{version}"
        if not path.is_file():
            continue
        target = path.resolve()
        names = [path.name]
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            entries = []
        for entry in entries:
            if entry.name.startswith(name) and entry.is_symlink() and entry.name != path.name:
                try:
                    if entry.resolve() == target:
                        names.append(entry.name)
                except OSError:
                    continue
        soname = SONAMES.get(name, f"{name}.1")
        if name not in _FULL_VERSION_SONAME and soname not in names:
            names.append(soname)
        return DriverLibrary(str(target), tuple(names))
    return None


def find_driver(
    gpus: Sequence[tuple[int, int, str]],
    paths: CdiPaths,
    *,
    driver_version: str | None = None,
    is_device: Callable[[Path], bool] = is_character_device,
) -> NodeDriver | str:
    """The driver of ``gpus`` (``(index, minor, UUID)``) as the node has it under ``paths``
    (module doc), or why it cannot serve: the first thing missing, naming the path looked at.
    ``driver_version`` is NVML's (``None``: the highest ``libcuda.so.<version>`` found)."""
    dev = paths.dev_root
    if not is_device(dev / "nvidiactl"):
        return f"no NVIDIA device node {dev / 'nvidiactl'}"
    gpu_nodes = []
    for index, minor, uuid in gpus:
        node = dev / f"nvidia{minor}"
        if not is_device(node):
            return f"no device node {node} for GPU {index} ({uuid})"
        gpu_nodes.append(GpuNode(index, uuid, DeviceNode(f"/dev/nvidia{minor}", str(node))))
    control = tuple(
        DeviceNode(f"/dev/{name}", str(dev / name))
        for name in CONTROL_NODES
        if is_device(dev / name)
    )
    dirs = paths.library_dirs
    version = driver_version or _installed_version(dirs)
    shown = ", ".join(map(str, dirs))
    if version is None:
        return f"no libcuda.so.<driver version> in {shown}"
    libraries = []
    for name in DRIVER_LIBRARIES:
        library = _library(name, version, dirs)
        if library is not None:
            libraries.append(library)
        elif name in REQUIRED_LIBRARIES:
            return f"no {name}.{version} (driver {version}) in {shown}"
    binaries = []
    for name in DRIVER_BINARIES:
        for directory in paths.binary_dirs:
            if (directory / name).is_file():
                binaries.append(str(directory / name))
                break
    return NodeDriver(version, tuple(gpu_nodes), control, tuple(libraries), tuple(binaries))


def _spec_devices(document: Any) -> frozenset[str] | None:
    """The device names of a CDI spec of the toolkit's kind, else ``None``."""
    if not isinstance(document, Mapping) or document.get("kind") != TOOLKIT_KIND:
        return None
    devices = document.get("devices")
    if not isinstance(devices, list):
        return frozenset()
    return frozenset(
        str(d["name"]) for d in devices if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    )


def find_toolkit_spec(dirs: Iterable[Path]) -> ToolkitSpec | None:
    """The first spec of kind ``nvidia.com/gpu`` in ``dirs`` (file names in order), or
    ``None``. A file that cannot be read or parsed is logged and skipped."""
    for directory in dirs:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.suffix not in (".yaml", ".yml", ".json") or not entry.is_file():
                continue
            try:
                text = entry.read_text(encoding="utf-8")
                document = json.loads(text) if entry.suffix == ".json" else yaml.safe_load(text)
            except (OSError, ValueError, yaml.YAMLError) as error:
                log.warning("CDI spec %s cannot be read, left out: %s", entry, error)
                continue
            names = _spec_devices(document)
            if names is not None:
                return ToolkitSpec(str(entry), names)
    return None


def write_spec(path: Path, spec: Mapping[str, Any]) -> None:
    """``spec`` as JSON at ``path``, replaced in one rename (the runtime never reads half);
    ``OSError`` when the directory cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".gpushare-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as handle:
            json.dump(spec, handle, indent=1)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def node_gpu_cdi(
    mode: CdiMode,
    gpus: Sequence[tuple[int, int, str]],
    paths: CdiPaths,
    *,
    driver_version: str | None = None,
    is_device: Callable[[Path], bool] = is_character_device,
) -> CdiChoice:
    """What ``--cdi`` ``mode`` comes to for ``gpus`` (``(index, minor, UUID)``) on this node
    (``gpushare.deviceplugin.cdi.choose_cdi``), with gpushare's spec written (atomically,
    again at every start) when it is the choice. ``CdiError`` when ``toolkit`` or
    ``gpushare`` is asked of a node that lacks it; ``OSError`` when the spec cannot be
    written."""
    if mode is CdiMode.OFF:
        return choose_cdi(mode, toolkit=None, driver=None, driver_missing="", spec_path="")
    toolkit = None if mode is CdiMode.GPUSHARE else find_toolkit_spec(paths.toolkit_dirs)
    found: NodeDriver | str = "the toolkit's spec is used"
    if toolkit is None and mode is not CdiMode.TOOLKIT:
        found = find_driver(gpus, paths, driver_version=driver_version, is_device=is_device)
    driver = found if isinstance(found, NodeDriver) else None
    missing = found if isinstance(found, str) else ""
    choice = choose_cdi(
        mode, toolkit=toolkit, driver=driver, driver_missing=missing,
        spec_path=str(paths.spec_path),
    )  # fmt: skip
    if choice.write and driver is not None:
        write_spec(paths.spec_path, gpu_spec(driver))
    log.info("CDI: %s", choice.reason)
    return choice
