"""Allocate: give each container the GPU(s) the extender decided for its pod (design.md, "the
handshake"; the rule and the matching are ``gpushare.core.handshake``).

For each ``ContainerAllocateRequest`` (kubelet sends exactly one, spec 2.5), the units asked are
the number of device IDs. The pending pods are the node's GPU-memory pods (``NodePods``) whose
allocation is recorded and not all started (``gpushare.kube.codec.handshake``); this process
also remembers the steps it answered, so a lagging cache never answers one step twice. A pod
kubelet admits may be newer than the cache: with no match, the node's pods are listed again
from the API server once. Calls are serialised (kubelet admits one pod at a time anyway).

The answer for the matched container, as Alibaba's device plugin gives it (same names, same
formats; several GPUs comma-separated in index order):

* ``NVIDIA_VISIBLE_DEVICES``: the GPU UUIDs;
* ``ALIYUN_COM_GPU_MEM_IDX``: the GPU indices;
* ``ALIYUN_COM_GPU_MEM_POD``: the pod's GPU memory in all (units of the node);
* ``ALIYUN_COM_GPU_MEM_CONTAINER``: this container's (share × GPUs);
* ``ALIYUN_COM_GPU_MEM_DEV``: the whole memory of the (first) GPU;
* with ``mps`` on (opt-in): ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``0=<MiB>M[,1=...]``, one
  entry per visible GPU, CUDA's ordinal inside the container) and
  ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the share of the GPU, rounded up, 1-100), from NVIDIA's
  MPS documentation (``nvidia-cuda-mps-control``, section "Environment variables");
* with a managed MPS daemon (``mps_paths``, ``--mps-managed``): also
  ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY``, and the mounts of the daemon's
  pipe, log and shared-memory directories (``gpushare.deviceplugin.mps.MpsPaths``).

Then the step is recorded on the pod (``gpushare.io/assigned-containers``, and
``ALIYUN_COM_GPU_MEM_ASSIGNED: "true"`` with the last one). A record that cannot be written for
a passing reason (API server unreachable) does not fail the answer: equal pending pods are
interchangeable, and the extender keeps pinning until its timeout. A permanent refusal
(forbidden, pod gone) fails Allocate. When nothing matches, Allocate fails with
FAILED_PRECONDITION naming the units asked, the node and the pending pods; it never returns a
made-up device.

Events (best effort, never delaying the answer; ``AllocateEvents``): ``GPUAllocated`` (Normal)
on the matched pod naming the container's GPU(s); ``FailedGPUAllocation`` (Warning) on every
candidate pod of an ambiguous match, on the pod whose record was refused, and on the node when no
pending pod matches (kubelet then fails the admitted pod with the same message).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, Protocol

import grpc

from gpushare.core.handshake import Match, MatchStatus, PendingPod, Step, match_allocate
from gpushare.deviceplugin._proto import api_pb2
from gpushare.deviceplugin.inventory import RESOURCE_GPU_MEM, PhysicalGpu
from gpushare.deviceplugin.mps import MpsPaths
from gpushare.deviceplugin.server import AllocateError
from gpushare.kube.codec import (
    CodecError,
    Json,
    MemoryUnit,
    pod_deleting,
    pod_finished,
    pod_key,
    pod_uid,
)
from gpushare.kube.codec.handshake import handshake_annotations, pending_pod
from gpushare.kube.errors import KubeError
from gpushare.kube.events import EventType
from gpushare.kube.refs import PodRef

__all__ = ["AllocateEvents", "HandshakeAllocator", "PodSource", "container_envs"]

ALLOCATED = "GPUAllocated"
FAILED = "FailedGPUAllocation"

log = logging.getLogger(__name__)


class PodSource(Protocol):
    """The node's GPU-memory pods and the annotation patch (``gpushare.kube.nodepods``)."""

    def pods(self) -> Sequence[Json]:
        """The cached pods."""
        ...

    async def list_now(self) -> Sequence[Json]:
        """The pods straight from the API server; ``KubeError`` on failure."""
        ...

    async def patch_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge ``annotations`` into the pod; ``KubeError`` on failure."""
        ...


class AllocateEvents(Protocol):
    """Where Allocate's Events go (``gpushare.kube.events.EventRecorder``)."""

    async def pod_event(
        self, pod: PodRef, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> str:
        """An Event on ``pod``; ``KubeError`` on failure."""
        ...

    async def node_event(
        self, node: str, reason: str, message: str, type: EventType = EventType.WARNING
    ) -> str:
        """An Event on node ``node``; ``KubeError`` on failure."""
        ...


def container_envs(
    step: Step,
    pod_units: int,
    gpus: Mapping[int, PhysicalGpu],
    unit: MemoryUnit,
    *,
    mps: bool = False,
) -> dict[str, str]:
    """The environment of the container answered by ``step`` (module doc). ``gpus`` by index;
    ``KeyError`` when a GPU of the step is not in it."""
    chosen = [gpus[index] for index in step.gpu_indices]
    envs = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(g.uuid for g in chosen),
        "ALIYUN_COM_GPU_MEM_IDX": ",".join(str(g.index) for g in chosen),
        "ALIYUN_COM_GPU_MEM_POD": str(pod_units),
        "ALIYUN_COM_GPU_MEM_CONTAINER": str(step.units),
        "ALIYUN_COM_GPU_MEM_DEV": str(chosen[0].units(unit)),
    }
    if mps:
        share_mib = step.share * unit.mib
        envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
            f"{ordinal}={share_mib}M" for ordinal in range(len(chosen))
        )
        percent = max(math.ceil(100 * share_mib / g.memory_mib) for g in chosen)
        envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, max(1, percent)))
    return envs


