"""Fakes for the extender's component tests: pod and node JSON, a recording binder and event sink,
and :func:`serve_in_thread` (an ASGI app under a real uvicorn server on a loopback port).

Pods and nodes are the plain dicts kube-scheduler sends (``ExtenderArgs.Pod``, ``Nodes.items``);
GPU nodes come from :func:`gpushare.testing.nodes.gpu_node`, so they carry the same
``gpushare.io/gpu-inventory`` contract as the kwok nodes of the cluster tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn

from gpushare.core.model import Allocation, ContainerAllocation, PodRequest
from gpushare.core.preemption import Hold
from gpushare.extender.bindapi import BindEvent, Binding
from gpushare.extender.state import ExtenderState
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPUSHARE_LABEL,
    MemoryUnit,
    allocation_annotations,
    pod_request,
    pod_uid,
)
from gpushare.kube.evictions import Eviction, EvictionOutcome
from gpushare.kube.refs import PodRef
from gpushare.testing.controlplane import wait_until
from gpushare.testing.nodes import FakeGpu, gpu_node, plain_node


def node_json(
    name: str, gpus: Sequence[int | FakeGpu], *, unit: MemoryUnit = MemoryUnit.MIB
) -> dict[str, Any]:
    """A GPU-share Node as JSON (``gpu_node``), per-GPU memories in ``unit``."""
    result: dict[str, Any] = gpu_node(name, gpus, unit=unit).to_dict()
    return result


def plain_node_json(name: str) -> dict[str, Any]:
    """A Node without GPUs, as JSON."""
    result: dict[str, Any] = plain_node(name).to_dict()
    return result


def alibaba_node_json(name: str, total: int, count: int) -> dict[str, Any]:
    """A node as Alibaba's device plugin leaves it: capacity only, no inventory annotation."""
    capacity = {
        "cpu": "32",
        "memory": "256Gi",
        GPU_MEM: str(total),
        GPU_COUNT: str(count),
    }
    return {
        "metadata": {"name": name, "labels": {GPUSHARE_LABEL: "true"}},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def pod_json(
    name: str,
    gpu_mem: int | Sequence[int | None] | None = None,
    *,
    namespace: str = "default",
    uid: str | None = None,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    limits: Mapping[str, str] | None = None,
    priority: int | None = None,
    preemption_policy: str | None = None,
    started: str | None = None,
    deleting: bool = False,
    labels: Mapping[str, str] | None = None,
    scheduler: str | None = "gpushare",
    node_selector: Mapping[str, str] | None = None,
    node_affinity: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod as kube-scheduler sends it. ``gpu_mem``: one container ``main`` asking that much,
    or one container per entry (``c0``, ``c1``...); ``limits`` are added to every container;
    ``node`` sets ``spec.nodeName`` (a bound pod); ``priority`` ``spec.priority``,
    ``preemption_policy`` ``spec.preemptionPolicy``, ``started`` ``status.startTime``
    (RFC 3339), ``deleting`` a ``metadata.deletionTimestamp``, ``labels`` its labels;
    ``scheduler`` its ``spec.schedulerName`` (``None``: unset, the default scheduler's),
    ``node_selector`` its ``spec.nodeSelector``, ``node_affinity`` the ``nodeSelectorTerms``
    of its required node affinity."""
    amounts = [gpu_mem] if isinstance(gpu_mem, int) or gpu_mem is None else list(gpu_mem)
    names = ["main"] if len(amounts) == 1 else [f"c{i}" for i in range(len(amounts))]
    containers = []
    for container_name, amount in zip(names, amounts, strict=True):
        resources = {"cpu": "100m", **(limits or {})}
        if amount is not None:
            resources[GPU_MEM] = str(amount)
        containers.append(
            {
                "name": container_name,
                "image": "registry.invalid/gpushare/test:0",
                "resources": {"limits": dict(resources), "requests": dict(resources)},
            }
        )
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid or str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    if labels:
        metadata["labels"] = dict(labels)
    if deleting:
        metadata["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    spec: dict[str, Any] = {"containers": containers}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if node_selector is not None:
        spec["nodeSelector"] = dict(node_selector)
    if node_affinity is not None:
        required = {"nodeSelectorTerms": [dict(term) for term in node_affinity]}
        spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}
        }
    if node is not None:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    if preemption_policy is not None:
        spec["preemptionPolicy"] = preemption_policy
    status: dict[str, Any] = {"phase": "Running" if node is not None else "Pending"}
    if started is not None:
        status["startTime"] = started
    return {"metadata": metadata, "spec": spec, "status": status}


def plain_request(pod: Mapping[str, Any]) -> PodRequest:
    """The ``PodRequest`` that ``pod`` (an ``aliyun.com/gpu-mem`` pod, ``pod_json``) asks on
    every node: the codec's ask, which needs no node to resolve. ``AssertionError`` for a pod
    whose ask waits for a node (memory in MiB or percent, GPUs by type or UUID)."""
    ask = pod_request(dict(pod))
    assert ask.plain is not None, f"pod {ask.key} is resolved per node"
    return ask.plain


def bound_pod(
    state: ExtenderState,
    name: str,
    node: str,
    gpus: Mapping[int, int],
    *,
    namespace: str = "default",
    **pod: Any,
) -> dict[str, Any]:
    """Pod ``namespace/name`` bound to ``node`` with one container ``main`` holding
    ``gpus`` (GPU index → amount; several GPUs must hold the same amount), fed to ``state`` as
    the watch would (``pod``: more ``pod_json`` keywords: ``priority``, ``started``...);
    returns the pod. ``AssertionError`` if the state does not commit it."""
    info = state.cluster.node(node)
    assert info is not None, f"unknown node {node}"
    shares = set(gpus.values())
    assert len(shares) == 1, f"one amount per GPU, got {gpus}"
    share = shares.pop()
    allocation = Allocation(
        f"{namespace}/{name}", node, (ContainerAllocation("main", tuple(sorted(gpus)), share),)
    )
    notes = allocation_annotations(allocation, info.node, now_ns=1, unit=info.unit)
    notes[ALIYUN_ASSIGNED] = "true"
    if len(gpus) > 1:
        notes[GPU_COUNT_ANNOTATION] = str(len(gpus))
    obj = pod_json(
        name, share * len(gpus), namespace=namespace, node=node, annotations=notes, **pod
    )
    result = state.observe_pod(obj)
    assert result is not None
    assert not isinstance(result, Allocation)
    assert result.ok, result
    return obj


@dataclass
class RecordingBinder:
    """A ``Binder`` that records every call. ``failure`` (an error text) or ``error`` (raised:
    unknown outcome) make binds fail; ``gate``, when set, is awaited before answering so that
    tests can hold binds in flight."""

    failure: str | None = None
    error: Exception | None = None
    gate: asyncio.Event | None = None
    calls: list[Binding] = field(default_factory=list)

    async def bind(self, binding: Binding) -> str | None:
        """Record ``binding``, then answer as configured."""
        self.calls.append(binding)
        if self.gate is not None:
            await self.gate.wait()
        else:
            await asyncio.sleep(0)  # yield, as a real API call would
        if self.error is not None:
            raise self.error
        return self.failure


@dataclass
class RecordingEvents:
    """An ``EventSink`` that keeps every event."""

    events: list[BindEvent] = field(default_factory=list)

    async def emit(self, event: BindEvent) -> None:
        """Keep ``event``."""
        self.events.append(event)


def seed_bound_pods(state: ExtenderState, node: str, used: Sequence[int]) -> None:
    """Bound pods ``seed-<node>-<i>`` holding ``used[i]`` on GPU i, fed to ``state`` as the
    watch would; ``AssertionError`` if the state does not commit one."""
    info = state.cluster.node(node)
    assert info is not None, f"unknown node {node}"
    for index, amount in enumerate(used):
        if amount:
            name = f"seed-{node}-{index}"
            allocation = Allocation(
                f"default/{name}", node, (ContainerAllocation("main", (index,), amount),)
            )
            notes = allocation_annotations(allocation, info.node, now_ns=1, unit=info.unit)
            result = state.observe_pod(pod_json(name, amount, node=node, annotations=notes))
            assert result is not None
            assert not isinstance(result, Allocation)
            assert result.ok


def populated_state(
    nodes: int,
    pods: int,
    *,
    pending: int = 0,
    started: bool = False,
    gpus_per_node: int = 8,
    gpu_gib: int = 16,
) -> tuple[ExtenderState, list[str]]:
    """A synced state for the benchmarks: ``nodes`` nodes ``node-0000``, ... of
    ``gpus_per_node`` GPUs of ``gpu_gib`` GiB, ``pods`` bound pods ``bench/pod-<i>`` of 1 or
    2 GiB spread round-robin over the nodes and their GPUs (about 20 pods a node over 8 GPUs
    stays under 16 GiB a GPU), started by the device plugin when ``started`` (else not yet),
    and ``pending`` unbound pods ``bench/pending-<i>`` asking 4 GiB. Returns the state and
    the node names."""
    state = ExtenderState()
    names = [f"node-{i:04d}" for i in range(nodes)]
    infos = [
        state.upsert_node(node_json(name, [gpu_gib] * gpus_per_node, unit=MemoryUnit.GIB))
        for name in names
    ]
    for i in range(pods):
        info = infos[i % nodes]
        share = 1 + (i // nodes) % 2
        gpu = (i // nodes) % gpus_per_node
        allocation = Allocation(
            f"bench/pod-{i}", info.node.name, (ContainerAllocation("main", (gpu,), share),)
        )
        notes = allocation_annotations(allocation, info.node, now_ns=0, unit=MemoryUnit.GIB)
        if started:
            notes[ALIYUN_ASSIGNED] = "true"
        state.observe_pod(
            pod_json(f"pod-{i}", share, namespace="bench", node=info.node.name, annotations=notes)
        )
    for i in range(pending):
        state.cluster.remember_pod(pod_json(f"pending-{i}", 4, namespace="bench"))
    state.cluster.mark_synced()
    return state, names


@contextlib.contextmanager
def serve_in_thread(app: Any, *, start_timeout_s: float = 10.0, **config: Any) -> Iterator[int]:
    """Serve ``app`` with uvicorn (``config``: more ``uvicorn.Config`` keywords, e.g. TLS or
    ``gpushare.extender.limits.uvicorn_settings``) in a daemon thread on a free loopback port;
    yields the port, stops the server on exit."""
    server = uvicorn.Server(
        uvicorn.Config(app, log_config=None, ws="none", lifespan="on", **config)
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the uvicorn thread died during start-up")
        return bool(server.started)

    wait_until("uvicorn to start", started, start_timeout_s)
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


@dataclass
class RecordingEvictor:
    """An evictor (``gpushare.extender.preemption.Evicts``) that records every call: pods in
    ``refuse`` (key → the server's words) are refused, as a PodDisruptionBudget would; every
    other eviction succeeds. ``evicted`` lists the real evictions, in order."""

    refuse: dict[str, str] = field(default_factory=dict)
    calls: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def evicted(self) -> list[str]:
        """The pods evicted for real, in order."""
        return [key for key, dry_run in self.calls if not dry_run]

    async def evict(self, pod: PodRef, *, dry_run: bool = False) -> Eviction:
        """Record, then answer as configured."""
        self.calls.append((pod.key, dry_run))
        await asyncio.sleep(0)
        if pod.key in self.refuse:
            return Eviction(pod, EvictionOutcome.REFUSED, self.refuse[pod.key], dry_run)
        return Eviction(pod, EvictionOutcome.EVICTED, "", dry_run)


@dataclass
class PodsOnServer:
    """A pod reader (``gpushare.extender.preemption.ReadsPods``) over ``pods`` (key → the
    API server's copy now); ``reads`` lists the keys read, in order."""

    pods: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    reads: list[str] = field(default_factory=list)

    async def read(self, pod: PodRef) -> Mapping[str, Any] | None:
        """The copy of ``pod`` if it is that incarnation, else ``None``."""
        self.reads.append(pod.key)
        await asyncio.sleep(0)
        found = self.pods.get(pod.key)
        return found if found is not None and pod_uid(found) == pod.uid else None


@dataclass
class RecordingHoldStore:
    """A hold store (``gpushare.extender.preemption.HoldWriter``) in memory: ``holds`` by
    preemptor UID; ``failure``, when set, is raised by every call."""

    holds: dict[str, Hold] = field(default_factory=dict)
    failure: Exception | None = None

    async def put(self, hold: Hold) -> None:
        """Keep ``hold``."""
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        self.holds[hold.uid] = hold

    async def drop(self, uid: str, read_from: str = "") -> None:
        """Forget the hold of ``uid`` (``read_from``: where the book read it; one store
        here)."""
        await asyncio.sleep(0)
        if self.failure is not None:
            raise self.failure
        self.holds.pop(uid, None)


@dataclass
class RecordingNotes:
    """Preemption Events (``gpushare.extender.preemption.PreemptionEvents``), kept as
    ``(pod, reason, message, warning)``."""

    notes: list[tuple[str, str, str, bool]] = field(default_factory=list)

    def note(self, pod: str, uid: str, reason: str, message: str, *, warning: bool = False) -> None:
        """Keep the Event."""
        self.notes.append((pod, reason, message, warning))

    def reasons(self, pod: str) -> list[str]:
        """The reasons of the Events on ``pod``, in order."""
        return [reason for key, reason, _, _ in self.notes if key == pod]
