"""The forward hop trusts nothing the Lease says, on the real API server (docs/install.md,
"High availability").

Two ``gpushare extender`` processes with leader election and TLS as the chart runs them:
certificates from one release CA for the Service's DNS name, ``--peer-ca``,
``--peer-server-name``, ``--peer-selector`` naming two replica Pod objects whose status says
127.0.0.1 (the processes' address). Then an attacker who may ``update`` the Lease rewrites its
``gpushare.io/leader-url`` over and over, to:

* a server on 127.0.0.2 with a certificate for the same name from another CA: not a replica's
  address;
* the same server on 127.0.0.1 (a replica's address): its certificate fails verification;
* the real leader's peer port with a path, or over ``http``: not ``https://<IP>:<port>``.

Each time the follower refuses the verb and says why, and the attacker's server never receives
a request. The leader's peer listener refuses a client without the release CA's certificate,
and, with the Lease left alone, the follower forwards to the real leader as before.
"""

from __future__ import annotations

import contextlib
import ssl
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest
import uvicorn
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gpushare.extender.forward import LEADER_URL_ANNOTATION
from gpushare.testing.controlplane import ControlPlane, free_ports, wait_for
from gpushare.testing.extender import pod_json
from gpushare.testing.failover import Replica
from gpushare.testing.pki import Ca, Pair
from gpushare.testing.rbac import EXTENDER_RULES

pytestmark = pytest.mark.cluster

NAMESPACE = "kube-system"
SERVER_NAME = "gpushare-extender.trust.svc"
LABELS = {"app": "trust-extender"}
PREFIX = "/gpushare-scheduler"


@dataclass
class Evil:
    """An HTTPS server that records every request it gets."""

    pair: Pair
    host: str
    port: int
    received: list[str] = field(default_factory=list)
    _server: uvicorn.Server | None = None

    def __enter__(self) -> Evil:
        async def anything(request: Request) -> JSONResponse:
            self.received.append(f"{request.method} {request.url.path}")
            return JSONResponse({"NodeNames": [], "Error": "evil says no"})

        app = Starlette(routes=[Route("/{path:path}", anything, methods=["GET", "POST"])])
        self._server = uvicorn.Server(
            uvicorn.Config(
                app, host=self.host, port=self.port, log_config=None, lifespan="off",
                ssl_certfile=str(self.pair.cert), ssl_keyfile=str(self.pair.key),
            )
        )  # fmt: skip
        threading.Thread(target=self._server.run, daemon=True).start()
        wait_for("the attacker's server", lambda: (self._server and self._server.started) or None)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.should_exit = True


@dataclass
class Stack:
    kube: Client
    replicas: list[Replica]
    peer_ports: dict[int, int]  # replica index -> its peer port
    lease: str
    ca: Ca
    pair: Pair

    def leader(self) -> Replica | None:
        with contextlib.suppress(Exception):
            lease = self.kube.get(Lease, self.lease, namespace=NAMESPACE)
            holder = lease.spec.holderIdentity if lease.spec is not None else None
            found = [r for r in self.replicas if r.identity == holder]
            return found[0] if found else None
        return None

    def follower(self) -> Replica:
        leader = self.leader()
        (other,) = [r for r in self.replicas if r is not leader]
        return other


def replica_pod(name: str) -> Pod:
    """A Pod object standing for a replica process (status set by the test: 127.0.0.1)."""
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE, labels=LABELS),
        spec=PodSpec(
            nodeName="nowhere",
            containers=[Container(name="extender", image="registry.invalid/gpushare:0")],
        ),
    )


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    pki = tmp_path_factory.mktemp("pki")
    ca = Ca.create(pki / "release")
    pair = ca.sign("replica", dns=[SERVER_NAME], ips=["127.0.0.1"])
    suffix = uuid.uuid4().hex[:6]
    with contextlib.ExitStack() as exits:
        kube = exits.enter_context(control_plane.client())
        for i in range(2):
            name = f"trust-replica-{suffix}-{i}"
            kube.create(replica_pod(name))
            kube.patch(
                Pod.Status, name, {"status": {"podIP": "127.0.0.1", "phase": "Running"}},
                namespace=NAMESPACE, patch_type=PatchType.MERGE,
            )  # fmt: skip
            exits.callback(kube.delete, Pod, name, namespace=NAMESPACE, grace_period=0)
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-trust", NAMESPACE, EXTENDER_RULES
        )
        lease = f"gpushare-trust-{suffix}"
        ports = free_ports(4)
        peer_ports = {0: ports[2], 1: ports[3]}
        replicas = []
        for i in range(2):
            args = (
                f"--tls-cert={pair.cert}", f"--tls-key={pair.key}", f"--peer-ca={ca.cert}",
                f"--peer-server-name={SERVER_NAME}", f"--peer-port={peer_ports[i]}",
                "--peer-selector=app=trust-extender", "--log-level=debug",
            )  # fmt: skip
            replica = Replica(
                i, ports[i], kubeconfig, lease, control_plane.root / "trust", args=args
            )
            replica.start()
            exits.callback(replica.stop)
            replicas.append(replica)
        stack = Stack(kube, replicas, peer_ports, lease, ca, pair)
        wait_for("a leader", stack.leader, 90)
        for replica in replicas:

            def ready(r: Replica = replica) -> bool | None:
                return https_ready(r, ca) or None

            wait_for(f"{replica.identity} ready", ready, 60)
        yield stack


