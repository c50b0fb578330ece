"""How a container gets a real NVIDIA GPU without the NVIDIA container toolkit: CDI (the Container
Device Interface, spec version 0.6.0, what containerd 1.7.2+ with ``enable_cdi``, 2.x and CRI-O
read from their ``cdi_spec_dirs``). Pure: no I/O; the files and device nodes come from
``gpushare.deviceplugin.cdifiles``, which reads the node and writes the spec.

**The spec** (:func:`gpu_spec`, kind :data:`GPUSHARE_KIND`, written as :data:`SPEC_FILE_NAME`)
names each GPU twice, by index and by UUID (``gpushare.io/nvidia-gpu=0``,
``gpushare.io/nvidia-gpu=GPU-<uuid>``), and ``all``; each device carries its ``/dev/nvidiaN``
node. What every GPU container needs besides is in the spec's ``containerEdits``, applied
once whichever of its devices a container names:

* the control nodes :data:`CONTROL_NODES` found on the node (``/dev/nvidiactl`` always;
  ``nvidia-uvm``, ``nvidia-uvm-tools``, ``nvidia-modeset`` where present: a node without UVM
  loaded gets none rather than a spec the runtime refuses);
* the driver's user-space libraries of :data:`DRIVER_LIBRARIES`, the compute and utility
  libraries the NVIDIA container toolkit gives a headless CUDA container (``nvidia-ctk cdi
  generate`` and libnvidia-container's "compute" and "utility" lists: ``libcuda``,
  ``libnvidia-ml``, the PTX JIT compiler, NVVM, the debugger, OpenCL, ...; no graphics,
  video or display libraries), each the file of the driver's version
  (``libcuda.so.<driver version>``), read-only;
* the binaries of :data:`DRIVER_BINARIES` found (``nvidia-smi``, the MPS control daemon and
  server, ...), read-only at ``/usr/bin/<name>``, on every image's ``PATH``;
* ``LD_LIBRARY_PATH`` (:data:`LIBRARY_PATH`).

**Why one directory and ``LD_LIBRARY_PATH``.** The toolkit mounts the libraries where the host
has them (``/usr/lib/x86_64-linux-gnu/...``) and then runs a CDI *hook* (``nvidia-cdi-hook
update-ldcache`` and ``create-symlinks``) that rebuilds the container's ``ld.so.cache`` and
makes the ``.so.1`` links. A hook is a program on the node run by the runtime; without the
toolkit there is none, and a library mounted into ``/usr/lib/x86_64-linux-gnu`` is found only on
Debian-family images (glibc's built-in search path there) and never on images whose cache
predates it. So every library file is mounted into one directory, :data:`CONTAINER_LIB_DIR`,
under its own name and under each of its link names (``libcuda.so.1``, ``libcuda.so``,
``libnvidia-nvvm.so.4``: the sonames programs ``dlopen``; CDI has no symlink edit, so each name
is a second read-only bind mount of the same file), and ``LD_LIBRARY_PATH`` names that
directory: the dynamic linker searches it before the cache, on glibc and musl alike. A CDI env
edit replaces a variable of the same name (the image's and the pod's), so the value keeps,
after gpushare's directory, ``/usr/local/nvidia/lib:/usr/local/nvidia/lib64``, what NVIDIA's
CUDA images set; an image that relies on other entries of its own ``LD_LIBRARY_PATH`` must
list them in ``/etc/ld.so.conf`` instead.

**Which devices Allocate and the DRA driver name** (:class:`GpuCdi`, chosen by
:func:`choose_cdi` from ``--cdi``, :class:`CdiMode`): the toolkit's own spec when the node has
one (kind :data:`TOOLKIT_KIND`, ``/etc/cdi/nvidia.yaml`` or ``/var/run/cdi/nvidia*``: its
device names, gpushare writes nothing), else gpushare's spec when the node has the NVIDIA
device nodes, else none (the container gets the GPU only through ``NVIDIA_VISIBLE_DEVICES`` and
a default NVIDIA runtime, as before CDI). A GPU is named by UUID when the spec has that name,
else by index.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CDI_VERSION",
    "CONTAINER_BIN_DIR",
    "CONTAINER_LIB_DIR",
    "CONTROL_NODES",
    "DRIVER_BINARIES",
    "DRIVER_LIBRARIES",
    "GPUSHARE_KIND",
    "LIBRARY_PATH",
    "REQUIRED_LIBRARIES",
    "SPEC_FILE_NAME",
    "TOOLKIT_KIND",
    "CdiChoice",
    "CdiError",
    "CdiMode",
    "DeviceNode",
    "DriverLibrary",
    "GpuCdi",
    "GpuNode",
    "NodeDriver",
    "ToolkitSpec",
    "choose_cdi",
    "gpu_spec",
    "gpushare_cdi",
]

CDI_VERSION = "0.6.0"
"""The CDI specification version written (as ``gpushare.dra.prepare`` writes claims')."""
GPUSHARE_KIND = "gpushare.io/nvidia-gpu"
"""The kind (``vendor/class``) of gpushare's GPU devices."""
TOOLKIT_KIND = "nvidia.com/gpu"
"""The kind of the NVIDIA container toolkit's devices (``nvidia-ctk cdi generate``)."""
SPEC_FILE_NAME = "gpushare.io-nvidia-gpu.json"
"""gpushare's GPU spec in the CDI directory."""
CONTAINER_LIB_DIR = "/usr/local/gpushare/nvidia/lib64"
"""Where a container finds the driver's libraries (module doc)."""
CONTAINER_BIN_DIR = "/usr/bin"
"""Where a container finds the driver's binaries."""
LIBRARY_PATH = f"{CONTAINER_LIB_DIR}:/usr/local/nvidia/lib:/usr/local/nvidia/lib64"
"""The container's ``LD_LIBRARY_PATH`` (module doc: why the CUDA images' entries follow)."""
CONTROL_NODES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
"""The driver's control device nodes under ``/dev``; ``nvidiactl`` is required."""
DRIVER_LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-cfg.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-opencl.so",
    "libnvidia-allocator.so",
    "libnvidia-pkcs11.so",
    "libnvidia-pkcs11-openssl3.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-compiler.so",
)
"""The compute and utility libraries (module doc), by the name before the version suffix;
``libcuda.so`` and ``libnvidia-ml.so`` are required, the others taken where present (older
drivers have ``fatbinaryloader`` and ``compiler``, newer ones ``nvvm`` and ``gpucomp``)."""
REQUIRED_LIBRARIES = ("libcuda.so", "libnvidia-ml.so")
"""The libraries without which gpushare writes no spec."""
DRIVER_BINARIES = (
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
)
"""The driver's binaries mounted where present."""

