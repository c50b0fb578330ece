"""The unit-free model: GPUs, nodes, requests, allocations and a node's state.

Every amount of GPU memory here is an integer in the node's own unit (GiB or MiB on a cluster,
milli-GPU in the openb trace): the core never converts units, the adapters do (docs/design.md,
"Units"). GPU **compute** is a second dimension of every GPU, in thousandths of one GPU
(``compute_milli``; a GPU has ``GPU_COMPUTE_MILLI``): Tencent's ``tencent.com/vcuda-core`` and
HAMi's ``nvidia.com/gpucores`` percentages are 10 each, openb's ``gpu_milli`` is it as is. A
container that asks no compute (``compute_milli == 0``, Alibaba's dialect) is not bounded by
it, as Alibaba's gpushare does not bound it (docs/compute.md). A container may instead ask
**whole GPUs** (``exclusive``): GPUs nobody else uses, which then take nothing else while held.
All types are frozen and hashable so that they can key caches and be shared between threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GPU_COMPUTE_MILLI = 1000
"""The compute of one whole GPU, in the unit of every ``compute_milli``."""


@dataclass(frozen=True, slots=True)
class Gpu:
    """One physical GPU of a node.

    ``index`` is the device index on the node (NVML order, 0-based); ``capacity`` is the whole
    GPU in the node's unit (> 0); an unhealthy GPU keeps its allocations but takes no new ones.
    """

    index: int
    model: str
    capacity: int
    healthy: bool = True

    def __post_init__(self) -> None:
        if self.index < 0:
            raise ValueError(f"GPU index must be >= 0, got {self.index}")
        if self.capacity <= 0:
            raise ValueError(f"GPU {self.index} capacity must be > 0, got {self.capacity}")


@dataclass(frozen=True, slots=True)
class Node:
    """A node and its GPUs, in index order. ``cpu_milli``/``memory_mib`` are allocatable
    amounts; ``None`` means the node does not constrain that resource."""

    name: str
    gpus: tuple[Gpu, ...]
    cpu_milli: int | None = None
    memory_mib: int | None = None
    models: tuple[str, ...] = field(init=False, repr=False, compare=False)
    """GPU models per position (derived)."""
    capacities: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """GPU capacities per position (derived)."""
    by_index: Mapping[int, Gpu] = field(init=False, repr=False, compare=False)
    """The GPUs by device index (derived; not to be changed)."""

    def __post_init__(self) -> None:
        indices = [gpu.index for gpu in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"node {self.name}: duplicate GPU indices {indices}")
        if indices != sorted(indices):
            raise ValueError(f"node {self.name}: GPUs must be in index order, got {indices}")
        object.__setattr__(self, "models", tuple(gpu.model for gpu in self.gpus))
        object.__setattr__(self, "capacities", tuple(gpu.capacity for gpu in self.gpus))
        by_index = {gpu.index: gpu for gpu in self.gpus}  # a dict: Nodes are pickled
        object.__setattr__(self, "by_index", by_index)

    def gpu(self, index: int) -> Gpu:
        """The GPU with device index ``index``; ``KeyError`` when the node has none."""
        gpu = self.by_index.get(index)
        if gpu is None:
            raise KeyError(f"node {self.name} has no GPU {index}")
        return gpu


def check_container(
    name: str, gpu_share: int, gpu_count: int, compute_milli: int, exclusive: bool
) -> None:
    """``ValueError`` naming container ``name`` when its amounts are what no container can
    ask (``ContainerRequest``, ``gpushare.core.ask.ContainerAsk``): below 0, compute over one
    GPU, an exclusive container that asks a share, a GPU container that asks nothing or
    another that asks something."""
    if gpu_count < 0 or gpu_share < 0:
        raise ValueError(
            f"container {name}: gpu_share and gpu_count must be >= 0, got {gpu_share} x {gpu_count}"
        )
    if not 0 <= compute_milli <= GPU_COMPUTE_MILLI:
        raise ValueError(
            f"container {name}: compute_milli must be 0..{GPU_COMPUTE_MILLI}, got {compute_milli}"
        )
    if exclusive and (gpu_share or compute_milli or not gpu_count):
        raise ValueError(
            f"container {name}: an exclusive container asks whole GPUs only "
            f"(gpu_count > 0, gpu_share and compute_milli 0), got {gpu_share} units, "
            f"{compute_milli} compute_milli x {gpu_count}"
        )
    asks = gpu_share > 0 or compute_milli > 0 or exclusive
    if (gpu_count == 0) == asks:
        raise ValueError(
            f"container {name}: gpu_share {gpu_share}, compute_milli {compute_milli} with "
            f"gpu_count {gpu_count}; a GPU container (gpu_count > 0) asks memory, compute or "
            "whole GPUs, another asks none"
        )


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks: on each of ``gpu_count`` distinct GPUs, ``gpu_share`` units of
    memory and ``compute_milli`` thousandths of the GPU's compute (0: compute not bounded), or,
    with ``exclusive``, the whole GPU (nothing else on it while held; ``gpu_share`` and
    ``compute_milli`` are then 0 in the request and the allocation records the whole GPU).

    A container with ``gpu_count == 0`` asks no GPU (it then asks nothing of one); one with
    ``gpu_count > 0`` asks memory, compute or whole GPUs. ``allowed_models`` restricts the GPU
    models it may use; empty means any model.

    It is always in the node's terms: memory in the node's unit, GPUs chosen by exact model and
    position. A pod that asks memory in MiB or percent, or GPUs by type or UUID, is first a
    ``gpushare.core.ask.PodAsk``, resolved into a ``PodRequest`` for one node by
    ``gpushare.core.resolve``.

    ``allocate_resource`` and ``kubelet_units``: the extended resource kubelet's Allocate for
    this container comes on and the device IDs it passes there (the container's amount of that
    resource in its spec), what the device plugin tells pods apart by
    (``gpushare.core.handshake``). Empty and ``None`` (the defaults, and the simulator's): the
    node's memory resource, ``gpu_share × gpu_count`` units.

    ``allowed_positions``: the positions in ``Node.gpus`` of the GPUs the container may use on
    the node (empty: any), what GPUs named by UUID resolve to.

    ``ValueError`` for amounts below 0, compute over one GPU, an exclusive container that asks
    a share, and a GPU container that asks nothing (or another that asks something).
    """

    name: str
    gpu_share: int
    gpu_count: int = 1
    allowed_models: frozenset[str] = frozenset()
    compute_milli: int = 0
    exclusive: bool = False
    allocate_resource: str = ""
    kubelet_units: int | None = None
    allowed_positions: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        check_container(
            self.name, self.gpu_share, self.gpu_count, self.compute_milli, self.exclusive
        )

    @property
    def total(self) -> int:
        """GPU memory units the container takes in all: share × count (0 for whole GPUs: their
        amount is the capacity of the GPUs chosen)."""
        return self.gpu_share * self.gpu_count

    @property
    def allocate_units(self) -> int:
        """Device IDs kubelet passes to Allocate for this container: ``kubelet_units``, else
        ``total``."""
        return self.total if self.kubelet_units is None else self.kubelet_units

    def allows(self, model: str) -> bool:
        """Whether a GPU of ``model`` is acceptable to this container (by model alone:
        ``allows_at`` also checks ``allowed_positions``)."""
        return not self.allowed_models or model in self.allowed_models

    def allows_at(self, position: int, model: str) -> bool:
        """Whether the GPU at ``position`` of the node, of ``model``, is acceptable."""
        return (not self.allowed_models or model in self.allowed_models) and (
            not self.allowed_positions or position in self.allowed_positions
        )


