"""Placement policies: the registry, the GPU-choice contract every policy keeps, the paper
baselines' integer scores (METHOD.md §4), binpack/spread/alibaba, and FGD (METHOD.md §3)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import assume, given, note
from hypothesis import strategies as st

from gpushare.core.fit import check_fit
from gpushare.core.fragmentation import TargetWorkload, TaskShape, state_fragmentation
from gpushare.core.model import (
    ContainerAllocation,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.core.policies import (
    Policy,
    PolicyContext,
    make_policy,
    policy_names,
    policy_summary,
    register,
)
from gpushare.core.policies import fgd as fgd_module
from gpushare.core.policies.fgd import FgdPolicy
from gpushare.testing.core import node_state as build_state
from gpushare.testing.core import pod_request

ALL_POLICIES = (
    "binpack",
    "spread",
    "bestfit",
    "fgd",
    "random",
    "dotprod",
    "clustering",
    "packing",
    "alibaba",
    "fgd-cpu",
    "fgd-spare",
)
INTEGER_SCORED = ("dotprod", "clustering", "packing", "bestfit", "fgd", "alibaba")
BEST_FIT_GPU = ("binpack", "bestfit", "dotprod", "clustering", "packing", "alibaba")
MIB_16G = 16276  # design.md's 16 GiB GPU in MiB
# A small target workload in milli-GPU, used wherever FGD needs one.
DEFAULT_M = TargetWorkload(
    (TaskShape(0, 0, 0), TaskShape(1000, 500, 1), TaskShape(2000, 1000, 1), TaskShape(0, 250, 1)),
    (0.2, 0.4, 0.3, 0.1),
)


def node_state(
    used: tuple[int, ...],
    *,
    capacity: int = 1000,
    tags: Mapping[str, int] | None = None,
    **kw: Any,
) -> NodeState:
    """A node of 1000-milli V100s (``capacity``) with ``used`` per GPU."""
    return build_state((capacity,) * len(used), used, model="V100", workload_tags=tags, **kw)


def idle(
    gpus: int,
    *,
    cpu_milli: int | None = None,
    cpu_used_milli: int = 0,
    memory_mib: int | None = None,
) -> NodeState:
    """A node with ``gpus`` empty 1000-milli GPUs."""
    return node_state(
        (0,) * gpus, cpu_milli=cpu_milli, cpu_used_milli=cpu_used_milli, memory_mib=memory_mib
    )


def gpu_pod(share: int, count: int = 1, *, cpu: int = 0, memory: int = 0) -> PodRequest:
    return pod_request(("main", share, count), cpu_milli=cpu, memory_mib=memory)


def cpu_pod(cpu: int, memory: int = 0) -> PodRequest:
    return pod_request(("main", 0, 0), cpu_milli=cpu, memory_mib=memory)


def policy(name: str, workload: TargetWorkload = DEFAULT_M, seed: int = 0) -> Policy:
    return make_policy(name, PolicyContext(workload=workload, rng=random.Random(seed)))


def chosen_indices(allocations: tuple[ContainerAllocation, ...]) -> list[tuple[int, ...]]:
    return [a.gpu_indices for a in allocations]


# --- the registry ----------------------------------------------------------------------------


def test_every_policy_is_registered_with_a_summary() -> None:
    assert set(policy_names()) == set(ALL_POLICIES)
    assert len(policy_names()) == len(ALL_POLICIES)
    for name in ALL_POLICIES:
        assert policy_summary(name)
        assert policy(name).name == name


def test_unknown_policy_names_the_accepted_ones() -> None:
    with pytest.raises(KeyError) as raised:
        make_policy("tetris")
    message = str(raised.value)
    assert "tetris" in message
    for name in ALL_POLICIES:
        assert name in message


def test_registering_a_name_twice_raises() -> None:
    with pytest.raises(ValueError, match="'binpack' registered twice"):
        register("binpack", "an impostor")(lambda context: policy("binpack"))
    assert policy("binpack").name == "binpack"


def test_fgd_needs_a_target_workload() -> None:
    with pytest.raises(ValueError, match="needs a target workload"):
        make_policy("fgd", PolicyContext())


def test_make_policy_without_a_context_uses_defaults() -> None:
    assert make_policy("bestfit").name == "bestfit"


# --- the GPU-choice contract, for every policy -----------------------------------------------

MODELS = ("A", "B")
SHARES = st.sampled_from((100, 250, 300, 500, 600, 1000)) | st.integers(1, 1000)


@st.composite
def node_states(draw: st.DrawFn) -> NodeState:
    count = draw(st.integers(1, 6))
    capacity = draw(st.sampled_from((1000, 1000, 600)))
    used = tuple(
        draw(st.sampled_from((0, 0, 250, 500, 1000)).map(lambda u: min(u, capacity)))
        for _ in range(count)
    )
    models = tuple(draw(st.sampled_from(MODELS)) for _ in range(count))
    healthy = tuple(draw(st.booleans() | st.just(True)) for _ in range(count))
    cpu = draw(st.none() | st.integers(0, 8000))
    memory = draw(st.none() | st.integers(0, 8000))
    tags = draw(st.dictionaries(st.sampled_from(("share", "1-gpu", "2-gpu")), st.integers(1, 3)))
    gpus = tuple(
        Gpu(i, m, capacity, healthy=h) for i, (m, h) in enumerate(zip(models, healthy, strict=True))
    )
    return NodeState(
        Node("node", gpus, cpu_milli=cpu, memory_mib=memory),
        gpu_used=used,
        cpu_used_milli=draw(st.integers(0, cpu)) if cpu is not None else 0,
        memory_used_mib=draw(st.integers(0, memory)) if memory is not None else 0,
        workload_tags=tags,
    )


@st.composite
def pods(draw: st.DrawFn) -> PodRequest:
    containers = []
    for i in range(draw(st.integers(0, 3))):
        share = draw(st.just(0) | SHARES)
        count = draw(st.integers(1, 3)) if share else 0
        allowed = draw(st.frozensets(st.sampled_from(MODELS)))
        containers.append(
            ContainerRequest(f"c{i}", share, count, allowed if share else frozenset())
        )
    return PodRequest(
        "ns/pod",
        tuple(containers),
        cpu_milli=draw(st.integers(0, 4000)),
        memory_mib=draw(st.integers(0, 4000)),
    )


@st.composite
def one_gpu_pods(draw: st.DrawFn) -> PodRequest:
    """A pod with one GPU container on one GPU (plus, maybe, a CPU-only container)."""
    main = ContainerRequest(
        "main", draw(SHARES), 1, draw(st.frozensets(st.sampled_from(MODELS), max_size=1))
    )
    sidecar = (ContainerRequest("sidecar", 0, 0),) if draw(st.booleans()) else ()
    return PodRequest("ns/pod", (main, *sidecar), cpu_milli=draw(st.integers(0, 4000)))


def assert_valid_assignment(
    state: NodeState, request: PodRequest, got: tuple[ContainerAllocation, ...]
) -> None:
    """Each GPU container gets its count of distinct allowed GPUs, and no GPU gets more than
    its free."""
    assert [a.container for a in got] == [c.name for c in request.gpu_containers]
    taken = dict.fromkeys(range(len(state.node.gpus)), 0)
    position = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
    for allocation, container in zip(got, request.gpu_containers, strict=True):
        assert allocation.gpu_share == container.gpu_share
        assert len(set(allocation.gpu_indices)) == len(allocation.gpu_indices)
        assert len(allocation.gpu_indices) == container.gpu_count
        for index in allocation.gpu_indices:
            assert container.allows_at(position[index], state.node.gpu(index).model)
            taken[position[index]] += container.gpu_share
    for p, amount in taken.items():
        assert amount <= state.gpu_free[p], f"GPU position {p}: took {amount}"


@given(state=node_states(), request=pods(), seed=st.integers(0, 3))
def test_choose_gpus_respects_count_models_and_free(
    state: NodeState, request: PodRequest, seed: int
) -> None:
    """Every policy, on the same fitting examples (one run keeps the suite fast)."""
    assume(check_fit(state, request).fits)
    for name in ALL_POLICIES:
        note(f"policy {name}")
        chosen = policy(name, seed=seed).choose_gpus(state, request)
        assert_valid_assignment(state, request, chosen)


@given(state=node_states(), request=pods())
def test_integer_scores_are_integers_from_0_to_100(state: NodeState, request: PodRequest) -> None:
    assume(check_fit(state, request).fits)
    context = PolicyContext(workload=DEFAULT_M, max_node_cpu_milli=8000, max_node_gpu=6000)
    for name in INTEGER_SCORED:
        score = make_policy(name, context).score(state, request)
        assert score == int(score), name
        assert 0 <= score <= 100, name


@pytest.mark.parametrize("name", ALL_POLICIES)
@pytest.mark.parametrize("count", [1, 2])
def test_every_policy_keeps_to_the_positions_a_container_may_use(name: str, count: int) -> None:
    """HAMi's GPU UUIDs resolve into ``allowed_positions`` (``kube.codec.resolve``): GPU 0 is
    the fullest (binpack's pick), GPU 2 the emptiest (spread's), and only 1 and 3 may be used."""
    state = node_state((8, 6, 0, 4), capacity=16)
    container = ContainerRequest("main", 2, count, allowed_positions=frozenset({1, 3}))
    request = PodRequest("ns/p", (container,))
    chosen = policy(name).choose_gpus(state, request)
    assert_valid_assignment(state, request, chosen)
    assert {i for a in chosen for i in a.gpu_indices} <= {1, 3}


@pytest.mark.parametrize("name", ALL_POLICIES)
def test_choose_gpus_with_repeated_container_names(name: str) -> None:
    """check_fit keys its assignment by position, so repeated names fit; the policies must not
    put both containers on the GPU chosen for the last one (10 + 8 > 16)."""
    state = node_state((0, 0), capacity=16)
    request = PodRequest(
        "ns/pod", (ContainerRequest("same", 10, 1), ContainerRequest("same", 8, 1))
    )
    assert check_fit(state, request).fits
    assert_valid_assignment(state, request, policy(name).choose_gpus(state, request))


# --- paper baselines' scores (METHOD.md §4; MC = 128000, MG = 8000) --------------------------


@dataclass(frozen=True)
class ScoreCase:
    id: str
    state: NodeState
    pod: PodRequest
    score: int


DOTPROD = [
    # ⌊100·(1 − ½[(d/MC)(c/MC) + (D/MG)(R/MG)])⌋
    ScoreCase(
        "whole GPU, half the cpu, empty 8-GPU node: 1 - (0.5 + 0.125)/2",
        idle(8, cpu_milli=128_000),
        gpu_pod(1000, cpu=64_000),
        68,
    ),
    ScoreCase(
        "cpu-only pod weighs only cpu: 1 - 0.25*0.5/2",
        idle(8, cpu_milli=128_000, cpu_used_milli=64_000),
        cpu_pod(32_000),
        93,
    ),
    ScoreCase("4-GPU pod without cpu: 1 - 0.5/2", idle(8, cpu_milli=128_000), gpu_pod(1000, 4), 75),
    ScoreCase(
        "sharing pod on a used node: 1 - (0.0625*0.5 + 0.0625*0.3125)/2",
        node_state((0, 0, 500, 1000), cpu_milli=96_000, cpu_used_milli=32_000),
        gpu_pod(500, cpu=8000),
        97,
    ),
    ScoreCase(
        "unconstrained cpu counts as the largest node's",
        idle(8),
        gpu_pod(1000, cpu=64_000),
        68,
    ),
]

CLUSTERING = [
    # b = ⌊25·(MG − R)/MG⌋
    ScoreCase(
        "only the same tag: 75 + ⌊25·1000/8000⌋",
        node_state((500, 500, 0, 0, 0, 0, 0, 0), tags={"share": 2}),
        gpu_pod(300),
        78,
    ),
    ScoreCase(
        "the same tag mixed with others: 50 + ⌊25·1500/8000⌋",
        node_state((500, 1000, 0, 0, 0, 0, 0, 0), tags={"share": 1, "1-gpu": 1}),
        gpu_pod(300),
        54,
    ),
    ScoreCase("no GPU pods on an idle 8-GPU node: 25 + 0", idle(8), gpu_pod(300), 25),
    ScoreCase("no GPU pods on an idle 2-GPU node: 25 + ⌊25·6000/8000⌋", idle(2), gpu_pod(300), 43),
    ScoreCase(
        "only other tags: ⌊25·2000/8000⌋",
        node_state((1000, 1000, 0, 0, 0, 0, 0, 0), tags={"2-gpu": 1}),
        gpu_pod(300),
        6,
    ),
    ScoreCase(
        "a 2-gpu pod beside 2-gpu pods: 75 + 6",
        node_state((1000, 1000, 0, 0, 0, 0, 0, 0), tags={"2-gpu": 1}),
        gpu_pod(1000, 2),
        81,
    ),
    ScoreCase(
        "a whole-GPU pod is tagged 1-gpu, not share",
        node_state((500, 1000, 0, 0, 0, 0, 0, 0), tags={"1-gpu": 1}),
        gpu_pod(1000),
        79,
    ),
    ScoreCase("cpu-only pod scores 0 on an idle node", idle(8), cpu_pod(1000), 0),
    ScoreCase(
        "cpu-only pod scores 0 on a used node",
        node_state((500, 0), tags={"share": 1}),
        cpu_pod(1000),
        0,
    ),
]

PACKING = [
    ScoreCase("idle 8-GPU node: max(33 − 8, 8)", idle(8), gpu_pod(500), 25),
    ScoreCase("idle 2-GPU node: max(33 − 2, 2)", idle(2), gpu_pod(500), 31),
    ScoreCase("idle 20-GPU node: max(33 − 20, 20)", idle(20), gpu_pod(500), 20),
    ScoreCase(
        "two fully free GPUs on a used node: max(50 − 2, 33)",
        node_state((500, 0, 0, 0)),
        gpu_pod(1000, 2),
        48,
    ),
    ScoreCase(
        "eighteen fully free GPUs on a used node: floor max(50 − 18, 33)",
        node_state((500,) + (0,) * 19),
        gpu_pod(1000, 18),
        33,
    ),
    ScoreCase(
        "sharing pod that only fits a fully free GPU of a used node: 50 − 1",
        node_state((500, 0, 0, 0)),
        gpu_pod(600),
        49,
    ),
    ScoreCase(
        "sharing pod on a shared GPU (best fit 40% free): 100 − ⌊40/10⌋",
        node_state((300, 600, 0, 0)),
        gpu_pod(300),
        96,
    ),
    ScoreCase(
        "sharing pod on a shared GPU (best fit 70% free): 100 − ⌊70/10⌋",
        node_state((300, 600, 0, 0)),
        gpu_pod(500),
        93,
    ),
    ScoreCase("cpu-only pod scores 0 on an idle node", idle(8), cpu_pod(1000), 0),
    ScoreCase("cpu-only pod scores 0 on a used node", node_state((300, 0)), cpu_pod(1000), 0),
]

BESTFIT = [
    # ⌊100·(1 − ½(c − d)/MC − ½(R − D)/MG)⌋
    ScoreCase(
        "whole GPU on an empty 128-core 8-GPU node: 1 − 0.5 − 0.4375",
        idle(8, cpu_milli=128_000),
        gpu_pod(1000),
        6,
    ),
    ScoreCase(
        "sharing pod on a small node: 1 − 0.125 − 0.09375",
        idle(2, cpu_milli=64_000),
        gpu_pod(500, cpu=32_000),
        78,
    ),
    ScoreCase(
        "pod takes exactly what is free: 100",
        node_state((1000, 500), cpu_milli=8000, cpu_used_milli=4000),
        gpu_pod(500, cpu=4000),
        100,
    ),
    ScoreCase(
        "cpu-only pod: 1 − 0.4375 − 0.5",
        idle(8, cpu_milli=128_000),
        cpu_pod(16_000),
        6,
    ),
]

ALIBABA = [
    # Σ_r ⌊(capacity − requested)·100 / capacity⌋ / #r, integer division throughout
    ScoreCase(
        "integer per resource, then integer mean: (66 + 33) // 2",
        node_state((0,), cpu_milli=3000, cpu_used_milli=500, memory_mib=3000, memory_used_mib=1000),
        gpu_pod(500, cpu=500, memory=1000),
        49,
    ),
    ScoreCase(
        "an openb-sized node: (50 + 66) // 2",
        idle(8, cpu_milli=96_000, cpu_used_milli=32_000, memory_mib=393_216),
        gpu_pod(500, cpu=16_000, memory=131_072),
        58,
    ),
    ScoreCase(
        "GPU use plays no part",
        node_state(
            (1000,) * 7 + (0,),
            cpu_milli=96_000,
            cpu_used_milli=32_000,
            memory_mib=393_216,
        ),
        gpu_pod(500, cpu=16_000, memory=131_072),
        58,
    ),
    ScoreCase(
        "memory unconstrained: cpu alone",
        idle(1, cpu_milli=4000, cpu_used_milli=1000),
        gpu_pod(500, cpu=1000),
        50,
    ),
    ScoreCase("neither cpu nor memory constrained: 0", idle(1), gpu_pod(500), 0),
    ScoreCase(
        "cpu-only pod on an empty node: (75 + 100) // 2",
        idle(1, cpu_milli=4000, memory_mib=1000),
        cpu_pod(1000),
        87,
    ),
]

SCORE_TABLES = {
    "dotprod": DOTPROD,
    "clustering": CLUSTERING,
    "packing": PACKING,
    "bestfit": BESTFIT,
    "alibaba": ALIBABA,
}
SCORE_CASES = [(name, case) for name, cases in SCORE_TABLES.items() for case in cases]


@pytest.mark.parametrize(
    ("name", "case"), SCORE_CASES, ids=[f"{name}: {case.id}" for name, case in SCORE_CASES]
)
def test_integer_score(name: str, case: ScoreCase) -> None:
    assert check_fit(case.state, case.pod).fits, "a score table case must fit"
    score = policy(name).score(case.state, case.pod)
    assert score == case.score
    assert isinstance(score, float)


# --- GPU choice inside a node -----------------------------------------------------------------


@dataclass(frozen=True)
class ChoiceCase:
    id: str
    free: tuple[int, ...]
    share: int
    chosen: tuple[int, ...]
    count: int = 1
    capacity: int = MIB_16G
    models: tuple[str, ...] | None = None
    allowed: frozenset[str] = frozenset()


DESIGN_FREE = (12207, 8138, 4069, MIB_16G)
BINPACK_CHOICE = [
    ChoiceCase("design.md: free 12207/8138/4069/16276, ask 8138 → GPU1", DESIGN_FREE, 8138, (1,)),
    ChoiceCase("ties go to the lowest index", (8, 16, 8), 8, (0,), capacity=16),
    ChoiceCase("GPUs too small are skipped", (4, 12, 16), 8, (1,), capacity=16),
    ChoiceCase("two GPUs: the two least free that fit", (16, 8, 12, 4), 8, (1, 2), 2, 16),
    ChoiceCase(
        "disallowed model skipped even when fuller",
        (8, 16),
        8,
        (1,),
        capacity=16,
        models=("A", "B"),
        allowed=frozenset({"B"}),
    ),
]
SPREAD_CHOICE = [
    ChoiceCase("design.md's GPUs, ask 8138 → the emptiest GPU3", DESIGN_FREE, 8138, (3,)),
    ChoiceCase("ties go to the lowest index", (8, 16, 16), 8, (1,), capacity=16),
    ChoiceCase("two GPUs: the two most free", (16, 8, 12, 4), 8, (0, 2), 2, 16),
]
WHOLE_GPU_CHOICE = [
    ChoiceCase("whole-GPU pod: the lowest-index free GPUs", (1000,) * 4, 1000, (0, 1), 2, 1000),
    ChoiceCase(
        "whole-GPU pod skips a partly used GPU", (1000, 500, 1000, 1000), 1000, (0, 2), 2, 1000
    ),
]
CHOICE_CASES = (
    [(name, case) for name in BEST_FIT_GPU for case in BINPACK_CHOICE]
    + [("spread", case) for case in SPREAD_CHOICE]
    + [(name, case) for name in (*BEST_FIT_GPU, "fgd", "random") for case in WHOLE_GPU_CHOICE]
)


@pytest.mark.parametrize(
    ("name", "case"), CHOICE_CASES, ids=[f"{name}: {case.id}" for name, case in CHOICE_CASES]
)
def test_gpu_choice(name: str, case: ChoiceCase) -> None:
    state = node_state(
        tuple(case.capacity - f for f in case.free), capacity=case.capacity, models=case.models
    )
    request = PodRequest(
        "ns/pod", (ContainerRequest("main", case.share, case.count, case.allowed),)
    )
    workload = TargetWorkload((TaskShape(0, case.share, case.count),), (1.0,))
    got = policy(name, workload).choose_gpus(state, request)
    assert chosen_indices(got) == [case.chosen]


def test_random_policy_picks_every_fitting_gpu_and_only_those() -> None:
    state = node_state((0, 800, 300, 500))  # free 1000, 200, 700, 500
    picks = {
        chosen_indices(policy("random", seed=seed).choose_gpus(state, gpu_pod(400)))[0][0]
        for seed in range(40)
    }
    assert picks == {0, 2, 3}


def test_binpack_prefers_the_node_whose_gpu_ends_fullest() -> None:
    binpack = policy("binpack")
    snug = node_state((600, 0, 0, 0))  # 400 free on GPU0: the pod fills it
    roomy = node_state((0, 0, 0, 0))
    assert binpack.score(snug, gpu_pod(400)) > binpack.score(roomy, gpu_pod(400))


def test_spread_prefers_the_emptier_node() -> None:
    spread = policy("spread")
    used = node_state((600, 0, 0, 0))
    empty = node_state((0, 0, 0, 0))
    assert spread.score(empty, gpu_pod(400)) > spread.score(used, gpu_pod(400))
    assert spread.score(idle(1, cpu_milli=8000), cpu_pod(1000)) > spread.score(
        idle(1, cpu_milli=8000, cpu_used_milli=4000), cpu_pod(1000)
    )


# --- FGD (METHOD.md §3) ----------------------------------------------------------------------

HALF_GPU_M = TargetWorkload((TaskShape(0, 500, 1),), (1.0,))


def fgd_score(delta: float) -> int:
    """⌊100·σ(−Δ/1000)⌋ for Δ in milli-GPU."""
    return int(100.0 / (1.0 + math.exp(delta / 1000)))


@dataclass(frozen=True)
class FgdCase:
    id: str
    state: NodeState
    pod: PodRequest
    workload: TargetWorkload
    chosen: tuple[int, ...]
    delta: float  # F_n'(M) − F_n(M) of the chosen placement, milli-GPU
    score: int


FGD_CASES = [
    FgdCase(
        "avoids the GPU whose leftover no shape can use (best fit would take GPU1)",
        node_state((0, 300)),  # free 1000, 700; a 300 pod leaves 700 on GPU0, or 400 on GPU1
        gpu_pod(300),
        HALF_GPU_M,
        (0,),
        0.0,
        50,
    ),
    FgdCase(
        "shrinks an unusable piece when it can",
        node_state((0, 550)),  # free 1000, 450: the 450 piece is already a fragment
        gpu_pod(300),
        HALF_GPU_M,
        (1,),
        -300.0,
        57,
    ),
    FgdCase(
        "truncation ties Δ = 0 and Δ = −10 at 50: the lower index wins",
        node_state((0, 540)),  # free 1000, 460; GPU1 would shrink the 460 fragment by 10
        gpu_pod(10),
        HALF_GPU_M,
        (0,),
        0.0,
        50,
    ),
    FgdCase(
        "cpu-only pod: Δ from leaving too little cpu for the workload's shape",
        idle(1, cpu_milli=8000),
        cpu_pod(6000),
        TargetWorkload((TaskShape(4000, 500, 1),), (1.0,)),
        (),
        1000.0,
        26,
    ),
    FgdCase(
        "the cpu-only term moves every GPU alike: same choice, Δ −150 lower",
        node_state((0, 300)),
        gpu_pod(300),
        TargetWorkload((TaskShape(0, 0, 0), TaskShape(0, 500, 1)), (0.5, 0.5)),
        (0,),
        -150.0,
        53,
    ),
]


@pytest.mark.parametrize("case", FGD_CASES, ids=[c.id for c in FGD_CASES])
def test_fgd_placement(case: FgdCase) -> None:
    assert check_fit(case.state, case.pod).fits
    fgd = policy("fgd", case.workload)
    assert case.score == fgd_score(case.delta)
    assert fgd.score(case.state, case.pod) == case.score
    got = fgd.choose_gpus(case.state, case.pod)
    assert chosen_indices(got) == ([case.chosen] if case.chosen else [])


def test_fgd_and_best_fit_disagree_on_the_leftover_piece() -> None:
    state, request = FGD_CASES[0].state, FGD_CASES[0].pod
    assert chosen_indices(policy("bestfit").choose_gpus(state, request)) == [(1,)]
    assert chosen_indices(policy("fgd", HALF_GPU_M).choose_gpus(state, request)) == [(0,)]


@pytest.mark.parametrize(
    ("case", "chosen", "score"),
    [
        (FGD_CASES[0], (0,), 0.0),
        (FGD_CASES[1], (1,), 300.0),
        (FGD_CASES[2], (1,), 10.0),
        (FGD_CASES[3], (), -1000.0),
    ],
    ids=[
        "Δ = 0 on the usable GPU",
        "Δ = −300 scores +300",
        "without truncation the exact Δ breaks the tie",
        "cpu exhaustion scores −1000",
    ],
)
def test_fgd_untruncated_scores_minus_delta(
    case: FgdCase, chosen: tuple[int, ...], score: float
) -> None:
    fgd = FgdPolicy(PolicyContext(workload=case.workload), truncate=False)
    assert fgd.score(case.state, case.pod) == pytest.approx(score)
    assert chosen_indices(fgd.choose_gpus(case.state, case.pod)) == ([chosen] if chosen else [])


def test_fgd_places_a_multi_container_pod_that_fits_a_mixed_model_node() -> None:
    # GPU0 (A) 600 free, GPU1 (B) 1000, GPU2 (B) 500. Container a (600, any model) must take
    # GPU0 so that b (500 on two B GPUs) finds GPU1 and GPU2; M (600 on an A GPU) makes FGD
    # prefer to keep GPU0 free, so it puts a on GPU1.
    state = node_state((400, 0, 500), models=("A", "B", "B"))
    request = PodRequest(
        "ns/pod",
        (ContainerRequest("a", 600, 1), ContainerRequest("b", 500, 2, frozenset({"B"}))),
    )
    workload = TargetWorkload((TaskShape(0, 600, 1, frozenset({"A"})),), (1.0,))
    assert check_fit(state, request).fits
    fgd = policy("fgd", workload)
    assert_valid_assignment(state, request, fgd.choose_gpus(state, request))
    assert 0 <= fgd.score(state, request) <= 100


@given(state=node_states(), request=one_gpu_pods())
def test_fgd_chooses_the_gpu_that_minimises_the_increase(
    state: NodeState, request: PodRequest
) -> None:
    """One-GPU pods: the chosen GPU's Δ, recomputed from scratch, is the least of every fitting
    GPU's, and the untruncated score is −Δ."""
    assume(check_fit(state, request).fits)
    fgd = FgdPolicy(PolicyContext(workload=DEFAULT_M), truncate=False)
    (allocation,) = fgd.choose_gpus(state, request)
    container = request.gpu_containers[0]
    before = state_fragmentation(state, DEFAULT_M)
    deltas: dict[int, float] = {}
    for p, gpu in enumerate(state.node.gpus):
        if state.gpu_free[p] < container.gpu_share or not container.allows(gpu.model):
            continue
        used = list(state.gpu_used)
        used[p] += container.gpu_share
        after = NodeState(state.node, tuple(used), state.cpu_used_milli + request.cpu_milli)
        deltas[gpu.index] = state_fragmentation(after, DEFAULT_M) - before
    (chosen,) = allocation.gpu_indices
    assert deltas[chosen] == pytest.approx(min(deltas.values()))
    assert fgd.score(state, request) == pytest.approx(-deltas[chosen])


def test_fgd_memos_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived extender scores forever: FGD's memos clear themselves at MEMO_LIMIT."""
    monkeypatch.setattr(fgd_module, "MEMO_LIMIT", 3)
    policy = FgdPolicy(PolicyContext(workload=DEFAULT_M))
    request = PodRequest("p", (ContainerRequest("main", 250),))
    for used in range(10):
        state = NodeState(Node("n", (Gpu(0, "T4", 1000), Gpu(1, "T4", 1000))), (used * 10, 0))
        policy.score(state, request)
        assert policy.memo_entries <= 3
        assert len(policy.frag) <= 3
