"""A follower's verbs (``gpushare.extender.forward``): each is counted by what happened to it.

``divert`` answers a verb instead of this replica's scheduler; ``/metrics`` then counts it as
``forwarded`` only when the leader gave the answer, and as ``refused`` when there was no leader
to forward to, so an operator (and ``tests/cluster/test_extender_failover.py``, which reads
``forwarded``) can tell forwarding from refusing. A replica with no Lease holder to forward to
refuses: filter and bind with an ``Error`` text (HTTP 200), prioritize with a 503, both closing
the connection. The forwarding itself, to a real leader, is proved on a cluster
(``tests/cluster/test_extender_failover.py``).
"""

from __future__ import annotations

import asyncio
from typing import cast

import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import Response
from starlette.testclient import TestClient

from gpushare.extender import ExtenderState, create_app
from gpushare.extender.app import Diverted
from gpushare.extender.forward import LeaderForwarder
from gpushare.extender.leadership import Leadership
from gpushare.kube.client import AsyncClient
from gpushare.kube.lease import LeaderElector, LeaseConfig
from gpushare.testing.extender import pod_json

PREFIX = "/gpushare-scheduler"
FILTER = {"Pod": pod_json("p", 4), "NodeNames": []}


def requests_counted(metrics: str, verb: str) -> dict[str, float]:
    """``gpushare_extender_requests_total`` of ``verb`` by outcome, the non-zero ones."""
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "gpushare_extender_requests_total"
        and sample.labels["verb"] == verb
        and sample.value
    }


DIVERSIONS = [
    ("the leader answered: forwarded", Diverted(Response(b"{}"), forwarded=True), "forwarded"),
    ("no leader to forward to: refused", Diverted(Response(b"{}"), forwarded=False), "refused"),
    ("this replica decides: ok", None, "ok"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("diverted", "outcome"), [d[1:] for d in DIVERSIONS], ids=[d[0] for d in DIVERSIONS]
)
def test_a_diverted_verb_is_counted_by_what_happened(
    diverted: Diverted | None, outcome: str
) -> None:
    async def divert(request: Request, body: bytes) -> Diverted | None:
        return diverted

    state = ExtenderState()
    state.cluster.mark_synced()
    app = create_app(state, expire_interval_s=None, divert=divert)
    with TestClient(app) as client:
        assert client.post(f"{PREFIX}/filter", json=FILTER).status_code == 200
        metrics = client.get("/metrics").text
    assert requests_counted(metrics, "filter") == {outcome: 1.0}


def test_with_no_leader_to_forward_to_a_follower_refuses_and_counts_it() -> None:
    config = LeaseConfig("kube-system", "gpushare-extender", "me", 8.0, 6.0, 1.0)
    elector = LeaderElector(cast(AsyncClient, object()), config)  # never campaigns here

    async def rebuild() -> None:
        return None

    forwarder = LeaderForwarder(Leadership(elector, rebuild))
    state = ExtenderState()
    state.cluster.mark_synced()
    app = create_app(state, expire_interval_s=None, divert=forwarder.divert)
    try:
        with TestClient(app) as client:
            filtered = client.post(f"{PREFIX}/filter", json=FILTER)
            prioritized = client.post(f"{PREFIX}/prioritize", json=FILTER)
            metrics = client.get("/metrics").text
    finally:
        asyncio.run(forwarder.aclose())
    assert filtered.status_code == 200
    assert filtered.json()["Error"] == (
        "gpushare replica me is not the leader (Lease kube-system/gpushare-extender not held); "
        "retry"
    )
    assert prioritized.status_code == 503
    assert filtered.headers["connection"] == prioritized.headers["connection"] == "close"
    assert requests_counted(metrics, "filter") == {"refused": 1.0}
    assert requests_counted(metrics, "prioritize") == {"refused": 1.0}
