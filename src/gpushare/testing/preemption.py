"""Preemption on the real control plane (``tests/cluster/test_preemption.py``,
``bench/preemption.py``): PriorityClasses, low-priority pods already running where a case puts
them, preemptors sent through kube-scheduler, and what happened, read back from the API.

* **Victims linger.** kwok deletes a pod the moment it is being deleted; the pods seeded here
  carry the finalizer :data:`FINALIZER`, so an evicted (or preempted) pod stays *terminating*
  until :meth:`Case.release` lets it go, as a pod in its grace period would. Every terminating
  pod is an eviction seen; no pod of the case is deleted any other way.
* **Placement is the case's.** Low-priority pods are created bound (``spec.nodeName`` and the
  extender's allocation annotations, ``gpushare.testing.pods.bound_gpu_pod``) on the GPUs the
  case names, started one second apart where the case needs an order of start times.
* **Judged from the pods**: which pods are terminating, where the preemptor is bound and on which
  GPUs (its ``gpushare.io/allocation``), and that no GPU is over capacity counting every pod
  still holding GPUs (terminating ones included) from their annotations alone.
* **Holds** are read as every shard's ConfigMap merged (:func:`read_hold_shards`), after the
  shards were created as the chart creates them (:func:`create_hold_shards`).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Namespace, Pod
from lightkube.resources.scheduling_v1 import PriorityClass
from lightkube.types import PatchType

from gpushare.core.model import GPU_COMPUTE_MILLI, Allocation, ContainerAllocation, Node
from gpushare.kube.codec import (
    ALLOCATION,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    MemoryUnit,
    allocation_annotations,
)
from gpushare.kube.codec.dialects import ALIYUN_CORE_PERCENT
from gpushare.kube.holds import SHARDS_ANNOTATION, HoldsRef
from gpushare.testing.controlplane import wait_for
from gpushare.testing.core import gpu_node as core_node
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node

__all__ = [
    "FINALIZER",
    "PRIORITIES",
    "Case",
    "Seed",
    "create_hold_shards",
    "ensure_priority_classes",
    "preemptor",
    "read_hold_shards",
]

FINALIZER = "gpushare.io/test-terminating"
PRIORITIES = {"gpushare-low": 100, "gpushare-mid": 500, "gpushare-high": 1000}
"""The PriorityClasses a case uses (name → value)."""
NEVER = "gpushare-high-never"
"""A PriorityClass of value 1000 with ``preemptionPolicy: Never`` (the API server takes a pod's
policy from its class)."""
CASE_LABEL = "gpushare.io/test-case"
IMAGE = "registry.invalid/gpushare/preemption:0"


def ensure_priority_classes(kube: Client) -> None:
    """Create :data:`PRIORITIES` (kept if they exist)."""
    classes = [PriorityClass(metadata=ObjectMeta(name=n), value=v) for n, v in PRIORITIES.items()]
    classes.append(
        PriorityClass(metadata=ObjectMeta(name=NEVER), value=1000, preemptionPolicy="Never")
    )
    for priority_class in classes:
        try:
            kube.create(priority_class)
        except ApiError as error:
            if error.status.code != 409:
                raise


@dataclass(frozen=True)
class Seed:
    """A running pod the case places itself: ``gpus`` (GPU index → GiB on it, the same on
    each), its PriorityClass, ``compute`` percent of each GPU (``aliyun.com/gpu-core.
    percentage``; 0: none) and ``labels``."""

    name: str
    node: str
    gpus: Mapping[int, int]
    priority: str = "gpushare-low"
    compute: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)


def preemptor(
    name: str,
    gib: int,
    *,
    gpus: int = 1,
    priority: str = "gpushare-high",
    compute: int = 0,
    never: bool = False,
) -> Pod:
    """A pod asking ``gib`` GiB on each of ``gpus`` GPUs (and ``compute`` percent of each),
    of PriorityClass ``priority``; ``never``: of :data:`NEVER` instead (``preemptionPolicy:
    Never``). The case fills in its namespace, scheduler and node selector."""
    limits = {"cpu": "10m", "memory": "16Mi", GPU_MEM: str(gib * gpus)}
    if compute:
        limits[ALIYUN_CORE_PERCENT] = str(compute)
    annotations = {GPU_COUNT_ANNOTATION: str(gpus)} if gpus > 1 else {}
    return Pod(
        metadata=ObjectMeta(name=name, annotations=annotations),
        spec=PodSpec(
            priorityClassName=NEVER if never else priority,
            containers=[
                Container(name="main", image=IMAGE, resources=ResourceRequirements(limits=limits))
            ],
        ),
    )


@dataclass
class Case:
    """One case in namespace ``name``, on its own kwok nodes (GPU sizes in GiB per node),
    scheduled by ``scheduler``. Use as a context manager: nodes and namespace go at exit.
    ``linger``: seeded pods carry :data:`FINALIZER` (an evicted one stays terminating until
    :meth:`release`); without it an evicted pod goes at once (kwok)."""

    kube: Client
    name: str
    nodes: Mapping[str, Sequence[int]]
    scheduler: str
    linger: bool = True
    _made: dict[str, Node] = field(default_factory=dict)

    def __enter__(self) -> Case:
        ensure_priority_classes(self.kube)
        create_nodes(
            self.kube,
            [
                gpu_node(n, list(gpus), unit=MemoryUnit.GIB, labels={CASE_LABEL: self.name})
                for n, gpus in self.nodes.items()
            ],
            timeout=600.0,
        )
        self._made = {n: core_node(list(g), name=n) for n, g in self.nodes.items()}
        self.kube.create(Namespace(metadata=ObjectMeta(name=self.name)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
        for pod in self.kube.list(Pod, namespace=self.name):
            assert pod.metadata is not None
            assert pod.metadata.name is not None
            self.kube.delete(Pod, pod.metadata.name, namespace=self.name, grace_period=0)
        self.kube.delete(Namespace, self.name)
        delete_nodes(self.kube, list(self.nodes))

    # -- making pods -----------------------------------------------------------------------

    def seed(self, *seeds: Seed, apart_s: float = 0.0) -> None:
        """Create ``seeds`` bound where they say, running (kwok), finalizer set; ``apart_s``
        between two of them (start times are whole seconds: 1.1 gives each its own), then
        wait until all run."""
        for i, seed in enumerate(seeds):
            if i and apart_s:
                time.sleep(apart_s)
            self.kube.create(self._seeded(seed), namespace=self.name)
        wait_for(
            f"{len(seeds)} seeded pods running in {self.name}",
            lambda: self._running({s.name for s in seeds}) or None,
            60,
        )

    def seed_waves(self, waves: Sequence[Sequence[Seed]]) -> None:
        """Seed each wave, a second after the one before (``Scenario.waves``)."""
        for i, wave in enumerate(waves):
            if i:
                time.sleep(1.1)
            self.seed(*wave)

    def _running(self, names: set[str]) -> bool:
        running = {
            p.metadata.name
            for p in self.kube.list(Pod, namespace=self.name)
            if p.metadata is not None and p.status is not None and p.status.phase == "Running"
        }
        return names <= running

    def _seeded(self, seed: Seed) -> Pod:
        node = self._made[seed.node]
        shares = set(seed.gpus.values())
        assert len(shares) == 1, seed
        share = shares.pop()
        compute = seed.compute * GPU_COMPUTE_MILLI // 100
        allocation = Allocation(
            f"{self.name}/{seed.name}",
            seed.node,
            (ContainerAllocation("main", tuple(sorted(seed.gpus)), share, compute),),
        )
        annotations = allocation_annotations(
            allocation, node, now_ns=time.time_ns(), unit=MemoryUnit.GIB
        )
        annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
        if len(seed.gpus) > 1:
            annotations[GPU_COUNT_ANNOTATION] = str(len(seed.gpus))
        limits = {"cpu": "10m", "memory": "16Mi", GPU_MEM: str(share * len(seed.gpus))}
        if seed.compute:
            limits[ALIYUN_CORE_PERCENT] = str(seed.compute)
        return Pod(
            metadata=ObjectMeta(
                name=seed.name,
                namespace=self.name,
                annotations=annotations,
                labels=dict(seed.labels),
                finalizers=[FINALIZER] if self.linger else None,
            ),
            spec=PodSpec(
                nodeName=seed.node,
                priorityClassName=seed.priority,
                terminationGracePeriodSeconds=5,
                containers=[
                    Container(
                        name="main", image=IMAGE, resources=ResourceRequirements(limits=limits)
                    )
                ],
            ),
        )

    def submit(self, pod: Pod) -> str:
        """Create ``pod`` in the case's namespace for its scheduler, on its nodes; its name."""
        assert pod.metadata is not None
        assert pod.spec is not None
        assert pod.metadata.name is not None
        pod.metadata.namespace = self.name
        pod.spec.schedulerName = self.scheduler
        pod.spec.nodeSelector = {CASE_LABEL: self.name}
        self.kube.create(pod, namespace=self.name)
        return pod.metadata.name

    # -- reading ---------------------------------------------------------------------------

    def pods(self) -> dict[str, Pod]:
        """The case's pods by name."""
        return {
            p.metadata.name: p
            for p in self.kube.list(Pod, namespace=self.name)
            if p.metadata is not None and p.metadata.name is not None
        }

    def terminating(self) -> set[str]:
        """The pods being deleted: the evictions seen."""
        return {
            name
            for name, pod in self.pods().items()
            if pod.metadata is not None and pod.metadata.deletionTimestamp is not None
        }

    def placement(self, name: str) -> tuple[str, tuple[int, ...]] | None:
        """(node, GPU indices) of a bound pod from its ``gpushare.io/allocation``, or
        ``None`` while it is not bound."""
        pod = self.kube.get(Pod, name, namespace=self.name)
        assert pod.spec is not None
        assert pod.metadata is not None
        if not pod.spec.nodeName:
            return None
        record = json.loads((pod.metadata.annotations or {})[ALLOCATION])
        gpus = sorted({g for c in record["containers"] for g in c["gpus"]})
        return str(pod.spec.nodeName), tuple(gpus)

    def nominated(self, name: str) -> str | None:
        """``status.nominatedNodeName`` of pod ``name``."""
        pod = self.kube.get(Pod, name, namespace=self.name)
        return pod.status.nominatedNodeName if pod.status is not None else None

    def wait_terminating(self, count: int, timeout_s: float = 60.0) -> set[str]:
        """Wait until at least ``count`` pods are terminating; those pods."""
        return wait_for(
            f"{count} evictions in {self.name}",
            lambda: found if len(found := self.terminating()) >= count else None,
            timeout_s,
        )

    def wait_bound(self, name: str, timeout_s: float = 60.0) -> tuple[str, tuple[int, ...]]:
        """Wait until pod ``name`` is bound; its (node, GPUs)."""
        return wait_for(f"{self.name}/{name} bound", lambda: self.placement(name), timeout_s)

    def release(self, names: Iterable[str] | None = None) -> None:
        """Let terminating pods (``names``, default all) finish: remove the finalizer."""
        for name, pod in self.pods().items():
            if names is not None and name not in set(names):
                continue
            assert pod.metadata is not None
            if FINALIZER in (pod.metadata.finalizers or []):
                self.kube.patch(
                    Pod,
                    name,
                    {"metadata": {"finalizers": None}},
                    namespace=self.name,
                    patch_type=PatchType.MERGE,
                )

    def overcommitted(self) -> list[str]:
        """Every GPU whose allocations (all pods holding GPUs, terminating ones included, from
        their annotations) sum above its capacity: ``node GPU i: used/capacity``."""
        used: dict[tuple[str, int], int] = {}
        for pod in self.pods().values():
            assert pod.metadata is not None
            record = (pod.metadata.annotations or {}).get(ALLOCATION)
            if pod.spec is None or not pod.spec.nodeName or record is None:
                continue
            for c in json.loads(record)["containers"]:
                for g in c["gpus"]:
                    key = (str(pod.spec.nodeName), g)
                    used[key] = used.get(key, 0) + c["share"]
        return [
            f"{node} GPU {gpu}: {amount}/{self.nodes[node][gpu]}"
            for (node, gpu), amount in sorted(used.items())
            if amount > self.nodes[node][gpu]
        ]


