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
from gpushare.kube.codec.dra import memory_in_use

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
    hold on each of ``gpus`` on ``node``, and one message per claim that could not be read
    (``gpushare.kube.codec.dra.memory_in_use``, as the extender reads them)."""
    capacities = {gpu.index: gpu.units(unit) for gpu in gpus}
    return memory_in_use(claims, driver=driver, node=node, capacities=capacities, unit=unit)


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
