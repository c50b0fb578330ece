"""Summaries of an experiment: per-policy statistics, the terminal table and the JSON file.

The headline number is the paper's Fig. 9(a)/11–14 metric: unallocated GPU (% of capacity) when
the arrived workload equals 100% of capacity, mean ± sd over seeds (METHOD.md §6–7).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from rich.table import Table

from gpushare.sim.experiment import RunResult

HEADLINE_PERCENT = 100


@dataclass(frozen=True, slots=True)
class Stat:
    """Mean and sample standard deviation (0 for a single value) over ``count`` seeds."""

    mean: float
    sd: float
    count: int = 1

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        """The statistic of ``values`` (NaN-free, at least one)."""
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        return cls(mean, sd, len(values))

    def __str__(self) -> str:
        """``4.39 ± 0.04`` over several seeds; ``4.39`` for one (a spread of one value is no
        spread)."""
        if self.count == 1:
            return f"{self.mean:.2f}"
        return f"{self.mean:.2f} ± {self.sd:.2f}"


def describe_seeds(seeds: Sequence[int]) -> str:
    """``seed 42``, ``seeds 42–51`` (consecutive) or ``seeds 42, 43, 47`` (anything else)."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}–{seeds[-1]}"
    return "seeds " + ", ".join(str(seed) for seed in seeds)


@dataclass(frozen=True, slots=True)
class PolicySummary:
    """One policy over its seeds, at arrived = ``HEADLINE_PERCENT``."""

    policy: str
    seeds: tuple[int, ...]
    unallocated_pct: Stat
    frag_amount_pct: Stat
    frag_rate_pct: Stat
    empty_frag_amount_pct: float
    failed_pods_whole_stream: Stat
    """Pods that fit nowhere over the whole tuned stream (to ``tune_ratio`` × capacity, 130 %
    by default), not only those arrived by ``HEADLINE_PERCENT``."""
    run_seconds: Stat


def summarise(results: Sequence[RunResult]) -> list[PolicySummary]:
    """Per-policy summaries, in the order policies first appear in ``results``."""
    by_policy: dict[str, list[RunResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    summaries = []
    for policy, runs in by_policy.items():
        at = HEADLINE_PERCENT
        summaries.append(
            PolicySummary(
                policy=policy,
                seeds=tuple(r.seed for r in runs),
                unallocated_pct=Stat.of([float(r.curves.unallocated_pct[at]) for r in runs]),
                frag_amount_pct=Stat.of([float(r.curves.frag_amount_pct[at]) for r in runs]),
                frag_rate_pct=Stat.of([float(r.curves.frag_rate_pct[at]) for r in runs]),
                empty_frag_amount_pct=runs[0].empty_frag_amount_pct,
                failed_pods_whole_stream=Stat.of(
                    [float(sum(r.failed_by_kind.values())) for r in runs]
                ),
                run_seconds=Stat.of([r.seconds for r in runs]),
            )
        )
    return summaries


def summary_table(
    summaries: Sequence[PolicySummary], title: str, gpus: float, tune_ratio: float = 1.3
) -> Table:
    """A rich table, best policy first: unallocated GPU % and GPUs, fragmentation, failures.

    Every column but "failed, whole stream" is at ``HEADLINE_PERCENT`` arrived; that one counts
    the pods that fit nowhere in the whole stream, tuned to ``tune_ratio`` × capacity."""
    several = any(s.unallocated_pct.count > 1 for s in summaries)
    table = Table(
        title=title,
        caption=f"at {HEADLINE_PERCENT}% arrived workload"
        + ("; mean ± sd over seeds" if several else "")
        + f"; failed, whole stream: pods that fit nowhere in the whole stream, tuned to "
        f"{tune_ratio:.0%} of capacity (not only those arrived by {HEADLINE_PERCENT}%)",
    )
    table.add_column("policy", no_wrap=True)
    table.add_column("unalloc %", justify="right", no_wrap=True)
    table.add_column("GPUs", justify="right")
    table.add_column("frag %", justify="right", no_wrap=True)
    table.add_column("frag rate %", justify="right", no_wrap=True)
    table.add_column("failed, whole stream", justify="right")
    table.add_column("s/run", justify="right")
    for s in sorted(summaries, key=lambda s: s.unallocated_pct.mean):
        table.add_row(
            s.policy,
            str(s.unallocated_pct),
            f"{s.unallocated_pct.mean * gpus / 100:.0f}",
            str(s.frag_amount_pct),
            str(s.frag_rate_pct),
            f"{s.failed_pods_whole_stream.mean:.0f}",
            f"{s.run_seconds.mean:.1f}",
        )
    return table


def _curve_json(values: npt.NDArray[np.float64]) -> list[float | None]:
    return [None if np.isnan(v) else round(float(v), 4) for v in values]


def write_json(
    path: Path,
    results: Sequence[RunResult],
    summaries: Sequence[PolicySummary],
    meta: dict[str, object],
) -> None:
    """Write ``results.json``: run metadata, per-policy summaries, and per-run curves indexed
    by arrived % (unallocated, frag amount, frag rate), failures and timings."""
    document = {
        **meta,
        "headline_arrived_pct": HEADLINE_PERCENT,
        "summaries": [asdict(s) for s in summaries],
        "runs": [
            {
                "policy": r.policy,
                "seed": r.seed,
                "pods": r.pods,
                "placed": r.placed,
                "failed_by_kind": r.failed_by_kind,
                "seconds": round(r.seconds, 3),
                "unallocated_pct": _curve_json(r.curves.unallocated_pct),
                "frag_amount_pct": _curve_json(r.curves.frag_amount_pct),
                "frag_rate_pct": _curve_json(r.curves.frag_rate_pct),
            }
            for r in results
        ],
    }
    path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
