"""Judging a run of pods in every dialect from their annotations alone, in both dimensions.

:mod:`gpushare.testing.outcome` judges Alibaba pods (memory only, one unit). This module does
the same for pods written in any dialect (docs/compute.md) on nodes of either memory unit: each
pod is a :class:`DialectSpec` (its containers' limits and annotations as written, and what each
GPU container asks, :class:`DialectAsk`, in the dialect's own terms), each node a
:class:`NodeGpus` (unit and per-GPU capacity). :func:`read_dialect_outcome` reads every pod of a
namespace back through the API and keeps only what ``gpushare.io/allocation`` records (never the
extender's state, never the codec's decoder; :func:`dialect_outcome` does the keeping, for pods
already read); :func:`judge_dialects` lists what is wrong:

* a bound pod without a record, a record for another node or unit, a GPU container placed twice
  or not at all (so no pod has two allocations), on the wrong number of distinct GPUs, on a GPU
  the node lacks, or with a record that does not match its request: the memory resolved into the
  node's unit as docs/compute.md says (MiB rounded up to whole GiB on a GiB node, a percentage
  of the GPU rounded up), the compute asked (``compute``), and for whole GPUs each GPU's own
  whole memory (a container over several GPUs records one share: the smallest of theirs, as
  ``gpushare.core.fit`` records it), 1000 compute and ``whole``;
* a GPU whose memory sums above its capacity (node unit), whose compute sums above 1000
  (``GPU_COMPUTE_MILLI``), or that is held whole and holds anything else;
* a Pending pod that fits a node it may use, against what the records leave free there
  (memory, compute and whole flags per GPU). A pod of one GPU container (every pod of
  :func:`dialect_workload`) is judged without the core, by a count (:func:`fits_by_count`); a
  pod of several falls back to the core's own ``check_fit`` on the state rebuilt from the
  records (:meth:`DialectOutcome.states`), which cannot catch the core wrongly refusing it.

:func:`dialect_workload` is the seeded mix of ``tests/cluster/test_extender_mixed.py``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from lightkube import Client

from gpushare.core.fit import FitStatus, check_fit
from gpushare.core.model import (
    GPU_COMPUTE_MILLI,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.kube.codec import ALLOCATION, MemoryUnit
from gpushare.testing.outcome import ReadBack, read_pods

__all__ = [
    "Basis",
    "DialectAsk",
    "DialectOutcome",
    "DialectSpec",
    "Held",
    "Hold",
    "NodeGpus",
    "dialect_outcome",
    "dialect_workload",
    "fits_by_count",
    "gpu_problems",
    "judge_dialects",
    "pending_that_fit",
    "read_dialect_outcome",
    "records_of",
]

Limits = dict[str, str | int]


class Basis:
    """What a :class:`DialectAsk`'s ``memory`` counts."""

    NODE = "node unit"  # aliyun.com/gpu-mem
    MIB = "MiB"  # tencent.com/vcuda-memory (x 256), nvidia.com/gpumem
    PERCENT = "%"  # nvidia.com/gpumem-percentage


@dataclass(frozen=True)
class NodeGpus:
    """A node's memory unit and its GPUs' capacities (in that unit, index order)."""

    unit: MemoryUnit
    capacities: tuple[int, ...]


@dataclass(frozen=True)
class DialectAsk:
    """One GPU container's ask: ``gpus`` distinct GPUs with ``memory`` (in ``basis``) and
    ``compute_milli`` on each, or with ``whole`` the GPUs whole (``memory`` then 0)."""

    container: str
    gpus: int
    memory: int
    basis: str = Basis.NODE
    compute_milli: int = 0
    whole: bool = False

    def share_on(self, gpus: NodeGpus, indices: tuple[int, ...] = ()) -> int:
        """The memory per GPU on a node of ``gpus``, in its unit (docs/compute.md, "Memory
        basis"): MiB rounded up to the unit, a percentage of the largest GPU rounded up; whole
        GPUs the capacity of the GPUs at ``indices`` (each GPU's own; the smallest of several,
        the one share a record carries). ``ValueError`` for whole GPUs without ``indices``,
        ``IndexError`` for an index the node lacks."""
        if self.whole:
            if not indices:
                raise ValueError(f"container {self.container}: a whole GPU's share needs its GPUs")
            return min(gpus.capacities[i] for i in indices)
        if self.basis == Basis.MIB:
            return math.ceil(self.memory / gpus.unit.mib)
        if self.basis == Basis.PERCENT:
            return math.ceil(self.memory * max(gpus.capacities) / 100)
        return self.memory

    def request_on(self, gpus: NodeGpus) -> ContainerRequest:
        """The core's request for this ask on a node of ``gpus``."""
        if self.whole:
            return ContainerRequest(self.container, 0, self.gpus, exclusive=True)
        return ContainerRequest(
            self.container, self.share_on(gpus), self.gpus, compute_milli=self.compute_milli
        )


