"""GPU discovery through NVML, behind a narrow `Nvml` interface that a fake can stand in for.

`Nvml` lists exactly the NVML calls gpushare makes (NVML API reference, "Device Queries" and
"Event Handling Methods"). `PynvmlBackend` implements it with `pynvml` (the `nvidia-ml-py`
package); `gpushare.testing.nvml.FakeNvml` implements it for tests. Both raise `NvmlError` (the
NVML return code and its text) and never pynvml's own exception types, so callers handle one kind.

`NvmlInventory` is the real `gpushare.deviceplugin.inventory.Inventory`: it initialises NVML once
and discovers the GPUs (index, UUID, minor number, model, total memory in MiB). When NVML cannot
be loaded or initialised (no driver, libraries not mounted) it raises `NvmlUnavailableError`, a
user error whose one-line message names the fix; callers print it without a traceback.

Errors: `NvmlError(code, text)` for a failed NVML call (codes are NVML's `nvmlReturn_t`);
`NvmlUnavailableError` for "no usable NVML here".
"""

from __future__ import annotations

import importlib
import logging
from dataclasses import dataclass
from typing import Any, NewType, Protocol

from gpushare.deviceplugin.inventory import PhysicalGpu

__all__ = [
    "COMPUTE_MODE_DEFAULT",
    "COMPUTE_MODE_EXCLUSIVE_PROCESS",
    "COMPUTE_MODE_NAMES",
    "ERROR_DRIVER_NOT_LOADED",
    "ERROR_GPU_IS_LOST",
    "ERROR_INVALID_ARGUMENT",
    "ERROR_LIBRARY_NOT_FOUND",
    "ERROR_NOT_SUPPORTED",
    "ERROR_TIMEOUT",
    "ERROR_UNINITIALIZED",
    "ERROR_UNKNOWN",
    "EVENT_TYPE_XID_CRITICAL_ERROR",
    "MEMORY_LIMITS_FUNCTION",
    "DeviceHandle",
    "EventSet",
    "Nvml",
    "NvmlError",
    "NvmlEvent",
    "NvmlInventory",
    "NvmlUnavailableError",
    "PynvmlBackend",
    "event_type_names",
]

log = logging.getLogger(__name__)

# nvmlReturn_t values (nvml.h) that gpushare or its fake uses.
ERROR_UNINITIALIZED = 1
ERROR_INVALID_ARGUMENT = 2
ERROR_NOT_SUPPORTED = 3
ERROR_DRIVER_NOT_LOADED = 9
ERROR_TIMEOUT = 10
ERROR_LIBRARY_NOT_FOUND = 12
ERROR_GPU_IS_LOST = 15
ERROR_UNKNOWN = 999

COMPUTE_MODE_DEFAULT = 0
"""`NVML_COMPUTEMODE_DEFAULT`: any number of contexts per device."""
COMPUTE_MODE_EXCLUSIVE_PROCESS = 3
"""`NVML_COMPUTEMODE_EXCLUSIVE_PROCESS`: one context per device (the MPS server's), what MPS
needs so that every CUDA process goes through it (NVIDIA MPS documentation, section 2.3)."""
COMPUTE_MODE_NAMES = {0: "DEFAULT", 1: "EXCLUSIVE_THREAD", 2: "PROHIBITED", 3: "EXCLUSIVE_PROCESS"}
"""`nvmlComputeMode_t` names, as `nvidia-smi -c` spells them."""

MEMORY_LIMITS_FUNCTION = "nvmlDeviceSetMemoryLimits_v1"
"""The NVML call that limits a cgroup's memory on a GPU (driver r615+, CUDA 13.4)."""

EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
"""`nvmlEventTypeXidCriticalError`: the event's data is the XID number."""

_EVENT_TYPE_NAMES = {
    0x1: "SingleBitEccError",
    0x2: "DoubleBitEccError",
    0x4: "PState",
    0x8: "XidCriticalError",
    0x10: "Clock",
    0x80: "PowerSourceChange",
    0x100: "MigConfigChange",
    0x200: "SingleBitEccErrorStorm",
    0x400: "DramRetirementEvent",
    0x800: "DramRetirementFailure",
    0x1000: "NonFatalPoisonError",
    0x2000: "FatalPoisonError",
    0x4000: "GpuUnavailableError",
    0x8000: "GpuRecoveryAction",
}

DeviceHandle = NewType("DeviceHandle", object)
"""An opaque `nvmlDevice_t` (valid between `Nvml.init` and `Nvml.shutdown`)."""
EventSet = NewType("EventSet", object)
"""An opaque `nvmlEventSet_t`."""


