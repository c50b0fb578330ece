"""The policy contract and the registry of policies by name.

A policy has two halves, after kube-scheduler's split between scoring nodes and binding:

* the node half, ``score(state, pod) -> float``: higher is better; called only for nodes the pod
  fits (``gpushare.core.fit.check_fit`` said FITS). Paper policies return integers 0–100 as the
  artifact does (truncation included), because tie-breaking on coarse scores is part of their
  behaviour (docs/simulator.md, "Fidelity").
* the GPU half, ``choose_gpus(state, pod) -> tuple[ContainerAllocation, ...]``: which GPU indices
  each GPU container gets on the chosen node.

Ties between nodes are the caller's job (the simulator: a per-run random node order; the
extender: kube-scheduler). Policies are looked up by name (``make_policy``), as the scheduler's
``plugins/registry.go`` does.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from gpushare.core.fit import (
    GpuPicker,
    assign_containers,
    best_fit_positions,
    greedy_assignment,
)
from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    ContainerAllocation,
    ContainerRequest,
    Node,
    NodeState,
    PodRequest,
)


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy may know beyond one node: the cluster's largest node (for the paper's
    normalisations, ``MaxSpecCpu``/``MaxSpecGpu``), one whole GPU in the node unit, the target
    workload (FGD), a random source (the random baseline), and optionally all task shapes and
    the cluster's nodes (``fgd-cpu``'s reservations)."""

    workload: TargetWorkload | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    max_node_cpu_milli: int = 128_000
    max_node_gpu: int = 8_000
    gpu_unit: int = 1_000
    all_shapes: TargetWorkload | None = None
    """Every task shape with its frequency (coverage 100%), for policies that reserve scarce
    nodes (``fgd-cpu``); ``None``: no reservation."""
    cluster: tuple[Node, ...] = ()
    """The cluster's nodes (capacities only), for policies that weigh supply per node type."""


class Policy(Protocol):
    """A placement policy (module doc)."""

    @property
    def name(self) -> str:
        """The registry name."""
        ...

    @property
    def deterministic(self) -> bool:
        """True when ``score`` depends only on the node state and the pod's shape (cacheable)."""
        ...

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Node half: higher is better. Precondition: ``pod`` fits ``state``."""
        ...

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """GPU half: the GPUs each GPU container gets. Precondition: ``pod`` fits ``state``."""
        ...


TieBreak = Callable[[NodeState, PodRequest], float]
"""A policy's tie-break: higher wins among the nodes with the best score."""


@runtime_checkable
class TieBreaking(Protocol):
    """A policy's optional member: it orders the nodes that tie on ``score`` (``fgd-cpu``).
    Read it with ``tie_break_of`` (``gpushare.core.placement.Placer``, the extender's
    prioritize)."""

    def tie_break(self, state: NodeState, pod: PodRequest) -> float:
        """Higher wins among the nodes with the best score. Precondition: ``pod`` fits."""
        ...


@runtime_checkable
class Generational(Protocol):
    """A policy's optional member: ``generation`` changes when every score may change (the
    extender's ``AdaptiveFgd`` on a new target workload); callers then drop cached scores.
    Read it with ``generational``."""

    @property
    def generation(self) -> int:
        """Changes whenever every score may change."""
        ...


def tie_break_of(policy: Policy) -> TieBreak | None:
    """``policy.tie_break`` when the policy has one (``TieBreaking``), else ``None``. An
    ``isinstance`` check on a protocol: callers resolve it once per policy, not per node."""
    return policy.tie_break if isinstance(policy, TieBreaking) else None


def generational(policy: Policy) -> Generational | None:
    """``policy`` as a ``Generational`` when it has a ``generation``, else ``None`` (its
    scores never all change at once). Resolved once per policy, like ``tie_break_of``."""
    return policy if isinstance(policy, Generational) else None


PolicyFactory = Callable[[PolicyContext], Policy]
_REGISTRY: dict[str, tuple[PolicyFactory, str]] = {}


def register(name: str, summary: str) -> Callable[[PolicyFactory], PolicyFactory]:
    """Class/function decorator adding a policy factory under ``name``."""

    def add(factory: PolicyFactory) -> PolicyFactory:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} registered twice")
        _REGISTRY[name] = (factory, summary)
        return factory

    return add


def policy_names() -> list[str]:
    """All registered policy names, in registration order."""
    return list(_REGISTRY)


def policy_summary(name: str) -> str:
    """One line describing policy ``name``."""
    return _REGISTRY[name][1]


def make_policy(name: str, context: PolicyContext | None = None) -> Policy:
    """A new policy instance. Raises ``KeyError`` naming the accepted names for an unknown name."""
    try:
        factory, _ = _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown policy {name!r}; accepted: {', '.join(policy_names())}") from None
    return factory(context or PolicyContext())


def assign_sequentially(
    state: NodeState, pod: PodRequest, pick: GpuPicker
) -> tuple[ContainerAllocation, ...]:
    """GPU containers placed one by one (largest share first) with ``pick`` on the running free
    list; falls back to the fit check's best-fit-decreasing assignment if ``pick`` fails."""
    assignment = assign_containers(state, pod.gpu_containers, pick)
    if isinstance(assignment, ContainerRequest):
        return fallback_assignment(state, pod)
    return assignment


def fallback_assignment(state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
    """The fit check's best-fit-decreasing assignment; ``ValueError`` if the pod does not fit
    (a caller bug: policies are only asked about nodes the pod fits)."""
    assignment = greedy_assignment(state, pod.gpu_containers)
    if isinstance(assignment, ContainerRequest):
        raise ValueError(f"pod {pod.key} does not fit node {state.node.name}")
    return assignment


def lowest_free_positions(
    free: list[int], models: tuple[str, ...], container: ContainerRequest
) -> list[int] | None:
    """The ``gpu_count`` lowest positions that hold ``gpu_share`` (the artifact's rule for
    whole-GPU pods: ``AllocateExclusiveGpuId``)."""
    positions = [
        p
        for p, amount in enumerate(free)
        if amount >= container.gpu_share and container.allows_at(p, models[p])
    ]
    if len(positions) < container.gpu_count:
        return None
    return positions[: container.gpu_count]


def best_fit_gpus(state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
    """Best-fit GPU half shared by several policies (least free that fits; lowest index)."""
    return assign_sequentially(state, pod, best_fit_positions)


def is_sharing(pod: PodRequest, gpu_unit: int) -> bool:
    """A GPU-sharing pod: one container on one GPU, asking less than a whole GPU in memory and
    in compute (not whole GPUs: ``exclusive``)."""
    containers = pod.gpu_containers
    if len(containers) != 1:
        return False
    container = containers[0]
    return (
        container.gpu_count == 1
        and container.gpu_share < gpu_unit
        and container.compute_milli < GPU_COMPUTE_MILLI
        and not container.exclusive
    )


def workload_tag(pod: PodRequest, gpu_unit: int) -> str | None:
    """The clustering baseline's pod tag: ``share``, ``<k>-gpu``, or ``None`` for CPU-only."""
    containers = pod.gpu_containers
    if not containers:
        return None
    if is_sharing(pod, gpu_unit):
        return "share"
    return f"{sum(c.gpu_count for c in containers)}-gpu"
