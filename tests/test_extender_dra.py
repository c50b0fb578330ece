"""The extender's ``dra/prioritize`` route (``gpushare extender --dra-scoring``): served only with
it, bounded and decoded like every verb, an empty answer for pods without gpushare's claims and
before the cache has listed. Its scores on the real scheduler: tests/cluster/test_dra_scoring.py."""

from __future__ import annotations

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
    """A scorer on a cache that has not listed (no API server behind it: never started)."""
    return DraScorer(DraCache(cast(AsyncClient, None), DRIVER), extender_policy("bestfit"))


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


def test_a_claim_pod_before_the_cache_has_listed_gets_an_empty_answer() -> None:
    pod = {**PLAIN_POD, "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}]}}
    assert scorer().prioritize(pod, ["n1"]) == []
