"""The simulator's report formatting: statistics over seeds and how the seeds are named."""

from __future__ import annotations

import pytest

from gpushare.sim.report import Stat, describe_seeds

STATS = [
    ("one seed: the value, no spread", [4.391], "4.39"),
    ("two seeds: mean ± sd", [4.0, 5.0], "4.50 ± 0.71"),
    ("equal values over seeds still show their spread", [3.0, 3.0, 3.0], "3.00 ± 0.00"),
]


@pytest.mark.parametrize(("values", "text"), [c[1:] for c in STATS], ids=[c[0] for c in STATS])
def test_stat_text(values: list[float], text: str) -> None:
    stat = Stat.of(values)
    assert stat.count == len(values)
    assert str(stat) == text


SEEDS = [
    ("one seed", (42,), "seed 42"),
    ("consecutive seeds: a range", (42, 43, 44), "seeds 42–44"),
    ("gaps: listed", (42, 43, 47), "seeds 42, 43, 47"),
    ("out of order: listed", (43, 42), "seeds 43, 42"),
]


@pytest.mark.parametrize(("seeds", "text"), [c[1:] for c in SEEDS], ids=[c[0] for c in SEEDS])
def test_describe_seeds(seeds: tuple[int, ...], text: str) -> None:
    assert describe_seeds(seeds) == text
