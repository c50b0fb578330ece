"""The v1beta1 DevicePlugin gRPC service (grpc.aio) on a unix socket.

Serves GetDevicePluginOptions, ListAndWatch (the full device list at once, then again on every
health change), GetPreferredAllocation, Allocate and PreStartContainer. Allocate is delegated to an
`Allocator` (the extender handshake, `gpushare.deviceplugin.allocate`); without one it fails with
FAILED_PRECONDITION: it never hands out a made-up device. `PluginServer` only serves; registration
with kubelet and its restarts are `gpushare.deviceplugin.lifecycle`'s job.

Every call does bounded work, so that one request cannot hold the event loop that answers
kubelet's other calls (without bounds, 100,000 IDs in one GetPreferredAllocation blocked it
for 30 s and Allocates timed out). GetPreferredAllocation checks its IDs against the advertised
device set (a set lookup each) and refuses, with INVALID_ARGUMENT naming the count or the ID, a
request that lists more IDs than the plugin has devices or an ID it never advertised; its answer
is then linear in the request.

`DevicePluginService.stop` ends the ListAndWatch streams open at that moment; the same service can
then be served again (a re-registration after a kubelet restart) and new streams work.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import grpc
from grpc import aio

from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.inventory import (
    RESOURCE_GPU_MEM,
    DevicesPerGpu,
    PhysicalGpu,
    check_message_size,
    device_ids,
    list_and_watch_response,
)
from gpushare.kube.codec import MemoryUnit

__all__ = [
    "ALLOCATE_NOT_READY",
    "MAX_ALLOCATE_CONTAINERS",
    "AllocateError",
    "Allocator",
    "DevicePluginService",
    "PluginServer",
    "PreferredAllocationError",
    "preferred_allocation",
    "serve",
]

log = logging.getLogger(__name__)

ALLOCATE_NOT_READY = "no allocator is wired to this device plugin service"

_Context = aio.ServicerContext[Any, Any]


class AllocateError(Exception):
    """Allocate cannot be answered: `code` is the gRPC status, the message goes to kubelet."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


class PreferredAllocationError(ValueError):
    """A GetPreferredAllocation request this plugin refuses (INVALID_ARGUMENT)."""


def preferred_allocation(
    request: api_pb2.PreferredAllocationRequest, known_ids: frozenset[str]
) -> api_pb2.PreferredAllocationResponse:
    """Prefer must-include IDs, then the available IDs in the order kubelet gave them.

    ``known_ids`` are the advertised device IDs. Raises ``PreferredAllocationError`` for a
    request listing more IDs in all than twice the devices (available and must-include), an
    ``allocation_size`` outside 0..devices, or an ID not advertised. Work is linear in the
    request, which is itself bounded by ``known_ids`` (kubelet only offers advertised IDs).
    """
    devices = len(known_ids)
    listed = sum(
        len(r.available_deviceIDs) + len(r.must_include_deviceIDs)
        for r in request.container_requests
    )
    if listed > 2 * devices:
        raise PreferredAllocationError(
            f"GetPreferredAllocation lists {listed} device IDs over "
            f"{len(request.container_requests)} container request(s); this plugin has "
            f"{devices} devices (accepted: at most {2 * devices} IDs, available and "
            "must-include together)"
        )
    responses = []
    for n, req in enumerate(request.container_requests):
        if not 0 <= req.allocation_size <= devices:
            raise PreferredAllocationError(
                f"GetPreferredAllocation container request {n}: allocation_size "
                f"{req.allocation_size} is out of range; accepted 0 to {devices} devices"
            )
        for ident in (*req.must_include_deviceIDs, *req.available_deviceIDs):
            if ident not in known_ids:
                raise PreferredAllocationError(
                    f"GetPreferredAllocation container request {n}: device ID {ident[:80]!r} "
                    "is not a device this plugin advertised (<GPU UUID>-_-<n>)"
                )
        chosen = dict.fromkeys(req.must_include_deviceIDs)
        for ident in req.available_deviceIDs:
            if len(chosen) >= req.allocation_size:
                break
            chosen.setdefault(ident)
        responses.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=list(chosen)))
    return api_pb2.PreferredAllocationResponse(container_responses=responses)


