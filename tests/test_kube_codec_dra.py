"""gpushare's DRA objects read into core values (``gpushare.kube.codec.dra``): a slice's GPUs, a
node's state from the claims on it, and what a pod's claims ask. The extender scoring claim
pods with them on the real scheduler: tests/cluster/test_dra_scoring.py."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import pytest

from gpushare.core.fit import FitStatus, check_fit
from gpushare.core.model import ContainerRequest
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import resource_slice
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import (
    ClaimAsk,
    SliceError,
    claim_asks,
    claim_pod_request,
    node_state,
    slice_node,
)
from gpushare.testing.dra import allocated_claim, result

GPUS = [
    PhysicalGpu(0, "GPU-a", 0, "Tesla-T4", 16384),
    PhysicalGpu(1, "GPU-b", 1, "Tesla-T4", 16384, healthy=False),
    PhysicalGpu(2, "GPU-c", 2, "A100", 40960),
]
GIB = 1024 * 1024 * 1024


def test_a_slice_reads_back_into_the_gpus_the_driver_published() -> None:
    node, unit = slice_node(resource_slice("n1", GPUS, unit=MemoryUnit.GIB, generation=3,
                                           order=[2, 0, 1]))  # fmt: skip
    assert unit is MemoryUnit.GIB
    assert node.name == "n1"
    assert [(g.index, g.model, g.capacity, g.healthy) for g in node.gpus] == [
        (0, "Tesla-T4", 16, True), (1, "Tesla-T4", 16, False), (2, "A100", 40, True),
    ]  # fmt: skip
    _, mib = slice_node(resource_slice("n1", GPUS[:1], unit=MemoryUnit.MIB, generation=1))
    assert mib is MemoryUnit.MIB


def broken(path: str, value: object) -> dict[str, Any]:
    body = resource_slice("n1", GPUS[:1], unit=MemoryUnit.GIB, generation=1)
    device = body["spec"]["devices"][0]
    *parents, last = path.split(".")
    target = device
    for part in parents:
        target = target[part]
    target[last] = value
    return body


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(broken("attributes.index", {}), "attribute index (int) missing",
                     id="no index"),
        pytest.param(broken("capacity.memory.value", "lots"), "capacity.memory",
                     id="memory not a quantity"),
        pytest.param(broken("capacity.memory.value", "1536Mi"), "whole GiB",
                     id="memory not whole units"),
    ],
)  # fmt: skip
def test_a_slice_gpushare_did_not_write_is_refused_naming_the_field(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(SliceError, match=re.escape(message)):
        slice_node(body)


def test_a_nodes_state_adds_up_the_claims_allocated_on_it() -> None:
    node, unit = slice_node(resource_slice("n1", GPUS, unit=MemoryUnit.GIB, generation=1))
    claims = [
        allocated_claim([result("gpu-0", memory="4Gi")], name="a", uid="u-a"),
        allocated_claim([result("gpu-0", memory="8Gi")], name="b", uid="u-b"),
        allocated_claim([result("gpu-2", memory=None)], name="whole", uid="u-w"),
        allocated_claim([result("gpu-9", memory="1Gi")], name="bad", uid="u-x"),
    ]
    state, errors = node_state(node, unit, claims, driver="gpu.gpushare.io")
    assert state.gpu_used == (12, 0, 40)
    assert len(errors) == 1
    assert "device='gpu-9': no such GPU on node n1" in errors[0]


def pod(*entries: dict[str, str], statuses: list[dict[str, str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"namespace": "ns", "name": "p"},
                            "spec": {"resourceClaims": list(entries)}}  # fmt: skip
    if statuses is not None:
        body["status"] = {"resourceClaimStatuses": statuses}
    return body


def claim(name: str, *requests: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": name},
            "spec": {"devices": {"requests": list(requests)}}}  # fmt: skip


def exactly(device_class: str = "gpushare-gpu", **fields: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": device_class, **fields}}


@dataclass(frozen=True)
class Asks:
    id: str
    pod: dict[str, Any]
    claims: dict[tuple[str, str], dict[str, Any]]
    asks: list[ClaimAsk] | None


ASKS = [
    Asks("a claim named in the spec: its memory on one GPU",
         pod({"name": "gpu", "resourceClaimName": "c"}),
         {("ns", "c"): claim("c", exactly(capacity={"requests": {"memory": "3500Mi"}}))},
         [ClaimAsk("c/gpu", 1, Fraction(3500 * 1024 * 1024))]),
    Asks("a claim made from a template, named in the status; two GPUs",
         pod({"name": "gpu", "resourceClaimTemplateName": "t"},
             statuses=[{"name": "gpu", "resourceClaimName": "p-gpu-1"}]),
         {("ns", "p-gpu-1"): claim("p-gpu-1", exactly(count=2, capacity={
             "requests": {"memory": "8Gi"}}))},
         [ClaimAsk("p-gpu-1/gpu", 2, Fraction(8 * GIB))]),
    Asks("no memory asked: the whole GPU", pod({"name": "gpu", "resourceClaimName": "c"}),
         {("ns", "c"): claim("c", exactly(capacity={"requests": {"cores": "100"}}))},
         [ClaimAsk("c/gpu", 1, None)]),
    Asks("another class is not gpushare's", pod({"name": "gpu", "resourceClaimName": "c"}),
         {("ns", "c"): claim("c", exactly("gpu.nvidia.com"))}, []),
    Asks("a claim not known yet: not scored", pod({"name": "gpu", "resourceClaimName": "c"}),
         {}, None),
    Asks("a template's claim not made yet: not scored",
         pod({"name": "gpu", "resourceClaimTemplateName": "t"}), {}, None),
]  # fmt: skip


@pytest.mark.parametrize("case", ASKS, ids=[c.id for c in ASKS])
def test_what_a_pods_claims_ask_of_gpushares_class(case: Asks) -> None:
    assert claim_asks(case.pod, case.claims, "gpushare-gpu") == case.asks


def test_the_request_rounds_memory_up_to_the_nodes_unit_and_fits_as_the_allocator_would() -> None:
    asks = [ClaimAsk("c/gpu", 1, Fraction(3500 * 1024 * 1024))]
    (container,) = claim_pod_request("ns/p", asks, MemoryUnit.GIB).containers
    assert container == ContainerRequest("c/gpu", 4, 1)  # 3500Mi: 4Gi, as the slice's step
    (on_mib,) = claim_pod_request("ns/p", asks, MemoryUnit.MIB).containers
    assert on_mib.gpu_share == 3500
    whole = claim_pod_request("ns/p", [ClaimAsk("w/gpu", 2, None)], MemoryUnit.GIB)
    assert whole.containers[0] == ContainerRequest("w/gpu", 0, 2, exclusive=True)
    node, unit = slice_node(resource_slice("n1", [GPUS[0], GPUS[2]], unit=MemoryUnit.GIB,
                                           generation=1))  # fmt: skip
    state, _ = node_state(node, unit, [], driver="gpu.gpushare.io")
    assert check_fit(state, whole).status is FitStatus.FITS
    used = dataclasses.replace(state, gpu_used=(1, 0))
    assert check_fit(used, whole).status is not FitStatus.FITS
