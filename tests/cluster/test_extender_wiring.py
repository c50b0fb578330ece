"""The extender wiring against the real kube-scheduler (spec: kubernetes-interfaces.md, section 1).

A second kube-scheduler (profile ``gpushare-wiring``) is configured with one extender: filter,
prioritize and bind verbs pointing at a scripted HTTP server on loopback,
``nodeCacheCapable: true``, and ``managedResources: aliyun.com/gpu-mem`` with
``ignoredByScheduler: false`` (Alibaba's configuration: kube-scheduler checks the node total,
the extender the single GPUs). The test asserts that

* filter and prioritize requests arrive as ``{"Pod", "Nodes": null, "NodeNames": [...]}`` and
  bind requests as ``{"PodName", "PodNamespace", "PodUID", "Node"}``, POSTed as JSON;
* kube-scheduler honours the node list the server returns (each pod lands on the one node the
  server let through) and the server's scores;
* every ``aliyun.com/gpu-mem`` pod is bound by the server's bind verb (the server creates the
  Binding through the API with its own RBAC-limited ServiceAccount), and kwok runs it;
* a pod without ``aliyun.com/gpu-mem`` never reaches the extender and is bound by DefaultBinder.

The real request bodies are kept in ``tests/fixtures/extender/`` for the extender's component
tests. Re-record them with ``GPUSHARE_RECORD_FIXTURES=1``; otherwise the test checks that the
checked-in fixtures still have the shape the real scheduler sends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.kube.codec import GPU_MEM
from gpushare.testing.controlplane import ControlPlane, gpushare_extender, wait_for
from gpushare.testing.extender_stub import RecordedCall, ScriptedExtender
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node, plain_node

pytestmark = pytest.mark.cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "extender"
RECORD = os.environ.get("GPUSHARE_RECORD_FIXTURES") == "1"
NAMESPACE = "wiring"
SCHEDULER_NAME = "gpushare-wiring"
BOUND_BY = "gpushare.io/test-bound-by"
GPU_NODES = ("wiring-gpu-0", "wiring-gpu-1", "wiring-gpu-2")
CPU_NODE = "wiring-cpu-0"
# pod -> the nodes the scripted filter lets through, and the node its prioritize prefers.
PLAN: dict[str, tuple[tuple[str, ...], str | None]] = {
    "gpu-a": (("wiring-gpu-2",), None),
    "gpu-b": (("wiring-gpu-0",), None),
    "gpu-c": (("wiring-gpu-1",), None),
    "gpu-d": (("wiring-gpu-0", "wiring-gpu-1"), "wiring-gpu-1"),
}
EXPECTED_NODE = {pod: preferred or allowed[0] for pod, (allowed, preferred) in PLAN.items()}


def make_pod(name: str, gpu_mem: int | None) -> Pod:
    limits = {"cpu": "100m", "memory": "64Mi"}
    if gpu_mem is not None:
        limits[GPU_MEM] = str(gpu_mem)
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE),
        spec=PodSpec(
            schedulerName=SCHEDULER_NAME,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/wiring:0",
                    resources=ResourceRequirements(limits=limits),
                )
            ],
        ),
    )


def pod_name(args: dict[str, Any]) -> str:
    return str(args["Pod"]["metadata"]["name"])


def scripted_filter(args: dict[str, Any]) -> dict[str, Any]:
    allowed = PLAN[pod_name(args)][0]
    names = args["NodeNames"] or []
    return {
        "NodeNames": [n for n in names if n in allowed],
        "FailedNodes": {n: "wiring test: not in the plan" for n in names if n not in allowed},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def scripted_prioritize(args: dict[str, Any]) -> list[dict[str, Any]]:
    preferred = PLAN[pod_name(args)][1]
    return [{"Host": n, "Score": 10 if n == preferred else 0} for n in args["NodeNames"] or []]


class ScriptedBinder:
    """The bind verb: POST pods/binding with its own ServiceAccount, the UID as precondition.

    A raw request: lightkube (1.0.1) decodes the 201 ``Status`` answer as a ``Binding`` and
    raises although the bind succeeded (kube-scheduler then sees a failed bind of a pod that is
    in fact bound).
    """

    def __init__(self, control_plane: ControlPlane, token: str) -> None:
        self.control_plane = control_plane
        self.token = token

    def __call__(self, args: dict[str, Any]) -> dict[str, Any]:
        name, namespace = args["PodName"], args["PodNamespace"]
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": args["PodUID"],
                "annotations": {BOUND_BY: "scripted-extender"},
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": args["Node"]},
        }
        status, body = self.control_plane.api_request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
            binding,
            token=self.token,
        )
        if status != 201:
            return {"Error": f"binding {namespace}/{name}: HTTP {status}: {body}"}
        return {"Error": ""}


def wait_for_pods(client: Client, names: list[str], timeout: float = 60.0) -> dict[str, Pod]:
    """Poll until every pod is bound and Running (kwok); return them."""
    pending: dict[str, tuple[str | None, str | None]] = {}  # name -> (node, phase), last seen

    def running() -> dict[str, Pod] | None:
        pods = {n: client.get(Pod, n, namespace=NAMESPACE) for n in names}
        pending.clear()
        for name, pod in pods.items():
            node = pod.spec.nodeName if pod.spec is not None else None
            phase = pod.status.phase if pod.status is not None else None
            if not node or phase != "Running":
                pending[name] = (node, phase)
        return None if pending else pods

    return wait_for(
        "pods bound and Running", running, timeout, detail=lambda: f"(node, phase) {pending}"
    )


def first_call(calls: list[RecordedCall], name: str) -> RecordedCall:
    for call in calls:
        body = call.body
        if isinstance(body, dict) and (
            body.get("PodName") == name
            or (isinstance(body.get("Pod"), dict) and body["Pod"]["metadata"]["name"] == name)
        ):
            return call
    raise AssertionError(f"no call for pod {name}: {[c.path for c in calls]}")


def shape(value: Any) -> Any:
    """The JSON structure without values: key names and value types (lists by first item)."""
    if isinstance(value, dict):
        return {k: shape(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [shape(value[0])] if value else []
    return type(value).__name__


def keep_fixture(name: str, body: Any) -> None:
    """Record ``body`` as a fixture, or check the checked-in fixture's top-level shape."""
    path = FIXTURES / name
    if RECORD:
        FIXTURES.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(body, indent=2) + "\n")
        return
    assert path.exists(), f"{path} missing: run the cluster tests with GPUSHARE_RECORD_FIXTURES=1"
    saved = json.loads(path.read_text())
    top = {k: shape(v) if k != "Pod" else "object" for k, v in body.items()}
    saved_top = {k: shape(v) if k != "Pod" else "object" for k, v in saved.items()}
    assert top == saved_top, f"{path} no longer matches what kube-scheduler sends"


