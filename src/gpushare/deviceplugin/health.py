"""GPU health from NVML critical XID events, with recovery, for ListAndWatch and the inventory.

The rules follow NVIDIA's k8s-device-plugin (`internal/rm/health.go`):

* every GPU is registered for `nvmlEventTypeXidCriticalError`; a GPU that cannot report them
  (no XID bit in `nvmlDeviceGetSupportedEventTypes`, or registration fails) is logged and treated
  as always healthy;
* application XIDs are ignored: 13 (graphics engine exception), 31 (GPU memory page fault), 43
  (GPU stopped processing), 45 (preemptive cleanup), 68 (video processor exception) and 109
  (context switch timeout), plus the caller's `ignored_xids` (NVIDIA's
  `DP_DISABLE_HEALTHCHECKS=xids,<n>,...`);
* any other XID marks its GPU unhealthy; an event whose device is unknown (NVML gave no device,
  its UUID cannot be read, or it is not one of ours) and a failed event wait mark every watched
  GPU unhealthy. (NVIDIA ignores events for UUIDs it does not manage; gpushare manages every GPU
  of the node, so such an event is treated as unattributable.)

Unlike NVIDIA's plugin, an unhealthy GPU comes back: once `recovery_s` have passed without a new
critical XID on it, and a probe of the device (`nvmlDeviceGetMemoryInfo`) succeeds, it is healthy
again. `on_change(index, healthy)` is awaited on each transition, never otherwise.

Health checking can be turned off with `enabled=False`: `run` then returns at once without
touching NVML, and every GPU stays healthy (NVIDIA's `DP_DISABLE_HEALTHCHECKS=all`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import (
    ERROR_NOT_SUPPORTED,
    EVENT_TYPE_XID_CRITICAL_ERROR,
    DeviceHandle,
    EventSet,
    Nvml,
    NvmlError,
    NvmlEvent,
)

__all__ = ["APPLICATION_XIDS", "HealthWatcher", "OnHealthChange"]

log = logging.getLogger(__name__)

APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
"""XIDs caused by an application rather than the GPU (NVIDIA k8s-device-plugin's skip list)."""

OnHealthChange = Callable[[int, bool], Awaitable[None]]
"""Called with (GPU index, healthy) on each health transition."""


@dataclass(slots=True)
class _Watched:
    gpu: PhysicalGpu
    device: DeviceHandle
    healthy: bool = True
    last_xid: int | None = None
    last_xid_at: float = 0.0
    probe_failure_logged: bool = False


def _xid_text(xid: int | None) -> str:
    return "a failed NVML event wait" if xid is None else f"critical XID {xid}"


class HealthWatcher:
    """Watches NVML XID events for `gpus` and reports health transitions to `on_change`.

    `nvml` must be initialised (e.g. by the `NvmlInventory` that found `gpus`) for as long as the
    watcher runs. `recovery_s` (seconds on `clock`, default `time.monotonic`) is the quiet time
    before an unhealthy GPU is probed; `wait_timeout_s` bounds each blocking NVML wait (run in a
    thread), and so how long a recovery check can lag. Raises `ValueError` for a negative
    `recovery_s` or a non-positive `wait_timeout_s`.

    Use `run()` in a task and cancel it to stop; or drive it step by step with `open()`,
    `poll_once()` and `close()`.
    """

    def __init__(
        self,
        nvml: Nvml,
        gpus: Sequence[PhysicalGpu],
        on_change: OnHealthChange,
        *,
        enabled: bool = True,
        recovery_s: float = 300.0,
        ignored_xids: Iterable[int] = (),
        wait_timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        problems = []
        if recovery_s < 0:
            problems.append(f"recovery_s must be >= 0, got {recovery_s}")
        if wait_timeout_s <= 0:
            problems.append(f"wait_timeout_s must be > 0, got {wait_timeout_s}")
        if problems:
            raise ValueError("; ".join(problems))
        self._nvml = nvml
        self._gpus = list(gpus)
        self._on_change = on_change
        self.enabled = enabled
        self.recovery_s = recovery_s
        self.ignored_xids = APPLICATION_XIDS | frozenset(ignored_xids)
        self._wait_timeout_ms = max(1, round(wait_timeout_s * 1000))
        self._clock = clock
        self._watched: list[_Watched] = []
        self._event_set: EventSet | None = None
        self._lock = threading.Lock()
        self._waits_in_flight = 0
        self._free_pending: EventSet | None = None

    def healthy(self, index: int) -> bool:
        """Current health of the GPU with `index` (True for GPUs that are not watched)."""
        return all(w.healthy for w in self._watched if w.gpu.index == index)

    @property
    def watched(self) -> list[int]:
        """Indices of the GPUs registered for XID events (empty before `open`)."""
        return [w.gpu.index for w in self._watched]

    async def run(self) -> None:
        """Watch until cancelled: `open`, then `poll_once` forever, then `close`.

        Returns at once when `enabled` is False. Cancellation is prompt: the NVML wait in flight
        finishes in its thread (within `wait_timeout_s`) and the event set is freed after it.
        """
        if not self.enabled:
            log.info("GPU health checking is off: every GPU stays healthy")
            return
        self.open()
        try:
            while True:
                await self.poll_once()
        finally:
            self.close()

    def open(self) -> None:
        """Create the NVML event set and register every GPU for XID events (idempotent).

        Raises `NvmlError` when the event set cannot be created.
        """
        if not self.enabled or self._event_set is not None:
            return
        event_set = self._nvml.event_set_create()
        self._watched = []
        for gpu in self._gpus:
            try:
                device = self._nvml.device_handle_by_index(gpu.index)
                supported = self._nvml.device_supported_event_types(device)
                if not supported & EVENT_TYPE_XID_CRITICAL_ERROR:
                    raise NvmlError(ERROR_NOT_SUPPORTED, "no XidCriticalError in supported events")
                self._nvml.device_register_events(device, EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
            except NvmlError as error:
                log.warning(
                    "GPU %d (%s) cannot report XID events (%s): not health-checked, always healthy",
                    gpu.index,
                    gpu.uuid,
                    error,
                )
                continue
            self._watched.append(_Watched(gpu, device))
        self._event_set = event_set
        log.info(
            "GPU health checking on for GPU(s) %s: recovery after %g s, ignored XIDs %s",
            self.watched,
            self.recovery_s,
            sorted(self.ignored_xids),
        )

    def close(self) -> None:
        """Free the event set (after the NVML wait in flight, if any, has returned)."""
        with self._lock:
            event_set, self._event_set = self._event_set, None
            if event_set is None:
                return
            if self._waits_in_flight:
                self._free_pending = event_set
                return
        self._free(event_set)

    def _free(self, event_set: EventSet) -> None:
        try:
            self._nvml.event_set_free(event_set)
        except NvmlError as error:
            log.warning("cannot free the NVML event set: %s", error)

    def _wait_blocking(self) -> NvmlEvent | None:
        with self._lock:
            event_set = self._event_set
            if event_set is None:  # closed before this thread started
                return None
            self._waits_in_flight += 1
        try:
            return self._nvml.event_set_wait(event_set, self._wait_timeout_ms)
        finally:
            with self._lock:
                self._waits_in_flight -= 1
                pending = None
                if self._waits_in_flight == 0:
                    pending, self._free_pending = self._free_pending, None
            if pending is not None:
                self._free(pending)

    async def poll_once(self) -> None:
        """Wait for one NVML event (up to `wait_timeout_s`), apply it, then check recoveries.

        Raises `RuntimeError` when not open.
        """
        if self._event_set is None:
            raise RuntimeError("HealthWatcher.poll_once before open() or after close()")
        try:
            event = await asyncio.to_thread(self._wait_blocking)
        except NvmlError as error:
            log.warning("waiting for NVML events failed (%s): marking all GPUs unhealthy", error)
            await self._mark_unhealthy(self._watched, None)
            await asyncio.sleep(self._wait_timeout_ms / 1000)
            return
        if event is not None:
            await self._apply(event)
        await self._recover()

    async def _apply(self, event: NvmlEvent) -> None:
        if event.event_type != EVENT_TYPE_XID_CRITICAL_ERROR:
            log.debug("skipping NVML event of type 0x%x", event.event_type)
            return
        xid = event.event_data
        if xid in self.ignored_xids:
            log.info("ignoring application XID %d", xid)
            return
        await self._mark_unhealthy(self._owners(event.device, xid), xid)

    def _owners(self, device: DeviceHandle | None, xid: int) -> list[_Watched]:
        if device is None:
            log.warning("critical XID %d for no single device: marking all GPUs unhealthy", xid)
            return self._watched
        try:
            uuid = self._nvml.device_uuid(device)
        except NvmlError as error:
            log.warning("critical XID %d on a device whose UUID cannot be read (%s)", xid, error)
            return self._watched
        owners = [w for w in self._watched if w.gpu.uuid == uuid]
        if not owners:
            log.warning(
                "critical XID %d on unknown device %s: marking all GPUs unhealthy", xid, uuid
            )
            return self._watched
        return owners

    async def _mark_unhealthy(self, targets: Sequence[_Watched], xid: int | None) -> None:
        now = self._clock()
        for w in targets:
            w.last_xid, w.last_xid_at = xid, now
            if not w.healthy:
                log.info(
                    "GPU %d (%s) still unhealthy after %s: recovery timer restarted",
                    w.gpu.index,
                    w.gpu.uuid,
                    _xid_text(xid),
                )
                continue
            w.healthy, w.probe_failure_logged = False, False
            log.warning("GPU %d (%s) is unhealthy: %s", w.gpu.index, w.gpu.uuid, _xid_text(xid))
            await self._on_change(w.gpu.index, False)

    async def _recover(self) -> None:
        for w in self._watched:
            if w.healthy or self._clock() - w.last_xid_at < self.recovery_s:
                continue
            try:
                await asyncio.to_thread(self._nvml.device_memory_total_bytes, w.device)
            except NvmlError as error:
                if not w.probe_failure_logged:
                    w.probe_failure_logged = True
                    log.warning(
                        "GPU %d (%s) stays unhealthy: probe failed (%s) after %s",
                        w.gpu.index,
                        w.gpu.uuid,
                        error,
                        _xid_text(w.last_xid),
                    )
                continue
            w.healthy = True
            log.warning(
                "GPU %d (%s) is healthy again: %g s without a critical XID since %s, probe ok",
                w.gpu.index,
                w.gpu.uuid,
                self.recovery_s,
                _xid_text(w.last_xid),
            )
            await self._on_change(w.gpu.index, True)
