"""Bound pods the ledger cannot record still count (docs/extender.md, "Skipped pods").

A pod bound to a node holds *something* there: the extender never takes its GPU as free on a
guess. Table: each impossible allocation a bound pod can carry, fed through the real feeder, and
what the pod is then counted as (``gpushare.extender.state``, "Skipped pods"). Then the five
problems together on one node through the app: ``/inspect`` (violations, skipped), ``/metrics``,
filter's reason with the numbers, and agreement with ``gpushare inspect``'s problem list.
"""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from gpushare.core.skipped import SkipKind
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.feed import StateFeeder
from gpushare.kube.codec import ALIYUN_ASSIGNED, ALIYUN_IDX, ALIYUN_POD, MemoryUnit
from gpushare.kube.watch import Action, Change
from gpushare.testing.extender import node_json, pod_json

GPU = 40  # GiB
NODE = "n"
PREFIX = "/gpushare-scheduler"


def placed(name: str, amount: int, annotations: dict[str, str]) -> dict[str, Any]:
    """A pod asking ``amount`` GiB, bound to NODE, carrying Alibaba's ``annotations``."""
    notes = {ALIYUN_ASSIGNED: "true", **annotations}
    return pod_json(name, amount, node=NODE, annotations=notes, uid=f"uid-{name}")


def on(index: int | str, amount: int | str) -> dict[str, str]:
    return {ALIYUN_IDX: str(index), ALIYUN_POD: str(amount)}


def feeder_with(*pods: dict[str, Any]) -> StateFeeder:
    feeder = StateFeeder(ExtenderState())
    feeder.on_node(
        Change("Node", Action.UPSERT, NODE, node_json(NODE, [GPU, GPU], unit=MemoryUnit.GIB))
    )
    for pod in pods:
        key = f"default/{pod['metadata']['name']}"
        feeder.on_pod(Change("Pod", Action.UPSERT, key, pod))
    feeder.state.cluster.mark_synced()
    return feeder


