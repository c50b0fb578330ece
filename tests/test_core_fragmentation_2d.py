"""Fragmentation and FGD in two dimensions (memory and compute, docs/compute.md): a GPU short
of a shape's memory *or* compute is fragmented for it, idle is what is free in both, and with
one dimension every number is the paper's F to the last bit."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.fragmentation import (
    ComputeFree,
    FragmentationMeasure,
    TargetWorkload,
    TaskShape,
    compute_of,
    cpu_aware_fragmentation,
    gpu_idle,
    node_fragmentation,
    shape_fragmentation,
    state_fragmentation,
)
from gpushare.core.model import Allocation, ContainerRequest, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies import PolicyContext, make_policy
from gpushare.core.policies.fgd import sigmoid
from gpushare.core.policies.fgd_cpu import CPU_WEIGHT, FgdCpuPolicy
from gpushare.testing.core import node_state, pod_request

CAPACITY = 1000


def compute(*free_milli: int, capacity: int = CAPACITY) -> ComputeFree:
    return ComputeFree(tuple(free_milli), (capacity,) * len(free_milli))


# --- F_n(m) in two dimensions, case by case --------------------------------------------------


@dataclass(frozen=True)
class Case2d:
    id: str
    free: tuple[int, ...]
    compute_free: tuple[int, ...]
    shape: TaskShape
    expected: int
    capacity: int = CAPACITY


CASES_2D = [
    Case2d(
        "memory fits but compute is short: fragmented",
        (800, 1000),
        (100, 1000),
        TaskShape(0, 500, 1, compute_milli=300),
        100,  # GPU 0's idle: min(800, 100)
    ),
    Case2d(
        "compute fits but memory is short: fragmented",
        (200, 1000),
        (900, 1000),
        TaskShape(0, 500, 1, compute_milli=300),
        200,
    ),
    Case2d(
        "both fit: usable",
        (600, 600),
        (400, 300),
        TaskShape(0, 500, 1, compute_milli=300),
        0,
    ),
    Case2d(
        "no GPU holds both: all idle, min of the two per GPU",
        (800, 200),
        (100, 900),
        TaskShape(0, 500, 1, compute_milli=300),
        100 + 200,
    ),
    Case2d(
        "a shape asking no compute is not bounded by it",
        (800, 200),
        (0, 900),
        TaskShape(0, 500, 1),
        200,  # GPU 0 is usable (memory); GPU 1 is not, its idle min(200, 900)
    ),
    Case2d(
        "idle compute is counted in the memory unit",
        (16, 16),
        (500, 1000),
        TaskShape(0, 8, 1, compute_milli=600),
        8,  # GPU 0: min(16, 500 * 16 // 1000)
        capacity=16,
    ),
    Case2d(
        "compute-only shape on memory-free GPUs reads compute alone (openb as compute)",
        (1000, 1000, 1000),
        (190, 600, 1000),
        TaskShape(0, 0, 1, compute_milli=500),
        190,
    ),
]


@pytest.mark.parametrize("case", CASES_2D, ids=lambda c: c.id)
def test_shape_fragmentation_in_two_dimensions(case: Case2d) -> None:
    view = compute(*case.compute_free, capacity=case.capacity)
    models = ("V100",) * len(case.free)
    assert shape_fragmentation(case.free, models, None, case.shape, view) == case.expected
    workload = TargetWorkload((case.shape,), (1.0,))
    assert node_fragmentation(case.free, models, None, workload, view) == case.expected


def test_gpu_idle_is_the_smaller_free_dimension() -> None:
    assert gpu_idle((800, 200, 16), ComputeFree((100, 900, 500), (1000, 1000, 32))) == [
        100,
        200,
        16,
    ]
    assert gpu_idle((800, 200)) == [800, 200]


# --- one dimension: exactly the paper's F ----------------------------------------------------

MODELS = ("A", "B")
SHARES = st.sampled_from((0, 100, 250, 500, 700, 1000)) | st.integers(0, 1000)


@st.composite
def one_dimensional_shapes(draw: st.DrawFn) -> TaskShape:
    share = draw(SHARES)
    count = draw(st.integers(1, 4)) if share else 0
    allowed = draw(st.frozensets(st.sampled_from(MODELS), max_size=1)) if share else frozenset()
    return TaskShape(draw(st.integers(0, 8000)), share, count, allowed)


@st.composite
def one_dimensional_nodes(draw: st.DrawFn) -> tuple[list[int], list[str], int | None]:
    count = draw(st.integers(0, 8))
    free = draw(st.lists(SHARES, min_size=count, max_size=count))
    if draw(st.booleans()):
        models = [draw(st.sampled_from(MODELS))] * count
    else:
        models = draw(st.lists(st.sampled_from(MODELS), min_size=count, max_size=count))
    return free, models, draw(st.none() | st.integers(0, 9000))


@st.composite
def weighted(draw: st.DrawFn) -> TargetWorkload:
    shapes = draw(st.lists(one_dimensional_shapes(), min_size=1, max_size=6))
    raw = draw(st.lists(st.integers(1, 100), min_size=len(shapes), max_size=len(shapes)))
    return TargetWorkload(tuple(shapes), tuple(w / sum(raw) for w in raw))


@given(one_dimensional_nodes(), weighted())
def test_all_compute_free_is_the_one_dimensional_f_bit_for_bit(
    node: tuple[list[int], list[str], int | None], workload: TargetWorkload
) -> None:
    free, models, cpu = node
    view = compute(*([1000] * len(free)))
    assert node_fragmentation(free, models, cpu, workload, view) == node_fragmentation(
        free, models, cpu, workload
    )
    assert cpu_aware_fragmentation(free, models, cpu, workload, compute=view) == (
        cpu_aware_fragmentation(free, models, cpu, workload)
    )


@given(one_dimensional_nodes(), weighted())
def test_openb_read_as_compute_has_the_same_f_bit_for_bit(
    node: tuple[list[int], list[str], int | None], workload: TargetWorkload
) -> None:
    """The share read as memory (compute all free) or as compute (memory all free): same F."""
    free, models, cpu = node
    as_compute = TargetWorkload(
        tuple(
            TaskShape(s.cpu_milli, 0, s.gpu_count, s.allowed_models, s.gpu_share)
            for s in workload.shapes
        ),
        workload.weights,
    )
    memory_free = [1000] * len(free)
    view = compute(*free)
    assert node_fragmentation(memory_free, models, cpu, as_compute, view) == (
        node_fragmentation(free, models, cpu, workload)
    )
    assert cpu_aware_fragmentation(memory_free, models, cpu, as_compute, compute=view) == (
        cpu_aware_fragmentation(free, models, cpu, workload)
    )


def test_a_state_without_compute_is_measured_in_one_dimension() -> None:
    workload = TargetWorkload((TaskShape(0, 500, 1),), (1.0,))
    assert compute_of(node_state([1000, 1000], [600, 0]), workload) is None
    compute_pod = pod_request(ContainerRequest("c", 200, 1, compute_milli=700))
    assert compute_of(node_state([1000, 1000], [600, 0]), workload, compute_pod) == compute(
        1000, 1000
    )
    used = node_state([1000, 1000], [600, 0], compute_used=[700, 0])
    assert compute_of(used, workload) == compute(300, 1000)
    # 2-D: GPU 0 has 400 memory but only 300 compute; a 500-memory shape cannot use it anyway.
    assert state_fragmentation(used, workload) == 300


# --- the target workload and task shapes -----------------------------------------------------


def test_task_shape_of_a_pod_reads_compute_and_whole_gpus() -> None:
    compute_pod = pod_request(ContainerRequest("c", 200, 1, compute_milli=700), cpu_milli=8000)
    assert TaskShape.of(compute_pod) == TaskShape(8000, 200, 1, compute_milli=700)
    whole = pod_request(ContainerRequest("c", 0, 2, exclusive=True))
    assert TaskShape.of(whole) == TaskShape(0, 0, 2, compute_milli=1000)
    assert not TargetWorkload.from_pods([pod_request((500, 1))]).two_dimensional
    assert TargetWorkload.from_pods([compute_pod]).two_dimensional


# --- FGD and fgd-cpu in two dimensions -------------------------------------------------------

INFERENCE = TaskShape(0, 700, 1, compute_milli=100)
TRAINING = TaskShape(0, 200, 1, compute_milli=700)
MIXED_M = TargetWorkload((INFERENCE, TRAINING), (0.5, 0.5))


@pytest.mark.parametrize("policy_name", ["fgd", "fgd-cpu"])
def test_fgd_puts_a_training_pod_beside_an_inference_pod(policy_name: str) -> None:
    """GPU 0 holds 700 memory / 100 compute. A 200 / 700 pod there leaves F = 100 (Δ −50);
    on the empty GPU 1 it would leave GPU 1 unusable by inference and GPU 0 by training
    (F = 300, Δ +150)."""
    state = node_state([1000, 1000], [700, 0], compute_used=[100, 0], cpu_milli=64_000)
    pod = pod_request(ContainerRequest("main", 200, 1, compute_milli=700))
    policy = make_policy(policy_name, PolicyContext(workload=MIXED_M))
    (allocation,) = policy.choose_gpus(state, pod)
    assert allocation.gpu_indices == (0,)
    assert allocation.compute_milli == 700
    assert allocation.gpu_share == 200


def test_fgd_gives_whole_gpus_the_fit_checks_assignment() -> None:
    state = node_state([1000, 1000, 1000], [300, 0, 0], compute_used=[300, 0, 0])
    pod = pod_request(ContainerRequest("main", 0, 2, exclusive=True))
    policy = make_policy("fgd", PolicyContext(workload=MIXED_M))
    (allocation,) = policy.choose_gpus(state, pod)
    assert allocation.exclusive
    assert allocation.gpu_indices == (1, 2)
    assert policy.score(state, pod) >= 0


@dataclass(frozen=True)
class AfterCase:
    id: str
    state: NodeState
    pod: PodRequest
    workload: TargetWorkload


TWO_OF_EIGHT = TargetWorkload((TaskShape(0, 8, 2),), (1.0,))

AFTER_CASES = [
    AfterCase(
        "memory only: the paper's F after the pod's GPUs",
        node_state([1000, 1000, 1000], [300, 0, 600], cpu_milli=64_000),
        pod_request((500, 1), cpu_milli=8000),
        TargetWorkload((TaskShape(8000, 500, 1), TaskShape(4000, 300, 2)), (0.5, 0.5)),
    ),
    AfterCase(
        "memory and compute: both taken on the chosen GPU",
        node_state([1000, 1000], [700, 0], compute_used=[100, 0], cpu_milli=64_000),
        pod_request(ContainerRequest("main", 200, 1, compute_milli=700), cpu_milli=8000),
        MIXED_M,
    ),
    AfterCase(
        # The fit check records the smaller capacity (16) as the share of both GPUs; the
        # 32 GPU held whole still has nothing free, not 16 (it takes nothing new).
        "whole GPUs of 16 and 32: neither has anything free after",
        node_state([16, 32, 32], cpu_milli=64_000),
        pod_request(ContainerRequest("main", 0, 2, exclusive=True), cpu_milli=8000),
        TWO_OF_EIGHT,
    ),
]


@pytest.mark.parametrize("case", AFTER_CASES, ids=lambda c: c.id)
def test_fgd_scores_the_node_state_after_its_own_choice(case: AfterCase) -> None:
    """FGD's score and fgd-cpu's tie-break are ⌊100·σ(−Δ/unit)⌋ of the fragmentation change
    to the node state that the chosen allocation really leaves (``NodeState.with_allocation``)."""
    context = PolicyContext(workload=case.workload)
    fgd = make_policy("fgd", context)
    allocation = Allocation(
        case.pod.key, case.state.node.name, fgd.choose_gpus(case.state, case.pod),
        cpu_milli=case.pod.cpu_milli,
    )  # fmt: skip
    after = case.state.with_allocation(allocation)

    def truncated(measure: FragmentationMeasure) -> float:
        def f(state: NodeState) -> float:
            view = compute_of(state, case.workload, case.pod)
            return measure(
                state.gpu_free, state.node.models, state.cpu_free_milli, case.workload,
                compute=view,
            )  # fmt: skip

        delta = f(after) - f(case.state)
        return float(int(100.0 * sigmoid(-delta / context.gpu_unit)))

    assert fgd.score(case.state, case.pod) == truncated(node_fragmentation)
    cpu_aware = functools.partial(cpu_aware_fragmentation, cpu_weight=CPU_WEIGHT)
    fgd_cpu = FgdCpuPolicy(context)
    assert fgd_cpu.tie_break(case.state, case.pod) == truncated(cpu_aware)


def test_the_placer_sees_compute_taken_by_a_pod_that_asks_no_memory() -> None:
    """Regression: the Placer cached fit results on memory in use only, so a second
    compute-only pod was placed on a GPU whose compute the first one holds (overcommit)."""
    pod = pod_request(ContainerRequest("main", 0, 1, compute_milli=600), key="ns/a")
    second = pod_request(ContainerRequest("main", 0, 1, compute_milli=600), key="ns/b")
    context = PolicyContext(workload=TargetWorkload.from_pods([pod]))
    placer = Placer([node_state([1000])], make_policy("bestfit", context))
    decision = placer.decide(pod)
    assert decision is not None
    state: NodeState = placer.states[0].with_allocation(decision.allocation)
    placer.replace(0, state)
    assert state.gpu_compute_used == (600,)
    assert placer.decide(second) is None
