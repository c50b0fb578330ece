"""``gpushare.core.skipped``: what a bound pod whose allocation cannot be recorded is charged
with, the one rule the extender and the inspect report share. Table-driven: a node state, the
skipped pods (and units recorded on GPU indices the node lacks) and the free units per GPU they
leave."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpushare.core.fit import check_fit
from gpushare.core.model import (
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    NodeState,
    PodRequest,
)
from gpushare.core.skipped import SkipKind, SkippedPod, charged, held, refused, unreadable
from gpushare.testing.core import gpu_node, node_state

NODE = gpu_node([16, 16], name="n1")


def on(pod: str, *gpus: tuple[int, int]) -> Allocation:
    """Pod ``default/<pod>`` on ``n1``: one container per (GPU index, units)."""
    return Allocation(
        f"default/{pod}",
        "n1",
        tuple(ContainerAllocation(f"c{i}", (index,), units) for i, (index, units) in
              enumerate(gpus)),
    )  # fmt: skip


@dataclass(frozen=True)
class Case:
    id: str
    used: tuple[int, int]
    skipped: tuple[SkippedPod, ...]
    free: tuple[int, int]
    held: tuple[int, int]
    units_off_node: int = 0


CASES = [
    Case("nothing skipped leaves the state as it is", (4, 0), (), (12, 16), (0, 0)),
    Case("a GPU index the node lacks is charged on every GPU",
         (4, 0), (refused(on("ghost", (7, 4)), NODE, "GPU 7"),), (8, 12), (4, 4)),
    Case("an allocation over capacity is charged on the GPU it names",
         (12, 0), (refused(on("big", (0, 8)), NODE, "requested 8"),), (-4, 16), (8, 0)),
    Case("known and unknown indices of one pod: each rule for its part",
         (0, 0), (refused(on("mixed", (1, 2), (9, 3)), NODE, "GPU 9"),), (13, 11), (3, 5)),
    Case("an unreadable allocation blocks every GPU of the node",
         (2, 0), (unreadable("default/odd", "n1", "pod default/odd: garbage"),), (-2, 0), (0, 0)),
    Case("units recorded on a GPU index the node no longer has count on every GPU",
         (4, 0), (), (10, 14), (0, 0), units_off_node=2),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_what_skipped_pods_are_charged_with(case: Case) -> None:
    state = node_state([16, 16], list(case.used), name="n1")
    result = charged(state, case.skipped, case.units_off_node)
    assert result.gpu_free == case.free
    assert held(NODE, case.skipped) == case.held
    if not case.skipped and not case.units_off_node:
        assert result is state


def test_the_kinds_and_what_a_skipped_pod_says() -> None:
    ghost = refused(on("ghost", (7, 4)), NODE, "GPU 7; the node has GPUs 0, 1")
    assert (ghost.kind, ghost.charges, ghost.missing) == (
        SkipKind.UNKNOWN_GPU, ((0, 4), (1, 4)), ((7, 4),)
    )  # fmt: skip
    assert refused(on("big", (0, 20)), NODE, "").kind is SkipKind.OVER_CAPACITY
    odd = unreadable("default/odd", "n1", "pod default/odd: annotation X='y':\n  not a number")
    assert (odd.kind, odd.whole_node, odd.reason) == (
        SkipKind.UNREADABLE, True, "annotation X='y': not a number"
    )  # fmt: skip
    assert ghost.describe() == (
        "pod default/ghost on node n1: allocation names a GPU the node does not have: GPU 7; "
        "the node has GPUs 0, 1; counted as 4 on GPU 0, 4 on GPU 1"
    )
    assert odd.describe().endswith("; counted as every GPU of the node blocked")


@pytest.mark.parametrize(
    "skipped",
    [
        (refused(on("ghost", (7, 4)), NODE, "GPU 7"),),
        (unreadable("default/odd", "n1", "pod default/odd: garbage"),),
    ],
    ids=["a GPU the node lacks", "an unreadable allocation"],
)
def test_charging_a_skipped_pod_keeps_the_compute_held_and_the_gpus_held_whole(
    skipped: tuple[SkippedPod, ...],
) -> None:
    # GPU 0 holds 700 compute_milli, GPU 1 is held whole: a skipped pod on the node adds
    # memory, and takes away neither (else a compute share could land on GPU 0 above 1000).
    state = NodeState(NODE, (4, 16), gpu_compute_used=(700, 1000), gpu_whole=(False, True))
    result = charged(state, skipped)
    assert result.gpu_compute_used == (700, 1000)
    assert result.gpu_whole == (False, True)
    assert result.gpu_compute_free == (300, 0)


def with_compute(pod: str, index: int, units: int, compute_milli: int) -> Allocation:
    """Pod ``default/<pod>`` on ``n1``: one container of ``units`` and ``compute_milli``."""
    return Allocation(
        f"default/{pod}", "n1", (ContainerAllocation("main", (index,), units, compute_milli),)
    )


@pytest.mark.parametrize(
    ("skipped", "compute_used"),
    [
        pytest.param(refused(with_compute("big", 0, 20, 600), NODE, "requested 20"), (1300, 0),
                     id="over-capacity-its-compute-on-the-gpu-it-names"),
        pytest.param(refused(with_compute("ghost", 7, 4, 300), NODE, "GPU 7"), (1000, 300),
                     id="a-gpu-the-node-lacks-its-compute-on-every-gpu"),
        pytest.param(refused(on("plain", (0, 20)), NODE, "requested 20"), (700, 0),
                     id="no-compute-recorded-none-charged"),
    ],
)  # fmt: skip
def test_a_skipped_pod_is_charged_the_compute_it_records(
    skipped: SkippedPod, compute_used: tuple[int, int]
) -> None:
    """GPU 0 holds 700 compute_milli: a skipped pod's recorded compute is added where it may
    be, so no compute share is placed above 1000 beside it."""
    state = NodeState(NODE, (4, 0), gpu_compute_used=(700, 0))
    result = charged(state, [skipped])
    assert result.gpu_compute_used == compute_used
    # A 400-milli share now fits only where the charged compute leaves room for it.
    share = PodRequest("default/new", (ContainerRequest("main", 1, 1, compute_milli=400),))
    fit = check_fit(result, share)
    room = [i for i, used in enumerate(compute_used) if used + 400 <= 1000]
    assert [c.gpu_indices for c in fit.assignment] == [(room[0],)]


def test_a_skipped_pods_compute_is_named() -> None:
    ghost = refused(with_compute("ghost", 7, 4, 300), NODE, "GPU 7")
    assert ghost.describe().endswith(
        "counted as 4 on GPU 0, 4 on GPU 1, 300 compute_milli on GPU 0, 300 compute_milli on GPU 1"
    )
