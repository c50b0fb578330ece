"""GPU inventory for the device plugin: the GPU record, a declared fake, and the device list.

The device plugin advertises `aliyun.com/gpu-mem` to kubelet as one fake device per memory unit
per GPU (`--memory-unit GiB|MiB`). Device IDs encode the GPU (`<UUID>-_-<n>`), are stable across
plugin restarts and stay within kubelet's 63-character limit. A device list that would not fit in
one ListAndWatch message (kubelet's 4 MiB gRPC receive limit) is refused before serving.

Real GPUs are discovered through NVML (`gpushare.deviceplugin.nvml.NvmlInventory`); machines
without GPUs use an explicit `--fake-gpus` declaration such as `"2x16GiB:T4"`, parsed by
`parse_fake_gpus`, which always logs that it is fake.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from gpushare.deviceplugin._proto import api_pb2
from gpushare.kube.codec import GPU_MEM, MemoryUnit

__all__ = [
    "HEALTHY",
    "KUBELET_MAX_MESSAGE_BYTES",
    "MAX_FAKE_GPUS",
    "MAX_GPU_MEMORY_MIB",
    "RESOURCE_GPU_MEM",
    "UNHEALTHY",
    "DeviceListTooLargeError",
    "DevicesPerGpu",
    "FakeGpuSpecError",
    "FakeInventory",
    "Inventory",
    "PhysicalGpu",
    "build_devices",
    "check_message_size",
    "device_id",
    "device_ids",
    "gpu_of_device",
    "list_and_watch_response",
    "parse_fake_gpus",
]

log = logging.getLogger(__name__)

RESOURCE_GPU_MEM = GPU_MEM
HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
KUBELET_MAX_MESSAGE_BYTES = 4 * 1024 * 1024
"""kubelet's default gRPC receive limit for one ListAndWatch message (4 MiB)."""

MAX_FAKE_GPUS = 256
"""Most GPUs a `--fake-gpus` declaration may hold in all (real nodes have up to 16)."""
MAX_GPU_MEMORY_MIB = 1024 * 1024
"""Most memory of one declared GPU: 1 TiB (the largest GPUs today have under 300 GB)."""

_MAX_DIGITS = 12
_ID_SEPARATOR = "-_-"
_MAX_DEVICE_ID_CHARS = 63


@dataclass(frozen=True, slots=True)
class PhysicalGpu:
    """One physical (or declared fake) GPU on the node, as NVML (or ``--fake-gpus``) gives it:
    UUID, minor number, memory in MiB. Not ``gpushare.core.model.Gpu``, the unit-free GPU the
    scheduler places on (its capacity in the node's unit)."""

    index: int
    uuid: str
    minor: int
    model: str
    memory_mib: int
    healthy: bool = True

    def units(self, unit: MemoryUnit) -> int:
        """Whole memory units of this GPU (rounded down)."""
        return self.memory_mib // unit.mib


class Inventory(Protocol):
    """Source of the node's GPUs (NVML on real nodes, `FakeInventory` elsewhere)."""

    @property
    def fake(self) -> bool:
        """True when the GPUs are a declaration rather than discovered hardware."""
        ...

    def gpus(self) -> list[PhysicalGpu]:
        """The GPUs, ordered by index."""
        ...


class FakeGpuSpecError(ValueError):
    """A `--fake-gpus` declaration that cannot be parsed."""


_GROUP = re.compile(
    r"^(?:(?P<count>\d+)\s*[xX×]\s*)?(?P<size>\d+)\s*(?P<unit>"
    + "|".join(MemoryUnit)
    + r")(?::(?P<model>.*))?$"
)
_SPEC_HELP = (
    "expected comma-separated groups COUNTxSIZE(GiB|MiB)[:MODEL], e.g. '2x16GiB:T4' or "
    "'1x80GiB:H100,2x24GiB:L4'"
)


