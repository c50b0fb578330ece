"""Fragmentation F_n(m) and F_n(M) after the FGD paper (METHOD.md §2), the target workload M,
and the empty-cluster check against the real openb trace."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.fragmentation import (
    TargetWorkload,
    TaskShape,
    node_fragmentation,
    shape_fragmentation,
    state_fragmentation,
)
from gpushare.core.model import ContainerRequest, Gpu, Node, NodeState, PodRequest
from gpushare.sim.trace import load_trace

REPO = Path(__file__).resolve().parents[1]
REAL_TRACE_DIR = (REPO / ".." / "shared" / "traces" / "openb").resolve()
ANY: frozenset[str] = frozenset()


# --- F_n(m), case by case (METHOD.md §2) -----------------------------------------------------


@dataclass(frozen=True)
class FragCase:
    id: str
    free: tuple[int, ...]
    shape: TaskShape
    expected: int
    cpu_free_milli: int | None = None
    models: tuple[str, ...] | None = None  # default: every GPU "V100"


FRAG_CASES = [
    # 1. CPU-only task: every idle GPU is a fragment.
    FragCase("cpu-only task counts all idle", (1000, 600, 0), TaskShape(2000, 0, 0), 1600),
    FragCase(
        "cpu-only task counts all idle even with cpu short",
        (1000, 250),
        TaskShape(9000, 0, 0),
        1250,
        cpu_free_milli=100,
    ),
    FragCase("cpu-only task on a full node is zero", (0, 0), TaskShape(1000, 0, 0), 0),
    # 2. Model mismatch: all idle.
    FragCase(
        "model mismatch counts all idle",
        (1000, 600),
        TaskShape(0, 500, 1, frozenset({"T4"})),
        1600,
    ),
    FragCase(
        "allowed model behaves like any model",
        (1000, 300),
        TaskShape(0, 500, 1, frozenset({"V100", "T4"})),
        300,
    ),
    # 3. Cannot fit: all idle.
    FragCase(
        "cpu short counts all idle",
        (1000, 300),
        TaskShape(4000, 500, 1),
        1300,
        cpu_free_milli=3999,
    ),
    FragCase(
        "cpu exactly free fits",
        (1000, 300),
        TaskShape(4000, 500, 1),
        300,
        cpu_free_milli=4000,
    ),
    FragCase(
        "unconstrained cpu fits any cpu request",
        (1000, 300),
        TaskShape(10**9, 500, 1),
        300,
        cpu_free_milli=None,
    ),
    FragCase(
        "fewer than k GPUs with free >= g counts all idle",
        (1000, 600, 300),
        TaskShape(0, 1000, 2),
        1900,
    ),
    FragCase("no GPU holds g counts all idle", (400, 300), TaskShape(0, 500, 1), 700),
    FragCase("node without GPUs has no idle GPU", (), TaskShape(0, 500, 1), 0),
    # 4. Fits: only pieces smaller than g.
    FragCase("fits: only pieces < g count", (1000, 600, 300, 0), TaskShape(0, 500, 1), 300),
    FragCase("fits: free equal to g is usable", (500, 499), TaskShape(0, 500, 1), 499),
    FragCase(
        "fits: k GPUs exactly available",
        (1000, 1000, 700),
        TaskShape(0, 1000, 2),
        700,
    ),
    FragCase(
        "whole-GPU task counts every partial GPU",
        (1000, 1000, 600, 300, 0),
        TaskShape(0, 1000, 1),
        900,
    ),
    FragCase(
        "fully free node has no fragment for a fitting task", (1000,) * 4, TaskShape(0, 250, 1), 0
    ),
    FragCase(
        "mixed-model node: excluded models count, the allowed GPUs fit",
        (1000, 1000),
        TaskShape(0, 500, 1, frozenset({"A"})),
        1000,
        models=("A", "B"),
    ),
]


@pytest.mark.parametrize("case", FRAG_CASES, ids=[c.id for c in FRAG_CASES])
def test_shape_fragmentation(case: FragCase) -> None:
    models = case.models or ("V100",) * len(case.free)
    got = shape_fragmentation(case.free, models, case.cpu_free_milli, case.shape)
    assert got == case.expected


@pytest.mark.parametrize("case", FRAG_CASES, ids=[c.id for c in FRAG_CASES])
def test_node_fragmentation_of_a_single_shape_is_that_shape(case: FragCase) -> None:
    models = case.models or ("V100",) * len(case.free)
    workload = TargetWorkload((case.shape,), (1.0,))
    got = node_fragmentation(case.free, models, case.cpu_free_milli, workload)
    assert got == pytest.approx(case.expected)


def test_node_fragmentation_weights_the_shapes() -> None:
    workload = TargetWorkload(
        (TaskShape(0, 0, 0), TaskShape(0, 500, 1), TaskShape(0, 1000, 1)), (0.2, 0.5, 0.3)
    )
    # idle 1900; g=500 leaves 300; g=1000 leaves 600 + 300.
    got = node_fragmentation((1000, 600, 300), ("V100",) * 3, None, workload)
    assert got == pytest.approx(0.2 * 1900 + 0.5 * 300 + 0.3 * 900)


def test_state_fragmentation_reads_free_gpus_models_and_cpu() -> None:
    node = Node(
        "n",
        (Gpu(0, "V100", 1000), Gpu(1, "V100", 1000), Gpu(2, "V100", 1000, healthy=False)),
        cpu_milli=8000,
    )
    state = NodeState(node, gpu_used=(400, 0, 0), cpu_used_milli=5000)
    workload = TargetWorkload((TaskShape(2000, 700, 1), TaskShape(4000, 500, 1)), (0.5, 0.5))
    # The unhealthy GPU is not idle: free (600, 1000, 0), CPU free 3000.
    # 2000-CPU shape fits (600 < 700 counts); 4000-CPU shape is CPU short (all 1600 counts).
    assert state_fragmentation(state, workload) == pytest.approx(0.5 * 600 + 0.5 * 1600)


# --- the fast path equals the definition -----------------------------------------------------

MODELS = ("A", "B", "C")
SHARES = st.sampled_from((0, 100, 250, 300, 500, 700, 1000)) | st.integers(0, 1000)


@st.composite
def task_shapes(draw: st.DrawFn) -> TaskShape:
    share = draw(SHARES)
    count = draw(st.integers(1, 4)) if share else 0
    allowed = draw(st.frozensets(st.sampled_from(MODELS), max_size=2)) if share else ANY
    return TaskShape(draw(st.integers(0, 8000)), share, count, allowed)


@st.composite
def workloads(draw: st.DrawFn) -> TargetWorkload:
    shapes = draw(st.lists(task_shapes(), min_size=1, max_size=6))
    raw = draw(st.lists(st.integers(1, 100), min_size=len(shapes), max_size=len(shapes)))
    return TargetWorkload(tuple(shapes), tuple(w / sum(raw) for w in raw))


@st.composite
def nodes(draw: st.DrawFn) -> tuple[list[int], list[str], int | None]:
    count = draw(st.integers(0, 8))
    free = draw(st.lists(SHARES, min_size=count, max_size=count))
    if draw(st.booleans()):
        models = [draw(st.sampled_from(MODELS))] * count  # homogeneous: the fast path
    else:
        models = draw(st.lists(st.sampled_from(MODELS), min_size=count, max_size=count))
    cpu = draw(st.none() | st.integers(0, 9000))
    return free, models, cpu


@given(nodes(), workloads())
def test_node_fragmentation_is_the_weighted_sum_of_shape_fragmentation(
    node: tuple[list[int], list[str], int | None], workload: TargetWorkload
) -> None:
    free, models, cpu = node
    expected = sum(
        weight * shape_fragmentation(free, models, cpu, shape)
        for shape, weight in zip(workload.shapes, workload.weights, strict=True)
    )
    assert node_fragmentation(free, models, cpu, workload) == pytest.approx(expected)


@given(nodes(), task_shapes())
def test_fragmentation_never_exceeds_idle_gpu(
    node: tuple[list[int], list[str], int | None], shape: TaskShape
) -> None:
    free, models, cpu = node
    assert 0 <= shape_fragmentation(free, models, cpu, shape) <= sum(free)


# --- the target workload M -------------------------------------------------------------------


def _pods(counts: dict[TaskShape, int]) -> list[PodRequest]:
    """``count`` pods of each shape (any model), grouped by shape in dict order, keys unique."""
    pods: list[PodRequest] = []
    for shape, count in counts.items():
        for _ in range(count):
            container = ContainerRequest("main", shape.gpu_share, shape.gpu_count)
            pods.append(PodRequest(f"p{len(pods)}", (container,), cpu_milli=shape.cpu_milli))
    return pods


# Ten pods: A ×5, B ×3, C ×1, D ×1.
SHAPE_A = TaskShape(1000, 500, 1)
SHAPE_B = TaskShape(0, 0, 0)
SHAPE_C = TaskShape(2000, 1000, 2)
SHAPE_D = TaskShape(4000, 1000, 1)
TEN_PODS = _pods({SHAPE_D: 1, SHAPE_B: 3, SHAPE_C: 1, SHAPE_A: 5})


@dataclass(frozen=True)
class CoverageCase:
    id: str
    coverage: float
    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]


COVERAGE_CASES = [
    CoverageCase("the most common shape alone covers 50%", 0.5, (SHAPE_A,), (1.0,)),
    CoverageCase(
        "stops as soon as 80% is covered exactly", 0.8, (SHAPE_A, SHAPE_B), (5 / 8, 3 / 8)
    ),
    CoverageCase(
        "81% needs a third shape; ties go to the smaller cpu",
        0.81,
        (SHAPE_A, SHAPE_B, SHAPE_C),
        (5 / 9, 3 / 9, 1 / 9),
    ),
    CoverageCase(
        "coverage 1 keeps every shape",
        1.0,
        (SHAPE_A, SHAPE_B, SHAPE_C, SHAPE_D),
        (0.5, 0.3, 0.1, 0.1),
    ),
    CoverageCase(
        "default 95% keeps every shape here",
        0.95,
        (SHAPE_A, SHAPE_B, SHAPE_C, SHAPE_D),
        (0.5, 0.3, 0.1, 0.1),
    ),
]


@pytest.mark.parametrize("case", COVERAGE_CASES, ids=[c.id for c in COVERAGE_CASES])
def test_target_workload_coverage(case: CoverageCase) -> None:
    workload = TargetWorkload.from_pods(TEN_PODS, coverage=case.coverage)
    assert workload.shapes == case.shapes
    assert workload.weights == pytest.approx(case.weights)
    assert sum(workload.weights) == pytest.approx(1.0)


def test_target_workload_orders_most_common_first_whatever_the_pod_order() -> None:
    workload = TargetWorkload.from_pods(list(reversed(TEN_PODS)), coverage=1.0)
    assert workload.shapes == (SHAPE_A, SHAPE_B, SHAPE_C, SHAPE_D)


@given(
    st.lists(
        st.tuples(st.sampled_from((0, 1000, 4000)), st.sampled_from((0, 250, 500, 1000))),
        min_size=1,
        max_size=60,
    ),
    st.floats(0.01, 1.0),
)
def test_target_workload_covers_at_least_the_threshold_and_no_more_than_needed(
    rows: list[tuple[int, int]], coverage: float
) -> None:
    pods = [
        PodRequest(f"p{i}", (ContainerRequest("main", share, 1 if share else 0),), cpu_milli=cpu)
        for i, (cpu, share) in enumerate(rows)
    ]
    workload = TargetWorkload.from_pods(pods, coverage=coverage)
    counts = Counter(TaskShape.of(pod) for pod in pods)
    kept = [counts[shape] for shape in workload.shapes]
    covered = sum(kept)
    assert len(set(workload.shapes)) == len(workload.shapes)
    assert workload.weights == pytest.approx([count / covered for count in kept])
    assert sum(workload.weights) == pytest.approx(1.0)
    assert covered >= coverage * len(pods), "stopped before reaching the coverage"
    assert covered - kept[-1] < coverage * len(pods), "kept a shape it did not need"
    assert kept == sorted(kept, reverse=True), "not most common first"
    dropped = [count for shape, count in counts.items() if shape not in workload.shapes]
    assert all(count <= kept[-1] for count in dropped), "dropped a more common shape"


@pytest.mark.parametrize(
    "coverage", [0.0, -0.1, 1.01, 2.0], ids=["zero", "negative", "just above one", "two"]
)
def test_target_workload_rejects_bad_coverage(coverage: float) -> None:
    with pytest.raises(ValueError, match="coverage must be in"):
        TargetWorkload.from_pods(TEN_PODS, coverage=coverage)


def test_target_workload_rejects_no_pods() -> None:
    with pytest.raises(ValueError, match="no pods"):
        TargetWorkload.from_pods([])


def test_target_workload_rejects_mismatched_weights() -> None:
    with pytest.raises(ValueError, match="2 shapes but 1 weights"):
        TargetWorkload((SHAPE_A, SHAPE_B), (1.0,))


@dataclass(frozen=True)
class ShapeOfCase:
    id: str
    pod: PodRequest
    shape: TaskShape


SHAPE_OF_CASES = [
    ShapeOfCase(
        "cpu-only pod has g = k = 0",
        PodRequest("p", (ContainerRequest("main", 0, 0),), cpu_milli=3000),
        TaskShape(3000, 0, 0),
    ),
    ShapeOfCase(
        "sharing pod keeps its share and models",
        PodRequest("p", (ContainerRequest("main", 250, 1, frozenset({"T4"})),), cpu_milli=1000),
        TaskShape(1000, 250, 1, frozenset({"T4"})),
    ),
    ShapeOfCase(
        "multi-container pod takes its largest GPU container",
        PodRequest(
            "p",
            (
                ContainerRequest("small", 300, 1),
                ContainerRequest("big", 1000, 2),
                ContainerRequest("cpu", 0, 0),
            ),
            cpu_milli=500,
        ),
        TaskShape(500, 1000, 2),
    ),
]


@pytest.mark.parametrize("case", SHAPE_OF_CASES, ids=[c.id for c in SHAPE_OF_CASES])
def test_task_shape_of_a_pod(case: ShapeOfCase) -> None:
    assert TaskShape.of(case.pod) == case.shape


# --- the real openb trace (METHOD.md §2, "Default trace" and "Consequence") ------------------

needs_real_trace = pytest.mark.skipif(
    not REAL_TRACE_DIR.is_dir(),
    reason=f"the real openb trace is not present at {REAL_TRACE_DIR}",
)


@needs_real_trace
def test_real_default_trace_target_workload() -> None:
    trace = load_trace(REAL_TRACE_DIR, "default")
    workload = TargetWorkload.from_pods(trace.pods)
    assert len({TaskShape.of(pod) for pod in trace.pods}) == 91
    assert len(workload.shapes) == 35
    cpu_only = sum(
        w for s, w in zip(workload.shapes, workload.weights, strict=True) if not s.gpu_count
    )
    assert cpu_only == pytest.approx(0.136, abs=0.0005)


@needs_real_trace
def test_real_default_trace_empty_cluster_fragmentation_is_13_94_percent() -> None:
    trace = load_trace(REAL_TRACE_DIR, "default")
    workload = TargetWorkload.from_pods(trace.pods)
    total = sum(state_fragmentation(NodeState.empty(node), workload) for node in trace.nodes)
    assert trace.gpu_capacity_milli == 1000 * 6212
    assert 100 * total / (1000 * 6212) == pytest.approx(13.94, abs=0.01)
