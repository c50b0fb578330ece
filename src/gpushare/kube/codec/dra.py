"""gpushare's DRA objects read into core values: the allocation results of a ResourceClaim, the
GPUs of a ResourceSlice of gpushare's driver, the asks of a pod's claims. Pure; no I/O.

Shared by the kubelet plugin (``gpushare.dra.prepare``: a claim it prepares), the driver's
device order (``gpushare.dra.usage``) and the extender's scoring of claim pods
(``gpushare.extender.dra``), so that all three read a claim alike. The objects' shapes are
``resource.k8s.io/v1`` (docs/dra.md); what gpushare's driver writes is ``gpushare.dra.slices``.

* ``allocated_devices``: a claim's results of one driver on one node: each names the node's
  pool and a device ``gpu-<index>``; ``consumedCapacity`` says the share (``memory`` in the
  node's unit, a whole number of units; absent: the whole GPU; ``cores`` a whole percentage,
  absent: none). Anything else is a ``ClaimError`` naming the value, the place and what is
  accepted.
* ``slice_node``: a slice's GPUs as a core ``Node`` and the unit its memory is shared in (the
  request policy's ``step``: ``1Gi`` or ``1Mi``); a GPU with a ``NoSchedule`` or ``NoExecute``
  taint is unhealthy. ``SliceError`` for what gpushare's driver does not write.
* ``claim_asks`` and ``claim_pod_request``: what a pod's claims ask of one DeviceClass (per
  request ``count`` GPUs, each ``memory``; none: the whole GPU, the slice's default) as the
  ``PodRequest`` the core fits and scores, memory rounded up to the node's unit.
* ``node_state``: a node's ``NodeState`` from its slice and the claims allocated on it.

Memory only in the last three: the allocator also checks ``cores``, and CEL selectors are not
read (a claim limited to some models is scored as if any would do).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from gpushare.core.model import ContainerRequest, Gpu, Node, NodeState, PodRequest
from gpushare.kube.codec.common import MemoryUnit, parse_quantity

__all__ = [
    "CORES",
    "DEVICE_CLASS",
    "DEVICE_PREFIX",
    "DRIVER",
    "MEMORY",
    "AllocatedDevice",
    "ClaimAsk",
    "ClaimError",
    "SliceError",
    "allocated_devices",
    "claim_asks",
    "claim_pod_request",
    "device_name",
    "memory_in_use",
    "node_state",
    "pod_claim_names",
    "slice_node",
    "text_field",
]

Json = Mapping[str, Any]
_MIB = 1024 * 1024
MEMORY = "memory"
"""The consumable capacity of a GPU's memory, in the node's unit (``16Gi``)."""
CORES = "cores"
"""The consumable capacity of a GPU's compute, in percent of the GPU."""
DRIVER = "gpu.gpushare.io"
"""The driver name: ``spec.driver`` of the slices and of every allocation result, the DeviceClass
selector, the kubelet plugin's name (a DNS subdomain)."""
DEVICE_CLASS = "gpushare-gpu"
"""The DeviceClass of gpushare's GPUs (the chart's ``draDriver.deviceClassName``)."""
DEVICE_PREFIX = "gpu-"
"""gpushare's device names: ``gpu-<index>``."""


def device_name(index: int) -> str:
    """``gpu-<index>``: the name of GPU ``index`` in gpushare's slices."""
    return f"{DEVICE_PREFIX}{index}"


class ClaimError(ValueError):
    """A claim whose allocation cannot be read; the text names the value, the place and what is
    accepted."""


class SliceError(ValueError):
    """A slice of gpushare's driver that cannot be read; the text names the device and field."""


@dataclass(frozen=True, slots=True)
class AllocatedDevice:
    """One allocation result of a driver: the ``request`` it serves, the GPU ``index``, the
    share (``memory_units`` of the node's unit, ``None``: none recorded, the whole GPU;
    ``cores_percent``) and the scheduler's ``share_id`` (``""`` when none)."""

    request: str
    index: int
    memory_units: int | None
    cores_percent: int
    share_id: str


def text_field(value: object, where: str, accepted: str) -> str:
    """``value`` when it is a non-empty string of at most 253 characters; ``ClaimError`` naming
    ``where`` and ``accepted`` otherwise."""
    if not isinstance(value, str) or not value or len(value) > 253:
        raise ClaimError(f"{where}={value!r}: not {accepted}")
    return value


def _units(value: object, where: str, unit: MemoryUnit) -> int:
    """A memory quantity in whole units of the node's ``unit``."""
    try:
        amount = parse_quantity(value)
    except ValueError as error:
        raise ClaimError(f"{where}={value!r}: {error}; accepted: a quantity such as 8Gi") from None
    units = amount / (unit.mib * _MIB)
    if units.denominator != 1 or units < 1:
        raise ClaimError(f"{where}={value!r}: not a whole number of {unit} (at least one)")
    return int(units)


