"""The node's GPUs as Dynamic Resource Allocation devices: one ``ResourceSlice``
(``resource.k8s.io/v1``) per node, each GPU a device that several claims share, each taking part
of its capacity (consumable capacity, KEP-5075, Beta and on by default in v1.37). Pure; no I/O.

Per GPU (``PhysicalGpu``, from NVML or ``--fake-gpus``, the device plugin's inventory):

* ``name``: ``gpu-<index>`` (``device_name``);
* ``allowMultipleAllocations: true``: one GPU serves several claims;
* ``attributes``: ``uuid``, ``model`` (strings), ``index``, ``minor`` (ints), ``memoryMiB``
  (int: the GPU's memory, for CEL selectors such as ``device.attributes["gpu.gpushare.io"]
  .memoryMiB >= 40000``);
* ``capacity.memory``: the GPU's memory in the node's unit (``16Gi`` for a 16 GiB GPU counted in
  GiB; rounded down to whole units, as the device plugin counts it), with a ``requestPolicy``:
  a claim's request rounds up to whole units (``step``), at least one unit (``min``), at most
  the GPU (``max``; larger requests make the device ineligible); ``default`` all of it: a
  claim that asks no memory takes the whole GPU's (gpushare's whole-GPU templates);
* ``capacity.cores``: the GPU's compute in percent (``100``), a claim's ``cores`` request taking
  that part of it (gpu-manager's and HAMi's unit); ``default`` 0: a claim that asks no compute
  takes none, as an ``aliyun.com/gpu-mem`` pod does not bound compute;
* ``taints``: an unhealthy GPU carries ``gpushare.io/unhealthy=true:NoSchedule`` (device
  taints, GA in v1.37): no new claim is allocated on it, claims on it keep it.

The pool is the node (``pool.name`` = node name), one slice in it; ``generation`` grows with every
change so that the scheduler drops an older slice. Field names and semantics: docs/dra.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import CORES, DRIVER, MEMORY, device_name

__all__ = [
    "CORES",
    "CORES_PERCENT",
    "DRIVER",
    "MEMORY",
    "UNHEALTHY_TAINT",
    "device_class",
    "device_name",
    "resource_slice",
    "slice_name",
]

UNHEALTHY_TAINT = "gpushare.io/unhealthy"
"""The device taint key of an unhealthy GPU (effect ``NoSchedule``)."""
CORES_PERCENT = 100
"""The ``cores`` capacity of every GPU: percent."""

Json = dict[str, Any]


def device_class(name: str, driver: str = DRIVER) -> Json:
    """The DeviceClass ``name`` (JSON, ``resource.k8s.io/v1``) that selects ``driver``'s devices
    (the chart's ``draDriver.deviceClassName``, which renders the same selector)."""
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
    }


def slice_name(node: str, driver: str = DRIVER) -> str:
    """The name of node ``node``'s ResourceSlice: ``<node>-<driver with dots as dashes>``."""
    return f"{node}-{driver.replace('.', '-')}"


def _quantity(units: int, unit: MemoryUnit) -> str:
    """``units`` of ``unit`` as a Kubernetes quantity: ``16Gi``, ``16276Mi``."""
    return f"{units}{'Gi' if unit is MemoryUnit.GIB else 'Mi'}"


def _device(gpu: PhysicalGpu, unit: MemoryUnit) -> Json:
    units = gpu.units(unit)
    device: Json = {
        "name": device_name(gpu.index),
        "allowMultipleAllocations": True,
        "attributes": {
            "uuid": {"string": gpu.uuid},
            "model": {"string": gpu.model},
            "index": {"int": gpu.index},
            "minor": {"int": gpu.minor},
            "memoryMiB": {"int": gpu.memory_mib},
        },
        "capacity": {
            MEMORY: {
                "value": _quantity(units, unit),
                "requestPolicy": {
                    "default": _quantity(units, unit),
                    "validRange": {
                        "min": _quantity(1, unit),
                        "max": _quantity(units, unit),
                        "step": _quantity(1, unit),
                    },
                },
            },
            CORES: {
                "value": str(CORES_PERCENT),
                "requestPolicy": {
                    "default": "0",
                    "validRange": {"min": "0", "max": str(CORES_PERCENT), "step": "1"},
                },
            },
        },
    }
    if not gpu.healthy:
        device["taints"] = [{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}]
    return device


def resource_slice(
    node: str,
    gpus: Sequence[PhysicalGpu],
    *,
    unit: MemoryUnit,
    generation: int,
    driver: str = DRIVER,
    order: Sequence[int] | None = None,
) -> Json:
    """The ResourceSlice (JSON, ``resource.k8s.io/v1``) of node ``node`` with ``gpus`` (module
    doc), memory counted in ``unit``, pool ``generation`` (>= 1), the devices listed in
    ``order`` (GPU indices, each GPU once; default: by index), which the allocator's first fit
    follows (``gpushare.dra.usage.device_order``). ``ValueError`` for a GPU too small for one
    unit, a generation below 1, or an order that is not the GPUs' indices."""
    if generation < 1:
        raise ValueError(f"pool generation must be >= 1, got {generation}")
    by_index = {gpu.index: gpu for gpu in gpus}
    listed = sorted(by_index) if order is None else list(order)
    if sorted(listed) != sorted(by_index) or len(by_index) != len(gpus):
        raise ValueError(
            f"device order {listed[:16]}: not each of the GPU indices {sorted(by_index)[:16]} once"
        )
    for gpu in gpus:
        if gpu.units(unit) < 1:
            raise ValueError(
                f"GPU {gpu.index} ({gpu.memory_mib} MiB) holds no whole {unit} to share"
            )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": slice_name(node, driver)},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": [_device(by_index[index], unit) for index in listed],
        },
    }
