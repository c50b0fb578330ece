"""The simulator against a real run (``gpushare.sim.compare``, ``bench/replay.py``): the
unallocated curve of a run, the seed band, the distance outside it, the verdict with its 0.25
points of tolerance, and the first pod the two runs placed differently."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from gpushare.sim.compare import (
    Largest,
    PlacedDifferently,
    SeedBand,
    distance_outside,
    first_placed_differently,
    largest,
    seed_band,
    simulate_stream,
    unallocated_curve,
    within_band,
)
from gpushare.sim.engine import LikeCluster, simulate
from gpushare.sim.experiment import policy_context, run_policy
from gpushare.sim.trace import load_embedded_trace
from gpushare.sim.workload import make_run
from gpushare.testing.core import pod_request

NAN = float("nan")


def curve(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float64)


def same(left: np.ndarray, right: np.ndarray) -> bool:
    return bool(np.array_equal(left, right, equal_nan=True))


# --- unallocated_curve ------------------------------------------------------------------------


@dataclass(frozen=True)
class CurveCase:
    id: str
    arrived: list[float]
    allocated: list[float]
    capacity: float
    max_percent: int
    expected: list[float]


CURVE_CASES = [
    CurveCase(
        "every arrived % has an event: its value",
        [0, 10, 20], [0, 10, 10], 1000.0, 2, [100.0, 99.0, 99.0],
    ),
    CurveCase(
        "a bin no event fell in carries the last value over",
        [0, 20], [0, 10], 1000.0, 2, [100.0, 100.0, 99.0],
    ),
    CurveCase(
        "the last event of a bin wins",
        [0, 4, 6], [0, 4, 5], 1000.0, 1, [99.6, 99.5],
    ),
    CurveCase(
        "beyond the last event's arrived %: NaN",
        [0, 10], [0, 5], 1000.0, 3, [100.0, 99.5, NAN, NAN],
    ),
    CurveCase(
        "events beyond max_percent are left out",
        [0, 10, 30], [0, 10, 10], 1000.0, 1, [100.0, 99.0],
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", CURVE_CASES, ids=[c.id for c in CURVE_CASES])
def test_unallocated_curve_takes_the_last_event_at_or_below_each_arrived_percent(
    case: CurveCase,
) -> None:
    got = unallocated_curve(case.arrived, case.allocated, case.capacity, case.max_percent)
    assert same(got, curve(*case.expected))


@dataclass(frozen=True)
class BadCurveCase:
    id: str
    arrived: list[float]
    allocated: list[float]
    capacity: float
    message: str


BAD_CURVE_CASES = [
    BadCurveCase("series of different lengths", [0, 1], [0], 10.0, "one length"),
    BadCurveCase("no event at all", [], [], 10.0, "at least the empty one"),
    BadCurveCase("a capacity of zero", [0], [0], 0.0, "capacity 0.0 is not a GPU total"),
]


@pytest.mark.parametrize("case", BAD_CURVE_CASES, ids=[c.id for c in BAD_CURVE_CASES])
def test_unallocated_curve_names_bad_input(case: BadCurveCase) -> None:
    with pytest.raises(ValueError, match=case.message):
        unallocated_curve(case.arrived, case.allocated, case.capacity)


# --- the band, the distance outside it and the verdict ----------------------------------------


@dataclass(frozen=True)
class BandCase:
    id: str
    seeds: list[list[float]]
    real: list[float]
    distance: list[float]
    inside: bool


BAND_CASES = [
    BandCase("real between the seeds: 0", [[5, 5], [7, 3]], [6, 4], [0, 0], True),
    BandCase("real on the band's edge: 0", [[5, 5], [7, 3]], [7, 3], [0, 0], True),
    BandCase("one seed: the band is its curve", [[5, 5]], [5.25, 4.75], [0.25, 0.25], True),
    BandCase(
        "above the band by exactly the tolerance: inside", [[5], [6]], [6.25], [0.25], True
    ),
    BandCase("above the band by more than the tolerance", [[5], [6]], [6.5], [0.5], False),
    BandCase("below the band by more than the tolerance", [[5], [6]], [4.5], [0.5], False),
    BandCase(
        "NaN where the runs have not arrived: not compared",
        [[5, NAN], [6, NAN]], [5.5, NAN], [0, NAN], True,
    ),
    BandCase("nothing compared: not inside", [[NAN], [NAN]], [NAN], [NAN], False),
]  # fmt: skip


@pytest.mark.parametrize("case", BAND_CASES, ids=[c.id for c in BAND_CASES])
def test_the_real_curve_lies_within_the_seed_band_up_to_a_quarter_point(case: BandCase) -> None:
    band = seed_band([curve(*seed) for seed in case.seeds])
    distance = distance_outside(curve(*case.real), band)
    assert np.allclose(distance, curve(*case.distance), equal_nan=True)
    assert within_band(distance) is case.inside


def test_the_band_is_the_lowest_and_highest_seed_at_each_arrived_percent() -> None:
    band = seed_band([curve(1, 9, 5), curve(3, 2, 5), curve(2, 4, 6)])
    assert same(band.low, curve(1, 2, 5))
    assert same(band.high, curve(3, 9, 6))


@pytest.mark.parametrize(
    ("curves", "message"),
    [([], "at least one"), ([curve(1, 2), curve(1)], "lengths \\[1, 2\\]")],
    ids=["no seed", "curves of different lengths"],
)
def test_seed_band_names_bad_input(curves: list[np.ndarray], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        seed_band(curves)


def test_distance_outside_refuses_a_curve_of_another_length() -> None:
    band = SeedBand(curve(1, 2), curve(3, 4))
    with pytest.raises(ValueError, match="accepted: equal"):
        distance_outside(curve(1), band)


@pytest.mark.parametrize(
    ("series", "expected"),
    [
        (curve(0.1, 0.7, 0.3), Largest(0.7, 1)),
        (curve(0.5, NAN, 0.5), Largest(0.5, 0)),
        (curve(NAN, NAN), None),
        (curve(), None),
    ],
    ids=["the largest and its arrived %", "ties: the first", "all NaN: none", "empty: none"],
)
def test_largest_skips_nan(series: np.ndarray, expected: Largest | None) -> None:
    assert largest(series) == expected


# --- the first pod placed differently ---------------------------------------------------------


STREAM = [pod_request((500, 1), key=f"ns/p{i}") for i in range(1, 4)]


@dataclass(frozen=True)
class FirstCase:
    id: str
    simulated: list[str | None]
    real: list[str | None]
    outcome_only: bool
    expected: PlacedDifferently | None
    kinds: dict[str, str] | None = None


FIRST_CASES = [
    FirstCase("every pod alike: none", ["a", None, "b"], ["a", None, "b"], False, None),
    FirstCase(
        "another node", ["a", "b", "c"], ["a", "c", None], False,
        PlacedDifferently(2, "ns/p2", "b", "c"),
    ),
    FirstCase(
        "outcome only: another node is alike, refused is not", ["a", "b", "c"], ["a", "c", None],
        True, PlacedDifferently(3, "ns/p3", "c", None),
    ),
    FirstCase(
        "refused by the simulator, bound for real", [None, "b", "c"], ["a", "b", "c"], True,
        PlacedDifferently(1, "ns/p1", None, "a"),
    ),
    FirstCase(
        "by kind: another node of the same kind is alike", ["a", "b", "c"], ["b", "c", "c"], False,
        PlacedDifferently(2, "ns/p2", "b", "c"), {"a": "T4", "b": "T4", "c": "V100"},
    ),
    FirstCase(
        "by kind: refused still differs", ["a", "a", None], ["b", "b", "b"], False,
        PlacedDifferently(3, "ns/p3", None, "b"), {"a": "T4", "b": "T4"},
    ),
]  # fmt: skip


@pytest.mark.parametrize("case", FIRST_CASES, ids=[c.id for c in FIRST_CASES])
def test_first_placed_differently_finds_the_first_pod_the_runs_disagree_on(
    case: FirstCase,
) -> None:
    got = first_placed_differently(
        STREAM, case.simulated, case.real, outcome_only=case.outcome_only, kinds=case.kinds
    )
    assert got == case.expected


def test_first_placed_differently_wants_one_placement_per_pod() -> None:
    with pytest.raises(ValueError, match="3 pods, 2 simulated and 3 real"):
        first_placed_differently(STREAM, ["a", "b"], ["a", "b", "c"])


# --- simulate_stream: one stream, the simulator's draws per seed --------------------------------


@pytest.mark.parametrize("like_cluster", [True, False], ids=["like the cluster", "ideal"])
def test_simulate_stream_with_the_streams_seed_is_the_run_the_bench_compared_before(
    like_cluster: bool,
) -> None:
    trace = load_embedded_trace()
    setup = make_run(trace.nodes, trace.pods, 42)
    context = policy_context(trace.nodes, trace.pods, 42)
    assert context.workload is not None
    record = simulate(
        trace.nodes, setup.stream, run_policy("fgd-spare", context, like_cluster=like_cluster),
        tie_rank=setup.tie_rank, workload=context.workload,
        like_cluster=LikeCluster(42) if like_cluster else None,
    )  # fmt: skip
    run = simulate_stream(
        trace.nodes, trace.pods, setup.stream, "fgd-spare", 42, like_cluster=like_cluster
    )
    capacity = float(sum(g.capacity for n in trace.nodes for g in n.gpus))
    assert same(run.unallocated_pct, unallocated_curve(record.arrived, record.allocated, capacity))
    assert run.placed == record.placed
    assert run.placed_on == tuple(record.placed_on)


def test_another_seed_draws_otherwise_on_the_same_pods_in_the_same_order() -> None:
    trace = load_embedded_trace()
    stream = make_run(trace.nodes, trace.pods, 42).stream
    runs = [simulate_stream(trace.nodes, trace.pods, stream, "bestfit", s) for s in (42, 43)]
    assert runs[0].placed_on != runs[1].placed_on
    assert len(runs[0].placed_on) == len(runs[1].placed_on) == len(stream)


def test_placed_on_names_each_pods_node_and_none_for_a_dropped_pod() -> None:
    trace = load_embedded_trace()
    stream = make_run(trace.nodes, trace.pods, 42).stream
    run = simulate_stream(trace.nodes, trace.pods, stream, "bestfit", 42)
    names = {n.name for n in trace.nodes}
    assert sum(node is not None for node in run.placed_on) == run.placed
    assert {node for node in run.placed_on if node is not None} <= names
