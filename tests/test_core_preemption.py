"""GPU-aware preemption (``gpushare.core.preemption``): the cheapest set of lower-priority pods
whose eviction makes a pod fit one node's GPUs, or why none helps.

The first five cases are the table of docs/usage.md, "What kube-scheduler does without
gpushare's preemption", one node at a time (kube-scheduler's node choice is
``best_preemption`` over them); the rest are the fit rules every other decision uses. A property
test checks the choice against brute force on small nodes: feasible, cheapest, minimal.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.fit import check_fit
from gpushare.core.handshake import PendingPod, Step, handshake_fit
from gpushare.core.model import ContainerRequest, NodeState, PodRequest
from gpushare.core.preemption import (
    Preemption,
    PreemptionStatus,
    Resident,
    VictimCost,
    best_preemption,
    plan_preemption,
    preemption_floor,
)
from gpushare.testing.core import pod_request, resident, state_with

LOW, MID, HIGH = 100, 500, 1000
NOW_S = 10_000.0


def low(key: str, gpus: dict[int, int], started_s: float | None = 0.0, **kw: object) -> Resident:
    return resident(key, gpus, priority=LOW, started_s=started_s, **kw)  # type: ignore[arg-type]


def high(key: str, gpus: dict[int, int], **kw: object) -> Resident:
    return resident(key, gpus, priority=HIGH, started_s=0.0, **kw)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Case:
    id: str
    capacities: tuple[int, ...]
    residents: tuple[Resident, ...]
    pod: PodRequest
    status: PreemptionStatus
    victims: tuple[str, ...] = ()
    priority: int = HIGH
    budgets: dict[str, int] = field(default_factory=dict)
    gpus: tuple[int, ...] | None = None  # the GPU indices the pod gets afterwards
    pending: tuple[PendingPod, ...] = ()


ASK_16 = pod_request((16, 1), key="ns/high")
ASK_8 = pod_request((8, 1), key="ns/high")

CASES = [
    # --- the cases of docs/usage.md, "What kube-scheduler does without gpushare's preemption"
    Case(
        "case 1: 8+8 / 8+8 of lows, asks 16: the two lows of one GPU (the newer pair)",
        (16, 16),
        (
            low("ns/a", {0: 8}, 1.0),
            low("ns/b", {1: 8}, 2.0),
            low("ns/c", {0: 8}, 3.0),
            low("ns/d", {1: 8}, 4.0),
        ),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/b", "ns/d"),
        gpus=(1,),
    ),
    Case(
        "case 2: 12 / 12 of lows, asks 8: one 12 GiB low, the newer",
        (16, 16),
        (low("ns/a", {0: 12}, 1.0), low("ns/b", {1: 12}, 2.0)),
        ASK_8,
        PreemptionStatus.EVICT,
        ("ns/b",),
        gpus=(1,),
    ),
    Case(
        "case 3, node A: high+low / high+low: evicting the lows frees 8 per GPU, never 16",
        (16, 16),
        (
            high("ns/h0", {0: 8}),
            low("ns/l0", {0: 8}),
            high("ns/h1", {1: 8}),
            low("ns/l1", {1: 8}),
        ),
        ASK_16,
        PreemptionStatus.NO_HELP,
    ),
    Case(
        "case 3, node B: low+low / high+high: the two lows of GPU 0",
        (16, 16),
        (low("ns/a", {0: 8}), low("ns/b", {0: 8}), high("ns/h0", {1: 8}), high("ns/h1", {1: 8})),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/a", "ns/b"),
        gpus=(0,),
    ),
    Case(
        "case 4: asks 20 where every GPU has 16: can never fit, nothing evicted",
        (16, 16),
        (low("ns/a", {0: 8}), low("ns/b", {0: 8}), low("ns/c", {1: 8}), low("ns/d", {1: 8})),
        pod_request((20, 1), key="ns/high"),
        PreemptionStatus.NEVER,
    ),
    # --- who may be evicted ----------------------------------------------------------------
    Case(
        "a pod of equal priority is never a victim",
        (16,),
        (resident("ns/peer", {0: 16}, priority=HIGH),),
        ASK_8,
        PreemptionStatus.NO_HELP,
    ),
    Case(
        "a pod that fits needs no preemption",
        (16, 16),
        (low("ns/a", {0: 16}),),
        ASK_8,
        PreemptionStatus.FITS,
        gpus=(1,),
    ),
    Case(
        "terminating pods free the GPU: wait for them, evict nobody",
        (16,),
        (low("ns/a", {0: 12}, terminating=True), low("ns/b", {0: 4})),
        ASK_8,
        PreemptionStatus.WAIT,
        gpus=(0,),
    ),
    Case(
        "a terminating pod counts as gone: one more victim is enough",
        (16,),
        (low("ns/a", {0: 8}, terminating=True), low("ns/b", {0: 4}, 1.0), low("ns/c", {0: 4}, 2.0)),
        pod_request((12, 1), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/c",),
    ),
    # --- which set ---------------------------------------------------------------------------
    Case(
        "lower priority before fewer pods: two lows rather than one mid",
        (16, 16),
        (
            resident("ns/mid", {0: 16}, priority=MID),
            low("ns/a", {1: 8}),
            low("ns/b", {1: 8}),
        ),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/a", "ns/b"),
        gpus=(1,),
    ),
    Case(
        "fewer pods at equal priority: one 12 rather than two 6",
        (16, 16),
        (low("ns/big", {0: 12}), low("ns/s1", {1: 6}), low("ns/s2", {1: 6})),
        pod_request((14, 1), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/big",),
        gpus=(0,),
    ),
    Case(
        "least work lost at equal count: the most recently started",
        (16, 16),
        (low("ns/old", {0: 16}, started_s=1.0), low("ns/new", {1: 16}, started_s=9_000.0)),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/new",),
        gpus=(1,),
    ),
    Case(
        "a PodDisruptionBudget that forbids the cheapest set: the larger set it allows",
        (16, 16),
        (
            low("ns/guarded", {0: 16}, budgets=("pdb",)),
            low("ns/a", {1: 8}),
            low("ns/b", {1: 8}),
        ),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/a", "ns/b"),
        gpus=(1,),
    ),
    Case(
        "a PodDisruptionBudget that allows one disruption: the guarded pod is cheapest",
        (16, 16),
        (
            low("ns/guarded", {0: 16}, budgets=("pdb",)),
            low("ns/a", {1: 8}),
            low("ns/b", {1: 8}),
        ),
        ASK_16,
        PreemptionStatus.EVICT,
        ("ns/guarded",),
        budgets={"pdb": 1},
        gpus=(0,),
    ),
    # --- the fit rules ---------------------------------------------------------------------
    Case(
        "a multi-GPU pod: two GPUs of 8 each, the pair that loses least work",
        (16, 16, 16),
        (
            low("ns/a", {0: 12}, 5_000.0),
            low("ns/b", {1: 12}, 5_000.0),
            low("ns/c", {2: 4}, 1.0),
            low("ns/d", {2: 4}, 1.0),
            low("ns/e", {2: 4}, 1.0),
        ),
        pod_request((8, 2), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/a", "ns/b"),
        gpus=(0, 1),
    ),
    Case(
        "a multi-GPU victim counts once and frees both its GPUs",
        (16, 16),
        (low("ns/wide", {0: 10, 1: 10}), low("ns/a", {0: 6}), low("ns/b", {1: 6})),
        pod_request((10, 2), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/wide",),
        gpus=(0, 1),
    ),
    Case(
        "a compute share: the GPU whose compute a victim frees",
        (16, 16),
        (
            low("ns/busy", {0: 2}, 9_000.0, compute_milli=800),
            low("ns/mem", {1: 15}, 1.0),
        ),
        pod_request(ContainerRequest("main", 2, compute_milli=500), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/busy",),
        gpus=(0,),
    ),
    Case(
        "a whole GPU: the GPU with the fewest pods is emptied",
        (16, 16),
        (low("ns/a", {0: 2}), low("ns/b", {0: 2}), low("ns/c", {1: 1})),
        pod_request(ContainerRequest("main", 0, exclusive=True), key="ns/high"),
        PreemptionStatus.EVICT,
        ("ns/c",),
        gpus=(1,),
    ),
    Case(
        "a GPU held whole by a low pod is freed by evicting that one pod",
        (16,),
        (low("ns/whole", {0: 16}, whole=True),),
        ASK_8,
        PreemptionStatus.EVICT,
        ("ns/whole",),
        gpus=(0,),
    ),
    Case(
        "the handshake rule: a pending equal pod pins the preemptor to its GPU",
        (16, 16),
        (
            low("ns/pend", {0: 8}, started_s=None),
            low("ns/a", {0: 8}, started_s=5.0),
            low("ns/b", {1: 16}, started_s=9_999.0),
        ),
        ASK_8,
        PreemptionStatus.EVICT,
        ("ns/pend",),
        pending=(PendingPod("ns/pend", (Step("c0", (0,), 8),), assume_time_ns=1),),
        gpus=(0,),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_plan(case: Case) -> None:
    state = state_with(case.capacities, case.residents)
    plan = plan_preemption(
        state, case.pod, case.priority, case.residents, now_s=NOW_S,
        pending=case.pending, budgets=case.budgets,
    )  # fmt: skip
    assert plan.status is case.status, plan.describe()
    assert plan.victims == case.victims
    if case.gpus is not None:
        assert sorted({i for c in plan.assignment for i in c.gpu_indices}) == list(case.gpus)
    if plan.helps:
        assert plan.exhaustive
        assert plan.fit.fits


def test_case_3_across_nodes_only_node_b_is_chosen() -> None:
    node_a = (
        high("ns/h0", {0: 8}, node="a"), low("ns/l0", {0: 8}, node="a"),
        high("ns/h1", {1: 8}, node="a"), low("ns/l1", {1: 8}, node="a"),
    )  # fmt: skip
    node_b = (
        low("ns/x", {0: 8}, node="b"), low("ns/y", {0: 8}, node="b"),
        high("ns/h2", {1: 8}, node="b"), high("ns/h3", {1: 8}, node="b"),
    )  # fmt: skip
    options = [
        plan_preemption(state_with((16, 16), rs, name=n), ASK_16, HIGH, rs, now_s=NOW_S)
        for n, rs in (("a", node_a), ("b", node_b))
    ]
    best = best_preemption(options)
    assert best is not None
    assert (best.node, best.victims) == ("b", ("ns/x", "ns/y"))


def test_waiting_beats_evicting_across_nodes() -> None:
    waiting = Preemption(PreemptionStatus.WAIT, "w", check_fit(state_with((8,), ()), ASK_8))
    waiting = Preemption(
        PreemptionStatus.WAIT, "w", waiting.fit, cost=VictimCost(), waiting_for=("ns/t",)
    )
    evicting = Preemption(
        PreemptionStatus.EVICT, "e", waiting.fit, ("ns/v",), VictimCost(0, LOW, 1, 0.0)
    )
    assert best_preemption([evicting, waiting]) is waiting
    assert best_preemption([]) is None


def test_max_checks_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_checks"):
        plan_preemption(state_with((16,), ()), ASK_8, HIGH, (), now_s=0, max_checks=0)


def test_a_tight_budget_still_gives_a_minimal_set() -> None:
    residents = tuple(low(f"ns/p{i}", {i % 4: 2}, started_s=float(i)) for i in range(32))
    state = state_with((16, 16, 16, 16), residents)
    plan = plan_preemption(state, ASK_16, HIGH, residents, now_s=NOW_S, max_checks=5)
    assert plan.status is PreemptionStatus.EVICT
    assert _irredundant(state, ASK_16, residents, plan)


def test_describe_names_victims_and_cost() -> None:
    residents = (low("ns/a", {0: 16}, started_s=NOW_S - 60),)
    plan = plan_preemption(state_with((16,), residents), ASK_8, HIGH, residents, now_s=NOW_S)
    assert plan.describe() == (
        "evict ns/a (1 pod(s), highest priority 100, 0 PodDisruptionBudget violation(s), "
        "60 s of work lost)"
    )


# --- brute force --------------------------------------------------------------------------


def _verdict(state: NodeState, pod: PodRequest, gone: Sequence[Resident]) -> bool:
    for r in gone:
        state = state.without(r.allocation)
    return handshake_fit(state, pod, ()).fits


def _cost(chosen: Sequence[Resident], budgets: dict[str, int]) -> VictimCost:
    counts: dict[str, int] = {}
    for r in chosen:
        for b in r.budgets:
            counts[b] = counts.get(b, 0) + 1
    return VictimCost(
        sum(max(0, n - budgets.get(b, 0)) for b, n in counts.items()),
        max((r.priority for r in chosen), default=0),
        len(chosen),
        sum(max(0.0, NOW_S - r.started_s) for r in chosen if r.started_s is not None),
    )


def _irredundant(
    state: NodeState, pod: PodRequest, residents: Sequence[Resident], plan: Preemption
) -> bool:
    leaving = [r for r in residents if r.terminating]
    chosen = [r for r in residents if r.key in plan.victims]
    return all(
        not _verdict(state, pod, leaving + [c for c in chosen if c is not left]) for left in chosen
    )


@st.composite
def scenarios(
    draw: st.DrawFn,
) -> tuple[NodeState, tuple[Resident, ...], PodRequest, int, dict[str, int]]:
    capacities = tuple(draw(st.lists(st.integers(4, 8), min_size=1, max_size=3)))
    free = list(capacities)
    compute_free = [1000] * len(capacities)
    empty = [True] * len(capacities)
    residents: list[Resident] = []
    for i in range(draw(st.integers(0, 7))):
        gpu_count = draw(st.integers(1, min(2, len(capacities))))
        gpus = draw(st.permutations(range(len(capacities))))[:gpu_count]
        kind = draw(st.sampled_from(("memory", "memory", "compute", "whole")))
        share = draw(st.integers(1, 4))
        compute = draw(st.sampled_from((300, 600))) if kind == "compute" else 0
        if kind == "whole":
            if not all(empty[g] for g in gpus) or len({capacities[g] for g in gpus}) > 1:
                continue
            share, compute = capacities[gpus[0]], 1000
        if any(free[g] < share or compute_free[g] < compute for g in gpus):
            continue
        for g in gpus:
            free[g] -= share
            compute_free[g] -= compute
            empty[g] = False
        residents.append(
            resident(
                f"ns/r{i}",
                dict.fromkeys(gpus, share),
                priority=draw(st.sampled_from((0, 1, 2, 3))),
                started_s=draw(st.sampled_from((None, 1.0, 500.0, 9_000.0))),
                budgets=draw(st.sampled_from(((), ("p",), ("q",), ("p", "q")))),
                terminating=draw(st.booleans()) and draw(st.booleans()),
                compute_milli=compute if kind == "compute" else 0,
                whole=kind == "whole",
            )
        )
    count = draw(st.integers(1, min(2, len(capacities))))
    asks = draw(st.sampled_from(("memory", "memory", "compute", "whole")))
    container = (
        ContainerRequest("main", 0, count, exclusive=True)
        if asks == "whole"
        else ContainerRequest(
            "main", draw(st.integers(1, 8)), count,
            compute_milli=draw(st.sampled_from((400, 700))) if asks == "compute" else 0,
        )
    )  # fmt: skip
    pod = pod_request(container, key="ns/new")
    budgets = {"p": draw(st.integers(0, 1)), "q": draw(st.integers(0, 2))}
    return (
        state_with(capacities, residents),
        tuple(residents),
        pod,
        draw(st.integers(0, 4)),
        budgets,
    )


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_the_choice_is_the_cheapest_and_minimal_by_brute_force(
    scenario: tuple[NodeState, tuple[Resident, ...], PodRequest, int, dict[str, int]],
) -> None:
    state, residents, pod, priority, budgets = scenario
    plan = plan_preemption(state, pod, priority, residents, now_s=NOW_S, budgets=budgets)
    leaving = [r for r in residents if r.terminating]
    candidates = [r for r in residents if r.priority < priority and not r.terminating]
    feasible = [
        _cost(chosen, budgets)
        for n in range(len(candidates) + 1)
        for chosen in itertools.combinations(candidates, n)
        if _verdict(state, pod, leaving + list(chosen))
    ]
    if handshake_fit(state, pod, ()).fits:
        assert plan.status is PreemptionStatus.FITS
    elif check_fit(state, pod).status.value == "can-never-fit":
        assert plan.status is PreemptionStatus.NEVER
    elif not feasible:
        assert plan.status is PreemptionStatus.NO_HELP
    else:
        assert plan.helps
        assert plan.exhaustive
        assert plan.cost == min(feasible)
        if plan.status is PreemptionStatus.EVICT:  # weighed against other nodes' best sets
            best = min(feasible)

            def against(other: VictimCost) -> Preemption:
                return plan_preemption(
                    state, pod, priority, residents, now_s=NOW_S, budgets=budgets,
                    better_than=other,
                )  # fmt: skip

            assert against(best).status is PreemptionStatus.COSTLIER
            assert against(VictimCost(99, 99, 99, 0.0)).cost == best
            found = against(replace(best, work_lost_s=best.work_lost_s + 0.5))
            assert found.status is PreemptionStatus.EVICT
            assert found.cost == best
        chosen = [r for r in residents if r.key in plan.victims]
        assert all(r.priority < priority and not r.terminating for r in chosen)
        assert _verdict(state, pod, leaving + chosen)
        assert _irredundant(state, pod, residents, plan)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_no_preemption_costs_less_than_the_floor_weighing_starts_from(
    scenario: tuple[NodeState, tuple[Resident, ...], PodRequest, int, dict[str, int]],
) -> None:
    """``preemption_floor`` is a lower bound: nodes are weighed from the lowest floor up and
    the rest left out once the best set found costs no more than the next floor."""
    state, residents, pod, priority, budgets = scenario
    plan = plan_preemption(state, pod, priority, residents, now_s=NOW_S, budgets=budgets)
    floor = preemption_floor(state, pod, priority, residents, now_s=NOW_S)
    if floor is None:
        assert not plan.helps
    elif plan.helps:
        assert plan.cost is not None
        assert floor <= plan.cost
