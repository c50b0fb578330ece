"""A test double of kubelet's device manager: `v1beta1.Registration` plus a real plugin client.

`FakeKubelet` serves `/v1beta1.Registration/Register` on `<socket_dir>/kubelet.sock` (grpc.aio)
and behaves as kubelet 1.25+ does (docs/interfaces.md, "The device plugin API (v1beta1)"):

* Register validates the version (`"v1beta1"`) and the resource name (`IsExtendedResourceName`,
  docs/interfaces.md, "Extended resources"), dials `<socket_dir>/<endpoint>` (10 s), calls
  `GetDevicePluginOptions` (an error fails the Register), replaces any earlier endpoint of the
  resource, starts consuming `ListAndWatch` in the background and returns `Empty`. Errors carry
  kubelet's texts, status UNKNOWN (kubelet returns plain Go errors).
* Each ListAndWatch message replaces the resource's device list; capacity counts every device,
  allocatable the `"Healthy"` ones. When the stream ends, every device turns unhealthy
  (allocatable 0, capacity kept), as when a plugin dies.
* `allocate` asks `GetPreferredAllocation` (when the plugin offers it) and then calls `Allocate`
  with exactly one `ContainerAllocateRequest`, as kubelet does at pod admission.
* `restart` is a kubelet restart: stop serving, drop every endpoint, delete every socket in the
  directory except `kubelet_internal_checkpoint` (the plugin's too), re-create `kubelet.sock`.

Tests only; it never touches a real kubelet directory unless told to.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import stat
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
from grpc import aio
from lightkube import Client
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.inventory import HEALTHY, UNHEALTHY
from gpushare.kube.codec import GPU_MEM
from gpushare.kube.nodes import json_pointer_key

if TYPE_CHECKING:
    from gpushare.deviceplugin._proto.api_pb2_grpc import DevicePluginAsyncStub

__all__ = [
    "CHECKPOINT_NAME",
    "FakeKubelet",
    "KubeletError",
    "KubeletThread",
    "ResourceView",
    "is_extended_resource",
]

T = TypeVar("T")

CHECKPOINT_NAME = "kubelet_internal_checkpoint"
SUPPORTED_VERSIONS = ("v1beta1",)

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")


def is_extended_resource(name: str) -> bool:
    """kubelet's `IsExtendedResourceName` (docs/interfaces.md, "Extended resources"):
    `domain/name`, not kubernetes.io."""
    if "/" not in name or "kubernetes.io/" in name or name.startswith("requests."):
        return False
    prefix, _, short = f"requests.{name}".partition("/")
    return (
        len(prefix) <= 253
        and _SUBDOMAIN.match(prefix) is not None
        and len(short) <= 63
        and _NAME.match(short) is not None
    )


class KubeletError(Exception):
    """A kubelet-side refusal outside gRPC (e.g. pod admission failing in `allocate`)."""


@dataclass(frozen=True)
class ResourceView:
    """What kubelet knows of one resource: the latest device list from ListAndWatch.

    `registration` is the index (into `FakeKubelet.registrations`) of the Register that created
    the endpoint; `connected` is False once the stream ended or kubelet restarted.
    """

    endpoint: str
    registration: int
    devices: tuple[api_pb2.Device, ...] = ()
    connected: bool = True

    @property
    def ids(self) -> list[str]:
        """Device IDs, in the plugin's order."""
        return [d.ID for d in self.devices]

    @property
    def capacity(self) -> int:
        """Every device, healthy or not (node.status.capacity)."""
        return len(self.devices)

    @property
    def allocatable(self) -> int:
        """Devices whose health is exactly "Healthy" (node.status.allocatable)."""
        return sum(d.health == HEALTHY for d in self.devices)


@dataclass
class _Endpoint:
    channel: aio.Channel
    stub: DevicePluginAsyncStub
    options: api_pb2.DevicePluginOptions
    task: asyncio.Task[None] | None = None
    allocated: set[str] = field(default_factory=set)


