"""Fit checks: fits now, does not fit now, can never fit — and the numbers that say why."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.fit import (
    FitResult,
    FitStatus,
    Reason,
    best_fit_order,
    best_fit_positions,
    check_fit,
)
from gpushare.core.model import (
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    NodeState,
    PodRequest,
)
from gpushare.testing.core import node_state as state
from gpushare.testing.core import pod_request as pod

MIB_16G = 16276  # a "16 GiB" GPU as NVML reports it, in MiB (design.md's example)
QUARTER = MIB_16G // 4  # 4069


@dataclass(frozen=True)
class Case:
    id: str
    state: NodeState
    pod: PodRequest
    status: FitStatus
    reason: Reason
    requested: int | None = None
    available: int | None = None
    container: str | None = None
    assignment: tuple[tuple[int, ...], ...] | None = None  # GPU indices per GPU container
    allocations: tuple[ContainerAllocation, ...] = ()  # the whole assignment, for TWO_D


CASES = [
    # --- design.md's example: two 16276 MiB GPUs, the pod asks 8138 MiB -----------------------
    Case(
        "N1 with 4069 free in all does not fit now",
        state((MIB_16G, MIB_16G), (MIB_16G - QUARTER, MIB_16G)),
        pod((2 * QUARTER, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=2 * QUARTER,
        container="c0",
    ),
    Case(
        "N2 with 4069+4069 free split across GPUs does not fit now",
        state((MIB_16G, MIB_16G), (MIB_16G - QUARTER, MIB_16G - QUARTER)),
        pod((2 * QUARTER, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=2 * QUARTER,
    ),
    Case(
        "N3 with 8138 free on GPU0 fits there",
        state((MIB_16G, MIB_16G), (MIB_16G - 2 * QUARTER, MIB_16G)),
        pod((2 * QUARTER, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    # --- edges -----------------------------------------------------------------------------
    Case(
        "fits exactly when free equals requested",
        state((16, 16), (16, 6)),
        pod((10, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((1,),),
    ),
    Case(
        "does not fit now when free is one short",
        state((16, 16), (16, 7)),
        pod((10, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=10,
    ),
    Case(
        "share equal to the whole GPU fits an empty GPU",
        state((16,)),
        pod((16, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    Case(
        "cpu-only pod fits a node without GPUs",
        state(()),
        pod((0, 0), cpu_milli=100),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((),),
    ),
    # --- can never fit ---------------------------------------------------------------------
    Case(
        "no GPUs on the node can never fit",
        state(()),
        pod((4, 1)),
        FitStatus.CAN_NEVER_FIT,
        Reason.NO_GPUS,
        requested=4,
    ),
    Case(
        "share larger than every GPU can never fit",
        state((MIB_16G, MIB_16G)),
        pod((MIB_16G + 1, 1)),
        FitStatus.CAN_NEVER_FIT,
        Reason.SHARE_EXCEEDS_GPU,
        requested=MIB_16G + 1,
        available=MIB_16G,
        container="c0",
    ),
    Case(
        "model excluded can never fit",
        state((16, 16), models=("T4", "T4")),
        pod(ContainerRequest("c0", 4, 1, frozenset({"V100"}))),
        FitStatus.CAN_NEVER_FIT,
        Reason.MODEL_EXCLUDED,
        requested=4,
        container="c0",
    ),
    Case(
        "share larger than every allowed model's GPU can never fit",
        state((32, 16), models=("A100", "T4")),
        pod(ContainerRequest("c0", 20, 1, frozenset({"T4"}))),
        FitStatus.CAN_NEVER_FIT,
        Reason.SHARE_EXCEEDS_GPU,
        requested=20,
        available=16,
        container="c0",
    ),
    Case(
        "gpu_count above the node's GPUs can never fit",
        state((16, 16)),
        pod((4, 3)),
        FitStatus.CAN_NEVER_FIT,
        Reason.TOO_FEW_GPUS,
        requested=3,
        available=2,
        container="c0",
    ),
    Case(
        "gpu_count above the GPUs large enough can never fit",
        state((32, 8, 8)),
        pod((16, 2)),
        FitStatus.CAN_NEVER_FIT,
        Reason.TOO_FEW_GPUS,
        requested=2,
        available=1,
        container="c0",
    ),
    Case(
        "cpu larger than the node can never fit",
        state((16,), cpu_milli=4000),
        pod((4, 1), cpu_milli=4001),
        FitStatus.CAN_NEVER_FIT,
        Reason.INSUFFICIENT_CPU,
        requested=4001,
        available=4000,
    ),
    Case(
        "memory larger than the node can never fit",
        state((16,), memory_mib=1024),
        pod((4, 1), memory_mib=2048),
        FitStatus.CAN_NEVER_FIT,
        Reason.INSUFFICIENT_MEMORY,
        requested=2048,
        available=1024,
    ),
    # --- insufficient cpu / memory now -----------------------------------------------------
    Case(
        "insufficient cpu now does not fit now",
        state((16,), cpu_milli=4000, cpu_used_milli=3500),
        pod((4, 1), cpu_milli=1000),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_CPU,
        requested=1000,
        available=500,
    ),
    Case(
        "cpu exactly free fits",
        state((16,), cpu_milli=4000, cpu_used_milli=3000),
        pod((4, 1), cpu_milli=1000),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    Case(
        "insufficient memory now does not fit now",
        state((16,), memory_mib=8192, memory_used_mib=8000),
        pod((4, 1), memory_mib=256),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_MEMORY,
        requested=256,
        available=192,
    ),
    Case(
        "unconstrained cpu and memory always fit",
        state((16,)),
        pod((4, 1), cpu_milli=10**9, memory_mib=10**9),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    # --- multi-GPU containers and multi-container pods -------------------------------------
    Case(
        "multi-GPU container takes the least-free GPUs that fit",
        state((16, 16, 16, 16), (0, 8, 4, 12)),
        pod((8, 2)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((1, 2),),
    ),
    Case(
        "multi-GPU container does not fit now with one GPU short",
        state((16, 16, 16), (0, 12, 12)),
        pod((8, 2)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=8,
        container="c0",
    ),
    Case(
        "two containers pack onto one GPU",
        state((16, 16)),
        pod((8, 1), (8, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,), (0,)),
    ),
    Case(
        "larger container placed first, smaller packs beside it",
        state((16, 16), (0, 10)),
        pod((4, 1), (12, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,), (0,)),
    ),
    Case(
        "second container finds no room does not fit now",
        state((16, 16), (0, 8)),
        pod((10, 1), (10, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=10,
        container="c1",
    ),
    Case(
        "cpu-only containers are left out of the assignment",
        state((16,)),
        pod((0, 0), (4, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    # --- health ----------------------------------------------------------------------------
    Case(
        "unhealthy GPU takes nothing new",
        state((16, 16), (12, 0), healthy=(True, False)),
        pod((8, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.UNHEALTHY,
        requested=8,
        container="c0",
    ),
    Case(
        "healthy GPU used instead of an emptier unhealthy one",
        state((16, 16), (4, 0), healthy=(True, False)),
        pod((8, 1)),
        FitStatus.FITS,
        Reason.FITS,
        assignment=((0,),),
    ),
    Case(
        "full healthy GPUs are insufficient, not unhealthy",
        state((16, 16), (12, 12)),
        pod((8, 1)),
        FitStatus.DOES_NOT_FIT_NOW,
        Reason.INSUFFICIENT_GPU,
        requested=8,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_check_fit(case: Case) -> None:
    result = check_fit(case.state, case.pod)
    assert (result.status, result.reason) == (case.status, case.reason), result.describe()
    assert result.fits == (case.status is FitStatus.FITS)
    assert result.free_per_gpu == case.state.gpu_free
    assert result.capacity_per_gpu == tuple(g.capacity for g in case.state.node.gpus)
    if case.requested is not None:
        assert result.requested == case.requested
    if case.available is not None:
        assert result.available == case.available
    if case.container is not None:
        assert result.container == case.container
    if case.assignment is not None:
        got = {a.container: a.gpu_indices for a in result.assignment}
        wanted = dict(zip((c.name for c in case.pod.gpu_containers), case.assignment, strict=False))
        assert got == wanted


def test_rejection_describes_its_numbers() -> None:
    result = check_fit(
        state((MIB_16G, MIB_16G), (MIB_16G - QUARTER, MIB_16G - QUARTER)),
        pod((2 * QUARTER, 1)),
    )
    assert result.describe() == (
        "no GPU has enough free; container c0; requested 8138; "
        "free/capacity per GPU 4069/16276, 4069/16276"
    )
    assert FitResult(FitStatus.FITS, Reason.FITS).describe() == "fits"


BEST_FIT = [
    ("design.md example picks GPU1", [12207, 8138, 4069, 16276], 8138, 1, None, [1]),
    ("ties go to the lowest index", [8, 16, 8], 8, 1, None, [0]),
    ("exact free is preferred", [9, 8, 16], 8, 1, None, [1]),
    ("two GPUs: the two least free that fit", [16, 8, 12, 4], 8, 2, None, [1, 2]),
    ("too few candidates", [16, 7, 7], 8, 2, None, None),
    ("nothing fits", [7, 7], 8, 1, None, None),
    ("disallowed model skipped", [8, 16], 8, 1, frozenset({"B"}), [1]),
]


@pytest.mark.parametrize(
    ("free", "share", "count", "allowed", "expected"),
    [row[1:] for row in BEST_FIT],
    ids=[row[0] for row in BEST_FIT],
)
def test_best_fit_positions(
    free: list[int],
    share: int,
    count: int,
    allowed: frozenset[str] | None,
    expected: list[int] | None,
) -> None:
    models = ("A", "B") + ("A",) * (len(free) - 2)
    container = ContainerRequest("c", share, count, allowed or frozenset())
    assert best_fit_positions(free, models, container) == expected


@given(
    free=st.lists(st.integers(0, 16), min_size=1, max_size=8),
    share=st.integers(1, 16),
    count=st.integers(1, 4),
)
def test_first_fit_in_best_fit_order_chooses_what_best_fit_chooses(
    free: list[int], share: int, count: int
) -> None:
    """The DRA allocator takes the first devices of a slice that fit; listed in
    ``best_fit_order``, they are the GPUs gpushare's best fit picks."""
    container = ContainerRequest("c", share, count, frozenset())
    first_fit = [p for p in best_fit_order(free) if free[p] >= share][:count]
    expected = best_fit_positions(free, ("A",) * len(free), container)
    assert (sorted(first_fit) if len(first_fit) == count else None) == expected


