"""The extender's Prometheus metrics (``GET /metrics``), on an explicit ``CollectorRegistry``.

Series (Prometheus naming, units in the names):

=================================================================  ================================
``gpushare_extender_requests_total{verb,outcome}``                 counter; ``verb`` filter /
                                                                   prioritize / bind; ``outcome``
                                                                   ``ok``, ``error`` (an ``Error``
                                                                   text or a 5xx), ``bad_request``
``gpushare_extender_request_duration_seconds{verb}``               histogram of handling time
``gpushare_gpu_capacity{node,gpu,model,unit}``                     gauge, the GPU's capacity
``gpushare_gpu_allocated{node,gpu,model,unit}``                    gauge, committed + assumed
``gpushare_gpu_pods{node,gpu}``                                    gauge, pods holding the GPU
``gpushare_extender_synced``                                       gauge, 1 once the caches synced
=================================================================  ================================

The per-GPU gauges and ``synced`` are computed at scrape time from the ``ExtenderState`` (its
ledger) by ``StateCollector``, so nothing has to be kept in sync by hand. Amounts are in the
node's unit (the ``unit`` label; empty when unknown, like a missing ``model``). No global
default registry is used: each ``ExtenderMetrics`` owns (or is given) its registry.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from gpushare.extender.state import ExtenderState

VERBS = ("filter", "prioritize", "bind")
OUTCOMES = ("ok", "error", "bad_request")
# Handling is sub-millisecond to tens of milliseconds (1,000 nodes x 8 GPUs); bind waits on the
# API server, hence the long tail.
DURATION_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)


class StateCollector(Collector):
    """Per-GPU capacity, allocation and pod counts, and the sync flag, read at scrape time."""

    def __init__(self, state: ExtenderState) -> None:
        self._state = state

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        capacity, allocated, pods, synced = self._families()
        synced.add_metric([], 1.0 if self._state.synced else 0.0)
        ledger = self._state.ledger
        for info in self._state.nodes():
            if not info.gpushare:
                continue
            node = info.node
            used = ledger.state(node.name).gpu_used
            holders: dict[int, int] = {}
            for allocation in ledger.allocations(node.name):
                for index, amount in allocation.per_gpu().items():
                    if amount:
                        holders[index] = holders.get(index, 0) + 1
            for position, gpu in enumerate(node.gpus):
                labels = [node.name, str(gpu.index), gpu.model or "", info.unit or ""]
                capacity.add_metric(labels, float(gpu.capacity))
                allocated.add_metric(labels, float(used[position]))
                pods.add_metric([node.name, str(gpu.index)], float(holders.get(gpu.index, 0)))
        return [capacity, allocated, pods, synced]

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        gpu_labels = ["node", "gpu", "model", "unit"]
        return (
            GaugeMetricFamily(
                "gpushare_gpu_capacity",
                "GPU memory capacity of a shared GPU, in the node's unit (label unit).",
                labels=gpu_labels,
            ),
            GaugeMetricFamily(
                "gpushare_gpu_allocated",
                "GPU memory allocated on a shared GPU (committed and assumed), in the node's unit.",
                labels=gpu_labels,
            ),
            GaugeMetricFamily(
                "gpushare_gpu_pods",
                "Pods holding an allocation on a shared GPU.",
                labels=["node", "gpu"],
            ),
            GaugeMetricFamily(
                "gpushare_extender_synced",
                "1 once the extender's node and pod caches have synced, else 0.",
            ),
        )


class ExtenderMetrics:
    """The extender's metrics on ``registry`` (a fresh ``CollectorRegistry`` when not given)."""

    def __init__(self, state: ExtenderState, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.requests = Counter(
            "gpushare_extender_requests",
            "Extender requests handled, by verb and outcome.",
            ["verb", "outcome"],
            registry=self.registry,
        )
        self.duration = Histogram(
            "gpushare_extender_request_duration_seconds",
            "Time to handle an extender request, by verb.",
            ["verb"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        for verb in VERBS:
            self.duration.labels(verb)
            for outcome in OUTCOMES:
                self.requests.labels(verb, outcome)
        self.registry.register(StateCollector(state))

    def observe(self, verb: str, outcome: str, seconds: float) -> None:
        """One handled request."""
        self.requests.labels(verb, outcome).inc()
        self.duration.labels(verb).observe(seconds)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
