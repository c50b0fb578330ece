"""``kubectl inspect gpushare`` and the extender give the same verdict and the same reason for every
pending pod, the device-plugin handshake's pins included: both call
``gpushare.core.handshake.handshake_verdict``. Bound pods the extender's ledger skips but counts
(docs/extender.md, "Skipped pods": over a GPU's capacity, on a GPU index the node lacks, an
allocation that cannot be read) count in both, by ``gpushare.core.skipped``'s rule. Each case builds
one node (two 16 GiB GPUs) with bound pods as the watch feeds them, asks the extender's filter over
HTTP (its ASGI app) and builds the inspect report from the same objects, as the kubectl plugin reads
them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpushare.core.fit import Reason
from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.core.resolve import NOT_SERVED
from gpushare.core.serves import Serves
from gpushare.core.skipped import SkipKind
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.outcomes import skipped_note
from gpushare.inspect.report import Snapshot, build_report
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_IDX,
    ALIYUN_POD,
    CodecError,
    MemoryUnit,
    allocation_annotations,
)
from gpushare.kube.codec.common import EXCLUSIVE_ANNOTATION
from gpushare.testing.extender import node_json, pod_json, seed_bound_pods
from gpushare.testing.nodes import gpu_node

NODE = "n1"
NOW_NS = 1_800_000_000 * 10**9


def pin_holder(state: ExtenderState, *containers: tuple[int, tuple[int, ...]]) -> None:
    """Pod ``default/held`` bound to ``NODE`` by the extender 1 s ago and not started by the
    device plugin: it pins equal pods. ``containers``: (share, GPU indices) in spec order."""
    info = state.cluster.node(NODE)
    assert info is not None
    allocation = Allocation(
        "default/held",
        NODE,
        tuple(ContainerAllocation(f"c{i}", gpus, share) for i, (share, gpus) in
              enumerate(containers)),
    )  # fmt: skip
    notes = allocation_annotations(allocation, info.node, now_ns=NOW_NS - 10**9, unit=info.unit)
    asks = [share * len(gpus) for share, gpus in containers]
    pod = pod_json("held", asks if len(asks) > 1 else asks[0], node=NODE, annotations=notes)
    if len(asks) == 1:  # pod_json names a single container "main"
        pod["spec"]["containers"][0]["name"] = "c0"
    result = state.observe_pod(pod)
    assert result is not None
    assert not isinstance(result, Allocation)
    assert result.ok


Setup = Callable[[ExtenderState], None]


def holder(*containers: tuple[int, tuple[int, ...]]) -> Setup:
    return lambda state: pin_holder(state, *containers)


def used(*amounts: int) -> Setup:
    return lambda state: seed_bound_pods(state, NODE, amounts)


def over_capacity(name: str, amount: int, gpu: int) -> Setup:
    """A started pod bound to ``NODE`` holding ``amount`` GiB on GPU ``gpu`` (Alibaba's
    annotations) that does not fit there: the ledger skips it, the extender counts it anyway
    (``ExtenderState``, "Skipped pods"), and so does inspect (from the annotations)."""

    def run(state: ExtenderState) -> None:
        notes = {ALIYUN_ASSIGNED: "true", ALIYUN_IDX: str(gpu), ALIYUN_POD: str(amount)}
        state.observe_pod(pod_json(name, amount, node=NODE, annotations=notes))
        assert [s.pod for s in state.reservations.skipped(NODE)] == [f"default/{name}"]

    return run


def unknown_gpu(name: str, amount: int, gpu: int) -> Setup:
    """A started pod bound to ``NODE`` holding ``amount`` GiB on GPU index ``gpu``, which the
    node does not have: the extender charges it on every GPU of the node, and so does inspect
    (``gpushare.core.skipped``)."""

    def run(state: ExtenderState) -> None:
        notes = {ALIYUN_ASSIGNED: "true", ALIYUN_IDX: str(gpu), ALIYUN_POD: str(amount)}
        state.observe_pod(pod_json(name, amount, node=NODE, annotations=notes))
        assert [(s.pod, s.kind) for s in state.reservations.skipped(NODE)] == [
            (f"default/{name}", SkipKind.UNKNOWN_GPU)
        ]

    return run


def unreadable(name: str, amount: int, **annotations: str) -> Setup:
    """A pod bound to ``NODE`` whose allocation cannot be read (``annotations``): which GPU
    it holds and how much are unknown, so it blocks the whole node, in both."""

    def run(state: ExtenderState) -> None:
        with pytest.raises(CodecError):
            state.observe_pod(pod_json(name, amount, node=NODE, annotations=annotations))
        assert [(s.pod, s.kind) for s in state.reservations.skipped(NODE)] == [
            (f"default/{name}", SkipKind.UNREADABLE)
        ]

    return run


def steps(*setups: Setup) -> Setup:
    def run(state: ExtenderState) -> None:
        for setup in setups:
            setup(state)

    return run


@dataclass(frozen=True)
class Case:
    id: str
    setup: Callable[[ExtenderState], None]
    asks: int
    status: str  # "fits", "does-not-fit-now", "can-never-fit"
    reason: Reason


CASES = [
    Case("fits on an idle node", steps(), 4, "fits", Reason.FITS),
    Case("a full node says no GPU has enough free",
         used(16, 14), 4, "does-not-fit-now",
         Reason.INSUFFICIENT_GPU),
    Case("larger than any GPU can never fit", steps(), 20, "can-never-fit",
         Reason.SHARE_EXCEEDS_GPU),
    Case("pinned to the equal pending pod's GPU, which has room",
         holder((4, (0,))), 4, "fits", Reason.FITS),
    Case("pinned GPU full while another has room: the handshake holds it",
         steps(holder((4, (0,))), used(12, 0)), 4,
         "does-not-fit-now", Reason.HANDSHAKE),
    Case("pinned pod on a node simply full is told the node is full",
         steps(holder((4, (0,))), used(12, 14)), 4,
         "does-not-fit-now", Reason.INSUFFICIENT_GPU),
    Case("an equal first container with a different shape waits",
         holder((4, (0,)), (2, (1,))), 4, "does-not-fit-now",
         Reason.HANDSHAKE),
    Case("a skipped pod over capacity counts: the other GPU takes the pod",
         steps(used(14, 0), over_capacity("big", 8, 0)), 4, "fits", Reason.FITS),
    Case("a skipped pod over capacity counts: the node is full",
         steps(used(14, 10), over_capacity("big", 8, 1)), 4, "does-not-fit-now",
         Reason.INSUFFICIENT_GPU),
    Case("a skipped pod over capacity fills the pinned GPU: the handshake holds it",
         steps(holder((4, (0,))), used(10, 0), over_capacity("big", 8, 0)), 4,
         "does-not-fit-now", Reason.HANDSHAKE),
    Case("a pod on a GPU index the node lacks counts on every GPU: the node is full",
         steps(used(10, 10), unknown_gpu("ghost", 4, 7)), 4, "does-not-fit-now",
         Reason.INSUFFICIENT_GPU),
    Case("a pod on a GPU index the node lacks counts on every GPU: a smaller pod fits",
         steps(used(10, 12), unknown_gpu("ghost", 4, 7)), 2, "fits", Reason.FITS),
    Case("a pod on a GPU index the node lacks fills the pinned GPU: the handshake holds it",
         steps(holder((4, (0,))), used(4, 0), unknown_gpu("ghost", 6, 7)), 4,
         "does-not-fit-now", Reason.HANDSHAKE),
    Case("a pod whose allocation annotation cannot be read blocks the whole node",
         unreadable("garbled", 4, **{ALIYUN_IDX: "0", ALIYUN_POD: "four"}), 4,
         "does-not-fit-now", Reason.INSUFFICIENT_GPU),
    Case("a pod whose allocation names a negative amount blocks the whole node",
         steps(used(2, 0), unreadable("negative", 4, **{ALIYUN_IDX: "1", ALIYUN_POD: "-4"})),
         1, "does-not-fit-now", Reason.INSUFFICIENT_GPU),
]  # fmt: skip


def filter_reason(state: ExtenderState, asks: int) -> tuple[str, str, str]:
    """(status, text, ``Error``) of the extender's filter of a pod asking ``asks`` GiB on
    ``NODE``."""
    app = create_app(state, expire_interval_s=None, clock_ns=lambda: NOW_NS)
    body: dict[str, Any] = {"Pod": pod_json("new", asks), "NodeNames": [NODE], "Nodes": None}
    with TestClient(app) as client:
        result = client.post("/gpushare-scheduler/filter", json=body).json()
    error: str = result["Error"]
    if NODE in (result.get("NodeNames") or []):
        return "fits", "", error
    if NODE in (result.get("FailedNodes") or {}):
        return "does-not-fit-now", result["FailedNodes"][NODE], error
    return "can-never-fit", result["FailedAndUnresolvableNodes"][NODE], error


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_inspect_and_the_extender_agree(case: Case) -> None:
    state = ExtenderState(wall_clock_ns=lambda: NOW_NS)
    state.upsert_node(node_json(NODE, [16, 16], unit=MemoryUnit.GIB))
    case.setup(state)
    state.cluster.mark_synced()

    status, text, error = filter_reason(state, case.asks)
    nodes, pods = state.cluster.objects()
    pods = tuple(p for p in pods if p["metadata"]["name"] != "new")  # the filter's copy
    report = build_report(Snapshot(nodes, (*pods, pod_json("new", case.asks))))
    (pending,) = report.pending
    (fit,) = pending.nodes

    assert (status, fit.status) == (case.status, case.status)
    assert fit.reason == str(case.reason)
    # Held by the rule on the only node: an Error too, so kube-scheduler retries with backoff.
    held = case.reason is Reason.HANDSHAKE
    assert error == (f"gpushare: held by the handshake rule, retrying with backoff: {NODE}: {text}"
                     if held else "")  # fmt: skip
    if status != "fits":
        assert text.startswith(f"gpushare: {case.reason}")
        assert fit.fit is not None
        # The extender adds what it counts beyond its ledger (skipped pods), when any.
        assert text == f"gpushare: {fit.fit.describe()}; unit GiB{skipped_note(state, NODE)}"


SERVES_CASES = [
    ("a whole-GPU node refuses a shared pod", Serves.WHOLE, {}),
    ("a shared node refuses a whole-GPU pod", Serves.SHARED, {EXCLUSIVE_ANNOTATION: "true"}),
]


@pytest.mark.parametrize(
    ("serves", "annotations"), [c[1:] for c in SERVES_CASES], ids=[c[0] for c in SERVES_CASES]
)
def test_inspect_and_the_extender_refuse_a_kind_the_node_does_not_serve(
    serves: Serves, annotations: dict[str, str]
) -> None:
    """Per-node ``serves`` (docs/node-config.md): the filter refuses the pod for good, and the
    inspect report gives the same sentence (``gpushare.core.serves.serves_refusal``)."""
    state = ExtenderState(wall_clock_ns=lambda: NOW_NS)
    node = gpu_node(NODE, [16, 16], serves=serves).to_dict()
    state.upsert_node(node)
    state.cluster.mark_synced()
    pod = pod_json("new", 16, annotations=annotations)
    app = create_app(state, expire_interval_s=None, clock_ns=lambda: NOW_NS)
    body: dict[str, Any] = {"Pod": pod, "NodeNames": [NODE], "Nodes": None}
    with TestClient(app) as client:
        result = client.post("/gpushare-scheduler/filter", json=body).json()
    text = result["FailedAndUnresolvableNodes"][NODE]

    (pending,) = build_report(Snapshot((node,), (pod,))).pending
    (fit,) = pending.nodes
    assert fit.status == "can-never-fit"
    assert fit.reason == NOT_SERVED
    assert text == f"gpushare: {fit.refusal}"
    assert f"serves={serves}" in fit.text
