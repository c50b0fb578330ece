"""How the device plugin and the DRA driver hold a shared container to its share and show it
the share (docs/share-view.md; the backends and what a pod is told: ``gpushare.core.isolation``).

* :func:`install_library`: the share-view library (``libgpushare-share.so``, shipped in the
  image at :data:`IMAGE_LIBRARY`) copied into a host directory kubelet can mount from, under a
  name made of its content's hash (a container running an older copy keeps it).
* :func:`installed_library`: the same from the flags (``--share-library``, else the image's
  copy; ``--share-library-dir``), logging rather than failing: without it containers see the
  whole GPU.
* :func:`share_edits`: what a shared container gets for a backend: environment variables and
  mounts, the same for Allocate (``gpushare.deviceplugin.allocate``) and the DRA driver's CDI
  spec (``gpushare.dra.prepare``):

  - the view (the library installed): read-only mounts of the library at
    :data:`CONTAINER_LIBRARY` and of a one-line ``/etc/ld.so.preload`` naming it (glibc's
    dynamic linker then loads it into every dynamically linked process; a static binary, or a
    musl image whose linker does not read the file, is left as it is, where ``LD_PRELOAD``
    of a glibc library would stop a musl program at start), and ``GPUSHARE_SHARE_MIB``
    (``<uuid>=<MiB>`` per GPU, comma separated);
  - ``library``: also ``GPUSHARE_SHARE_ENFORCE=1`` (the library refuses allocations past the
    share);
  - ``driver``: ``NVIDIA_GPU_MEMORY_LIMIT`` and ``NVIDIA_GPU_MEMORY_REQUEST`` (MiB, the share
    of one GPU), which the NVIDIA container toolkit's CDI hook ``apply-cuda-memory-limits``
    applies to the container's cgroup through NVML (nvidia-container-toolkit, driver r615+);
  - ``mps``: nothing here (the MPS variables come from ``mps_envs``, with ``--mps``).

A whole GPU gets none of it: the container has the card.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpushare.core.isolation import Available, Choice, Enforcement, Isolation, choose
from gpushare.deviceplugin.nvml import Nvml

__all__ = [
    "CONTAINER_LIBRARY",
    "CONTAINER_PRELOAD",
    "IMAGE_LIBRARY",
    "LIBRARY_NAME",
    "Mount",
    "NodeIsolation",
    "ShareEdits",
    "ShareLibrary",
    "install_library",
    "installed_library",
    "node_isolation",
    "share_edits",
]

log = logging.getLogger(__name__)

LIBRARY_NAME = "libgpushare-share.so"
IMAGE_LIBRARY = Path("/opt/gpushare/lib") / LIBRARY_NAME
"""Where the image has the library (the Dockerfile builds it from ``native/share``)."""
CONTAINER_LIBRARY = Path("/usr/local/gpushare/lib") / LIBRARY_NAME
"""Where a shared container finds it (mounted read-only)."""
CONTAINER_PRELOAD = Path("/etc/ld.so.preload")
"""The dynamic linker's list of libraries to load first (glibc, ``ld.so(8)``)."""


@dataclass(frozen=True, slots=True)
class ShareLibrary:
    """The library installed on the node: ``host_path`` and the preload list naming it where
    containers see it, ``preload_path`` (what kubelet mounts)."""

    host_path: Path
    preload_path: Path


@dataclass(frozen=True, slots=True)
class Mount:
    """A read-only bind mount of ``host_path`` at ``container_path``."""

    host_path: str
    container_path: str


@dataclass(frozen=True, slots=True)
class ShareEdits:
    """What a shared container gets (module doc): ``envs`` and ``mounts``."""

    envs: dict[str, str]
    mounts: tuple[Mount, ...] = ()


def install_library(source: Path, directory: Path) -> ShareLibrary:
    """Copy ``source`` into ``directory`` as ``libgpushare-share-<sha256[:16]>.so`` (module
    doc), with ``ld.so.preload`` beside it naming :data:`CONTAINER_LIBRARY`, each atomically
    (a temporary file renamed); an existing copy with that name is kept.
    Raises ``OSError`` naming the path when ``source`` cannot be read or ``directory`` written.
    """
    data = source.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    target = directory / f"libgpushare-share-{digest}.so"
    preload = directory / "ld.so.preload"
    directory.mkdir(parents=True, exist_ok=True)
    if not (target.is_file() and target.stat().st_size == len(data)):
        _write_atomically(target, data, 0o755)
    listed = f"{CONTAINER_LIBRARY}\n".encode()
    if not (preload.is_file() and preload.read_bytes() == listed):
        _write_atomically(preload, listed, 0o644)
    return ShareLibrary(target, preload)


