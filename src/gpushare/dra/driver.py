"""``gpushare dra-driver``: the DRA driver of one node. It publishes the node's ResourceSlice from
the device plugin's inventory (``gpushare.dra.slices``; NVML or ``--fake-gpus``), serves the
kubelet plugin and its registration (``gpushare.dra.plugin``), and keeps the slice current: every
``resync_s`` it reads the inventory again and publishes a new pool generation when a GPU changed
(health, memory, a GPU gone or added). It stops when ``stop`` is set, removing its sockets; the
CDI specs of prepared claims stay (they are the prepared state a restart finds)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpushare.deviceplugin.inventory import Inventory
from gpushare.dra.plugin import ClaimSource, DraPluginService, serve
from gpushare.dra.slices import DRIVER, resource_slice
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.resourceslices import publish_slice

__all__ = ["DraDriver", "DriverOptions"]

log = logging.getLogger(__name__)

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class DriverOptions:
    """Where the driver lives: ``plugin_dir`` (its DRA socket is ``<plugin_dir>/<driver>/
    dra.sock``), ``registry_dir`` (kubelet's plugin watcher: ``<driver>-reg.sock``), ``cdi_dir``
    (the CDI specs), the memory ``unit``, ``resync_s`` between inventory reads, ``mps``: give
    containers CUDA MPS limits (the node runs an MPS daemon), ``recheck_s``: how long a slice
    published unchanged goes without asking the API server whether it still holds it."""

    node: str
    unit: MemoryUnit = MemoryUnit.GIB
    driver: str = DRIVER
    plugin_dir: Path = Path("/var/lib/kubelet/plugins")
    registry_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    cdi_dir: Path = Path("/var/run/cdi")
    resync_s: float = 10.0
    mps: bool = False
    recheck_s: float = 300.0

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / self.driver / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registry_dir / f"{self.driver}-reg.sock"


class DraDriver:
    """The driver of ``options.node`` (module doc), on ``inventory``, publishing through
    ``client`` and reading claims from ``claims``."""

    def __init__(
        self,
        options: DriverOptions,
        inventory: Inventory,
        client: AsyncClient,
        claims: ClaimSource,
    ) -> None:
        self.options = options
        self.inventory = inventory
        self.client = client
        self.service = DraPluginService(
            driver=options.driver, node=options.node, gpus=inventory.gpus, unit=options.unit,
            claims=claims, cdi_dir=options.cdi_dir, mps=options.mps,
        )  # fmt: skip
        self.generation = 0
        self._published: tuple[Json, float] | None = None  # (body, monotonic time checked)

    async def publish(self) -> int:
        """Publish the node's slice as the inventory says now; the pool generation it has. A
        slice that says what the last one published said is not asked about again before
        ``recheck_s`` (each resync would otherwise GET it from the API server: 100 requests a
        second from 1,000 nodes at the default 10 s)."""
        body = resource_slice(
            self.options.node, self.inventory.gpus(), unit=self.options.unit, generation=1,
            driver=self.options.driver,
        )  # fmt: skip
        now = time.monotonic()
        if self._published is not None:
            last, checked = self._published
            if last == body and now - checked < self.options.recheck_s:
                return self.generation
        generation = await publish_slice(self.client, body)
        self._published = (body, now)
        if generation != self.generation:
            log.info(
                "published ResourceSlice %s, pool generation %d (%d GPUs)",
                body["metadata"]["name"], generation, len(body["spec"]["devices"]),
            )  # fmt: skip
        self.generation = generation
        return generation

    async def run(self, stop: asyncio.Event) -> None:
        """Publish, serve, and keep the slice current until ``stop`` (module doc)."""
        await self.publish()
        sockets = await serve(
            self.service, self.options.dra_socket, self.options.registration_socket
        )
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.options.resync_s)
                if stop.is_set():
                    break
                try:
                    await self.publish()
                except Exception as error:  # the API server away: try again next round
                    log.warning("publishing the ResourceSlice failed; retrying: %s", error)
        finally:
            await sockets.stop()
