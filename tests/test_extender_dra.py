"""The extender's ``dra/prioritize`` route (``gpushare extender --dra-scoring``): served only with
it, bounded and decoded like every verb, an empty answer for pods without gpushare's claims and
when the cache has not listed within the wait. Its scores on the real scheduler, and its wait
for claims its watch has not delivered yet: tests/cluster/test_dra_scoring.py."""

from __future__ import annotations

import asyncio
import logging
from typing import cast

import pytest
from starlette.testclient import TestClient

from gpushare.extender import ExtenderState, create_app
from gpushare.extender.dra import DraScorer, candidate_names
from gpushare.extender.scoring import extender_policy
from gpushare.extender.wire import ExtenderArgs, NodeList
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec.dra import DRIVER
from gpushare.kube.dracache import DraCache

URL = "/gpushare-scheduler/dra/prioritize"
PLAIN_POD = {"metadata": {"namespace": "ns", "name": "p"}, "spec": {"containers": []}}


def scorer() -> DraScorer:
    """A scorer on a cache that has not listed (no API server behind it: never started), that
    waits 0.05 s for it."""
    cache = DraCache(cast(AsyncClient, None), DRIVER)
    return DraScorer(cache, extender_policy("bestfit"), claim_wait_s=0.05)


def test_the_route_is_served_only_with_dra_scoring() -> None:
    body = {"Pod": PLAIN_POD, "NodeNames": ["n1"]}
    with TestClient(create_app(ExtenderState(), expire_interval_s=None)) as client:
        assert client.post(URL, json=body).status_code == 404
    with TestClient(create_app(ExtenderState(), expire_interval_s=None, dra=scorer())) as client:
        answer = client.post(URL, json=body)
        assert (answer.status_code, answer.json()) == (200, [])
        refused = client.post(URL, content=b"{not json")
        assert refused.status_code == 400
        assert "prioritize" in refused.text


@pytest.mark.parametrize(
    ("args", "names"),
    [
        pytest.param(ExtenderArgs(pod={}, node_names=["a", "b", "a"]), ["a", "b"], id="names"),
        pytest.param(ExtenderArgs(pod={}, nodes=NodeList(items=[
            {"metadata": {"name": "a"}}, {"metadata": {}}, {"metadata": {"name": "c"}}])),
            ["a", "c"], id="nodes, one without a name"),
    ],
)  # fmt: skip
def test_the_candidates_are_the_requests_nodes_each_once(
    args: ExtenderArgs, names: list[str]
) -> None:
    assert candidate_names(args) == names


def test_a_claim_pod_the_cache_has_not_listed_within_the_wait_gets_an_empty_answer(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pod = {**PLAIN_POD, "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}
    with caplog.at_level(logging.WARNING, logger="gpushare.extender.dra"):
        assert asyncio.run(scorer().prioritize(pod, ["n1"])) == []
    assert "pod ns/p not scored after 0.05 s: ResourceSlices and ResourceClaims are not listed" in (
        caplog.text
    )
