"""The device-plugin handshake (gpushare.core.handshake): matching kubelet's Allocate to the
pod the extender decided for, and the placement rule that makes the match exact."""

from __future__ import annotations

import itertools
from collections.abc import Iterable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.fit import FitStatus, Reason, check_fit
from gpushare.core.handshake import (
    GPUSHARE_SCHEDULER,
    NO_ASSIGNMENT,
    MatchStatus,
    PendingPod,
    PinStatus,
    Step,
    forced_fit,
    handshake_fit,
    match_allocate,
    pending_pod_of,
    pin,
    steps_of,
)
from gpushare.core.model import (
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.testing.core import pod_request


def pending(
    key: str, *steps: tuple[str, tuple[int, ...], int], t: int = 0, done: int = 0
) -> PendingPod:
    return PendingPod(key, tuple(Step(*s) for s in steps), t, done)


A = pending("ns/a", ("main", (0,), 4), t=1)
B = pending("ns/b", ("main", (1,), 4), t=2)
B_SAME_GPU = pending("ns/b", ("main", (0,), 4), t=2)
TWO = pending("ns/two", ("x", (1,), 2), ("y", (0, 1), 3), t=3)
TWO_STARTED = pending("ns/two", ("x", (1,), 2), ("y", (0, 1), 3), t=3, done=1)
BIG = pending("ns/big", ("main", (2,), 6), t=0)


@pytest.mark.parametrize(
    ("units", "pods", "status", "pod", "container"),
    [
        pytest.param(4, [A], MatchStatus.MATCHED, "ns/a", "main", id="one-pending-pod"),
        pytest.param(4, [B_SAME_GPU, A], MatchStatus.MATCHED, "ns/a", "main",
                     id="equal-pods-same-gpus-oldest-first"),
        pytest.param(4, [A, B], MatchStatus.AMBIGUOUS, None, None,
                     id="equal-pods-different-gpus-refused"),
        pytest.param(6, [A, BIG], MatchStatus.MATCHED, "ns/big", "main", id="by-size"),
        pytest.param(2, [A, TWO], MatchStatus.MATCHED, "ns/two", "x",
                     id="multi-container-first-step"),
        pytest.param(6, [A, TWO_STARTED, BIG], MatchStatus.MATCHED, "ns/two", "y",
                     id="pod-in-progress-goes-first"),
        pytest.param(5, [A, TWO], MatchStatus.NO_CANDIDATE, None, None, id="nothing-asks-5"),
        pytest.param(4, [], MatchStatus.NO_CANDIDATE, None, None, id="nothing-pending"),
    ],
)  # fmt: skip
def test_match_allocate(
    units: int, pods: list[PendingPod], status: MatchStatus, pod: str | None, container: str | None
) -> None:
    for order in itertools.permutations(pods):
        match = match_allocate(units, order)
        assert match.status is status
        assert (match.pod.key if match.pod else None) == pod
        assert (match.step.container if match.step else None) == container


def test_no_match_message_names_units_and_candidates() -> None:
    text = match_allocate(5, [A, TWO]).describe()
    assert "no pending pod asks 5 unit(s)" in text
    assert "ns/a container main asks 4 on GPU 0" in text
    assert "ns/two container x asks 2 on GPU 1" in text
    assert "cannot be told apart" in match_allocate(4, [A, B]).describe()


@pytest.mark.parametrize(
    ("units", "pods", "says"),
    [
        pytest.param(5, [A, TWO], (NO_ASSIGNMENT, "asking 5 unit(s)", "spec.schedulerName",
                                   GPUSHARE_SCHEDULER),
                     id="another-tenants-pending-pods-a-pod-without-assignment-is-told-its-own"),
        pytest.param(4, [], (NO_ASSIGNMENT, "asking 4 unit(s)", "spec.schedulerName"),
                     id="nothing-pending-says-what-the-pod-lacks"),
        pytest.param(4, [A, B], ("cannot be told apart from 1 other pending pod(s)",
                                 "recreate this pod"),
                     id="ambiguous-counts-the-others-without-naming-them"),
    ],
)  # fmt: skip
def test_refusal_says_what_this_pod_lacks_and_names_no_other_pod(
    units: int, pods: list[PendingPod], says: tuple[str, ...]
) -> None:
    match = match_allocate(units, pods)
    text = match.refusal()
    for words in says:
        assert words in text
    assert "ns/" not in text


def request(key: str, *containers: tuple[str, int, int]) -> PodRequest:
    return pod_request(*containers, key=key)


@pytest.mark.parametrize(
    ("pod", "pods", "status", "gpus"),
    [
        pytest.param(request("ns/c", ("main", 4, 1)), [], PinStatus.FREE, None,
                     id="nothing-pending"),
        pytest.param(request("ns/c", ("main", 2, 1)), [A], PinStatus.FREE, None,
                     id="different-first-size-is-free"),
        pytest.param(request("ns/c", ("main", 4, 1)), [A], PinStatus.FORCED, [(0,)],
                     id="equal-pod-takes-the-pending-pods-gpu"),
        pytest.param(request("ns/c", ("main", 2, 2)), [A], PinStatus.WAIT, None,
                     id="same-units-other-shape-waits"),
        pytest.param(request("ns/c", ("p", 2, 1), ("q", 3, 2)), [TWO], PinStatus.FORCED,
                     [(1,), (0, 1)], id="multi-container-copies-every-step"),
        pytest.param(request("ns/c", ("p", 2, 1), ("q", 1, 1)), [TWO], PinStatus.WAIT, None,
                     id="later-step-differs-waits"),
        pytest.param(request("ns/c", ("main", 4, 1)), [TWO_STARTED, BIG], PinStatus.FREE, None,
                     id="started-pods-do-not-pin"),
        pytest.param(request("ns/a", ("main", 4, 1)), [A], PinStatus.FREE, None,
                     id="a-pod-never-pins-itself"),
        pytest.param(request("ns/c", ("main", 4, 1)), [A, B], PinStatus.WAIT, None,
                     id="rule-already-broken-waits"),
    ],
)  # fmt: skip
def test_pin(
    pod: PodRequest, pods: list[PendingPod], status: PinStatus, gpus: list[tuple[int, ...]] | None
) -> None:
    rule = pin(pod, pods)
    assert rule.status is status
    if gpus is not None:
        assert [c.gpu_indices for c in rule.assignment] == gpus
        assert [c.container for c in rule.assignment] == [c.name for c in pod.gpu_containers]


NODE = Node("n", (Gpu(0, "T4", 8), Gpu(1, "T4", 8), Gpu(2, "A100", 8, healthy=False)))


@pytest.mark.parametrize(
    ("used", "assignment", "status", "reason"),
    [
        pytest.param((4, 0, 0), [("main", (0,), 4)], FitStatus.FITS, Reason.FITS, id="fits"),
        pytest.param((5, 0, 0), [("main", (0,), 4)], FitStatus.DOES_NOT_FIT_NOW,
                     Reason.INSUFFICIENT_GPU, id="gpu-too-full"),
        pytest.param((0, 0, 0), [("main", (2,), 4)], FitStatus.DOES_NOT_FIT_NOW,
                     Reason.INSUFFICIENT_GPU, id="unhealthy-gpu-has-nothing-free"),
        pytest.param((0, 0, 0), [("main", (7,), 4)], FitStatus.DOES_NOT_FIT_NOW,
                     Reason.MODEL_EXCLUDED, id="no-such-gpu"),
    ],
)  # fmt: skip
def test_forced_fit(
    used: tuple[int, ...],
    assignment: list[tuple[str, tuple[int, ...], int]],
    status: FitStatus,
    reason: Reason,
) -> None:
    state = NodeState(NODE, used)
    result = forced_fit(
        state, request("ns/c", ("main", 4, 1)), [ContainerAllocation(*a) for a in assignment]
    )
    assert (result.status, result.reason) == (status, reason)


A_COMPUTE = PendingPod("ns/a", (Step("main", (0,), 4, compute_milli=600),), 1, 0)


def compute_request(compute_milli: int) -> PodRequest:
    return PodRequest("ns/c", (ContainerRequest("main", 4, 1, compute_milli=compute_milli),))


@pytest.mark.parametrize(
    "compute_milli",
    [
        pytest.param(600, id="equal-compute-pinned-to-a-gpu-without-that-compute-waits"),
        pytest.param(300, id="other-compute-same-memory-waits"),
        pytest.param(200, id="other-compute-that-would-fit-still-waits"),
    ],
)
def test_the_pin_rule_counts_compute(compute_milli: int) -> None:
    """A pod pinned to an equal pending pod's GPUs asks compute there too: the pinned GPU must
    hold it (else the pod waits), and a pod asking other compute is not equal (it waits)."""
    node = Node("n", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
    blocker = Allocation("ns/a", "n", (ContainerAllocation("main", (0,), 4, compute_milli=600),))
    state = NodeState.empty(node).with_allocation(blocker)
    result = handshake_fit(state, compute_request(compute_milli), [A_COMPUTE])
    assert (result.status, result.reason) == (FitStatus.DOES_NOT_FIT_NOW, Reason.HANDSHAKE)


def test_a_pod_pinned_to_a_gpu_with_room_records_its_compute() -> None:
    node = Node("n", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
    blocker = Allocation("ns/a", "n", (ContainerAllocation("main", (0,), 4, compute_milli=300),))
    state = NodeState.empty(node).with_allocation(blocker)
    pending_a = PendingPod("ns/a", (Step("main", (0,), 4, compute_milli=300),), 1, 0)
    pod = compute_request(300)
    rule = pin(pod, [pending_a])
    assert rule.status is PinStatus.FORCED
    assert rule.assignment == (ContainerAllocation("main", (0,), 4, compute_milli=300),)
    result = handshake_fit(state, pod, [pending_a])
    assert result.fits
    assert result.assignment == rule.assignment
    other = Allocation("ns/x", "n", (ContainerAllocation("x", (0,), 1, compute_milli=500),))
    fuller = forced_fit(state.with_allocation(other), pod, rule.assignment)
    assert fuller.reason is Reason.INSUFFICIENT_COMPUTE


def test_steps_follow_spec_order() -> None:
    allocation = Allocation(
        "ns/p", "n", (ContainerAllocation("b", (1,), 2), ContainerAllocation("a", (0, 1), 3))
    )
    spec = [ContainerRequest("a", 3, 2), ContainerRequest("b", 2, 1)]
    assert [s.container for s in steps_of(allocation, spec)] == ["a", "b"]
    assert [s.units for s in steps_of(allocation, spec)] == [6, 2]
    with pytest.raises(ValueError, match="do not match"):
        steps_of(allocation, spec[:1])


def test_steps_carry_the_units_kubelet_passes_on_the_pods_allocate_resource() -> None:
    """A Tencent pod is matched by its vcuda-core, an exclusive Alibaba pod by the gpu-mem its
    spec names (not the whole GPU's memory it is given)."""
    allocation = Allocation("ns/p", "n", (ContainerAllocation("a", (0,), 16, 1000, True),))
    whole = ContainerRequest(
        "a", 0, 1, exclusive=True, allocate_resource="aliyun.com/gpu-mem", kubelet_units=4
    )
    pod = pending_pod_of(allocation, PodRequest("ns/p", (whole,)), 7)
    assert (pod.resource, pod.first_units, pod.steps[0].given_units) == (
        "aliyun.com/gpu-mem", 4, 16,
    )  # fmt: skip
    assert match_allocate(4, [pod]).status is MatchStatus.MATCHED
    assert match_allocate(16, [pod]).status is MatchStatus.NO_CANDIDATE


# -- the property: bind under the rule, admit in any order, every container gets its own GPUs --


def bind_under_the_rule(pods: Iterable[PodRequest]) -> list[PendingPod]:
    """``pods`` bound one by one to a node of four 8-unit GPUs as the extender binds them
    (the rule, then greedy GPUs when free to choose); the pending pods, assumed in order."""
    state = NodeState.empty(Node("n", tuple(Gpu(i, "T4", 8) for i in range(4))))
    books: list[PendingPod] = []
    for i, pod in enumerate(pods):
        rule = pin(pod, books)
        if rule.status is PinStatus.WAIT:
            continue
        fit = (
            forced_fit(state, pod, rule.assignment)
            if rule.status is PinStatus.FORCED
            else check_fit(state, pod)
        )
        if not fit.fits:
            continue
        allocation = Allocation(pod.key, "n", fit.assignment)
        state = state.with_allocation(allocation)
        books.append(pending_pod_of(allocation, pod, i))
    return books


SHAPES = st.lists(
    st.lists(st.tuples(st.integers(1, 4), st.integers(1, 2)), min_size=1, max_size=3),
    min_size=1,
    max_size=8,
)


@settings(max_examples=300, deadline=None)
@given(shapes=SHAPES, order=st.randoms(use_true_random=False))
def test_any_admission_order_gives_each_container_its_own_pods_gpus(
    shapes: list[list[tuple[int, int]]], order: object
) -> None:
    """The extender binds pods one by one under the rule (greedy GPUs when free to choose);
    kubelet then admits the bound pods in a random order, one Allocate per GPU container. Every
    Allocate matches, and answers exactly what was recorded for the pod being admitted."""
    books = bind_under_the_rule(
        request(f"ns/p{i}", *((f"c{j}", s, c) for j, (s, c) in enumerate(shape)))
        for i, shape in enumerate(shapes)
    )
    admission = list(books)
    order.shuffle(admission)  # type: ignore[attr-defined]
    live = {p.key: p for p in books}
    for admitted in admission:
        for step in admitted.steps:
            match = match_allocate(step.units, list(live.values()))
            assert match.status is MatchStatus.MATCHED, match.describe()
            assert match.pod is not None
            assert match.step is not None
            assert match.step.answer == step.answer  # the admitted pod's own GPUs
            matched = live[match.pod.key]
            done = PendingPod(matched.key, matched.steps, matched.assume_time_ns, matched.done + 1)
            if done.next_step is None:
                del live[matched.key]
            else:
                live[matched.key] = done
    assert not live


CORE = "tencent.com/vcuda-core"


def vcuda(key: str, core: int, memory_units: int) -> PodRequest:
    """A Tencent-like pod: matched at Allocate by its ``core`` alone, whatever its memory."""
    container = ContainerRequest(
        "main", memory_units, 1, compute_milli=core * 10, allocate_resource=CORE,
        kubelet_units=core,
    )  # fmt: skip
    return PodRequest(key, (container,))


def core_pending(key: str, gpu: int, core: int, memory_units: int, t: int) -> PendingPod:
    step = Step("main", (gpu,), memory_units, core * 10, kubelet_units=core)
    return PendingPod(key, (step,), t, 0, CORE)


CORE_A = core_pending("ns/a", 0, 50, 4, 1)
MEM_A = pending("ns/m", ("main", (0,), 4), t=1)


@pytest.mark.parametrize(
    ("pod", "pods", "status"),
    [
        pytest.param(vcuda("ns/c", 50, 8), [CORE_A], PinStatus.WAIT,
                     id="equal-vcuda-core-other-memory-waits-the-plugin-could-not-tell-them-apart"),
        pytest.param(vcuda("ns/c", 50, 4), [CORE_A], PinStatus.FORCED,
                     id="equal-in-every-dimension-takes-the-pending-pods-gpu"),
        pytest.param(vcuda("ns/c", 30, 4), [CORE_A], PinStatus.FREE,
                     id="other-vcuda-core-same-memory-is-free"),
        pytest.param(vcuda("ns/c", 4, 4), [MEM_A], PinStatus.FREE,
                     id="as-many-units-of-another-resource-is-free"),
        pytest.param(request("ns/c", ("main", 4, 1)), [CORE_A], PinStatus.FREE,
                     id="a-memory-pod-is-never-pinned-by-a-vcuda-pod"),
    ],
)  # fmt: skip
def test_the_pin_rule_keys_pods_by_their_allocate_resource_and_units(
    pod: PodRequest, pods: list[PendingPod], status: PinStatus
) -> None:
    """The rule keeps apart exactly the pods the device plugin cannot tell apart: same Allocate
    resource, same units there (design.md, "the handshake")."""
    assert pin(pod, pods).status is status


DIALECT_SHAPES = st.lists(
    st.tuples(st.booleans(), st.sampled_from([10, 20, 50]), st.integers(1, 4)),
    min_size=1,
    max_size=10,
)


@settings(max_examples=300, deadline=None)
@given(shapes=DIALECT_SHAPES, order=st.randoms(use_true_random=False))
def test_any_admission_order_matches_each_pod_on_its_own_resource(
    shapes: list[tuple[bool, int, int]], order: object
) -> None:
    """Pods matched by memory units and pods matched by vcuda-core (compute, whatever their
    memory) bound under the rule on one node: kubelet admits them in any order, calling
    Allocate on each pod's resource, and every call matches the pod's own GPUs."""
    books = bind_under_the_rule(
        vcuda(f"ns/p{i}", core, memory_units)
        if by_core
        else request(f"ns/p{i}", ("main", memory_units, 1))
        for i, (by_core, core, memory_units) in enumerate(shapes)
    )
    admission = list(books)
    order.shuffle(admission)  # type: ignore[attr-defined]
    live = {p.key: p for p in books}
    for admitted in admission:
        step = admitted.steps[0]
        on_resource = [p for p in live.values() if p.resource == admitted.resource]
        match = match_allocate(step.units, on_resource)
        assert match.status is MatchStatus.MATCHED, match.describe()
        assert match.step is not None
        assert match.pod is not None
        assert match.step.answer == step.answer
        del live[match.pod.key]
    assert not live
