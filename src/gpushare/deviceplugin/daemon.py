"""The running device plugin: inventory, node publishing, Allocate, kubelet lifecycle, health.

:class:`DevicePluginDaemon` wires the parts together for one node (``gpushare device-plugin``):

1. The GPUs come from the inventory (NVML, or a declared ``--fake-gpus``); a device list too big
   for one kubelet message is refused before anything starts (``DeviceListTooLargeError``).
2. The node's GPU-memory pods are listed and watched (``gpushare.kube.nodepods``): Allocate
   reads them (``gpushare.deviceplugin.allocate``).
3. The node's inventory and ``aliyun.com/gpu-count`` are published (``gpushare.kube.nodes``):
   at start, again after every re-registration with kubelet (a restarted kubelet may have
   reset the node's extended resources), and on every health change; a publish that would
   write what was last written sends nothing.
4. The gRPC server is served, then registered with kubelet, and re-registered when kubelet
   restarts (``gpushare.deviceplugin.lifecycle``).
5. With NVML and health checking on, critical XIDs mark a GPU's devices unhealthy in
   ListAndWatch and in the node inventory; a recovered GPU comes back
   (``gpushare.deviceplugin.health``).
6. With ``mps_managed`` (``--mps-managed``), the MPS control daemon of the node's GPUs is
   started before serving, supervised, and stopped (compute mode restored) at the end
   (``gpushare.deviceplugin.mps``); while it is down every GPU is unhealthy, whatever the XIDs
   say, and Allocate gives containers its directories and limits.
7. With ``unhealthy_configmap`` (on by default), GPUs an operator lists in Alibaba's ConfigMap
   ``kube-system/unhealthy-gpu-<node>`` (``gpushare.kube.unhealthy``) are unhealthy too, in
   ListAndWatch and in the inventory, until the ConfigMap lets them go; a value that cannot be
   read is a Warning Event on the node and changes nothing.
8. With ``node_config`` (on by default), the node's entry in the ConfigMap
   ``<namespace>/gpushare-node-config`` (``gpushare.kube.nodeconfig``, docs/node-config.md) sets
   the unit, the memory held back per GPU, the GPUs left out of sharing and what the node
   serves; the ConfigMap's keys win over ``--memory-unit``. It is read before the first
   publish and watched: a change re-advertises the devices to kubelet (ListAndWatch) and
   rewrites the inventory, unless it would take memory from pods holding it
   (``gpushare.deviceplugin.nodeconfig.deferral``): then the configuration in force stays, a
   Warning Event ``NodeConfigDeferred`` says why, and the change is tried again every
   ``node_config_retry_s`` and on every change. An entry that cannot be read is a Warning
   Event ``NodeConfigInvalid`` and changes nothing. A change applied is a Normal Event
   ``NodeConfigApplied``.
9. ``/metrics`` on its own port (``gpushare.deviceplugin.metrics``): inventory, Allocate
   outcomes and latency, registrations, and with NVML used memory and utilisation per GPU and
   per process (mapped to its pod).

10. With ``dialects`` (``--dialects tencent,hami``; none by default), the dialects' resources
   are served too, one socket each, registered with kubelet and re-registered as the main
   one (``gpushare.deviceplugin.dialects``): the same GPUs, health and node configuration,
   Allocate matched among that resource's pods only; the node's pods cache then keeps the
   dialects' pods as well.

11. Isolation (``gpushare.deviceplugin.isolation``, docs/share-view.md): with
   ``share_library_dir`` the share-view library is installed there (a host directory) and
   given to every shared container; the enforcement backend is chosen from what the node has
   (MPS on, the driver's memory limits through NVML, the library) and the node
   configuration's ``enforcement``/``requireEnforcement``, published per GPU in the inventory
   and said on every ``GPUAllocated`` Event.

12. With ``cdi`` (``--cdi``, chosen at start by ``gpushare.deviceplugin.cdifiles``), Allocate
   names the CDI devices of each container's GPUs (``gpushare.deviceplugin.cdi``).

``run`` returns when ``stop`` is set (SIGTERM/SIGINT in the CLI): the socket is removed, watches
end. Permanent API failures at start (no such node, forbidden) raise ``ApiCallError`` with the
fix in its message; passing ones are logged and retried with the next publish.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.core.isolation import Isolation
from gpushare.deviceplugin.allocate import (
    AllocateEvents,
    EmptyAllocator,
    HandshakeAllocator,
    PodSource,
)
from gpushare.deviceplugin.cdi import GpuCdi
from gpushare.deviceplugin.configcontrol import NodeConfigController
from gpushare.deviceplugin.dialects import (
    DEFAULT_SPLIT_COUNT,
    GPU_MEM_DIALECT,
    DialectResource,
    resources_for,
)
from gpushare.deviceplugin.gpuhealth import GpuHealth
from gpushare.deviceplugin.health import HealthWatcher
from gpushare.deviceplugin.inventory import Inventory, PhysicalGpu
from gpushare.deviceplugin.isolation import (
    NodeIsolation,
    installed_library,
    node_isolation,
)
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME, PluginRunner
from gpushare.deviceplugin.metrics import (
    DEFAULT_METRICS_HOST,
    DEFAULT_METRICS_PORT,
    DevicePluginMetrics,
    MetricsServer,
    pods_by_uid,
    serve_metrics,
)
from gpushare.deviceplugin.mps import (
    DEFAULT_MPS_CONTROL,
    DEFAULT_MPS_ROOT,
    MpsControl,
    MpsPaths,
    MpsSupervisor,
)
from gpushare.deviceplugin.nodeconfig import Configured, NodeConfigMetrics
from gpushare.deviceplugin.nvml import Nvml
from gpushare.deviceplugin.registration import DEVICE_PLUGIN_DIR
from gpushare.deviceplugin.server import DevicePluginService
from gpushare.kube.cache import requests_gpu, requests_gpu_mem
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec import GPU_MEM, CodecError, InventoryGpu, MemoryUnit
from gpushare.kube.codec.configmaps import unhealthy_configmap_name
from gpushare.kube.codec.nodeconfig import NODE_CONFIG_NAME
from gpushare.kube.errors import KubeError
from gpushare.kube.events import EventRecorder, EventType
from gpushare.kube.nodeconfig import NodeConfigWatch
from gpushare.kube.nodepods import NodePods
from gpushare.kube.nodes import NodePublisher
from gpushare.kube.unhealthy import UnhealthyMarks

__all__ = [
    "EVENT_COMPONENT",
    "DaemonOptions",
    "DevicePluginDaemon",
    "inventory_gpus",
    "resource_runner",
]

EVENT_COMPONENT = "gpushare-device-plugin"
"""``source.component`` of the device plugin's Events."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DaemonOptions:
    """How the device plugin runs on node ``node_name`` (``gpushare device-plugin --help``).

    ``socket_dir``: kubelet's device-plugin directory; ``health``: watch NVML XID events;
    ``recovery_s``: quiet time before an unhealthy GPU comes back; ``ignored_xids``: XIDs that
    never mark a GPU unhealthy (besides the application XIDs); ``mps``: add the MPS variables;
    ``sync_timeout_s``: bound on the first list of the node's pods; ``metrics_host`` and
    ``metrics_port`` where ``/metrics`` is served (``None``: not served; the CLI's
    ``--metrics-port 0`` becomes ``None``); ``proc_root`` the
    host's ``/proc`` (GPU processes are mapped to pods through their cgroups);
    ``mps_managed``: run and supervise the MPS control daemon (needs NVML), with its
    directories under ``mps_root``, the binary ``mps_control`` and a liveness check every
    ``mps_check_interval_s``; ``unhealthy_configmap``: honour
    ``kube-system/unhealthy-gpu-<node>`` (module doc, 7); ``node_config``: read the node's
    entry in ConfigMap ``node_config_namespace``/``node_config_name``, retrying a deferred one
    every ``node_config_retry_s`` and reading the node's labels every ``node_config_poll_s``
    (module doc, 8); ``share_library_dir``: the host directory the share-view library is
    installed into (``None``: containers get no view), from ``share_library`` (``None``: the
    image's copy) (module doc, 11).
    """

    node_name: str
    unit: MemoryUnit = MemoryUnit.GIB
    socket_dir: Path = DEVICE_PLUGIN_DIR
    socket_name: str = DEFAULT_SOCKET_NAME
    health: bool = True
    recovery_s: float = 300.0
    ignored_xids: tuple[int, ...] = field(default=())
    mps: bool = False
    sync_timeout_s: float = 60.0
    metrics_host: str = DEFAULT_METRICS_HOST
    metrics_port: int | None = DEFAULT_METRICS_PORT
    proc_root: Path = Path("/proc")
    mps_managed: bool = False
    mps_root: Path = DEFAULT_MPS_ROOT
    mps_control: str = DEFAULT_MPS_CONTROL
    mps_check_interval_s: float = 5.0
    unhealthy_configmap: bool = True
    node_config: bool = True
    node_config_namespace: str = "kube-system"
    node_config_name: str = NODE_CONFIG_NAME
    node_config_retry_s: float = 10.0
    node_config_poll_s: float = 30.0
    dialects: tuple[str, ...] = ()
    split_count: int = DEFAULT_SPLIT_COUNT
    share_library: Path | None = None
    share_library_dir: Path | None = None


