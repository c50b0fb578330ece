"""Builders of core values for table-driven tests: nodes, node states and pod requests, in the
core's unit-free integers (``gpushare.core.model``). Shared by the unit tests of the core, the
extender and the simulator instead of a copy per test file."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.core.preemption import Resident

__all__ = [
    "DEFAULT_MODEL",
    "gpu_node",
    "node_state",
    "pod_request",
    "resident",
    "state_with",
]

DEFAULT_MODEL = "T4"

ContainerSpec = tuple[int, int] | tuple[str, int, int] | ContainerRequest
"""A container: ``(share, count)`` (named ``c0``, ``c1``, ... by position), ``(name, share,
count)``, or a full ``ContainerRequest``."""


def gpu_node(
    capacities: Sequence[int],
    *,
    name: str = "node",
    model: str = DEFAULT_MODEL,
    models: Sequence[str] | None = None,
    healthy: Sequence[bool] | None = None,
    cpu_milli: int | None = None,
    memory_mib: int | None = None,
) -> Node:
    """Node ``name`` with one GPU per capacity (indices 0..n-1), all of ``model`` unless
    ``models`` gives one per GPU, healthy unless ``healthy`` says otherwise."""
    n = len(capacities)
    gpus = tuple(
        Gpu(index=i, model=m, capacity=c, healthy=h)
        for i, (c, m, h) in enumerate(
            zip(capacities, models or (model,) * n, healthy or (True,) * n, strict=True)
        )
    )
    return Node(name, gpus, cpu_milli=cpu_milli, memory_mib=memory_mib)


def node_state(
    capacities: Sequence[int],
    used: Sequence[int] | None = None,
    *,
    name: str = "node",
    model: str = DEFAULT_MODEL,
    models: Sequence[str] | None = None,
    healthy: Sequence[bool] | None = None,
    cpu_milli: int | None = None,
    memory_mib: int | None = None,
    cpu_used_milli: int = 0,
    memory_used_mib: int = 0,
    workload_tags: Mapping[str, int] | None = None,
    compute_used: Sequence[int] = (),
    whole: Sequence[bool] = (),
) -> NodeState:
    """The state of a ``gpu_node`` with ``used`` memory per GPU (default: nothing used),
    ``compute_used`` compute_milli per GPU and ``whole`` GPUs held whole (default: none)."""
    node = gpu_node(
        capacities, name=name, model=model, models=models, healthy=healthy,
        cpu_milli=cpu_milli, memory_mib=memory_mib,
    )  # fmt: skip
    return NodeState(
        node=node,
        gpu_used=tuple(used) if used is not None else (0,) * len(capacities),
        cpu_used_milli=cpu_used_milli,
        memory_used_mib=memory_used_mib,
        workload_tags=dict(workload_tags or {}),
        gpu_compute_used=tuple(compute_used),
        gpu_whole=tuple(whole),
    )


def pod_request(
    *containers: ContainerSpec, key: str = "ns/pod", cpu_milli: int = 0, memory_mib: int = 0
) -> PodRequest:
    """Pod ``key`` with ``containers`` (``ContainerSpec``) in spec order."""
    built: list[ContainerRequest] = []
    for i, spec in enumerate(containers):
        if isinstance(spec, ContainerRequest):
            built.append(spec)
        elif len(spec) == 3:
            built.append(ContainerRequest(spec[0], spec[1], spec[2]))
        else:
            built.append(ContainerRequest(f"c{i}", spec[0], spec[1]))
    return PodRequest(key, tuple(built), cpu_milli=cpu_milli, memory_mib=memory_mib)


def resident(
    key: str,
    gpus: Mapping[int, int],
    *,
    priority: int = 0,
    started_s: float | None = None,
    budgets: Sequence[str] = (),
    terminating: bool = False,
    compute_milli: int = 0,
    whole: bool = False,
    node: str = "node",
) -> Resident:
    """A pod ``key`` on ``node`` holding ``gpus`` (GPU index → memory units, one container
    ``main`` per distinct amount), each with ``compute_milli`` (or whole, at the given
    amount), for ``gpushare.core.preemption``."""
    by_share: dict[int, list[int]] = {}
    for index, share in sorted(gpus.items()):
        by_share.setdefault(share, []).append(index)
    containers = tuple(
        ContainerAllocation(
            f"c{i}",
            tuple(indices),
            share,
            GPU_COMPUTE_MILLI if whole else compute_milli,
            exclusive=whole,
        )
        for i, (share, indices) in enumerate(sorted(by_share.items()))
    )
    return Resident(
        Allocation(key, node, containers),
        priority=priority,
        started_s=started_s,
        budgets=frozenset(budgets),
        terminating=terminating,
    )


def state_with(
    capacities: Sequence[int], residents: Sequence[Resident], *, name: str = "node"
) -> NodeState:
    """The state of a ``gpu_node`` holding every resident's allocation."""
    state = NodeState.empty(gpu_node(capacities, name=name))
    for r in residents:
        state = state.with_allocation(r.allocation)
    return state