# --- properties ------------------------------------------------------------------------------

MODELS = ("A", "B")


@st.composite
def node_states(draw: st.DrawFn) -> NodeState:
    gpus = draw(
        st.lists(
            st.tuples(st.integers(1, 32), st.sampled_from(MODELS), st.booleans()),
            max_size=5,
        )
    )
    used = tuple(draw(st.integers(0, cap)) for cap, _, _ in gpus)
    compute_used = tuple(draw(st.sampled_from((0, 0, 300, 800, 1000))) for _ in gpus)
    whole = tuple(draw(st.booleans()) and draw(st.booleans()) for _ in gpus)
    cpu = draw(st.none() | st.integers(0, 8000))
    memory = draw(st.none() | st.integers(0, 8192))
    return state(
        tuple(cap for cap, _, _ in gpus),
        used,
        models=tuple(m for _, m, _ in gpus),
        healthy=tuple(h for _, _, h in gpus),
        cpu_milli=cpu,
        memory_mib=memory,
        cpu_used_milli=draw(st.integers(0, cpu)) if cpu is not None else 0,
        memory_used_mib=draw(st.integers(0, memory)) if memory is not None else 0,
        compute_used=compute_used,
        whole=whole,
    )


@st.composite
def containers(draw: st.DrawFn) -> ContainerRequest:
    share = draw(st.integers(0, 40))
    compute_milli = draw(st.sampled_from((0, 0, 100, 500, 1000)))
    exclusive = not share and not compute_milli and draw(st.booleans())
    count = draw(st.integers(1, 3)) if share or compute_milli or exclusive else 0
    allowed = draw(st.frozensets(st.sampled_from(MODELS)))
    # Names may repeat: the check must not rely on them being unique.
    name = draw(st.sampled_from("abc"))
    return ContainerRequest(name, share, count, allowed, compute_milli, exclusive)