def inventory_gpus(
    gpus: list[PhysicalGpu], unit: MemoryUnit, isolation: Isolation | None = None
) -> list[InventoryGpu]:
    """The node-inventory records of ``gpus`` (memory in whole ``unit``; ``isolation``: how
    their shares are held and shown)."""
    return [
        InventoryGpu(g.index, g.uuid, g.model, g.units(unit), g.healthy, isolation) for g in gpus
    ]


def resource_runner(
    served: DialectResource,
    gpus: Sequence[PhysicalGpu],
    unit: MemoryUnit,
    pods: PodSource,
    *,
    node_name: str,
    socket_dir: Path = DEVICE_PLUGIN_DIR,
    mps: bool = False,
    mps_paths: MpsPaths | None = None,
    isolation: NodeIsolation | None = None,
    cdi: GpuCdi | None = None,
    events: AllocateEvents | None = None,
    observe: Callable[[str, float], None] | None = None,
    on_registered: Callable[[], Awaitable[None]] | None = None,
) -> tuple[PluginRunner, HandshakeAllocator | None]:
    """The runner serving ``served`` (``aliyun.com/gpu-mem`` or a dialect's resource) over
    ``gpus`` in ``unit``, and its ``HandshakeAllocator`` (``None`` for a resource answered
    empty, ``EmptyAllocator``). Allocate matches among ``pods``; ``mps``, ``mps_paths``,
    ``isolation``, ``cdi``, ``events`` and ``observe`` as ``HandshakeAllocator`` takes them;
    ``on_registered`` as ``PluginRunner`` takes it."""
    service = DevicePluginService(
        gpus, unit, EmptyAllocator(), per_gpu=served.per_gpu, resource=served.resource
    )
    handshake: HandshakeAllocator | None = None
    if served.allocate is not None:
        service.allocator = handshake = HandshakeAllocator(
            node_name,
            service,  # the GPUs and unit it advertises now
            pods,
            dialect=served.allocate,
            mps=mps,
            mps_paths=mps_paths,
            isolation=isolation,
            cdi=cdi,
            events=events,
            observe=observe,
        )
    runner = PluginRunner(
        service,
        socket_dir=socket_dir,
        socket_name=served.socket_name,
        resource_name=served.resource,
        on_registered=on_registered,
    )
    return runner, handshake


