"""The simulator's packing plot (``gpushare.sim.plot``): every policy the simulator offers has a
colour of its own, and the default policy (the extender's) stands out: thicker, drawn on top,
labelled as the default in the legend."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from gpushare.core.policies import policy_names
from gpushare.extender.scoring import DEFAULT_POLICY
from gpushare.sim.experiment import RunResult
from gpushare.sim.metrics import Curves
from gpushare.sim.plot import PALETTE, draw_results, policy_styles

BINS = 131  # arrived 0..130%


def run(policy: str, seed: int, unallocated_at_100_pct: float) -> RunResult:
    """A run whose curves fall linearly to ``unallocated_at_100_pct`` at 100% arrived."""
    arrived = np.arange(BINS, dtype=np.float64)
    unallocated = np.maximum(100.0 - arrived, 0.0) + unallocated_at_100_pct
    curves = Curves(unallocated, unallocated / 4, unallocated / 8)
    return RunResult(policy, seed, curves, 100, 90, {}, 0.1, 13.9)


@pytest.fixture
def every_policy() -> Iterator[Figure]:
    """The figure of two seeds of every registered policy, the default among them."""
    results = [
        run(name, seed, float(rank) + seed / 100)
        for rank, name in enumerate(policy_names())
        for seed in (42, 43)
    ]
    figure = draw_results(results, "every policy", default_policy=DEFAULT_POLICY)
    yield figure
    plt.close(figure)


def policy_lines(figure: Figure) -> dict[str, Line2D]:
    """The unallocated panel's policy lines by legend label (the ideal line left out)."""
    left = figure.axes[0]
    return {str(line.get_label()): line for line in left.get_lines() if line.get_label() != "ideal"}


def test_every_policy_the_simulator_offers_is_drawn_in_a_colour_of_its_own(
    every_policy: Figure,
) -> None:
    lines = policy_lines(every_policy)
    assert len(lines) == len(policy_names())
    colours = [str(line.get_color()) for line in lines.values()]
    assert len(set(colours)) == len(colours), dict(zip(lines, colours, strict=True))


def test_the_default_policy_is_thicker_drawn_on_top_and_labelled_the_default(
    every_policy: Figure,
) -> None:
    lines = policy_lines(every_policy)
    default = lines.pop(f"{DEFAULT_POLICY} (default)")
    assert all(default.get_linewidth() > line.get_linewidth() for line in lines.values())
    assert all(default.get_zorder() > line.get_zorder() for line in lines.values())
    assert DEFAULT_POLICY not in lines  # listed once, as the default
    assert every_policy.axes[0].get_legend() is not None


STYLES = [
    ("the registry, the default among them", policy_names(), DEFAULT_POLICY),
    ("the registry, no default named", policy_names(), None),
    ("more policies than the palette has colours", [f"p{i}" for i in range(30)], "p3"),
    ("one policy, the default", ["fgd-spare"], "fgd-spare"),
]


@pytest.mark.parametrize(
    ("policies", "default_policy"), [c[1:] for c in STYLES], ids=[c[0] for c in STYLES]
)
def test_policy_styles_give_distinct_colours(
    policies: Sequence[str], default_policy: str | None
) -> None:
    styles = policy_styles(policies, default_policy)
    assert list(styles) == [p for p in policies if p != default_policy] + (
        [default_policy] if default_policy else []
    )
    colours = [style.colour for style in styles.values()]
    assert len(set(colours)) == len(colours)


def test_a_policy_keeps_its_colour_whatever_else_is_drawn() -> None:
    """Colours follow the registry, not the policies of one run: a plot of two policies and
    one of all of them draw ``bestfit`` alike."""
    everything = policy_styles(policy_names(), DEFAULT_POLICY)
    results = [run("bestfit", 42, 7.0), run(DEFAULT_POLICY, 42, 4.0)]
    figure = draw_results(results, "two policies", default_policy=DEFAULT_POLICY)
    try:
        assert policy_lines(figure)["bestfit"].get_color() == everything["bestfit"].colour
    finally:
        plt.close(figure)
    assert len(PALETTE) >= len(policy_names())


def test_a_policy_named_twice_is_refused_naming_it() -> None:
    with pytest.raises(ValueError, match="policies fgd are named more than once"):
        policy_styles(["fgd", "bestfit", "fgd"])
