"""The packing plot: the paper's Fig. 9(a) (unallocated GPU % against arrived %) and Fig. 7
(fragmentation amount against arrived %), median over seeds with the 25–75% band.

Every policy has a colour of its own (:func:`policy_styles`), fixed by its place in the policy
registry so that it keeps it from one plot to the next; the default policy is a thick black
line drawn on top, labelled ``(default)``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from gpushare.core.policies import policy_names
from gpushare.sim.experiment import RunResult
from gpushare.sim.reference import Reference

PALETTE: tuple[str, ...] = tuple(
    to_hex(colour)
    for colour in (
        *matplotlib.colormaps["tab10"].colors,  # type: ignore[attr-defined]
        *matplotlib.colormaps["tab20"].colors[1::2],  # type: ignore[attr-defined]
    )
)
"""The colours of the policies other than the default, in registry order: matplotlib's tab10,
then the light halves of tab20 (20 distinct colours); more policies than that take evenly
spaced colours of the ``turbo`` colormap instead."""

DEFAULT_COLOUR = "#000000"
"""The default policy's line: black, which no other policy's line is (the ideal line is grey)."""


@dataclass(frozen=True)
class LineStyle:
    """How one policy's curves are drawn: ``colour`` (``#rrggbb``), ``width_pt`` (line width in
    points), ``zorder`` (higher is drawn on top) and its ``label`` in the legend."""

    colour: str
    width_pt: float
    zorder: float
    label: str


def policy_styles(
    policies: Sequence[str], default_policy: str | None = None
) -> dict[str, LineStyle]:
    """``policies`` (names, in a fixed order such as ``policy_names()``) → the style of each
    line: a colour of its own for every policy (:data:`PALETTE`), and for ``default_policy``
    (when it is among them) :data:`DEFAULT_COLOUR`, a thicker line, drawn above the others,
    labelled ``<name> (default)``. ``ValueError`` naming the repeated names when a name repeats."""
    repeated = sorted(name for name, count in Counter(policies).items() if count > 1)
    if repeated:
        raise ValueError(f"policies {', '.join(repeated)} are named more than once")
    others = [name for name in policies if name != default_policy]
    if len(others) <= len(PALETTE):
        colours = list(PALETTE[: len(others)])
    else:
        colormap = matplotlib.colormaps["turbo"]
        colours = [to_hex(colormap(x)) for x in np.linspace(0.0, 1.0, len(others))]
    styles = {
        name: LineStyle(colour, 1.6, 2.0, name)
        for name, colour in zip(others, colours, strict=True)
    }
    if default_policy is not None and default_policy in policies:
        styles[default_policy] = LineStyle(DEFAULT_COLOUR, 3.0, 3.0, f"{default_policy} (default)")
    return styles


def plot_results(
    path: Path,
    results: Sequence[RunResult],
    title: str,
    references: Sequence[Reference] = (),
    default_policy: str | None = None,
) -> None:
    """Write :func:`draw_results`' figure to ``path`` as a PNG (120 dpi)."""
    figure = draw_results(results, title, references, default_policy)
    try:
        figure.savefig(path, dpi=120)
    finally:
        plt.close(figure)


def draw_results(
    results: Sequence[RunResult],
    title: str,
    references: Sequence[Reference] = (),
    default_policy: str | None = None,
) -> Figure:
    """The two-panel figure: unallocated GPU % for arrived 75–120% (with the ideal line
    100 − arrived and, given ``references``, their means at their arrived % as markers:
    offline best-fit-decreasing and the lower bound) and fragmentation amount for arrived
    0–120%; one line per policy (median over its seeds, with the 25–75% band when it has
    several), each in its own colour, ``default_policy`` standing out (:func:`policy_styles`).
    The caller closes it (``matplotlib.pyplot.close``)."""
    by_policy: dict[str, list[RunResult]] = {}
    for result in results:
        by_policy.setdefault(result.policy, []).append(result)
    registered = policy_names()
    styles = policy_styles(
        [*registered, *sorted(p for p in by_policy if p not in registered)], default_policy
    )
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
            style = styles[policy]
            axis.plot(
                x,
                median,
                label=style.label,
                color=style.colour,
                linewidth=style.width_pt,
                zorder=style.zorder,
            )
            if len(runs) > 1:
                q1, q3 = np.nanpercentile(stack, [25, 75], axis=0)
                axis.fill_between(
                    x, q1, q3, color=style.colour, alpha=0.2, linewidth=0, zorder=style.zorder - 1
                )
    ideal = np.arange(75, 121)
    # Thin and dashed, above the policies: a policy on the ideal line does not hide it.
    left.plot(
        ideal, np.maximum(100 - ideal, 0), "--", color="0.5", linewidth=1, label="ideal", zorder=4
    )
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
    return figure
