"""``/inspect`` and ``kubectl inspect gpushare`` report building at scale (docs/extender.md,
"``/inspect`` at scale").

(Not ``bench/inspect.py``: run as a script, that name would shadow the standard library's
``inspect`` module.)
Run: ``.venv/bin/python bench/inspect_report.py [--nodes 1000] [--pods 20000] [--pending 50]
[--rounds 5]`` (``make bench-inspect``).

Set-up: ``--nodes`` GPU-share nodes × 8 GPUs of 16 GiB, ``--pods`` bound GPU pods started by the
device plugin (1 or 2 GiB each, spread over the GPUs) and ``--pending`` unbound GPU pods asking
4 GiB, held by an ``ExtenderState`` as the watch delivers them. Measured in-process as the
handlers do it (``SnapshotReader`` kept between requests, cyclic GC paused, the app's msgspec
encoder), each ``--rounds`` times: the extender's ``/inspect`` (the cluster view:
``cluster_report`` and its JSON encoding; the first request after start, which reads every pod,
is shown apart as "first"; the base line reads every pod again with the cyclic GC on, the
ratio of medians against it is printed), ``/inspect/<node>`` (``node_report`` of one node)
and the kubectl plugin's work after the API reads (``build_report`` of the snapshot and the
summary table, every pod read: the plugin is a fresh process each time; built without pod rows,
as the plugin builds it for the summary; ``-d``, the detail view, with them). Reports median and
p99 (with few rounds, the slowest) in ms of wall-clock time, and of CPU time in brackets (the
work alone: on a shared machine the wall clock also counts waiting for a core). Budgets: cluster
view p99 ≤ 1 s, one node ≤ 50 ms.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np

from gpushare.extender.report import cluster_report, node_report
from gpushare.extender.wire import encode
from gpushare.inspect.gcpause import gc_paused
from gpushare.inspect.render import render_detail, render_summary
from gpushare.inspect.report import Snapshot, SnapshotReader, build_report
from gpushare.testing.extender import populated_state

GPUS_PER_NODE = 8
GPU_GIB = 16


CPU: dict[str, list[float]] = {}
"""CPU milliseconds of each ``timed`` call by label (``time.process_time``: the work alone,
without the time spent waiting for a core on a shared machine)."""


def timed(
    work: Callable[[], object], rounds: int, label: str = "", *, fresh: bool = False
) -> list[float]:
    """Wall-clock milliseconds of ``rounds`` calls of ``work`` (CPU ones kept in ``CPU``).
    ``fresh``: collect garbage before each call, off the clock: the kubectl plugin is a new
    process each run and never pays for a collection of an earlier run's garbage, which
    ``gc_paused`` only defers (without it, a collection of the 20,000 pods' heap lands in a
    later round: 1.0-1.35 s spikes among 0.7-0.9 s rounds)."""
    samples, cpu = [], CPU.setdefault(label, [])
    for _ in range(rounds):
        if fresh:
            gc.collect()
        started, started_cpu = time.perf_counter(), time.process_time()
        work()
        samples.append((time.perf_counter() - started) * 1000)
        cpu.append((time.process_time() - started_cpu) * 1000)
    return samples


def line(name: str, samples: list[float]) -> str:
    p99 = float(np.percentile(samples, 99))
    cpu = CPU.get(name, [])
    tail = ""
    if cpu:
        cpu_p99 = float(np.percentile(cpu, 99))
        tail = f"   (CPU median {statistics.median(cpu):7.1f}, p99 {cpu_p99:7.1f})"
    return f"{name:<34} median {statistics.median(samples):9.1f} ms   p99 {p99:9.1f} ms{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--pending", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    started = time.perf_counter()
    state, names = populated_state(
        args.nodes,
        args.pods,
        pending=args.pending,
        started=True,
        gpus_per_node=GPUS_PER_NODE,
        gpu_gib=GPU_GIB,
    )
    print(
        f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs, {args.pods} bound pods, {args.pending} "
        f"pending; set-up {time.perf_counter() - started:.1f} s"
    )
    one = state.cluster.node(names[len(names) // 2])
    assert one is not None
    nodes, pods = state.cluster.objects()

    reader = SnapshotReader()

    def cluster_view() -> None:
        with gc_paused():
            encode(cluster_report(state, reader))

    def node_view() -> None:
        with gc_paused():
            encode(node_report(state, one))

    def kubectl_view() -> None:  # as the plugin builds its summary table: no pod rows
        with gc_paused():
            render_summary(build_report(Snapshot(nodes, pods), pod_rows=False))

    def kubectl_detail() -> None:
        with gc_paused():
            render_detail(build_report(Snapshot(nodes, pods)))

    def kubectl_node() -> None:
        with gc_paused():
            snapshot = Snapshot(nodes, pods)
            render_summary(build_report(snapshot, node=one.node.name, pod_rows=False))

    def baseline_view() -> None:  # every pod read again, the cyclic GC running
        encode(cluster_report(state))

    views: dict[str, tuple[Callable[[], None], int, bool]] = {  # (work, rounds, fresh)
        "/inspect (cluster view)": (cluster_view, args.rounds, False),
        "/inspect, no reader, GC on (base)": (baseline_view, args.rounds, False),
        "/inspect/<node>": (node_view, max(args.rounds, 20), False),
        "kubectl inspect gpushare": (kubectl_view, args.rounds, True),
        "kubectl inspect gpushare -d": (kubectl_detail, args.rounds, True),
        "kubectl inspect gpushare NODE": (kubectl_node, max(args.rounds, 20), True),
    }
    first = timed(cluster_view, 1, "/inspect first after start")
    results = {
        name: timed(work, rounds, name, fresh=fresh)
        for name, (work, rounds, fresh) in views.items()
    }
    print(line("/inspect first after start", first))
    for name, samples in results.items():
        print(line(name, samples))
    ratio = statistics.median(results["/inspect (cluster view)"]) / statistics.median(
        results["/inspect, no reader, GC on (base)"]
    )
    print(f"cluster view / base: {ratio:.2f} (medians, same run)")
    cluster = float(np.percentile(results["/inspect (cluster view)"], 99))
    node = float(np.percentile(results["/inspect/<node>"], 99))
    kubectl = float(np.percentile(results["kubectl inspect gpushare"], 99))
    kubectl_one = float(np.percentile(results["kubectl inspect gpushare NODE"], 99))
    print(
        f"budgets: cluster view p99 {cluster:.0f} ms (<= 1000: {cluster <= 1000}), "
        f"one node p99 {node:.1f} ms (<= 50: {node <= 50}); kubectl p99 {kubectl:.0f} ms "
        f"(<= 1000: {kubectl <= 1000}), NODE {kubectl_one:.1f} ms (<= 50: {kubectl_one <= 50})"
    )


if __name__ == "__main__":
    main()
