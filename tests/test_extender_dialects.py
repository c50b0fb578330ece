"""Pods in gpu-manager's, HAMi's and Alibaba's cloud's dialects through the extender's filter
and bind (ASGI app, real HTTP shapes): memory resolved per node, compute and whole GPUs placed,
recorded in ``gpushare.io/allocation``, rebuilt by a restarted extender; a request its own
system refuses is refused at filter with that rule (an answer, not a 500). docs/compute.md."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpushare.extender import ExtenderState, create_app
from gpushare.kube.codec import ALLOCATION, MemoryUnit
from gpushare.testing.dialects import (
    dialect_pod_json,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.dialects import table_pod as _pod
from gpushare.testing.extender import (
    RecordingBinder,
    RecordingEvents,
    alibaba_node_json,
    node_json,
    pod_json,
    seed_bound_pods,
)
from gpushare.testing.nodes import fake_gpu_uuid

PREFIX = "/gpushare-scheduler"
GIB, MIB = MemoryUnit.GIB, MemoryUnit.MIB


@dataclass(frozen=True)
class Node:
    name: str
    capacities: list[int]
    unit: MemoryUnit = GIB
    used: list[int] = field(default_factory=list)


def state_of(*nodes: Node) -> ExtenderState:
    state = ExtenderState()
    for node in nodes:
        state.upsert_node(node_json(node.name, node.capacities, unit=node.unit))
        seed_bound_pods(state, node.name, node.used)
    state.cluster.mark_synced()
    return state


def filter_body(pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


def bind_body(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"],
            "PodUID": meta["uid"], "Node": node}  # fmt: skip


def schedule(
    client: TestClient, pod: dict[str, Any], names: list[str]
) -> tuple[dict[str, Any], str | None]:
    """Filter, then bind to the first node that passed (as kube-scheduler with one node
    passing): the filter answer and the bind error (``None``: no node passed)."""
    answer = client.post(f"{PREFIX}/filter", json=filter_body(pod, names))
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    if not result["NodeNames"]:
        return result, None
    bound = client.post(f"{PREFIX}/bind", json=bind_body(pod, result["NodeNames"][0]))
    assert bound.status_code == 200
    error: str = bound.json()["Error"]
    return result, error


@dataclass(frozen=True)
class Placed:
    id: str
    node: Node
    pod: dict[str, Any]
    containers: list[dict[str, Any]]
    event: str  # in the Scheduled event's message


PLACED = [
    Placed("gpu-manager README pod 1 on a GiB node: 7,680 MiB is 8 GiB, with 500 compute",
           Node("g", [16, 16], used=[12]), gpu_manager_readme_pod_1("p", "ns"),
           [{"name": "nvidia", "gpus": [1], "share": 8, "compute": 500}],
           "container nvidia on GPU 1 (8 GiB, 50% compute each)"),
    Placed("gpu-manager README pod 2 takes two GPUs that hold nothing, whole",
           Node("g", [16, 16, 16], used=[0, 4]), gpu_manager_readme_pod_2("p", "ns"),
           [{"name": "nvidia", "gpus": [0, 2], "share": 16, "compute": 1000, "whole": True}],
           "container nvidia on GPU 0,2 (whole)"),
    Placed("the fork's MiB on a MiB node, as written",
           Node("m", [16384], MIB),
           _pod({"main": {"nvidia.com/vcuda-core": 25, "nvidia.com/vcuda-memory": 4097}}),
           [{"name": "main", "gpus": [0], "share": 4097, "compute": 250}],
           "container main on GPU 0 (4097 MiB, 25% compute each)"),
    Placed("HAMi: two GPUs of 3,000 MiB and 30 %, rounded up to 3 GiB each",
           Node("g", [16, 16]),
           _pod({"main": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000,
                          "nvidia.com/gpucores": 30}}),
           [{"name": "main", "gpus": [0, 1], "share": 3, "compute": 300}],
           "container main on GPU 0,1 (3 GiB, 30% compute each)"),
    Placed("HAMi: nvidia.com/gpu alone takes all the memory of a GPU",
           Node("g", [16, 16], used=[1]), _pod({"main": {"nvidia.com/gpu": 1}}),
           [{"name": "main", "gpus": [1], "share": 16}], "container main on GPU 1 (16 GiB each)"),
    Placed("HAMi: a quarter of the GPU's memory",
           Node("g", [16, 16], used=[1]),
           _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25}}),
           [{"name": "main", "gpus": [0], "share": 4}], "container main on GPU 0 (4 GiB each)"),
    Placed("HAMi: gpucores 100 is a whole GPU",
           Node("g", [16, 16], used=[1]),
           _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}}),
           [{"name": "main", "gpus": [1], "share": 16, "compute": 1000, "whole": True}],
           "container main on GPU 1 (whole)"),
    Placed("Alibaba's cloud: gpu-core.percentage next to gpu-mem",
           Node("g", [16, 16], used=[1]),
           _pod({"main": {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 50}}),
           [{"name": "main", "gpus": [0], "share": 4, "compute": 500}],
           "container main on GPU 0 (4 GiB, 50% compute each)"),
    Placed("HAMi's nvidia.com/use-gpuuuid: the GPU named, not the fuller one binpack prefers",
           Node("g", [16, 16, 16], used=[4]),
           _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048}},
                annotations={"nvidia.com/use-gpuuuid": fake_gpu_uuid("g", 2)}),
           [{"name": "main", "gpus": [2], "share": 2}], "container main on GPU 2 (2 GiB each)"),
    Placed("gpushare.io/exclusive: an Alibaba pod takes a whole GPU",
           Node("g", [16, 16], used=[1]),
           _pod({"main": {"aliyun.com/gpu-mem": 16}},
                annotations={"gpushare.io/exclusive": "true"}),
           [{"name": "main", "gpus": [1], "share": 16, "compute": 1000, "whole": True}],
           "container main on GPU 1 (whole)"),
]  # fmt: skip


@pytest.mark.parametrize("case", PLACED, ids=[c.id for c in PLACED])
def test_a_dialect_pod_is_placed_recorded_and_rebuilt(case: Placed) -> None:
    state, binder, events = state_of(case.node), RecordingBinder(), RecordingEvents()
    app = create_app(state, policy="binpack", binder=binder, events=events, expire_interval_s=None)
    with TestClient(app) as client:
        result, error = schedule(client, case.pod, [case.node.name])
        assert result["NodeNames"] == [case.node.name], result
        assert error == ""
    (call,) = binder.calls
    document = json.loads(call.annotations[ALLOCATION])
    assert document["containers"] == case.containers
    (event,) = events.events
    assert event.ok
    assert case.event in event.message
    # A restarted extender reads the bound pod back into the same ledger.
    bound = json.loads(json.dumps(case.pod))
    bound["metadata"].setdefault("annotations", {}).update(call.annotations)
    bound["spec"]["nodeName"] = case.node.name
    rebuilt = state_of(case.node)
    result_of_rebuild = rebuilt.observe_pod(bound)
    assert result_of_rebuild is not None
    assert getattr(result_of_rebuild, "ok", False)
    assert rebuilt.reservations.ledger_state(case.node.name) == state.reservations.ledger_state(
        case.node.name
    )


@dataclass(frozen=True)
class Refused:
    id: str
    nodes: list[Node]
    pod: dict[str, Any]
    failed: dict[str, str]
    unresolvable: dict[str, str]


REFUSED = [
    Refused("whole GPUs: every GPU holds something",
            [Node("g", [16, 16], used=[1, 1])], gpu_manager_readme_pod_2("p", "ns"),
            {"g": "gpushare: not enough GPUs that hold nothing for whole GPUs; container "
                  "nvidia; requested 2"}, {}),
    Refused("compute: no GPU has 600 free",
            [Node("g", [16])],
            _pod({"main": {"aliyun.com/gpu-mem": 1, "aliyun.com/gpu-core.percentage": 60}}),
            {}, {}),
    Refused("MiB on a node without the inventory annotation (unit unknown)",
            [], gpu_manager_readme_pod_1("p", "ns"), {},
            {"a": "gpushare: container nvidia asks GPU memory in MiB and the node's memory "
                  "unit is unknown (no gpushare.io/gpu-inventory annotation)"}),
    Refused("100 % of a GPU larger than any",
            [Node("g", [16, 16], used=[1, 1])], _pod({"main": {"nvidia.com/gpu": 1}}),
            {"g": "gpushare: no GPU has enough free; container main; requested 16"}, {}),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_a_dialect_pod_that_does_not_fit_gets_the_reason(case: Refused) -> None:
    state = state_of(*case.nodes)
    state.upsert_node(alibaba_node_json("a", 32, 2))
    if case.id.startswith("compute"):  # a pod holding 500 compute on the only GPU
        with TestClient(create_app(state, policy="binpack", binder=RecordingBinder())) as client:
            holder = _pod({"main": {"aliyun.com/gpu-mem": 1, "aliyun.com/gpu-core.percentage": 50}})
            holder["metadata"]["name"] = "holder"
            assert schedule(client, holder, ["g"])[1] == ""
    names = [n.name for n in case.nodes] or ["a"]
    with TestClient(create_app(state, policy="binpack", binder=RecordingBinder())) as client:
        result, error = schedule(client, case.pod, names)
    assert error is None
    assert result["NodeNames"] == []
    for name, reason in {**case.failed, **case.unresolvable}.items():
        kind = "FailedNodes" if name in case.failed else "FailedAndUnresolvableNodes"
        assert result[kind][name].startswith(reason), result
    if case.id.startswith("compute"):
        assert "no GPU has enough free compute; container main; requested 600" in str(result)


@pytest.mark.parametrize(
    ("pod", "rule"),
    [(_pod({"main": {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 4}}),
      "gpushare: pod ns/p container main: tencent.com/vcuda-core=150: above 100 only "
      "multiples of 100 (whole GPUs); accepted: tencent.com/vcuda-core 1-99 with "
      "tencent.com/vcuda-memory > 0, or 100, 200, ... (whole GPUs)"),
     (_pod({"a": {"aliyun.com/gpu-mem": 4},
            "b": {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 4}}),
      "GPU containers in two dialects; accepted: one dialect per pod"),
     (_pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 120}}),
      "nvidia.com/gpucores=120: above 100 %")],
    ids=["vcuda-core 150", "a mixed pod", "HAMi gpucores 120"],
)  # fmt: skip
def test_an_invalid_dialect_request_is_refused_at_filter_with_its_rule(
    pod: dict[str, Any], rule: str
) -> None:
    state = state_of(Node("g", [16, 16]))
    with TestClient(create_app(state, policy="binpack", binder=RecordingBinder())) as client:
        answer = client.post(f"{PREFIX}/filter", json=filter_body(pod, ["g"]))
    assert answer.status_code == 200
    result = answer.json()
    assert result["NodeNames"] == []
    assert rule in result["Error"]


def test_a_whole_gpu_counts_its_whole_memory_and_a_used_gpu_is_not_taken_whole() -> None:
    """A GPU held whole is recorded at its capacity, so memory alone turns shared pods away
    from it. (That nothing shared lands on a GPU held whole even with memory to spare, the
    flag rule, cannot be reached through a dialect: none yields a shared request of 0 memory;
    test_core_fit and test_core_ledger prove it.)"""
    state, binder = state_of(Node("g", [16, 16, 16])), RecordingBinder()
    with TestClient(
        create_app(state, policy="binpack", binder=binder, expire_interval_s=None)
    ) as client:
        shared = pod_json("shared", 1, namespace="ns")
        assert schedule(client, shared, ["g"])[1] == ""  # binpack: GPU 0
        # GPU 0 holds 1 GiB: the two whole GPUs are 1 and 2.
        assert schedule(client, gpu_manager_readme_pod_2("whole", "ns"), ["g"])[1] == ""
        assert state.reservations.ledger_state("g").gpu_whole == (False, True, True)
        assert state.reservations.ledger_state("g").gpu_used == (
            1,
            16,
            16,
        )  # whole: all their memory
        big = pod_json("big", 16, namespace="ns")  # fits no GPU: 15 free on 0, none on 1 and 2
        result, _ = schedule(client, big, ["g"])
        assert result["FailedNodes"]["g"].startswith("gpushare: no GPU has enough free")
        small = pod_json("small", 2, namespace="ns")  # GPU 0, the only one with memory free
        assert schedule(client, small, ["g"])[1] == ""
    small_call = binder.calls[-1]
    assert json.loads(small_call.annotations[ALLOCATION])["containers"][0]["gpus"] == [0]
    assert state.reservations.ledger_state("g").gpu_used == (3, 16, 16)


def test_inspect_shows_compute_and_whole_gpus_next_to_memory() -> None:
    state = state_of(Node("g", [16, 16, 16], used=[4]))
    with TestClient(
        create_app(state, policy="binpack", binder=RecordingBinder(), expire_interval_s=None)
    ) as client:
        assert schedule(client, gpu_manager_readme_pod_1("share", "ns"), ["g"])[1] == ""
        assert schedule(client, gpu_manager_readme_pod_2("whole", "ns"), ["g"])[1] == ""
        report = client.get(f"{PREFIX}/inspect/g").json()
    devs = [(d["usedGPU"], d["compute"], d["whole"]) for d in report["devs"]]
    assert devs == [(12, 500, False), (16, 1000, True), (16, 1000, True)]
    pods = {p["name"]: (p.get("compute"), p.get("whole")) for p in report["devs"][0]["pods"]}
    assert pods == {"seed-g-0": (None, None), "share": (500, None)}
    gpus = report["gpushare"]["nodes"][0]["gpus"]
    assert [(g["compute_milli"], g["whole"]) for g in gpus] == [(500, False), (1000, True),
                                                               (1000, True)]  # fmt: skip


def test_inspect_of_a_node_without_compute_has_no_compute_keys() -> None:
    state = state_of(Node("g", [16, 16], used=[4]))
    with TestClient(create_app(state, policy="binpack", binder=RecordingBinder())) as client:
        report = client.get(f"{PREFIX}/inspect/g").json()
    assert "compute" not in report["devs"][0]
    assert "compute_milli" not in report["gpushare"]["nodes"][0]["gpus"][0]


def test_prioritize_scores_a_dialect_pod_on_each_node_in_that_nodes_unit() -> None:
    state = state_of(Node("fuller", [16, 16], used=[8]), Node("empty", [16, 16]))
    state.upsert_node(alibaba_node_json("unknown-unit", 32, 2))
    body = filter_body(gpu_manager_readme_pod_1("p", "ns"), ["fuller", "empty", "unknown-unit"])
    with TestClient(create_app(state, policy="binpack", binder=RecordingBinder())) as client:
        answer = client.post(f"{PREFIX}/prioritize", json=body)
    assert answer.status_code == 200
    scores = {entry["Host"]: entry["Score"] for entry in answer.json()}
    assert scores["fuller"] > scores["empty"]  # binpack: 8 GiB fills fuller's GPU 0
    assert scores["unknown-unit"] == 0  # MiB cannot be resolved there


def _vcuda(name: str, core: int, blocks: int) -> dict[str, Any]:
    limits = {"tencent.com/vcuda-core": core, "tencent.com/vcuda-memory": blocks}
    return dialect_pod_json(name, {"main": limits}, namespace="ns")


@pytest.mark.parametrize(
    ("pod", "placed"),
    [
        pytest.param(_vcuda("b", 50, 16), None,
                     id="equal-vcuda-core-other-memory-waits-for-the-pending-pods-start"),
        pytest.param(_vcuda("c", 50, 8), [0],
                     id="equal-in-every-dimension-takes-the-pending-pods-gpu"),
        pytest.param(_vcuda("d", 30, 16), [0],
                     id="other-vcuda-core-is-placed"),
        pytest.param(_pod({"main": {"aliyun.com/gpu-mem": 2}}), [0],
                     id="a-gpu-mem-pod-of-the-same-memory-is-not-held"),
    ],
)  # fmt: skip
def test_the_handshake_rule_keeps_apart_the_pods_the_device_plugin_cannot_tell_apart(
    pod: dict[str, Any], placed: list[int] | None
) -> None:
    """gpu-manager's device plugin tells pods apart by their vcuda-core alone (docs/compute.md):
    while pod ``a`` (vcuda-core 50, 2 GiB) is bound to GPU 0 and not yet started, another pod
    asking vcuda-core 50 either takes GPU 0 too, equal in every dimension, or waits."""
    state, binder = state_of(Node("g", [16, 16], used=[8])), RecordingBinder()
    app = create_app(
        state, policy="binpack", binder=binder, events=RecordingEvents(), expire_interval_s=None
    )
    with TestClient(app) as client:
        first, error = schedule(client, _vcuda("a", 50, 8), ["g"])
        assert error == "", first
        result, error = schedule(client, pod, ["g"])
    if placed is None:
        assert result["NodeNames"] == []
        why = result["FailedNodes"]["g"]
        assert "an equal pod bound here awaits its device-plugin start" in why
        return
    assert error == "", result
    gpus = [json.loads(c.annotations[ALLOCATION])["containers"][0]["gpus"] for c in binder.calls]
    assert gpus == [[0], placed]