class FakeKubelet(api_pb2_grpc.RegistrationServicer):
    """kubelet's Registration service and device-plugin client on `<socket_dir>/<socket_name>`.

    `registrations` holds every RegisterRequest received (valid or not); `allocate_requests` every
    AllocateRequest sent. Use as `async with FakeKubelet(dir) as kubelet:`.
    """

    def __init__(
        self, socket_dir: Path, socket_name: str = "kubelet.sock", dial_timeout_s: float = 10.0
    ) -> None:
        self.socket_dir = socket_dir
        self.socket_path = socket_dir / socket_name
        self.dial_timeout_s = dial_timeout_s
        self.registrations: list[api_pb2.RegisterRequest] = []
        self.allocate_requests: list[api_pb2.AllocateRequest] = []
        self._server: aio.Server | None = None
        self._endpoints: dict[str, _Endpoint] = {}
        self._resources: dict[str, ResourceView] = {}
        self._changed = asyncio.Condition()

    async def start(self) -> None:
        """Serve Registration on a fresh `kubelet.sock`; write `DEPRECATION` as kubelet does."""
        self.socket_path.unlink(missing_ok=True)
        server = aio.server()
        api_pb2_grpc.add_RegistrationServicer_to_server(self, server)
        if server.add_insecure_port(f"unix://{self.socket_path.absolute()}") == 0:
            raise OSError(f"cannot listen on {self.socket_path}")
        await server.start()
        self._server = server
        (self.socket_dir / "DEPRECATION").touch()

    async def stop(self) -> None:
        """Stop serving, drop every endpoint and remove `kubelet.sock`."""
        if self._server is not None:
            await self._server.stop(None)
            self._server = None
        for resource in list(self._endpoints):
            await self._drop(resource)
        async with self._changed:
            for name, view in self._resources.items():
                self._resources[name] = _unhealthy(view)
            self._changed.notify_all()
        self.socket_path.unlink(missing_ok=True)

    async def restart(self) -> None:
        """A kubelet restart (docs/interfaces.md, "Lifecycle"): stop, delete every socket but the
        checkpoint, serve again.

        Resources stay known with all devices unhealthy until their plugin registers again.
        """
        await self.stop()
        for entry in self.socket_dir.iterdir():
            if entry.name != CHECKPOINT_NAME and stat.S_ISSOCK(entry.lstat().st_mode):
                entry.unlink()
        await self.start()

    async def __aenter__(self) -> FakeKubelet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def resource(self, name: str) -> ResourceView | None:
        """The current view of resource `name`, None if it never registered."""
        return self._resources.get(name)

    async def wait_for_devices(
        self, resource: str, predicate: Callable[[ResourceView], bool], timeout_s: float
    ) -> ResourceView:
        """The first view of `resource` satisfying `predicate`; TimeoutError after timeout_s."""

        def holds() -> bool:
            view = self._resources.get(resource)
            return view is not None and predicate(view)

        async with asyncio.timeout(timeout_s), self._changed:
            await self._changed.wait_for(holds)
            return self._resources[resource]

    async def allocate(
        self, resource: str, device_ids: Sequence[str] = (), size: int | None = None
    ) -> api_pb2.AllocateResponse:
        """Admit one container needing `size` devices (default len(device_ids)) of `resource`.

        `device_ids` are IDs kubelet already picked (must-include). Further IDs come from
        GetPreferredAllocation, then from the remaining healthy devices, in order
        (docs/interfaces.md, "Allocate").
        Raises `KubeletError` when unregistered or short of devices, `aio.AioRpcError` when the
        plugin's Allocate fails.
        """
        endpoint, view = self._endpoints.get(resource), self._resources.get(resource)
        if endpoint is None or view is None:
            raise KubeletError(f"cannot allocate unregistered device {resource}")
        size = len(device_ids) if size is None else size
        chosen = list(device_ids)
        available = [
            d.ID
            for d in view.devices
            if d.health == HEALTHY and d.ID not in endpoint.allocated and d.ID not in chosen
        ]
        if size - len(chosen) > len(available):
            raise KubeletError(
                f"requested number of devices unavailable for {resource}. "
                f"Requested: {size}, Available: {len(available) + len(chosen)}"
            )
        if len(chosen) < size and endpoint.options.get_preferred_allocation_available:
            preferred = await endpoint.stub.GetPreferredAllocation(
                api_pb2.PreferredAllocationRequest(
                    container_requests=[
                        api_pb2.ContainerPreferredAllocationRequest(
                            available_deviceIDs=[*chosen, *available],
                            must_include_deviceIDs=chosen,
                            allocation_size=size,
                        )
                    ]
                )
            )
            for response in preferred.container_responses[:1]:
                for ident in response.deviceIDs:
                    if ident in available and ident not in chosen and len(chosen) < size:
                        chosen.append(ident)
        chosen += [i for i in available if i not in chosen][: size - len(chosen)]
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=chosen)]
        )
        self.allocate_requests.append(request)
        answer = await endpoint.stub.Allocate(request)
        if not answer.container_responses:
            raise KubeletError(f"Allocate for {resource} returned no container response")
        endpoint.allocated.update(chosen)
        return answer

    async def Register(  # noqa: N802 (gRPC method name)
        self, request: api_pb2.RegisterRequest, context: aio.ServicerContext[object, object]
    ) -> api_pb2.Empty:
        """kubelet's Register (docs/interfaces.md, "Registration"); refusals are UNKNOWN with
        kubelet's text."""
        self.registrations.append(request)
        index = len(self.registrations) - 1
        if request.version not in SUPPORTED_VERSIONS:
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"requested API version {request.version!r} is not supported by kubelet. "
                f"Supported versions are {list(SUPPORTED_VERSIONS)!r}",
            )
        if not is_extended_resource(request.resource_name):
            await context.abort(
                grpc.StatusCode.UNKNOWN, f'the ResourceName "{request.resource_name}" is invalid'
            )
        channel = aio.insecure_channel(f"unix://{(self.socket_dir / request.endpoint).absolute()}")
        try:
            await asyncio.wait_for(channel.channel_ready(), self.dial_timeout_s)
            stub = api_pb2_grpc.DevicePluginStub(channel)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
        except TimeoutError:
            await channel.close(None)
            await context.abort(
                grpc.StatusCode.UNKNOWN, "failed to dial device plugin: context deadline exceeded"
            )
        except aio.AioRpcError as error:
            await channel.close(None)
            await context.abort(
                grpc.StatusCode.UNKNOWN,
                f"failed to get device plugin options: {error.code().name}: {error.details()}",
            )
        await self._drop(request.resource_name)
        endpoint = _Endpoint(channel, stub, options)
        self._endpoints[request.resource_name] = endpoint
        async with self._changed:
            self._resources[request.resource_name] = ResourceView(request.endpoint, index)
            self._changed.notify_all()
        endpoint.task = asyncio.create_task(self._consume(request.resource_name, endpoint))
        return api_pb2.Empty()

    async def _consume(self, resource: str, endpoint: _Endpoint) -> None:
        """Keep the latest ListAndWatch list; on stream end mark every device unhealthy."""
        with contextlib.suppress(aio.AioRpcError):
            async for message in endpoint.stub.ListAndWatch(api_pb2.Empty()):
                async with self._changed:
                    view = self._resources[resource]
                    self._resources[resource] = replace(view, devices=tuple(message.devices))
                    self._changed.notify_all()
        if self._endpoints.get(resource) is endpoint:
            async with self._changed:
                self._resources[resource] = _unhealthy(self._resources[resource])
                self._changed.notify_all()

    async def _drop(self, resource: str) -> None:
        endpoint = self._endpoints.pop(resource, None)
        if endpoint is None:
            return
        if endpoint.task is not None:
            endpoint.task.cancel()
            await asyncio.wait([endpoint.task])  # its CancelledError stays inside the task
        await endpoint.channel.close(None)


