"""The unit-free model: GPUs, nodes, requests, allocations and a node's state.

Every amount of GPU here is an integer in the node's own unit (GiB or MiB on a cluster, milli-GPU
in the openb trace): the core never converts units, the adapters do (design.md, "Units").
All types are frozen and hashable so that they can key caches and be shared between threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


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

    def __post_init__(self) -> None:
        indices = [gpu.index for gpu in self.gpus]
        if len(set(indices)) != len(indices):
            raise ValueError(f"node {self.name}: duplicate GPU indices {indices}")
        if indices != sorted(indices):
            raise ValueError(f"node {self.name}: GPUs must be in index order, got {indices}")
        object.__setattr__(self, "models", tuple(gpu.model for gpu in self.gpus))
        object.__setattr__(self, "capacities", tuple(gpu.capacity for gpu in self.gpus))

    def gpu(self, index: int) -> Gpu:
        """The GPU with device index ``index``; ``KeyError`` when the node has none."""
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"node {self.name} has no GPU {index}")


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """What one container asks: ``gpu_share`` units on each of ``gpu_count`` distinct GPUs.

    A container with ``gpu_count == 0`` asks no GPU (``gpu_share`` must then be 0).
    ``allowed_models`` restricts the GPU models it may use; empty means any model.
    """

    name: str
    gpu_share: int
    gpu_count: int = 1
    allowed_models: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.gpu_count < 0 or self.gpu_share < 0:
            raise ValueError(
                f"container {self.name}: gpu_share and gpu_count must be >= 0, "
                f"got {self.gpu_share} x {self.gpu_count}"
            )
        if (self.gpu_count == 0) != (self.gpu_share == 0):
            raise ValueError(
                f"container {self.name}: gpu_share {self.gpu_share} with gpu_count "
                f"{self.gpu_count}; both must be 0 or both > 0"
            )

    @property
    def total(self) -> int:
        """GPU units the container takes in all: share × count."""
        return self.gpu_share * self.gpu_count

    def allows(self, model: str) -> bool:
        """Whether a GPU of ``model`` is acceptable to this container."""
        return not self.allowed_models or model in self.allowed_models


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

    def __post_init__(self) -> None:
        if self.cpu_milli < 0 or self.memory_mib < 0:
            raise ValueError(
                f"pod {self.key}: cpu_milli and memory_mib must be >= 0, "
                f"got {self.cpu_milli} and {self.memory_mib}"
            )
        gpu: list[ContainerRequest] = []
        shapes: list[tuple[int, int, frozenset[str]]] = []
        total = 0
        for c in self.containers:  # one pass: a pod is built for every one the API lists
            share, count = c.gpu_share, c.gpu_count
            if count > 0:
                gpu.append(c)
            total += share * count
            shapes.append((share, count, c.allowed_models))
        setattr_ = object.__setattr__
        setattr_(self, "gpu_containers", tuple(gpu))
        setattr_(self, "gpu_total", total)
        setattr_(self, "shape", (self.cpu_milli, self.memory_mib, tuple(shapes)))


@dataclass(frozen=True, slots=True)
class ContainerAllocation:
    """The GPUs one container got: ``gpu_share`` units on each index in ``gpu_indices``."""

    container: str
    gpu_indices: tuple[int, ...]
    gpu_share: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """Which GPU indices each GPU container of pod ``pod`` got on node ``node``."""

    pod: str
    node: str
    containers: tuple[ContainerAllocation, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    def per_gpu(self) -> dict[int, int]:
        """Units taken on each GPU index, summed over containers."""
        used: dict[int, int] = {}
        for container in self.containers:
            for index in container.gpu_indices:
                used[index] = used.get(index, 0) + container.gpu_share
        return used


_EMPTY_TAGS: Mapping[str, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node with what is in use on it: the snapshot that fit checks and policies read.

    ``gpu_used[i]`` is the amount in use on ``node.gpus[i]`` (position, not device index).
    ``workload_tags`` counts the pods on the node by tag (used by the clustering baseline).
    """

    node: Node
    gpu_used: tuple[int, ...]
    cpu_used_milli: int = 0
    memory_used_mib: int = 0
    workload_tags: Mapping[str, int] = field(
        default_factory=lambda: _EMPTY_TAGS, compare=False, hash=False
    )
    tags_key: tuple[tuple[str, int], ...] = field(init=False, repr=False)
    """``workload_tags`` as a sorted tuple (derived): the hashable part of the state."""
    gpu_free: tuple[int, ...] = field(init=False, repr=False, compare=False)
    """Free units per GPU position (derived); an unhealthy GPU has 0 free (it takes nothing new)."""

    def __post_init__(self) -> None:
        if len(self.gpu_used) != len(self.node.gpus):
            raise ValueError(
                f"node {self.node.name}: {len(self.gpu_used)} usage entries for "
                f"{len(self.node.gpus)} GPUs"
            )
        object.__setattr__(self, "tags_key", tuple(sorted(self.workload_tags.items())))
        object.__setattr__(
            self,
            "gpu_free",
            tuple(
                gpu.capacity - used if gpu.healthy else 0
                for gpu, used in zip(self.node.gpus, self.gpu_used, strict=True)
            ),
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
        used = list(self.gpu_used)
        position = {gpu.index: i for i, gpu in enumerate(self.node.gpus)}
        for index, amount in allocation.per_gpu().items():
            if index in position:
                used[position[index]] -= amount
        return NodeState(
            node=self.node,
            gpu_used=tuple(used),
            cpu_used_milli=self.cpu_used_milli - allocation.cpu_milli,
            memory_used_mib=self.memory_used_mib - allocation.memory_mib,
            workload_tags=self.workload_tags,
        )

    def with_allocation(self, allocation: Allocation, tag: str | None = None) -> NodeState:
        """This state with ``allocation`` added (no fit check: see ``gpushare.core.fit``)."""
        used = list(self.gpu_used)
        position = {gpu.index: i for i, gpu in enumerate(self.node.gpus)}
        for index, amount in allocation.per_gpu().items():
            used[position[index]] += amount
        tags = dict(self.workload_tags)
        if tag is not None:
            tags[tag] = tags.get(tag, 0) + 1
        return NodeState(
            node=self.node,
            gpu_used=tuple(used),
            cpu_used_milli=self.cpu_used_milli + allocation.cpu_milli,
            memory_used_mib=self.memory_used_mib + allocation.memory_mib,
            workload_tags=MappingProxyType(tags),
        )
