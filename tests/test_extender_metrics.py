"""The extender's ``/metrics`` through its ASGI app, parsed back with prometheus-client's parser.

The request test's state is design.md §1's N1 and N2 (seeded as in ``test_extender_app``) and an
empty N3 with two 16,276 MiB GPUs; the recorded pod (8,138 MiB) filters to N3 and binds there.
The per-GPU gauges are then checked case by case on small states: MiB, GiB and unit-less
(Alibaba) nodes, an unhealthy GPU, pods bound but not yet started by the device plugin, compute
shares and a GPU held whole (docs/compute.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.metrics import ExtenderMetrics, unit_bytes
from gpushare.kube.codec import ALIYUN_IDX, MemoryUnit, allocation_annotations
from gpushare.kube.codec.handshake import ASSIGNED_CONTAINERS
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.extender import (
    RecordingBinder,
    alibaba_node_json,
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
POD_MEM = 8138
MODEL = "Tesla-V100-SXM2-16GB"  # gpu_node's default
MIB, GIB = 2**20, 2**30
GPU_FAMILIES = (
    "gpushare_gpu_memory_capacity_bytes",
    "gpushare_gpu_memory_allocated_bytes",
    "gpushare_gpu_memory_pending_bytes",
    "gpushare_gpu_healthy",
    "gpushare_gpu_pods",
    "gpushare_gpu_compute_allocated_ratio",
    "gpushare_gpu_held_whole",
)

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
        state.cluster.mark_synced()
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


def gpu(node: str, index: int, model: str = MODEL) -> dict[str, str]:
    return {"node": node, "gpu": str(index), "model": model}


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
    for name in GPU_FAMILIES:
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

    # allocated on the bound GPU is exactly what was bound there (in bytes, the node counts
    # MiB), and it is pending until the device plugin starts the pod; the others as seeded
    allocated, pending = "gpushare_gpu_memory_allocated_bytes", "gpushare_gpu_memory_pending_bytes"
    assert samples[key(allocated, **gpu(N3, chosen))] == POD_MEM * MIB
    assert samples[key(allocated, **gpu(N3, other))] == 0
    assert samples[key(pending, **gpu(N3, chosen))] == POD_MEM * MIB
    assert samples[key(pending, **gpu(N3, other))] == 0
    assert samples[key("gpushare_gpu_pods", **gpu(N3, chosen))] == 1
    assert samples[key("gpushare_gpu_pods", **gpu(N3, other))] == 0
    assert samples[key(allocated, **gpu(N1, 0))] == GPU * MIB
    assert samples[key(allocated, **gpu(N1, 1))] == (GPU - 4069) * MIB
    assert samples[key(pending, **gpu(N1, 0))] == 0  # seeded long ago: past the pin timeout
    assert samples[key("gpushare_gpu_pods", **gpu(N2, 1))] == 1
    for node in (N1, N2, N3):
        for index in (0, 1):
            assert samples[key("gpushare_gpu_memory_capacity_bytes", **gpu(node, index))] == (
                GPU * MIB
            )
            assert samples[key("gpushare_gpu_healthy", **gpu(node, index))] == 1
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
        state.cluster.mark_synced()
        state.forget_pod(f"default/seed-{N1}-0")
        after, _ = scrape(client)
    assert before[key("gpushare_extender_synced")] == 0
    assert after[key("gpushare_extender_synced")] == 1
    allocated = "gpushare_gpu_memory_allocated_bytes"
    assert before[key(allocated, **gpu(N1, 0))] == GPU * MIB
    assert after[key(allocated, **gpu(N1, 0))] == 0
    assert before[key("gpushare_gpu_pods", **gpu(N1, 0))] == 1
    assert after[key("gpushare_gpu_pods", **gpu(N1, 0))] == 0
    # a second app in the same process registers its own series without a clash
    create_app(state, expire_interval_s=None)


# -- the per-GPU gauges, case by case ---------------------------------------------------------

NOW_NS = 1_000 * 10**9
"""The wall clock of the cases' states; pods assumed 1 s before it still pin (timeout 300 s)."""