MAX_ALLOCATE_CONTAINERS = 16
"""Most container requests in one Allocate (kubelet sends one per call: docs/interfaces.md,
"Allocate")."""


def _allocate_problem(request: api_pb2.AllocateRequest, devices: int) -> str | None:
    count = len(request.container_requests)
    if count > MAX_ALLOCATE_CONTAINERS:
        return (
            f"Allocate has {count} container requests; accepted at most "
            f"{MAX_ALLOCATE_CONTAINERS} (kubelet sends one)"
        )
    for n, container in enumerate(request.container_requests):
        if len(container.devices_ids) > devices:
            return (
                f"Allocate container request {n} asks for {len(container.devices_ids)} "
                f"devices; this plugin has {devices}"
            )
    return None


class Allocator(Protocol):
    """Answers kubelet's Allocate (one `ContainerAllocateRequest` per call; docs/interfaces.md,
    "Allocate")."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """The response for `request`; raises `AllocateError` when nothing matches."""
        ...


class DevicePluginService(api_pb2_grpc.DevicePluginServicer):
    """DevicePlugin servicer over a GPU list; `set_health` re-sends the list to every stream.

    It advertises `resource` (default `aliyun.com/gpu-mem`): one device per memory unit per
    GPU, or `per_gpu(gpu)` devices for a dialect's resource (`gpushare.deviceplugin.dialects`).
    """

    def __init__(
        self,
        gpus: Sequence[PhysicalGpu],
        unit: MemoryUnit = MemoryUnit.GIB,
        allocator: Allocator | None = None,
        *,
        per_gpu: DevicesPerGpu | None = None,
        resource: str = RESOURCE_GPU_MEM,
    ) -> None:
        self.per_gpu = per_gpu
        self.resource = resource
        self.check_size(gpus, unit)
        self._gpus = list(gpus)
        self._unit = unit
        self.allocator = allocator
        """Answers Allocate (``None``: every request refused); set before serving. A
        ``HandshakeAllocator`` reads this service's ``gpus`` and ``unit``, so it is made after
        the service and set here."""
        self._device_ids = self._ids(self._gpus, unit)
        self._version = 0
        self._epoch = 0
        self._changed = asyncio.Condition()

    def check_size(self, gpus: Sequence[PhysicalGpu], unit: MemoryUnit) -> int:
        """``check_message_size`` of this resource's device list for ``gpus``."""
        return check_message_size(gpus, unit, per_gpu=self.per_gpu, resource=self.resource)

    def _ids(self, gpus: Sequence[PhysicalGpu], unit: MemoryUnit) -> frozenset[str]:
        return frozenset(device_ids(gpus, unit, self.per_gpu))

    @property
    def unit(self) -> MemoryUnit:
        """The memory unit of one advertised device."""
        return self._unit

    @property
    def gpus(self) -> list[PhysicalGpu]:
        """The current GPUs (with health)."""
        return list(self._gpus)

    async def set_health(self, index: int, healthy: bool) -> None:
        """Mark the GPU with `index` healthy or unhealthy; streams get a new list if it changed."""
        async with self._changed:
            for i, gpu in enumerate(self._gpus):
                if gpu.index == index and gpu.healthy != healthy:
                    self._gpus[i] = replace(gpu, healthy=healthy)
                    self._version += 1
                    log.info(
                        "GPU %d (%s) is now %s",
                        index,
                        gpu.uuid,
                        "healthy" if healthy else "unhealthy",
                    )
                    self._changed.notify_all()

    async def set_inventory(self, gpus: Sequence[PhysicalGpu], unit: MemoryUnit) -> None:
        """Advertise ``gpus`` in ``unit`` from now on (the node's configuration changed,
        ``gpushare.deviceplugin.nodeconfig``); every stream gets the new list.
        ``DeviceListTooLargeError`` (nothing changed) when it would not fit one message."""
        self.check_size(gpus, unit)
        async with self._changed:
            self._gpus = list(gpus)
            self._unit = unit
            self._device_ids = self._ids(self._gpus, unit)
            self._version += 1
            self._changed.notify_all()

    def _moved_since(self, version: int, epoch: int) -> bool:
        return self._epoch != epoch or self._version != version

    async def stop(self) -> None:
        """End every ListAndWatch stream open now (streams opened later work normally)."""
        async with self._changed:
            self._epoch += 1
            self._changed.notify_all()

    async def GetDevicePluginOptions(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: _Context
    ) -> api_pb2.DevicePluginOptions:
        """Options: no PreStartContainer needed, GetPreferredAllocation available."""
        return options()

    async def ListAndWatch(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.Empty, context: _Context
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        """Send the full device list now, then again after every change, until stopped."""
        seen = -1
        epoch = self._epoch
        while True:
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._moved_since, seen, epoch))
                if self._epoch != epoch:
                    return
                seen = self._version
                response = list_and_watch_response(self._gpus, self._unit, self.per_gpu)
            yield response

    async def GetPreferredAllocation(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreferredAllocationRequest, context: _Context
    ) -> api_pb2.PreferredAllocationResponse:
        """``preferred_allocation`` over the advertised IDs; a refused request ends in
        INVALID_ARGUMENT with the reason."""
        try:
            return preferred_allocation(request, self._device_ids)
        except PreferredAllocationError as error:
            log.warning("%s", error)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(error))
            raise AssertionError("context.abort returned") from error  # pragma: no cover

    async def Allocate(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.AllocateRequest, context: _Context
    ) -> api_pb2.AllocateResponse:
        """Delegate to the allocator; its `AllocateError` becomes the gRPC status. A request
        kubelet would never send (more than `MAX_ALLOCATE_CONTAINERS` containers, or more
        device IDs in one than the plugin has devices) ends in INVALID_ARGUMENT unanswered."""
        problem = _allocate_problem(request, len(self._device_ids))
        if problem is not None:
            log.warning("%s", problem)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, problem)
        if self.allocator is not None:
            try:
                return await self.allocator.allocate(request)
            except AllocateError as error:
                log.warning("Allocate failed: %s", error)
                await context.abort(error.code, str(error))
                raise AssertionError("context.abort returned") from error  # pragma: no cover
        asked = sum(len(c.devices_ids) for c in request.container_requests)
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{ALLOCATE_NOT_READY}: cannot resolve which pod asked for {asked} "
            f"{self._unit.value} of GPU memory",
        )
        raise AssertionError("context.abort returned")  # pragma: no cover

    async def PreStartContainer(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.PreStartContainerRequest, context: _Context
    ) -> api_pb2.PreStartContainerResponse:
        """Nothing to prepare (pre_start_required is false)."""
        return api_pb2.PreStartContainerResponse()