@dataclass(frozen=True)
class Scenario:
    """One case of the table in docs/usage.md, "Priorities and preemption": ``nodes`` (GPU
    sizes in GiB), low and high pods seeded in ``waves`` (each wave starts a second after the
    one before: whole-second start times order them), a high-priority pod asking ``ask`` GiB,
    and the right outcome in words."""

    name: str
    nodes: Mapping[str, Sequence[int]]
    waves: tuple[tuple[Seed, ...], ...]
    ask: int
    right: str


def _node_a(node: str) -> tuple[tuple[Seed, ...], tuple[Seed, ...]]:
    """GPU0 and GPU1 each high + low (the table's node A), as two waves: the lows started
    later (kube-scheduler prefers the node whose victims started last)."""
    highs = (
        Seed(f"{node}-h0", node, {0: 8}, "gpushare-high"),
        Seed(f"{node}-h1", node, {1: 8}, "gpushare-high"),
    )
    return highs, (Seed(f"{node}-l0", node, {0: 8}), Seed(f"{node}-l1", node, {1: 8}))


def _node_b(node: str) -> tuple[Seed, ...]:
    """GPU0 low + low, GPU1 high + high (the table's node B)."""
    return (
        Seed(f"{node}-l0", node, {0: 8}),
        Seed(f"{node}-l1", node, {0: 8}),
        Seed(f"{node}-h0", node, {1: 8}, "gpushare-high"),
        Seed(f"{node}-h1", node, {1: 8}, "gpushare-high"),
    )


