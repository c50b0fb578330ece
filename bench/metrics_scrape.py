"""The extender's ``/metrics`` scrape at scale (docs/extender.md, "5,000 nodes": a scrape at
40,000 GPUs took 2.2–3.1 s on the event loop and stalled filter).

Run: ``.venv/bin/python bench/metrics_scrape.py [--nodes 5000] [--pods 50000] [--changed 100]
[--rounds 5]`` (``make bench-metrics``).

Set-up: ``populated_state`` (``--nodes`` × 8 GPUs of 16 GiB, ``--pods`` bound pods), and
``ExtenderMetrics.exposition`` called as ``GET /metrics`` calls it. Measured, ``--rounds`` times
each, in ms of wall-clock time (CPU time in brackets):

* **first**: the first scrape after start, every node rendered;
* **steady**: a scrape with nothing changed since the last;
* **churn**: a scrape after ``--changed`` nodes each took a new pod (a scheduling burst
  between two scrapes);
* **base line**: the same per-GPU samples (``gpu_samples``) built as prometheus-client
  ``GaugeMetricFamily`` objects and written by its ``generate_latest``, every scrape (how the
  extender scraped before ``GpuSeries``). The ratios of medians against it are printed.

The outputs are checked equal, sample for sample, to the base line's before timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.extender.metrics import GPU_FAMILIES, ExtenderMetrics, gpu_samples
from gpushare.extender.state import ExtenderState
from gpushare.testing.extender import populated_state


class BaseLine(Collector):
    """The per-GPU gauges as prometheus-client objects, built anew on every scrape."""

    def __init__(self, state: ExtenderState) -> None:
        self._state = state

    def collect(self) -> Iterable[Metric]:
        state = self._state
        labelled = ["node", "gpu", "model"]
        families = [GaugeMetricFamily(n, h, labels=labelled) for n, h in GPU_FAMILIES]
        for info in state.cluster.nodes():
            if not info.gpushare:
                continue
            for gpu, values in gpu_samples(state, info):
                labels = [info.node.name, str(gpu.index), gpu.model or ""]
                for family, value in zip(families, values, strict=True):
                    family.add_metric(labels, value)
        return families


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    names = {name for name, _ in GPU_FAMILIES}
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        if family.name in names
        for s in family.samples
    }


def timed(work: Callable[[], object], rounds: int, before: Callable[[], None]) -> list[float]:
    """(wall ms, CPU ms) medians of ``rounds`` calls, ``before`` run off the clock each time."""
    wall, cpu = [], []
    for _ in range(rounds):
        before()
        w, c = time.perf_counter(), time.process_time()
        work()
        wall.append((time.perf_counter() - w) * 1000)
        cpu.append((time.process_time() - c) * 1000)
    return [statistics.median(wall), statistics.median(cpu)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--changed", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"building {args.nodes} nodes x 8 GPUs, {args.pods} pods ...", flush=True)
    state, names = populated_state(args.nodes, args.pods, started=True)
    base = CollectorRegistry()
    base.register(BaseLine(state))
    serial = iter(range(10**9))

    def churn() -> None:
        for name in names[: args.changed]:
            pod = f"bench/churn-{next(serial)}"
            state.reservations.assume(
                Allocation(pod, name, (ContainerAllocation("main", (7,), 0),))
            )

    assert samples(ExtenderMetrics(state).exposition()[0]) == samples(generate_latest(base))
    print("outputs equal: every per-GPU sample", flush=True)

    def fresh() -> ExtenderMetrics:
        return ExtenderMetrics(state)

    holder: list[ExtenderMetrics] = []

    def scrape_newest() -> None:
        holder[-1].exposition()

    first = timed(scrape_newest, args.rounds, lambda: holder.append(fresh()))
    metrics = fresh()
    metrics.exposition()
    steady = timed(metrics.exposition, args.rounds, lambda: None)
    churned = timed(metrics.exposition, args.rounds, churn)
    baseline = timed(lambda: generate_latest(base), args.rounds, lambda: None)
    gpus = args.nodes * 8
    print(f"/metrics at {gpus:,} GPUs ({args.rounds} rounds, median ms wall [CPU]):")
    for label, (wall, cpu) in [
        ("base line (prometheus-client objects)", baseline),
        ("first scrape (every node rendered)", first),
        ("steady (nothing changed)", steady),
        (f"churn ({args.changed} nodes changed)", churned),
    ]:
        print(f"  {label:40s} {wall:9.1f} [{cpu:9.1f}]  {wall / baseline[0]:.3f}x")


if __name__ == "__main__":
    main()
