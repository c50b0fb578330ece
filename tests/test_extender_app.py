"""The extender through its ASGI app, with the request bodies kube-scheduler really sent.

The fixtures in ``tests/fixtures/extender/`` were recorded from kube-scheduler by
``tests/cluster/test_extender_wiring.py``: a filter of pod ``wiring/gpu-a`` over
``wiring-gpu-0..2`` and its bind to ``wiring-gpu-2``. Here the three nodes are design.md §1's
(two 16,276 MiB GPUs each) and the pod asks 8,138 MiB: N1 = ``wiring-gpu-0`` (4,069 free in
all), N2 = ``wiring-gpu-1`` (4,069 + 4,069), N3 = ``wiring-gpu-2`` (8,138 on GPU0). Existing
allocations are fed as bound pods with annotations, as the API-server watch will feed them.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx2
import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from gpushare.core.explain import MESSAGE_MAX_BYTES
from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.cluster import REQUESTED_LIMIT
from gpushare.kube.codec import (
    ALIYUN_DEV,
    ALIYUN_IDX,
    ALIYUN_POD,
    ALLOCATION,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    PLACEMENT,
    MemoryUnit,
    allocation_annotations,
    node_info,
)
from gpushare.testing.extender import (
    RecordingBinder,
    RecordingEvents,
    node_json,
    plain_node_json,
    pod_json,
    seed_bound_pods,
)
from gpushare.testing.nodes import FakeGpu

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "extender"
GPU = 16276
N1, N2, N3 = "wiring-gpu-0", "wiring-gpu-1", "wiring-gpu-2"
PREFIX = "/gpushare-scheduler"


def fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


def filter_body(gpu_mem: int = 8138, **annotations: str) -> dict[str, Any]:
    """The recorded filter request, the pod asking ``gpu_mem`` MiB."""
    body = fixture("filter_request")
    container = body["Pod"]["spec"]["containers"][0]
    for kind in ("limits", "requests"):
        container["resources"][kind][GPU_MEM] = str(gpu_mem)
    if annotations:
        body["Pod"]["metadata"]["annotations"] = annotations
    return body


def design_state(*, synced: bool = True) -> ExtenderState:
    """design.md §1: N1 free 0 + 4,069; N2 4,069 + 4,069; N3 8,138 + 0."""
    state = ExtenderState()
    for name in (N1, N2, N3):
        state.upsert_node(node_json(name, [GPU, GPU]))
    seed_bound_pods(state, N1, [GPU, GPU - 4069])
    seed_bound_pods(state, N2, [GPU - 4069, GPU - 4069])
    seed_bound_pods(state, N3, [GPU - 8138, GPU])
    if synced:
        state.cluster.mark_synced()
    return state


def snapshot(state: ExtenderState) -> tuple[object, ...]:
    """Everything the ledger holds, to compare before and after."""
    names = [info.node.name for info in state.cluster.nodes()]
    return (
        tuple((name, state.reservations.ledger_state(name).gpu_used) for name in names),
        tuple(state.reservations.allocations(name) for name in names),
        tuple(
            state.reservations.is_assumed(a.pod)
            for name in names
            for a in state.reservations.allocations(name)
        ),
    )


def app_for(
    state: ExtenderState, binder: RecordingBinder | None = None, **kwargs: Any
) -> Starlette:
    kwargs.setdefault("policy", "binpack")  # the cases are Alibaba's binpack examples
    return create_app(state, binder=binder or RecordingBinder(), expire_interval_s=None, **kwargs)


def post(app: Starlette, verb: str, body: object) -> httpx2.Response:
    with TestClient(app) as client:
        return client.post(f"{PREFIX}/{verb}", json=body)


def bind_body(pod: dict[str, Any], node: str) -> dict[str, str]:
    meta = pod["metadata"]
    return {
        "PodName": meta["name"],
        "PodNamespace": meta["namespace"],
        "PodUID": meta["uid"],
        "Node": node,
    }


# -- the recorded fixtures -------------------------------------------------------------------


def test_fixtures_have_the_wire_shape() -> None:
    assert set(fixture("filter_request")) == {"Pod", "Nodes", "NodeNames"}
    assert set(fixture("prioritize_request")) == {"Pod", "Nodes", "NodeNames"}
    assert set(fixture("bind_request")) == {"PodName", "PodNamespace", "PodUID", "Node"}
    assert fixture("bind_request")["PodUID"] == fixture("filter_request")["Pod"]["metadata"]["uid"]


# -- filter ----------------------------------------------------------------------------------


def test_filter_node_names_only_n3_passes() -> None:
    state = design_state()
    before = snapshot(state)
    response = post(app_for(state), "filter", filter_body())
    assert response.status_code == 200
    result = response.json()
    assert set(result) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    assert result["NodeNames"] == [N3]
    assert result["Nodes"] is None
    assert result["Error"] == ""
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["FailedNodes"] == {
        N1: "gpushare: no GPU has enough free; container main; requested 8138; "
        "free/capacity per GPU 0/16276, 4069/16276; unit MiB",
        N2: "gpushare: no GPU has enough free; container main; requested 8138; "
        "free/capacity per GPU 4069/16276, 4069/16276; unit MiB",
    }
    assert snapshot(state) == before  # filter reserves nothing


def test_filter_nodes_returns_the_node_objects_as_received() -> None:
    state = ExtenderState()  # nodes come with the request
    nodes = [node_json(name, [GPU, GPU]) for name in (N1, N2, N3)]
    for node in nodes:
        state.upsert_node(node)
    seed_bound_pods(state, N1, [GPU, GPU - 4069])
    seed_bound_pods(state, N2, [GPU - 4069, GPU - 4069])
    seed_bound_pods(state, N3, [GPU - 8138, GPU])
    state.cluster.mark_synced()
    body = filter_body()
    body["NodeNames"] = None
    body["Nodes"] = {"metadata": {"resourceVersion": "7"}, "items": copy.deepcopy(nodes)}
    result = post(app_for(state), "filter", body).json()
    assert result["NodeNames"] is None
    assert result["Nodes"] == {"metadata": {"resourceVersion": "7"}, "items": [nodes[2]]}
    assert set(result["FailedNodes"]) == {N1, N2}


def test_filter_nodes_mode_learns_nodes_from_the_request_only_in_memory() -> None:
    state = ExtenderState()
    state.cluster.mark_synced()
    body = filter_body()
    body["NodeNames"] = None
    body["Nodes"] = {"metadata": {}, "items": [node_json(N3, [GPU, GPU]), plain_node_json("cpu")]}
    result = post(app_for(state, nodes_from_requests=True), "filter", body).json()
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == [N3]
    assert result["FailedAndUnresolvableNodes"] == {
        "cpu": "gpushare: not a GPU-share node (no label gpushare=true)"
    }
    assert state.cluster.node(N3) is not None


def test_filter_nodes_request_never_changes_node_state() -> None:
    """A ``Nodes`` body claiming N2 has 8 x 80 GiB changes nothing; the
    nodes are candidates by name, judged on what the state (the API server) says."""
    state = design_state()
    before = (snapshot(state), state.cluster.node(N2), state.cluster.nodes())
    forged = node_json(N2, [80 * 1024] * 8)
    body = filter_body()
    body["NodeNames"] = None
    body["Nodes"] = {"metadata": {}, "items": [forged, node_json("forged-new", [GPU]), {}]}
    app = app_for(state)
    result = post(app, "filter", body).json()
    assert (snapshot(state), state.cluster.node(N2), state.cluster.nodes()) == before
    assert result["Nodes"]["items"] == []
    assert result["FailedNodes"][N2].startswith("gpushare: no GPU has enough free")
    assert result["FailedAndUnresolvableNodes"] == {
        "forged-new": "gpushare: node unknown to the extender (not in its node cache)",
        "Nodes.items[2]": "gpushare: node without metadata.name",
    }
    prioritized = post(app, "prioritize", body).json()
    assert prioritized == [{"Host": N2, "Score": 0}, {"Host": "forged-new", "Score": 0}]
    assert (snapshot(state), state.cluster.node(N2), state.cluster.nodes()) == before


UNRESOLVABLE = [
    ("larger than any GPU", 20000, {}, "request is larger than any GPU; container main; "
     "requested 20000; available 16276"),
    ("model excluded", 4, {"gpushare.io/gpu-models": "A100"}, "no GPU of an allowed model"),
    ("more GPUs than the node has", 3 * 4069, {GPU_COUNT_ANNOTATION: "3"},
     "node has fewer GPUs than requested"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpu_mem", "annotations", "reason"),
    [u[1:] for u in UNRESOLVABLE],
    ids=[u[0] for u in UNRESOLVABLE],
)
def test_filter_can_never_fit(gpu_mem: int, annotations: dict[str, str], reason: str) -> None:
    state = design_state()
    result = post(app_for(state), "filter", filter_body(gpu_mem, **annotations)).json()
    assert result["NodeNames"] == []
    assert set(result["FailedAndUnresolvableNodes"]) == {N1, N2, N3}
    assert reason in result["FailedAndUnresolvableNodes"][N3]


def test_filter_unknown_and_plain_nodes_are_unresolvable() -> None:
    state = design_state()
    state.upsert_node(plain_node_json("cpu-0"))
    body = filter_body()
    body["NodeNames"] = [N3, "cpu-0", "ghost"]
    result = post(app_for(state), "filter", body).json()
    assert result["NodeNames"] == [N3]
    assert result["FailedAndUnresolvableNodes"]["ghost"].startswith("gpushare: node unknown")
    assert result["FailedAndUnresolvableNodes"]["cpu-0"].startswith("gpushare: not a GPU-share")


def test_filter_pod_without_gpu_passes_everywhere() -> None:
    state = design_state()
    body = filter_body()
    del body["Pod"]["spec"]["containers"][0]["resources"]["limits"][GPU_MEM]
    del body["Pod"]["spec"]["containers"][0]["resources"]["requests"][GPU_MEM]
    body["NodeNames"] = [N1, "ghost"]
    assert post(app_for(state), "filter", body).json()["NodeNames"] == [N1, "ghost"]


def test_filter_excludes_unhealthy_gpus() -> None:
    state = ExtenderState()
    state.upsert_node(node_json(N3, [FakeGpu(0, GPU, healthy=False), FakeGpu(1, GPU)]))
    seed_bound_pods(state, N3, [0, 4069])
    state.cluster.mark_synced()
    body = filter_body(GPU - 4069 + 1)
    body["NodeNames"] = [N3]
    result = post(app_for(state), "filter", body).json()
    assert result["FailedNodes"][N3].startswith("gpushare: not enough healthy GPUs")


def test_filter_before_sync_is_an_error_and_not_ready() -> None:
    state = design_state(synced=False)
    app = app_for(state)
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 503
        result = client.post(f"{PREFIX}/filter", json=filter_body()).json()
        assert result["Error"].startswith("gpushare: the extender has not finished listing")
        state.cluster.mark_synced()
        assert client.get("/readyz").status_code == 200


# -- prioritize ------------------------------------------------------------------------------


def test_prioritize_binpack_prefers_the_fuller_node() -> None:
    state = design_state()
    state.upsert_node(node_json("empty", [GPU, GPU]))
    body = fixture("prioritize_request")
    body["Pod"] = filter_body(4069)["Pod"]
    body["NodeNames"] = [N1, N2, "empty", "ghost"]
    response = post(app_for(state), "prioritize", body)
    assert response.status_code == 200
    assert b'"Score":10' in response.content  # integers, never 10.0
    scores = {entry["Host"]: entry["Score"] for entry in response.json()}
    assert scores == {N1: 10, N2: scores[N2], "empty": 0, "ghost": 0}
    assert 0 < scores[N2] < 10


@pytest.mark.parametrize(
    "policy", ["binpack", "spread", "fgd", "fgd-cpu", "fgd-spare", "bestfit", "random"]
)
def test_prioritize_scores_are_integers_0_to_10(policy: str) -> None:
    state = design_state()
    state.upsert_node(node_json("empty", [GPU, GPU]))
    body = filter_body(4069)
    body["NodeNames"] = [N1, N2, N3, "empty"]
    result = post(app_for(state, policy=policy, gpu_unit=GPU), "prioritize", body).json()
    assert [entry["Host"] for entry in result] == [N1, N2, N3, "empty"]
    assert all(isinstance(e["Score"], int) and 0 <= e["Score"] <= 10 for e in result)
    assert max(e["Score"] for e in result) == 10


# -- bind ------------------------------------------------------------------------------------


def test_bind_design_example_lands_on_n3_gpu0() -> None:
    state = design_state()
    binder, events = RecordingBinder(), RecordingEvents()
    app = app_for(state, binder, events=events)
    with TestClient(app) as client:
        assert client.post(f"{PREFIX}/filter", json=filter_body()).json()["NodeNames"] == [N3]
        response = client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
    assert response.json() == {"Error": ""}
    (call,) = binder.calls
    assert (call.namespace, call.name, call.node) == ("wiring", "gpu-a", N3)
    assert call.uid == fixture("bind_request")["PodUID"]
    assert call.annotations[ALIYUN_IDX] == "0"
    assert call.annotations[ALIYUN_POD] == "8138"
    assert call.annotations[ALIYUN_DEV] == "16276"
    assert state.reservations.ledger_state(N3).gpu_free == (0, 0)
    assert state.reservations.is_assumed("wiring/gpu-a")
    assert events.events[-1].ok
    assert "container main on GPU 0 (8138 MiB each)" in events.events[-1].message


@pytest.mark.parametrize(
    ("names", "scored", "node", "says"),
    [
        pytest.param([N1, N2, N3], True, N1,
                     ("container main on GPU 1 (4069 MiB each)", "policy binpack",
                      "scores 0-10 of the 3 node(s) it fits: ", f"{N1} 10, "),
                     id="the-event-names-the-gpus-the-policy-and-the-best-nodes-scores"),
        pytest.param([N1, N2, N3], True, N3,
                     (f"bound to node {N3}", f"{N1} 10", f"{N3} 0"),
                     id="a-node-kube-scheduler-chose-over-gpushares-best-shows-its-low-score"),
        pytest.param([N1], False, N1,
                     ("policy binpack; the only node that passed the filter (not scored)",),
                     id="a-lone-node-kube-scheduler-did-not-score-is-said-so"),
    ],
)  # fmt: skip
def test_bind_event_says_why_the_pod_went_there_from_the_scores_sent(
    names: list[str], scored: bool, node: str, says: tuple[str, ...]
) -> None:
    state = design_state()
    binder, events = RecordingBinder(), RecordingEvents()
    body = filter_body(4069) | {"NodeNames": names}
    with TestClient(app_for(state, binder, events=events)) as client:
        passed = client.post(f"{PREFIX}/filter", json=body).json()["NodeNames"]
        assert node in passed
        if scored:
            sent = client.post(f"{PREFIX}/prioritize", json=body).json()
            assert {e["Host"]: e["Score"] for e in sent}[N1] == 10
        bind = fixture("bind_request") | {"Node": node}
        assert client.post(f"{PREFIX}/bind", json=bind).json() == {"Error": ""}
    (event,) = events.events
    assert event.ok
    for words in says:
        assert words in event.message
    (call,) = binder.calls
    assert call.annotations[PLACEMENT] == event.message  # what inspect --pod shows
    assert len(event.message.encode()) <= MESSAGE_MAX_BYTES


def binpack_state() -> ExtenderState:
    """N3 with four GPUs, free 12,207 / 8,138 / 4,069 / 16,276 MiB."""
    state = ExtenderState()
    state.upsert_node(node_json(N3, [GPU] * 4))
    seed_bound_pods(state, N3, [4069, 8138, 12207, 0])
    state.cluster.mark_synced()
    return state


def test_bind_binpack_picks_gpu1() -> None:
    state = binpack_state()
    binder = RecordingBinder()
    app = app_for(state, binder)
    with TestClient(app) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        assert client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"] == ""
    assert binder.calls[0].annotations[ALIYUN_IDX] == "1"
    assert state.reservations.ledger_state(N3).gpu_free == (12207, 0, 4069, 16276)


def test_bind_multi_gpu_pod_records_our_annotation_only() -> None:
    state = binpack_state()
    binder = RecordingBinder()
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body(2 * 8138, **{GPU_COUNT_ANNOTATION: "2"}))
        assert client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"] == ""
    annotations = binder.calls[0].annotations
    assert ALIYUN_IDX not in annotations
    assert ALIYUN_DEV not in annotations
    assert annotations[ALIYUN_POD] == "16276"
    document = json.loads(annotations[ALLOCATION])
    assert document["containers"] == [{"name": "main", "gpus": [0, 1], "share": 8138}]


def test_retried_bind_succeeds_without_a_second_allocation() -> None:
    state = design_state()
    binder = RecordingBinder()
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        first = client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()
        after_first = snapshot(state)
        second = client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()
    assert first == second == {"Error": ""}
    assert len(binder.calls) == 1
    assert snapshot(state) == after_first


def test_bind_retry_after_watch_confirmed_it() -> None:
    state = design_state()
    binder = RecordingBinder()
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
        bound = filter_body()["Pod"]
        bound["spec"]["nodeName"] = N3
        bound["metadata"]["annotations"] = dict(binder.calls[0].annotations)
        state.observe_pod(bound)  # the watch sees the pod bound: committed
        assert not state.reservations.is_assumed("wiring/gpu-a")
        assert client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"] == ""
    assert len(binder.calls) == 1
    assert state.reservations.ledger_state(N3).gpu_free == (0, 0)


def test_retry_after_unknown_outcome_reuses_the_same_gpus() -> None:
    state = binpack_state()
    binder = RecordingBinder(error=TimeoutError("apiserver timeout"))
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        first = client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()
        assert "outcome unknown" in first["Error"]
        assert state.reservations.is_assumed("wiring/gpu-a")  # kept: the bind may have happened
        # kube-scheduler retries: the pod's own assumption does not block it
        assert client.post(f"{PREFIX}/filter", json=filter_body()).json()["NodeNames"] == [N3]
        binder.error = None
        assert client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"] == ""
    assert [c.annotations[ALIYUN_IDX] for c in binder.calls] == ["1", "1"]
    assert state.reservations.ledger_state(N3).gpu_free == (12207, 0, 4069, 16276)


def test_retry_on_another_node_moves_a_stale_assumption() -> None:
    state = design_state()
    state.upsert_node(node_json("spare", [GPU]))
    binder = RecordingBinder(error=TimeoutError("lost"))
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
        binder.error = None
        body = fixture("bind_request") | {"Node": "spare"}
        assert client.post(f"{PREFIX}/bind", json=body).json()["Error"] == ""
    allocation = state.reservations.allocation("wiring/gpu-a")
    assert allocation is not None
    assert allocation.node == "spare"
    assert state.reservations.ledger_state(N3).gpu_free == (8138, 0)


def test_bind_that_would_overcommit_fails_and_leaves_the_ledger() -> None:
    state = design_state()
    binder, events = RecordingBinder(), RecordingEvents()
    before = snapshot(state)
    with TestClient(app_for(state, binder, events=events)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        body = fixture("bind_request") | {"Node": N2}
        error = client.post(f"{PREFIX}/bind", json=body).json()["Error"]
    assert error == (
        f"gpushare: pod wiring/gpu-a does not fit node {N2} now: no GPU has enough free; "
        "container main; requested 8138; free/capacity per GPU 4069/16276, 4069/16276; unit MiB"
    )
    assert binder.calls == []
    assert snapshot(state) == before
    assert not events.events[-1].ok
    assert events.events[-1].message == error


def test_binder_failure_releases_the_assumption() -> None:
    state = design_state()
    binder = RecordingBinder(failure="pods/binding: 409 Conflict")
    before = snapshot(state)
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        error = client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"]
    assert (
        error
        == f"gpushare: binding pod wiring/gpu-a to node {N3} failed: pods/binding: 409 Conflict"
    )
    assert snapshot(state) == before


def test_assumption_expires() -> None:
    now = [0.0]
    state = ExtenderState(clock=lambda: now[0], assume_ttl_s=30)
    state.upsert_node(node_json(N3, [GPU, GPU]))
    state.cluster.mark_synced()
    binder = RecordingBinder(error=TimeoutError("lost"))
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
    assert state.reservations.ledger_state(N3).gpu_free == (GPU - 8138, GPU)
    now[0] = 29.9
    assert state.reservations.expire() == []
    now[0] = 30.0
    assert [a.pod for a in state.reservations.expire()] == ["wiring/gpu-a"]
    assert state.reservations.ledger_state(N3).gpu_free == (GPU, GPU)


@pytest.mark.parametrize(
    ("handshake_timeout_s", "bound", "free"),
    [
        pytest.param(0, 4, (0, 0), id="rule-off-four-fit"),
        pytest.param(300, 2, (0, GPU), id="rule-on-equal-pending-pods-share-one-gpu"),
    ],
)
def test_concurrent_binds_never_overcommit(
    handshake_timeout_s: float, bound: int, free: tuple[int, int]
) -> None:
    """20 pods of 8,138 MiB bound at once to a node with two 16,276 MiB GPUs: four fit. With the
    handshake rule on (no device plugin starts them here), equal pending pods must share the
    first one's GPU, so two are bound and the others wait."""
    state = ExtenderState(handshake_timeout_s=handshake_timeout_s)
    state.upsert_node(node_json(N3, [GPU, GPU]))
    state.cluster.mark_synced()
    pods = [pod_json(f"p{i}", 8138) for i in range(20)]
    for pod in pods:
        state.cluster.remember_pod(pod)
    binder = RecordingBinder()
    app = app_for(state, binder)

    async def run() -> list[str]:
        transport = httpx2.ASGITransport(app=app)
        async with httpx2.AsyncClient(transport=transport, base_url="http://extender") as client:
            bodies = [bind_body(pod, N3) for pod in pods] + [bind_body(pods[0], N3)]
            responses = await asyncio.gather(
                *(client.post(f"{PREFIX}/bind", json=body) for body in bodies)
            )
        return [r.json()["Error"] for r in responses]

    errors = asyncio.run(run())
    assert sum(1 for e in errors[:20] if e == "") == bound
    assert all("does not fit node" in e for e in errors[:20] if e)
    assert errors[0] == errors[20] == ""  # the same pod twice: both succeed, bound once
    assert len(binder.calls) == bound
    assert state.reservations.ledger_state(N3).gpu_free == free
    if handshake_timeout_s:
        assert any("awaits its device-plugin start" in e for e in errors[:20]), errors[:3]
    assert state.reservations.ledger_violations() == []


