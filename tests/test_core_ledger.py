"""The ledger: committed and assumed allocations, rejections that change nothing, invariants."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from gpushare.core.ledger import (
    Ledger,
    LedgerOutcome,
    LedgerResult,
    Violation,
    ViolationKind,
)
from gpushare.core.model import Allocation, ContainerAllocation, Gpu, Node, NodeState
from gpushare.testing.clock import ManualClock
from gpushare.testing.core import gpu_node

TTL_S = 30.0


def make_node(
    name: str = "n1",
    capacities: tuple[int, ...] = (16, 16),
    unhealthy: frozenset[int] = frozenset(),
) -> Node:
    healthy = tuple(i not in unhealthy for i in range(len(capacities)))
    return gpu_node(capacities, name=name, healthy=healthy, cpu_milli=8000, memory_mib=32768)


def alloc(
    pod: str = "ns/p1",
    node: str = "n1",
    *shares: tuple[tuple[int, ...], int],
    cpu_milli: int = 0,
    memory_mib: int = 0,
) -> Allocation:
    """An allocation from ``(gpu_indices, share)`` pairs, one per container (c0, c1, ...)."""
    return Allocation(
        pod,
        node,
        tuple(ContainerAllocation(f"c{i}", idx, share) for i, (idx, share) in enumerate(shares)),
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
    )


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def ledger(clock: ManualClock) -> Ledger:
    book = Ledger(clock=clock, assume_ttl_s=TTL_S)
    book.upsert_node(make_node())
    return book


@dataclass(frozen=True)
class Snapshot:
    states: tuple[NodeState, ...]
    allocations: tuple[tuple[Allocation, ...], ...]
    deadlines: tuple[tuple[str, float | None], ...]
    violations: tuple[Violation, ...]


def snapshot(book: Ledger, pods: tuple[str, ...] = ()) -> Snapshot:
    names = book.node_names()
    return Snapshot(
        states=tuple(book.state(n) for n in names),
        allocations=tuple(book.allocations(n) for n in names),
        deadlines=tuple((p, book.expires_at(p)) for p in pods),
        violations=tuple(book.check_invariants()),
    )


# --- committing, releasing ---------------------------------------------------------------------


def test_apply_records_and_release_gives_back(ledger: Ledger) -> None:
    allocation = alloc("ns/p1", "n1", ((0,), 6), ((0, 1), 2), cpu_milli=500, memory_mib=1024)
    result = ledger.apply(allocation)
    assert result.outcome is LedgerOutcome.APPLIED
    assert result.ok
    assert result.free_per_gpu == (), "the numbers come with a rejection only"
    state = ledger.state("n1")
    assert state.gpu_used == (8, 2)
    assert (state.cpu_used_milli, state.memory_used_mib) == (500, 1024)
    assert ledger.allocation("ns/p1") == allocation
    assert ledger.allocations("n1") == (allocation,)
    assert not ledger.is_assumed("ns/p1")

    assert ledger.release("ns/p1") == allocation
    assert ledger.state("n1") == NodeState.empty(make_node())
    assert ledger.allocation("ns/p1") is None
    assert ledger.release("ns/p1") is None, "releasing twice is a no-op"


def test_reapplying_the_identical_allocation_is_idempotent(ledger: Ledger) -> None:
    allocation = alloc("ns/p1", "n1", ((1,), 8))
    ledger.apply(allocation)
    before = snapshot(ledger, ("ns/p1",))
    again = ledger.apply(allocation)
    assert again.outcome is LedgerOutcome.UNCHANGED
    assert again.ok
    assert again.existing == allocation
    assert snapshot(ledger, ("ns/p1",)) == before


def test_allocations_are_sorted_by_pod_key(ledger: Ledger) -> None:
    for pod in ("ns/b", "ns/c", "ns/a"):
        assert ledger.apply(alloc(pod, "n1", ((0,), 1))).ok
    assert [a.pod for a in ledger.allocations("n1")] == ["ns/a", "ns/b", "ns/c"]
    assert ledger.allocations("elsewhere") == ()


# --- assume, confirm, expire -------------------------------------------------------------------


def test_assume_counts_and_expires_at_the_deadline(ledger: Ledger, clock: ManualClock) -> None:
    allocation = alloc("ns/p1", "n1", ((0,), 10))
    assert ledger.assume(allocation).outcome is LedgerOutcome.ASSUMED
    assert ledger.is_assumed("ns/p1")
    assert ledger.expires_at("ns/p1") == clock.now_s + TTL_S
    assert ledger.state("n1").gpu_used == (10, 0)
    rejected = ledger.apply(alloc("ns/p2", "n1", ((0,), 7)))
    assert rejected.outcome is LedgerOutcome.INSUFFICIENT_GPU, "assumed units count in fit checks"

    clock.now_s += TTL_S - 0.001
    assert ledger.expire() == []
    assert ledger.is_assumed("ns/p1")
    clock.now_s += 0.001
    assert ledger.expire() == [allocation]
    assert ledger.allocation("ns/p1") is None
    assert ledger.state("n1").gpu_used == (0, 0)


def test_applying_an_assumed_allocation_confirms_it_without_double_count(
    ledger: Ledger, clock: ManualClock
) -> None:
    allocation = alloc("ns/p1", "n1", ((0,), 10))
    ledger.assume(allocation)
    result = ledger.apply(allocation)
    assert result.outcome is LedgerOutcome.CONFIRMED
    assert result.ok
    assert ledger.state("n1").gpu_used == (10, 0)
    assert not ledger.is_assumed("ns/p1")
    assert ledger.expires_at("ns/p1") is None
    clock.now_s += 10 * TTL_S
    assert ledger.expire() == [], "committed allocations never expire"
    assert ledger.allocation("ns/p1") == allocation


def test_reassuming_keeps_the_state_and_the_deadline(ledger: Ledger, clock: ManualClock) -> None:
    allocation = alloc("ns/p1", "n1", ((0,), 4))
    ledger.assume(allocation)
    deadline = ledger.expires_at("ns/p1")
    clock.now_s += 5
    assert ledger.assume(allocation).outcome is LedgerOutcome.UNCHANGED
    assert ledger.expires_at("ns/p1") == deadline
    assert ledger.state("n1").gpu_used == (4, 0)


def test_assuming_a_committed_allocation_keeps_it_committed(ledger: Ledger) -> None:
    allocation = alloc("ns/p1", "n1", ((0,), 4))
    ledger.apply(allocation)
    assert ledger.assume(allocation).outcome is LedgerOutcome.UNCHANGED
    assert not ledger.is_assumed("ns/p1")


def test_expire_returns_earliest_deadline_first(ledger: Ledger, clock: ManualClock) -> None:
    late, early, tie = (alloc(p, "n1", ((0,), 1)) for p in ("ns/late", "ns/early", "ns/a-tie"))
    ledger.assume(early)
    ledger.assume(tie)
    clock.now_s += 1
    ledger.assume(late)
    ledger.apply(alloc("ns/committed", "n1", ((1,), 1)))
    clock.now_s += TTL_S + 1
    assert ledger.expire() == [tie, early, late]
    assert [a.pod for a in ledger.allocations("n1")] == ["ns/committed"]


def test_released_assumed_allocation_does_not_expire_later(
    ledger: Ledger, clock: ManualClock
) -> None:
    ledger.assume(alloc("ns/p1", "n1", ((0,), 4)))
    assert ledger.release("ns/p1") is not None
    clock.now_s += TTL_S
    assert ledger.expire() == []


# --- rejections ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rejection:
    id: str
    allocation: Allocation
    outcome: LedgerOutcome
    gpu_index: int | None = None
    requested: int = 0
    available: int | None = None


# The ledger in these cases holds ns/held: 10 units on GPU0 of n1 (two GPUs of 16, GPU1 healthy).
REJECTIONS = [
    Rejection("unknown node", alloc("ns/p", "n9", ((0,), 1)), LedgerOutcome.UNKNOWN_NODE),
    Rejection(
        "unknown GPU index",
        alloc("ns/p", "n1", ((1,), 1), ((2,), 3)),
        LedgerOutcome.UNKNOWN_GPU,
        gpu_index=2,
        requested=3,
    ),
    Rejection(
        "unknown GPU index even when another GPU is short",
        alloc("ns/p", "n1", ((0,), 15), ((5,), 1)),
        LedgerOutcome.UNKNOWN_GPU,
        gpu_index=5,
        requested=1,
    ),
    Rejection(
        "more than free on a GPU",
        alloc("ns/p", "n1", ((0,), 7)),
        LedgerOutcome.INSUFFICIENT_GPU,
        gpu_index=0,
        requested=7,
        available=6,
    ),
    Rejection(
        "more than a whole GPU",
        alloc("ns/p", "n1", ((1,), 17)),
        LedgerOutcome.INSUFFICIENT_GPU,
        gpu_index=1,
        requested=17,
        available=16,
    ),
    Rejection(
        "two containers together exceed one GPU",
        alloc("ns/p", "n1", ((1,), 9), ((1,), 8)),
        LedgerOutcome.INSUFFICIENT_GPU,
        gpu_index=1,
        requested=17,
        available=16,
    ),
    Rejection(
        "multi-GPU container with one GPU short",
        alloc("ns/p", "n1", ((0, 1), 8)),
        LedgerOutcome.INSUFFICIENT_GPU,
        gpu_index=0,
        requested=8,
        available=6,
    ),
    Rejection(
        "different allocation for a pod already recorded",
        alloc("ns/held", "n1", ((1,), 10)),
        LedgerOutcome.CONFLICT,
    ),
    Rejection(
        "same GPUs but different cpu for a pod already recorded",
        alloc("ns/held", "n1", ((0,), 10), cpu_milli=1),
        LedgerOutcome.CONFLICT,
    ),
    Rejection(
        "same pod on another node",
        alloc("ns/held", "n9", ((0,), 10)),
        LedgerOutcome.CONFLICT,
    ),
]


@pytest.mark.parametrize("how", ["apply", "assume"])
@pytest.mark.parametrize("case", REJECTIONS, ids=[c.id for c in REJECTIONS])
def test_rejection_changes_nothing_and_says_why(ledger: Ledger, case: Rejection, how: str) -> None:
    held = alloc("ns/held", "n1", ((0,), 10))
    ledger.assume(held) if how == "assume" else ledger.apply(held)
    before = snapshot(ledger, ("ns/held", "ns/p"))
    result = ledger.assume(case.allocation) if how == "assume" else ledger.apply(case.allocation)
    assert result.outcome is case.outcome, result.describe()
    assert not result.ok
    assert (result.gpu_index, result.requested, result.available) == (
        case.gpu_index,
        case.requested,
        case.available,
    )
    if case.outcome is LedgerOutcome.CONFLICT:
        assert result.existing == held
    known = case.allocation.node == "n1"
    assert result.free_per_gpu == ((6, 16) if known else ())
    assert result.capacity_per_gpu == ((16, 16) if known else ())
    assert snapshot(ledger, ("ns/held", "ns/p")) == before
    assert ledger.allocation(case.allocation.pod) == (
        held if case.allocation.pod == "ns/held" else None
    )


@pytest.mark.parametrize(
    ("shares", "outcome"),
    [
        ((((0,), 6),), LedgerOutcome.APPLIED),
        ((((0,), 7),), LedgerOutcome.INSUFFICIENT_GPU),
        ((((0,), 3), ((0,), 3)), LedgerOutcome.APPLIED),
    ],
    ids=[
        "fits exactly when free equals requested",
        "one unit over free is rejected",
        "two containers summing exactly to free fit",
    ],
)
def test_free_equal_to_requested_is_the_edge(
    ledger: Ledger, shares: tuple[tuple[tuple[int, ...], int], ...], outcome: LedgerOutcome
) -> None:
    ledger.apply(alloc("ns/held", "n1", ((0,), 10)))
    assert ledger.apply(alloc("ns/p", "n1", *shares)).outcome is outcome
    assert ledger.check_invariants() == []


def test_rejection_describes_its_numbers(ledger: Ledger) -> None:
    ledger.apply(alloc("ns/held", "n1", ((0,), 10)))
    result = ledger.apply(alloc("ns/p", "n1", ((0,), 7)))
    assert result.describe() == (
        "pod ns/p on node n1: not enough free on the GPU; GPU 0; requested 7; available 6; "
        "free/capacity per GPU 6/16, 16/16"
    )
    assert LedgerResult(LedgerOutcome.APPLIED, "ns/p", "n1").describe() == (
        "pod ns/p on node n1: applied"
    )


@pytest.mark.parametrize(
    "allocation",
    [
        alloc("ns/p", "n1", ((0,), -1)),
        alloc("ns/p", "n1", ((0, 0), 1)),
        alloc("ns/p", "n1", ((-1,), 1)),
        alloc("ns/p", "n1", ((0,), 1), cpu_milli=-5),
    ],
    ids=["negative share", "GPU index twice in a container", "negative GPU index", "negative cpu"],
)
def test_malformed_allocation_is_a_programming_error(
    ledger: Ledger, allocation: Allocation
) -> None:
    with pytest.raises(ValueError, match="malformed allocation for pod ns/p"):
        ledger.apply(allocation)
    with pytest.raises(ValueError, match="malformed allocation"):
        ledger.assume(allocation)


def test_negative_ttl_is_a_programming_error(clock: ManualClock) -> None:
    with pytest.raises(ValueError, match="assume_ttl_s must be >= 0"):
        Ledger(clock=clock, assume_ttl_s=-1)


def test_state_of_unknown_node_is_a_programming_error(ledger: Ledger) -> None:
    with pytest.raises(KeyError, match="n9"):
        ledger.state("n9")


# --- node changes ------------------------------------------------------------------------------


def test_health_flip_keeps_allocations_but_takes_no_new_ones(ledger: Ledger) -> None:
    held = alloc("ns/held", "n1", ((0,), 4))
    ledger.apply(held)
    ledger.upsert_node(make_node(unhealthy=frozenset({0})))
    state = ledger.state("n1")
    assert state.gpu_used == (4, 0)
    assert state.gpu_free == (0, 16)
    assert ledger.allocation("ns/held") == held
    assert ledger.check_invariants() == []

    refused = ledger.apply(alloc("ns/p", "n1", ((0,), 1)))
    assert (refused.outcome, refused.gpu_index, refused.available) == (
        LedgerOutcome.UNHEALTHY_GPU,
        0,
        0,
    )
    assert ledger.assume(alloc("ns/p", "n1", ((0,), 1))).outcome is LedgerOutcome.UNHEALTHY_GPU
    assert ledger.apply(alloc("ns/p", "n1", ((1,), 1))).outcome is LedgerOutcome.APPLIED

    ledger.upsert_node(make_node())
    assert ledger.apply(alloc("ns/q", "n1", ((0,), 12))).outcome is LedgerOutcome.APPLIED


def test_confirming_an_assumed_allocation_on_a_gpu_gone_unhealthy(ledger: Ledger) -> None:
    allocation = alloc("ns/p", "n1", ((0,), 4))
    ledger.assume(allocation)
    ledger.upsert_node(make_node(unhealthy=frozenset({0})))
    assert ledger.apply(allocation).outcome is LedgerOutcome.CONFIRMED


def test_rebuild_may_admit_pods_already_on_an_unhealthy_gpu(clock: ManualClock) -> None:
    book = Ledger(clock=clock, assume_ttl_s=TTL_S)
    book.upsert_node(make_node(unhealthy=frozenset({0})))
    running = alloc("ns/running", "n1", ((0,), 12))
    assert book.apply(running).outcome is LedgerOutcome.UNHEALTHY_GPU
    assert book.apply(running, allow_unhealthy=True).outcome is LedgerOutcome.APPLIED
    too_big = alloc("ns/other", "n1", ((0,), 5))
    assert book.apply(too_big, allow_unhealthy=True).outcome is LedgerOutcome.INSUFFICIENT_GPU
    assert book.check_invariants() == []


def test_shrunk_or_missing_gpu_is_reported_by_check_invariants(ledger: Ledger) -> None:
    ledger.apply(alloc("ns/a", "n1", ((0,), 12)))
    ledger.apply(alloc("ns/b", "n1", ((0,), 2), ((1,), 3)))
    ledger.upsert_node(make_node(capacities=(8,)))
    assert ledger.check_invariants() == [
        Violation(ViolationKind.OVER_CAPACITY, "n1", 0, 14, 8, ("ns/a", "ns/b")),
        Violation(ViolationKind.UNKNOWN_GPU, "n1", 1, 3, 0, ("ns/b",)),
    ]
    state = ledger.state("n1")
    assert state.gpu_used == (14,), "units on a vanished GPU are left out of the state"
    assert state.gpu_free == (-6,)
    assert ledger.units_off_node("n1") == 3, "but counted apart, for callers that charge them"
    assert ledger.apply(alloc("ns/c", "n1", ((0,), 1))).outcome is LedgerOutcome.INSUFFICIENT_GPU
    ledger.release("ns/b")
    assert ledger.check_invariants() == [
        Violation(ViolationKind.OVER_CAPACITY, "n1", 0, 12, 8, ("ns/a",))
    ]
    assert ledger.units_off_node("n1") == 0
    assert ledger.units_off_node("unknown") == 0


def test_removed_node_keeps_its_allocations_until_released(ledger: Ledger) -> None:
    held = alloc("ns/held", "n1", ((1,), 5))
    ledger.apply(held)
    ledger.remove_node("n1")
    assert ledger.node_names() == ()
    assert ledger.allocations("n1") == (held,)
    assert ledger.check_invariants() == [
        Violation(ViolationKind.UNKNOWN_NODE, "n1", 1, 5, 0, ("ns/held",))
    ]
    assert ledger.apply(alloc("ns/p", "n1", ((0,), 1))).outcome is LedgerOutcome.UNKNOWN_NODE
    with pytest.raises(KeyError):
        ledger.state("n1")

    ledger.upsert_node(make_node())
    assert ledger.state("n1").gpu_used == (0, 5), "a node that comes back still counts them"
    ledger.remove_node("n1")
    assert ledger.release("ns/held") == held
    assert ledger.check_invariants() == []
    assert ledger.allocations("n1") == ()
    ledger.remove_node("n1")  # unknown: no-op


def test_upsert_node_replaces_cpu_and_memory(ledger: Ledger) -> None:
    ledger.apply(alloc("ns/p", "n1", ((0,), 1), cpu_milli=100))
    ledger.upsert_node(replace(make_node(), cpu_milli=200))
    assert ledger.state("n1").cpu_free_milli == 100


# --- random sequences ----------------------------------------------------------------------------

NODES = {
    "n0": Node("n0", (Gpu(0, "T4", 10), Gpu(1, "T4", 8), Gpu(2, "A100", 16))),
    "n1": Node("n1", (Gpu(0, "T4", 12), Gpu(3, "T4", 6))),  # indices with a gap
}
PODS = tuple(f"ns/p{i}" for i in range(6))


@st.composite
def allocations(draw: st.DrawFn) -> Allocation:
    """Mostly well-formed allocations on known nodes and GPUs; sometimes a ghost node or GPU."""
    node = draw(st.sampled_from([*NODES] * 6 + ["ghost"]))
    known = [gpu.index for gpu in NODES[node].gpus] if node in NODES else [0]
    indices = st.sampled_from(known * 8 + [1, 3])
    containers = draw(
        st.lists(
            st.tuples(
                st.lists(indices, min_size=1, max_size=2, unique=True),
                st.integers(0, 8),
                st.sampled_from([0, 0, 0, 300, 700]),  # compute_milli
                st.sampled_from([False] * 5 + [True]),  # whole GPUs
            ),
            min_size=1,
            max_size=2,
        )
    )
    return Allocation(
        draw(st.sampled_from(PODS)),
        node,
        tuple(
            ContainerAllocation(
                f"c{i}", tuple(indices), share, 1000 if whole else compute, exclusive=whole
            )
            for i, (indices, share, compute, whole) in enumerate(containers)
        ),
        cpu_milli=draw(st.integers(0, 2)),
        memory_mib=draw(st.integers(0, 2)),
    )


class LedgerMachine(RuleBasedStateMachine):
    """Random apply/assume/release/expire/clock/health sequences against a plain model."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock(0.0)
        self.ledger = Ledger(clock=self.clock, assume_ttl_s=5.0)
        self.nodes = dict(NODES)
        for node in self.nodes.values():
            self.ledger.upsert_node(node)
        self.model: dict[str, tuple[Allocation, float | None]] = {}  # pod -> (alloc, deadline)

    def expected_ok(self, allocation: Allocation) -> bool:
        node = self.nodes.get(allocation.node)
        if node is None:
            return False
        state = self.recomputed(node)
        position = {gpu.index: i for i, gpu in enumerate(node.gpus)}
        compute = allocation.per_gpu_compute()
        for index, amount in allocation.per_gpu().items():
            if index not in position:
                return False
            p = position[index]
            gpu = node.gpus[p]
            if not gpu.healthy or state.gpu_whole[p]:
                return False
            if index in allocation.whole_gpus() and (
                state.gpu_used[p] or state.gpu_compute_used[p]
            ):
                return False
            if state.gpu_used[p] + amount > gpu.capacity:
                return False
            if state.gpu_compute_used[p] + compute.get(index, 0) > 1000:
                return False
        return True

    def recomputed(self, node: Node) -> NodeState:
        state = NodeState.empty(node)
        for allocation, _ in self.model.values():
            if allocation.node == node.name:
                state = state.with_allocation(allocation)
        return state

    def record(self, allocation: Allocation, assumed: bool) -> None:
        before = snapshot(self.ledger, PODS)
        node = self.nodes.get(allocation.node)
        free_before = self.recomputed(node).gpu_free if node is not None else ()
        result = self.ledger.assume(allocation) if assumed else self.ledger.apply(allocation)
        # A rejection reports the free units as a NodeState counts them, before the call.
        assert result.free_per_gpu == (() if result.ok else free_before)
        recorded = self.model.get(allocation.pod)
        if recorded is not None:
            if recorded[0] != allocation:
                assert result.outcome is LedgerOutcome.CONFLICT
            elif assumed or recorded[1] is None:
                assert result.outcome is LedgerOutcome.UNCHANGED
            else:
                assert result.outcome is LedgerOutcome.CONFIRMED
                self.model[allocation.pod] = (allocation, None)
        elif self.expected_ok(allocation):
            assert result.outcome is (LedgerOutcome.ASSUMED if assumed else LedgerOutcome.APPLIED)
            deadline = self.clock.now_s + 5.0 if assumed else None
            self.model[allocation.pod] = (allocation, deadline)
        else:
            assert not result.ok
        if not result.ok or result.outcome is LedgerOutcome.UNCHANGED:
            assert snapshot(self.ledger, PODS) == before

    @rule(allocation=allocations())
    def apply(self, allocation: Allocation) -> None:
        self.record(allocation, assumed=False)

    @rule(allocation=allocations())
    def assume(self, allocation: Allocation) -> None:
        self.record(allocation, assumed=True)

    @rule(pod=st.sampled_from(PODS))
    def confirm(self, pod: str) -> None:
        """Apply exactly what the pod holds (the watch seeing it bound), if it holds anything."""
        if pod in self.model:
            self.record(self.model[pod][0], assumed=False)

    @rule(pod=st.sampled_from(PODS))
    def release(self, pod: str) -> None:
        recorded = self.model.pop(pod, None)
        assert self.ledger.release(pod) == (None if recorded is None else recorded[0])

    @rule()
    def expire(self) -> None:
        now = self.clock.now_s
        due = sorted(
            (deadline, pod)
            for pod, (_, deadline) in self.model.items()
            if deadline is not None and deadline <= now
        )
        expected = [self.model.pop(pod)[0] for _, pod in due]
        assert self.ledger.expire() == expected

    @rule(seconds=st.sampled_from([1.0, 5.0]))
    def advance_clock(self, seconds: float) -> None:
        self.clock.now_s += seconds

    @rule(name=st.sampled_from(sorted(NODES)), index=st.integers(0, 2))
    def flip_health(self, name: str, index: int) -> None:
        node = self.nodes[name]
        position = index % len(node.gpus)
        gpus = list(node.gpus)
        gpus[position] = replace(gpus[position], healthy=not gpus[position].healthy)
        self.nodes[name] = replace(node, gpus=tuple(gpus))
        self.ledger.upsert_node(self.nodes[name])

    @invariant()
    def no_violations(self) -> None:
        assert self.ledger.check_invariants() == []

    @invariant()
    def state_equals_recomputation(self) -> None:
        for node in self.nodes.values():
            assert self.ledger.state(node.name) == self.recomputed(node)
            assert self.ledger.allocations(node.name) == tuple(
                a for _, (a, _) in sorted(self.model.items()) if a.node == node.name
            )
        for pod in PODS:
            recorded = self.model.get(pod)
            assert self.ledger.allocation(pod) == (None if recorded is None else recorded[0])
            assert self.ledger.expires_at(pod) == (None if recorded is None else recorded[1])