pods = st.builds(
    PodRequest,
    key=st.just("ns/pod"),
    containers=st.lists(containers(), max_size=4).map(tuple),
    cpu_milli=st.integers(0, 9000),
    memory_mib=st.integers(0, 9000),
)


@given(node_states(), pods)
def test_a_fit_never_puts_a_gpu_above_capacity(before: NodeState, request: PodRequest) -> None:
    result = check_fit(before, request)
    if not result.fits:
        return
    gpus = before.node.gpus
    assert len(result.assignment) == len(request.gpu_containers)
    for got, asked in zip(result.assignment, request.gpu_containers, strict=True):
        assert got.exclusive == asked.exclusive
        if not asked.exclusive:
            assert (got.gpu_share, got.compute_milli) == (asked.gpu_share, asked.compute_milli)
        assert len(set(got.gpu_indices)) == len(got.gpu_indices) == asked.gpu_count
        for index in got.gpu_indices:
            assert asked.allows(before.node.gpu(index).model)
    allocation = Allocation(
        request.key, before.node.name, result.assignment, request.cpu_milli, request.memory_mib
    )
    after = before.with_allocation(allocation)
    for p, gpu in enumerate(gpus):
        used_before, used_after = before.gpu_used[p], after.gpu_used[p]
        assert used_after <= gpu.capacity
        assert after.gpu_compute_used[p] <= 1000, "compute above one GPU"
        if not gpu.healthy or before.gpu_whole[p]:
            assert used_after == used_before, "unhealthy or whole-held GPU took new units"
            assert after.gpu_compute_used[p] == before.gpu_compute_used[p]
        if after.gpu_whole[p] and not before.gpu_whole[p]:
            assert before.is_unused(p), "a whole GPU was taken from a GPU in use"
            takers = [a for a in result.assignment if gpu.index in a.gpu_indices]
            assert len(takers) == 1, "a GPU taken whole is shared within the pod"
    if before.node.cpu_milli is not None:
        assert after.cpu_used_milli <= before.node.cpu_milli
    if before.node.memory_mib is not None:
        assert after.memory_used_mib <= before.node.memory_mib


