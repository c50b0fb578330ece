"""Judging a scheduling run from the pods' annotations alone (cluster tests and benchmarks).

A run creates GPU-sharing pods (:class:`Spec`: containers asking ``gpus`` distinct GPUs with
``share`` units each) on kwok nodes of known GPUs, and afterwards reads every pod back through
the API. :func:`read_outcome` turns the annotations into placements; :func:`judge` lists what
is wrong:

* a bound pod whose ``gpushare.io/allocation`` or ``ALIYUN_COM_GPU_MEM_*`` annotations are
  missing, for another node, or do not place each GPU container exactly once on the number of
  distinct GPUs it asked with its whole request (so no pod has two allocations);
* a GPU whose shares sum above its capacity (overcommit);
* a Pending pod that fits somewhere in what the annotations leave free (an exhaustive search:
  :func:`fits_somewhere`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpushare.kube.codec import (
    ALIYUN_ASSUME_TIME,
    ALIYUN_POD,
    ALLOCATION,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    MemoryUnit,
)

__all__ = ["Ask", "Outcome", "ReadBack", "Spec", "fits_somewhere", "judge", "make_pod", "read_pods"]

Placement = dict[tuple[str, int], int]  # (node, GPU index) -> units
Nodes = Mapping[str, list[int]]  # node -> per-GPU capacity (units)


@dataclass(frozen=True)
class Ask:
    """One GPU container: ``gpus`` distinct GPUs with ``share`` units on each."""

    container: str
    gpus: int
    share: int

    @property
    def total(self) -> int:
        return self.gpus * self.share


@dataclass(frozen=True)
class Spec:
    """One pod: its name and GPU containers."""

    name: str
    asks: tuple[Ask, ...]


def make_pod(
    spec: Spec, *, namespace: str, scheduler_name: str, node_selector: Mapping[str, str]
) -> Pod:
    """The Pod of ``spec`` (``gpushare.io/gpu-count`` for containers over several GPUs)."""
    annotations = {}
    if any(a.gpus > 1 for a in spec.asks):
        annotations[GPU_COUNT_ANNOTATION] = json.dumps({a.container: a.gpus for a in spec.asks})
    return Pod(
        metadata=ObjectMeta(name=spec.name, namespace=namespace, annotations=annotations),
        spec=PodSpec(
            schedulerName=scheduler_name,
            nodeSelector=dict(node_selector),
            containers=[
                Container(
                    name=a.container,
                    image="registry.invalid/gpushare/outcome:0",
                    resources=ResourceRequirements(
                        limits={"cpu": "10m", "memory": "16Mi", GPU_MEM: str(a.total)}
                    ),
                )
                for a in spec.asks
            ],
        ),
    )


@dataclass
class Outcome:
    """What the annotations say: placements of bound pods, Pending pods, and problems."""

    bound: dict[str, Placement] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    assume_time_ns: dict[str, int] = field(default_factory=dict)

    def used(self) -> Placement:
        used: Placement = {}
        for placement in self.bound.values():
            for key, amount in placement.items():
                used[key] = used.get(key, 0) + amount
        return used


@dataclass
class ReadBack:
    """The pods of a namespace as read back: bound ones (name, node, annotations), the names of
    the Pending ones, and pods not bound in a phase other than Pending (problems)."""

    bound: list[tuple[str, str, Mapping[str, str]]] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


def read_pods(kube: Client, namespace: str) -> ReadBack:
    """Every pod of ``namespace`` read back through the API (:class:`ReadBack`)."""
    found = ReadBack()
    for pod in kube.list(Pod, namespace=namespace):
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        assert pod.spec is not None
        name, node = pod.metadata.name, pod.spec.nodeName
        if node:
            found.bound.append((name, node, pod.metadata.annotations or {}))
            continue
        phase = pod.status.phase if pod.status is not None else None
        if phase not in (None, "Pending"):
            found.problems.append(f"{name}: unbound in phase {phase}")
        found.pending.append(name)
    return found


def read_outcome(
    kube: Client,
    namespace: str,
    specs: Mapping[str, Spec],
    nodes: Nodes,
    unit: MemoryUnit = MemoryUnit.GIB,
) -> Outcome:
    """Every pod of ``namespace`` read back (``specs``: what each asked)."""
    found = read_pods(kube, namespace)
    outcome = Outcome(pending=found.pending, problems=found.problems)
    for name, node, notes in found.bound:
        placement, problem = placement_of(specs[name], node, notes, nodes, unit)
        if problem:
            outcome.problems.append(f"{name} on {node}: {problem}")
        outcome.bound[name] = placement
        assume = notes.get(ALIYUN_ASSUME_TIME, "")
        if assume.isdigit():
            outcome.assume_time_ns[name] = int(assume)
    return outcome


def placement_of(
    spec: Spec,
    node: str,
    annotations: Mapping[str, str],
    nodes: Nodes,
    unit: MemoryUnit = MemoryUnit.GIB,
) -> tuple[Placement, str]:
    """Where ``spec``'s annotations put it on ``node``, and what is wrong ('' if nothing)."""
    raw = annotations.get(ALLOCATION)
    if raw is None:
        return {}, f"bound without {ALLOCATION}"
    document = json.loads(raw)
    if document.get("node") != node or document.get("unit") != unit:
        return {}, f"allocation for another node or unit: {raw}"
    total = sum(a.total for a in spec.asks)
    if annotations.get(ALIYUN_POD) != str(total):
        return {}, f"ALIYUN_COM_GPU_MEM_POD is not {total}: {annotations}"
    if annotations.get("ALIYUN_COM_GPU_MEM_ASSIGNED") != "false":
        return {}, "ALIYUN_COM_GPU_MEM_ASSIGNED is not 'false'"
    if not annotations.get(ALIYUN_ASSUME_TIME, "").isdigit():
        return {}, "no ALIYUN_COM_GPU_MEM_ASSUME_TIME"
    containers = document.get("containers", [])
    names = [c["name"] for c in containers]
    if sorted(names) != sorted(a.container for a in spec.asks):
        return {}, f"containers placed {names}, asked {[a.container for a in spec.asks]}"
    placement: Placement = {}
    asks = {a.container: a for a in spec.asks}
    for entry in containers:
        ask = asks[entry["name"]]
        gpus = entry["gpus"]
        if len(set(gpus)) != len(gpus) or len(gpus) != ask.gpus or entry["share"] != ask.share:
            return {}, f"container {entry} does not match the request {ask}"
        for gpu in gpus:
            if not 0 <= gpu < len(nodes[node]):
                return {}, f"no GPU {gpu} on {node}"
            placement[node, gpu] = placement.get((node, gpu), 0) + ask.share
    indices = {gpu for _, gpu in placement}
    if len(indices) == 1:
        (only,) = indices
        if annotations.get("ALIYUN_COM_GPU_MEM_IDX") != str(only):
            return {}, f"ALIYUN_COM_GPU_MEM_IDX is not {only}"
        if annotations.get("ALIYUN_COM_GPU_MEM_DEV") != str(nodes[node][only]):
            return {}, "ALIYUN_COM_GPU_MEM_DEV is not the GPU's memory"
    return placement, ""