TestLedgerSequences = LedgerMachine.TestCase
TestLedgerSequences.settings = settings(max_examples=80, stateful_step_count=40, deadline=None)


# --- the second dimension: compute and whole GPUs ----------------------------------------------


def shared(index: int, share: int, compute_milli: int, name: str = "c0") -> ContainerAllocation:
    return ContainerAllocation(name, (index,), share, compute_milli)


def whole_gpu(*indices: int, capacity: int = 16) -> ContainerAllocation:
    return ContainerAllocation("w", indices, capacity, 1000, exclusive=True)


@dataclass(frozen=True)
class TwoDRecord:
    id: str
    held: tuple[ContainerAllocation, ...]  # what ns/held holds on n1 (two GPUs of 16)
    asked: tuple[ContainerAllocation, ...]  # what ns/p asks there
    outcome: LedgerOutcome
    gpu_index: int | None = None
    requested: int = 0
    available: int | None = None


TWO_D_RECORDS = [
    TwoDRecord("compute fits next to compute", (shared(0, 4, 600),), (shared(0, 4, 400),),
               LedgerOutcome.APPLIED),
    TwoDRecord("compute above one GPU is refused with the compute numbers",
               (shared(0, 4, 600),), (shared(0, 4, 500),),
               LedgerOutcome.INSUFFICIENT_COMPUTE, 0, 500, 400),
    TwoDRecord("a memory-only pod is not bounded by compute",
               (shared(0, 4, 1000),), (ContainerAllocation("c0", (0,), 4),),
               LedgerOutcome.APPLIED),
    TwoDRecord("a whole GPU on a GPU that holds nothing", (shared(0, 4, 0),), (whole_gpu(1),),
               LedgerOutcome.APPLIED),
    TwoDRecord("a whole GPU on a GPU holding memory is refused",
               (shared(0, 4, 0),), (whole_gpu(0),), LedgerOutcome.GPU_IN_USE, 0, 16, 12),
    TwoDRecord("a whole GPU on a GPU holding compute only is refused",
               (shared(0, 0, 300),), (whole_gpu(0),), LedgerOutcome.GPU_IN_USE, 0, 16, 16),
    TwoDRecord("nothing goes on a GPU held whole, not even compute only",
               (whole_gpu(0),), (shared(0, 0, 100),), LedgerOutcome.HELD_WHOLE, 0, 0, 0),
    TwoDRecord("nor another whole claim", (whole_gpu(0),), (whole_gpu(0, 1),),
               LedgerOutcome.HELD_WHOLE, 0, 16, 0),
]  # fmt: skip


