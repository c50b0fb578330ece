"""Offline references of a run (``gpushare.sim.reference``) on clusters small enough to check by
hand: which pods feed the headline bin, the upper bound on allocated GPU that no placement can
beat, and the best-fit-decreasing placement."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from gpushare.core.model import ContainerRequest, PodRequest
from gpushare.sim.reference import (
    allocated_upper_bound,
    best_fit_decreasing,
    headline_prefix,
    reference_for_seed,
)
from gpushare.testing.core import gpu_node, pod_request

C = 1000  # one whole GPU, openb's milli-GPU


def shares(*amounts: int) -> list[PodRequest]:
    """One single-GPU pod per amount, named p0, p1, ..."""
    return [pod_request((amount, 1), key=f"p{i}") for i, amount in enumerate(amounts)]


# --- headline_prefix -------------------------------------------------------------------------

PREFIXES = [
    # (id, pod GPU totals, capacity, pods that feed the 100% bin)
    ("the last pod at 100% closes the prefix", [500, 500, 500], C, 2),
    ("every pod in the bin counts, up to the last", [500, 496, 8, 400], C, 3),
    ("empty bin: the bins either side are averaged", [600, 390, 20, 300], C, 3),
    ("never near 100%: no prefix", [300, 300, 300, 300], C, None),
    ("CPU-only pods add events without arrivals", [1000, 0, 0, 500], C, 3),
]


@pytest.mark.parametrize(
    ("totals", "capacity", "expected"), [c[1:] for c in PREFIXES], ids=[c[0] for c in PREFIXES]
)
def test_headline_prefix(totals: list[int], capacity: int, expected: int | None) -> None:
    stream = [
        pod_request((t, 1), key=f"p{i}") if t else pod_request(key=f"p{i}", cpu_milli=1000)
        for i, t in enumerate(totals)
    ]
    assert headline_prefix(stream, capacity) == expected


def test_headline_prefix_rejects_a_cluster_without_gpu() -> None:
    with pytest.raises(ValueError, match="capacity must be > 0"):
        headline_prefix(shares(500), 0)


# --- allocated_upper_bound -------------------------------------------------------------------


@dataclass(frozen=True)
class BoundCase:
    id: str
    pods: list[PodRequest]
    gpus: list[int]
    bound: int


BOUNDS = [
    BoundCase("no pods: nothing allocated", [], [C, C], 0),
    BoundCase("no GPUs: nothing allocated", shares(500), [], 0),
    BoundCase("whole GPUs fill exactly", shares(C, C), [C, C], 2 * C),
    BoundCase("demand beyond capacity is capped", shares(C, C, C), [C, C], 2 * C),
    BoundCase("two shares over half a GPU never share one", shares(600, 600, 600), [C, C], 1200),
    BoundCase(
        "leftovers too small for the small shares stay empty",
        shares(810, 810, 300, 300),
        [C, C],
        1620,  # 810 + 810; one 810 out for 300 + 300 gives only 1410
    ),
    BoundCase("small shares fill the leftovers exactly", shares(800, 800, 200, 200), [C, C], 2 * C),
    BoundCase("three 400s never share a GPU: at most 800 of it", shares(*[400] * 6), [C, C], 1600),
    BoundCase(
        "a leftover holds only sums of the sizes that fit it",
        shares(700, 700, 200, 200, 200),
        [C, C],
        2 * 700 + 2 * 200,  # each 300 leftover takes one 200: 100 of it stays empty
    ),
    BoundCase(
        "dropping a big share can pay: three 600s and four 500s on three GPUs",
        shares(600, 600, 600, 500, 500, 500, 500),
        [C, C, C],
        600 + 4 * 500,  # one 600 and two GPUs of 500 + 500 beat three 600s (1800)
    ),
    BoundCase(
        "a 2-GPU pod is two whole-GPU pieces",
        [pod_request((C, 2), key="two")],
        [C, C, C],
        2 * C,
    ),
    BoundCase(
        "a share larger than every GPU is never placed",
        [pod_request((C, 1), key="big")],
        [500, 500],
        0,
    ),
    BoundCase("smaller GPUs: capped by their total", shares(400, 400, 400), [C, 500], 1200),
]


@pytest.mark.parametrize("case", BOUNDS, ids=[c.id for c in BOUNDS])
def test_allocated_upper_bound(case: BoundCase) -> None:
    assert allocated_upper_bound(case.pods, case.gpus) == case.bound


# --- best_fit_decreasing ---------------------------------------------------------------------

BFD = [
    # (id, GPUs per node (one node each), pods, allocated)
    (
        "largest first packs what arrival order would not",
        [[C, C]],
        shares(300, 300, 700, 700),
        2 * C,
    ),
    ("a pod that fits nowhere is dropped", [[C]], shares(C, 500), C),
    ("a 2-GPU pod needs one node with two GPUs", [[C], [C]], [pod_request((C, 2))], 0),
    ("no pods", [[C]], [], 0),
]


@pytest.mark.parametrize(
    ("capacities", "pods", "allocated"), [c[1:] for c in BFD], ids=[c[0] for c in BFD]
)
def test_best_fit_decreasing(
    capacities: list[list[int]], pods: list[PodRequest], allocated: int
) -> None:
    nodes = [gpu_node(caps, name=f"n{i}", cpu_milli=8000) for i, caps in enumerate(capacities)]
    assert best_fit_decreasing(nodes, pods) == allocated


def test_bfd_respects_cpu() -> None:
    node = gpu_node([C, C], cpu_milli=4000)
    pods = [pod_request((C, 1), key=f"p{i}", cpu_milli=3000) for i in range(2)]
    assert best_fit_decreasing([node], pods) == C  # the second pod's CPU does not fit


def test_reference_for_seed_brackets_nothing_it_cannot_reach() -> None:
    """On a small cluster: the bound is never above what BFD, a real placement, leaves. Pods
    of at most 2% of capacity, so that the stream has events in the 100% bin."""
    nodes = [gpu_node([C] * 2, name=f"n{i}", cpu_milli=32_000) for i in range(2)]
    pods = [
        pod_request((share, 1), key=f"s{i}", cpu_milli=500)
        for i, share in enumerate([40, 30, 20, 60, 80, 10])
    ]
    reference = reference_for_seed(nodes, pods, 42)
    assert reference.pods > 0
    assert 0 <= reference.bound_unallocated_pct <= reference.bfd_unallocated_pct <= 100


@pytest.mark.parametrize(
    "two_dimensional",
    [
        ContainerRequest("main", 50, 1, compute_milli=50),
        ContainerRequest("main", 0, 1, compute_milli=30),
    ],
    ids=["a pod asking memory and compute", "a pod asking compute only"],
)
def test_reference_for_seed_bounds_nothing_in_two_dimensions(
    two_dimensional: ContainerRequest,
) -> None:
    """The references count memory only: with one pod that asks compute or whole GPUs, both
    are NaN (what the table shows as no reference), not memory-only numbers."""
    nodes = [gpu_node([C] * 2, name=f"n{i}", cpu_milli=32_000) for i in range(2)]
    pods = [
        pod_request((share, 1), key=f"s{i}", cpu_milli=500)
        for i, share in enumerate([40, 30, 20, 60, 80, 10])
    ]
    pods.append(pod_request(two_dimensional, key="two", cpu_milli=500))
    reference = reference_for_seed(nodes, pods, 42)
    assert reference.pods == 0
    assert math.isnan(reference.bfd_unallocated_pct)
    assert math.isnan(reference.bound_unallocated_pct)