def _a_and_b(a_nodes: Sequence[str], b_node: str) -> tuple[tuple[Seed, ...], ...]:
    """Nodes like A and one like B, A's lows the most recently started."""
    first = tuple(s for n in a_nodes for s in _node_a(n)[0]) + _node_b(b_node)
    return first, tuple(s for n in a_nodes for s in _node_a(n)[1])


ISSUE_CASES = (
    Scenario(
        "1", {"s1": [16, 16]},
        ((Seed("a", "s1", {0: 8}), Seed("b", "s1", {1: 8})),
         (Seed("c", "s1", {0: 8}), Seed("d", "s1", {1: 8}))),
        16, "evict the 2 lows of one GPU, bind there",
    ),
    Scenario(
        "2", {"s2": [16, 16]},
        ((Seed("a", "s2", {0: 12}),), (Seed("b", "s2", {1: 12}),)),
        8, "evict one 12 GiB low, bind there",
    ),
    Scenario("3", {"s3-a": [16, 16], "s3-b": [16, 16]},
             _a_and_b(["s3-a"], "s3-b"), 16, "evict B's 2 lows only"),
    Scenario(
        "3'", {**{f"s3p-a{i}": [16, 16] for i in range(3)}, "s3p-b": [16, 16]},
        _a_and_b([f"s3p-a{i}" for i in range(3)], "s3p-b"), 16, "2 evicted",
    ),
    Scenario(
        "4", {"s4": [16, 16]},
        (tuple(Seed(f"p{i}", "s4", {i // 2: 8}) for i in range(4)),),
        20, "evict nothing: it can never fit",
    ),
)  # fmt: skip
"""The table of docs/usage.md, "Priorities and preemption", as ``bench/preemption.py
--cases`` replays it under both preemptions; ``tests/cluster/test_preemption.py`` holds the
right outcomes."""


def create_hold_shards(kube: Client, ref: HoldsRef) -> None:
    """Create the holds ConfigMaps of ``ref`` as the chart does (the extender may only patch
    them; its count on the first); those that exist are left alone."""
    for i, name in enumerate(ref.names):
        annotations = {SHARDS_ANNOTATION: str(ref.shards)} if i == 0 else None
        metadata = ObjectMeta(name=name, namespace=ref.namespace, annotations=annotations)
        with contextlib.suppress(ApiError):
            kube.create(ConfigMap(metadata=metadata))


def read_hold_shards(kube: Client, ref: HoldsRef) -> dict[str, str]:
    """Every entry of the holds ConfigMaps of ``ref``, merged (preemptor UID -> hold JSON); a
    missing shard holds nothing."""
    entries: dict[str, str] = {}
    for name in ref.names:
        with contextlib.suppress(ApiError):
            entries.update(kube.get(ConfigMap, name, namespace=ref.namespace).data or {})
    return entries
