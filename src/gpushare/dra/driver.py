"""``gpushare dra-driver``: the DRA driver of one node. It publishes the node's ResourceSlice from
the device plugin's inventory (``gpushare.dra.slices``; NVML or ``--fake-gpus``), serves the
kubelet plugin and its registration (``gpushare.dra.plugin``), and keeps the slice current: every
``resync_s`` it reads the inventory again and publishes a new pool generation when a GPU changed
(health, memory, a GPU gone or added). With ``best_fit`` (the default) it lists the GPUs least
free first, from the claims allocated to its node's pods (``gpushare.dra.nodeclaims``,
``gpushare.dra.usage``), and publishes again whenever that order changes, so that the
allocator's first fit is gpushare's best fit. It watches its own slice and publishes it again
at once when someone else deletes or changes it (kubelet deletes its node's slices when it
starts: ``gpushare.kube.resourceslices``). It stops when ``stop`` is set, removing its
sockets; the CDI specs of prepared claims stay (they are the prepared state a restart finds)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.deviceplugin.cdi import GpuCdi
from gpushare.deviceplugin.inventory import Inventory, PhysicalGpu
from gpushare.deviceplugin.isolation import NodeIsolation
from gpushare.dra.nodeclaims import NodeClaims
from gpushare.dra.plugin import ClaimSource, DraPluginService, serve
from gpushare.dra.slices import DRIVER, resource_slice, slice_name
from gpushare.dra.usage import device_order, memory_used
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.resourceslices import (
    publish_slice,
    published_digest,
    slice_digest,
    slice_reflector,
)
from gpushare.kube.unhealthy import UnhealthyMarks
from gpushare.kube.watch import Action, Change

__all__ = ["DraDriver", "DriverOptions"]

log = logging.getLogger(__name__)

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """Where the driver lives: ``plugin_dir`` (its DRA socket is ``<plugin_dir>/<driver>/
    dra.sock``), ``registry_dir`` (kubelet's plugin watcher: ``<driver>-reg.sock``), ``cdi_dir``
    (the CDI specs), the memory ``unit``, ``resync_s`` between inventory reads, ``mps``: give
    containers CUDA MPS limits (the node runs an MPS daemon), ``recheck_s``: how long a slice
    published unchanged goes without asking the API server whether it still holds it;
    ``best_fit``: list the GPUs least free first (module doc), else by index; ``settle_s``: how
    long after a change of the node's pods the order is computed (one slice for a burst);
    ``unhealthy_configmap``: also taint the GPUs an operator lists in Alibaba's ConfigMap
    ``kube-system/unhealthy-gpu-<node>`` (``gpushare.kube.unhealthy``, as the device plugin
    reads it)."""

    node: str
    unit: MemoryUnit = MemoryUnit.GIB
    driver: str = DRIVER
    plugin_dir: Path = Path("/var/lib/kubelet/plugins")
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Path = Path("/var/run/cdi")
    resync_s: float = 10.0
    mps: bool = False
    recheck_s: float = 300.0
    best_fit: bool = True
    settle_s: float = 0.1
    unhealthy_configmap: bool = False

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / self.driver / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"


class DraDriver:
    """The driver of ``options.node`` (module doc), on ``inventory``, publishing through
    ``client`` and reading claims from ``claims``; ``node_claims`` (with ``best_fit``, made
    from ``client`` when not given) the claims allocated on the node; ``isolation`` the
    node's share backend and view (``gpushare.deviceplugin.isolation``; ``None``: neither);
    ``gpu_cdi`` the CDI devices of the node's GPUs each prepared device names too
    (``gpushare.deviceplugin.cdi``, ``--cdi``; ``None``: none)."""

    def __init__(
        self,
        options: DriverOptions,
        inventory: Inventory,
        client: AsyncClient,
        claims: ClaimSource,
        node_claims: NodeClaims | None = None,
        *,
        isolation: NodeIsolation | None = None,
        gpu_cdi: GpuCdi | None = None,
    ) -> None:
        self.options = options
        self.inventory = inventory
        self.client = client
        if node_claims is None and options.best_fit:
            node_claims = NodeClaims(client, options.node, claims, on_change=self._wake_up)
        self.node_claims = node_claims
        self._claim_errors: list[str] = []
        self._marked: frozenset[int] = frozenset()
        self._wake = asyncio.Event()
        self._digest: str | None = None
        self._own = slice_reflector(
            client, slice_name(options.node, options.driver), self._own_slice_changed
        )
        self.marks: UnhealthyMarks | None = None
        if options.unhealthy_configmap:
            self.marks = UnhealthyMarks(
                client, options.node, frozenset(g.index for g in inventory.gpus()),
                self._marks_changed, self._marks_invalid,
            )  # fmt: skip
        self.service = DraPluginService(
            driver=options.driver, node=options.node, gpus=inventory.gpus, unit=options.unit,
            claims=claims, cdi_dir=options.cdi_dir, mps=options.mps, isolation=isolation,
            gpu_cdi=gpu_cdi,
        )  # fmt: skip
        self.generation = 0
        self._published: tuple[Json, float] | None = None  # (body, monotonic time checked)

    async def publish(self) -> int:
        """Publish the node's slice as the inventory says now; the pool generation it has. A
        slice that says what the last one published said is not asked about again before
        ``recheck_s`` (each resync would otherwise GET it from the API server: 100 requests a
        second from 1,000 nodes at the default 10 s)."""
        gpus = [
            dataclasses.replace(gpu, healthy=False) if gpu.index in self._marked else gpu
            for gpu in self.inventory.gpus()
        ]
        body = resource_slice(
            self.options.node, gpus, unit=self.options.unit, generation=1,
            driver=self.options.driver, order=await self._order(gpus),
        )  # fmt: skip
        now = time.monotonic()
        if self._published is not None:
            last, checked = self._published
            if last == body and now - checked < self.options.recheck_s:
                return self.generation
        self._digest = slice_digest(body)  # before: the watch may report the write first
        generation = await publish_slice(self.client, body)
        self._published = (body, now)
        if generation != self.generation:
            log.info(
                "published ResourceSlice %s, pool generation %d (%d GPUs)",
                body["metadata"]["name"], generation, len(body["spec"]["devices"]),
            )  # fmt: skip
        self.generation = generation
        return generation

    async def _order(self, gpus: list[PhysicalGpu]) -> list[int] | None:
        """The device order (module doc); ``None``: by index."""
        if self.node_claims is None:
            return None
        claims, errors = await self.node_claims.allocated()
        used, unreadable = memory_used(
            claims, driver=self.options.driver, node=self.options.node, gpus=gpus,
            unit=self.options.unit,
        )  # fmt: skip
        errors += unreadable
        if errors != self._claim_errors:  # said once, not every round
            for error in errors:
                log.warning("claim left out of the device order: %s", error)
        self._claim_errors = errors
        return device_order(gpus, used, self.options.unit)

    def _own_slice_changed(self, change: Change) -> None:
        """The node's slice as the API server holds it changed: someone else deleted it
        (kubelet does when it starts) or wrote it; publish again at the next round, now."""
        if change.action is Action.DELETE or published_digest(change.obj) != self._digest:
            if self._published is not None:
                log.info("ResourceSlice %s deleted or changed elsewhere: publishing it again",
                         change.key)  # fmt: skip
            self._published = None
            self._wake.set()

    async def _marks_changed(self, marked: frozenset[int]) -> None:
        log.info("GPUs marked unhealthy in the ConfigMap: %s", sorted(marked) or "none")
        self._marked = marked
        self._wake.set()

    async def _marks_invalid(self, error: Exception) -> None:
        log.warning("the unhealthy-GPU ConfigMap cannot be read; the last marks stay: %s", error)

    async def _next_round(self, stop: asyncio.Event) -> None:
        """Wait ``resync_s``, or until ``stop``, or until the node's pods or the marks change
        (then ``settle_s`` more, for the rest of a burst)."""
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
        try:
            await asyncio.wait(
                waits, timeout=self.options.resync_s, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiting in waits:
                waiting.cancel()
        if self._wake.is_set() and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.options.settle_s)
            self._wake.clear()

    def _wake_up(self) -> None:
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Publish, serve, and keep the slice current until ``stop`` (module doc)."""
        if self.node_claims is not None:
            self.node_claims.start()
        own = asyncio.create_task(self._own.run(), name="gpushare-dra-own-slice")
        marks = (
            asyncio.create_task(self.marks.run(), name="gpushare-dra-unhealthy-marks")
            if self.marks is not None
            else None
        )
        try:
            # Watching before the first publish: a deletion after it is an event, not missed.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._own.synced.wait(), self.options.resync_s)
            await self.publish()
            sockets = await serve(
                self.service, self.options.dra_socket, self.options.registration_socket
            )
            try:
                while not stop.is_set():
                    await self._next_round(stop)
                    if stop.is_set():
                        break
                    try:
                        await self.publish()
                    except Exception as error:  # the API server away: try again next round
                        log.warning("publishing the ResourceSlice failed; retrying: %s", error)
            finally:
                await sockets.stop()
        finally:
            for task in (own, marks):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            if self.node_claims is not None:
                await self.node_claims.stop()