@given(node_states(), pods)
def test_can_never_fit_means_not_even_an_empty_healthy_node(
    current: NodeState, request: PodRequest
) -> None:
    result = check_fit(current, request)
    if result.status is not FitStatus.CAN_NEVER_FIT:
        return
    node = current.node
    pristine = NodeState.empty(
        replace(node, gpus=tuple(replace(g, healthy=True) for g in node.gpus))
    )
    assert not check_fit(pristine, request).fits


def test_assignment_is_keyed_by_container_position_not_name() -> None:
    """Two containers with one name must not share one assignment (that would overcommit)."""
    request = PodRequest(
        "ns/pod", (ContainerRequest("same", 10, 1), ContainerRequest("same", 8, 1))
    )
    result = check_fit(state((16, 16)), request)
    assert result.fits
    assert [a.gpu_indices for a in result.assignment] == [(0,), (1,)]
    assert isinstance(result.assignment[0], ContainerAllocation)


# --- the second dimension: compute shares and whole GPUs (docs/compute.md) -----------------


def compute(name: str, share: int, compute_milli: int, count: int = 1) -> ContainerRequest:
    return ContainerRequest(name, share, count, compute_milli=compute_milli)


def whole(name: str, count: int = 1) -> ContainerRequest:
    return ContainerRequest(name, 0, count, exclusive=True)