@pytest.mark.parametrize("how", ["apply", "assume"])
@pytest.mark.parametrize("case", TWO_D_RECORDS, ids=[c.id for c in TWO_D_RECORDS])
def test_both_dimensions_and_whole_gpus_are_guarded(
    ledger: Ledger, case: TwoDRecord, how: str
) -> None:
    held = Allocation("ns/held", "n1", case.held)
    assert ledger.apply(held).ok
    before = snapshot(ledger, ("ns/held", "ns/p"))
    asked = Allocation("ns/p", "n1", case.asked)
    result = ledger.assume(asked) if how == "assume" else ledger.apply(asked)
    outcome = case.outcome
    if outcome is LedgerOutcome.APPLIED and how == "assume":
        outcome = LedgerOutcome.ASSUMED
    assert result.outcome is outcome, result.describe()
    if not result.ok:
        assert (result.gpu_index, result.requested, result.available) == (
            case.gpu_index, case.requested, case.available,
        )  # fmt: skip
        assert snapshot(ledger, ("ns/held", "ns/p")) == before
    assert ledger.check_invariants() == []
    state = ledger.state("n1")
    expected = NodeState.empty(state.node).with_allocation(held)
    if result.ok:
        expected = expected.with_allocation(asked)
    assert (state.gpu_used, state.gpu_compute_used, state.gpu_whole) == (
        expected.gpu_used, expected.gpu_compute_used, expected.gpu_whole,
    )  # fmt: skip
    ledger.release("ns/p")
    ledger.release("ns/held")
    empty = ledger.state("n1")
    assert (empty.gpu_used, empty.gpu_compute_used, empty.gpu_whole) == (
        (0, 0), (0, 0), (False, False),
    )  # fmt: skip


def test_malformed_compute_is_a_programming_error(ledger: Ledger) -> None:
    with pytest.raises(ValueError, match="compute_milli 1200"):
        ledger.apply(Allocation("ns/p", "n1", (shared(0, 4, 1200),)))