def options() -> api_pb2.DevicePluginOptions:
    """The plugin's options, identical in RegisterRequest and GetDevicePluginOptions."""
    return api_pb2.DevicePluginOptions(
        pre_start_required=False, get_preferred_allocation_available=True
    )


class PluginServer:
    """A running grpc.aio server for one `DevicePluginService` on `<socket_dir>/<socket_name>`."""

    def __init__(self, service: DevicePluginService, socket_path: Path, server: aio.Server) -> None:
        self.service = service
        self.socket_path = socket_path
        self._server = server

    @property
    def address(self) -> str:
        """The `unix://` address clients dial."""
        return f"unix://{self.socket_path}"

    async def stop(self, grace: float = 1.0) -> None:
        """End the streams, stop serving and remove the socket file."""
        await self.service.stop()
        await self._server.stop(grace)
        self.socket_path.unlink(missing_ok=True)


async def serve(
    service: DevicePluginService, socket_dir: Path, socket_name: str = "aliyungpushare.sock"
) -> PluginServer:
    """Serve `service` on a fresh unix socket in `socket_dir` (a stale socket is removed)."""
    socket_path = Path(os.path.abspath(socket_dir)) / socket_name
    socket_path.unlink(missing_ok=True)
    server = aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(service, server)
    address = f"unix://{socket_path}"
    if server.add_insecure_port(address) == 0:
        raise OSError(f"cannot listen on {address}")
    await server.start()
    log.info("device plugin serving on %s", address)
    return PluginServer(service, socket_path, server)