@pytest.fixture
def wiring_cluster(kube: Client) -> Iterator[None]:
    """Three 2 x 16 GiB GPU nodes, one CPU-only node, a namespace; removed afterwards."""
    create_nodes(kube, [*(gpu_node(n, [16, 16]) for n in GPU_NODES), plain_node(CPU_NODE)])
    kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    yield
    # No kube-controller-manager here: delete pods outright, the namespace stays Terminating.
    for pod in kube.list(Pod, namespace=NAMESPACE):
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        kube.delete(Pod, pod.metadata.name, namespace=NAMESPACE, grace_period=0)
    kube.delete(Namespace, NAMESPACE)
    delete_nodes(kube, [*GPU_NODES, CPU_NODE])


@pytest.mark.usefixtures("wiring_cluster")
def test_extender_wiring(control_plane: ControlPlane, kube: Client) -> None:
    binder_token = control_plane.service_account_token(
        "scripted-extender",
        "kube-system",
        [
            PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list", "watch"]),
            PolicyRule(apiGroups=[""], resources=["pods/binding"], verbs=["create"]),
        ],
    )
    with (
        ScriptedExtender(
            on_filter=scripted_filter,
            on_prioritize=scripted_prioritize,
            on_bind=ScriptedBinder(control_plane, binder_token),
        ) as extender,
        control_plane.scheduler(
            "kube-scheduler-wiring",
            profiles=[{"schedulerName": SCHEDULER_NAME}],
            extenders=[gpushare_extender(extender.url_prefix, http_timeout="5s")],
        ),
    ):
        # One at a time, so that each pod's placement depends only on the plan.
        for name in PLAN:
            kube.create(make_pod(name, gpu_mem=4))
            wait_for_pods(kube, [name])
        kube.create(make_pod("cpu-only", gpu_mem=None))
        pods = wait_for_pods(kube, [*PLAN, "cpu-only"])
        assert extender.errors == []
        filters, prioritizes, binds = (extender.calls(v) for v in ("filter", "prioritize", "bind"))

    # Wire format of filter (and prioritize): PascalCase keys, cache mode, JSON POST.
    for call in [*filters, *prioritizes]:
        assert call.method == "POST"
        assert call.content_type.startswith("application/json")
        assert set(call.body) == {"Pod", "Nodes", "NodeNames"}
        assert call.body["Nodes"] is None
        assert all(isinstance(n, str) for n in call.body["NodeNames"])
    for name in PLAN:
        call = first_call(filters, name)
        assert call.path == "/scheduler/filter"
        pod = call.body["Pod"]
        assert pod["metadata"]["namespace"] == NAMESPACE
        assert pod["metadata"]["uid"] == pods[name].metadata.uid  # type: ignore[union-attr]
        assert pod["spec"]["containers"][0]["resources"]["limits"][GPU_MEM] == "4"
        # ignoredByScheduler: false -> NodeResourcesFit drops the node without gpu-mem first.
        assert set(GPU_NODES) <= set(call.body["NodeNames"])
        assert CPU_NODE not in call.body["NodeNames"]

    # Prioritize only when two or more nodes survive the filter.
    assert {pod_name(c.body) for c in prioritizes} == {"gpu-d"}
    assert sorted(first_call(prioritizes, "gpu-d").body["NodeNames"]) == list(PLAN["gpu-d"][0])

    # Bind: the server's verb, with the node kube-scheduler chose.
    for name, expected in EXPECTED_NODE.items():
        call = first_call(binds, name)
        assert call.path == "/scheduler/bind"
        assert set(call.body) == {"PodName", "PodNamespace", "PodUID", "Node"}
        assert call.body["PodNamespace"] == NAMESPACE
        assert call.body["PodUID"] == pods[name].metadata.uid  # type: ignore[union-attr]
        assert call.body["Node"] == expected
        assert call.response == {"Error": ""}

    # The scheduler honoured the filter's node list and the scores; the bind went through us.
    for name, expected in EXPECTED_NODE.items():
        pod = pods[name]
        assert pod.spec is not None
        assert pod.metadata is not None
        assert pod.status is not None
        assert pod.spec.nodeName == expected, name
        assert (pod.metadata.annotations or {}).get(BOUND_BY) == "scripted-extender"
        conditions = {c.type: c.status for c in pod.status.conditions or []}
        assert conditions.get("PodScheduled") == "True"

    # A pod without aliyun.com/gpu-mem skips the extender and is bound by DefaultBinder.
    cpu_only = pods["cpu-only"]
    assert cpu_only.metadata is not None
    assert cpu_only.spec is not None
    assert all(
        c.body.get("PodName") != "cpu-only"
        and (c.body.get("Pod") or {}).get("metadata", {}).get("name") != "cpu-only"
        for c in extender.calls()
    )
    assert cpu_only.spec.nodeName
    assert BOUND_BY not in (cpu_only.metadata.annotations or {})

    keep_fixture("filter_request.json", first_call(filters, "gpu-a").body)
    keep_fixture("prioritize_request.json", first_call(prioritizes, "gpu-d").body)
    keep_fixture("bind_request.json", first_call(binds, "gpu-a").body)
