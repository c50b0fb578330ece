"""The packing plot: the paper's Fig. 9(a) (unallocated GPU % against arrived %) and Fig. 7
(fragmentation amount against arrived %), median over seeds with the 25–75% band."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from gpushare.sim.experiment import RunResult
from gpushare.sim.reference import Reference


def plot_results(
    path: Path,
    results: Sequence[RunResult],
    title: str,
    references: Sequence[Reference] = (),
) -> None:
    """Write a two-panel PNG to ``path``: unallocated GPU % for arrived 75–120% (with the ideal
    line 100 − arrived and, given ``references``, their means at their arrived % as markers:
    offline best-fit-decreasing and the lower bound) and fragmentation amount for arrived
    0–120%."""
    by_policy: dict[str, list[RunResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    figure, (left, right) = plt.subplots(1, 2, figsize=(13, 5), constrained_layout=True)
    order = sorted(
        by_policy,
        key=lambda p: float(np.nanmean([r.curves.unallocated_pct[100] for r in by_policy[p]])),
    )
    for policy in order:
        runs = by_policy[policy]
        for axis, field, lo, hi in (
            (left, "unallocated_pct", 75, 120),
            (right, "frag_amount_pct", 0, 120),
        ):
            stack = np.array([getattr(r.curves, field)[lo : hi + 1] for r in runs])
            x = np.arange(lo, hi + 1)
            median = np.nanmedian(stack, axis=0)
            (line,) = axis.plot(x, median, label=policy, linewidth=1.6)
            if len(runs) > 1:
                q1, q3 = np.nanpercentile(stack, [25, 75], axis=0)
                axis.fill_between(x, q1, q3, color=line.get_color(), alpha=0.2, linewidth=0)
    ideal = np.arange(75, 121)
    left.plot(ideal, np.maximum(100 - ideal, 0), "k--", linewidth=1, label="ideal")
    reached = [r for r in references if not np.isnan(r.bound_unallocated_pct)]
    if reached:
        at = reached[0].percent
        for values, marker, label in (
            ([r.bfd_unallocated_pct for r in reached], "s", "offline BFD"),
            ([r.bound_unallocated_pct for r in reached], "v", "lower bound"),
        ):
            left.plot([at], [float(np.mean(values))], "k" + marker, markersize=7, label=label)
    left.set_xlabel("arrived workload (% of GPU capacity)")
    left.set_ylabel("unallocated GPU (% of capacity)")
    left.set_title("Unallocated GPU (lower is better)")
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3)
    left.legend(fontsize=8)
    right.set_xlabel("arrived workload (% of GPU capacity)")
    right.set_ylabel("fragmented GPU (% of capacity)")
    right.set_title("Fragmentation amount F(M)")
    right.set_ylim(bottom=0)
    right.grid(alpha=0.3)
    figure.suptitle(title)
    figure.savefig(path, dpi=120)
    plt.close(figure)
