"""Binning a run's events by arrived % (METHOD.md §6 step 8): round to an integer percent,
average within a bin, fill an empty bin from bins ±1."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpushare.sim.engine import RunRecord
from gpushare.sim.metrics import Curves, bin_by_arrived

CAPACITY = 1000.0  # so that 10 units = 1%


def record(
    arrived: list[float], allocated: list[float], fragmentation: list[float], idle: list[float]
) -> RunRecord:
    return RunRecord(
        arrived=np.array(arrived, dtype=np.float64),
        allocated=np.array(allocated, dtype=np.float64),
        fragmentation=np.array(fragmentation, dtype=np.float64),
        idle=np.array(idle, dtype=np.float64),
    )


# Events: arrived → percent bin:  0→0, 4→0, 6→1, 14→1, 16→2, 40→4, 44→4 (bins 3 and 5 empty).
RUN = record(
    arrived=[0, 4, 6, 14, 16, 40, 44],
    allocated=[0, 4, 6, 14, 16, 30, 34],
    fragmentation=[100, 120, 80, 60, 50, 20, 10],
    idle=[1000, 996, 994, 986, 984, 970, 966],  # one dimension: capacity - allocated
)


@pytest.fixture(scope="module")
def curves() -> Curves:
    return bin_by_arrived(RUN, CAPACITY, max_percent=5)


def test_one_value_per_integer_percent(curves: Curves) -> None:
    for curve in (curves.unallocated_pct, curves.frag_amount_pct, curves.frag_rate_pct):
        assert curve.shape == (6,)
        assert curve.dtype == np.float64


@pytest.mark.parametrize(
    ("bin_", "unallocated", "amount"),
    [
        (0, 100 - (0.0 + 0.4) / 2, (10 + 12) / 2),
        (1, 100 - (0.6 + 1.4) / 2, (8 + 6) / 2),
        (2, 100 - 1.6, 5),
        (3, 100 - (1.6 + 3.0 + 3.4) / 3, (5 + 2 + 1) / 3),
        (4, 100 - (3.0 + 3.4) / 2, (2 + 1) / 2),
        (5, 100 - (3.0 + 3.4) / 2, (2 + 1) / 2),
    ],
    ids=[
        "0.0% and 0.4% round to bin 0 and average",
        "0.6% and 1.4% round to bin 1 and average",
        "a single event is its bin",
        "empty bin 3 averages the events of bins 2 and 4",
        "4.0% and 4.4% round to bin 4",
        "empty last bin uses bin 4 (there is no bin 6)",
    ],
)
def test_unallocated_and_fragmentation_amount(
    curves: Curves, bin_: int, unallocated: float, amount: float
) -> None:
    assert curves.unallocated_pct[bin_] == pytest.approx(unallocated)
    assert curves.frag_amount_pct[bin_] == pytest.approx(amount)


def test_fragmentation_rate_is_percent_of_idle_and_zero_without_idle(curves: Curves) -> None:
    assert curves.frag_rate_pct[0] == pytest.approx((100 * 100 / 1000 + 100 * 120 / 996) / 2)
    assert curves.frag_rate_pct[2] == pytest.approx(100 * 50 / 984)
    assert curves.frag_rate_pct[4] == pytest.approx((100 * 20 / 970 + 100 * 10 / 966) / 2)
    full = record(arrived=[0, 1000], allocated=[0, 1000], fragmentation=[0, 0], idle=[1000, 0])
    # No idle GPU: the rate is 0, not inf or NaN.
    assert bin_by_arrived(full, CAPACITY, max_percent=100).frag_rate_pct[100] == 0.0


def test_two_dimensions_count_a_gpu_once_however_many_dimensions_are_asked() -> None:
    """Pods asking opposite dimensions share GPUs: the request placed (``allocated``, 120% of
    capacity here) passes what the GPUs hold; unallocated is the idle GPU, never negative."""
    paired = record(
        arrived=[0, 500, 1000], allocated=[0, 600, 1200], fragmentation=[0, 0, 0],
        idle=[1000, 700, 150],
    )  # fmt: skip
    curves = bin_by_arrived(paired, CAPACITY, max_percent=100)
    assert curves.unallocated_pct[50] == pytest.approx(70.0)
    assert curves.unallocated_pct[100] == pytest.approx(15.0)


@pytest.mark.parametrize(
    ("fragmentation", "idle"),
    [(0.0, 0.0), (50.0, 0.0)],
    ids=["no fragmentation and no idle", "fragmentation but no idle"],
)
def test_zero_idle_gives_a_zero_rate(fragmentation: float, idle: float) -> None:
    curves = bin_by_arrived(record([0], [1000], [fragmentation], [idle]), CAPACITY, max_percent=0)
    assert curves.frag_rate_pct.tolist() == [0.0]


@pytest.mark.parametrize(
    ("arrived", "bin_"),
    [(4.9, 0), (5.0, 0), (5.1, 1), (15.0, 2), (25.0, 2), (994.9, 99), (995.0, 100)],
    ids=[
        "0.49% rounds down",
        "0.5% rounds half to even (0)",
        "0.51% rounds up",
        "1.5% rounds half to even (2)",
        "2.5% rounds half to even (2)",
        "99.49% is bin 99",
        "99.5% rounds half to even (100)",
    ],
)
def test_arrived_rounds_to_the_nearest_integer_percent(arrived: float, bin_: int) -> None:
    """The artifact rounds with Python's ``round`` (half to even); numpy's ``rint`` agrees."""
    assert round(100 * arrived / CAPACITY) == bin_
    curves = bin_by_arrived(record([arrived], [500], [0], [500]), CAPACITY, max_percent=130)
    assert curves.unallocated_pct[bin_] == pytest.approx(50.0)
    others = [v for i, v in enumerate(curves.unallocated_pct) if abs(i - bin_) > 1]
    assert all(math.isnan(v) for v in others)


def test_bins_without_events_nearby_stay_empty() -> None:
    curves = bin_by_arrived(record([0, 50], [0, 50], [0, 0], [1000, 950]), CAPACITY, 5)
    assert curves.unallocated_pct[1] == pytest.approx(100.0)  # from bin 0
    assert math.isnan(curves.unallocated_pct[2])
    assert math.isnan(curves.unallocated_pct[3])
    assert curves.unallocated_pct[4] == pytest.approx(95.0)  # from bin 5


def test_events_beyond_the_last_bin_do_not_change_it() -> None:
    curves = bin_by_arrived(
        record([0, 50, 100], [0, 50, 100], [0, 0, 0], [1000, 950, 900]), CAPACITY, 5
    )
    assert curves.unallocated_pct[5] == pytest.approx(95.0)