def parse_fake_gpus(spec: str) -> list[PhysicalGpu]:
    """Parse a `--fake-gpus` declaration into GPUs with deterministic fake UUIDs.

    Groups are comma-separated `COUNTxSIZE<GiB|MiB>[:MODEL]`; COUNT defaults to 1 and MODEL to
    "FakeGPU". Indices (and minor numbers) run on across groups in order. At most
    `MAX_FAKE_GPUS` GPUs in all, each of at most `MAX_GPU_MEMORY_MIB`: the bounds are checked
    before any GPU is made (without that, `99999999x16GiB` ran forever).
    """
    if not spec.strip():
        raise FakeGpuSpecError(f"empty --fake-gpus declaration; {_SPEC_HELP}")
    gpus: list[PhysicalGpu] = []
    for raw in spec.split(","):
        group = raw.strip()
        match = _GROUP.match(group)
        if match is None:
            raise FakeGpuSpecError(f"bad --fake-gpus group {group!r}; {_SPEC_HELP}")
        count = _bounded(group, match["count"] or "1", "GPU count", 1, MAX_FAKE_GPUS)
        memory_mib = (
            _bounded(
                group, match["size"], f"memory in {match['unit']}", 1, _per_unit(match["unit"])
            )
            * MemoryUnit(match["unit"]).mib
        )
        model = "FakeGPU" if match["model"] is None else match["model"].strip()
        if len(gpus) + count > MAX_FAKE_GPUS:
            raise FakeGpuSpecError(
                f"bad --fake-gpus group {group!r}: {len(gpus) + count} GPUs in all; accepted "
                f"at most {MAX_FAKE_GPUS}"
            )
        if not model or len(model) > 64:
            raise FakeGpuSpecError(
                f"bad --fake-gpus group {group!r}: model must be 1 to 64 characters"
            )
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                PhysicalGpu(
                    index=index,
                    uuid=f"GPU-fa4e0000-0000-4000-8000-{index:012x}",
                    minor=index,
                    model=model,
                    memory_mib=memory_mib,
                )
            )
    return gpus


def _per_unit(unit: str) -> int:
    return MAX_GPU_MEMORY_MIB // MemoryUnit(unit).mib


def _bounded(group: str, digits: str, what: str, low: int, high: int) -> int:
    """`digits` as an int within `[low, high]`, else `FakeGpuSpecError` naming the group, the
    value and the accepted range (long digit strings are refused unconverted)."""
    value = int(digits) if len(digits) <= _MAX_DIGITS else None
    if value is None or not low <= value <= high:
        raise FakeGpuSpecError(
            f"bad --fake-gpus group {group!r}: {what} {digits} is out of range; accepted "
            f"{low} to {high}"
        )
    return value


class FakeInventory:
    """A declared, fake GPU inventory (`--fake-gpus`); logs loudly that it is fake."""

    def __init__(self, spec: str) -> None:
        self._spec = spec
        self._gpus = parse_fake_gpus(spec)
        log.warning(
            "FAKE GPU inventory from --fake-gpus %r: %d fake GPU(s), no NVML; "
            "containers get no real GPU",
            spec,
            len(self._gpus),
        )

    @property
    def fake(self) -> bool:
        """Always True."""
        return True

    def gpus(self) -> list[PhysicalGpu]:
        """The declared GPUs."""
        return list(self._gpus)

    def set_health(self, index: int, healthy: bool) -> PhysicalGpu:
        """Mark GPU `index` healthy or not (for tests and health simulation)."""
        gpu = replace(self._gpus[index], healthy=healthy)
        self._gpus[index] = gpu
        return gpu


def device_id(gpu: PhysicalGpu, n: int) -> str:
    """The advertised device ID for unit `n` of `gpu`: `<UUID>-_-<n>`."""
    ident = f"{gpu.uuid}{_ID_SEPARATOR}{n}"
    if len(ident) > _MAX_DEVICE_ID_CHARS:
        raise ValueError(
            f"device ID {ident!r} is {len(ident)} characters; kubelet allows at most "
            f"{_MAX_DEVICE_ID_CHARS}"
        )
    return ident


def gpu_of_device(ident: str) -> str:
    """The GPU UUID encoded in a device ID made by `device_id`."""
    uuid, sep, n = ident.rpartition(_ID_SEPARATOR)
    if not sep or not n.isdigit():
        raise ValueError(f"{ident!r} is not a gpushare device ID (<UUID>{_ID_SEPARATOR}<n>)")
    return uuid