class HandshakeAllocator:
    """The ``Allocator`` of ``DevicePluginService`` (module doc).

    ``gpus`` returns the node's current GPUs; ``unit`` the node's memory unit; ``pods`` the
    node's pods (listed again when the cache has no match); ``mps`` adds the MPS variables;
    ``mps_paths`` (a managed daemon) adds them too, with its directories and mounts;
    ``events`` records Events; ``observe(outcome, seconds)`` is called once per call with
    ``ok``, ``rejected`` or ``error`` (metrics); ``patch_attempts`` bounds the tries of one
    annotation patch (``retry_s`` apart, doubling).
    """

    def __init__(
        self,
        node_name: str,
        gpus: Callable[[], Sequence[PhysicalGpu]],
        unit: MemoryUnit,
        pods: PodSource,
        *,
        mps: bool = False,
        mps_paths: MpsPaths | None = None,
        patch_attempts: int = 3,
        retry_s: float = 0.1,
        events: AllocateEvents | None = None,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self._gpus = gpus
        self._unit = unit
        self._pods = pods
        self._mps = mps or mps_paths is not None
        self._mps_paths = mps_paths
        self._patch_attempts = max(1, patch_attempts)
        self._retry_s = retry_s
        self._lock = asyncio.Lock()
        self._done: dict[tuple[str, int], int] = {}  # (pod, assume time) -> steps answered
        self._uids: dict[str, str] = {}  # pod key -> UID, from the last pods read
        self._events = events
        self._observe = observe
        self._emitting: set[asyncio.Task[None]] = set()

    def set_unit(self, unit: MemoryUnit) -> None:
        """The node's memory unit from now on (its configuration changed)."""
        self._unit = unit

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Answer every container request in order (module doc); ``AllocateError`` if one
        cannot be answered (nothing is recorded for it)."""
        started, outcome = time.perf_counter(), "error"
        try:
            if not request.container_requests:
                raise AllocateError(grpc.StatusCode.INVALID_ARGUMENT, "no container requests")
            responses = []
            async with self._lock:
                for container in request.container_requests:
                    responses.append(await self._answer(len(container.devices_ids)))
            outcome = "ok"
            return api_pb2.AllocateResponse(container_responses=responses)
        except AllocateError:
            outcome = "rejected"
            raise
        finally:
            if self._observe is not None:
                self._observe(outcome, time.perf_counter() - started)

    async def _answer(self, units: int) -> api_pb2.ContainerAllocateResponse:
        match = self._match(units, self._pods.pods())
        if match.status is not MatchStatus.MATCHED:
            try:
                match = self._match(units, await self._pods.list_now())
            except KubeError as error:
                log.warning("listing the pods of node %s failed: %s", self.node_name, error)
        pod, step = match.pod, match.step
        if match.status is not MatchStatus.MATCHED or pod is None or step is None:
            message = (
                f"gpushare: cannot allocate {units} {self._unit.value} of {RESOURCE_GPU_MEM} on "
                f"node {self.node_name}: {match.describe()}"
            )
            if match.status is MatchStatus.AMBIGUOUS:
                for candidate in match.candidates:
                    self._pod_event(candidate.key, FAILED, message, EventType.WARNING)
            elif self._events is not None:
                self._emit(self._events.node_event(self.node_name, FAILED, message))
            raise AllocateError(grpc.StatusCode.FAILED_PRECONDITION, message)
        gpus = {gpu.index: gpu for gpu in self._gpus()}
        try:
            envs = container_envs(
                step, sum(s.units for s in pod.steps), gpus, self._unit, mps=self._mps
            )
        except KeyError as error:
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"gpushare: pod {pod.key} was given GPU {error} on node {self.node_name}, which "
                f"this device plugin does not have (GPUs: {sorted(gpus)})",
            ) from None
        await self._record(pod, pod.done + 1)
        log.info("Allocate: %s", match.describe())
        self._pod_event(
            pod.key,
            ALLOCATED,
            f"gpushare device plugin on node {self.node_name}: container {step.container} gets "
            f"GPU {envs['ALIYUN_COM_GPU_MEM_IDX']} ({envs['NVIDIA_VISIBLE_DEVICES']}), "
            f"{step.share} {self._unit.value} each",
        )
        if self._mps_paths is None:
            return api_pb2.ContainerAllocateResponse(envs=envs)
        envs.update(self._mps_paths.envs())
        return api_pb2.ContainerAllocateResponse(envs=envs, mounts=self._mps_paths.mounts())

    def _pod_event(
        self, key: str, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> None:
        uid = self._uids.get(key)
        if self._events is None or not uid:
            return
        namespace, name = key.split("/", 1)
        self._emit(self._events.pod_event(PodRef(namespace, name, uid), reason, message, type))

    def _emit(self, call: Coroutine[Any, Any, str]) -> None:
        """Send an Event in the background: Allocate never waits for it."""

        async def send() -> None:
            try:
                await call
            except KubeError as error:
                log.warning("recording an Allocate event failed: %s", error)

        task = asyncio.get_running_loop().create_task(send())
        self._emitting.add(task)
        task.add_done_callback(self._emitting.discard)

    async def drain_events(self) -> None:
        """Wait for the Events in flight (tests, shutdown)."""
        while self._emitting:
            await asyncio.gather(*self._emitting, return_exceptions=True)

    def _match(self, units: int, pods: Sequence[Json]) -> Match:
        """Match ``units`` among ``pods``; refreshes the UIDs (for Events) and forgets the
        steps answered for pods that are gone, in the same pass."""
        pending, uids, present = [], {}, set()
        for pod in pods:
            try:
                key = pod_key(pod)
            except CodecError:
                continue
            present.add(key)
            uid = pod_uid(pod)
            if uid:
                uids[key] = uid
            found = self._pending(pod)
            if found is not None:
                pending.append(found)
        self._uids = uids
        for answered in [k for k in self._done if k[0] not in present]:
            del self._done[answered]  # the pod is gone
        return match_allocate(units, pending)

    def _pending(self, pod: Json) -> PendingPod | None:
        if pod_deleting(pod) or pod_finished(pod):
            return None
        try:
            found = pending_pod(pod)
        except CodecError as error:
            log.warning("pod left out of Allocate matching: %s", error)
            return None
        if found is None:
            return None
        done = max(found.done, self._done.get((found.key, found.assume_time_ns), 0))
        if done >= len(found.steps):
            return None
        return PendingPod(found.key, found.steps, found.assume_time_ns, done)

    async def _record(self, pod: PendingPod, done: int) -> None:
        namespace, name = pod.key.split("/", 1)
        annotations = handshake_annotations(pod, done)
        delay_s = self._retry_s
        for attempt in range(1, self._patch_attempts + 1):
            try:
                await self._pods.patch_annotations(namespace, name, annotations)
                break
            except KubeError as error:
                if not error.temporary:
                    message = (
                        f"gpushare: cannot record the GPU of pod {pod.key} on node "
                        f"{self.node_name}: {error}"
                    )
                    self._pod_event(pod.key, FAILED, message, EventType.WARNING)
                    raise AllocateError(grpc.StatusCode.FAILED_PRECONDITION, message) from error
                if attempt == self._patch_attempts:
                    log.error(
                        "answering pod %s without recording it (%d tries): %s",
                        pod.key, attempt, error,
                    )  # fmt: skip
                    break
                await asyncio.sleep(delay_s)
                delay_s *= 2
        self._done[(pod.key, pod.assume_time_ns)] = done