def _unhealthy(view: ResourceView) -> ResourceView:
    devices = tuple(api_pb2.Device(ID=d.ID, health=UNHEALTHY) for d in view.devices)
    return replace(view, devices=devices, connected=False)


class KubeletThread:
    """A :class:`FakeKubelet` on its own event loop in a thread, for tests that block (a sync
    API client, subprocesses): ``call`` runs one of its coroutines there and waits."""

    def __init__(self, socket_dir: Path) -> None:
        self.kubelet = FakeKubelet(socket_dir)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float = 30.0) -> T:
        """Run ``coro`` on the kubelet's loop; its result, or ``TimeoutError``."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout_s)

    def __enter__(self) -> KubeletThread:
        self._thread.start()
        self.call(self.kubelet.start())
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(Exception):
            self.call(self.kubelet.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def sync_node_status(self, kube: Client, node: str, resource: str = GPU_MEM) -> ResourceView:
        """What kubelet's node-status sync does (docs/interfaces.md, "ListAndWatch"):
        ``resource``'s capacity (all
        devices) and allocatable (healthy ones) from the registered plugin's device list, on
        node ``node``. ``KubeletError`` when nothing registered ``resource``."""
        view = self.kubelet.resource(resource)
        if view is None:
            raise KubeletError(f"no device plugin registered {resource}")
        key = json_pointer_key(resource)
        kube.patch(
            Node.Status, node, [
                {"op": "add", "path": f"/status/capacity/{key}", "value": str(view.capacity)},
                {"op": "add", "path": f"/status/allocatable/{key}", "value": str(view.allocatable)},
            ], patch_type=PatchType.JSON,
        )  # fmt: skip
        return view
