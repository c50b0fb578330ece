"""``gpushare.testing.metrics.sample_sum`` reads a real ``/metrics`` endpoint (prometheus-client's
own HTTP server on loopback) the way the failover and real-node harnesses use it."""

from __future__ import annotations

import urllib.error
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, start_http_server

from gpushare.testing.metrics import sample_sum

REQUESTS = "gpushare_extender_requests_total"


@pytest.fixture(scope="module")
def metrics_url() -> Iterator[str]:
    registry = CollectorRegistry()
    requests = Counter(
        "gpushare_extender_requests", "Requests", ["verb", "outcome"], registry=registry
    )
    requests.labels("filter", "forwarded").inc(3)
    requests.labels("bind", "forwarded").inc(2)
    requests.labels("filter", "ok").inc(7)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


@pytest.mark.parametrize(
    ("name", "labels", "expected"),
    [
        (REQUESTS, {"outcome": "forwarded"}, 5.0),  # summed over the other labels
        (REQUESTS, {"outcome": "forwarded", "verb": "bind"}, 2.0),
        (REQUESTS, {}, 12.0),
        (REQUESTS, {"outcome": "rejected"}, 0.0),  # no such sample
        ("gpushare_extender_requests", {}, 0.0),  # the family name is no sample's name
    ],
    ids=["one label", "two labels", "no label", "no match", "family name"],
)
def test_sample_sum_adds_the_matching_samples(
    metrics_url: str, name: str, labels: dict[str, str], expected: float
) -> None:
    assert sample_sum(metrics_url, name, labels) == expected


def test_sample_sum_raises_when_nothing_answers() -> None:
    with pytest.raises(urllib.error.URLError, match="refused"):
        sample_sum("http://127.0.0.1:9/metrics", REQUESTS, timeout_s=2.0)
