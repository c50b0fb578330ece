"""A standing attack on the live extender: every bad input it has been found to mishandle.

``gpushare extender --kubeconfig`` runs as its own process against the real control plane, as
deployed, with short read timeouts and a 1 MiB body limit so that the attacks finish quickly. Every
bad input found in review (``tests/test_extender_app.py`` holds each) is sent over real HTTP (raw
sockets where a request must be left half-sent), then a hypothesis strategy of hostile bodies. After
each: a 4xx (or a closed connection), ``/inspect`` exactly as before, the process alive, and no
traceback in its log.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_IDX,
    ALIYUN_POD,
    ALLOCATION,
    GPU_MEM,
    INVENTORY,
)
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    wait_until,
)
from gpushare.testing.live_extender import http_get
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import delete_namespace

pytestmark = pytest.mark.cluster

NAMESPACE = "attack"
N1, N2 = "attack-n1", "attack-n2"
PREFIX = "/gpushare-scheduler"
WAIT_S = 30.0


@dataclass
class Target:
    """The running extender process and how to reach it."""

    proc: ManagedProcess
    port: int
    http: httpx.Client

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def inspect(self) -> Any:
        status, report = http_get(f"{self.url}{PREFIX}/inspect")
        assert status == 200
        return report

    def post(self, verb: str, body: bytes) -> httpx.Response:
        return self.http.post(f"{PREFIX}/{verb}", content=body)

    def raw(self, data: bytes, *, close_after_send: bool = False) -> bytes:
        """Send ``data`` on a fresh connection; everything read until the server closes it
        (``TimeoutError`` when it does not within ``WAIT_S``)."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S) as conn:
            conn.sendall(data)
            if close_after_send:
                return b""
            received = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := conn.recv(65536):
                    received += chunk
            return received

    def alive(self) -> None:
        self.proc.check_running()
        assert http_get(f"{self.url}/healthz") == (200, {"status": "ok"})

    def log(self) -> str:
        return self.proc.log_path.read_text()


def bound_pod(name: str, node: str, gpu: int, amount: int) -> Pod:
    notes = {ALIYUN_IDX: str(gpu), ALIYUN_POD: str(amount), ALIYUN_ASSIGNED: "true"}
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE, annotations=notes),
        spec=PodSpec(
            nodeName=node,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/attack:0",
                    resources=ResourceRequirements(limits={GPU_MEM: str(amount)}),
                )
            ],
        ),
    )


