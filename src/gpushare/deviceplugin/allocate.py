"""Allocate: give each container the GPU(s) the extender decided for its pod (docs/design.md,
"The handshake"; the rule and the matching are ``gpushare.core.handshake``).

For each ``ContainerAllocateRequest`` (kubelet sends exactly one: docs/interfaces.md,
"Allocate"), the units asked are
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
  pipe, log and shared-memory directories (``gpushare.deviceplugin.mps.MpsPaths``);
* for a share of a GPU (not a whole one), with ``isolation`` (the node's backend and the
  share-view library, ``gpushare.deviceplugin.isolation``): the share-view library
  (``GPUSHARE_SHARE_MIB`` and its mounts), ``GPUSHARE_SHARE_ENFORCE`` for the
  ``library`` backend, ``NVIDIA_GPU_MEMORY_LIMIT``/``_REQUEST`` for ``driver``. When the node
  configuration requires an enforced share and the node has none, the shared container is
  refused (FAILED_PRECONDITION and a ``FailedGPUAllocation`` Event naming what is missing).
* with ``cdi`` (``--cdi``, ``gpushare.deviceplugin.cdi``): the CDI devices of the container's
  GPUs in ``cdi_devices`` (kubelet's DevicePluginCDIDevices, GA since v1.31, hands them to the
  runtime), the NVIDIA container toolkit's (``nvidia.com/gpu=<uuid>``) or gpushare's own
  (``gpushare.io/nvidia-gpu=<uuid>``: device node, control nodes, driver libraries and
  binaries), so that the node needs no NVIDIA runtime as its default runtime. A GPU the spec
  lacks (a stale spec) is refused with FAILED_PRECONDITION naming the spec.

Then the step is recorded on the pod (``gpushare.io/assigned-containers``, and
``ALIYUN_COM_GPU_MEM_ASSIGNED: "true"`` with the last one). A record that cannot be written for
a passing reason (API server unreachable) does not fail the answer: equal pending pods are
interchangeable, and the extender keeps pinning until its timeout. A permanent refusal
(forbidden, pod gone) fails Allocate. When nothing matches, Allocate fails with
FAILED_PRECONDITION naming the units asked, the node and what the pod being admitted lacks
(``gpushare.core.handshake.Match.refusal``: no GPU assignment from gpushare's scheduler, and
the ``schedulerName`` to set; or that it cannot be told apart from equal pods), never the
other pods pending there: kubelet writes the message into the admitted pod's status, which
its owner reads, and the call names no pod. The pending pods (``Match.describe``) go to the
log and the node's ``FailedGPUAllocation`` Event, for operators. It never returns a made-up
device.

Events (best effort, never delaying the answer; ``AllocateEvents``): ``GPUAllocated`` (Normal)
on the matched pod naming the container's GPU(s) and how its share is held (``share enforced
(mps)``, ``share view only``, ...: ``gpushare.core.isolation.Isolation.said``; ``whole
GPU``); ``FailedGPUAllocation`` (Warning) on every
candidate pod of an ambiguous match (the refusal, naming no other pod), on the pod whose record
was refused, and on the node when no pending pod asks as much (with the pending pods named).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import replace
from typing import Any, Protocol

import grpc

from gpushare.core.handshake import Match, MatchStatus, PendingPod, Step, match_allocate
from gpushare.deviceplugin._proto import api_pb2
from gpushare.deviceplugin.cdi import CdiError, GpuCdi
from gpushare.deviceplugin.dialects import GPU_MEM_DIALECT, AllocateDialect
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.isolation import NodeIsolation
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

__all__ = [
    "Advertised",
    "AllocateEvents",
    "EmptyAllocator",
    "HandshakeAllocator",
    "PodSource",
    "mps_envs",
]

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


def mps_envs(
    step: Step, chosen: Sequence[PhysicalGpu], unit: MemoryUnit, ceiling_percent: int | None = None
) -> dict[str, str]:
    """The MPS limits of ``step`` on its GPUs ``chosen`` (module doc):
    ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the share in MiB per visible GPU) and
    ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``, 1-100: the compute share when one is recorded
    (``compute_milli``, rounded up; 100 for whole GPUs), else the memory share of the largest
    fraction of a GPU (as before compute existed). ``ceiling_percent`` (Tencent's
    ``vcuda-core-limit``, a soft cap the pod may burst to) raises it to that ceiling: MPS has
    only a hard cap, so the burst ceiling is the nearest documented equivalent."""
    share_mib = step.share * unit.mib
    envs = {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ",".join(
            f"{ordinal}={share_mib}M" for ordinal in range(len(chosen))
        )
    }
    if step.exclusive:
        percent = 100
    elif step.compute_milli > 0:
        percent = math.ceil(step.compute_milli / 10)
    else:
        percent = max(math.ceil(100 * share_mib / g.memory_mib) for g in chosen)
    if ceiling_percent is not None:
        percent = max(percent, ceiling_percent)
    envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(min(100, max(1, percent)))
    return envs


class Advertised(Protocol):
    """What a resource advertises now (``DevicePluginService``): the node's GPUs (with health)
    and the memory unit of one device."""

    @property
    def gpus(self) -> list[PhysicalGpu]:
        """The current GPUs."""
        ...

    @property
    def unit(self) -> MemoryUnit:
        """The current memory unit."""
        ...


class HandshakeAllocator:
    """The ``Allocator`` of ``DevicePluginService`` (module doc).

    ``advertised`` gives the node's current GPUs and memory unit (the service this answers
    for: ``DevicePluginService.allocator``); ``pods`` the node's pods (listed again when the
    cache has no match); ``dialect`` the resource whose Allocate this answers
    (``aliyun.com/gpu-mem`` by default; a dialect's resource: ``gpushare.deviceplugin.dialects``),
    only its pods are matched, by its units; ``mps`` adds the MPS variables (``mps_envs``);
    ``mps_paths`` (a managed daemon) adds them too, with its directories and mounts;
    ``isolation`` the node's share backend and view (module doc; ``None``: neither);
    ``cdi`` the CDI devices containers are given (module doc; ``None``: none); ``events``
    records Events; ``observe(outcome, seconds)`` is called once per call with ``ok``,
    ``rejected`` or ``error`` (metrics); ``patch_attempts`` bounds the tries of one
    annotation patch (``retry_s`` apart, doubling).
    """

    def __init__(
        self,
        node_name: str,
        advertised: Advertised,
        pods: PodSource,
        *,
        dialect: AllocateDialect = GPU_MEM_DIALECT,
        mps: bool = False,
        mps_paths: MpsPaths | None = None,
        isolation: NodeIsolation | None = None,
        cdi: GpuCdi | None = None,
        patch_attempts: int = 3,
        retry_s: float = 0.1,
        events: AllocateEvents | None = None,
        observe: Callable[[str, float], None] | None = None,
    ) -> None:
        self.node_name = node_name
        self._advertised = advertised
        self._pods = pods
        self.dialect = dialect
        self._pod_json: dict[str, Json] = {}  # pod key -> the pod, from the last pods read
        self._left_out: dict[str, str] = {}  # pod key -> why it cannot be matched here
        self._mps = mps or mps_paths is not None
        self._mps_paths = mps_paths
        self.isolation = isolation
        self.cdi = cdi
        self._patch_attempts = max(1, patch_attempts)
        self._retry_s = retry_s
        self._lock = asyncio.Lock()
        self._done: dict[tuple[str, int], int] = {}  # (pod, assume time) -> steps answered
        self._uids: dict[str, str] = {}  # pod key -> UID, from the last pods read
        self._events = events
        self._observe = observe
        self._emitting: set[asyncio.Task[None]] = set()

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
            what = (
                f"{units} {self._advertised.unit.value} of {self.dialect.resource}"
                if self.dialect.in_memory_units
                else f"{units} {self.dialect.resource}"
            )
            head = f"gpushare: cannot allocate {what} on node {self.node_name}: "
            left_out = "".join(f"; {why}" for why in self._left_out.values())
            details = f"{head}{match.describe()}{left_out}"  # names pods: operators only
            unmatched = (
                f"; {len(self._left_out)} GPU pod(s) bound here are left out of matching "
                f"(a GPU container names no {self.dialect.resource}; the node's Events say "
                "which)"
                if self._left_out
                else ""
            )
            message = f"{head}{match.refusal()}{unmatched}"  # this pod's own: no other pod
            log.warning("Allocate refused: %s", details)
            if match.status is MatchStatus.AMBIGUOUS:
                for candidate in match.candidates:
                    self._pod_event(candidate.key, FAILED, message, EventType.WARNING)
            elif self._events is not None:
                self._emit(self._events.node_event(self.node_name, FAILED, details))
            raise AllocateError(grpc.StatusCode.FAILED_PRECONDITION, message)
        gpus = {gpu.index: gpu for gpu in self._advertised.gpus}
        try:
            chosen = [gpus[index] for index in step.gpu_indices]
        except KeyError as error:
            raise AllocateError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"gpushare: pod {pod.key} was given GPU {error} on node {self.node_name}, which "
                f"this device plugin does not have (GPUs: {sorted(gpus)})",
            ) from None
        isolation = None if step.exclusive else self.isolation
        if isolation is not None and (refusal := isolation.refusal()):
            message = (
                f"gpushare: container {step.container} of pod {pod.key} cannot start on node "
                f"{self.node_name}: {refusal}"
            )
            self._pod_event(pod.key, FAILED, message, EventType.WARNING)
            raise AllocateError(grpc.StatusCode.FAILED_PRECONDITION, message)
        try:
            cdi_ids = [] if self.cdi is None else self.cdi.ids((g.index, g.uuid) for g in chosen)
        except CdiError as error:
            message = f"gpushare: container {step.container} of pod {pod.key}: {error}"
            self._pod_event(pod.key, FAILED, message, EventType.WARNING)
            raise AllocateError(grpc.StatusCode.FAILED_PRECONDITION, message) from None
        envs = self._envs(pod, step, chosen)
        mounts: list[api_pb2.Mount] = []
        if isolation is not None:
            mib = step.share * self._advertised.unit.mib
            edits = isolation.edits([(gpu.uuid, mib) for gpu in chosen])
            envs.update(edits.envs)
            mounts += [
                api_pb2.Mount(
                    container_path=m.container_path, host_path=m.host_path, read_only=True
                )
                for m in edits.mounts
            ]
        await self._record(pod, pod.done + 1)
        log.info("Allocate: %s", match.describe())
        held = (
            "whole GPU"
            if step.exclusive
            else "share " + (isolation.isolation.said() if isolation is not None else "none")
        )
        self._pod_event(
            pod.key,
            ALLOCATED,
            f"gpushare device plugin on node {self.node_name}: container {step.container} gets "
            f"GPU {','.join(map(str, step.gpu_indices))} ({envs['NVIDIA_VISIBLE_DEVICES']}), "
            f"{step.share} {self._advertised.unit.value} each; {held}",
        )
        if self._mps_paths is not None:
            envs.update(self._mps_paths.envs())
            mounts += self._mps_paths.mounts()
        return api_pb2.ContainerAllocateResponse(
            envs=envs,
            mounts=mounts,
            cdi_devices=[api_pb2.CDIDevice(name=name) for name in cdi_ids],
        )

    def _envs(self, pod: PendingPod, step: Step, chosen: list[PhysicalGpu]) -> dict[str, str]:
        """The dialect's variables for ``step`` on ``chosen``, and the MPS ones when on."""
        unit = self._advertised.unit
        envs = self.dialect.envs(step, sum(s.given_units for s in pod.steps), chosen, unit)
        if self._mps:
            read_ceiling = self.dialect.ceiling
            pod_json = self._pod_json.get(pod.key, {})
            ceiling = None if read_ceiling is None else read_ceiling(pod_json)
            envs.update(mps_envs(step, chosen, unit, ceiling))
        return envs

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
        pending, uids, present, by_key = [], {}, set(), {}
        left_out: dict[str, str] = {}
        for pod in pods:
            try:
                key = pod_key(pod)
            except CodecError:
                continue
            present.add(key)
            uid = pod_uid(pod)
            if uid:
                uids[key] = uid
            if not self.dialect.belongs(pod):
                continue
            by_key[key] = pod
            found = self._pending(pod)
            if found is None:
                continue
            missing = self.dialect.missing(pod, [s.container for s in found.steps])
            if missing:
                left_out[key] = (
                    f"pod {key} left out: GPU container(s) {', '.join(missing)} name no "
                    f"{self.dialect.resource}, so kubelet never asks for them (write "
                    f"{self.dialect.resource} in every GPU container)"
                )
                continue
            pending.append(found)
        self._uids, self._pod_json, self._left_out = uids, by_key, left_out
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
        return replace(found, done=done)

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


class EmptyAllocator:
    """The ``Allocator`` of a resource answered empty (``tencent.com/vcuda-memory``, as
    gpu-manager's ``vmemory.sock``): one empty ``ContainerAllocateResponse`` per container
    request. The container's GPUs come from its ``tencent.com/vcuda-core`` call."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """Empty answers, one per container request."""
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse() for _ in request.container_requests
            ]
        )