def two_step_pod(state: ExtenderState, node: str, *, started: int) -> None:
    """Pod ``default/two`` on ``node``: container c0 2 units on GPU 0, c1 3 units on GPU 1,
    assumed 1 s ago, the first ``started`` containers answered by the device plugin."""
    info = state.cluster.node(node)
    assert info is not None
    allocation = Allocation(
        "default/two",
        node,
        (ContainerAllocation("c0", (0,), 2), ContainerAllocation("c1", (1,), 3)),
    )
    notes = allocation_annotations(allocation, info.node, now_ns=NOW_NS - 10**9, unit=info.unit)
    notes[ASSIGNED_CONTAINERS] = str(started)
    if started == 2:
        notes["ALIYUN_COM_GPU_MEM_ASSIGNED"] = "true"
    result = state.observe_pod(pod_json("two", [2, 3], node=node, annotations=notes))
    assert result is not None
    assert not isinstance(result, Allocation)
    assert result.ok


def gib_node(state: ExtenderState) -> None:
    state.upsert_node(
        node_json("g", [FakeGpu(0, 16, "T4"), FakeGpu(1, 40, "A100")], unit=MemoryUnit.GIB)
    )


# Each case: a state builder, the handshake timeout, and the expected (family, node, gpu, model)
# -> value for every per-GPU sample (no other per-GPU sample may appear).
Expected = dict[tuple[str, str, int, str], float]
CAP, ALLOC, PEND, HEALTHY, PODS, COMPUTE, WHOLE = GPU_FAMILIES


def gpu_samples(
    node: str, index: int, model: str, *, cap: float, alloc: float, pend: float,
    healthy: float, pods: float, compute: float = 0.0, whole: float = 0.0,
) -> Expected:  # fmt: skip
    values = {CAP: cap, ALLOC: alloc, PEND: pend, HEALTHY: healthy, PODS: pods,
              COMPUTE: compute, WHOLE: whole}  # fmt: skip
    return {(family, node, index, model): value for family, value in values.items()}


def build_mib(state: ExtenderState) -> None:
    state.upsert_node(node_json("m", [GPU, GPU]))
    state.upsert_node(plain_node_json("cpu-only"))
    seed_bound_pods(state, "m", [1000])


def build_alibaba(state: ExtenderState) -> None:
    state.upsert_node(alibaba_node_json("a", 32, 2))


def build_unhealthy(state: ExtenderState) -> None:
    state.upsert_node(
        node_json(
            "u", [FakeGpu(0, 16, "T4"), FakeGpu(1, 16, "T4", healthy=False)], unit=MemoryUnit.GIB
        )
    )


def build_partly_started(state: ExtenderState) -> None:
    gib_node(state)
    two_step_pod(state, "g", started=1)


def build_started(state: ExtenderState) -> None:
    gib_node(state)
    two_step_pod(state, "g", started=2)


