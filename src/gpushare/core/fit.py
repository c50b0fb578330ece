"""Fit checks: can a pod run on a node now, later, or never — with the numbers that say why.

Pure functions of a ``NodeState`` and a ``PodRequest``. Expected outcomes are values in three
kinds, after the scheduler framework's ``Unschedulable`` / ``UnschedulableAndUnresolvable``
(docs/design.md, "Failure semantics"; Kubernetes ``noderesources/fit.go`` ``Fits()``):

* ``FITS`` — the pod fits; ``assignment`` is a feasible GPU assignment (best fit per container);
* ``DOES_NOT_FIT_NOW`` — too little free right now (extender ``FailedNodes``);
* ``CAN_NEVER_FIT`` — not even an empty node would do (``FailedAndUnresolvableNodes``).

Multi-container pods are checked greedily: containers by decreasing share, each on the GPUs with
the least free that still fit (lowest index on ties). Greedy packing can miss a feasible
assignment in rare multi-container cases; it never claims a fit that does not exist.

A GPU takes a container when it has the memory (``gpu_share``) free and, for a container that
asks compute, the compute (``compute_milli``) too; a container asking whole GPUs
(``exclusive``) takes only GPUs that hold nothing (``NodeState.is_unused``) and records each of
them whole; a GPU held whole takes nothing else (docs/compute.md). Reasons for the second
dimension carry its numbers (``compute_free_per_gpu``, shown only for pods that ask compute or
whole GPUs, so other pods' reasons read as before).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    ContainerAllocation,
    ContainerRequest,
    NodeState,
    PodRequest,
)


class FitStatus(enum.Enum):
    """The three outcomes of a fit check."""

    FITS = "fits"
    DOES_NOT_FIT_NOW = "does-not-fit-now"
    CAN_NEVER_FIT = "can-never-fit"


class Reason(enum.StrEnum):
    """Fixed reason texts; the numbers live in ``FitResult`` fields, never in these strings."""

    FITS = "fits"
    NO_GPUS = "node has no GPUs"
    MODEL_EXCLUDED = "no GPU of an allowed model"
    SHARE_EXCEEDS_GPU = "request is larger than any GPU"
    TOO_FEW_GPUS = "node has fewer GPUs than requested"
    INSUFFICIENT_CPU = "insufficient cpu"
    INSUFFICIENT_MEMORY = "insufficient memory"
    INSUFFICIENT_GPU = "no GPU has enough free"
    INSUFFICIENT_COMPUTE = "no GPU has enough free compute"
    NO_UNUSED_GPU = "not enough GPUs that hold nothing for whole GPUs"
    UNHEALTHY = "not enough healthy GPUs"
    HANDSHAKE = "an equal pod bound here awaits its device-plugin start"


@dataclass(frozen=True, slots=True)
class FitResult:
    """Outcome of ``check_fit``.

    ``requested`` is the amount that failed (GPU units per GPU, milli-CPU or MiB, per
    ``reason``); ``free_per_gpu`` and ``capacity_per_gpu`` are the node's GPUs in position order.
    ``container`` names the container that failed, when one did. ``compute_free_per_gpu``:
    the free ``compute_milli`` per GPU position, set for pods that ask compute or whole GPUs
    (empty otherwise); for ``INSUFFICIENT_COMPUTE`` ``requested`` is compute_milli per GPU.
    """

    status: FitStatus
    reason: Reason
    requested: int = 0
    free_per_gpu: tuple[int, ...] = ()
    capacity_per_gpu: tuple[int, ...] = ()
    container: str | None = None
    available: int | None = None
    assignment: tuple[ContainerAllocation, ...] = ()
    compute_free_per_gpu: tuple[int, ...] = ()

    @property
    def fits(self) -> bool:
        """True when the pod fits now."""
        return self.status is FitStatus.FITS

    def describe(self) -> str:
        """One line for people: the reason followed by its numbers."""
        if self.fits:
            return "fits"
        parts = [str(self.reason)]
        if self.container is not None:
            parts.append(f"container {self.container}")
        parts.append(f"requested {self.requested}")
        if self.available is not None:
            parts.append(f"available {self.available}")
        if self.free_per_gpu:
            parts.append(describe_free_per_gpu(self.free_per_gpu, self.capacity_per_gpu))
        if self.compute_free_per_gpu:
            shown = ", ".join(str(max(f, 0)) for f in self.compute_free_per_gpu)
            parts.append(f"compute free per GPU {shown} (of {GPU_COMPUTE_MILLI})")
        return "; ".join(parts)


def describe_free_per_gpu(free: tuple[int, ...], capacity: tuple[int, ...]) -> str:
    """``free/capacity per GPU 4/16, 0/16``: the numbers every rejection message carries. A
    GPU charged above its capacity (a skipped pod, a preemption hold while its victims run)
    reads 0 free, not less: what is charged there says the rest."""
    pairs = ", ".join(f"{max(f, 0)}/{c}" for f, c in zip(free, capacity, strict=True))
    return f"free/capacity per GPU {pairs}"


GpuPicker = Callable[[list[int], tuple[str, ...], ContainerRequest], list[int] | None]
"""Chooses GPU positions for one container from the free list (per position) and models."""


def best_fit_positions(
    free: list[int], models: tuple[str, ...], container: ContainerRequest
) -> list[int] | None:
    """Positions of the ``gpu_count`` GPUs with the least free that still hold ``gpu_share``.

    Lowest position wins ties (Alibaba gpushare's binpack rule). ``free`` is per GPU position.
    Returns ``None`` when fewer than ``gpu_count`` allowed GPUs have enough free.
    """
    share = container.gpu_share
    restricted = bool(container.allowed_models or container.allowed_positions)
    candidates = [
        (amount, position)
        for position, amount in enumerate(free)
        if amount >= share and (not restricted or container.allows_at(position, models[position]))
    ]
    if len(candidates) < container.gpu_count:
        return None
    candidates.sort()
    return sorted(position for _, position in candidates[: container.gpu_count])


def best_fit_order(free: Sequence[int]) -> list[int]:
    """GPU positions in the order in which first fit chooses as ``best_fit_positions`` does:
    least free first, lowest position on ties. ``free`` is per GPU position (``NodeState.
    gpu_free``). Whatever one container asks (``gpu_share`` on ``gpu_count`` GPUs), the first
    ``gpu_count`` positions in this order that hold it are ``best_fit_positions``' answer. The
    DRA driver lists its devices in this order, as the allocator chooses first fit in a slice's
    device order (docs/dra.md, "Placement")."""
    return sorted(range(len(free)), key=lambda position: (free[position], position))


def check_fit(state: NodeState, pod: PodRequest) -> FitResult:
    """Whether ``pod`` fits ``state`` now, later, or never, with numbers (see module doc)."""
    node = state.node
    gpus = node.gpus
    capacity = node.capacities
    free = state.gpu_free
    gpu_containers = pod.gpu_containers
    two_dimensional = pod.two_dimensional
    compute_free = state.gpu_compute_free if two_dimensional else ()

    def fail(
        status: FitStatus,
        reason: Reason,
        requested: int,
        container: str | None = None,
        available: int | None = None,
    ) -> FitResult:
        return FitResult(
            status, reason, requested, free, capacity, container, available, (), compute_free
        )

    if gpu_containers and not gpus:
        return fail(FitStatus.CAN_NEVER_FIT, Reason.NO_GPUS, pod.gpu_total)
    for container in gpu_containers:
        allowed_capacity = (
            [gpu.capacity for p, gpu in enumerate(gpus) if container.allows_at(p, gpu.model)]
            if container.allowed_models or container.allowed_positions
            else capacity
        )
        if not allowed_capacity:
            return fail(
                FitStatus.CAN_NEVER_FIT, Reason.MODEL_EXCLUDED, container.gpu_share, container.name
            )
        if container.gpu_share > max(allowed_capacity):
            return fail(
                FitStatus.CAN_NEVER_FIT,
                Reason.SHARE_EXCEEDS_GPU,
                container.gpu_share,
                container.name,
                max(allowed_capacity),
            )
        large_enough = (
            1
            if container.gpu_count == 1
            else sum(1 for cap in allowed_capacity if cap >= container.gpu_share)
        )
        if container.gpu_count > large_enough:
            return fail(
                FitStatus.CAN_NEVER_FIT,
                Reason.TOO_FEW_GPUS,
                container.gpu_count,
                container.name,
                large_enough,
            )
    if node.cpu_milli is not None and pod.cpu_milli > 0:
        if pod.cpu_milli > node.cpu_milli:
            return fail(
                FitStatus.CAN_NEVER_FIT,
                Reason.INSUFFICIENT_CPU,
                pod.cpu_milli,
                None,
                node.cpu_milli,
            )
        cpu_free = node.cpu_milli - state.cpu_used_milli
        if pod.cpu_milli > cpu_free:
            return fail(
                FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_CPU, pod.cpu_milli, None, cpu_free
            )
    if node.memory_mib is not None and pod.memory_mib > 0:
        if pod.memory_mib > node.memory_mib:
            return fail(
                FitStatus.CAN_NEVER_FIT,
                Reason.INSUFFICIENT_MEMORY,
                pod.memory_mib,
                None,
                node.memory_mib,
            )
        memory_free = node.memory_mib - state.memory_used_mib
        if pod.memory_mib > memory_free:
            return fail(
                FitStatus.DOES_NOT_FIT_NOW,
                Reason.INSUFFICIENT_MEMORY,
                pod.memory_mib,
                None,
                memory_free,
            )
    assignment = (
        _single_gpu_assignment(state, gpu_containers[0])
        if len(gpu_containers) == 1 and gpu_containers[0].gpu_count == 1 and not two_dimensional
        else greedy_assignment(state, gpu_containers)
    )
    if isinstance(assignment, ContainerRequest):
        reason, requested = _why_not(state, assignment)
        return fail(FitStatus.DOES_NOT_FIT_NOW, reason, requested, assignment.name)
    return FitResult(
        FitStatus.FITS,
        Reason.FITS,
        pod.gpu_total,
        free,
        capacity,
        assignment=assignment,
        compute_free_per_gpu=compute_free,
    )


def _why_not(state: NodeState, container: ContainerRequest) -> tuple[Reason, int]:
    """(reason, requested) for ``container``, which found no room on ``state``: a GPU that is
    unhealthy would have taken it (``UNHEALTHY``), too few GPUs hold nothing for whole GPUs
    (``NO_UNUSED_GPU``, requested: the count), the memory is there but not the compute
    (``INSUFFICIENT_COMPUTE``, requested: compute_milli), else ``INSUFFICIENT_GPU``."""
    gpus, models = state.node.gpus, state.node.models
    need = container.compute_milli

    def room(*, unhealthy_too: bool, compute_too: bool) -> bool:
        view = []
        for p, gpu in enumerate(gpus):
            usable = (unhealthy_too or gpu.healthy) and not state.gpu_whole[p]
            if container.exclusive:
                usable = usable and not state.gpu_used[p] and not state.gpu_compute_used[p]
            elif compute_too and GPU_COMPUTE_MILLI - state.gpu_compute_used[p] < need:
                usable = False
            amount = gpu.capacity if container.exclusive else gpu.capacity - state.gpu_used[p]
            view.append(amount if usable else -1)
        return best_fit_positions(view, models, container) is not None

    if any(not gpu.healthy for gpu in gpus) and room(unhealthy_too=True, compute_too=True):
        requested = container.gpu_count if container.exclusive else container.gpu_share or need
        return Reason.UNHEALTHY, requested
    if container.exclusive:
        return Reason.NO_UNUSED_GPU, container.gpu_count
    if need and room(unhealthy_too=False, compute_too=False):
        return Reason.INSUFFICIENT_COMPUTE, need
    return Reason.INSUFFICIENT_GPU, container.gpu_share


def greedy_assignment(
    state: NodeState, containers: tuple[ContainerRequest, ...]
) -> tuple[ContainerAllocation, ...] | ContainerRequest:
    """Best-fit-decreasing assignment of ``containers`` to GPUs, in declaration order.

    Returns the allocations, or the first container that found no room.
    """
    return assign_containers(state, containers, best_fit_positions)


def assign_containers(
    state: NodeState, containers: tuple[ContainerRequest, ...], pick: GpuPicker
) -> tuple[ContainerAllocation, ...] | ContainerRequest:
    """Containers placed one by one, whole GPUs first, then largest share first, each by
    ``pick`` on the running free list of the container's binding dimension (memory per
    position; compute for a container that asks compute and no memory), where a GPU that
    cannot take the container (compute, whole-GPU rules) shows -1. Returns the allocations in
    declaration order, or the first container with no room."""
    gpus = state.node.gpus
    models = state.node.models
    free = list(state.gpu_free)
    two_dimensional = any(c.compute_milli or c.exclusive for c in containers)
    # The second dimension is followed only for pods that ask it (the common pod does not).
    compute = list(state.gpu_compute_free) if two_dimensional else []
    unused = [state.is_unused(p) for p in range(len(gpus))] if two_dimensional else []
    chosen: dict[int, ContainerAllocation] = {}  # by position in ``containers``: names repeat
    order = sorted(
        range(len(containers)),
        key=lambda i: (
            not containers[i].exclusive,
            -containers[i].gpu_share,
            -containers[i].gpu_count,
        ),
    )
    for i in order:
        container = containers[i]
        view = free  # what ``pick`` packs by: the binding dimension
        if container.exclusive:
            view = [amount if unused[p] else -1 for p, amount in enumerate(free)]
        elif container.compute_milli:
            need = container.compute_milli
            # Memory binds when asked; a compute-only container (openb) packs by compute.
            binding = free if container.gpu_share else compute
            view = [amount if compute[p] >= need else -1 for p, amount in enumerate(binding)]
        positions = pick(view, models, container)
        if positions is None:
            return container
        indices = tuple(gpus[p].index for p in positions)
        if container.exclusive:
            for position in positions:
                free[position], compute[position], unused[position] = 0, 0, False
            share = min(gpus[p].capacity for p in positions)
            chosen[i] = ContainerAllocation(
                container.name, indices, share, GPU_COMPUTE_MILLI, exclusive=True
            )
            continue
        for position in positions:
            free[position] -= container.gpu_share
            if two_dimensional:
                compute[position] -= container.compute_milli
                unused[position] = False
        chosen[i] = ContainerAllocation(
            container.name, indices, container.gpu_share, container.compute_milli
        )
    return tuple(chosen[i] for i in range(len(containers)))


def _single_gpu_assignment(
    state: NodeState, container: ContainerRequest
) -> tuple[ContainerAllocation, ...] | ContainerRequest:
    """``greedy_assignment`` for the common case of one container on one GPU, without copies."""
    share = container.gpu_share
    restricted = bool(container.allowed_models or container.allowed_positions)
    models = state.node.models
    best_position = -1
    best_free = 0
    for position, amount in enumerate(state.gpu_free):
        if amount >= share and (best_position < 0 or amount < best_free):
            if restricted and not container.allows_at(position, models[position]):
                continue
            best_position, best_free = position, amount
    if best_position < 0:
        return container
    index = state.node.gpus[best_position].index
    return (ContainerAllocation(container.name, (index,), share),)