# -- bad input -------------------------------------------------------------------------------

BAD_BODIES: list[tuple[str, str, bytes, str]] = [
    ("filter, malformed JSON", "filter", b'{"Pod": ', "malformed JSON"),
    ("filter, not an object", "filter", b"[1, 2]", "Expected `object`"),
    ("filter, missing Pod", "filter", b'{"NodeNames": ["a"]}', "missing required field `Pod`"),
    ("filter, Pod not an object", "filter", b'{"Pod": 3, "NodeNames": []}', "`$.Pod`"),
    ("filter, NodeNames not strings", "filter", b'{"Pod": {}, "NodeNames": [1]}', "NodeNames"),
    ("filter, no candidates", "filter", b'{"Pod": {}, "Nodes": null, "NodeNames": null}',
     "neither NodeNames nor Nodes"),
    ("prioritize, malformed JSON", "prioritize", b"{", "malformed JSON"),
    ("prioritize, unreadable pod", "prioritize", b'{"Pod": {}, "NodeNames": []}', "metadata.name"),
    ("bind, empty body", "bind", b"", "malformed JSON"),
    ("bind, missing PodUID", "bind", b'{"PodName": "a", "PodNamespace": "b", "Node": "n"}',
     "missing required field `PodUID`"),
    # These were once 200 "internal error" with a traceback.
    ("filter, invalid UTF-8 in the pod", "filter",
     b'{"Pod": {"metadata": {"name": "p\xff\xfe"}}, "NodeNames": ["a"]}', "not valid UTF-8"),
    ("bind, invalid UTF-8 in a name", "bind",
     b'{"PodName": "\xc3", "PodNamespace": "b", "PodUID": "u", "Node": "n"}', "not valid UTF-8"),
    ("filter, JSON nested 50,000 deep in the pod", "filter",
     b'{"Pod": {"spec": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b'}, "NodeNames": []}',
     "nested too deep"),
    ("prioritize, JSON nested 50,000 deep", "prioritize",
     b'{"Pod": {"x": ' + b"[" * 50_000 + b"]" * 50_000 + b'}, "NodeNames": []}',
     "nested too deep"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("verb", "body", "message"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_bad_bodies_are_400_with_the_reason(verb: str, body: bytes, message: str) -> None:
    state = design_state()
    before = snapshot(state)
    with TestClient(app_for(state)) as client:
        response = client.post(f"{PREFIX}/{verb}", content=body)
    assert response.status_code == 400
    assert message in response.json()["Error"]
    assert "internal error" not in response.json()["Error"]
    assert snapshot(state) == before


BAD_PODS: list[tuple[str, dict[str, str], int | str, str]] = [
    ("garbage gpu-count annotation", {GPU_COUNT_ANNOTATION: "lots"}, 8138,
     "annotation gpushare.io/gpu-count='lots'"),
    ("fractional gpu-mem", {}, "500m", "resources.limits.aliyun.com/gpu-mem='500m'"),
    ("garbage gpu-models annotation", {"gpushare.io/gpu-models": '{"main": 5}'}, 8138,
     "annotation gpushare.io/gpu-models"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("annotations", "gpu_mem", "message"), [b[1:] for b in BAD_PODS], ids=[b[0] for b in BAD_PODS]
)
def test_unreadable_pod_is_a_filter_error(
    annotations: dict[str, str], gpu_mem: int | str, message: str
) -> None:
    state = design_state()
    before = snapshot(state)
    body = filter_body(8138, **annotations)
    container = body["Pod"]["spec"]["containers"][0]
    container["resources"]["limits"][GPU_MEM] = container["resources"]["requests"][GPU_MEM] = str(
        gpu_mem
    )
    app = app_for(state)
    with TestClient(app) as client:
        result = client.post(f"{PREFIX}/filter", json=body)
        bind = client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
    assert result.status_code == 200
    assert result.json()["Error"].startswith("gpushare: pod wiring/gpu-a")
    assert message in result.json()["Error"]
    assert result.json()["NodeNames"] == []
    assert bind.json()["Error"] == "gpushare: pod wiring/gpu-a unknown to the extender (never seen)"
    assert snapshot(state) == before


def test_garbage_node_in_nodes_request_is_unresolvable() -> None:
    state = design_state()
    broken = node_json("broken", [GPU])
    broken["metadata"]["annotations"]["gpushare.io/gpu-inventory"] = '{"unit": "KiB"}'
    body = filter_body()
    body["NodeNames"] = None
    body["Nodes"] = {"metadata": {}, "items": [broken, {"metadata": {}}]}
    result = post(app_for(state, nodes_from_requests=True), "filter", body).json()
    assert result["FailedAndUnresolvableNodes"]["broken"].startswith(
        "gpushare: node broken: annotation gpushare.io/gpu-inventory="
    )
    assert "Nodes.items[1]" in result["FailedAndUnresolvableNodes"]
    assert result["Nodes"]["items"] == []


BAD_BINDS: list[tuple[str, dict[str, str], str]] = [
    ("unknown node", {"Node": "ghost"}, "gpushare: node unknown to the extender"),
    ("UID mismatch", {"PodUID": "other"}, "has UID"),
    ("unknown pod", {"PodName": "nobody"}, "pod wiring/nobody unknown"),
]


@pytest.mark.parametrize(
    ("change", "message"), [b[1:] for b in BAD_BINDS], ids=[b[0] for b in BAD_BINDS]
)
def test_bad_bind_is_an_error_and_leaves_the_ledger(change: dict[str, str], message: str) -> None:
    state = design_state()
    before = snapshot(state)
    binder = RecordingBinder()
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        response = client.post(f"{PREFIX}/bind", json=fixture("bind_request") | change)
    assert response.status_code == 200
    assert message in response.json()["Error"]
    assert binder.calls == []
    assert snapshot(state) == before


def test_bind_of_a_pod_bound_elsewhere_fails() -> None:
    state = design_state()
    pod = fixture("filter_request")["Pod"]
    pod["spec"]["nodeName"] = N1
    state.observe_pod(pod)
    error = post(app_for(state), "bind", fixture("bind_request")).json()["Error"]
    assert error == f"gpushare: pod wiring/gpu-a is already bound to node {N1}, not {N3}"


# -- the other routes ------------------------------------------------------------------------


def test_health_version_and_inspect() -> None:
    state = design_state()
    app = app_for(state, prefix="/custom/")
    with TestClient(app) as client:
        assert client.get("/healthz").json() == {"status": "ok"}
        assert client.get("/readyz").json() == {"ready": True}
        assert client.get("/version").json() == {"version": "0.1.0"}
        report = client.get("/custom/inspect").json()
        one = client.get(f"/custom/inspect/{N3}").json()
        assert client.get("/custom/inspect/ghost").status_code == 404
        assert client.post("/custom/filter", json=filter_body()).json()["NodeNames"] == [N3]
    assert [node["name"] for node in report["nodes"]] == [N1, N2, N3]
    assert report["violations"] == []
    assert one["totalGPU"] == 2 * GPU
    assert one["usedGPU"] == GPU + 8138
    assert one["devs"][0]["pods"] == [
        {
            "name": f"seed-{N3}-0",
            "namespace": "default",
            "usedGPU": 8138,
            "bindInFlight": False,
            "containers": ["main"],
        }
    ]
    # The same report kubectl inspect gpushare -o json prints, from the extender's own copy.
    shared = report["gpushare"]
    assert [n["name"] for n in shared["nodes"]] == [N1, N2, N3]
    assert [(t["unit"], t["allocated"], t["total"]) for t in shared["totals"]] == [
        ("MiB", sum(n["usedGPU"] for n in report["nodes"]), 6 * GPU)
    ]
    assert [n["name"] for n in one["gpushare"]["nodes"]] == [N3]
    assert [g["allocated"] for g in one["gpushare"]["nodes"][0]["gpus"]] == [8138, GPU]


def test_finished_and_deleted_pods_release_their_gpus() -> None:
    state = design_state()
    pod = pod_json(f"seed-{N3}-0", 8138, node=N3)
    pod["status"]["phase"] = "Succeeded"
    released = state.observe_pod(pod)
    assert isinstance(released, Allocation)
    assert released.node == N3
    assert state.forget_pod(f"default/seed-{N3}-1") is not None
    assert state.reservations.ledger_state(N3).gpu_free == (GPU, GPU)
    assert node_info(node_json(N3, [GPU, GPU])).node == state.reservations.ledger_state(N3).node


def test_a_pod_seen_before_its_node_is_counted_when_the_node_arrives() -> None:
    state = ExtenderState()
    node = node_json("late", [GPU, GPU])
    allocation = Allocation("default/early", "late", (ContainerAllocation("main", (1,), 4069),))
    notes = allocation_annotations(allocation, node_info(node).node, now_ns=1, unit=MemoryUnit.MIB)
    result = state.observe_pod(pod_json("early", 4069, node="late", annotations=notes))
    assert result is not None
    assert not isinstance(result, Allocation)
    assert str(result.outcome) == "unknown node"
    state.upsert_node(node)
    assert state.reservations.allocation("default/early") == allocation
    assert state.reservations.ledger_state("late").gpu_free == (GPU, GPU - 4069)


# -- log noise: one line each, no traceback --------------------------------------------------


def test_client_disconnect_mid_body_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    state = design_state()
    before = snapshot(state)
    app = app_for(state)
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": b'{"Pod": {"metadata": ', "more_body": True},
        {"type": "http.disconnect"},
    ]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return messages.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST",
        "scheme": "http", "path": f"{PREFIX}/filter", "raw_path": f"{PREFIX}/filter".encode(),
        "root_path": "", "query_string": b"", "headers": [(b"content-length", b"5000")],
        "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 12345),
    }  # fmt: skip
    with caplog.at_level("INFO", logger="gpushare"):
        asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 400
    records = [r for r in caplog.records if r.name.startswith("gpushare")]
    assert [r.getMessage() for r in records] == [
        "filter from 127.0.0.1:40000: the client disconnected before sending the whole body "
        "(pod unknown: the body was not complete)"
    ]
    assert all(r.exc_info is None for r in caplog.records)
    assert snapshot(state) == before


def test_bind_with_the_api_server_down_is_one_line(caplog: pytest.LogCaptureFixture) -> None:
    state = design_state()
    binder = RecordingBinder(error=ConnectionRefusedError(111, "Connection refused"))
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        with caplog.at_level("INFO", logger="gpushare"):
            result = client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()
    assert "outcome unknown" in result["Error"]
    records = [r for r in caplog.records if r.name.startswith("gpushare")]
    assert [r.getMessage() for r in records] == [
        f"binding pod wiring/gpu-a to node {N3}: outcome unknown, GPUs kept assumed: "
        "ConnectionRefusedError: [Errno 111] Connection refused"
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_filter_requests_never_change_inspect() -> None:
    """Pods seen only in requests stay out of ``/inspect`` (its pending list came from them),
    and at most ``REQUESTED_LIMIT`` of them are kept, however many names clients invent."""
    state = design_state()
    with TestClient(app_for(state)) as client:
        before = client.get(f"{PREFIX}/inspect").json()
        for i in range(REQUESTED_LIMIT + 10):
            body = filter_body()
            body["Pod"]["metadata"]["name"] = f"invented-{i}"
            assert client.post(f"{PREFIX}/filter", json=body).status_code == 200
        assert client.get(f"{PREFIX}/inspect").json() == before
    assert state.cluster.pod("wiring/invented-0") is None  # the oldest went first
    assert state.cluster.pod(f"wiring/invented-{REQUESTED_LIMIT + 9}") is not None


def test_a_filter_claiming_the_pod_is_bound_cannot_fake_a_bind() -> None:
    """kube-scheduler filters only unbound pods: a request copy with ``nodeName`` set is
    forged, and must not make a later bind answer "bound" without creating the Binding."""
    state = design_state()
    binder = RecordingBinder()
    forged = filter_body()
    forged["Pod"]["spec"]["nodeName"] = N3
    with TestClient(app_for(state, binder)) as client:
        client.post(f"{PREFIX}/filter", json=filter_body())
        client.post(f"{PREFIX}/filter", json=forged)
        assert client.post(f"{PREFIX}/bind", json=fixture("bind_request")).json()["Error"] == ""
    assert len(binder.calls) == 1