class NvmlError(Exception):
    """An NVML call failed: `code` is NVML's `nvmlReturn_t`, the message its error string."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailableError(Exception):
    """NVML cannot be loaded or initialised on this machine (a user error, not a bug)."""

    def __init__(self, detail: str, code: int | None = None) -> None:
        self.detail = detail
        self.code = code
        super().__init__(
            f"NVML could not be loaded/initialised: {detail}; run on a node with the NVIDIA "
            "driver, mount the driver libraries (e.g. the NVIDIA container toolkit), or use "
            "--fake-gpus '2x16GiB:T4' for a declared fake"
        )


@dataclass(frozen=True, slots=True)
class NvmlEvent:
    """One `nvmlEventData_t`.

    `device` is the handle NVML reported, None when it reported none (an event for all devices);
    `event_type` one `nvmlEventType*` bit; `event_data` the XID number for XID events.
    """

    device: DeviceHandle | None
    event_type: int
    event_data: int


class Nvml(Protocol):
    """The NVML calls gpushare makes; every method raises `NvmlError` on failure."""

    def init(self) -> None:
        """`nvmlInit`: load the library and initialise it (reference-counted by NVML)."""
        ...

    def shutdown(self) -> None:
        """`nvmlShutdown`: release what `init` acquired."""
        ...

    def device_count(self) -> int:
        """`nvmlDeviceGetCount`: GPUs visible to this process."""
        ...

    def device_handle_by_index(self, index: int) -> DeviceHandle:
        """`nvmlDeviceGetHandleByIndex` for index 0..count-1."""
        ...

    def device_uuid(self, device: DeviceHandle) -> str:
        """`nvmlDeviceGetUUID`: "GPU-" followed by the GPU's UUID."""
        ...

    def device_minor_number(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetMinorNumber`: N of /dev/nvidiaN."""
        ...

    def device_name(self, device: DeviceHandle) -> str:
        """`nvmlDeviceGetName`, e.g. "Tesla T4"."""
        ...

    def device_memory_total_bytes(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetMemoryInfo(...).total` in bytes (also the health probe)."""
        ...

    def device_supported_event_types(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetSupportedEventTypes`: a bit mask of `nvmlEventType*`."""
        ...

    def device_memory_used_bytes(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetMemoryInfo(...).used` in bytes (metrics)."""
        ...

    def device_utilization_gpu_percent(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetUtilizationRates(...).gpu`: percent of the last sample period during
        which a kernel ran, 0-100 (metrics)."""
        ...

    def device_compute_processes(self, device: DeviceHandle) -> list[tuple[int, int | None]]:
        """`nvmlDeviceGetComputeRunningProcesses`: (PID, used GPU memory in bytes) per compute
        process; the PID is in the host's PID namespace, the memory `None` when NVML cannot
        report it (`NVML_VALUE_NOT_AVAILABLE`) (metrics)."""
        ...

    def device_compute_mode(self, device: DeviceHandle) -> int:
        """`nvmlDeviceGetComputeMode`: a `COMPUTE_MODE_*` value."""
        ...

    def device_set_compute_mode(self, device: DeviceHandle, mode: int) -> None:
        """`nvmlDeviceSetComputeMode` (needs root; not persistent across reboots or driver
        reloads)."""
        ...

    def event_set_create(self) -> EventSet:
        """`nvmlEventSetCreate`."""
        ...

    def device_register_events(
        self, device: DeviceHandle, event_types: int, event_set: EventSet
    ) -> None:
        """`nvmlDeviceRegisterEvents`; `ERROR_NOT_SUPPORTED` when the GPU cannot report them."""
        ...

    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NvmlEvent | None:
        """`nvmlEventSetWait`: block up to `timeout_ms`; None on `ERROR_TIMEOUT`."""
        ...

    def event_set_free(self, event_set: EventSet) -> None:
        """`nvmlEventSetFree`."""
        ...

    def driver_version(self) -> str:
        """The driver's version, e.g. `580.159.04` (`nvmlSystemGetDriverVersion`): the suffix
        of its libraries' file names (`libcuda.so.<version>`, `gpushare.deviceplugin.cdifiles`)."""
        ...

    def driver_memory_limits(self) -> str:
        """Why the driver cannot limit GPU memory per cgroup, `""` when it can: its NVML has
        `nvmlDeviceSetMemoryLimits_v1` (driver r615+, CUDA 13.4; the NVIDIA container
        toolkit's CDI hook `apply-cuda-memory-limits` calls it)."""
        ...


class PynvmlBackend:
    """`Nvml` over `pynvml` (nvidia-ml-py); pynvml's `NVMLError` becomes `NvmlError`.

    `module` is the pynvml module; by default it is imported on first use (it ships no type
    stubs, so it is typed `Any` here) and a missing package is `ERROR_LIBRARY_NOT_FOUND`.
    """

    def __init__(self, module: Any = None) -> None:
        self._pynvml: Any = module

    def _lib(self) -> Any:
        if self._pynvml is None:
            try:
                self._pynvml = importlib.import_module("pynvml")
            except ImportError as error:
                raise NvmlError(
                    ERROR_LIBRARY_NOT_FOUND, f"cannot import pynvml (nvidia-ml-py): {error}"
                ) from error
        return self._pynvml

    def _call(self, name: str, *args: object) -> Any:
        lib = self._lib()
        try:
            return getattr(lib, name)(*args)
        except lib.NVMLError as error:
            raise NvmlError(int(error.value), str(error)) from error

    def init(self) -> None:
        self._call("nvmlInit")

    def shutdown(self) -> None:
        self._call("nvmlShutdown")

    def device_count(self) -> int:
        return int(self._call("nvmlDeviceGetCount"))

    def device_handle_by_index(self, index: int) -> DeviceHandle:
        return DeviceHandle(self._call("nvmlDeviceGetHandleByIndex", index))

    def device_uuid(self, device: DeviceHandle) -> str:
        return _text(self._call("nvmlDeviceGetUUID", device))

    def device_minor_number(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMinorNumber", device))

    def device_name(self, device: DeviceHandle) -> str:
        return _text(self._call("nvmlDeviceGetName", device))

    def device_memory_total_bytes(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", device).total)

    def device_supported_event_types(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetSupportedEventTypes", device))

    def device_memory_used_bytes(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetMemoryInfo", device).used)

    def device_utilization_gpu_percent(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetUtilizationRates", device).gpu)

    def device_compute_processes(self, device: DeviceHandle) -> list[tuple[int, int | None]]:
        processes = self._call("nvmlDeviceGetComputeRunningProcesses", device)
        return [
            (int(p.pid), None if p.usedGpuMemory is None else int(p.usedGpuMemory))
            for p in processes
        ]

    def device_compute_mode(self, device: DeviceHandle) -> int:
        return int(self._call("nvmlDeviceGetComputeMode", device))

    def device_set_compute_mode(self, device: DeviceHandle, mode: int) -> None:
        self._call("nvmlDeviceSetComputeMode", device, mode)

    def event_set_create(self) -> EventSet:
        return EventSet(self._call("nvmlEventSetCreate"))

    def device_register_events(
        self, device: DeviceHandle, event_types: int, event_set: EventSet
    ) -> None:
        self._call("nvmlDeviceRegisterEvents", device, event_types, event_set)

    def event_set_wait(self, event_set: EventSet, timeout_ms: int) -> NvmlEvent | None:
        try:
            data = self._call("nvmlEventSetWait", event_set, timeout_ms)
        except NvmlError as error:
            if error.code == ERROR_TIMEOUT:
                return None
            raise
        # A NULL nvmlDevice_t (no single device) is a falsy ctypes pointer.
        device = DeviceHandle(data.device) if data.device else None
        return NvmlEvent(device, int(data.eventType), int(data.eventData))

    def event_set_free(self, event_set: EventSet) -> None:
        self._call("nvmlEventSetFree", event_set)

    def driver_version(self) -> str:
        return _text(self._call("nvmlSystemGetDriverVersion"))

    def driver_memory_limits(self) -> str:
        lib = self._lib()
        try:
            version = _text(self._call("nvmlSystemGetDriverVersion"))
        except NvmlError as error:
            return f"the driver version cannot be read: {error}"
        try:
            lib._nvmlGetFunctionPointer(MEMORY_LIMITS_FUNCTION)
        except lib.NVMLError:
            return f"driver {version} has no {MEMORY_LIMITS_FUNCTION} (driver r615+ has)"
        return ""


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def event_type_names(mask: int) -> list[str]:
    """Names of the `nvmlEventType*` bits set in `mask` (unknown bits as hex), lowest first."""
    names = []
    for bit in range(mask.bit_length()):
        flag = 1 << bit
        if mask & flag:
            names.append(_EVENT_TYPE_NAMES.get(flag, f"0x{flag:x}"))
    return names


class NvmlInventory:
    """The node's GPUs as NVML reports them (`Inventory` with `fake` False).

    NVML is initialised and the GPUs discovered on construction; `close` shuts NVML down (call it
    after any `HealthWatcher` on the same `Nvml` has stopped). Raises `NvmlUnavailableError` when
    NVML cannot be initialised, and `NvmlError` when a discovered GPU cannot be queried.
    """

    def __init__(self, nvml: Nvml) -> None:
        self.nvml = nvml
        try:
            nvml.init()
        except NvmlError as error:
            raise NvmlUnavailableError(str(error), error.code) from error
        try:
            self._gpus = [self._discover(index) for index in range(nvml.device_count())]
        except BaseException:
            nvml.shutdown()
            raise
        for gpu in self._gpus:
            log.info(
                "GPU %d: %s, minor %d, %s, %d MiB",
                gpu.index,
                gpu.uuid,
                gpu.minor,
                gpu.model,
                gpu.memory_mib,
            )

    def _discover(self, index: int) -> PhysicalGpu:
        try:
            device = self.nvml.device_handle_by_index(index)
            return PhysicalGpu(
                index=index,
                uuid=self.nvml.device_uuid(device),
                minor=self.nvml.device_minor_number(device),
                model=self.nvml.device_name(device),
                memory_mib=self.nvml.device_memory_total_bytes(device) // 2**20,
            )
        except NvmlError as error:
            raise NvmlError(error.code, f"cannot query GPU {index}: {error}") from error

    @property
    def fake(self) -> bool:
        """Always False: the GPUs are discovered hardware."""
        return False

    def gpus(self) -> list[PhysicalGpu]:
        """The GPUs found at construction, ordered by NVML index, all `healthy=True`."""
        return list(self._gpus)

    def close(self) -> None:
        """Shut NVML down (`nvmlShutdown`)."""
        self.nvml.shutdown()