@pytest.fixture(scope="module")
def target(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        create_nodes(kube, [gpu_node(N1, [16, 16]), gpu_node(N2, [16, 16])])
        stack.callback(delete_nodes, kube, [N1, N2])
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        kube.create(bound_pod("held", N2, 0, 12))
        stack.callback(delete_namespace, kube, NAMESPACE)
        (port,) = free_ports(1)
        argv = gpushare_argv("extender")
        argv += ["--kubeconfig", str(control_plane.kubeconfig), "--host", "127.0.0.1"]
        argv += ["--port", str(port), "--request-head-timeout", "1"]
        argv += ["--request-body-timeout", "1", "--max-request-body-mib", "1"]
        argv += ["--max-connections", "40"]
        proc = ManagedProcess("gpushare-extender-attack", argv, tmp_path_factory.mktemp("attack"))
        proc.start()
        stack.callback(proc.stop)
        url = f"http://127.0.0.1:{port}"
        wait_until(
            "extender /readyz", lambda: http_get(f"{url}/readyz")[0] == 200, WAIT_S,
            processes=[proc],
        )  # fmt: skip
        wait_until(
            "pod held counted",
            lambda: any(
                p["name"] == "held"
                for n in http_get(f"{url}{PREFIX}/inspect")[1]["nodes"] if n["name"] == N2
                for d in n["devs"] for p in d["pods"]
            ),
            WAIT_S, processes=[proc],
        )  # fmt: skip
        http = stack.enter_context(httpx.Client(base_url=url, timeout=WAIT_S, trust_env=False))
        yield Target(proc, port, http)


def gpu_pod_json(name: str, gib: int, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": NAMESPACE, "uid": f"uid-{name}"},
        "spec": {"containers": [{"name": "main", "resources": {"limits": {GPU_MEM: str(gib)}}}],
                 **spec},
    }  # fmt: skip


def head(length: int) -> bytes:
    return (
        f"POST {PREFIX}/filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    ).encode()


DEEP = b'{"Pod": {"metadata": {"name": "d"}, "spec": ' + b'{"a": ' * 50_000 + b"1"
DEEP += b"}" * 50_000 + b'}, "NodeNames": ["attack-n1"]}'
BAD_BODIES = [
    ("invalid UTF-8 in the pod", "filter",
     b'{"Pod": {"metadata": {"name": "p\xff\xfe"}}, "NodeNames": ["attack-n1"]}', 400,
     "not valid UTF-8"),
    ("JSON nested 50,000 deep in the pod", "filter", DEEP, 400, "nested too deep"),
    ("malformed JSON", "prioritize", b'{"Pod": ', 400, "malformed JSON"),
    ("bind without a UID", "bind", b'{"PodName": "a", "PodNamespace": "b", "Node": "n"}', 400,
     "PodUID"),
    ("a body over the limit", "filter", b'{"Pod": {}, "x": "' + b"a" * (2 << 20) + b'"}', 413,
     "--max-request-body-mib"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("verb", "body", "status", "message"),
    [b[1:] for b in BAD_BODIES],
    ids=[b[0] for b in BAD_BODIES],
)
def test_bad_bodies_are_client_errors(
    target: Target, verb: str, body: bytes, status: int, message: str
) -> None:
    before = target.inspect()
    response = target.post(verb, body)
    assert response.status_code == status, response.text
    assert message in response.json()["Error"]
    assert target.inspect() == before
    target.alive()


def test_a_forged_nodes_body_changes_nothing(target: Target) -> None:
    """A forged ``Nodes`` body: N2 sent as 8 x 80 GiB; the ledger keeps the API server's 2 x 16."""
    before = target.inspect()
    forged = json.loads(json.dumps(gpu_node(N2, [80] * 8).to_dict()))
    body = {"Pod": gpu_pod_json("forger", 8), "Nodes": {"items": [forged]}, "NodeNames": None}
    result = target.post("filter", json.dumps(body).encode()).json()
    assert [item["metadata"]["name"] for item in result["Nodes"]["items"]] == [N2]
    assert target.inspect() == before
    n2 = next(n for n in target.inspect()["nodes"] if n["name"] == N2)
    assert [d["totalGPU"] for d in n2["devs"]] == [16, 16]
    big = {"Pod": gpu_pod_json("forger-big", 20), "Nodes": {"items": [forged]}, "NodeNames": None}
    result = target.post("filter", json.dumps(big).encode()).json()
    assert "request is larger than any GPU" in result["FailedAndUnresolvableNodes"][N2]


def test_slow_and_half_sent_requests_are_cut_off(target: Target) -> None:
    before = target.inspect()
    assert target.raw(b"POST /gpushare-scheduler/filter HTT") == b""  # closed
    assert target.raw(head(100 * 1024 * 1024)).startswith(b"HTTP/1.1 413")  # 100 MB announced
    assert target.raw(head(1000) + b'{"Pod": ').startswith(b"HTTP/1.1 408")
    target.raw(head(1000) + b'{"Pod": {"metadata"', close_after_send=True)  # disconnect
    wait_until(
        "the disconnect logged as one line",
        lambda: "client disconnected before sending the whole body" in target.log(),
        WAIT_S,
    )
    # more connections than the cap, all idle: the extras are closed, the rest time out
    conns = [socket.create_connection(("127.0.0.1", target.port)) for _ in range(60)]
    try:
        time.sleep(0.5)  # let the server accept them
        target.proc.check_running()
    finally:
        for conn in conns:
            conn.close()
    wait_until(
        "extender answers after the flood",
        lambda: http_get(f"{target.url}/healthz")[0] == 200,
        WAIT_S,
    )
    assert target.inspect() == before
    target.alive()


# -- hostile bodies -----------------------------------------------------------------------

_leaf = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=12))
_json = st.recursive(
    _leaf,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3), st.dictionaries(st.text(max_size=8), kids, max_size=3)
    ),
    max_leaves=12,
)
_amount = st.one_of(st.integers(-5, 10**20).map(str), st.text(max_size=6))
_annotations = st.dictionaries(
    st.sampled_from([ALIYUN_IDX, ALIYUN_POD, ALIYUN_ASSIGNED, ALLOCATION,
                     "gpushare.io/gpu-count", "gpushare.io/gpu-models"]),
    st.one_of(_amount, _json.map(json.dumps)),
    max_size=3,
)  # fmt: skip
_container = st.fixed_dictionaries(
    {"name": st.text(max_size=6),
     "resources": st.fixed_dictionaries({"limits": st.fixed_dictionaries({GPU_MEM: _amount})})}
)  # fmt: skip
_pod = st.fixed_dictionaries(
    {
        "metadata": st.fixed_dictionaries(
            {"name": st.text(min_size=1, max_size=12), "namespace": st.just(NAMESPACE),
             "uid": st.text(max_size=8), "annotations": _annotations}
        ),
        "spec": st.fixed_dictionaries(
            {"nodeName": st.sampled_from(["", N1, N2]),
             "containers": st.lists(_container, max_size=2)}
        ),
    }
)  # fmt: skip
_names = st.lists(st.sampled_from([N1, N2, "ghost", ""]), max_size=4)
_forged_node = st.builds(
    lambda name, gpus: json.loads(json.dumps(gpu_node(name, gpus).to_dict())),
    st.sampled_from([N1, N2, "forged"]),
    st.lists(st.integers(1, 10**6), min_size=1, max_size=8),
)
_args = st.one_of(
    st.fixed_dictionaries({"Pod": st.one_of(_pod, _json), "NodeNames": st.one_of(_names, _json)}),
    st.fixed_dictionaries(
        {"Pod": _pod, "Nodes": st.fixed_dictionaries({"items": st.lists(_forged_node, max_size=3)})}
    ),
    st.fixed_dictionaries(
        {"PodName": st.text(max_size=8), "PodNamespace": st.just(NAMESPACE),
         "PodUID": st.text(max_size=8), "Node": st.sampled_from([N1, N2, "ghost"])}
    ),
)  # fmt: skip


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    """A body: valid-looking JSON, then maybe cut, spliced with bytes that are not UTF-8, or
    wrapped deep; or raw bytes."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.binary(max_size=200))
    body = json.dumps(draw(_args)).encode()
    change = draw(st.sampled_from(["none", "cut", "splice", "deep"]))
    at = draw(st.integers(0, len(body)))
    if change == "cut":
        return body[:at]
    if change == "splice":
        return body[:at] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + body[at:]
    if change == "deep":
        depth = draw(st.integers(500, 20_000))
        return b'{"Pod": ' + b"[" * depth + b"]" * depth + b', "NodeNames": []}'
    return body


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(verb=st.sampled_from(["filter", "prioritize", "bind"]), body=hostile())
def test_hostile_bodies_never_change_state(target: Target, verb: str, body: bytes) -> None:
    before = target.inspect()
    response = target.post(verb, body)
    assert response.status_code in (200, 400), (response.status_code, response.text)
    answer = response.json()
    if response.status_code == 400:
        assert answer["Error"]
        assert "internal error" not in answer["Error"]
    elif isinstance(answer, dict):
        assert "internal error" not in answer.get("Error", ""), answer
    assert target.inspect() == before


UUIDS = ",".join(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(5000))


def test_a_pod_listing_5000_gpu_uuids_gets_one_short_refusal(target: Target) -> None:
    """A 205 KB ``nvidia.com/use-gpuuuid``: the refusal names a few UUIDs and counts the rest,
    the same short line on every node, so kube-scheduler's status write stays small."""
    pod = gpu_pod_json("many-uuids", 4)
    pod["metadata"]["annotations"] = {"nvidia.com/use-gpuuuid": UUIDS}
    before = target.inspect()
    response = target.post("filter", json.dumps({"Pod": pod, "NodeNames": [N1, N2]}).encode())
    assert response.status_code == 200, response.text
    answer = response.json()
    failed = {
        **(answer.get("FailedNodes") or {}),
        **(answer.get("FailedAndUnresolvableNodes") or {}),
    }
    assert sorted(failed) == [N1, N2]
    (reason,) = set(failed.values())
    assert len(reason) < 400, reason
    assert "4,997 more" in reason
    assert len(response.content) < 2_000
    assert target.inspect() == before


