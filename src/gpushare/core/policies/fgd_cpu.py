"""``fgd-cpu``: gpushare's placement policy — FGD, with CPU-aware tie-breaking that respects
scarce nodes.

FGD's integer scores tie often (a point is ~40 milli-GPU of fragmentation) and the artifact breaks
ties by a random node order. ``fgd-cpu`` keeps FGD's score as the primary key and breaks its ties
with a second FGD score computed on ``cpu_aware_fragmentation``: idle GPU that a node's CPU
cannot serve counts as fragmentation (on openb, GPU pods ask ~11 vCPU per GPU and the 8-GPU G2
nodes offer 12, so CPU placed badly strands whole GPUs that the paper's F does not see).

Steering by CPU alone takes scarce nodes from the pods that need them (T4 nodes from T4-only
pods, 128-vCPU nodes from 120-vCPU 8-GPU pods), so the tie-break is withheld where it would do
that: task shapes (all of them, not only the popular ones) are grouped by the node types that
could host them; a group whose hosts hold at most ``SCARCE_SUPPLY`` of the cluster's GPUs and
whose GPU demand exceeds ``RESERVE_RATIO`` × its hosts' share of GPUs reserves those node
types, and GPU pods of other groups get no tie-break credit there. CPU-only pods take no GPU
and are never held back. Without ``PolicyContext.all_shapes`` and ``cluster`` nothing is
reserved. Results: ``docs/simulator.md``.

Two dimensions: both F's are the two-dimensional measure where ``fgd`` uses it, the tie-break
reads the node after FGD's own allocation in memory and compute, and a shape's demand (for
the reservations) is the idle amount one copy takes (``copy_idle``): with one dimension all of
this is the memory share, as before.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gpushare.core.fragmentation import (
    ComputeFree,
    TargetWorkload,
    TaskShape,
    compute_of,
    copy_idle,
    cpu_aware_fragmentation,
    shape_fragmentation,
)
from gpushare.core.model import ContainerAllocation, Node, NodeState, PodRequest
from gpushare.core.policies.base import PolicyContext, register
from gpushare.core.policies.fgd import FgdPolicy, FragmentationMemo, free_after, sigmoid

CPU_WEIGHT = 0.7
"""β of ``cpu_aware_fragmentation`` in the tie-break (0.5–1.0 all helped on openb)."""
RESERVE_RATIO = 0.25
"""A scarce host group is reserved when its demand share exceeds this × its supply share."""
SCARCE_SUPPLY = 0.5
"""Only host groups holding at most this share of the cluster's GPUs can be reserved."""

NodeType = tuple[tuple[str, ...], int | None]


def node_type(node: Node) -> NodeType:
    """What decides which shapes a node can host: its GPU models and its CPU."""
    return (node.models, node.cpu_milli)


def _can_host(node: Node, shape: TaskShape) -> bool:
    """Whether an empty ``node`` can run ``shape`` (some idle GPU is usable by it)."""
    free = node.capacities
    return shape_fragmentation(free, node.models, node.cpu_milli, shape) != sum(free)


def gpu_demand(shape: TaskShape, weight: float, capacity: int) -> float:
    """A shape's GPU demand in M: its weight × k × the idle one copy takes on each GPU
    (``copy_idle`` on a GPU of ``capacity``)."""
    return weight * shape.gpu_count * copy_idle(shape, capacity)


@dataclass(frozen=True, slots=True)
class HostGroups:
    """The shapes of M grouped by the node types that could host them (module doc):
    ``supply`` GPUs per node type, ``demand`` GPU demand per host group, ``group_of`` each
    shape's group (shapes with no GPU demand have none) and ``pinned`` the groups holding a
    shape pinned to GPU models."""

    supply: dict[NodeType, int]
    demand: dict[frozenset[NodeType], float]
    group_of: dict[TaskShape, frozenset[NodeType]]
    pinned: frozenset[frozenset[NodeType]]

    def scarce(self, hosts: frozenset[NodeType]) -> bool:
        """Whether ``hosts`` hold some and at most ``SCARCE_SUPPLY`` of the cluster's GPUs."""
        total = sum(self.supply.values())
        return total > 0 and 0 < sum(self.supply[key] for key in hosts) / total <= SCARCE_SUPPLY

    def reserved(
        self, ratio: float = RESERVE_RATIO, pinned_ratio: float | None = None
    ) -> dict[NodeType, set[frozenset[NodeType]]]:
        """Node type → the host groups that reserve it: a scarce group whose demand share
        exceeds ``ratio`` × its supply share (``pinned_ratio`` instead for a pinned group, when
        given)."""
        supply_total = sum(self.supply.values())
        demand_total = sum(self.demand.values())
        reserved: dict[NodeType, set[frozenset[NodeType]]] = {}
        if not supply_total or not demand_total:
            return reserved
        for hosts, amount in self.demand.items():
            share = sum(self.supply[key] for key in hosts) / supply_total
            limit = ratio if pinned_ratio is None or hosts not in self.pinned else pinned_ratio
            if 0 < share <= SCARCE_SUPPLY and amount / demand_total > limit * share:
                for key in hosts:
                    reserved.setdefault(key, set()).add(hosts)
        return reserved