async def _cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


class DevicePluginDaemon:
    """The device plugin of one node (module doc). ``client`` is the caller's; ``nvml`` the
    backend for health checking (``None``: no health checking, e.g. fake GPUs); ``cdi`` the
    CDI devices Allocate names (module doc, 12; ``None``: none).

    Its parts: the node's pods (``pods``), the inventory publisher (``publisher``), one runner
    per served resource (``runners``, ``aliyun.com/gpu-mem``'s first), the GPUs' health
    (``health``, ``gpushare.deviceplugin.gpuhealth``), the node configuration
    (``node_config``, ``gpushare.deviceplugin.configcontrol``, fed by ``node_config_watch``),
    the hand marks (``marks``), the MPS supervisor (``mps``) and metrics."""

    def __init__(
        self,
        client: AsyncClient,
        inventory: Inventory,
        options: DaemonOptions,
        *,
        nvml: Nvml | None = None,
        cdi: GpuCdi | None = None,
    ) -> None:
        self.options = options
        self._nvml = nvml
        node = options.node_name
        self.pods = NodePods(
            client, node, keep=requests_gpu if options.dialects else requests_gpu_mem
        )
        self.publisher = NodePublisher(client)
        self.metrics_server: MetricsServer | None = None
        self.metrics = DevicePluginMetrics(
            node,
            lambda: self.service.gpus,
            nvml=nvml,
            pods=lambda: pods_by_uid(self.pods.pods()),
            proc_root=options.proc_root,
        )
        self.events = EventRecorder(client, component=EVENT_COMPONENT, instance=node)
        mps_paths = MpsPaths(options.mps_root) if options.mps_managed else None
        if mps_paths is not None and nvml is None:
            raise ValueError("mps_managed needs NVML (compute mode), not a declared fake")
        self._physical = inventory.gpus()
        library = installed_library(options.share_library, options.share_library_dir)
        self.isolation = node_isolation(
            mps=options.mps or options.mps_managed, nvml=nvml, library=library
        )
        """The node's share backend and view (module doc, 11)."""
        resources = (
            DialectResource(GPU_MEM, options.socket_name, per_gpu=None, allocate=GPU_MEM_DIALECT),
            *resources_for(options.dialects, options.split_count),
        )
        self.runners: list[PluginRunner] = []
        self.allocators: list[HandshakeAllocator] = []
        for served in resources:
            runner, allocator = resource_runner(
                served,
                self._physical,
                options.unit,
                self.pods,
                node_name=node,
                socket_dir=options.socket_dir,
                mps=options.mps,
                mps_paths=mps_paths,
                isolation=self.isolation,
                cdi=cdi,
                events=self.events,
                observe=self.metrics.observe_allocate,
                on_registered=self._registered if not self.runners else None,
            )
            self.runners.append(runner)
            if allocator is not None:
                self.allocators.append(allocator)
        self.runner = self.runners[0]
        """``aliyun.com/gpu-mem``'s runner (the dialects' follow it in ``runners``)."""
        self.service = self.runner.service
        self.allocator = self.allocators[0]
        self.health = GpuHealth(
            {gpu.index: gpu.healthy for gpu in self.service.gpus},
            lambda: self.services,
            self._republish,
        )
        self.node_config = NodeConfigController(
            node,
            self._physical,
            options.unit,
            NodeConfigMetrics(self.metrics.registry, node),
            pods=self.pods.pods,
            advertise=self._set_inventory,
            healthy=self.health.healthy,
            republish=self._republish,
            node_event=self._node_event,
            retry_s=options.node_config_retry_s,
        )
        self.node_config_watch: NodeConfigWatch | None = None
        if options.node_config:
            self.node_config_watch = NodeConfigWatch(
                client,
                node,
                self.node_config.changed,
                self.node_config.invalid,
                namespace=options.node_config_namespace,
                name=options.node_config_name,
                node_poll_s=options.node_config_poll_s,
            )
        self.marks: UnhealthyMarks | None = None
        if options.unhealthy_configmap:
            self.marks = UnhealthyMarks(
                client, node, self.health.indices, self._marks_changed, self._marks_invalid
            )
        self.mps: MpsSupervisor | None = None
        if mps_paths is not None and nvml is not None:
            gpus = self._physical
            self.mps = MpsSupervisor(
                MpsControl(mps_paths, [g.uuid for g in gpus], binary=options.mps_control),
                nvml,
                gpus,
                self.health.mps_changed,
                events=self._node_event,
                check_interval_s=options.mps_check_interval_s,
            )
            supervisor = self.mps
            self.metrics.watch_mps(lambda: supervisor.healthy)

    @property
    def services(self) -> list[DevicePluginService]:
        """Every resource's service: ``aliyun.com/gpu-mem`` first, then the dialects'."""
        return [runner.service for runner in self.runners]

    @property
    def configured(self) -> Configured:
        """The node configuration in force."""
        return self.node_config.configured

    async def _set_inventory(self, gpus: list[PhysicalGpu], unit: MemoryUnit) -> None:
        """Advertise ``gpus`` in ``unit`` on every resource, ``aliyun.com/gpu-mem`` first: its
        ``set_inventory`` raises ``DeviceListTooLargeError`` before anything changed
        (``configure`` refuses such a configuration earlier). The dialects' lists cannot outgrow
        what their services accepted at start: they depend on neither the unit nor anything a
        node config can raise (the GPUs kept and their memory only shrink)."""
        for service in self.services:
            await service.set_inventory(gpus, unit)

    async def publish(self, *, force: bool = False) -> None:
        """Publish the current inventory; ``KubeError`` when the API server refuses."""
        unit = self.service.unit
        config = self.configured.config
        self.isolation.configure(config.enforcement, bool(config.require_enforcement))
        gpus = inventory_gpus(self.service.gpus, unit, self.isolation.isolation)
        await self.publisher.publish(
            self.options.node_name, unit.value, gpus, force=force, serves=self.configured.serves
        )

    async def _republish(self, *, force: bool = False) -> None:
        try:
            await self.publish(force=force)
        except KubeError as error:
            log.error("publishing the GPU inventory of node %s: %s", self.options.node_name, error)

    async def _registered(self) -> None:
        """After a registration: publish again, unconditionally after a kubelet restart (it may
        have reset the node's extended resources); the first one follows ``run``'s publish."""
        self.metrics.observe_registration()
        await self._republish(force=self.runner.registrations > 1)

    async def _marks_changed(self, marked: frozenset[int]) -> None:
        """``unhealthy-gpu-<node>`` now marks ``marked`` (module doc, 7)."""
        shown = ", ".join(map(str, sorted(marked))) or "none"
        text = (
            f"GPUs marked unhealthy by configmap kube-system/"
            f"{unhealthy_configmap_name(self.options.node_name)}: {shown}"
        )
        log.log(logging.WARNING if marked else logging.INFO, "%s", text)
        await self.health.marks_changed(marked)
        await self._node_event("GpuMarkedUnhealthy", text, warning=bool(marked))

    async def _marks_invalid(self, error: CodecError) -> None:
        """``unhealthy-gpu-<node>`` holds a value that cannot be read: the last good marks stay."""
        log.error("%s; the GPUs marked before stay marked", error)
        await self._node_event(
            "UnhealthyGpuConfigInvalid", f"{error}; the GPUs marked before stay marked", True
        )

    async def _node_event(self, reason: str, message: str, warning: bool) -> None:
        kind = EventType.WARNING if warning else EventType.NORMAL
        try:
            await self.events.node_event(self.options.node_name, reason, message, kind)
        except KubeError as error:
            log.warning("recording the event %s failed: %s", reason, error)

    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set (module doc). What starts is stopped in reverse order,
        however the start ends."""
        options = self.options
        async with contextlib.AsyncExitStack() as stack:

            def background(work: Coroutine[None, None, None], name: str) -> None:
                stack.push_async_callback(_cancel, asyncio.create_task(work, name=name))

            self.pods.start()
            stack.push_async_callback(self.pods.stop)
            if options.metrics_port is not None:
                self.metrics_server = metrics = await serve_metrics(
                    self.metrics.registry, options.metrics_host, options.metrics_port
                )
                stack.push_async_callback(metrics.close)
                log.info("metrics on http://%s:%d/metrics", metrics.host, metrics.port)
            for allocator in self.allocators:
                stack.push_async_callback(allocator.drain_events)
            await self.pods.wait_synced(options.sync_timeout_s)
            if self.marks is not None:
                background(self.marks.run(), "gpushare-unhealthy-marks")
            if self.node_config_watch is not None:
                background(self.node_config_watch.run(), "gpushare-node-config")
                background(self.node_config.retry_deferred(), "gpushare-config-retry")
                await self.node_config.start(self.node_config_watch, options.sync_timeout_s)
            try:
                await self.publish(force=True)
            except KubeError as error:
                if not error.temporary:
                    raise
                log.error("publishing the GPU inventory (will retry): %s", error)
            if self.mps is not None:
                stack.push_async_callback(self.mps.stop)
                await self.mps.start()
                background(self.mps.run(), "gpushare-mps")
            for runner in self.runners:
                stack.push_async_callback(runner.stop)
                await runner.start()
                if runner is not self.runner:
                    log.info("serving %s on %s", runner.resource_name, runner.socket_path)
            if self._nvml is not None and options.health:
                watcher = HealthWatcher(
                    self._nvml,
                    self._physical,
                    self.health.xid_changed,
                    recovery_s=options.recovery_s,
                    ignored_xids=options.ignored_xids,
                )
                background(watcher.run(), "gpushare-health")
            else:
                log.info("GPU health checking is off")
            log.info(
                "device plugin for node %s: %d GPU(s), unit %s, socket %s",
                options.node_name, len(self.service.gpus), self.service.unit.value,
                self.runner.socket_path,
            )  # fmt: skip
            await stop.wait()