_READ_ONLY = ["ro", "nosuid", "nodev", "bind"]


class CdiError(ValueError):
    """A CDI spec that cannot serve: the message names the spec, the value and the fix."""


class CdiMode(enum.StrEnum):
    """``--cdi``: how GPU containers get their GPU (module doc)."""

    AUTO = "auto"
    """The toolkit's spec if the node has one, else gpushare's if the node has the device
    nodes, else none."""
    OFF = "off"
    """No CDI devices: ``NVIDIA_VISIBLE_DEVICES`` for a default NVIDIA runtime (as before)."""
    TOOLKIT = "toolkit"
    """The toolkit's spec; refused at start when the node has none."""
    GPUSHARE = "gpushare"
    """gpushare's spec; refused at start when the node lacks the device nodes or driver."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    """A device node: ``path`` in the container, ``host_path`` on the node (the same on a real
    node; a stand-in's elsewhere)."""

    path: str
    host_path: str

    def edit(self) -> dict[str, str]:
        """The CDI ``deviceNodes`` entry (type, major and minor read from ``hostPath`` by the
        runtime)."""
        return {"path": self.path, "hostPath": self.host_path}


@dataclass(frozen=True, slots=True)
class GpuNode:
    """GPU ``index`` (``uuid``) and its ``/dev/nvidia<minor>`` ``node``."""

    index: int
    uuid: str
    node: DeviceNode


@dataclass(frozen=True, slots=True)
class DriverLibrary:
    """One library file on the node, ``host_path``, and the ``names`` a container finds it
    by in :data:`CONTAINER_LIB_DIR`: its own file name first, then its link names."""

    host_path: str
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class NodeDriver:
    """What the node has of the NVIDIA driver (``gpushare.deviceplugin.cdifiles.find_driver``):
    its ``version``, the ``gpus``' device nodes, the ``control_nodes`` present, the
    ``libraries`` of that version and the ``binaries`` (host paths)."""

    version: str
    gpus: tuple[GpuNode, ...]
    control_nodes: tuple[DeviceNode, ...]
    libraries: tuple[DriverLibrary, ...]
    binaries: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ToolkitSpec:
    """A CDI spec of the toolkit's kind found on the node: its file ``path`` and the device
    ``names`` it defines."""

    path: str
    names: frozenset[str]


@dataclass(frozen=True, slots=True)
class GpuCdi:
    """The CDI devices GPU containers are given: of ``kind``, among ``names``, from the spec
    at ``source`` (a file, for messages)."""

    kind: str
    names: frozenset[str]
    source: str

    def ids(self, gpus: Iterable[tuple[int, str]]) -> list[str]:
        """The fully qualified CDI device names (``kind=name``) of ``gpus``, ``(index, UUID)``
        in the order given: each GPU's UUID when the spec names it, else its index.
        ``CdiError`` naming the GPU and the spec when it has neither."""
        found = []
        for index, uuid in gpus:
            if uuid in self.names:
                found.append(f"{self.kind}={uuid}")
            elif str(index) in self.names:
                found.append(f"{self.kind}={index}")
            else:
                raise CdiError(
                    f"GPU {index} ({uuid}) is not a device of CDI spec {self.source} (kind "
                    f"{self.kind}, devices {', '.join(sorted(self.names)) or 'none'}): the spec "
                    "is stale; write it again (nvidia-ctk cdi generate, or restart gpushare)"
                )
        return found


@dataclass(frozen=True, slots=True)
class CdiChoice:
    """What ``--cdi`` comes to on this node: ``cdi`` (``None``: no CDI devices), whether
    gpushare writes its spec (``write``) and the ``reason``, for the log."""

    cdi: GpuCdi | None
    write: bool
    reason: str


def _lib_mounts(library: DriverLibrary) -> list[dict[str, Any]]:
    return [
        {
            "hostPath": library.host_path,
            "containerPath": f"{CONTAINER_LIB_DIR}/{name}",
            "options": list(_READ_ONLY),
        }
        for name in library.names
    ]


def gpu_spec(driver: NodeDriver) -> dict[str, Any]:
    """gpushare's CDI spec of ``driver``'s GPUs (module doc): the devices ``<index>``,
    ``<UUID>`` and ``all``, and the common edits (control nodes, libraries, binaries,
    ``LD_LIBRARY_PATH``). A JSON-ready mapping."""
    devices: list[dict[str, Any]] = []
    for gpu in sorted(driver.gpus, key=lambda g: g.index):
        edits = {"deviceNodes": [gpu.node.edit()]}
        devices.append({"name": str(gpu.index), "containerEdits": edits})
        devices.append({"name": gpu.uuid, "containerEdits": edits})
    if driver.gpus:
        devices.append(
            {
                "name": "all",
                "containerEdits": {
                    "deviceNodes": [
                        g.node.edit() for g in sorted(driver.gpus, key=lambda g: g.index)
                    ]
                },
            }
        )
    mounts = [m for library in driver.libraries for m in _lib_mounts(library)]
    mounts += [
        {
            "hostPath": binary,
            "containerPath": f"{CONTAINER_BIN_DIR}/{binary.rsplit('/', 1)[-1]}",
            "options": list(_READ_ONLY),
        }
        for binary in driver.binaries
    ]
    common: dict[str, Any] = {
        "env": [f"LD_LIBRARY_PATH={LIBRARY_PATH}"],
        "deviceNodes": [node.edit() for node in driver.control_nodes],
    }
    if mounts:
        common["mounts"] = mounts
    return {
        "cdiVersion": CDI_VERSION,
        "kind": GPUSHARE_KIND,
        "devices": devices,
        "containerEdits": common,
    }


def gpushare_cdi(driver: NodeDriver, spec_path: str) -> GpuCdi:
    """The devices of gpushare's spec of ``driver``, written at ``spec_path``."""
    names = {str(g.index) for g in driver.gpus} | {g.uuid for g in driver.gpus}
    return GpuCdi(GPUSHARE_KIND, frozenset(names | {"all"}), spec_path)


def choose_cdi(
    mode: CdiMode,
    *,
    toolkit: ToolkitSpec | None,
    driver: NodeDriver | None,
    driver_missing: str,
    spec_path: str,
) -> CdiChoice:
    """What ``mode`` comes to (module doc) on a node with the toolkit's spec ``toolkit``
    (``None``: none found) and the driver found, ``driver`` (``None``: not usable, for the
    reason ``driver_missing``); gpushare's spec would be written at ``spec_path``.
    ``CdiError`` for ``toolkit`` or ``gpushare`` asked of a node that lacks it, naming what
    is missing and the other choices."""
    if mode is CdiMode.OFF:
        return CdiChoice(None, False, "--cdi off: GPUs through NVIDIA_VISIBLE_DEVICES only")
    if mode is CdiMode.TOOLKIT or (mode is CdiMode.AUTO and toolkit is not None):
        if toolkit is None:
            raise CdiError(
                f"--cdi toolkit: no CDI spec of kind {TOOLKIT_KIND} on this node (write one "
                "with nvidia-ctk cdi generate, or use --cdi gpushare or auto)"
            )
        return CdiChoice(
            GpuCdi(TOOLKIT_KIND, toolkit.names, toolkit.path),
            False,
            f"the NVIDIA container toolkit's CDI spec {toolkit.path}",
        )
    if driver is None:
        if mode is CdiMode.GPUSHARE:
            raise CdiError(
                f"--cdi gpushare: {driver_missing} (use --cdi off on a node without NVIDIA "
                "GPUs, or point --cdi-dev-root, --cdi-library-dirs at the driver)"
            )
        return CdiChoice(None, False, f"no CDI devices: {driver_missing}")
    return CdiChoice(
        gpushare_cdi(driver, spec_path),
        True,
        f"gpushare's CDI spec {spec_path} (driver {driver.version}, {len(driver.gpus)} GPU(s), "
        f"{len(driver.libraries)} libraries, {len(driver.binaries)} binaries)",
    )
