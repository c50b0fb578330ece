"""One run's set-up (METHOD.md §6 steps 2–5, §9): the tuned pod stream and the node tie order."""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpushare.core.model import ContainerRequest, Gpu, Node, PodRequest
from gpushare.sim.trace import load_embedded_trace
from gpushare.sim.workload import make_run, tune_stream

CLONE_KEY = re.compile(r"^(?P<key>.+)-clone-(?P<n>\d+)$")


def pod(key: str, share: int, count: int = 1, cpu: int = 1000) -> PodRequest:
    return PodRequest(key, (ContainerRequest("main", share, count),), cpu_milli=cpu)


def gpu_total(pods: list[PodRequest]) -> int:
    return sum(p.gpu_total for p in pods)


def whole_gpu_pods(n: int) -> list[PodRequest]:
    return [pod(f"p{i}", 1000) for i in range(n)]


# --- tune_stream -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TuneCase:
    id: str
    pods: list[PodRequest]
    target: int
    length: int
    total: int


TUNE_CASES = [
    TuneCase(
        "below target: clones until the next would exceed", whole_gpu_pods(3), 10_500, 10, 10_000
    ),
    TuneCase("below target: a clone may land exactly on it", whole_gpu_pods(3), 10_000, 10, 10_000),
    TuneCase(
        "above target: removes pods until at or under it", whole_gpu_pods(10), 4_500, 4, 4_000
    ),
    TuneCase("above target by one: removes one pod", whole_gpu_pods(10), 9_999, 9, 9_000),
    TuneCase("exactly at target: unchanged", whole_gpu_pods(4), 4_000, 4, 4_000),
    TuneCase("empty input stays empty below target", [], 10_000, 0, 0),
    TuneCase("empty input stays empty at target 0", [], 0, 0, 0),
    TuneCase(
        "cpu-only pods below target: no clone can raise the total",
        [pod("c0", 0, 0), pod("c1", 0, 0)],
        10_000,
        2,
        0,
    ),
]


@pytest.mark.parametrize("case", TUNE_CASES, ids=[c.id for c in TUNE_CASES])
def test_tune_stream(case: TuneCase) -> None:
    stream = tune_stream(case.pods, case.target, random.Random(42))
    assert len(stream) == case.length
    assert gpu_total(stream) == case.total


def test_clones_are_appended_after_the_originals_with_unique_suffixed_keys() -> None:
    originals = [pod("a", 500), pod("b", 1000, 2), pod("c", 0, 0)]
    stream = tune_stream(originals, 20_000, random.Random(7))
    assert stream[:3] == originals
    clones = stream[3:]
    assert clones
    keys = [p.key for p in stream]
    assert len(set(keys)) == len(keys)
    by_key = {p.key: p for p in originals}
    for n, clone in enumerate(clones):
        match = CLONE_KEY.match(clone.key)
        assert match is not None, clone.key
        assert int(match["n"]) == n
        assert replace(by_key[match["key"]], key=clone.key) == clone


def test_removal_keeps_the_survivors_in_order_and_adds_no_clone() -> None:
    originals = whole_gpu_pods(10)
    stream = tune_stream(originals, 4_500, random.Random(3))
    positions = [originals.index(p) for p in stream]
    assert positions == sorted(positions)


def test_tune_stream_does_not_modify_its_input() -> None:
    originals = whole_gpu_pods(3)
    before = list(originals)
    tune_stream(originals, 10_000, random.Random(0))
    tune_stream(originals, 1_000, random.Random(0))
    assert originals == before


gpu_shapes = st.sampled_from([(0, 0), (250, 1), (500, 1), (1000, 1), (1000, 2), (1000, 4)])


@given(
    shapes=st.lists(gpu_shapes, max_size=30),
    target=st.integers(0, 40_000),
    seed=st.integers(0, 2**16),
)
def test_tuned_total_is_at_most_the_target_and_within_one_pod_of_it(
    shapes: list[tuple[int, int]], target: int, seed: int
) -> None:
    originals = [pod(f"p{i}", share, count) for i, (share, count) in enumerate(shapes)]
    stream = tune_stream(originals, target, random.Random(seed))
    total = gpu_total(stream)
    largest = max((p.gpu_total for p in originals), default=0)
    assert total <= target
    if largest:
        # Clones stop when the next draw would exceed; removal stops once at or under.
        assert total > target - largest
    keys = [p.key for p in stream]
    assert len(set(keys)) == len(keys)
    assert stream == tune_stream(originals, target, random.Random(seed)), "not deterministic"


# --- make_run --------------------------------------------------------------------------------


def nodes(n: int) -> list[Node]:
    return [
        Node(f"n{i}", tuple(Gpu(g, "V100", 1000) for g in range(1 + i % 4)), cpu_milli=64_000)
        for i in range(n)
    ]


NODES = nodes(20)  # 50 GPUs
PODS = [pod(f"p{i:02d}", (250, 500, 1000)[i % 3], cpu=1000 * (i % 5)) for i in range(30)]


def test_make_run_is_deterministic_per_seed() -> None:
    assert make_run(NODES, PODS, 42) == make_run(NODES, PODS, 42)


@pytest.mark.parametrize(("a", "b"), [(42, 43), (42, 51), (0, 1)], ids=["42-43", "42-51", "0-1"])
def test_make_run_differs_across_seeds(a: int, b: int) -> None:
    one, other = make_run(NODES, PODS, a), make_run(NODES, PODS, b)
    assert one.tie_rank != other.tie_rank
    assert [p.key for p in one.stream] != [p.key for p in other.stream]


@pytest.mark.parametrize("seed", [0, 42, 51])
def test_tie_rank_is_a_permutation_of_the_nodes(seed: int) -> None:
    setup = make_run(NODES, PODS, seed)
    assert setup.seed == seed
    assert sorted(setup.tie_rank) == list(range(len(NODES)))


def test_make_run_ignores_the_input_pod_order() -> None:
    """Pods are sorted by name before the shuffle (METHOD.md §6 step 3)."""
    assert make_run(NODES, list(reversed(PODS)), 42) == make_run(NODES, PODS, 42)


@pytest.mark.parametrize(
    ("ratio", "target"), [(1.3, 65_000), (1.0, 50_000), (0.25, 12_500)], ids=["1.3", "1", "0.25"]
)
def test_make_run_tunes_to_the_ratio_of_capacity(ratio: float, target: int) -> None:
    setup = make_run(NODES, PODS, 42, tune_ratio=ratio)
    assert setup.target == target
    assert gpu_total(list(setup.stream)) <= target
    assert gpu_total(list(setup.stream)) > target - 1000


def test_make_run_shuffles_every_original_pod_into_the_stream_head() -> None:
    setup = make_run(NODES, PODS, 42)
    head = setup.stream[: len(PODS)]
    assert sorted(p.key for p in head) == sorted(p.key for p in PODS)
    assert [p.key for p in head] != sorted(p.key for p in PODS)


def test_make_run_on_the_embedded_trace_reaches_130_percent() -> None:
    trace = load_embedded_trace()
    setup = make_run(trace.nodes, trace.pods, 42)
    assert setup.target == int(1.3 * trace.gpu_capacity_milli)
    total = gpu_total(list(setup.stream))
    assert setup.target - 8000 < total <= setup.target
