"""``MemoryUnit``, the one memory-unit vocabulary: the unit of ``aliyun.com/gpu-mem`` that the
device plugin advertises devices in, the inventory annotation names and the allocation records.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpushare.core.model import Allocation, ContainerAllocation, Gpu, Node
from gpushare.deviceplugin.inventory import parse_fake_gpus
from gpushare.extender.metrics import unit_bytes
from gpushare.kube.codec import (
    ALLOCATION,
    INVENTORY,
    CodecError,
    InventoryGpu,
    MemoryUnit,
    allocation_annotations,
    inventory_annotation,
    node_info,
)

UNITS = [
    ("GiB", "GiB", MemoryUnit.GIB, 1024),
    ("MiB", "MiB", MemoryUnit.MIB, 1),
]


@pytest.mark.parametrize(("name", "unit", "mib"), [u[1:] for u in UNITS], ids=[u[0] for u in UNITS])
def test_a_unit_reads_from_its_name_and_knows_its_size(
    name: str, unit: MemoryUnit, mib: int
) -> None:
    assert MemoryUnit(name) is unit
    assert (unit.mib, unit_bytes(unit)) == (mib, mib * 2**20)
    assert (str(unit), f"{unit}", json.dumps(unit)) == (name, name, f'"{name}"')


def test_the_units_are_gib_then_mib() -> None:
    assert list(MemoryUnit) == ["GiB", "MiB"]


@pytest.mark.parametrize(
    "name", ["gib", "GB", "KiB", "", " GiB"], ids=["lower case", "GB", "KiB", "empty", "space"]
)
def test_any_other_name_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match="is not a valid MemoryUnit"):
        MemoryUnit(name)


# -- the unit travels through the annotations unchanged ------------------------------------------

NODE = Node("n1", (Gpu(0, "T4", 16),))


@pytest.mark.parametrize(("unit", "mib"), [u[2:] for u in UNITS], ids=[u[0] for u in UNITS])
def test_inventory_round_trip_gives_the_unit_back(unit: MemoryUnit, mib: int) -> None:
    raw = inventory_annotation(unit, [InventoryGpu(0, "GPU-0", "T4", 16)])
    node = {
        "metadata": {"name": "n1", "labels": {"gpushare": "true"}, "annotations": {INVENTORY: raw}}
    }
    assert node_info(node).unit is unit
    assert json.loads(raw)["unit"] == unit.value


@pytest.mark.parametrize(("unit", "mib"), [u[2:] for u in UNITS], ids=[u[0] for u in UNITS])
def test_the_allocation_records_the_unit_by_name(unit: MemoryUnit, mib: int) -> None:
    allocation = Allocation("default/p", "n1", (ContainerAllocation("main", (0,), 4),))
    notes = allocation_annotations(allocation, NODE, now_ns=1, unit=unit)
    assert json.loads(notes[ALLOCATION])["unit"] == unit.value


BAD_INVENTORY_UNITS: list[tuple[str, Any]] = [
    ("unit missing", None),
    ("unit a number", 1024),
    ("unit a list", ["GiB"]),
    ("unit in lower case", "gib"),
    ("unit an object", {"GiB": True}),
]


@pytest.mark.parametrize(
    "unit", [b[1] for b in BAD_INVENTORY_UNITS], ids=[b[0] for b in BAD_INVENTORY_UNITS]
)
def test_an_inventory_with_an_unknown_unit_is_refused(unit: Any) -> None:
    raw = json.dumps({"unit": unit, "gpus": []})
    node = {"metadata": {"name": "n1", "annotations": {INVENTORY: raw}}}
    with pytest.raises(CodecError, match="unit missing or unknown"):
        node_info(node)


FAKE_SPECS = [
    ("GiB group", "2x16GiB:T4", [16 * 1024] * 2),
    ("MiB group", "1x512MiB", [512]),
    ("both", "1x1GiB,1x3MiB", [1024, 3]),
]


@pytest.mark.parametrize(
    ("spec", "memory_mib"), [f[1:] for f in FAKE_SPECS], ids=[f[0] for f in FAKE_SPECS]
)
def test_fake_gpus_are_declared_in_the_same_units(spec: str, memory_mib: list[int]) -> None:
    assert [gpu.memory_mib for gpu in parse_fake_gpus(spec)] == memory_mib
