"""How a share is held and shown inside a container: the enforcement backend a node uses, the
view of the share, and what is said per pod (docs/share-view.md, "Enforcement backends").
Pure; no I/O.

A node's device plugin finds which backends its GPUs have (:class:`Available`) and picks one
with :func:`choose` (the node configuration's ``enforcement``, else the best there is), in this
order of strength:

* ``mps``: NVIDIA MPS pins each client's device memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``)
  and its compute (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``); on when the device plugin runs with
  ``--mps`` or ``--mps-managed``. A process that rewrites its own variables gets more.
* ``driver``: the NVIDIA driver's memory limit per cgroup (NVML ``SetMemoryLimits_v1``, driver
  r615+ / CUDA 13.4), applied by the NVIDIA container toolkit's CDI hook from
  ``NVIDIA_GPU_MEMORY_LIMIT`` and ``NVIDIA_GPU_MEMORY_REQUEST`` (MiB); memory only.
* ``library``: the share-view library (``libgpushare-share.so``) refuses allocations past the
  share: advisory, code inside the process that a program can go around.
* ``none``: nothing holds a container to its share.

Independently the share-view library, where the node has it, makes CUDA and NVML report the
share (``view``). What a pod is told (:meth:`Isolation.said`): ``enforced (mps)``,
``enforced (driver)``, ``advisory (library)``, ``view only`` or ``none``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Available", "Choice", "Enforcement", "Isolation", "choose"]


class Enforcement(enum.StrEnum):
    """The backend that holds a container to its memory share (module doc), strongest first."""

    MPS = "mps"
    DRIVER = "driver"
    LIBRARY = "library"
    NONE = "none"

    @property
    def enforced(self) -> bool:
        """Whether the share holds against the container's own processes (``mps``,
        ``driver``)."""
        return self in (Enforcement.MPS, Enforcement.DRIVER)


@dataclass(frozen=True, slots=True)
class Isolation:
    """How one GPU's shares are held (``enforcement``) and whether a container sees its share
    (``view``: the share-view library is given to shared containers)."""

    enforcement: Enforcement
    view: bool

    def said(self) -> str:
        """What a pod sharing this GPU is told: ``enforced (mps)``, ``enforced (driver)``,
        ``advisory (library)``, ``view only`` (the library shows the share, nothing holds it)
        or ``none``."""
        if self.enforcement.enforced:
            return f"enforced ({self.enforcement})"
        if self.enforcement is Enforcement.LIBRARY:
            return "advisory (library)"
        return "view only" if self.view else "none"


@dataclass(frozen=True, slots=True)
class Available:
    """What a node has: ``mps`` (the device plugin sets MPS limits), ``driver`` (why not, or
    ``""`` when the driver can limit memory per cgroup), ``library`` (the share-view library is
    installed for containers)."""

    mps: bool = False
    driver_missing: str = "not detected"
    library: bool = False

    def missing(self, backend: Enforcement) -> str:
        """Why ``backend`` is not available here (``""`` when it is)."""
        if backend is Enforcement.MPS and not self.mps:
            return "MPS is off (the device plugin runs without --mps or --mps-managed)"
        if backend is Enforcement.DRIVER and self.driver_missing:
            return f"the driver cannot limit memory per container: {self.driver_missing}"
        if backend is Enforcement.LIBRARY and not self.library:
            return "the share-view library is not installed (--share-library-dir)"
        return ""


@dataclass(frozen=True, slots=True)
class Choice:
    """The backend :func:`choose` picked and, when a wanted one is not available, why
    (``missing``, ``""`` otherwise); ``isolation`` is what the node's GPUs publish."""

    isolation: Isolation
    missing: str = ""

    def refusal(self, required: bool) -> str:
        """Why a shared container is refused on a node that ``required`` enforcement
        (``""`` when it is not refused)."""
        if not required or self.isolation.enforcement.enforced:
            return ""
        why = self.missing or "no backend that enforces a share is available"
        return (
            f"the node requires an enforced share (node config requireEnforcement) and has "
            f"{self.isolation.said()}: {why}"
        )


def choose(available: Available, wanted: Enforcement | None = None) -> Choice:
    """The backend for a node with ``available``: ``wanted`` (the node configuration's
    ``enforcement``) when it is there, else ``none`` with the reason; with nothing wanted, the
    strongest available (module doc's order). The view is on wherever the library is."""
    view = available.library
    if wanted is not None:
        missing = available.missing(wanted)
        backend = Enforcement.NONE if missing else wanted
        return Choice(Isolation(backend, view), missing)
    for backend in (Enforcement.MPS, Enforcement.DRIVER, Enforcement.LIBRARY):
        if not available.missing(backend):
            return Choice(Isolation(backend, view))
    return Choice(Isolation(Enforcement.NONE, view))