Limits = dict[str, str | int]
TENCENT_SHARE: Limits = {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 32}  # 8 GiB
HAMI_SHARE: Limits = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 30}
TENCENT_WHOLE: Limits = {"tencent.com/vcuda-core": 100}
HAMI_QUARTER: Limits = {"nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 25}


def dialect_pods(state: ExtenderState, pods: dict[str, tuple[Limits, ContainerAllocation]]) -> None:
    """Bound, started pods ``default/<name>`` on node ``g``, one container ``main`` each
    (its limits, what it got)."""
    info = state.cluster.node("g")
    assert info is not None
    for name, (limits, container) in pods.items():
        pod = dialect_pod_json(name, {"main": limits})
        result = state.observe_pod(bound_dialect_pod(pod, info.node, [container]))
        assert result is not None
        assert not isinstance(result, Allocation)
        assert result.ok, result


def build_compute_shares(state: ExtenderState) -> None:
    gib_node(state)
    dialect_pods(
        state,
        {
            "tencent": (TENCENT_SHARE, ContainerAllocation("main", (1,), 8, compute_milli=500)),
            "hami": (HAMI_SHARE, ContainerAllocation("main", (1,), 2, compute_milli=300)),
        },
    )
    seed_bound_pods(state, "g", [4])  # an Alibaba pod: memory, no compute


def build_whole_gpu(state: ExtenderState) -> None:
    gib_node(state)
    whole = ContainerAllocation("main", (1,), 40, compute_milli=1000, exclusive=True)
    share = ContainerAllocation("main", (0,), 2, compute_milli=250)
    dialect_pods(state, {"whole": (TENCENT_WHOLE, whole), "share": (HAMI_QUARTER, share)})


GAUGE_CASES: list[tuple[str, Callable[[ExtenderState], None], float, Expected]] = [
    (
        "MiB node: units x 2^20 bytes; nodes without GPUs are not exported",
        build_mib,
        300.0,
        gpu_samples("m", 0, MODEL, cap=GPU * MIB, alloc=1000 * MIB, pend=0, healthy=1, pods=1)
        | gpu_samples("m", 1, MODEL, cap=GPU * MIB, alloc=0, pend=0, healthy=1, pods=0),
    ),
    (
        "Alibaba node without a unit: GiB assumed, no model",
        build_alibaba,
        300.0,
        gpu_samples("a", 0, "", cap=16 * GIB, alloc=0, pend=0, healthy=1, pods=0)
        | gpu_samples("a", 1, "", cap=16 * GIB, alloc=0, pend=0, healthy=1, pods=0),
    ),
    (
        "unhealthy GPU is 0",
        build_unhealthy,
        300.0,
        gpu_samples("u", 0, "T4", cap=16 * GIB, alloc=0, pend=0, healthy=1, pods=0)
        | gpu_samples("u", 1, "T4", cap=16 * GIB, alloc=0, pend=0, healthy=0, pods=0),
    ),
    (
        "pod with one of two containers started: the other container's memory is pending",
        build_partly_started,
        300.0,
        gpu_samples("g", 0, "T4", cap=16 * GIB, alloc=2 * GIB, pend=0, healthy=1, pods=1)
        | gpu_samples("g", 1, "A100", cap=40 * GIB, alloc=3 * GIB, pend=3 * GIB, healthy=1, pods=1),
    ),
    (
        "pod not started, pin rule off (timeout 0): allocated, nothing pending",
        build_partly_started,
        0.0,
        gpu_samples("g", 0, "T4", cap=16 * GIB, alloc=2 * GIB, pend=0, healthy=1, pods=1)
        | gpu_samples("g", 1, "A100", cap=40 * GIB, alloc=3 * GIB, pend=0, healthy=1, pods=1),
    ),
    (
        "pod fully started (assigned): nothing pending",
        build_started,
        300.0,
        gpu_samples("g", 0, "T4", cap=16 * GIB, alloc=2 * GIB, pend=0, healthy=1, pods=1)
        | gpu_samples("g", 1, "A100", cap=40 * GIB, alloc=3 * GIB, pend=0, healthy=1, pods=1),
    ),
    (
        "compute shares add up in GPUs (500 + 300 milli is 0.8); a pod asking none adds 0",
        build_compute_shares,
        300.0,
        gpu_samples("g", 0, "T4", cap=16 * GIB, alloc=4 * GIB, pend=0, healthy=1, pods=1)
        | gpu_samples(
            "g", 1, "A100", cap=40 * GIB, alloc=10 * GIB, pend=0, healthy=1, pods=2, compute=0.8
        ),
    ),
    (
        "a GPU held whole: flag 1, all its compute and memory allocated; its neighbour shared",
        build_whole_gpu,
        300.0,
        gpu_samples(
            "g", 0, "T4", cap=16 * GIB, alloc=2 * GIB, pend=0, healthy=1, pods=1, compute=0.25
        )
        | gpu_samples(
            "g",
            1,
            "A100",
            cap=40 * GIB,
            alloc=40 * GIB,
            pend=0,
            healthy=1,
            pods=1,
            compute=1.0,
            whole=1.0,
        ),
    ),
]


@pytest.mark.parametrize(
    ("build", "timeout_s", "expected"),
    [case[1:] for case in GAUGE_CASES],
    ids=[case[0] for case in GAUGE_CASES],
)
def test_gpu_gauges(
    build: Callable[[ExtenderState], None], timeout_s: float, expected: Expected
) -> None:
    state = ExtenderState(handshake_timeout_s=timeout_s, wall_clock_ns=lambda: NOW_NS)
    build(state)
    content, content_type = ExtenderMetrics(state).exposition()
    assert content_type.startswith("text/plain")
    found: Expected = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(content.decode()):
        types[family.name] = family.type
        if family.name not in GPU_FAMILIES:
            continue
        for sample in family.samples:
            assert set(sample.labels) == {"node", "gpu", "model"}, sample
            labels = sample.labels
            found[(sample.name, labels["node"], int(labels["gpu"]), labels["model"])] = sample.value
    assert found == expected
    assert all(types[name] == "gauge" for name in GPU_FAMILIES)


@pytest.mark.parametrize(
    ("unit", "expected"),
    [(MemoryUnit.GIB, GIB), (MemoryUnit.MIB, MIB), (None, GIB)],
    ids=["GiB", "MiB", "unknown is GiB"],
)
def test_unit_bytes(unit: MemoryUnit | None, expected: int) -> None:
    assert unit_bytes(unit) == expected


def allocated(content: bytes) -> dict[tuple[str, int], float]:
    """``gpushare_gpu_memory_allocated_bytes`` by (node, gpu) in a scrape."""
    return {
        (s.labels["node"], int(s.labels["gpu"])): s.value
        for family in text_string_to_metric_families(content.decode())
        if family.name == "gpushare_gpu_memory_allocated_bytes"
        for s in family.samples
    }


def test_the_gpu_gauges_follow_every_change_and_render_only_changed_nodes() -> None:
    """A scrape re-renders only the nodes whose version changed (docs: "At scale"): a bind shows
    at the next scrape, an untouched node's lines are the very ones kept, a removed node is
    gone, and a model with a quote and a backslash is escaped as prometheus-client escapes it."""
    state = metrics_state()
    metrics = ExtenderMetrics(state)
    first = allocated(metrics.exposition()[0])
    assert first[(N3, 0)] == 0
    assert metrics.gpus.renders == 3  # N1, N2, N3; the CPU node has no GPU series
    state.reservations.assume(Allocation("ns/p", N3, (ContainerAllocation("main", (0,), POD_MEM),)))
    second = allocated(metrics.exposition()[0])
    assert second[(N3, 0)] == POD_MEM * MIB
    assert {k: v for k, v in second.items() if k[0] != N3} == {
        k: v for k, v in first.items() if k[0] != N3
    }
    assert metrics.gpus.renders == 4  # N3 alone rendered again
    assert allocated(metrics.exposition()[0]) == second
    assert metrics.gpus.renders == 4  # nothing changed, nothing rendered
    state.remove_node(N2)
    assert {node for node, _ in allocated(metrics.exposition()[0])} == {N1, N3}
    odd = 'Tesla "X" \\ 16GB'
    state.upsert_node(node_json("odd", [FakeGpu(0, GPU, odd)]))
    families = text_string_to_metric_families(metrics.exposition()[0].decode())
    models = {
        s.labels["model"] for f in families for s in f.samples if s.labels.get("node") == "odd"
    }
    assert models == {odd}
