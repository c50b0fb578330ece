"""gpushare's CPU-aware fragmentation (``cpu_aware_fragmentation``) and the ``fgd-cpu`` policy."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.fragmentation import (
    TargetWorkload,
    TaskShape,
    cpu_aware_fragmentation,
    node_fragmentation,
)
from gpushare.core.model import ContainerRequest, Gpu, Node, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies import PolicyContext, make_policy
from gpushare.core.policies.fgd_cpu import FgdCpuPolicy, node_type, reserved_node_types
from gpushare.testing.core import gpu_node

ONE_GPU_4_CPU = TargetWorkload((TaskShape(4000, 1000, 1),), (1.0,))
EIGHT_FREE = (1000,) * 8
MODELS = ("G2",) * 8


@pytest.mark.parametrize(
    ("cpu_free", "cpu_weight", "expected"),
    [
        (64_000, 0.7, 0.0),  # 16 copies of CPU for 8 GPUs: nothing stranded, as the paper
        (8_000, 0.0, 0.0),  # β = 0 is the paper's F
        (8_000, 1.0, 6000.0),  # CPU for 2 copies: 6 whole GPUs stranded
        (8_000, 0.5, 3000.0),  # blended halfway
        (3_000, 1.0, 8000.0),  # not even one copy: all idle GPU, as the paper
    ],
    ids=[
        "plenty-of-cpu-equals-paper",
        "beta-zero-equals-paper",
        "cpu-for-two-copies-strands-six-gpus",
        "beta-half-blends",
        "cpu-short-of-one-copy-is-all-idle",
    ],
)
def test_idle_gpu_the_cpu_cannot_serve_is_fragmented(
    cpu_free: int, cpu_weight: float, expected: float
) -> None:
    value = cpu_aware_fragmentation(EIGHT_FREE, MODELS, cpu_free, ONE_GPU_4_CPU, cpu_weight)
    assert value == pytest.approx(expected)


def test_unconstrained_cpu_equals_the_paper() -> None:
    free = (1000, 300, 0, 700)
    models = ("T4",) * 4
    assert cpu_aware_fragmentation(free, models, None, ONE_GPU_4_CPU) == node_fragmentation(
        free, models, None, ONE_GPU_4_CPU
    )


def test_fgd_cpu_keeps_cpu_only_pods_off_gpu_dense_nodes() -> None:
    """A CPU-only pod goes to the CPU-rich node, not to the one whose CPU its GPUs need."""
    dense = Node("dense", tuple(Gpu(i, "G2", 1000) for i in range(8)), cpu_milli=96_000)
    rich = Node("rich", tuple(Gpu(i, "T4", 1000) for i in range(2)), cpu_milli=104_000)
    workload = TargetWorkload((TaskShape(12_000, 1000, 1),), (1.0,))
    context = PolicyContext(workload=workload)
    cpu_pod = PodRequest("cpu", (ContainerRequest("main", 0, 0),), cpu_milli=40_000)
    policy = FgdCpuPolicy(context)
    dense_score = policy.tie_break(NodeState.empty(dense), cpu_pod)
    rich_score = policy.tie_break(NodeState.empty(rich), cpu_pod)
    assert rich_score > dense_score
    paper = make_policy("fgd", context)
    assert paper.score(NodeState.empty(rich), cpu_pod) == paper.score(
        NodeState.empty(dense), cpu_pod
    )


def _gpu_node(name: str, model: str, gpus: int, cpu_milli: int) -> Node:
    return gpu_node((1000,) * gpus, name=name, model=model, cpu_milli=cpu_milli)


def test_fgd_score_is_the_primary_key() -> None:
    """fgd-cpu scores exactly as FGD; its CPU-aware tie-break (0–100) only orders FGD's ties."""
    workload = TargetWorkload((TaskShape(4000, 500, 1), TaskShape(4000, 1000, 1)), (0.5, 0.5))
    context = PolicyContext(workload=workload)
    fgd = make_policy("fgd", context)
    ours = FgdCpuPolicy(context)
    request = PodRequest("p", (ContainerRequest("main", 500),), cpu_milli=4000)
    states = [
        NodeState(_gpu_node("a", "T4", 2, 32_000), (500, 0)),
        NodeState(_gpu_node("b", "T4", 2, 32_000), (0, 0)),
        NodeState(_gpu_node("c", "T4", 2, 6_000), (0, 0)),
    ]
    for state in states:
        assert ours.score(state, request) == fgd.score(state, request)
        assert 0 <= ours.tie_break(state, request) <= 100


def test_placer_breaks_fgd_ties_by_cpu() -> None:
    """Two nodes FGD scores alike: the one whose CPU still serves its GPUs wins, whatever the
    node order."""
    workload = TargetWorkload((TaskShape(8000, 1000, 1),), (1.0,))
    context = PolicyContext(workload=workload)
    request = PodRequest("p", (ContainerRequest("main", 0, 0),), cpu_milli=8000)
    cramped = NodeState(_gpu_node("cramped", "G2", 4, 36_000), (0, 0, 0, 0))  # 4 copies → 3
    roomy = NodeState(_gpu_node("roomy", "G2", 4, 96_000), (0, 0, 0, 0))
    for order in ((0, 1), (1, 0)):
        placer = Placer([cramped, roomy], FgdCpuPolicy(context), order)
        decision = placer.decide(request)
        assert decision is not None
        assert decision.allocation.node == "roomy"


def test_scarce_node_types_are_reserved_for_the_shapes_that_need_them() -> None:
    """T4-only pods are a large share of demand and T4 nodes a small share of GPUs: T4 nodes are
    reserved for them; unconstrained shapes, hosted everywhere, reserve nothing."""
    cluster = tuple(_gpu_node(f"g{i}", "G2", 8, 96_000) for i in range(9)) + tuple(
        _gpu_node(f"t{i}", "T4", 2, 104_000) for i in range(4)
    )
    t4_only = TaskShape(8000, 1000, 1, frozenset({"T4"}))
    anywhere = TaskShape(8000, 1000, 1)
    reserved, group_of = reserved_node_types(
        cluster, TargetWorkload((t4_only, anywhere), (0.3, 0.7))
    )
    t4_type, g2_type = node_type(cluster[-1]), node_type(cluster[0])
    assert group_of[t4_only] in reserved[t4_type]
    assert g2_type not in reserved
    assert group_of[anywhere] not in reserved.get(t4_type, set())


@settings(max_examples=200, deadline=None)
@given(
    free=st.lists(st.integers(0, 1000), min_size=2, max_size=8),
    cpu=st.one_of(st.none(), st.integers(0, 64_000)),
    shapes=st.lists(
        st.tuples(st.integers(0, 16_000), st.integers(1, 1000), st.integers(1, 4)),
        min_size=1,
        max_size=5,
    ),
)
def test_fast_path_equals_the_general_path(
    free: list[int], cpu: int | None, shapes: list[tuple[int, int, int]]
) -> None:
    """One-model nodes take a sorted/bisect path; with unconstrained shapes, renaming one GPU's
    model (forcing the general path) must not change the value."""
    workload = TargetWorkload(
        tuple(TaskShape(d, g, k) for d, g, k in shapes), (1.0 / len(shapes),) * len(shapes)
    )
    same = ("A",) * len(free)
    mixed = ("A",) * (len(free) - 1) + ("B",)
    assert cpu_aware_fragmentation(free, same, cpu, workload) == pytest.approx(
        cpu_aware_fragmentation(free, mixed, cpu, workload)
    )