def _write_atomically(target: Path, data: bytes, mode: int) -> None:
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".install-")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.chmod(temporary, mode)
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def share_edits(
    shares_mib: Sequence[tuple[str, int]],
    isolation: Isolation,
    library: ShareLibrary | None,
) -> ShareEdits:
    """The edits of a shared container (module doc) holding ``shares_mib``, ``(GPU UUID, MiB)``
    per GPU in index order, on a node whose GPUs are held as ``isolation``."""
    envs: dict[str, str] = {}
    mounts: tuple[Mount, ...] = ()
    if not shares_mib:
        return ShareEdits(envs)
    if isolation.view and library is not None:
        envs["GPUSHARE_SHARE_MIB"] = ",".join(f"{uuid}={mib}" for uuid, mib in shares_mib)
        mounts = (
            Mount(str(library.host_path), str(CONTAINER_LIBRARY)),
            Mount(str(library.preload_path), str(CONTAINER_PRELOAD)),
        )
        if isolation.enforcement is Enforcement.LIBRARY:
            envs["GPUSHARE_SHARE_ENFORCE"] = "1"
    if isolation.enforcement is Enforcement.DRIVER:
        limit = str(max(mib for _, mib in shares_mib))
        envs["NVIDIA_GPU_MEMORY_LIMIT"] = limit
        envs["NVIDIA_GPU_MEMORY_REQUEST"] = limit
    return ShareEdits(envs, mounts)


def installed_library(source: Path | None, directory: Path | None) -> ShareLibrary | None:
    """The share-view library installed into host ``directory`` from ``source``
    (``--share-library``; ``None``: the image's copy), or ``None``: no ``directory`` asked, no
    library there, or the directory cannot be written (logged: containers then see the whole
    GPU)."""
    if directory is None:
        return None
    if source is None:
        source = IMAGE_LIBRARY
    if not source.is_file():
        log.warning("no share-view library at %s: shared containers see the whole GPU", source)
        return None
    try:
        installed = install_library(source, directory)
    except OSError as error:
        log.error(
            "installing the share-view library into %s: %s: shared containers see the whole "
            "GPU", directory, error,
        )  # fmt: skip
        return None
    log.info("share-view library %s installed as %s", source, installed.host_path)
    return installed


class NodeIsolation:
    """The node's isolation now: what it has (``available``, the installed ``library``), the
    backend chosen (``choice``: ``gpushare.core.isolation.choose``, again on every node
    configuration) and whether the configuration requires an enforced share (``required``).
    """

    def __init__(self, available: Available, library: ShareLibrary | None = None) -> None:
        self.available = available
        self.library = library
        self.choice: Choice = choose(available)
        self.required = False
        self._asked: tuple[Enforcement | None, bool] = (None, False)

    @property
    def isolation(self) -> Isolation:
        """How the node's GPUs hold and show shares (what the inventory publishes)."""
        return self.choice.isolation

    def configure(self, wanted: Enforcement | None, required: bool) -> None:
        """Choose again for the node configuration's ``enforcement`` and
        ``requireEnforcement`` (nothing happens when they did not change)."""
        if self._asked == (wanted, required):
            return
        self._asked = (wanted, required)
        self.choice = choose(self.available, wanted)
        self.required = required
        if self.choice.missing:
            log.warning(
                "enforcement %s asked by the node configuration is not available: %s; shares "
                "are %s", wanted, self.choice.missing, self.isolation.said(),
            )  # fmt: skip

    def refusal(self) -> str:
        """Why a shared container is refused now (``""``: it is not)."""
        return self.choice.refusal(self.required)

    def edits(self, shares_mib: Sequence[tuple[str, int]]) -> ShareEdits:
        """``share_edits`` for a shared container holding ``shares_mib`` on this node."""
        return share_edits(shares_mib, self.isolation, self.library)


def node_isolation(*, mps: bool, nvml: Nvml | None, library: ShareLibrary | None) -> NodeIsolation:
    """The isolation of a node with MPS on or off (``mps``), NVML (``None``: declared GPUs,
    no driver) and the installed ``library``."""
    driver_missing = nvml.driver_memory_limits() if nvml is not None else "no NVML (declared GPUs)"
    return NodeIsolation(Available(mps, driver_missing, library is not None), library)