def judge(outcome: Outcome, specs: Mapping[str, Spec], nodes: Nodes) -> list[str]:
    """Every violation: annotation problems, overcommitted GPUs, Pending pods that fit."""
    problems = list(outcome.problems)
    used = outcome.used()
    for (node, gpu), amount in sorted(used.items()):
        if amount > nodes[node][gpu]:
            problems.append(f"GPU {gpu} of {node} overcommitted: {amount} > {nodes[node][gpu]}")
    for name in outcome.pending:
        where = fits_somewhere(specs[name], used, nodes)
        if where is not None:
            problems.append(f"{name} is Pending but fits on {where}")
    return problems


def fits_somewhere(spec: Spec, used: Placement, nodes: Nodes) -> str | None:
    """A node where ``spec`` fits in what ``used`` leaves free (exhaustive), else ``None``."""
    asks = tuple(sorted(((a.gpus, a.share) for a in spec.asks), key=lambda a: -a[0] * a[1]))
    for node, capacities in nodes.items():
        free = tuple(sorted(c - used.get((node, i), 0) for i, c in enumerate(capacities)))
        if _fits(free, asks):
            return node
    return None


@functools.cache
def _fits(free: tuple[int, ...], asks: tuple[tuple[int, int], ...]) -> bool:
    if not asks:
        return True
    (count, share), rest = asks[0], asks[1:]
    return any(_fits(option, rest) for option in _take(free, count, share))


def _take(free: tuple[int, ...], count: int, share: int) -> Iterator[tuple[int, ...]]:
    """Every distinct ``free`` left after taking ``share`` from ``count`` distinct GPUs."""
    seen: set[tuple[int, ...]] = set()

    def pick(start: int, left: int, current: list[int]) -> Iterator[tuple[int, ...]]:
        if left == 0:
            key = tuple(sorted(current))
            if key not in seen:
                seen.add(key)
                yield key
            return
        for i in range(start, len(current)):
            if current[i] >= share:
                current[i] -= share
                yield from pick(i + 1, left - 1, current)
                current[i] += share

    yield from pick(0, count, list(free))
