"""Simulator and placement-decision speed on the openb default trace (budgets: docs/design.md,
"Budgets").

Run: ``make bench`` or ``.venv/bin/python bench/simulate.py [--trace DIR] [--repeats N]``.
Reports medians, and ratios against a baseline measured in the same run:

* one full run (tuned to 130%, one process, one core) of ``fgd``, ``fgd-cpu`` and
  ``fgd-spare``, against ``bestfit`` (a policy with trivial scores: the cost of the loop
  itself) and, for gpushare's policies, against ``fgd``. Budgets: fgd ≤ 20 s; gpushare's
  policies ≤ 1.5× fgd.
* one placement decision (``Placer.decide``: filter + score + tie-break + GPU choice over all
  1,213 nodes), every pod of a run timed: p50/p99/max. Budget: p99 ≤ 5 ms, ≤ 2 ms for
  gpushare's policies. A cold decision
  (fresh cache, cluster half full) is reported too: the worst case, e.g. after a restart.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from gpushare.core.model import NodeState
from gpushare.core.placement import Placer
from gpushare.core.policies import make_policy
from gpushare.sim.experiment import policy_context, run_one
from gpushare.sim.trace import Trace, load_trace
from gpushare.sim.workload import make_run

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"


def full_runs(trace: Trace, policy: str, repeats: int) -> list[float]:
    """Wall seconds of ``repeats`` full runs (seeds 42, 43, ...)."""
    return [run_one(trace.nodes, trace.pods, policy, 42 + i).seconds for i in range(repeats)]


def decision_times(trace: Trace, policy_name: str, seed: int = 42) -> tuple[list[float], float]:
    """Seconds per ``decide`` over one run, and one cold decision on the half-full cluster."""
    setup = make_run(trace.nodes, trace.pods, seed)
    context = policy_context(trace.nodes, trace.pods, seed)
    placer = Placer(
        [NodeState.empty(n) for n in trace.nodes], make_policy(policy_name, context), setup.tie_rank
    )
    times: list[float] = []
    half = len(setup.stream) // 2
    cold = 0.0
    for i, pod in enumerate(setup.stream):
        if i == half:
            fresh = Placer(placer.states, make_policy(policy_name, context), setup.tie_rank)
            started = time.perf_counter()
            fresh.decide(pod)
            cold = time.perf_counter() - started
        started = time.perf_counter()
        decision = placer.decide(pod)
        times.append(time.perf_counter() - started)
        if decision is not None:
            index = decision.node_index
            placer.replace(index, placer.states[index].with_allocation(decision.allocation))
    return times, cold


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--workload", default="default")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    trace = load_trace(args.trace, args.workload)
    print(f"{args.trace} {args.workload}: {len(trace.nodes)} nodes, {len(trace.pods)} pods")

    print("\nfull run, tuned to 130% (median of", args.repeats, "seeds)")
    baseline = statistics.median(full_runs(trace, "bestfit", args.repeats))
    print(f"  bestfit (baseline) {baseline:6.2f} s")
    fgd_s = 0.0
    for policy in ("fgd", "fgd-cpu", "fgd-spare"):
        median = statistics.median(full_runs(trace, policy, args.repeats))
        versus = f"{median / fgd_s:.2f}× fgd, budget 1.5×" if fgd_s else "budget 20 s"
        fgd_s = fgd_s or median
        print(f"  {policy:18s} {median:6.2f} s  ({median / baseline:.2f}× baseline; {versus})")

    print("\none placement decision over all nodes (every pod of seed 42)")
    base_times, _ = decision_times(trace, "bestfit")
    base_p99 = float(np.percentile(base_times, 99))
    for policy in ("bestfit", "fgd", "fgd-cpu", "fgd-spare"):
        times, cold = (base_times, 0.0) if policy == "bestfit" else decision_times(trace, policy)
        ms = np.array(times) * 1000
        p50, p99 = np.percentile(ms, [50, 99])
        line = (
            f"  {policy:18s} p50 {p50:6.3f} ms  p99 {p99:6.3f} ms  max {ms.max():7.2f} ms"
            f"  (p99 {p99 / (base_p99 * 1000):.2f}× bestfit; budget p99 5 ms, 2 ms for ours)"
        )
        if cold:
            line += f"  cold {cold * 1000:.1f} ms"
        print(line)


if __name__ == "__main__":
    main()
