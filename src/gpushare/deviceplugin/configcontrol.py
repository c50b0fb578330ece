"""Applying the node's configuration to what the device plugin advertises, safely.

:class:`NodeConfigController` takes the node's entry of the ``gpushare-node-config`` ConfigMap
(read and watched by ``gpushare.kube.nodeconfig.NodeConfigWatch``, which calls
:meth:`~NodeConfigController.changed` and :meth:`~NodeConfigController.invalid`) and turns it
into the GPUs and unit every resource advertises (``gpushare.deviceplugin.nodeconfig.configure``):

* **At start** (:meth:`~NodeConfigController.start`, before the first publish): the
  configuration is read, waiting at most ``min(sync_timeout_s, NODE_CONFIG_SYNC_S)``; without
  it the plugin starts with its flags and applies the configuration once read. The unit in
  force is the one the node publishes already when a restart finds one (pods placed before hold
  memory in it), else ``--memory-unit``.
* **On a change**: applied at once (ListAndWatch re-advertises, the inventory is republished,
  a Normal Event ``NodeConfigApplied``), unless it would take memory from pods holding it
  (``deferral``): then the configuration in force stays, a Warning Event ``NodeConfigDeferred``
  says why once per reason, and the change is tried again every ``retry_s``
  (:meth:`~NodeConfigController.retry_deferred`) and on every change.
* **An entry that cannot be read**: a Warning Event ``NodeConfigInvalid``; nothing changes.

Metrics: ``NodeConfigMetrics`` (invalid, deferred).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Protocol

from gpushare.core.serves import Serves
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nodeconfig import Configured, NodeConfigMetrics, configure, deferral
from gpushare.kube.codec import CodecError, Json, MemoryUnit, node_info
from gpushare.kube.codec.nodeconfig import NodeConfig
from gpushare.kube.watch import JsonObject

__all__ = ["NODE_CONFIG_SYNC_S", "ConfigSource", "NodeConfigController", "NodeEvent"]

log = logging.getLogger(__name__)

NODE_CONFIG_SYNC_S = 10.0
"""The longest the plugin waits at start for the node config before serving with the flags."""


class ConfigSource(Protocol):
    """Where the node's configuration is read (``NodeConfigWatch``)."""

    namespace: str
    name: str
    config: NodeConfig
    node: JsonObject | None

    async def wait_synced(self, timeout_s: float) -> None:
        """Return once read; ``TimeoutError`` after ``timeout_s``."""
        ...


NodeEvent = Callable[[str, str, bool], Awaitable[None]]
"""Records an Event on the node: (reason, message, warning)."""


class NodeConfigController:
    """The configuration in force on node ``node`` and the one waiting (module doc).

    ``physical``: the node's GPUs; ``default_unit``: ``--memory-unit``; ``pods`` the node's
    pods now (for ``deferral``); ``advertise`` sets the GPUs and unit on every resource
    (``DeviceListTooLargeError`` before anything changed); ``healthy`` a GPU's health now;
    ``republish`` publishes the node inventory; ``node_event`` records an Event on the node.
    """

    def __init__(
        self,
        node: str,
        physical: Sequence[PhysicalGpu],
        default_unit: MemoryUnit,
        metrics: NodeConfigMetrics,
        *,
        pods: Callable[[], Sequence[Json]],
        advertise: Callable[[list[PhysicalGpu], MemoryUnit], Awaitable[None]],
        healthy: Callable[[int], bool],
        republish: Callable[[], Awaitable[None]],
        node_event: NodeEvent,
        retry_s: float = 10.0,
    ) -> None:
        self.node = node
        self._physical = tuple(physical)
        self._default_unit = default_unit
        self.metrics = metrics
        self._pods = pods
        self._advertise = advertise
        self._healthy = healthy
        self._republish = republish
        self._node_event = node_event
        self.retry_s = retry_s
        self.configured = Configured(self._physical, default_unit, Serves.BOTH, NodeConfig())
        """The configuration in force (the flags' until one is applied)."""
        self.wanted: Configured | None = None
        """A configuration waiting (deferred), if any."""
        self._deferred = ""
        self._lock = asyncio.Lock()
        self._ready = False  # changes wait for start

    async def start(self, source: ConfigSource, sync_timeout_s: float) -> None:
        """Before the first publish: read the configuration from ``source`` (bounded by
        ``sync_timeout_s`` and ``NODE_CONFIG_SYNC_S``) and apply it (module doc)."""
        bound_s = min(sync_timeout_s, NODE_CONFIG_SYNC_S)
        try:
            await source.wait_synced(bound_s)
        except TimeoutError:
            log.warning(
                "node config %s/%s not read within %g s (RBAC: configmaps get/list/watch in "
                "%s, nodes get); starting with the flags, it applies once read",
                source.namespace, source.name, bound_s, source.namespace,
            )  # fmt: skip
            self._ready = True
            return
        published = _published_unit(source.node)
        if published is not None and published is not self._default_unit:
            await self._advertise(list(self._physical), published)
            self.configured = Configured(self._physical, published, Serves.BOTH, NodeConfig())
        self._ready = True
        await self.reconfigure(source.config, publish=False)

    async def changed(self, config: NodeConfig) -> None:
        """The node's entry changed (``NodeConfigWatch``'s ``on_change``)."""
        if self._ready:
            await self.reconfigure(config)

    async def invalid(self, error: CodecError) -> None:
        """The node's entry cannot be read: the configuration in force stays."""
        self.metrics.set(invalid=True)
        text = f"{error}; the configuration in force stays"
        log.error("%s", text)
        await self._node_event("NodeConfigInvalid", text, True)

    async def retry_deferred(self) -> None:
        """Try a waiting configuration again every ``retry_s``; until cancelled."""
        while True:
            await asyncio.sleep(self.retry_s)
            wanted = self.wanted
            if wanted is not None:
                await self.reconfigure(wanted.config)

    async def reconfigure(self, config: NodeConfig, *, publish: bool = True) -> None:
        """Apply ``config`` now, or keep it waiting while it would take memory from pods."""
        node = self.node
        async with self._lock:
            try:
                new = configure(self._physical, config, self._default_unit, node)
            except CodecError as error:
                await self.invalid(error)
                return
            self.metrics.set(invalid=False)
            if new == self.configured:
                self.wanted, self._deferred = None, ""
                self.metrics.set(deferred=False)
                return
            why = deferral(self.configured, new, self._pods(), node)
            if why:
                self.wanted = new
                self.metrics.set(deferred=True)
                if why != self._deferred:
                    self._deferred = why
                    text = (
                        f"node config for node {node} waits: {why}; in force: "
                        f"{self.configured.describe()}"
                    )
                    log.warning("%s", text)
                    await self._node_event("NodeConfigDeferred", text, True)
                return
            self.wanted, self._deferred = None, ""
            self.metrics.set(deferred=False)
            gpus = [replace(g, healthy=self._healthy(g.index)) for g in new.gpus]
            await self._advertise(gpus, new.unit)
            self.configured = new
        text = f"node config for node {node} applied: {new.describe()}"
        log.info("%s", text)
        if publish:
            await self._republish()
        await self._node_event("NodeConfigApplied", text, False)


def _published_unit(node: JsonObject | None) -> MemoryUnit | None:
    """The unit node ``node`` publishes already (``None``: none, or unreadable)."""
    try:
        return None if node is None else node_info(node).unit
    except CodecError:
        return None
