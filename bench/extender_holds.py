"""Filter and prioritize of one pod over nodes with preemption holds, cached and not
(``gpushare.extender.scheduler`` module doc, "Caches on nodes with preemption holds").

Run: ``.venv/bin/python bench/extender_holds.py [--nodes 1000] [--pods 20000] [--holds 900]
[--requests 40] [--rounds 5] [--touched 1]``.

Set-up, in process (no HTTP: ``bench/extender.py`` measures that): ``--nodes`` GPU-share nodes of
eight 16 GiB GPUs, ``--pods`` bound pods (``gpushare.testing.extender.populated_state``), and
``--holds`` preemption holds of 8 GiB for priority-1000 preemptors, one a node, live through the
run (as ``bench/preemption.py --nodes 1000`` leaves ~900 while its burst is preempting). Each
request is one filter (``NodeNames``: every node) and one prioritize of a new pending 4 GiB pod
of priority 0 with no hold of its own, as kube-scheduler sends them in one scheduling cycle;
before each, ``--touched`` nodes change (``cluster.touch``: a bind there, say). Each round
times ``--requests`` requests on a scheduler that caches the answers on held nodes (now), then
on one that evaluates every held node afresh for every pod (before: the scheduler's private
``_cache_held`` off), so both see the same machine. Reports the first (cold) request of each,
the medians over the rounds of each round's median request, their ratio, and the load average.
No budget: a measurement.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from gpushare.core.model import ContainerAllocation
from gpushare.core.policies import make_policy
from gpushare.core.preemption import Hold
from gpushare.extender.bindapi import UnwiredBinder
from gpushare.extender.holds import HoldBook
from gpushare.extender.preemption import Preemptor
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import ExtenderArgs
from gpushare.testing.extender import pod_json, populated_state

GPUS_PER_NODE = 8
HOLD_GIB = 8
PREEMPTOR_PRIORITY = 1000
HOLD_LIFE_S = 3600.0


def with_holds(state: ExtenderState, names: list[str], count: int, now_s: float) -> Preemptor:
    """A preemptor over ``state`` with ``count`` holds of ``HOLD_GIB`` on the first ``count``
    of ``names``, one a node, expiring ``HOLD_LIFE_S`` after ``now_s``."""
    book = HoldBook(state.cluster.touch, wall_clock=lambda: now_s)
    for i, node in enumerate(names[:count]):
        gpu = (ContainerAllocation("main", (i % GPUS_PER_NODE,), HOLD_GIB),)
        book.put(
            Hold(
                f"bench/preemptor-{i}",
                f"uid-preemptor-{i}",
                node,
                PREEMPTOR_PRIORITY,
                gpu,
                (),
                (),
                now_s,
                now_s + HOLD_LIFE_S,
            )
        )
    return Preemptor(state, book, wall_clock=lambda: now_s)


def timed_requests(
    scheduler: Scheduler, names: list[str], requests: int, touched: int, first: int
) -> list[float]:
    """Seconds of each of ``requests`` filter + prioritize pairs, new pods ``first``, ...;
    ``touched`` nodes changed before each (rotating over ``names``)."""
    times: list[float] = []
    for i in range(first, first + requests):
        for j in range(touched):
            scheduler.state.cluster.touch(names[(i * touched + j) % len(names)])
        pod = pod_json(f"pending-{i}", 4, namespace="bench", priority=0)
        args = ExtenderArgs(pod=pod, node_names=list(names))  # a new list, as decoded
        start = time.perf_counter()
        scheduler.filter(args)
        scheduler.prioritize(args)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=20000)
    parser.add_argument("--holds", type=int, default=900, help="one a node, at most --nodes")
    parser.add_argument("--requests", type=int, default=40, help="per scheduler and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--touched", type=int, default=1, help="nodes changed before a request")
    args = parser.parse_args()
    if not 0 <= args.holds <= args.nodes:
        parser.error(f"--holds {args.holds}: between 0 and --nodes ({args.nodes}) accepted")

    built = time.perf_counter()
    state, names = populated_state(args.nodes, args.pods, started=True)
    preemptor = with_holds(state, names, args.holds, time.time())
    schedulers = {}
    for kind in ("cached", "uncached"):
        scheduler = Scheduler(state, make_policy("binpack"), UnwiredBinder(), preemptor=preemptor)
        scheduler._cache_held = kind == "cached"  # the private knob (module doc)
        schedulers[kind] = scheduler
    print(
        f"{args.nodes} nodes × {GPUS_PER_NODE} GPUs, {args.pods} pods, {args.holds} holds "
        f"(built in {time.perf_counter() - built:.1f} s); filter + prioritize of one 4 GiB "
        f"priority-0 pod over every node; {args.rounds} rounds of {args.requests} requests per "
        f"scheduler, {args.touched} node(s) touched before each; load average before "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    )
    firsts = {
        kind: timed_requests(scheduler, names, 1, args.touched, 0)[0]
        for kind, scheduler in schedulers.items()
    }
    medians: dict[str, list[float]] = {kind: [] for kind in schedulers}
    for round_ in range(args.rounds):
        for kind, scheduler in schedulers.items():
            first = 1 + round_ * args.requests
            times = timed_requests(scheduler, names, args.requests, args.touched, first)
            medians[kind].append(statistics.median(times) * 1000)
    for kind in schedulers:
        print(
            f"  {kind:9s} median {statistics.median(medians[kind]):7.2f} ms (per round "
            + ", ".join(f"{x:.2f}" for x in medians[kind])
            + f"; first, cold {firsts[kind] * 1000:.1f} ms)"
        )
    ratio = statistics.median(medians["uncached"]) / statistics.median(medians["cached"])
    print(
        f"  uncached / cached: {ratio:.1f}×; load average after "
        + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    )


if __name__ == "__main__":
    main()
