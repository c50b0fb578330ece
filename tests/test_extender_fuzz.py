"""Fuzzing the extender's three POST routes with hypothesis (docs/extender.md, "Routes").

Any body — random bytes, random JSON, or requests shaped like kube-scheduler's with garbage in
the pod, the annotations, the quantities and the nodes — gets 200 or 400, never a 500 and never
an internal error; filter and prioritize never change an allocation; and after every request the
ledger's invariants hold (no GPU above its capacity), binds included.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.extender import ExtenderState, create_app
from gpushare.kube.codec import (
    ALIYUN_KEYS,
    ALLOCATION,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPU_MODELS_ANNOTATION,
    INVENTORY,
    allocation_annotations,
)
from gpushare.testing import strategies
from gpushare.testing.extender import RecordingBinder, node_json, plain_node_json, pod_json

PREFIX = "/gpushare-scheduler"
NODES = ("n1", "n2", "n3", "cpu")


def build() -> tuple[ExtenderState, TestClient]:
    state = ExtenderState()
    for name in NODES[:3]:
        state.upsert_node(node_json(name, [16, 16, 8]))
    state.upsert_node(plain_node_json("cpu"))
    info = state.cluster.node("n1")
    assert info is not None
    allocation = Allocation("default/old", "n1", (ContainerAllocation("main", (0,), 12),))
    notes = allocation_annotations(allocation, info.node, now_ns=5, unit=info.unit)
    state.observe_pod(pod_json("old", 12, node="n1", annotations=notes))
    state.cluster.mark_synced()
    app = create_app(state, binder=RecordingBinder(), expire_interval_s=None)
    return state, TestClient(app)


STATE, CLIENT = build()

json_values = strategies.json_values(text_size=6, items=3, max_leaves=12)
quantities = st.one_of(
    st.integers(-2, 40).map(str),
    st.sampled_from(["1k", "500m", "2Ki", "1e1", "", "x", "1.5", "-0"]),
    st.integers(0, 40),
    json_values,
)
annotation_maps = st.dictionaries(
    st.sampled_from(
        [ALLOCATION, GPU_COUNT_ANNOTATION, GPU_MODELS_ANNOTATION, INVENTORY, *ALIYUN_KEYS]
    ),
    st.one_of(
        st.text(max_size=10),
        st.integers(-2, 20).map(str),
        st.sampled_from(['{"main": 2}', '{"node": "n1", "containers": []}', "true", "2"]),
    ),
    max_size=3,
)
names = st.sampled_from(["p", "q", "r", "old"])


@st.composite
def pods(draw: st.DrawFn) -> Any:
    clean = draw(st.booleans())  # half the pods are valid, to reach the decisions
    notes = {} if clean else draw(annotation_maps)
    pod: dict[str, Any] = pod_json(draw(names), 4, annotations=notes)
    container = pod["spec"]["containers"][0]
    value = str(draw(st.integers(1, 20))) if clean else draw(quantities)
    kinds = [("limits", "requests")] if clean else [("limits",), ("requests",)]
    for kind in draw(st.sampled_from(kinds)):
        container["resources"][kind][GPU_MEM] = value
    if not clean and draw(st.booleans()):
        container["resources"]["limits"][GPU_COUNT] = draw(quantities)
    if not clean and draw(st.booleans()):
        pod["spec"]["nodeName"] = draw(st.sampled_from(NODES))
    return pod if clean else draw(st.one_of(st.just(pod), json_values))


@st.composite
def nodes(draw: st.DrawFn) -> Any:
    node: dict[str, Any] = node_json(f"fuzz-{draw(st.integers(0, 3))}", [16, 8])
    if draw(st.booleans()):
        node["metadata"]["annotations"][INVENTORY] = draw(
            st.one_of(st.text(max_size=10), json_values.map(json.dumps))
        )
    return draw(st.one_of(st.just(node), json_values))


node_names = st.lists(st.one_of(st.sampled_from(NODES), st.text(max_size=5)), max_size=5)
scheduler_args = st.fixed_dictionaries(  # as kube-scheduler sends them, garbage inside
    {"Pod": pods(), "NodeNames": node_names, "Nodes": st.none()}
)
extender_args = st.one_of(
    scheduler_args,
    st.fixed_dictionaries(
        {"Pod": pods(), "NodeNames": st.none()},
        optional={
            "Nodes": st.one_of(
                st.fixed_dictionaries(
                    {"metadata": st.just({}), "items": st.lists(nodes(), max_size=3)}
                ),
                json_values,
            )
        },
    ),
    st.fixed_dictionaries({"Pod": json_values}, optional={"NodeNames": json_values}),
)
bodies = st.one_of(
    st.binary(max_size=40),
    json_values.map(lambda v: json.dumps(v).encode()),
    extender_args.map(lambda v: json.dumps(v).encode()),
)


def allocations() -> list[Allocation]:
    return [
        a for info in STATE.cluster.nodes() for a in STATE.reservations.allocations(info.node.name)
    ]


def check(response: httpx2.Response) -> Any:
    assert response.status_code in (200, 400), response.text
    body = response.json()
    text = body.get("Error", "") if isinstance(body, dict) else ""
    assert not text.startswith("gpushare internal error"), text
    assert STATE.reservations.ledger_violations() == []
    return body


FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(bodies)
def test_fuzz_filter(body: bytes) -> None:
    before = allocations()
    response = CLIENT.post(f"{PREFIX}/filter", content=body)
    result = check(response)
    assert allocations() == before
    keys = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert set(result) == (keys if response.status_code == 200 else {"Error"})


@FUZZ
@given(bodies)
def test_fuzz_prioritize(body: bytes) -> None:
    before = allocations()
    result = check(CLIENT.post(f"{PREFIX}/prioritize", content=body))
    assert allocations() == before
    if isinstance(result, list):
        assert all(type(e["Score"]) is int and 0 <= e["Score"] <= 10 for e in result)


bind_args = st.fixed_dictionaries(
    {
        "PodName": st.one_of(names, st.text(max_size=4)),
        "PodNamespace": st.sampled_from(["default", "default", "wiring", ""]),
        "PodUID": st.one_of(st.just(""), st.text(max_size=4)),
        "Node": st.one_of(st.sampled_from(NODES), st.text(max_size=4)),
    }
)


@FUZZ
@given(st.one_of(bodies, bind_args.map(lambda v: json.dumps(v).encode())), scheduler_args)
def test_fuzz_bind(body: bytes, seen: dict[str, Any]) -> None:
    CLIENT.post(f"{PREFIX}/filter", content=json.dumps(seen).encode())  # the pod becomes known
    result = check(CLIENT.post(f"{PREFIX}/bind", content=body))
    assert set(result) == {"Error"}