DevicesPerGpu = Callable[[PhysicalGpu], int]
"""How many devices a resource advertises for one GPU (a dialect's resource,
``gpushare.deviceplugin.dialects``); ``None`` where accepted: one per memory unit."""


def _count(gpu: PhysicalGpu, unit: MemoryUnit, per_gpu: DevicesPerGpu | None) -> int:
    return gpu.units(unit) if per_gpu is None else per_gpu(gpu)


def device_ids(
    gpus: Sequence[PhysicalGpu], unit: MemoryUnit, per_gpu: DevicesPerGpu | None = None
) -> Iterator[str]:
    """The advertised device IDs of ``gpus`` in order (``device_id``): one per memory unit per
    GPU, or ``per_gpu(gpu)`` per GPU."""
    for gpu in gpus:
        for n in range(_count(gpu, unit, per_gpu)):
            yield device_id(gpu, n)


def build_devices(
    gpus: Sequence[PhysicalGpu], unit: MemoryUnit, per_gpu: DevicesPerGpu | None = None
) -> list[api_pb2.Device]:
    """One device per memory unit per GPU (or ``per_gpu(gpu)`` devices), health taken from
    its GPU."""
    return [
        api_pb2.Device(ID=ident, health=HEALTHY if gpu.healthy else UNHEALTHY)
        for gpu in gpus
        for ident in device_ids((gpu,), unit, per_gpu)
    ]


def list_and_watch_response(
    gpus: Sequence[PhysicalGpu], unit: MemoryUnit, per_gpu: DevicesPerGpu | None = None
) -> api_pb2.ListAndWatchResponse:
    """The full ListAndWatch message for the current GPUs."""
    return api_pb2.ListAndWatchResponse(devices=build_devices(gpus, unit, per_gpu))


class DeviceListTooLargeError(ValueError):
    """The device list would not fit into one kubelet gRPC message."""

    def __init__(
        self,
        gpus: int,
        devices: int,
        size: int,
        unit: MemoryUnit,
        limit: int,
        *,
        resource: str = RESOURCE_GPU_MEM,
    ) -> None:
        self.gpus = gpus
        self.limit = limit
        self.devices = devices
        self.size = size
        self.unit = unit
        fix = (
            "use --memory-unit GiB"
            if unit is MemoryUnit.MIB and resource == RESOURCE_GPU_MEM
            else "split the node's GPUs over several plugins/resources"
        )
        of = f"1 {unit.value}" if resource == RESOURCE_GPU_MEM else resource
        super().__init__(
            f"refusing to start: the {resource} device list ({gpus} GPU(s), {devices} "
            f"devices of {of}) serialises to at least {size} bytes, over kubelet's "
            f"{limit}-byte gRPC message limit (4 MiB = {KUBELET_MAX_MESSAGE_BYTES}); {fix}"
        )


def _varint_bytes(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _device_entry_bytes(ident: str, health: str) -> int:
    """Wire size of one `repeated Device devices = 1` entry (computed, not serialised)."""
    body = sum(1 + _varint_bytes(len(f)) + len(f) for f in (ident.encode(), health.encode()))
    return 1 + _varint_bytes(body) + body


def check_message_size(
    gpus: Sequence[PhysicalGpu],
    unit: MemoryUnit,
    limit: int = KUBELET_MAX_MESSAGE_BYTES,
    per_gpu: DevicesPerGpu | None = None,
    resource: str = RESOURCE_GPU_MEM,
) -> int:
    """Serialised size of the worst-case ListAndWatch message; raise if it exceeds `limit`.

    The worst case has every device "Unhealthy" (the longer health string). The size is computed
    from the protobuf wire format without building the message, and the count stops once it
    passes `limit` (bounded work for any GPU list: the reported size is then a lower bound).
    """
    size = 0
    for ident in device_ids(gpus, unit, per_gpu):
        size += _device_entry_bytes(ident, UNHEALTHY)
        if size > limit:
            raise DeviceListTooLargeError(
                len(gpus),
                sum(_count(g, unit, per_gpu) for g in gpus),
                size,
                unit,
                limit,
                resource=resource,
            )
    return size