def _percent(value: object, where: str) -> int:
    try:
        amount = parse_quantity(value)
    except ValueError as error:
        raise ClaimError(f"{where}={value!r}: {error}; accepted: 0-100") from None
    if amount.denominator != 1 or not 0 <= amount <= 100:
        raise ClaimError(f"{where}={value!r}: not a whole percentage 0-100")
    return int(amount)


def allocated_devices(
    claim: Json, *, driver: str, node: str, indices: Collection[int], unit: MemoryUnit
) -> list[AllocatedDevice]:
    """The allocation results of ``driver`` in ``claim`` (JSON as the API server returns it),
    on ``node`` whose GPUs have ``indices`` (module doc). ``ClaimError`` when the claim is not
    allocated, or a result of ``driver`` names another node's pool, a device the node lacks or
    a share that cannot be read."""
    meta = claim.get("metadata")
    subject = (
        f"claim {meta.get('namespace')}/{meta.get('name')}"
        if isinstance(meta, Mapping)
        else "claim"
    )
    status = claim.get("status")
    allocation = status.get("allocation") if isinstance(status, Mapping) else None
    results = (
        allocation.get("devices", {}).get("results") if isinstance(allocation, Mapping) else None
    )
    if not isinstance(results, list):
        raise ClaimError(f"{subject}: status.allocation.devices.results missing: not allocated")
    by_name = {device_name(index): index for index in indices}
    devices: list[AllocatedDevice] = []
    for i, result in enumerate(results):
        where = f"{subject} status.allocation.devices.results[{i}]"
        if not isinstance(result, Mapping):
            raise ClaimError(f"{where}: not an object")
        if result.get("driver") != driver:
            continue  # another driver's device
        pool = result.get("pool")
        if pool != node:
            raise ClaimError(f"{where}.pool={pool!r}: not this node's pool {node!r}")
        device = result.get("device")
        index = by_name.get(device) if isinstance(device, str) else None
        if index is None:
            raise ClaimError(
                f"{where}.device={device!r}: no such GPU on node {node} "
                f"(its devices: {', '.join(sorted(by_name)) or 'none'})"
            )
        consumed = result.get("consumedCapacity") or {}
        if not isinstance(consumed, Mapping):
            raise ClaimError(f"{where}.consumedCapacity: not an object")
        memory = (
            _units(consumed[MEMORY], f"{where}.consumedCapacity.{MEMORY}", unit)
            if MEMORY in consumed
            else None
        )
        cores = (
            _percent(consumed[CORES], f"{where}.consumedCapacity.{CORES}")
            if CORES in consumed
            else 0
        )
        share = result.get("shareID") or ""
        request = text_field(result.get("request"), f"{where}.request", "a request name")
        devices.append(AllocatedDevice(request, index, memory, cores, str(share)))
    return devices


def _attribute(device: Json, name: str, kind: str) -> object:
    value = ((device.get("attributes") or {}).get(name) or {}).get(kind)
    if value is None:
        raise SliceError(f"device {device.get('name')!r}: attribute {name} ({kind}) missing")
    return value


def slice_node(body: Json) -> tuple[Node, MemoryUnit]:
    """The GPUs of a ResourceSlice of gpushare's driver as node ``spec.nodeName`` (by index)
    and the unit its memory is shared in (module doc). ``SliceError`` naming the device and
    field for anything gpushare's driver does not write."""
    spec = body.get("spec") or {}
    gpus: list[Gpu] = []
    unit = MemoryUnit.GIB
    for device in spec.get("devices") or []:
        if not isinstance(device, Mapping):
            raise SliceError("a device that is not an object")
        memory = (device.get("capacity") or {}).get(MEMORY) or {}
        policy = (memory.get("requestPolicy") or {}).get("validRange") or {}
        try:
            capacity = parse_quantity(memory.get("value"))
            step = parse_quantity(policy.get("step", "1Gi"))
        except ValueError as error:
            raise SliceError(f"device {device.get('name')!r}: capacity.memory {error}") from None
        unit = MemoryUnit.GIB if step == 1024 * _MIB else MemoryUnit.MIB
        units = capacity / (unit.mib * _MIB)
        index = _attribute(device, "index", "int")
        if not isinstance(index, int) or index < 0 or units.denominator != 1 or units < 1:
            raise SliceError(
                f"device {device.get('name')!r}: index {index!r}, capacity.memory "
                f"{memory.get('value')!r} (accepted: an index >= 0, whole {unit})"
            )
        tainted = any(
            isinstance(t, Mapping) and t.get("effect") in {"NoSchedule", "NoExecute"}
            for t in device.get("taints") or []
        )
        model = str(_attribute(device, "model", "string"))
        gpus.append(Gpu(index, model, int(units), healthy=not tainted))
    gpus.sort(key=lambda gpu: gpu.index)
    return Node(str(spec.get("nodeName") or ""), tuple(gpus)), unit


