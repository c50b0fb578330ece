"""The node's GPUs as DRA devices (``gpushare.dra.slices``): what each device says, in the node's
unit, and what is refused. The API server's acceptance and kube-scheduler's allocation of these
slices: tests/cluster/test_dra_allocation.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import (
    CORES,
    DRIVER,
    MEMORY,
    UNHEALTHY_TAINT,
    device_name,
    resource_slice,
    slice_name,
)
from gpushare.kube.codec import MemoryUnit

T4 = PhysicalGpu(0, "GPU-aaaa", 3, "Tesla-T4", 15360)
A100 = PhysicalGpu(1, "GPU-bbbb", 4, "A100-SXM4-40GB", 40960, healthy=False)


@dataclass(frozen=True)
class Memory:
    id: str
    gpu: PhysicalGpu
    unit: MemoryUnit
    capacity: dict[str, Any]


MEMORY_CASES = [
    Memory("a 15 GiB GPU counted in GiB: 15Gi, one GiB a step", T4, MemoryUnit.GIB,
           {"value": "15Gi", "requestPolicy": {"default": "15Gi", "validRange": {
               "min": "1Gi", "max": "15Gi", "step": "1Gi"}}}),
    Memory("the same GPU counted in MiB: 15360Mi, one MiB a step", T4, MemoryUnit.MIB,
           {"value": "15360Mi", "requestPolicy": {"default": "15360Mi", "validRange": {
               "min": "1Mi", "max": "15360Mi", "step": "1Mi"}}}),
    Memory("memory not a whole number of units is rounded down, as the device plugin counts",
           PhysicalGpu(0, "GPU-c", 0, "Tesla-P4", 7611), MemoryUnit.GIB,
           {"value": "7Gi", "requestPolicy": {"default": "7Gi", "validRange": {
               "min": "1Gi", "max": "7Gi", "step": "1Gi"}}}),
]  # fmt: skip


@pytest.mark.parametrize("case", MEMORY_CASES, ids=[c.id for c in MEMORY_CASES])
def test_a_gpus_memory_is_consumable_in_the_nodes_unit(case: Memory) -> None:
    (device,) = resource_slice("n1", [case.gpu], unit=case.unit, generation=1)["spec"]["devices"]
    assert device["capacity"][MEMORY] == case.capacity


def test_a_device_is_shareable_and_says_what_gpu_it_is() -> None:
    body = resource_slice("n1", [A100, T4], unit=MemoryUnit.GIB, generation=3)
    assert body["metadata"]["name"] == slice_name("n1") == "n1-gpu-gpushare-io"
    spec = body["spec"]
    assert (spec["driver"], spec["nodeName"]) == (DRIVER, "n1")
    assert spec["pool"] == {"name": "n1", "generation": 3, "resourceSliceCount": 1}
    t4, a100 = spec["devices"]  # in index order
    assert (t4["name"], a100["name"]) == (device_name(0), device_name(1)) == ("gpu-0", "gpu-1")
    assert t4["allowMultipleAllocations"] is True
    assert t4["attributes"] == {
        "uuid": {"string": "GPU-aaaa"}, "model": {"string": "Tesla-T4"}, "index": {"int": 0},
        "minor": {"int": 3}, "memoryMiB": {"int": 15360},
    }  # fmt: skip
    assert t4["capacity"][CORES] == {
        "value": "100", "requestPolicy": {"default": "0", "validRange": {
            "min": "0", "max": "100", "step": "1"}},
    }  # fmt: skip
    assert "taints" not in t4


def test_an_unhealthy_gpu_is_tainted_so_that_no_new_claim_lands_on_it() -> None:
    (device,) = resource_slice("n1", [A100], unit=MemoryUnit.GIB, generation=1)["spec"]["devices"]
    assert device["taints"] == [{"key": UNHEALTHY_TAINT, "value": "true", "effect": "NoSchedule"}]


@pytest.mark.parametrize(
    ("gpus", "generation", "message"),
    [
        pytest.param([PhysicalGpu(0, "GPU-x", 0, "tiny", 512)], 1, "holds no whole GiB",
                     id="a GPU smaller than one unit"),
        pytest.param([T4], 0, "generation must be >= 1", id="a generation below 1"),
    ],
)  # fmt: skip
def test_what_no_slice_can_say_is_refused(
    gpus: list[PhysicalGpu], generation: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        resource_slice("n1", gpus, unit=MemoryUnit.GIB, generation=generation)
