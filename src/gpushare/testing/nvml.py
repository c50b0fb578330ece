"""`FakeNvml`: a declared, in-memory NVML behind `gpushare.deviceplugin.nvml.Nvml`.

It behaves like NVML where gpushare's code paths depend on it: calls before `init` (or after the
last `shutdown`) fail with `ERROR_UNINITIALIZED`; handles are opaque and only valid for this fake;
events reach only the event sets a device was registered on, for the registered types; a wait
blocks (in its thread) until an event arrives or the timeout passes, and returns None on timeout as
`PynvmlBackend` does. Tests inject XIDs, failing probes, failing waits and a failing `init`, and
set what the metrics read: used memory, utilisation and compute processes per GPU.
Thread-safe: the health watcher waits in a worker thread while the test injects from the loop.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from gpushare.deviceplugin.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_NAMES,
    ERROR_GPU_IS_LOST,
    ERROR_INVALID_ARGUMENT,
    ERROR_NOT_SUPPORTED,
    ERROR_UNINITIALIZED,
    EVENT_TYPE_XID_CRITICAL_ERROR,
    DeviceHandle,
    EventSet,
    NvmlError,
    NvmlEvent,
)

__all__ = ["DEFAULT_SUPPORTED_EVENT_TYPES", "FakeDevice", "FakeNvml"]

DEFAULT_SUPPORTED_EVENT_TYPES = 0x1F
"""ECC single/double bit, P-state, XID critical error and clock events: a data-centre GPU."""


@dataclass(frozen=True, slots=True)
class FakeDevice:
    """One declared GPU: what NVML would report for it."""

    uuid: str
    minor: int
    name: str
    memory_bytes: int
    supported_event_types: int = DEFAULT_SUPPORTED_EVENT_TYPES


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


@dataclass(slots=True, eq=False)
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # device index -> event type mask
    events: deque[NvmlEvent] = field(default_factory=deque)
    freed: bool = False


class FakeNvml:
    """An `Nvml` over declared `devices` (index = position); `calls` records each call by name."""

    def __init__(self, devices: Sequence[FakeDevice], *, init_error: NvmlError | None = None):
        self.devices = list(devices)
        self.init_error = init_error
        self.calls: list[str] = []
        self._cond = threading.Condition()
        self._init_count = 0
        self._event_sets: list[_EventSet] = []
        self._probe_ok = [True] * len(self.devices)
        self._wait_errors: deque[NvmlError] = deque()
        self._memory_used = [0] * len(self.devices)
        self._utilization = [0] * len(self.devices)
        self._processes: list[list[tuple[int, int | None]]] = [[] for _ in self.devices]
        self.compute_modes = [COMPUTE_MODE_DEFAULT] * len(self.devices)
        """Each GPU's compute mode (`device_set_compute_mode` writes it; tests read it)."""
        self.set_compute_mode_error: NvmlError | None = None
        """Raised by `device_set_compute_mode` when set (e.g. `ERROR_NO_PERMISSION`)."""
        self.memory_limits_missing = "driver 580.159.04 (fake) has no nvmlDeviceSetMemoryLimits_v1"
        """What `driver_memory_limits` answers (`""`: the driver limits memory per cgroup)."""
        self.version = "580.159.04"
        """What `driver_version` answers."""

    # -- test controls -------------------------------------------------------------------------

    def inject_event(self, index: int | None, event_type: int, data: int) -> None:
        """Deliver an event for GPU `index` (None: no single device) to the event sets that
        registered `event_type` for it (for None: for any device)."""
        device = None if index is None else DeviceHandle(_Handle(index))
        with self._cond:
            for es in self._event_sets:
                masks = es.registered.values() if index is None else [es.registered.get(index, 0)]
                if not es.freed and any(mask & event_type for mask in masks):
                    es.events.append(NvmlEvent(device, event_type, data))
            self._cond.notify_all()

    def inject_xid(self, index: int | None, xid: int) -> None:
        """A critical XID `xid` on GPU `index`, or (None) one NVML attributes to no device."""
        self.inject_event(index, EVENT_TYPE_XID_CRITICAL_ERROR, xid)

    def set_probe_ok(self, index: int, ok: bool) -> None:
        """Make memory queries on GPU `index` succeed or fail with `ERROR_GPU_IS_LOST`."""
        with self._cond:
            self._probe_ok[index] = ok

    def fail_next_wait(self, error: NvmlError) -> None:
        """Make the next `event_set_wait` (on any set) raise `error`."""
        with self._cond:
            self._wait_errors.append(error)
            self._cond.notify_all()

    def set_memory_used(self, index: int, used_bytes: int) -> None:
        """What `device_memory_used_bytes` reports for GPU `index` (initially 0)."""
        with self._cond:
            self._memory_used[index] = used_bytes

    def set_utilization(self, index: int, percent: int) -> None:
        """What `device_utilization_gpu_percent` reports for GPU `index` (initially 0)."""
        with self._cond:
            self._utilization[index] = percent

    def set_processes(self, index: int, processes: Sequence[tuple[int, int | None]]) -> None:
        """The compute processes of GPU `index`: (PID, used bytes or None) (initially none)."""
        with self._cond:
            self._processes[index] = list(processes)

    @property
    def live_event_sets(self) -> int:
        """Event sets created and not yet freed."""
        with self._cond:
            return sum(not es.freed for es in self._event_sets)

    # -- Nvml ----------------------------------------------------------------------------------

    def _record(self, name: str) -> None:
        with self._cond:
            self.calls.append(name)
            if name != "init" and self._init_count == 0:
                raise NvmlError(ERROR_UNINITIALIZED, "Uninitialized")

    def _device(self, device: DeviceHandle) -> tuple[int, FakeDevice]:
        if not isinstance(device, _Handle) or not 0 <= device.index < len(self.devices):
            raise NvmlError(ERROR_INVALID_ARGUMENT, "Invalid Argument")
        return device.index, self.devices[device.index]

    def _event_set(self, event_set: EventSet) -> _EventSet:
        if not isinstance(event_set, _EventSet) or event_set.freed:
            raise NvmlError(ERROR_INVALID_ARGUMENT, "Invalid Argument")
        return event_set

    def init(self) -> None:
        self._record("init")
        if self.init_error is not None:
            raise self.init_error
        with self._cond:
            self._init_count += 1

    def shutdown(self) -> None:
        self._record("shutdown")
        with self._cond:
            self._init_count -= 1

    def device_count(self) -> int:
        self._record("device_count")
        return len(self.devices)

    def device_handle_by_index(self, index: int) -> DeviceHandle:
        self._record("device_handle_by_index")
        if not 0 <= index < len(self.devices):
            raise NvmlError(ERROR_INVALID_ARGUMENT, "Invalid Argument")
        return DeviceHandle(_Handle(index))

    def device_uuid(self, device: DeviceHandle) -> str:
        self._record("device_uuid")
        return self._device(device)[1].uuid

    def device_minor_number(self, device: DeviceHandle) -> int:
        self._record("device_minor_number")
        return self._device(device)[1].minor

    def device_name(self, device: DeviceHandle) -> str:
        self._record("device_name")
        return self._device(device)[1].name

    def device_memory_total_bytes(self, device: DeviceHandle) -> int:
        self._record("device_memory_total_bytes")
        index, spec = self._device(device)
        with self._cond:
            if not self._probe_ok[index]:
                raise NvmlError(ERROR_GPU_IS_LOST, "GPU is lost")
        return spec.memory_bytes

    def device_supported_event_types(self, device: DeviceHandle) -> int:
        self._record("device_supported_event_types")
        return self._device(device)[1].supported_event_types

    def device_memory_used_bytes(self, device: DeviceHandle) -> int:
        self._record("device_memory_used_bytes")
        index, _ = self._device(device)
        with self._cond:
            if not self._probe_ok[index]:
                raise NvmlError(ERROR_GPU_IS_LOST, "GPU is lost")
            return self._memory_used[index]

    def device_utilization_gpu_percent(self, device: DeviceHandle) -> int:
        self._record("device_utilization_gpu_percent")
        index, _ = self._device(device)
        with self._cond:
            return self._utilization[index]

    def device_compute_processes(self, device: DeviceHandle) -> list[tuple[int, int | None]]:
        self._record("device_compute_processes")
        index, _ = self._device(device)
        with self._cond:
            return list(self._processes[index])

    def device_compute_mode(self, device: DeviceHandle) -> int:
        self._record("device_compute_mode")
        index, _ = self._device(device)
        with self._cond:
            return self.compute_modes[index]

    def device_set_compute_mode(self, device: DeviceHandle, mode: int) -> None:
        self._record("device_set_compute_mode")
        index, _ = self._device(device)
        if mode not in COMPUTE_MODE_NAMES:
            raise NvmlError(ERROR_INVALID_ARGUMENT, "Invalid Argument")
        with self._cond:
            if self.set_compute_mode_error is not None:
                raise self.set_compute_mode_error
            self.compute_modes[index] = mode

    def event_set_create(self) -> EventSet:
        self._record("event_set_create")
        es = _EventSet()
        with self._cond:
            self._event_sets.append(es)
        return EventSet(es)

    def device_register_events(
        self, device: DeviceHandle, event_types: int, event_set: EventSet
    ) -> None:
        self._record("device_register_events")
        index, spec = self._device(device)
        es = self._event_set(event_set)
        if event_types & ~spec.supported_event_types:
            raise NvmlError(ERROR_NOT_SUPPORTED, "Not Supported")
        with self._cond:
            es.registered[index] = es.registered.get(index, 0) | event_types

    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NvmlEvent | None:
        self._record("event_set_wait")
        es = self._event_set(event_set)
        with self._cond:
            self._cond.wait_for(lambda: es.events or self._wait_errors, timeout_ms / 1000)
            if self._wait_errors:
                raise self._wait_errors.popleft()
            return es.events.popleft() if es.events else None

    def event_set_free(self, event_set: EventSet) -> None:
        self._record("event_set_free")
        es = self._event_set(event_set)
        with self._cond:
            es.freed = True

    def driver_version(self) -> str:
        self._record("driver_version")
        return self.version

    def driver_memory_limits(self) -> str:
        self._record("driver_memory_limits")
        return self.memory_limits_missing