A8 = placed("a", 8, on(0, 8))  # a pod the ledger records: 8 GiB on GPU 0
CASES = [
    # name, the skipped pod, kind, charged (index, units), whole node, free per GPU after
    ("index 7 on a 2-GPU node", placed("idx7", 4, on(7, 4)), SkipKind.UNKNOWN_GPU,
     ((0, 4), (1, 4)), False, (28, 36)),
    ("negative ALIYUN_COM_GPU_MEM_POD", placed("neg", 4, on(1, -4)), SkipKind.UNREADABLE,
     (), True, (-8, 0)),
    ("unparsable ALIYUN_COM_GPU_MEM_POD", placed("nan", 4, on(1, "lots")), SkipKind.UNREADABLE,
     (), True, (-8, 0)),
    ("50 GiB on a 40 GiB GPU", placed("big", 50, on(0, 50)), SkipKind.OVER_CAPACITY,
     ((0, 50),), False, (-18, 40)),
    ("a GPU already full", placed("full", 36, on(0, 36)), SkipKind.OVER_CAPACITY,
     ((0, 36),), False, (-4, 40)),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_a_skipped_bound_pod_is_counted_conservatively(
    case: tuple[str, dict[str, Any], SkipKind, tuple[tuple[int, int], ...], bool, tuple[int, int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    _, pod, kind, charges, whole_node, free = case
    feeder = feeder_with(A8, pod)
    state = feeder.state
    (skipped,) = state.reservations.skipped()
    assert (skipped.pod, skipped.node, skipped.kind) == (f"default/{pod['metadata']['name']}",
                                                         NODE, kind)  # fmt: skip
    assert (skipped.charges, skipped.whole_node) == (charges, whole_node)
    assert state.reservations.ledger_state(NODE).gpu_free == (
        32,
        40,
    )  # the ledger holds only what it can
    node_state = state.schedulable_state(NODE)
    assert node_state is not None
    assert node_state.gpu_free == free
    assert feeder.errors == 1
    (line,) = [r.getMessage() for r in caplog.records if r.name.startswith("gpushare")]
    assert line.startswith("GPU pod skipped by the ledger, counted conservatively: pod default/")
    assert state.reservations.drain_new_skips() == []  # reported once


def test_skipped_pods_leave_when_they_go_or_fit() -> None:
    full = placed("full", 36, on(0, 36))
    feeder = feeder_with(A8, full)
    assert [s.pod for s in feeder.state.reservations.skipped()] == ["default/full"]
    # a goes: the full pod now fits the ledger, and is no longer skipped
    feeder.on_pod(Change("Pod", Action.DELETE, "default/a", A8, A8))
    assert feeder.state.reservations.skipped() == []
    assert feeder.state.reservations.ledger_state(NODE).gpu_free == (4, 40)
    # an unreadable pod that finishes unblocks the node
    nan = placed("nan", 4, on(1, "lots"))
    feeder.on_pod(Change("Pod", Action.UPSERT, "default/nan", nan))
    node_state = feeder.state.schedulable_state(NODE)
    assert node_state is not None
    assert node_state.gpu_free == (4 - GPU, 0)
    done = {**nan, "status": {"phase": "Succeeded"}}
    feeder.on_pod(Change("Pod", Action.UPSERT, "default/nan", done, nan))
    assert feeder.state.reservations.skipped() == []
    node_state = feeder.state.schedulable_state(NODE)
    assert node_state is not None
    assert node_state.gpu_free == (4, 40)


ISSUE_PODS = [A8] + [case[1] for case in CASES if case[0] != "a GPU already full"]


def test_the_five_skipped_pods_show_in_inspect_metrics_and_filter() -> None:
    feeder = feeder_with(*ISSUE_PODS)
    state = feeder.state
    app = create_app(state, expire_interval_s=None)
    ask = pod_json("new", 8, uid="uid-new")
    with TestClient(app) as client:
        report = client.get(f"{PREFIX}/inspect").json()
        metrics = client.get("/metrics").text
        result = client.post(f"{PREFIX}/filter", json={"Pod": ask, "NodeNames": [NODE]}).json()
    # /inspect: what was skipped, and the violations it causes
    assert {s["pod"]: s["kind"] for s in report["skipped"]} == {
        "default/idx7": str(SkipKind.UNKNOWN_GPU),
        "default/neg": str(SkipKind.UNREADABLE),
        "default/nan": str(SkipKind.UNREADABLE),
        "default/big": str(SkipKind.OVER_CAPACITY),
    }
    assert [(v["kind"], v["gpu"], v["used"], v["capacity"], v["pods"])
            for v in report["violations"]] == [
        ("GPU used above its capacity", 0, 58, GPU, ["default/a", "default/big"]),
        ("allocation names a GPU the node does not have", 7, 4, 0, ["default/idx7"]),
        ("allocation cannot be read", None, 0, 0, ["default/nan"]),
        ("allocation cannot be read", None, 0, 0, ["default/neg"]),
    ]  # fmt: skip
    (node,) = report["nodes"]
    assert node["blocked"] == ["default/nan", "default/neg"]
    assert [dev["usedGPU"] for dev in node["devs"]] == [62, 4]
    # gpushare inspect, built from the same objects, counts with the same ledger: the same
    # pods skipped, each with the same line (what it is counted as included)
    problems = report["gpushare"]["problems"]
    assert sorted(problems) == sorted(s["text"] for s in report["skipped"])
    # /metrics
    assert (
        'gpushare_extender_skipped_pods{kind="allocation cannot be read",node="n"} 2.0' in metrics
    )
    assert (
        'gpushare_extender_skipped_pods_recorded_total{kind="allocation does not fit the GPU"} 1.0'
        in metrics
    )
    # filter: the node takes nothing, and says why with the numbers
    assert result["NodeNames"] == []
    reason = result["FailedNodes"][NODE]
    assert reason.startswith("gpushare: no GPU has enough free; container main; requested 8; ")
    # charged above capacity: the GPUs read 0 free, never less; the
    # skipped pods' lines say what is charged
    assert "free/capacity per GPU 0/40, 0/40" in reason
    assert "pod default/neg on node n: allocation cannot be read" in reason
    assert "pod default/big on node n: allocation does not fit the GPU" in reason


def test_units_on_a_gpu_the_node_lost_count_on_every_gpu() -> None:
    """A node that shrinks under a recorded allocation: the ledger keeps the units on the GPU
    index it no longer has (``Ledger.units_off_node``) and the extender charges them on every
    GPU, as it charges a skipped pod on a missing index."""
    feeder = feeder_with(A8, placed("b", 4, on(1, 4)))
    feeder.on_node(Change("Node", Action.UPSERT, NODE, node_json(NODE, [GPU], unit=MemoryUnit.GIB)))
    state = feeder.state
    assert state.reservations.skipped() == []  # recorded before the node shrank: not skipped
    assert state.reservations.ledger_state(NODE).gpu_free == (GPU - 8,)
    node_state = state.schedulable_state(NODE)
    assert node_state is not None
    assert node_state.gpu_free == (GPU - 8 - 4,)


def test_skipped_pods_count_on_their_own_node_only() -> None:
    feeder = feeder_with(A8, placed("idx7", 4, on(7, 4)))
    feeder.on_node(Change("Node", Action.UPSERT, "m", node_json("m", [GPU], unit=MemoryUnit.GIB)))
    odd = pod_json("odd", 4, node="m", annotations={ALIYUN_ASSIGNED: "true", **on(0, "x")},
                   uid="uid-odd")  # fmt: skip
    feeder.on_pod(Change("Pod", Action.UPSERT, "default/odd", odd))
    state = feeder.state
    assert [s.pod for s in state.reservations.skipped()] == ["default/idx7", "default/odd"]
    assert [s.pod for s in state.reservations.skipped(NODE)] == ["default/idx7"]
    assert [s.pod for s in state.reservations.skipped("m")] == ["default/odd"]
    assert state.reservations.skipped("nowhere") == []
    feeder.on_pod(Change("Pod", Action.DELETE, "default/odd", odd, odd))
    assert state.reservations.skipped("m") == []
    m_state, n_state = state.schedulable_state("m"), state.schedulable_state(NODE)
    assert m_state is not None
    assert n_state is not None
    assert (m_state.gpu_free, n_state.gpu_free) == ((GPU,), (28, 36))
