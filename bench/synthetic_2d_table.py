"""The synthetic two-dimensional workload's table for docs/compute.md, from a results.json.

Run: ``gpushare simulate --workload synthetic-2d --seeds 42-51 --jobs 1 --out out/synthetic-2d``
then ``.venv/bin/python bench/synthetic_2d_table.py out/synthetic-2d/results.json``. Per policy
(mean ± sd over seeds): unallocated GPU % of capacity at 100% and at 130% arrived (the end of
the stream; the idle GPU, what is free in both memory and compute: ``bin_by_arrived``), and the
pods that failed over the whole stream, in all and by kind (mean per seed; results.json records
failures for the whole stream only).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def _mean_sd(values: list[float]) -> str:
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.2f} ± {sd:.2f}"


def main() -> None:
    results = json.loads(Path(sys.argv[1]).read_text())
    runs: dict[str, list[dict[str, object]]] = defaultdict(list)
    for run in results["runs"]:
        runs[str(run["policy"])].append(run)
    rows = []
    for policy, items in runs.items():
        at_100 = [float(r["unallocated_pct"][100]) for r in items]  # type: ignore[index]
        at_130 = [float(r["unallocated_pct"][130]) for r in items]  # type: ignore[index]
        kinds: dict[str, float] = defaultdict(float)
        for r in items:
            for kind, count in r["failed_by_kind"].items():  # type: ignore[attr-defined]
                kinds[kind] += count / len(items)
        failed = sum(kinds.values())
        by_kind = ", ".join(f"{k} {v:.1f}" for k, v in sorted(kinds.items()))
        rows.append((statistics.fmean(at_100), policy, at_100, at_130, failed, by_kind))
    print("| policy | unallocated % @100% | unallocated % @130% | failed pods | by kind |")
    print("|---|---|---|---|---|")
    for _, policy, at_100, at_130, failed, by_kind in sorted(rows):
        print(f"| {policy} | {_mean_sd(at_100)} | {_mean_sd(at_130)} | {failed:.1f} | {by_kind} |")


if __name__ == "__main__":
    main()
