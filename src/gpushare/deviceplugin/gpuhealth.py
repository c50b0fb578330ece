"""A GPU's health from its three sources, applied to every served resource.

A GPU is healthy when all three say so (:class:`GpuHealth`):

* **XIDs** (``gpushare.deviceplugin.health.HealthWatcher``): a critical XID marks the GPU
  unhealthy until a quiet ``recovery_s`` has passed;
* **the managed MPS control daemon** (``gpushare.deviceplugin.mps.MpsSupervisor``, only with
  ``--mps-managed``): while it is down every GPU is unhealthy, whatever the XIDs say (containers
  given its directories could not run);
* **marks by hand** (``gpushare.kube.unhealthy.UnhealthyMarks``): the GPUs an operator lists in
  Alibaba's ConfigMap ``kube-system/unhealthy-gpu-<node>``.

Every change sets the health of each GPU on every sink (the resources' ``DevicePluginService``:
ListAndWatch sends the new list) and then republishes the node inventory. The controller only
decides and forwards; the watchers that feed it run elsewhere.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Protocol

__all__ = ["GpuHealth", "HealthSink"]

log = logging.getLogger(__name__)


class HealthSink(Protocol):
    """What takes a GPU's health (``DevicePluginService.set_health``)."""

    async def set_health(self, index: int, healthy: bool) -> None:
        """GPU ``index`` is now ``healthy`` (no-op when it already was)."""
        ...


class GpuHealth:
    """The health of the GPUs in ``xid_healthy`` (GPU index → what the inventory says at
    start) (module doc). ``sinks`` gives the services to tell (read at every change);
    ``republish`` publishes the node inventory after a change. The MPS daemon starts up and
    nothing marked."""

    def __init__(
        self,
        xid_healthy: Mapping[int, bool],
        sinks: Callable[[], Sequence[HealthSink]],
        republish: Callable[[], Awaitable[None]],
    ) -> None:
        self._xid = dict(xid_healthy)
        self._mps_up = True
        self._marked: frozenset[int] = frozenset()
        self._sinks = sinks
        self._republish = republish

    @property
    def indices(self) -> frozenset[int]:
        """The GPUs whose health is kept."""
        return frozenset(self._xid)

    @property
    def marked(self) -> frozenset[int]:
        """The GPUs marked unhealthy by hand now."""
        return self._marked

    @property
    def mps_up(self) -> bool:
        """The managed MPS daemon is up (always ``True`` when it is not managed)."""
        return self._mps_up

    def healthy(self, index: int) -> bool:
        """GPU ``index``: no critical XID, MPS up, not marked; ``False`` for an unknown index."""
        return self._xid.get(index, False) and self._mps_up and index not in self._marked

    async def xid_changed(self, index: int, healthy: bool) -> None:
        """An XID transition of GPU ``index`` (``HealthWatcher``'s callback)."""
        if index not in self._xid:
            log.warning("health of GPU %d reported, but the node has no such GPU", index)
            return
        self._xid[index] = healthy
        await self._apply([index])

    async def mps_changed(self, up: bool) -> None:
        """The managed MPS daemon went down (every GPU unhealthy) or came back."""
        self._mps_up = up
        await self._apply(self._xid)

    async def marks_changed(self, marked: frozenset[int]) -> None:
        """``unhealthy-gpu-<node>`` marks exactly ``marked`` now."""
        self._marked = frozenset(marked)
        await self._apply(self._xid)

    async def _apply(self, indices: Iterable[int]) -> None:
        for index in indices:
            for sink in self._sinks():
                await sink.set_health(index, self.healthy(index))
        await self._republish()