def https_ready(replica: Replica, ca: Ca) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        answer = httpx.get(
            f"https://127.0.0.1:{replica.port}/readyz", verify=trusting(ca), timeout=2
        )
        return answer.status_code == 200
    return False


def filter_on(stack: Stack, replica: Replica) -> dict[str, Any]:
    """A filter request to ``replica`` (HTTPS, the release CA), its answer."""
    body = {"Pod": pod_json("p", 4), "NodeNames": []}
    answer = httpx.post(
        f"https://127.0.0.1:{replica.port}{PREFIX}/filter",
        json=body, verify=trusting(stack.ca), timeout=30,
    )  # fmt: skip
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


def rewritten(stack: Stack, url: str, why: str) -> str:
    """Rewrite the Lease's leader URL again and again (the leader writes it back at every
    renewal) until the follower refuses a filter; its refusal."""
    stop = threading.Event()

    def attack() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                stack.kube.patch(
                    Lease, stack.lease,
                    {"metadata": {"annotations": {LEADER_URL_ANNOTATION: url}}},
                    namespace=NAMESPACE, patch_type=PatchType.MERGE,
                )  # fmt: skip
            time.sleep(0.05)

    thread = threading.Thread(target=attack, daemon=True)
    thread.start()
    try:
        last = [""]

        def refused() -> str | None:
            last[0] = str(filter_on(stack, stack.follower()).get("Error", ""))
            return last[0] if why in last[0] else None

        what = f"the follower to refuse {url!r} for {why!r}"
        return wait_for(what, refused, 30, detail=lambda: f"Error {last[0]!r}")
    finally:
        stop.set()
        thread.join(5)


def test_a_follower_forwards_to_the_verified_leader(stack: Stack) -> None:
    """The leader's own answer (no nodes: none passes, no error), once the follower has
    observed the Lease (its elector reads it every second)."""

    def forwarded() -> bool | None:
        return filter_on(stack, stack.follower()).get("Error", "") == "" or None

    wait_for("the follower forwards to the leader", forwarded, 30)


@pytest.mark.parametrize(
    ("where", "why"),
    [
        pytest.param("elsewhere", "is not the IP of a replica pod", id="not a replica's address"),
        pytest.param("replica address", "failed TLS verification", id="another CA's certificate"),
        pytest.param("path", "carries a path", id="a path after the leader's address"),
        pytest.param("http", "scheme http", id="plain http"),
    ],
)
def test_a_rewritten_lease_is_refused_and_the_attacker_gets_nothing(
    stack: Stack, tmp_path: Path, where: str, why: str
) -> None:
    other = Ca.create(tmp_path / "evil")
    evil_pair = other.sign("evil", dns=[SERVER_NAME], ips=["127.0.0.1", "127.0.0.2"])
    host = "127.0.0.2" if where == "elsewhere" else "127.0.0.1"
    (port,) = free_ports(1)
    leader = stack.leader()
    assert leader is not None
    peer = stack.peer_ports[leader.index]
    url = {
        "elsewhere": f"https://{host}:{port}",
        "replica address": f"https://{host}:{port}",
        "path": f"https://127.0.0.1:{peer}/evil/filter?x=",
        "http": f"http://127.0.0.1:{peer}",
    }[where]
    with Evil(evil_pair, host, port) as evil:
        refusal = rewritten(stack, url, why)
        assert "refused" in refusal
        assert f"names leader URL '{url}'" in refusal
        assert evil.received == []


def test_the_peer_port_requires_the_release_cas_client_certificate(
    stack: Stack, tmp_path: Path
) -> None:
    leader = stack.leader()
    assert leader is not None
    url = f"https://127.0.0.1:{stack.peer_ports[leader.index]}/healthz"
    with pytest.raises(httpx.HTTPError):  # refused in the handshake or on the first read
        httpx.get(url, verify=trusting(stack.ca), timeout=5)
    stranger = Ca.create(tmp_path / "stranger").sign("client", usages=["clientAuth"])
    with pytest.raises(httpx.HTTPError):
        httpx.get(url, verify=client_context(stack.ca, stranger), timeout=5)
    answer = httpx.get(url, verify=client_context(stack.ca, stack.pair), timeout=5)
    assert answer.status_code == 200


def trusting(ca: Ca) -> ssl.SSLContext:
    """Trust ``ca`` only."""
    return ssl.create_default_context(cafile=str(ca.cert))


def client_context(ca: Ca, pair: Pair) -> ssl.SSLContext:
    """Trust ``ca``, present ``pair``."""
    context = ssl.create_default_context(cafile=str(ca.cert))
    context.load_cert_chain(pair.cert, pair.key)
    return context