TWO_D = [
    Case("memory and compute free: binpacks on memory",
         state((16, 16), (8, 0)), pod(compute("c", 4, 500)), FitStatus.FITS, Reason.FITS,
         allocations=(ContainerAllocation("c", (0,), 4, 500),)),
    Case("compute steers past the GPU with least memory free when its compute is taken",
         state((16, 16), (8, 0), compute_used=(800, 0)), pod(compute("c", 4, 300)),
         FitStatus.FITS, Reason.FITS, allocations=(ContainerAllocation("c", (1,), 4, 300),)),
    Case("memory free but compute taken everywhere: says compute, with the compute asked",
         state((16, 16), compute_used=(800, 800)), pod(compute("c", 4, 300)),
         FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_COMPUTE, requested=300),
    Case("compute free but memory short: says memory",
         state((16, 16), (14, 14)), pod(compute("c", 4, 300)),
         FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_GPU, requested=4),
    Case("a compute-only container (openb) binpacks on compute, memory not asked",
         state((16, 16), (16, 16), compute_used=(200, 600)), pod(compute("c", 0, 400)),
         FitStatus.FITS, Reason.FITS, allocations=(ContainerAllocation("c", (1,), 0, 400),)),
    Case("a pod asking no compute is not bounded by it (Alibaba's dialect)",
         state((16, 16), (0, 0), compute_used=(1000, 1000)), pod(("c", 4, 1)),
         FitStatus.FITS, Reason.FITS, allocations=(ContainerAllocation("c", (0,), 4),)),
    Case("a whole GPU takes a GPU that holds nothing, recorded whole",
         state((16, 16), (4, 0)), pod(whole("w")), FitStatus.FITS, Reason.FITS,
         allocations=(ContainerAllocation("w", (1,), 16, 1000, exclusive=True),)),
    Case("a GPU with compute in use is not unused",
         state((16, 16), (0, 0), compute_used=(100, 100)), pod(whole("w")),
         FitStatus.DOES_NOT_FIT_NOW, Reason.NO_UNUSED_GPU, requested=1),
    Case("two whole GPUs take the two unused ones",
         state((16, 16, 16), (0, 4, 0)), pod(whole("w", 2)), FitStatus.FITS, Reason.FITS,
         allocations=(ContainerAllocation("w", (0, 2), 16, 1000, exclusive=True),)),
    Case("whole GPUs beyond the node's count can never fit",
         state((16, 16)), pod(whole("w", 3)), FitStatus.CAN_NEVER_FIT, Reason.TOO_FEW_GPUS,
         requested=3),
    Case("a GPU held whole takes no memory pod, even one that would fit its numbers",
         state((16, 16), whole=(True, False)), pod(("c", 4, 1)),
         FitStatus.FITS, Reason.FITS, allocations=(ContainerAllocation("c", (1,), 4),)),
    Case("a GPU held whole takes no compute-only pod",
         state((16, 16), (0, 0), compute_used=(0, 900), whole=(True, False)),
         pod(compute("c", 0, 300)), FitStatus.DOES_NOT_FIT_NOW, Reason.INSUFFICIENT_COMPUTE,
         requested=300),
    Case("the only unused GPU is unhealthy: says unhealthy",
         state((16, 16), (4, 0), healthy=(True, False)), pod(whole("w")),
         FitStatus.DOES_NOT_FIT_NOW, Reason.UNHEALTHY, requested=1),
    Case("a whole-GPU container and a shared one in one pod use different GPUs",
         state((16, 16)), pod(compute("s", 4, 200), whole("w")), FitStatus.FITS, Reason.FITS,
         allocations=(ContainerAllocation("s", (1,), 4, 200),
                     ContainerAllocation("w", (0,), 16, 1000, exclusive=True))),
]  # fmt: skip


@pytest.mark.parametrize("case", TWO_D, ids=[c.id for c in TWO_D])
def test_check_fit_in_two_dimensions(case: Case) -> None:
    result = check_fit(case.state, case.pod)
    assert (result.status, result.reason) == (case.status, case.reason), result.describe()
    asks = any(c.compute_milli or c.exclusive for c in case.pod.gpu_containers)
    # Compute numbers only for pods that ask it: others read as before.
    assert result.compute_free_per_gpu == (case.state.gpu_compute_free if asks else ())
    if case.requested is not None:
        assert result.requested == case.requested
    assert result.assignment == case.allocations


def test_a_compute_rejection_describes_both_dimensions() -> None:
    result = check_fit(state((16, 16), (4, 0), compute_used=(800, 900)), pod(compute("c", 4, 300)))
    assert result.describe() == (
        "no GPU has enough free compute; container c; requested 300; "
        "free/capacity per GPU 12/16, 16/16; compute free per GPU 200, 100 (of 1000)"
    )
