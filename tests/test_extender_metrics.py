"""The extender's ``/metrics`` through its ASGI app, parsed back with prometheus-client's parser.

The state is design.md §1's N1 and N2 (seeded as in ``test_extender_app``) and an empty N3 with
two 16,276 MiB GPUs; the recorded pod (8,138 MiB) filters to N3 and binds there.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gpushare.extender import ExtenderState, create_app
from gpushare.kube.codec import ALIYUN_IDX
from gpushare.testing.extender import (
    RecordingBinder,
    node_json,
    plain_node_json,
    seed_bound_pods,
)

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "extender"
GPU = 16276
N1, N2, N3 = "wiring-gpu-0", "wiring-gpu-1", "wiring-gpu-2"
PREFIX = "/gpushare-scheduler"
POD_MEM = 8138
MODEL = "Tesla-V100-SXM2-16GB"  # gpu_node's default

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def fixture(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((FIXTURES / f"{name}.json").read_text())
    return document


def metrics_state(*, synced: bool = True) -> ExtenderState:
    state = ExtenderState()
    for name in (N1, N2, N3):
        state.upsert_node(node_json(name, [GPU, GPU]))
    state.upsert_node(plain_node_json("cpu-only"))
    seed_bound_pods(state, N1, [GPU, GPU - 4069])
    seed_bound_pods(state, N2, [GPU - 4069, GPU - 4069])
    if synced:
        state.mark_synced()
    return state


def scrape(client: TestClient) -> tuple[Samples, dict[str, str]]:
    """Every sample by (name, labels), and each family's type."""
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(response.text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, types


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


def gpu(node: str, index: int) -> dict[str, str]:
    return {"node": node, "gpu": str(index), "model": MODEL, "unit": "MiB"}


def test_metrics_after_filter_and_bind() -> None:
    state = metrics_state()
    binder = RecordingBinder()
    registry = CollectorRegistry()
    app = create_app(state, binder=binder, expire_interval_s=None, registry=registry)
    filter_request = fixture("filter_request")
    for kind in ("limits", "requests"):
        filter_request["Pod"]["spec"]["containers"][0]["resources"][kind]["aliyun.com/gpu-mem"] = (
            str(POD_MEM)
        )
    with TestClient(app) as client:
        assert client.post(f"{PREFIX}/filter", json=filter_request).json()["NodeNames"] == [N3]
        bound = client.post(f"{PREFIX}/bind", json=fixture("bind_request"))
        assert bound.json() == {"Error": ""}
        assert client.post(f"{PREFIX}/prioritize", content=b"{not json").status_code == 400
        samples, types = scrape(client)
    (call,) = binder.calls
    chosen = int(call.annotations[ALIYUN_IDX])
    other = 1 - chosen

    assert types["gpushare_extender_requests"] == "counter"
    assert types["gpushare_extender_request_duration_seconds"] == "histogram"
    for name in ("gpushare_gpu_capacity", "gpushare_gpu_allocated", "gpushare_gpu_pods"):
        assert types[name] == "gauge"
    assert types["gpushare_extender_synced"] == "gauge"

    requests = "gpushare_extender_requests_total"
    assert samples[key(requests, verb="filter", outcome="ok")] == 1
    assert samples[key(requests, verb="bind", outcome="ok")] == 1
    assert samples[key(requests, verb="prioritize", outcome="bad_request")] == 1
    assert samples[key(requests, verb="prioritize", outcome="ok")] == 0
    assert samples[key(requests, verb="bind", outcome="error")] == 0
    duration = "gpushare_extender_request_duration_seconds"
    for verb in ("filter", "bind", "prioritize"):
        assert samples[key(f"{duration}_count", verb=verb)] == 1
        assert samples[key(f"{duration}_bucket", verb=verb, le="+Inf")] == 1
        assert samples[key(f"{duration}_sum", verb=verb)] >= 0

    # allocated on the bound GPU is exactly what was bound there; the ledger's other GPUs as seeded
    assert samples[key("gpushare_gpu_allocated", **gpu(N3, chosen))] == POD_MEM
    assert samples[key("gpushare_gpu_allocated", **gpu(N3, other))] == 0
    assert samples[key("gpushare_gpu_pods", node=N3, gpu=str(chosen))] == 1
    assert samples[key("gpushare_gpu_pods", node=N3, gpu=str(other))] == 0
    assert samples[key("gpushare_gpu_allocated", **gpu(N1, 0))] == GPU
    assert samples[key("gpushare_gpu_allocated", **gpu(N1, 1))] == GPU - 4069
    assert samples[key("gpushare_gpu_pods", node=N2, gpu="1")] == 1
    for node in (N1, N2, N3):
        for index in (0, 1):
            assert samples[key("gpushare_gpu_capacity", **gpu(node, index))] == GPU
    assert not any(dict(labels).get("node") == "cpu-only" for _, labels in samples)
    assert samples[key("gpushare_extender_synced")] == 1

    # the explicit registry holds the series; the global default registry does not
    assert registry.get_sample_value(requests, {"verb": "bind", "outcome": "ok"}) == 1
    assert REGISTRY.get_sample_value(requests, {"verb": "bind", "outcome": "ok"}) is None


def test_metrics_follow_the_state_at_scrape_time() -> None:
    state = metrics_state(synced=False)
    app = create_app(state, expire_interval_s=None)  # a fresh registry per app
    with TestClient(app) as client:
        before, _ = scrape(client)
        state.mark_synced()
        state.forget_pod(f"default/seed-{N1}-0")
        after, _ = scrape(client)
    assert before[key("gpushare_extender_synced")] == 0
    assert after[key("gpushare_extender_synced")] == 1
    assert before[key("gpushare_gpu_allocated", **gpu(N1, 0))] == GPU
    assert after[key("gpushare_gpu_allocated", **gpu(N1, 0))] == 0
    assert before[key("gpushare_gpu_pods", node=N1, gpu="0")] == 1
    assert after[key("gpushare_gpu_pods", node=N1, gpu="0")] == 0
    # a second app in the same process registers its own series without a clash
    create_app(state, expire_interval_s=None)
