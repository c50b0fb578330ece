"""What the claims allocated on a node use of its GPUs, and the order its slice lists them in so
that the allocator's first fit is gpushare's best fit. Pure; no I/O.

kube-scheduler's DRA allocator takes, for each request, the first devices in pool, slice and
device order that fit (``k8s.io/dynamic-resource-allocation`` v0.37.1, ``structured``); no
plugin or extender can score devices. Listed least free first (``gpushare.core.fit.
best_fit_order``), first fit chooses the GPU that gpushare's best fit chooses (the smallest
remainder that still fits, Alibaba gpushare's binpack rule): the driver keeps its slice in that
order as claims are allocated on its node (``gpushare.dra.driver``; docs/dra.md, "Placement").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpushare.core.fit import best_fit_order
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import ClaimError, allocated_devices

__all__ = ["device_order", "memory_used"]


def memory_used(
    claims: Iterable[Mapping[str, Any]],
    *,
    driver: str,
    node: str,
    gpus: Sequence[PhysicalGpu],
    unit: MemoryUnit,
) -> tuple[dict[int, int], list[str]]:
    """The memory (units of ``unit``) that ``claims`` (ResourceClaim JSON, allocated or not)
    hold on each GPU index of ``node``, from their allocation results of ``driver``
    (``gpushare.kube.codec.dra.allocated_devices``; a result without memory holds the whole
    GPU), and one message per claim that could not be read (it is left out). Claims not
    allocated count nothing."""
    by_index = {gpu.index: gpu for gpu in gpus}
    used: dict[int, int] = {}
    errors: list[str] = []
    for claim in claims:
        status = claim.get("status")
        if not isinstance(status, Mapping) or not status.get("allocation"):
            continue
        try:
            found = allocated_devices(claim, driver=driver, node=node, indices=by_index, unit=unit)
        except ClaimError as error:
            errors.append(str(error))
            continue
        for device in found:
            whole = by_index[device.index].units(unit)
            share = whole if device.memory_units is None else device.memory_units
            used[device.index] = used.get(device.index, 0) + share
    return used, errors


def device_order(
    gpus: Sequence[PhysicalGpu], used: Mapping[int, int], unit: MemoryUnit
) -> list[int]:
    """The GPU indices least free first, lowest index on ties (``best_fit_order``), given
    ``used`` (``memory_used``); an unhealthy GPU counts as full (it is tainted: it takes no new
    claim)."""
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    free = [
        max(0, gpu.units(unit) - used.get(gpu.index, 0)) if gpu.healthy else 0 for gpu in ordered
    ]
    return [ordered[position].index for position in best_fit_order(free)]
