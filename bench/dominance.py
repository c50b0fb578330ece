"""Does a policy dominate FGD's curve? Seed-paired differences at every arrived level
(docs/simulator.md, "Every workload (10 seeds, 75–100 % arrived)").

Run: ``.venv/bin/python bench/dominance.py out/sweep/*/results.json [--policy fgd-spare]
[--baseline fgd] [--from 75] [--to 100]``. Each ``results.json`` is one ``gpushare simulate
--out DIR/<workload>`` run; the runs of files in directories of the same name are taken
together (so the baseline and the policy may come from separate runs), paired by seed;
docs/simulator.md, "Below saturation", has the commands that make them.

For every workload and every arrived level L from ``--from`` to ``--to`` (the curve's bins:
unallocated GPU % of capacity at L % arrived), the difference d_s(L) = policy − baseline of
seed s, its mean and sample standard deviation over the seeds. The policy is **behind** at L
when mean(d) > sd(d) (worse beyond one standard deviation of the difference: the acceptance
test for ``fgd-spare`` in docs/simulator.md, "Every workload (10 seeds, 75–100 % arrived)"),
**ahead** at 100 % when mean(d) < −sd(d). Prints a Markdown table: per workload the baseline
and policy at 100 % (mean ± sd), the difference at 100 %, the worst level (largest mean − sd),
the levels behind, and multi-GPU pods failed per run (the whole 130 % stream, as
``results.json`` counts them) and seconds per run for both.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any


def runs_by_seed(document: dict[str, Any], policy: str) -> dict[int, dict[str, Any]]:
    """The runs of ``policy`` in a ``results.json`` document, by seed."""
    return {run["seed"]: run for run in document["runs"] if run["policy"] == policy}


def paired(
    ours: dict[int, dict[str, Any]], base: dict[int, dict[str, Any]], level: int
) -> list[float]:
    """Policy − baseline unallocated % at ``level`` for each seed both ran."""
    return [
        ours[s]["unallocated_pct"][level] - base[s]["unallocated_pct"][level]
        for s in sorted(set(ours) & set(base))
    ]


def mean_sd(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), sd


def row(
    workload: str, documents: list[dict[str, Any]], policy: str, baseline: str, levels: range
) -> tuple[str, bool, bool]:
    """One Markdown row for ``workload``'s runs; (row, never behind, ahead at 100 %)."""
    ours: dict[int, dict[str, Any]] = {}
    base: dict[int, dict[str, Any]] = {}
    for document in documents:
        ours.update(runs_by_seed(document, policy))
        base.update(runs_by_seed(document, baseline))
    if not ours or not base:
        raise SystemExit(f"{workload}: needs runs of both {policy!r} and {baseline!r}")
    behind: list[int] = []
    worst = (float("-inf"), 0)
    for level in levels:
        mean, sd = mean_sd(paired(ours, base, level))
        if mean > sd + 1e-9:
            behind.append(level)
        worst = max(worst, (mean - sd, level))
    top = levels[-1]
    d100, sd100 = mean_sd(paired(ours, base, top))
    b100 = mean_sd([r["unallocated_pct"][top] for r in base.values()])
    o100 = mean_sd([r["unallocated_pct"][top] for r in ours.values()])

    def multi(runs: dict[int, dict[str, Any]]) -> float:
        return statistics.fmean(r["failed_by_kind"].get("multi-gpu", 0) for r in runs.values())

    def seconds(runs: dict[int, dict[str, Any]]) -> float:
        return statistics.fmean(r["seconds"] for r in runs.values())

    ahead = d100 < -sd100
    text = (
        f"| {workload} | {len(set(ours) & set(base))} "
        f"| {b100[0]:.2f} ± {b100[1]:.2f} | {o100[0]:.2f} ± {o100[1]:.2f} "
        f"| {d100:+.2f} ± {sd100:.2f}{' (ahead)' if ahead else ''} "
        f"| {worst[0]:+.2f} at {worst[1]} % "
        f"| {', '.join(map(str, behind)) if behind else 'none'} "
        f"| {multi(base):.1f} / {multi(ours):.1f} | {seconds(base):.1f} / {seconds(ours):.1f} |"
    )
    return text, not behind, ahead


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", nargs="+", type=Path)
    parser.add_argument("--policy", default="fgd-spare")
    parser.add_argument("--baseline", default="fgd")
    parser.add_argument("--from", dest="low", type=int, default=75)
    parser.add_argument("--to", dest="high", type=int, default=100)
    args = parser.parse_args()
    levels = range(args.low, args.high + 1)
    p, b = args.policy, args.baseline
    print(
        f"| workload | seeds | {b} at {args.high} % | {p} at {args.high} % | {p} − {b} "
        f"| worst level (mean − sd) | levels behind | multi-GPU failed {b} / {p} "
        f"| s/run {b} / {p} |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    by_workload: dict[str, list[dict[str, Any]]] = {}
    for path in args.results:
        document = json.loads(path.read_text(encoding="utf-8"))
        by_workload.setdefault(path.parent.name, []).append(document)
    never_behind = ahead = 0
    for workload, documents in sorted(by_workload.items()):
        text, clean, better = row(workload, documents, p, b, levels)
        print(text)
        never_behind += clean
        ahead += better
    count = len(by_workload)
    print(
        f"\n{p} never behind {b} beyond one sd at {args.low}–{args.high} % on {never_behind} of"
        f" {count} workloads; ahead beyond one sd at {args.high} % on {ahead} of {count}."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