@dataclass(frozen=True, slots=True)
class PodRequest:
    """A pod to place: its containers (GPU and CPU-only) and its pod-level CPU and memory.

    ``key`` identifies the pod (``namespace/name`` on a cluster).
    """

    key: str
    containers: tuple[ContainerRequest, ...]
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_containers: tuple[ContainerRequest, ...] = field(init=False, repr=False, compare=False)
    """The containers that ask for GPU, in declaration order (derived)."""
    gpu_total: int = field(init=False, repr=False, compare=False)
    """All GPU units the pod asks, summed over containers (derived)."""
    shape: tuple[object, ...] = field(init=False, repr=False, compare=False)
    """A hashable key of everything a placement decision depends on, not the pod's name
    (derived)."""
    two_dimensional: bool = field(init=False, repr=False, compare=False)
    """Whether a container asks compute or whole GPUs (derived): the fit follows the second
    dimension only then."""

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(
                f"pod {self.key}: cpu_milli and memory_mib must be >= 0, "
                f"got {self.cpu_milli} and {self.memory_mib}"
            )
        gpu: list[ContainerRequest] = []
        shapes: list[tuple[object, ...]] = []
        two_dimensional = False
        total = 0
        for c in self.containers:  # one pass: a pod is built for every one the API lists
            share, count = c.gpu_share, c.gpu_count
            if count > 0:
                gpu.append(c)
            total += share * count
            shapes.append((
                share, count, c.allowed_models, c.compute_milli, c.exclusive,
                c.allocate_resource, c.kubelet_units, c.allowed_positions,
            ))  # fmt: skip
            two_dimensional = two_dimensional or bool(c.compute_milli) or c.exclusive
        setattr_ = object.__setattr__
        setattr_(self, "gpu_containers", tuple(gpu))
        setattr_(self, "gpu_total", total)
        setattr_(self, "shape", (self.cpu_milli, self.memory_mib, tuple(shapes)))
        setattr_(self, "two_dimensional", two_dimensional)


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The GPUs one container got: ``gpu_share`` memory units and ``compute_milli`` of the
    compute on each index in ``gpu_indices``; ``exclusive``: each of them whole (``gpu_share``
    is then the GPUs' capacity, ``compute_milli`` all of it)."""

    container: str
    gpu_indices: tuple[int, ...]
    gpu_share: int
    compute_milli: int = 0
    exclusive: bool = False


@dataclass(frozen=True, slots=True)
class Allocation:
    """Which GPU indices each GPU container of pod ``pod`` got on node ``node``."""

    pod: str
    node: str
    containers: tuple[ContainerAllocation, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    def per_gpu(self) -> dict[int, int]:
        """Memory units taken on each GPU index, summed over containers."""
        used: dict[int, int] = {}
        for container in self.containers:
            for index in container.gpu_indices:
                used[index] = used.get(index, 0) + container.gpu_share
        return used

    def per_gpu_compute(self) -> dict[int, int]:
        """``compute_milli`` taken on each GPU index, summed over containers (only indices
        where some is taken)."""
        used: dict[int, int] = {}
        for container in self.containers:
            if container.compute_milli:
                for index in container.gpu_indices:
                    used[index] = used.get(index, 0) + container.compute_milli
        return used

    def whole_gpus(self) -> frozenset[int]:
        """The GPU indices held whole (``exclusive`` containers)."""
        return frozenset(i for c in self.containers if c.exclusive for i in c.gpu_indices)


_EMPTY_TAGS: Mapping[str, int] = MappingProxyType({})
_ZEROS: dict[int, tuple[int, ...]] = {}
_NOT_WHOLE: dict[int, tuple[bool, ...]] = {}
"""Shared default tuples per GPU count: most states use no compute and hold no GPU whole, and a
simulation builds millions of them."""


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node with what is in use on it: the snapshot that fit checks and policies read.

    ``gpu_used[i]`` is the memory in use on ``node.gpus[i]`` (position, not device index),
    ``gpu_compute_used[i]`` its compute in use (``compute_milli``; empty: none anywhere) and
    ``gpu_whole[i]`` whether a pod holds it whole (empty: none is).
    ``workload_tags`` counts the pods on the node by tag (used by the clustering baseline).
    """

    node: Node
    gpu_used: tuple[int, ...]
    cpu_used_milli: int = 0
    memory_used_mib: int = 0
    workload_tags: Mapping[str, int] = field(
        default_factory=lambda: _EMPTY_TAGS, compare=False, hash=False
    )
    gpu_compute_used: tuple[int, ...] = ()
    gpu_whole: tuple[bool, ...] = ()
    tags_key: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    """``workload_tags`` as a sorted tuple (derived): the hashable part of the state."""
    gpu_free: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Free memory units per GPU position (derived); an unhealthy GPU, or one held whole, has
    0 free (it takes nothing new)."""

    def __post_init__(self) -> None:
        count = len(self.node.gpus)
        if len(self.gpu_used) != count:
            self._wrong_length("usage", self.gpu_used)
        if not self.gpu_compute_used:
            zeros = _ZEROS.get(count) or _ZEROS.setdefault(count, (0,) * count)
            object.__setattr__(self, "gpu_compute_used", zeros)
        elif len(self.gpu_compute_used) != count:
            self._wrong_length("compute usage", self.gpu_compute_used)
        if not self.gpu_whole:
            falses = _NOT_WHOLE.get(count) or _NOT_WHOLE.setdefault(count, (False,) * count)
            object.__setattr__(self, "gpu_whole", falses)
        elif len(self.gpu_whole) != count:
            self._wrong_length("whole-GPU", self.gpu_whole)
        object.__setattr__(self, "tags_key", tuple(sorted(self.workload_tags.items())))
        free = tuple(
            gpu.capacity - used if gpu.healthy else 0
            for gpu, used in zip(self.node.gpus, self.gpu_used, strict=True)
        )
        if True in self.gpu_whole:
            free = tuple(0 if whole else f for f, whole in zip(free, self.gpu_whole, strict=True))
        object.__setattr__(self, "gpu_free", free)

    def _wrong_length(self, what: str, entries: tuple[object, ...]) -> None:
        raise ValueError(
            f"node {self.node.name}: {len(entries)} {what} entries for {len(self.node.gpus)} GPUs"
        )

    @property
    def gpu_compute_free(self) -> tuple[int, ...]:
        """Free ``compute_milli`` per GPU position; 0 on an unhealthy GPU or one held whole."""
        return tuple(
            GPU_COMPUTE_MILLI - used if gpu.healthy and not whole else 0
            for gpu, used, whole in zip(
                self.node.gpus, self.gpu_compute_used, self.gpu_whole, strict=True
            )
        )

    def is_unused(self, position: int) -> bool:
        """Whether GPU ``position`` is healthy and holds nothing (a whole-GPU request takes
        only such GPUs)."""
        gpu = self.node.gpus[position]
        return (
            gpu.healthy
            and not self.gpu_whole[position]
            and self.gpu_used[position] == 0
            and self.gpu_compute_used[position] == 0
        )

    @classmethod
    def empty(cls, node: Node) -> NodeState:
        """The state of ``node`` with nothing on it."""
        return cls(node=node, gpu_used=(0,) * len(node.gpus))

    @property
    def cpu_free_milli(self) -> int | None:
        """Free CPU, or ``None`` when the node does not constrain CPU."""
        if self.node.cpu_milli is None:
            return None
        return self.node.cpu_milli - self.cpu_used_milli

    @property
    def memory_free_mib(self) -> int | None:
        """Free memory, or ``None`` when the node does not constrain memory."""
        if self.node.memory_mib is None:
            return None
        return self.node.memory_mib - self.memory_used_mib

    def without(self, allocation: Allocation | None) -> NodeState:
        """This state minus ``allocation`` when it is on this node (a pod never blocks
        itself: a retried bind or a re-filter of a pod that holds GPUs here); else unchanged.
        GPU indices the node lacks are ignored."""
        if allocation is None or allocation.node != self.node.name:
            return self
        used, compute, whole = self._changed(allocation, -1)
        return NodeState(
            node=self.node,
            gpu_used=used,
            cpu_used_milli=self.cpu_used_milli - allocation.cpu_milli,
            memory_used_mib=self.memory_used_mib - allocation.memory_mib,
            workload_tags=self.workload_tags,
            gpu_compute_used=compute,
            gpu_whole=whole,
        )

    def with_allocation(self, allocation: Allocation, tag: str | None = None) -> NodeState:
        """This state with ``allocation`` added (no fit check: see ``gpushare.core.fit``).
        ``KeyError`` for a GPU index the node lacks."""
        used, compute, whole = self._changed(allocation, +1)
        tags = dict(self.workload_tags)
        if tag is not None:
            tags[tag] = tags.get(tag, 0) + 1
        return NodeState(
            node=self.node,
            gpu_used=used,
            cpu_used_milli=self.cpu_used_milli + allocation.cpu_milli,
            memory_used_mib=self.memory_used_mib + allocation.memory_mib,
            workload_tags=MappingProxyType(tags),
            gpu_compute_used=compute,
            gpu_whole=whole,
        )

    def _changed(
        self, allocation: Allocation, sign: int
    ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[bool, ...]]:
        """(memory, compute, whole) per position with ``allocation`` added (``sign`` +1:
        ``KeyError`` for a GPU index the node lacks) or taken away (-1: such indices are
        ignored)."""
        position = {gpu.index: i for i, gpu in enumerate(self.node.gpus)}
        used = list(self.gpu_used)
        for index, amount in allocation.per_gpu().items():
            if index in position:
                used[position[index]] += sign * amount
            elif sign > 0:
                raise KeyError(f"node {self.node.name} has no GPU {index}")
        compute, whole = self.gpu_compute_used, self.gpu_whole
        if not any(c.compute_milli or c.exclusive for c in allocation.containers):
            return tuple(used), compute, whole
        changed = list(compute)
        for index, amount in allocation.per_gpu_compute().items():
            if index in position:
                changed[position[index]] += sign * amount
        flags = list(whole)
        for index in allocation.whole_gpus():
            if index in position:
                flags[position[index]] = sign > 0
        compute, whole = tuple(changed), tuple(flags)
        return tuple(used), compute, whole