def memory_in_use(
    claims: Iterable[Json],
    *,
    driver: str,
    node: str,
    capacities: Mapping[int, int],
    unit: MemoryUnit,
) -> tuple[dict[int, int], list[str]]:
    """The memory (units of ``unit``) that ``claims`` hold on each GPU of ``node`` that holds
    any, by GPU index, from their results of ``driver``; and one message per claim that could
    not be read (it is left out of the sum).

    ``capacities`` maps each GPU's index to its whole memory, which a result without a memory
    amount holds (a whole-GPU claim). Claims not allocated hold nothing."""
    used: dict[int, int] = {}
    errors: list[str] = []
    for claim in claims:
        status = claim.get("status")
        if not isinstance(status, Mapping) or not status.get("allocation"):
            continue
        try:
            found = allocated_devices(
                claim, driver=driver, node=node, indices=capacities, unit=unit
            )
        except ClaimError as error:
            errors.append(str(error))
            continue
        for device in found:
            share = device.memory_units
            held = capacities[device.index] if share is None else share
            used[device.index] = used.get(device.index, 0) + held
    return used, errors


def node_state(
    node: Node, unit: MemoryUnit, claims: Iterable[Json], *, driver: str
) -> tuple[NodeState, list[str]]:
    """``node``'s state with the memory ``claims`` (those allocated on it) hold on each GPU
    (``memory_in_use``), and one message per claim that could not be read (left out)."""
    capacities = {gpu.index: gpu.capacity for gpu in node.gpus}
    used, errors = memory_in_use(
        claims, driver=driver, node=node.name, capacities=capacities, unit=unit
    )
    state = NodeState(node, tuple(min(used.get(gpu.index, 0), gpu.capacity) for gpu in node.gpus))
    return state, errors


@dataclass(frozen=True, slots=True)
class ClaimAsk:
    """One request of a pod's claim for one DeviceClass: ``count`` distinct GPUs, each
    ``memory_bytes`` (``None``: the whole GPU)."""

    name: str
    count: int
    memory_bytes: Fraction | None


def pod_claim_names(pod: Json) -> list[str | None]:
    """The name of each claim pod ``pod`` (JSON) lists in ``spec.resourceClaims``, in order:
    the one its entry names, or the one the resourceclaim controller made from its template
    (``status.resourceClaimStatuses``); ``None`` while that is not made yet (or unreadable)."""
    made = {
        e.get("name"): e.get("resourceClaimName")
        for e in (pod.get("status") or {}).get("resourceClaimStatuses") or []
        if isinstance(e, Mapping)
    }
    names: list[str | None] = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        if not isinstance(entry, Mapping):
            continue
        name = entry.get("resourceClaimName") or made.get(entry.get("name"))
        names.append(name if isinstance(name, str) and name else None)
    return names


def claim_asks(
    pod: Json, claims: Mapping[tuple[str, str], Json], device_class: str
) -> list[ClaimAsk] | None:
    """What pod ``pod`` (JSON) asks of ``device_class`` through its claims (``claims`` by
    namespace and name; those the resourceclaim controller made from templates are named in
    ``status.resourceClaimStatuses``); ``None`` when one of its claims is not known yet or
    cannot be read (the pod is not scored). Requests of other classes, and ``firstAvailable``
    ones, are left out."""
    namespace = str((pod.get("metadata") or {}).get("namespace", ""))
    asks: list[ClaimAsk] = []
    for name in pod_claim_names(pod):
        claim = claims.get((namespace, name)) if name is not None else None
        if claim is None:
            return None
        for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
            exactly = request.get("exactly") if isinstance(request, Mapping) else None
            if not isinstance(exactly, Mapping) or exactly.get("deviceClassName") != device_class:
                continue
            count = exactly.get("count", 1)
            memory = ((exactly.get("capacity") or {}).get("requests") or {}).get(MEMORY)
            try:
                amount = None if memory is None else parse_quantity(memory)
            except ValueError:
                return None
            if not isinstance(count, int) or count < 1 or (amount is not None and amount <= 0):
                return None
            asks.append(ClaimAsk(f"{name}/{request.get('name')}", count, amount))
    return asks


def claim_pod_request(key: str, asks: Sequence[ClaimAsk], unit: MemoryUnit) -> PodRequest:
    """The core's request for ``asks`` on a node sharing memory in ``unit``: each memory ask
    rounded up to whole units (the slice's ``step``); a whole-GPU ask ``exclusive``."""
    containers = []
    for ask in asks:
        if ask.memory_bytes is None:
            containers.append(ContainerRequest(ask.name, 0, ask.count, exclusive=True))
        else:
            units = -(-ask.memory_bytes // (unit.mib * _MIB))
            containers.append(ContainerRequest(ask.name, int(units), ask.count))
    return PodRequest(key, tuple(containers))