@dataclass(frozen=True)
class DialectSpec:
    """One pod: its name, its kind (for reports), its containers' limits and pod annotations as
    written, what each GPU container asks, and the node units it may land on (its node
    selector; every unit when empty)."""

    name: str
    kind: str
    limits: Mapping[str, Limits]
    asks: tuple[DialectAsk, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    units: frozenset[MemoryUnit] = frozenset()

    def may_use(self, gpus: NodeGpus) -> bool:
        return not self.units or gpus.unit in self.units


@dataclass(frozen=True)
class Hold:
    """What one container's record holds on one GPU."""

    pod: str
    node: str
    gpu: int
    share: int
    compute_milli: int
    whole: bool


@dataclass
class Held:
    """What the records put on one GPU: memory (node unit), compute_milli, held whole."""

    memory: int = 0
    compute_milli: int = 0
    whole: bool = False


@dataclass
class DialectOutcome:
    """What the records say: every hold of the bound pods, the bound and Pending pods, and the
    problems found while reading."""

    holds: list[Hold] = field(default_factory=list)
    bound: dict[str, str] = field(default_factory=dict)  # pod -> node
    pending: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def held(self, node: str, gpus: NodeGpus) -> list[Held]:
        """What the holds put on each GPU of ``node`` (index order)."""
        held = [Held() for _ in gpus.capacities]
        for hold in self.holds:
            if hold.node == node:
                gpu = held[hold.gpu]
                gpu.memory += hold.share
                gpu.compute_milli += hold.compute_milli
                gpu.whole = gpu.whole or hold.whole
        return held

    def states(self, nodes: Mapping[str, NodeGpus]) -> dict[str, NodeState]:
        """Each node's state rebuilt from the holds (memory, compute, whole per GPU), for the
        core's ``check_fit``."""
        states: dict[str, NodeState] = {}
        for name, gpus in nodes.items():
            held = self.held(name, gpus)
            used = [h.memory for h in held]
            compute = [h.compute_milli for h in held]
            whole = [h.whole for h in held]
            node = Node(name, tuple(Gpu(i, "", c) for i, c in enumerate(gpus.capacities)))
            states[name] = NodeState(
                node, tuple(used), gpu_compute_used=tuple(compute), gpu_whole=tuple(whole)
            )
        return states


def read_dialect_outcome(
    kube: Client, namespace: str, specs: Mapping[str, DialectSpec], nodes: Mapping[str, NodeGpus]
) -> DialectOutcome:
    """Every pod of ``namespace`` read back through the API (module doc)."""
    return dialect_outcome(read_pods(kube, namespace), specs, nodes)


def dialect_outcome(
    found: ReadBack, specs: Mapping[str, DialectSpec], nodes: Mapping[str, NodeGpus]
) -> DialectOutcome:
    """What the pods ``found`` record (:func:`records_of` for each bound pod; its problems as
    ``"<pod> (<kind>) on <node>: <problem>"``)."""
    outcome = DialectOutcome(pending=list(found.pending), problems=list(found.problems))
    for name, node, notes in found.bound:
        outcome.bound[name] = node
        holds, problem = records_of(specs[name], node, notes, nodes)
        if problem:
            outcome.problems.append(f"{name} ({specs[name].kind}) on {node}: {problem}")
        outcome.holds.extend(holds)
    return outcome


def records_of(
    spec: DialectSpec, node: str, annotations: Mapping[str, str], nodes: Mapping[str, NodeGpus]
) -> tuple[list[Hold], str]:
    """What ``spec``'s record holds on ``node``, and what is wrong with it ('' if nothing)."""
    raw = annotations.get(ALLOCATION)
    if raw is None:
        return [], f"bound without {ALLOCATION}"
    gpus = nodes.get(node)
    if gpus is None or not spec.may_use(gpus):
        return [], f"bound to a node it may not use: {node}"
    document: dict[str, Any] = json.loads(raw)
    if document.get("node") != node or document.get("unit") != gpus.unit:
        return [], f"record for another node or unit: {raw}"
    entries: list[dict[str, Any]] = document.get("containers", [])
    names = sorted(str(e.get("name")) for e in entries)
    if names != sorted(a.container for a in spec.asks):
        return [], f"containers recorded {names}, asked {[a.container for a in spec.asks]}"
    asks = {a.container: a for a in spec.asks}
    holds: list[Hold] = []
    for entry in entries:
        ask = asks[entry["name"]]
        indices: list[int] = entry["gpus"]
        if not indices:
            return [], f"record {entry} names no GPU"
        for index in indices:
            if not 0 <= index < len(gpus.capacities):
                return [], f"no GPU {index} on {node}"
        share = ask.share_on(gpus, tuple(indices))
        compute = GPU_COMPUTE_MILLI if ask.whole else ask.compute_milli
        expected = {"gpus": ask.gpus, "share": share, "compute": compute, "whole": ask.whole}
        found = {
            "gpus": len(set(indices)) if len(set(indices)) == len(indices) else -1,
            "share": entry.get("share"),
            "compute": entry.get("compute", 0),
            "whole": entry.get("whole", False),
        }
        if found != expected:
            return [], f"record {entry} does not match the request {expected}"
        holds.extend(Hold(spec.name, node, i, share, compute, ask.whole) for i in indices)
    return holds, ""


def judge_dialects(
    outcome: DialectOutcome, specs: Mapping[str, DialectSpec], nodes: Mapping[str, NodeGpus]
) -> list[str]:
    """Every violation (module doc): reading problems, GPUs over capacity in either dimension
    or held whole and shared (:func:`gpu_problems`), Pending pods the core fits somewhere
    (:func:`pending_that_fit`)."""
    return [
        *outcome.problems,
        *gpu_problems(outcome, nodes),
        *pending_that_fit(outcome, specs, nodes),
    ]


def gpu_problems(outcome: DialectOutcome, nodes: Mapping[str, NodeGpus]) -> list[str]:
    """GPUs above capacity in memory (node unit) or compute (1000), or held whole and holding
    anything else; none of these heals by waiting."""
    problems: list[str] = []
    on_gpu: dict[tuple[str, int], list[Hold]] = {}
    for hold in outcome.holds:
        on_gpu.setdefault((hold.node, hold.gpu), []).append(hold)
    for (node, gpu), holds in sorted(on_gpu.items()):
        capacity = nodes[node].capacities[gpu]
        memory = sum(h.share for h in holds)
        compute = sum(h.compute_milli for h in holds)
        where = f"GPU {gpu} of {node}"
        if memory > capacity:
            problems.append(f"{where}: memory over capacity, {memory} > {capacity}")
        if compute > GPU_COMPUTE_MILLI:
            problems.append(f"{where}: compute over capacity, {compute} > {GPU_COMPUTE_MILLI}")
        if any(h.whole for h in holds) and len(holds) > 1:
            problems.append(f"{where}: held whole and shared: {sorted(h.pod for h in holds)}")
    return problems


def pending_that_fit(
    outcome: DialectOutcome, specs: Mapping[str, DialectSpec], nodes: Mapping[str, NodeGpus]
) -> list[str]:
    """The Pending pods that fit on a node they may use, against what the records leave free
    there: a pod of one GPU container by :func:`fits_by_count` (not the core), a pod of several
    by the core's ``check_fit`` on the rebuilt state (a fallback: it trusts the code under
    test, and no pod of :func:`dialect_workload` needs it)."""
    problems: list[str] = []
    held = {node: outcome.held(node, gpus) for node, gpus in nodes.items()}
    states: dict[str, NodeState] | None = None
    for name in outcome.pending:
        spec = specs[name]
        for node, gpus in nodes.items():
            if not spec.may_use(gpus):
                continue
            if len(spec.asks) == 1:
                fits = fits_by_count(spec.asks[0], gpus, held[node])
            else:
                states = states or outcome.states(nodes)
                request = PodRequest(name, tuple(a.request_on(gpus) for a in spec.asks))
                fits = check_fit(states[node], request).status is FitStatus.FITS
            if fits:
                problems.append(f"{name} ({spec.kind}) is Pending but fits on {node}")
                break
    return problems


def fits_by_count(ask: DialectAsk, gpus: NodeGpus, held: list[Held]) -> bool:
    """Whether one container's ``ask`` fits a node of ``gpus`` holding ``held`` (per GPU, index
    order), independently of the core: it needs ``ask.gpus`` distinct GPUs, each taking it on
    its own, so it fits when enough GPUs qualify. For whole GPUs a GPU qualifies when it holds
    nothing (no memory, no compute, not held whole); for a share when it is not held whole
    and has the share resolved on that node free in memory and ``compute_milli`` free in
    compute (docs/compute.md)."""
    if ask.whole:
        qualifying = [h.memory == 0 and h.compute_milli == 0 and not h.whole for h in held]
    else:
        share = ask.share_on(gpus)
        qualifying = [
            not h.whole
            and capacity - h.memory >= share
            and GPU_COMPUTE_MILLI - h.compute_milli >= ask.compute_milli
            for h, capacity in zip(held, gpus.capacities, strict=True)
        ]
    return sum(qualifying) >= ask.gpus


# -- the mixed workload ------------------------------------------------------------------------

GIB_ONLY = frozenset({MemoryUnit.GIB})


def dialect_workload(count: int, seed: int) -> list[DialectSpec]:
    """``count`` pods (seeded) cycling over the dialects (docs/compute.md): Alibaba
    ``aliyun.com/gpu-mem`` on one or two GPUs and with ``aliyun.com/gpu-core.percentage``,
    gpushare's ``gpushare.io/exclusive``, Tencent shares (``vcuda-memory`` in 256 MiB, some not
    a whole GiB) and whole GPUs (``vcuda-core`` 100, 200), HAMi shares in MiB or percent with
    and without ``gpucores``, over one or two GPUs, and whole GPUs (``gpucores: 100``). Pods
    in the node's unit (Alibaba, exclusive) may use GiB nodes only; the others any node."""
    rng = random.Random(seed)
    specs: list[DialectSpec] = []
    for i in range(count):
        name = f"m{i:03d}"
        slot = i % 40
        limits: Limits
        annotations: dict[str, str] = {}
        units: frozenset[MemoryUnit] = frozenset()
        if slot in (5, 25):
            share = rng.choice([2, 4, 8])
            kind, limits = "alibaba-2gpu", {"aliyun.com/gpu-mem": 2 * share}
            annotations["gpushare.io/gpu-count"] = "2"
            ask = DialectAsk("main", 2, share)
            units = GIB_ONLY
        elif slot in (6, 26):
            memory, percent = rng.choice([2, 4]), rng.choice([20, 30, 50])
            kind = "alibaba-core"
            limits = {"aliyun.com/gpu-mem": memory, "aliyun.com/gpu-core.percentage": percent}
            ask = DialectAsk("main", 1, memory, compute_milli=percent * 10)
            units = GIB_ONLY
        elif slot in (7, 8, 9, 27, 28, 29, 30):
            core, memory_units = rng.choice([10, 20, 25, 30, 50, 70]), rng.choice([4, 5, 12, 24])
            kind = "tencent-share"
            limits = {"tencent.com/vcuda-core": core, "tencent.com/vcuda-memory": memory_units}
            ask = DialectAsk("main", 1, memory_units * 256, Basis.MIB, core * 10)
        elif slot in (10, 18):
            gpus = 2 if i % 80 == 10 else 1
            kind, limits = "tencent-whole", {"tencent.com/vcuda-core": 100 * gpus}
            ask = DialectAsk("main", gpus, 0, whole=True)
        elif slot in (11, 12, 14, 31, 32, 34):
            memory_mib = rng.choice([1024, 2048, 3000, 4096, 8192])
            kind, limits = "hami-mib", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory_mib}
            cores = rng.choice([0, 10, 20, 30, 50])
            if cores:
                limits["nvidia.com/gpucores"] = cores
            ask = DialectAsk("main", 1, memory_mib, Basis.MIB, cores * 10)
        elif slot in (13, 33):
            percent, cores = rng.choice([10, 25, 50]), rng.choice([20, 40])
            kind = "hami-percent"
            limits = {"nvidia.com/gpumem-percentage": percent, "nvidia.com/gpucores": cores}
            ask = DialectAsk("main", 1, percent, Basis.PERCENT, cores * 10)
        elif slot == 15:
            kind = "hami-2gpu"
            limits = {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 25}
            ask = DialectAsk("main", 2, 4096, Basis.MIB, 250)
        elif slot in (16, 36):
            kind, limits = "hami-whole", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}
            ask = DialectAsk("main", 1, 0, whole=True)
        elif slot == 17:
            kind, limits = "exclusive", {"aliyun.com/gpu-mem": 16}
            annotations["gpushare.io/exclusive"] = "true"
            ask = DialectAsk("main", 1, 0, whole=True)
            units = GIB_ONLY
        else:
            memory = rng.choice([1, 2, 3, 4, 6, 8, 12])
            kind, limits = "alibaba", {"aliyun.com/gpu-mem": memory}
            ask = DialectAsk("main", 1, memory)
            units = GIB_ONLY
        specs.append(DialectSpec(name, kind, {"main": limits}, (ask,), annotations, units))
    return specs