def test_a_node_announcing_a_10_to_the_30_gib_gpu_is_left_out_and_said_to(
    target: Target, control_plane: ControlPlane
) -> None:
    """An inventory of 10^30 GiB on a node whose capacity counts 32: the extender leaves the
    node out with one warning naming the bound, ``kubectl inspect gpushare`` reports it as a
    problem, and the other nodes still take pods."""
    hostile = gpu_node("attack-huge", [16, 16])
    assert hostile.metadata is not None
    assert hostile.metadata.annotations is not None
    document = json.loads(hostile.metadata.annotations[INVENTORY])
    document["gpus"][0]["memory"] = 10**30
    hostile.metadata.annotations[INVENTORY] = json.dumps(document)
    with control_plane.client() as kube:
        create_nodes(kube, [hostile])
        try:
            wait_until(
                "the hostile inventory refused",
                lambda: "node attack-huge cannot be read and is left out" in target.log(),
                WAIT_S, processes=[target.proc],
            )  # fmt: skip
            assert "16,777,216" in target.log()
            body = {"Pod": gpu_pod_json("ordinary", 2), "NodeNames": [N1, "attack-huge"]}
            answer = target.post("filter", json.dumps(body).encode()).json()
            assert answer["NodeNames"] == [N1]
            inspect = subprocess.run(
                [*gpushare_argv("inspect"), "--kubeconfig", str(control_plane.kubeconfig)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert "attack-huge" in inspect.stdout + inspect.stderr
            assert "16,777,216" in inspect.stdout + inspect.stderr
            target.alive()
        finally:
            delete_nodes(kube, ["attack-huge"])


def test_after_the_attacks_no_traceback_and_alive(target: Target) -> None:
    target.alive()
    log = target.log()
    assert "Traceback" not in log, log[-4000:]
