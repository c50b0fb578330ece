"""kube-scheduler's own scores for a pod that asks no GPU, and what an extender priority adds:
each case computed by hand from the v1.37.1 formulas (``noderesources/least_allocated.go``,
``balanced_allocation.go``, ``schedule_one.go``) that ``gpushare.core.kubescheduler`` and
``gpushare.core.extenderscore`` cite."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpushare.core import extenderscore
from gpushare.core.extenderscore import extender_score
from gpushare.core.kubescheduler import (
    Resources,
    balanced_allocation_score,
    balanced_resource_score,
    best_nodes,
    least_allocated_score,
    least_requested_score,
    nonzero_request,
    num_feasible_nodes_to_find,
    scan_feasible,
    score,
)
from gpushare.extender import wire

NODE = Resources(4000, 8192)  # 4 CPUs, 8 GiB


@pytest.mark.parametrize(
    ("requested", "capacity", "expected"),
    [
        pytest.param(1000, 4000, 75, id="a quarter used leaves 75"),
        pytest.param(3000, 4000, 25, id="three quarters used leaves 25"),
        pytest.param(1000, 3000, 66, id="two thirds free rounds down to 66"),
        pytest.param(4000, 4000, 0, id="requested equal to capacity scores 0"),
        pytest.param(5000, 4000, 0, id="requested over capacity scores 0"),
        pytest.param(100, 0, 0, id="no capacity scores 0"),
    ],
)
def test_least_requested_score_is_the_free_share_rounded_down(
    requested: int, capacity: int, expected: int
) -> None:
    assert least_requested_score(requested, capacity) == expected


@pytest.mark.parametrize(
    ("requested", "allocatable", "expected"),
    [
        pytest.param((1000, 2048), (4000, 8192), 75, id="75 and 75 average 75"),
        pytest.param((1000, 6144), (4000, 8192), 50, id="75 and 25 average 50"),
        pytest.param((1000, 2731), (4000, 8192), 70, id="75 and 66 average 70 rounded down"),
        pytest.param((1000, 2048), (4000, 0), 75, id="a resource the node lacks is left out"),
        pytest.param((1000, 2048), (0, 0), 0, id="a node with neither scores 0"),
    ],
)
def test_least_allocated_score_averages_cpu_and_memory(
    requested: tuple[int, int], allocatable: tuple[int, int], expected: int
) -> None:
    assert least_allocated_score(requested, allocatable, (1, 1)) == expected


@pytest.mark.parametrize(
    ("requested", "allocatable", "expected"),
    [
        pytest.param((1000, 2048), (4000, 8192), 100, id="equal fractions are balanced: 100"),
        pytest.param((3000, 2048), (4000, 8192), 75, id="0.75 against 0.25: std 0.25, 75"),
        pytest.param((5000, 0), (4000, 8192), 50, id="a fraction over 1 counts as 1: 50"),
        pytest.param((3000, 0), (4000, 8192), 62, id="0.75 against 0: 62.5 truncated to 62"),
        pytest.param((3000, 2048), (4000, 0), 100, id="one resource alone is balanced"),
    ],
)
def test_balanced_resource_score_is_one_minus_the_deviation(
    requested: tuple[int, int], allocatable: tuple[int, int], expected: int
) -> None:
    assert balanced_resource_score(requested, allocatable) == expected


@pytest.mark.parametrize(
    ("after", "before", "expected"),
    [
        pytest.param((1000, 2048), (0, 0), 75, id="balance unchanged: 75"),
        pytest.param((3000, 4096), (3000, 0), 87, id="balance improved 62 to 87: 87"),
        pytest.param((4000, 4096), (2000, 4096), 62, id="balance worsened 100 to 75: 62"),
    ],
)
def test_balanced_allocation_scores_the_change_the_pod_brings(
    after: tuple[int, int], before: tuple[int, int], expected: int
) -> None:
    assert balanced_allocation_score(after, before, (4000, 8192)) == expected


@dataclass(frozen=True)
class ScoreCase:
    used: Resources
    pod: Resources
    expected: int


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(
            ScoreCase(Resources(0, 0), Resources(1000, 2048), 75 + 75),
            id="empty node: least allocated 75, balance unchanged 75",
        ),
        pytest.param(
            ScoreCase(Resources(2000, 4096), Resources(1000, 2048), 25 + 75),
            id="half-full node: least allocated 25, balance unchanged 75",
        ),
        pytest.param(
            ScoreCase(Resources(2000, 0), Resources(0, 2048), 62 + 81),
            id="a memory pod on a CPU-heavy node improves its balance: 62 + 81",
        ),
        pytest.param(
            ScoreCase(Resources(0, 4096), Resources(0, 2048), 62 + 68),
            id="a memory pod on a memory-heavy node worsens its balance: 62 + 68",
        ),
        pytest.param(
            ScoreCase(Resources(0, 0), Resources(0, 0), 100),
            id="a pod requesting nothing: balanced allocation skipped",
        ),
    ],
)
def test_the_total_is_least_allocated_plus_balanced_allocation(case: ScoreCase) -> None:
    assert score(NODE, case.used, case.used, case.pod, case.pod) == case.expected


def test_an_empty_node_beats_a_half_full_one_and_a_balancing_node_an_unbalancing_one() -> None:
    pod = Resources(0, 2048)
    cpu_heavy, memory_heavy = Resources(2000, 0), Resources(0, 4096)
    assert score(NODE, cpu_heavy, cpu_heavy, pod, pod) > score(
        NODE, memory_heavy, memory_heavy, pod, pod
    )
    pod = Resources(1000, 2048)
    empty, half = Resources(0, 0), Resources(2000, 4096)
    assert score(NODE, empty, empty, pod, pod) > score(NODE, half, half, pod, pod)


@pytest.mark.parametrize(
    ("cpu_milli", "memory_mib", "expected"),
    [
        pytest.param(None, None, Resources(100, 200), id="unset requests count 100m and 200 MiB"),
        pytest.param(0, None, Resources(0, 200), id="a request set to zero stays zero"),
        pytest.param(500, 1024, Resources(500, 1024), id="set requests count as they are"),
    ],
)
def test_nonzero_request_defaults_only_unset_requests(
    cpu_milli: int | None, memory_mib: int | None, expected: Resources
) -> None:
    assert nonzero_request(cpu_milli, memory_mib) == expected


@pytest.mark.parametrize(
    ("nodes", "percentage", "expected"),
    [
        pytest.param(50, 0, 50, id="under 100 nodes: all"),
        pytest.param(120, 0, 100, id="120 nodes: 50 % is 60, raised to 100"),
        pytest.param(1000, 0, 420, id="1000 nodes: 50 - 8 = 42 %"),
        pytest.param(1213, 0, 497, id="1213 nodes: 50 - 9 = 41 %"),
        pytest.param(5000, 0, 500, id="5000 nodes: 50 - 40 = 10 %"),
        pytest.param(10000, 0, 500, id="10000 nodes: the 5 % floor"),
        pytest.param(120, 100, 120, id="percentageOfNodesToScore 100: all"),
        pytest.param(300, 10, 100, id="a set percentage is raised to 100 nodes too"),
    ],
)
def test_num_feasible_nodes_to_find_follows_the_adaptive_rule(
    nodes: int, percentage: int, expected: int
) -> None:
    assert num_feasible_nodes_to_find(nodes, percentage) == expected


def test_a_percentage_over_100_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"percentageOfNodesToScore must be in 0\.\.100, got 101"):
        num_feasible_nodes_to_find(120, 101)


@pytest.mark.parametrize(
    ("feasible", "start", "wanted", "expected"),
    [
        pytest.param((True, False, True, True), 1, 2, ([2, 3], 3), id="stops at enough"),
        pytest.param((True, False, True, True), 3, 2, ([3, 0], 2), id="wraps around"),
        pytest.param((False, True, False), 0, 5, ([1], 3), id="too few: looks at all"),
    ],
)
def test_scan_feasible_takes_the_first_feasible_from_the_start(
    feasible: tuple[bool, ...], start: int, wanted: int, expected: tuple[list[int], int]
) -> None:
    assert scan_feasible(feasible, start, wanted) == expected


@pytest.mark.parametrize(
    ("scores", "expected"),
    [
        pytest.param((3, 5, 5, 1), [1, 2], id="every node of the top score"),
        pytest.param((7,), [0], id="one node"),
        pytest.param((), [], id="no node"),
    ],
)
def test_best_nodes_are_all_those_with_the_top_score(
    scores: tuple[int, ...], expected: list[int]
) -> None:
    assert best_nodes(scores) == expected


@pytest.mark.parametrize(
    ("priority", "weight", "expected"),
    [
        pytest.param(10, 10, 1000, id="the extender's best with the chart's weight: 1000"),
        pytest.param(9, 10, 900, id="one step lower: 900"),
        pytest.param(10, 1, 100, id="weight 1: as much as one score plugin"),
        pytest.param(0, 10, 0, id="priority 0 adds nothing"),
    ],
)
def test_an_extender_priority_counts_weight_times_ten(
    priority: int, weight: int, expected: int
) -> None:
    assert extender_score(priority, weight) == expected


def test_the_core_priority_range_is_the_wire_formats() -> None:
    assert (extenderscore.MIN_PRIORITY, extenderscore.MAX_PRIORITY) == (
        wire.MIN_PRIORITY,
        wire.MAX_PRIORITY,
    )
