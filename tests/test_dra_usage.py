"""What the claims allocated on a node use of its GPUs, and the order its slice lists them in
(``gpushare.dra.usage``, ``gpushare.dra.nodeclaims.claim_names``, ``resource_slice``'s
``order``). The driver keeping kube-scheduler's first fit on best fit:
tests/cluster/test_dra_allocation.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.nodeclaims import claim_names
from gpushare.dra.slices import resource_slice
from gpushare.dra.usage import device_order, memory_used
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.dra import allocated_claim, result

GPUS = [PhysicalGpu(i, f"GPU-{i}", i, "Tesla-T4", 16384) for i in range(3)]


def used(*claims: dict[str, Any]) -> tuple[dict[int, int], list[str]]:
    return memory_used(claims, driver="gpu.gpushare.io", node="n1", gpus=GPUS,
                       unit=MemoryUnit.GIB)  # fmt: skip


@dataclass(frozen=True)
class Usage:
    id: str
    claims: list[dict[str, Any]]
    used: dict[int, int]
    errors: int = 0


USAGES = [
    Usage("two claims on one GPU add up", [
        allocated_claim([result("gpu-1", memory="4Gi")], name="a", uid="u-a"),
        allocated_claim([result("gpu-1", memory="8Gi")], name="b", uid="u-b")], {1: 12}),
    Usage("a claim of two GPUs counts on each", [allocated_claim(
        [result("gpu-0", memory="2Gi"), result("gpu-2", memory="2Gi", share_id="s2")])],
        {0: 2, 2: 2}),
    Usage("a whole GPU recorded without memory holds all of it",
          [allocated_claim([result("gpu-0", memory=None)])], {0: 16}),
    Usage("a claim not allocated yet counts nothing", [allocated_claim(None)], {}),
    Usage("another node's or driver's devices count nothing", [
        allocated_claim([result("gpu-0", driver="gpu.nvidia.com")], name="x", uid="u-x")], {}),
    Usage("a claim that cannot be read is left out, with its message", [
        allocated_claim([result("gpu-0", memory="4Gi")], name="a", uid="u-a"),
        allocated_claim([result("gpu-9", memory="4Gi")], name="bad", uid="u-bad")],
        {0: 4}, errors=1),
]  # fmt: skip


@pytest.mark.parametrize("case", USAGES, ids=[c.id for c in USAGES])
def test_memory_used_adds_up_the_allocation_results_of_this_node(case: Usage) -> None:
    found, errors = used(*case.claims)
    assert found == case.used
    assert len(errors) == case.errors
    if errors:
        assert "gpu-9" in errors[0]
        assert "no such GPU on node n1" in errors[0]


ORDERS = [
    ("nothing used: by index", {}, [0, 1, 2]),
    ("least free first", {0: 2, 1: 10, 2: 6}, [1, 2, 0]),
    ("equal free: by index", {0: 4, 2: 4}, [0, 2, 1]),
    ("a full GPU first (it fits nothing, first fit passes it)", {2: 16, 0: 1}, [2, 0, 1]),
]


@pytest.mark.parametrize(
    ("in_use", "expected"), [o[1:] for o in ORDERS], ids=[o[0] for o in ORDERS]
)
def test_devices_are_listed_least_free_first(in_use: dict[int, int], expected: list[int]) -> None:
    assert device_order(GPUS, in_use, MemoryUnit.GIB) == expected


def test_an_unhealthy_gpu_counts_as_full() -> None:
    gpus = [GPUS[0], replace(GPUS[1], healthy=False), GPUS[2]]
    assert device_order(gpus, {0: 8}, MemoryUnit.GIB) == [1, 0, 2]


def test_the_slice_lists_its_devices_in_the_order_given() -> None:
    body = resource_slice("n1", GPUS, unit=MemoryUnit.GIB, generation=1, order=[2, 0, 1])
    assert [d["name"] for d in body["spec"]["devices"]] == ["gpu-2", "gpu-0", "gpu-1"]
    default = resource_slice("n1", GPUS[::-1], unit=MemoryUnit.GIB, generation=1)
    assert [d["name"] for d in default["spec"]["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]


@pytest.mark.parametrize("order", [[0, 1], [0, 1, 1], [0, 1, 5]], ids=["short", "twice", "unknown"])
def test_an_order_that_is_not_each_gpu_once_is_refused(order: list[int]) -> None:
    with pytest.raises(ValueError, match="not each of the GPU indices"):
        resource_slice("n1", GPUS, unit=MemoryUnit.GIB, generation=1, order=order)


def pod(**fields: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "p"}} | fields


NAMES = [
    ("a claim the spec names", pod(spec={"resourceClaims": [
        {"name": "gpu", "resourceClaimName": "shared"}]}), {("ns", "shared")}),
    ("claims made from templates, in the status", pod(
        spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        status={"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}),
        {("ns", "p-gpu-x")}),
    ("a template's claim not made yet", pod(
        spec={"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}), set()),
    ("a finished pod holds none", pod(
        spec={"resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}]},
        status={"phase": "Succeeded"}), set()),
    ("malformed entries are passed over", pod(
        spec={"resourceClaims": ["x", {"resourceClaimName": 7}]},
        status={"resourceClaimStatuses": [None]}), set()),
]  # fmt: skip


@pytest.mark.parametrize(("body", "expected"), [n[1:] for n in NAMES], ids=[n[0] for n in NAMES])
def test_the_claims_a_pod_uses(body: dict[str, Any], expected: set[tuple[str, str]]) -> None:
    assert claim_names(body) == expected
