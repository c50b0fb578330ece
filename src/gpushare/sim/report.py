"""Summaries of an experiment: per-policy statistics, the terminal table and the JSON file.

The headline number is the paper's Fig. 9(a)/11–14 metric: unallocated GPU (% of capacity) when
the arrived workload equals 100% of capacity, mean ± sd over seeds (docs/simulator.md, "One
run" and "Reading the output").
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
from gpushare.sim.reference import Reference

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


@dataclass(frozen=True, slots=True)
class ReferenceSummary:
    """The offline references over seeds (``gpushare.sim.reference``): unallocated GPU % left by
    best-fit-decreasing, and its lower bound over any placement. Seeds whose stream never
    reaches the bin (NaN) are left out; ``None`` when none reaches it."""

    seeds: tuple[int, ...]
    bfd_unallocated_pct: Stat | None
    bound_unallocated_pct: Stat | None

    @classmethod
    def of(cls, references: Sequence[Reference]) -> ReferenceSummary:
        """The summary of ``references`` (one per seed)."""
        reached = [r for r in references if not np.isnan(r.bound_unallocated_pct)]
        if not reached:
            return cls(tuple(r.seed for r in references), None, None)
        return cls(
            tuple(r.seed for r in references),
            Stat.of([r.bfd_unallocated_pct for r in reached]),
            Stat.of([r.bound_unallocated_pct for r in reached]),
        )


def summary_table(
    summaries: Sequence[PolicySummary],
    title: str,
    gpus: float,
    tune_ratio: float = 1.3,
    reference: ReferenceSummary | None = None,
) -> Table:
    """A rich table, best policy first: unallocated GPU % and GPUs, fragmentation, failures.

    Every column but "failed, whole stream" is at ``HEADLINE_PERCENT`` arrived; that one counts
    the pods that fit nowhere in the whole stream, tuned to ``tune_ratio`` × capacity. With a
    ``reference`` (same seeds), a column "above bound" (policy's mean − the lower bound's mean,
    percentage points: the seed-paired mean difference) and two rows after the policies:
    offline best-fit-decreasing ("offline BFD") and the lower bound."""
    bound = reference.bound_unallocated_pct if reference is not None else None
    notes = [f"at {HEADLINE_PERCENT}% arrived workload"]
    if any(s.unallocated_pct.count > 1 for s in summaries):
        notes.append("mean ± sd over seeds")
    notes.append(
        f"failed, whole stream: pods that fit nowhere in the whole stream, tuned to "
        f"{tune_ratio:.0%} of capacity (not only those arrived by {HEADLINE_PERCENT}%)"
    )
    if bound is not None:
        notes.append(
            f"offline BFD: the same pods up to {HEADLINE_PERCENT}% arrived, known in advance, "
            "placed largest first by bestfit; lower bound: no placement of those pods leaves "
            "less unallocated; above bound: mean minus the lower bound's, in points "
            "(docs/simulator.md)"
        )
    table = Table(title=title, caption="; ".join(notes))
    table.add_column("policy", no_wrap=True)
    table.add_column("unalloc %", justify="right", no_wrap=True)
    table.add_column("GPUs", justify="right")
    if bound is not None:
        table.add_column("above bound", justify="right", no_wrap=True)
    table.add_column("frag %", justify="right", no_wrap=True)
    table.add_column("frag rate %", justify="right", no_wrap=True)
    table.add_column("failed, whole stream", justify="right", no_wrap=True)
    table.add_column("s/run", justify="right")
    for s in sorted(summaries, key=lambda s: s.unallocated_pct.mean):
        above = [f"{s.unallocated_pct.mean - bound.mean:+.2f}"] if bound is not None else []
        table.add_row(
            s.policy,
            str(s.unallocated_pct),
            f"{s.unallocated_pct.mean * gpus / 100:.0f}",
            *above,
            str(s.frag_amount_pct),
            str(s.frag_rate_pct),
            f"{s.failed_pods_whole_stream.mean:.0f}",
            f"{s.run_seconds.mean:.1f}",
        )
    if reference is not None and reference.bfd_unallocated_pct is not None and bound is not None:
        table.add_section()
        for name, stat in (
            ("offline BFD", reference.bfd_unallocated_pct),
            ("lower bound", bound),
        ):
            above = [f"{stat.mean - bound.mean:+.2f}"]
            table.add_row(
                f"[italic]{name}[/]",
                str(stat),
                f"{stat.mean * gpus / 100:.0f}",
                *above,
                *(["—"] * 4),
                style="dim",
            )
    return table


def _number_json(value: float) -> float | None:
    return None if np.isnan(value) else round(float(value), 4)


def _curve_json(values: npt.NDArray[np.float64]) -> list[float | None]:
    return [_number_json(v) for v in values]


def write_json(
    path: Path,
    results: Sequence[RunResult],
    summaries: Sequence[PolicySummary],
    meta: dict[str, object],
    references: Sequence[Reference] = (),
) -> None:
    """Write ``results.json``: run metadata, per-policy summaries, per-run curves indexed
    by arrived % (unallocated, frag amount, frag rate), failures and timings, and the offline
    references (``reference``: their summary and one entry per seed; absent without any)."""
    extra: dict[str, object] = {}
    if references:
        extra["reference"] = {
            **asdict(ReferenceSummary.of(references)),
            "per_seed": [
                {
                    "seed": r.seed,
                    "pods": r.pods,
                    "bfd_unallocated_pct": _number_json(r.bfd_unallocated_pct),
                    "bound_unallocated_pct": _number_json(r.bound_unallocated_pct),
                }
                for r in references
            ],
        }
    document = {
        **meta,
        "headline_arrived_pct": HEADLINE_PERCENT,
        "summaries": [asdict(s) for s in summaries],
        **extra,
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