def host_groups(cluster: tuple[Node, ...], shapes: TargetWorkload) -> HostGroups:
    """``shapes`` grouped by the node types of ``cluster`` that could host them."""
    supply: dict[NodeType, int] = {}
    template: dict[NodeType, Node] = {}
    for node in cluster:
        key = node_type(node)
        supply[key] = supply.get(key, 0) + len(node.gpus)
        template.setdefault(key, node)
    capacity = max((gpu.capacity for node in cluster for gpu in node.gpus), default=0)
    demand: dict[frozenset[NodeType], float] = {}
    group_of: dict[TaskShape, frozenset[NodeType]] = {}
    pinned: set[frozenset[NodeType]] = set()
    for shape, weight in zip(shapes.shapes, shapes.weights, strict=True):
        amount = gpu_demand(shape, weight, capacity)
        if amount == 0:
            continue
        hosts = frozenset(key for key, node in template.items() if _can_host(node, shape))
        demand[hosts] = demand.get(hosts, 0.0) + amount
        group_of[shape] = hosts
        if shape.allowed_models:
            pinned.add(hosts)
    return HostGroups(supply, demand, group_of, frozenset(pinned))


def reserved_node_types(
    cluster: tuple[Node, ...], shapes: TargetWorkload, ratio: float = RESERVE_RATIO
) -> tuple[dict[NodeType, set[frozenset[NodeType]]], dict[TaskShape, frozenset[NodeType]]]:
    """(node type → the host groups that reserve it, shape → its host group), module doc;
    ``ratio`` is the module doc's ``RESERVE_RATIO``."""
    groups = host_groups(cluster, shapes)
    return groups.reserved(ratio), groups.group_of


class FgdCpuPolicy:
    """FGD with a CPU-aware, reservation-respecting tie-break (module doc)."""

    name = "fgd-cpu"
    deterministic = True
    reserve_ratio = RESERVE_RATIO
    """``RESERVE_RATIO`` for this policy's reservations (``fgd-spare`` reserves more)."""
    pinned_reserve_ratio: float | None = None
    """The ratio for host groups of model-pinned shapes (``None``: ``reserve_ratio``)."""

    def __init__(self, context: PolicyContext) -> None:
        self.paper = FgdPolicy(context, name="fgd-cpu")
        assert context.workload is not None  # FgdPolicy raised otherwise
        self.cpu_frag = FragmentationMemo(
            context.workload,
            functools.partial(cpu_aware_fragmentation, cpu_weight=CPU_WEIGHT),
        )
        self.gpu_unit = context.gpu_unit
        self.workload = context.workload
        self.groups: HostGroups | None = None
        self.reserved: dict[NodeType, set[frozenset[NodeType]]] = {}
        self.group_of: dict[TaskShape, frozenset[NodeType]] = {}
        if context.all_shapes is not None and context.cluster:
            self.groups = host_groups(context.cluster, context.all_shapes)
            self.reserved = self.groups.reserved(self.reserve_ratio, self.pinned_reserve_ratio)
            self.group_of = self.groups.group_of

    def tie_break(self, state: NodeState, pod: PodRequest) -> float:
        """Among nodes FGD scores equally: ⌊100·σ(−Δ/unit)⌋ of the CPU-aware fragmentation
        change of FGD's own placement (0–100), or 0 on a node type reserved for other shapes."""
        if pod.gpu_containers:
            groups = self.reserved.get(node_type(state.node))
            if groups and self.group_of.get(TaskShape.of(pod)) not in groups:
                return 0.0
        models = state.node.models
        cpu = state.cpu_free_milli
        cpu_after = None if cpu is None else cpu - pod.cpu_milli
        before = compute_of(state, self.workload, pod)
        free, compute_free = free_after(
            state, self.paper.choose_gpus(state, pod), compute=before is not None
        )
        view = None if before is None else ComputeFree(tuple(compute_free), before.capacities)
        after = self.cpu_frag(models, cpu_after, free, view)
        delta = after - self.cpu_frag(models, cpu, state.gpu_free, before)
        return float(int(100.0 * sigmoid(-delta / self.gpu_unit)))

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """FGD's integer score (the primary key; ``tie_break`` orders its ties)."""
        return self.paper.score(state, pod)

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """FGD's GPU choice."""
        return self.paper.choose_gpus(state, pod)


register(
    "fgd-cpu",
    "gpushare: FGD, ties broken by CPU-aware fragmentation away from scarce nodes",
)(FgdCpuPolicy)
