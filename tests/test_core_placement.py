"""The cached decision loop: same answers as uncached core calls, ties, staleness, health."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.fit import check_fit
from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.model import Gpu, Node, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies import PolicyContext, make_policy, tie_break_of
from gpushare.testing.core import gpu_node, pod_request


def pod(key: str, share: int, count: int = 1, cpu: int = 0) -> PodRequest:
    container = ("main", share, count) if count else ("main", 0, 0)
    return pod_request(container, key=key, cpu_milli=cpu)


def node(name: str, gpus: int, capacity: int = 1000, cpu: int | None = None) -> Node:
    return gpu_node((capacity,) * gpus, name=name, cpu_milli=cpu)


def test_binpack_sends_the_pod_to_the_node_with_the_tightest_gpu() -> None:
    # design.md §1: N1 has 4,069 MiB free in all, N2 4,069 + 4,069, N3 8,138 on GPU0.
    cap = 16276
    nodes = [node("n1", 2, cap), node("n2", 2, cap), node("n3", 2, cap)]
    states = [
        NodeState(nodes[0], (cap - 4069, cap)),
        NodeState(nodes[1], (cap - 4069, cap - 4069)),
        NodeState(nodes[2], (cap - 8138, cap)),
    ]
    placer = Placer(states, make_policy("binpack"))
    decision = placer.decide(pod("p", 8138))
    assert decision is not None
    assert decision.allocation.node == "n3"
    assert decision.allocation.containers[0].gpu_indices == (0,)


@pytest.mark.parametrize(
    ("tie_rank", "expected"),
    [((0, 1, 2), "a"), ((2, 0, 1), "b"), ((1, 2, 0), "c")],
    ids=["rank-0-is-a", "rank-0-is-b", "rank-0-is-c"],
)
def test_equal_scores_go_to_the_lowest_tie_rank(tie_rank: tuple[int, ...], expected: str) -> None:
    states = [NodeState.empty(node(name, 2)) for name in "abc"]
    decision = Placer(states, make_policy("binpack"), tie_rank).decide(pod("p", 500))
    assert decision is not None
    assert decision.allocation.node == expected


@pytest.mark.parametrize(
    ("among", "expected"),
    [
        pytest.param(None, "a", id="no limit: the best of all"),
        pytest.param((False, True, True), "b", id="limited: the best of those flagged"),
        pytest.param((False, False, False), None, id="none flagged: no decision"),
    ],
)
def test_decide_among_limits_the_choice_to_the_nodes_flagged(
    among: tuple[bool, ...] | None, expected: str | None
) -> None:
    states = [NodeState.empty(node(name, 2)) for name in "abc"]
    flags = None if among is None else np.array(among, dtype=np.bool_)
    decision = Placer(states, make_policy("binpack")).decide(pod("p", 500), among=flags)
    assert (decision.allocation.node if decision is not None else None) == expected


def test_set_policy_drops_the_scores_of_the_policy_before() -> None:
    states = [
        NodeState(node("a", 1), (600,)),
        NodeState.empty(node("b", 1)),
    ]
    placer = Placer(states, make_policy("binpack"))
    first = placer.decide(pod("p", 300))
    placer.set_policy(make_policy("spread"))
    second = placer.decide(pod("p", 300))
    assert first is not None
    assert second is not None
    assert (first.allocation.node, second.allocation.node) == ("a", "b")


def test_a_pod_that_fits_nowhere_gets_no_decision() -> None:
    states = [NodeState.empty(node("a", 1)), NodeState.empty(node("b", 2))]
    assert Placer(states, make_policy("binpack")).decide(pod("p", 1000, count=4)) is None


def test_a_replaced_state_is_seen_by_the_next_decision() -> None:
    states = [NodeState.empty(node("a", 1)), NodeState.empty(node("b", 1))]
    placer = Placer(states, make_policy("binpack"))
    first = placer.decide(pod("p1", 600))
    assert first is not None
    assert first.allocation.node == "a"
    placer.replace(0, placer.states[0].with_allocation(first.allocation))
    second = placer.decide(pod("p2", 600))
    assert second is not None
    assert second.allocation.node == "b"


def test_an_unhealthy_gpu_is_skipped_after_replace() -> None:
    placer = Placer([NodeState.empty(node("a", 2))], make_policy("binpack"))
    sick = dataclasses.replace(
        node("a", 2), gpus=(Gpu(0, "T4", 1000, healthy=False), Gpu(1, "T4", 1000))
    )
    placer.replace(0, NodeState.empty(sick))
    decision = placer.decide(pod("p", 500))
    assert decision is not None
    assert decision.allocation.containers[0].gpu_indices == (1,)


def test_replace_refuses_another_node() -> None:
    placer = Placer([NodeState.empty(node("a", 1))], make_policy("binpack"))
    with pytest.raises(ValueError, match="not b"):
        placer.replace(0, NodeState.empty(node("b", 1)))


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    policy_name=st.sampled_from(["binpack", "bestfit", "packing", "fgd", "fgd-cpu"]),
)
def test_cached_decisions_equal_uncached_core_calls(seed: int, policy_name: str) -> None:
    """After any sequence of placements, the cached decision is the one a fresh evaluation of
    check_fit and score over every node gives, and no GPU is ever above capacity."""
    rng = random.Random(seed)
    nodes = [node(f"n{i}", rng.choice((1, 2, 4)), cpu=rng.choice((8000, 32000))) for i in range(6)]
    shapes = [
        pod(f"s{i}", rng.choice((250, 500, 800, 1000)), 1, rng.choice((0, 2000, 6000)))
        for i in range(4)
    ]
    context = PolicyContext(
        workload=TargetWorkload.from_pods(shapes), max_node_cpu_milli=32000, max_node_gpu=4000
    )
    placer = Placer([NodeState.empty(n) for n in nodes], make_policy(policy_name, context))
    reference = make_policy(policy_name, context)
    for step in range(25):
        request = dataclasses.replace(rng.choice(shapes), key=f"p{step}")
        decision = placer.decide(request)
        fitting = [i for i, s in enumerate(placer.states) if check_fit(s, request).fits]
        if decision is None:
            assert not fitting
            continue
        scores = {i: reference.score(placer.states[i], request) for i in fitting}
        best = [i for i, v in scores.items() if v == max(scores.values())]
        tie_break = tie_break_of(reference)
        if tie_break is not None and len(best) > 1:
            ties = {i: tie_break(placer.states[i], request) for i in best}
            best = [i for i, v in ties.items() if v == max(ties.values())]
        assert decision.node_index == min(best)
        new_state = placer.states[decision.node_index].with_allocation(decision.allocation)
        assert all(f >= 0 for f in new_state.gpu_free)
        placer.replace(decision.node_index, new_state)
