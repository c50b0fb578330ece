"""The inventory encoder (``gpushare.io/gpu-inventory``): exact output, refusals, and the round
trip through ``node_info`` (what the extender and inspect read)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpushare.core.model import Gpu, Node
from gpushare.kube.codec import (
    GPUSHARE_LABEL,
    INVENTORY,
    InventoryGpu,
    MemoryUnit,
    inventory_annotation,
    node_info,
)
from gpushare.testing.nodes import FakeGpu, gpu_node
from gpushare.testing.nodes import inventory_annotation as fake_inventory_annotation

UUID0 = "GPU-4a0d5f5e-0000-0000-0000-000000000000"
UUID1 = "GPU-4a0d5f5e-0000-0000-0000-000000000001"
V100 = "Tesla-V100-SXM2-16GB"
A100 = "NVIDIA-A100-SXM4-40GB"

ENCODED = [
    (
        "two identical GPUs, GiB",
        "GiB",
        [InventoryGpu(0, UUID0, V100, 16), InventoryGpu(1, UUID1, V100, 16)],
        '{"unit":"GiB","gpus":['
        f'{{"index":0,"uuid":"{UUID0}","model":"{V100}","memory":16,"healthy":true}},'
        f'{{"index":1,"uuid":"{UUID1}","model":"{V100}","memory":16,"healthy":true}}]}}',
    ),
    (
        "heterogeneous models, MiB, given out of order",
        "MiB",
        [InventoryGpu(1, UUID1, A100, 40536), InventoryGpu(0, UUID0, V100, 16276)],
        '{"unit":"MiB","gpus":['
        f'{{"index":0,"uuid":"{UUID0}","model":"{V100}","memory":16276,"healthy":true}},'
        f'{{"index":1,"uuid":"{UUID1}","model":"{A100}","memory":40536,"healthy":true}}]}}',
    ),
    (
        "unhealthy GPU",
        "GiB",
        [InventoryGpu(0, UUID0, V100, 16, healthy=False)],
        f'{{"unit":"GiB","gpus":[{{"index":0,"uuid":"{UUID0}","model":"{V100}",'
        '"memory":16,"healthy":false}]}',
    ),
    ("no GPUs", "MiB", [], '{"unit":"MiB","gpus":[]}'),
]


@pytest.mark.parametrize(
    ("unit", "gpus", "expected"), [c[1:] for c in ENCODED], ids=[c[0] for c in ENCODED]
)
def test_encoder_output_is_exact(unit: str, gpus: list[InventoryGpu], expected: str) -> None:
    assert inventory_annotation(unit, gpus) == expected


def gpu(**fields: Any) -> InventoryGpu:
    """A V100 at index 0 with ``fields`` replaced (wrong types included, as a caller may pass)."""
    base: dict[str, Any] = {"index": 0, "uuid": UUID0, "model": V100, "memory": 16}
    return InventoryGpu(**(base | fields))


MEMORY = "GPU 0: memory must be an integer > 0, got"
INDEX = "GPU index must be an integer >= 0, got"
REJECTED: list[tuple[str, str, list[InventoryGpu], str]] = [
    ("unknown unit", "GB", [gpu()], "unit must be one of GiB, MiB, got 'GB'"),
    ("empty unit", "", [], "unit must be one of GiB, MiB, got ''"),
    ("zero memory", "GiB", [gpu(memory=0)], f"{MEMORY} 0"),
    (
        "negative memory",
        "GiB",
        [gpu(index=3, memory=-1)],
        "GPU 3: memory must be an integer > 0, got -1",
    ),
    ("fractional memory", "GiB", [gpu(memory=1.5)], f"{MEMORY} 1.5"),
    ("boolean memory", "GiB", [gpu(memory=True)], f"{MEMORY} True"),
    ("negative index", "GiB", [gpu(index=-1)], f"{INDEX} -1"),
    ("string index", "GiB", [gpu(index="0")], f"{INDEX} '0'"),
    (
        "repeated index",
        "GiB",
        [gpu(), gpu(index=1), gpu(index=1, uuid=UUID1)],
        r"GPU indices must be distinct, repeated: \[1\]",
    ),
    ("uuid not a string", "GiB", [gpu(uuid=None)], "GPU 0: uuid must be a string, got None"),
    ("model not a string", "GiB", [gpu(model=7)], "GPU 0: model must be a string, got 7"),
    (
        "health not a boolean",
        "GiB",
        [gpu(healthy="yes")],
        "GPU 0: healthy must be a boolean, got 'yes'",
    ),
    (
        "too many GPUs",
        "MiB",
        [gpu(index=i) for i in range(1025)],
        "at most 1024 GPUs per node, got 1025",
    ),
]


@pytest.mark.parametrize(
    ("unit", "gpus", "message"), [c[1:] for c in REJECTED], ids=[c[0] for c in REJECTED]
)
def test_bad_inputs_are_rejected_with_the_value(
    unit: str, gpus: list[InventoryGpu], message: str
) -> None:
    with pytest.raises(ValueError, match=f"^{message}$"):
        inventory_annotation(unit, gpus)


def node_with(annotation: str, *, labelled: bool = True) -> dict[str, Any]:
    labels = {GPUSHARE_LABEL: "true"} if labelled else {}
    return {"metadata": {"name": "n1", "labels": labels, "annotations": {INVENTORY: annotation}}}


ROUND_TRIPS = [
    ("2 x 16 GiB", "GiB", [InventoryGpu(0, UUID0, V100, 16), InventoryGpu(1, UUID1, V100, 16)]),
    (
        "heterogeneous MiB, unhealthy second",
        "MiB",
        [InventoryGpu(1, UUID1, A100, 40536, healthy=False), InventoryGpu(0, UUID0, V100, 16276)],
    ),
    ("unknown uuid", "GiB", [InventoryGpu(0, "", V100, 16)]),
    ("sparse indices", "GiB", [InventoryGpu(2, UUID0, V100, 16), InventoryGpu(5, UUID1, A100, 40)]),
]


@pytest.mark.parametrize(
    ("unit", "gpus"), [c[1:] for c in ROUND_TRIPS], ids=[c[0] for c in ROUND_TRIPS]
)
def test_round_trip_through_node_info(unit: str, gpus: list[InventoryGpu]) -> None:
    info = node_info(node_with(inventory_annotation(unit, gpus)))
    ordered = sorted(gpus, key=lambda g: g.index)
    assert info.node == Node(
        "n1", tuple(Gpu(g.index, g.model, g.memory, g.healthy) for g in ordered)
    )
    assert info.unit == unit
    assert info.source == "inventory"
    assert info.uuids == tuple(g.uuid for g in ordered)
    assert info.gpushare


def test_round_trip_without_gpus_is_not_a_gpushare_node_but_reads() -> None:
    info = node_info(node_with(inventory_annotation("GiB", [])))
    assert (info.node, info.unit, info.source, info.uuids) == (
        Node("n1", ()),
        "GiB",
        "inventory",
        (),
    )


def test_the_fakes_use_the_same_encoder() -> None:
    fakes = [FakeGpu(0, 16), FakeGpu(1, 40, A100, uuid=UUID1, healthy=False)]
    expected = inventory_annotation(
        "GiB", [fakes[0].inventory_gpu("n1"), InventoryGpu(1, UUID1, A100, 40, healthy=False)]
    )
    assert fake_inventory_annotation("n1", fakes, MemoryUnit.GIB) == expected
    node = gpu_node("n1", fakes)
    assert node.metadata is not None
    assert (node.metadata.annotations or {})[INVENTORY] == expected
    assert json.loads(expected)["gpus"][1] == fakes[1].to_json("n1")
    with pytest.raises(ValueError, match="unit must be one of GiB, MiB, got 'KiB'"):
        fake_inventory_annotation("n1", fakes, "KiB")  # type: ignore[arg-type]
