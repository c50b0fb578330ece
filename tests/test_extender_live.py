"""The live extender's parts without an API server: the cache feeder, the API binder adapter
(which answers mean bound, not bound, unknown), the Event sink, and the filter's answer for a
node that is not labelled ``gpushare=true``. The real thing runs in
``tests/cluster/test_extender_live.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from gpushare.core.model import Allocation, ContainerAllocation
from gpushare.core.skipped import SkippedPod
from gpushare.extender import BindEvent, Binding, ExtenderState
from gpushare.extender.apiserver import ApiBinder, ApiEventSink, EventRate
from gpushare.extender.feed import StateFeeder
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.scoring import extender_policy
from gpushare.extender.wire import ExtenderArgs, ExtenderBindingArgs
from gpushare.kube.binder import BindResult
from gpushare.kube.cache import CacheStats
from gpushare.kube.codec import ALLOCATION, MemoryUnit, allocation_annotations, node_info
from gpushare.kube.errors import ApiCallError, BindError, BindStage, Failure
from gpushare.kube.events import EventType
from gpushare.kube.refs import PodRef
from gpushare.kube.watch import Action, Change, WatchStats
from gpushare.testing.clock import ManualClock
from gpushare.testing.extender import node_json, pod_json

T = TypeVar("T")
GPU = 16276


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


# -- the feeder ------------------------------------------------------------------------------


def bound_pod(
    name: str, node: str, gpu: int, amount: int, *, uid: str | None = None
) -> dict[str, Any]:
    """A pod bound to ``node`` holding ``amount`` on GPU ``gpu``, as the API server has it."""
    allocation = Allocation(f"default/{name}", node, (ContainerAllocation("main", (gpu,), amount),))
    notes = allocation_annotations(
        allocation, node_info(node_json(node, [GPU, GPU])).node, now_ns=1, unit=MemoryUnit.MIB
    )
    return pod_json(name, amount, node=node, annotations=notes, uid=uid)


def upsert(kind: str, key: str, obj: dict[str, Any], previous: Any = None) -> Change:
    return Change(kind, Action.UPSERT, key, obj, previous)


def delete(kind: str, key: str, obj: dict[str, Any]) -> Change:
    return Change(kind, Action.DELETE, key, obj, obj)


def used(state: ExtenderState, node: str) -> tuple[int, ...]:
    return state.reservations.ledger_state(node).gpu_used


def fed(*pods: dict[str, Any]) -> StateFeeder:
    """A feeder that has seen node n1 (2 × 16,276 MiB) and ``pods``."""
    feeder = StateFeeder(ExtenderState())
    feeder.on_node(upsert("Node", "n1", node_json("n1", [GPU, GPU])))
    for pod in pods:
        key = f"default/{pod['metadata']['name']}"
        feeder.on_pod(upsert("Pod", key, pod))
    return feeder


def test_bound_pods_are_committed_and_released_when_deleted() -> None:
    pod = bound_pod("a", "n1", 1, 8138)
    feeder = fed(pod)
    assert used(feeder.state, "n1") == (0, 8138)
    assert not feeder.state.reservations.is_assumed("default/a")
    feeder.on_pod(delete("Pod", "default/a", pod))
    assert used(feeder.state, "n1") == (0, 0)
    assert feeder.state.cluster.pod("default/a") is None
    assert feeder.errors == 0


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_finished_pods_release_their_gpus(phase: str) -> None:
    pod = bound_pod("a", "n1", 0, 4069)
    feeder = fed(pod)
    finished = {**pod, "status": {"phase": phase}}
    feeder.on_pod(upsert("Pod", "default/a", finished, pod))
    assert used(feeder.state, "n1") == (0, 0)


def test_a_pod_recreated_in_a_watch_gap_drops_the_old_allocation() -> None:
    old = bound_pod("a", "n1", 0, 4069, uid="uid-old")
    feeder = fed(old)
    new = pod_json("a", 4069, uid="uid-new")  # same name, pending again
    feeder.on_pod(upsert("Pod", "default/a", new, old))
    assert used(feeder.state, "n1") == (0, 0)
    assert feeder.state.cluster.pod("default/a") == new


def test_pods_bound_before_their_node_arrives_count_once_it_does() -> None:
    feeder = StateFeeder(ExtenderState())
    feeder.on_pod(upsert("Pod", "default/a", bound_pod("a", "n1", 1, 100)))
    feeder.on_node(upsert("Node", "n1", node_json("n1", [GPU, GPU])))
    assert used(feeder.state, "n1") == (0, 100)


def test_garbage_is_logged_and_blocks_the_node(caplog: pytest.LogCaptureFixture) -> None:
    pod = bound_pod("a", "n1", 1, 8138)
    feeder = fed(pod)
    garbage = {**pod, "metadata": {**pod["metadata"], "annotations": {ALLOCATION: "{oops"}}}
    feeder.on_pod(upsert("Pod", "default/a", garbage, pod))
    assert used(feeder.state, "n1") == (0, 8138)  # the ledger keeps what it had
    node_state = feeder.state.schedulable_state("n1")  # and the unreadable pod blocks the node
    assert node_state is not None
    assert node_state.gpu_free == (0, -8138)
    broken = node_json("n1", [GPU, GPU])
    broken["metadata"]["annotations"]["gpushare.io/gpu-inventory"] = '{"unit": "KiB"}'
    feeder.on_node(upsert("Node", "n1", broken))
    assert feeder.state.cluster.node("n1") is None  # unknown now: filter says so, the log says why
    assert feeder.errors == 2
    assert "pod default/a on node n1: allocation cannot be read" in caplog.text
    assert "node n1 cannot be read" in caplog.text


def test_overcommitted_cluster_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    feeder = fed(bound_pod("a", "n1", 0, 10000))
    feeder.on_pod(upsert("Pod", "default/b", bound_pod("b", "n1", 0, 10000)))
    assert feeder.errors == 1
    assert "pod default/b on node n1: allocation does not fit the GPU" in caplog.text


def test_deleted_nodes_are_forgotten() -> None:
    feeder = fed()
    feeder.on_node(delete("Node", "n1", node_json("n1", [GPU, GPU])))
    assert feeder.state.cluster.node("n1") is None


@dataclass
class FakeCache:
    """A cache that syncs after ``timeouts`` waits."""

    timeouts: int
    waits: list[float] = field(default_factory=list)

    async def wait_synced(self, timeout_s: float) -> None:
        self.waits.append(timeout_s)
        if len(self.waits) <= self.timeouts:
            raise TimeoutError

    @property
    def stats(self) -> CacheStats:
        return CacheStats(WatchStats(last_error="forbidden (HTTP 403): nodes"), WatchStats())


def test_marked_synced_once_the_cache_is(caplog: pytest.LogCaptureFixture) -> None:
    feeder = StateFeeder(ExtenderState())
    cache = FakeCache(timeouts=2)
    run(feeder.mark_when_synced(cache, log_every_s=0.5))
    assert feeder.state.cluster.synced
    assert cache.waits == [0.5, 0.5, 0.5]
    assert "still listing nodes and pods after 1s (nodes: forbidden (HTTP 403)" in caplog.text


# -- GPU-share nodes -------------------------------------------------------------------------


def test_unlabelled_node_takes_no_pods_but_counts_what_it_holds() -> None:
    node = node_json("n1", [GPU, GPU])
    del node["metadata"]["labels"]["gpushare"]
    feeder = StateFeeder(ExtenderState())
    feeder.on_node(upsert("Node", "n1", node))
    feeder.on_pod(upsert("Pod", "default/a", bound_pod("a", "n1", 0, 4069)))
    feeder.state.cluster.mark_synced()
    assert used(feeder.state, "n1") == (4069, 0)
    scheduler = Scheduler(feeder.state, extender_policy("binpack"), ApiBinder(FakeBinder()))
    pod = pod_json("b", 4069)
    result = scheduler.filter(ExtenderArgs(pod=pod, nodes=None, node_names=["n1"]))
    assert result.failed_and_unresolvable_nodes == {
        "n1": "gpushare: not a GPU-share node (no label gpushare=true)"
    }


# -- the binder adapter ----------------------------------------------------------------------


@dataclass
class FakeBinder:
    """``gpushare.kube.binder.PodBinder`` stand-in: raises ``error`` or succeeds; ``delay_s``."""

    error: BindError | None = None
    delay_s: float = 0.0
    calls: list[tuple[PodRef, str, dict[str, str]]] = field(default_factory=list)

    async def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> BindResult:
        self.calls.append((pod, node, dict(annotations)))
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return BindResult(pod, node, annotations)


BINDING = Binding("ns", "p", "uid-1", "n3", {ALLOCATION: '{"node":"n3"}'})


def bind_error(
    stage: BindStage, failure: Failure, *, bound: str | None = None, recorded: str | None = None
) -> BindError:
    observed = None
    if bound is not None:
        annotations = {ALLOCATION: recorded} if recorded is not None else {}
        observed = {"metadata": {"annotations": annotations}, "spec": {"nodeName": bound}}
    return BindError(
        "ns/p", "n3", stage, failure, "detail", bound_node=bound, observed_pod=observed
    )


def test_a_successful_bind_is_none_and_passes_everything_on() -> None:
    binder = FakeBinder()
    assert run(ApiBinder(binder).bind(BINDING)) is None
    assert binder.calls == [(PodRef("ns", "p", "uid-1"), "n3", dict(BINDING.annotations))]


def test_already_bound_to_the_same_node_is_success(caplog: pytest.LogCaptureFixture) -> None:
    same = bind_error(BindStage.READ, Failure.ALREADY_BOUND, bound="n3", recorded='{"node":"n3"}')
    assert run(ApiBinder(FakeBinder(same)).bind(BINDING)) is None
    assert "already bound" not in caplog.text
    other_gpus = bind_error(BindStage.READ, Failure.ALREADY_BOUND, bound="n3", recorded="{}")
    assert run(ApiBinder(FakeBinder(other_gpus)).bind(BINDING)) is None
    assert "was already bound to n3 with allocation {}" in caplog.text


DEFINITELY_NOT_BOUND = [
    bind_error(BindStage.READ, Failure.ALREADY_BOUND, bound="n1"),
    bind_error(BindStage.READ, Failure.NOT_FOUND),
    bind_error(BindStage.READ, Failure.UNREACHABLE),
    bind_error(BindStage.ANNOTATE, Failure.SERVER),
    bind_error(BindStage.ANNOTATE, Failure.FORBIDDEN),
    bind_error(BindStage.BIND, Failure.CONFLICT),
    bind_error(BindStage.BIND, Failure.FORBIDDEN),
    bind_error(BindStage.BIND, Failure.INVALID),
    bind_error(BindStage.BIND, Failure.THROTTLED),
]


@pytest.mark.parametrize(
    "error", DEFINITELY_NOT_BOUND, ids=[f"{e.stage}-{e.failure}" for e in DEFINITELY_NOT_BOUND]
)
def test_definite_failures_are_error_texts(error: BindError) -> None:
    assert run(ApiBinder(FakeBinder(error)).bind(BINDING)) == str(error)


@pytest.mark.parametrize("failure", [Failure.SERVER, Failure.UNREACHABLE])
def test_unknown_outcomes_raise(failure: Failure) -> None:
    error = bind_error(BindStage.BIND, failure)
    with pytest.raises(BindError) as caught:
        run(ApiBinder(FakeBinder(error)).bind(BINDING))
    assert caught.value is error


def test_a_bind_past_its_timeout_is_unknown() -> None:
    with pytest.raises(TimeoutError, match=r"bind ns/p to n3: no answer within 0\.01s"):
        run(ApiBinder(FakeBinder(delay_s=1), timeout_s=0.01).bind(BINDING))


def test_a_binding_without_uid_is_refused_unsent() -> None:
    binder = FakeBinder()
    text = run(ApiBinder(binder).bind(Binding("ns", "p", "", "n3", {})))
    assert text == "pod ns/p has no UID to bind it safely with"
    assert binder.calls == []


def test_unknown_outcome_keeps_the_assumption_and_definite_failure_releases_it() -> None:
    def scheduler_with(error: BindError) -> tuple[Scheduler, ExtenderState]:
        state = ExtenderState()
        state.upsert_node(node_json("n3", [GPU, GPU]))
        state.cluster.mark_synced()
        state.cluster.remember_pod(pod_json("p", 8138, namespace="ns", uid="uid-1"))
        return Scheduler(state, extender_policy("binpack"), ApiBinder(FakeBinder(error))), state

    args = ExtenderBindingArgs(pod_name="p", pod_namespace="ns", pod_uid="uid-1", node="n3")
    scheduler, state = scheduler_with(bind_error(BindStage.BIND, Failure.UNREACHABLE))
    result = run(scheduler.bind(args))
    assert "outcome unknown" in result.error
    assert state.reservations.is_assumed("ns/p")
    scheduler, state = scheduler_with(bind_error(BindStage.BIND, Failure.CONFLICT))
    result = run(scheduler.bind(args))
    assert "failed" in result.error
    assert state.reservations.allocation("ns/p") is None


# -- the Event sink --------------------------------------------------------------------------


@dataclass
class FakeRecorder:
    """``EventRecorder`` stand-in: keeps calls; raises ``error``; waits ``delay_s``."""

    error: Exception | None = None
    delay_s: float = 0.0
    calls: list[tuple[PodRef, str, str, EventType]] = field(default_factory=list)

    async def pod_event(
        self, pod: PodRef, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> str:
        self.calls.append((pod, reason, message, type))
        await asyncio.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        return f"{pod.name}.abcde"


def emitted(sink: ApiEventSink, *events: BindEvent) -> None:
    """``sink.emit`` each of ``events`` on one loop, then wait for the Events it started."""

    async def emit_all() -> None:
        for event in events:
            await sink.emit(event)
        await sink.drain()

    run(emit_all())


def test_events_say_assigned_or_failed() -> None:
    recorder = FakeRecorder()
    sink = ApiEventSink(recorder)
    emitted(
        sink,
        BindEvent("ns", "p", "uid-1", "n3", True, "bound to n3: GPU 0"),
        BindEvent("ns", "p", "uid-1", "n3", False, "does not fit"),
    )
    ref = PodRef("ns", "p", "uid-1")
    assert recorder.calls == [
        (ref, "GPUAssigned", "bound to n3: GPU 0", EventType.NORMAL),
        (ref, "FailedBinding", "does not fit", EventType.WARNING),
    ]
    assert (sink.emitted, sink.failed, sink.dropped) == (2, 0, 0)


def test_an_event_does_not_hold_up_the_bind() -> None:
    """``emit`` returns before the Event is created; ``drain`` waits for it."""
    recorder = FakeRecorder(delay_s=0.2)
    sink = ApiEventSink(recorder)

    async def emit_then_look() -> tuple[int, int]:
        await sink.emit(BindEvent("ns", "p", "uid-1", "n3", True, "bound"))
        before = sink.emitted
        await sink.drain()
        return before, sink.emitted

    assert run(emit_then_look()) == (0, 1)


# (case, qps, burst, [(seconds later, bind ok?)], GPUAssigned/FailedBinding recorded, dropped)
RATE_CASES = [
    ("a burst past --event-burst is dropped", 1.0, 2, [(0, True)] * 4, 2, 2),
    ("the bucket refills at --event-qps", 1.0, 2, [(0, True)] * 3 + [(1.0, True)], 3, 1),
    ("a quiet spell refills only up to the burst", 1.0, 2, [(100, True)] * 1 + [(0, True)] * 3,
     2, 2),
    ("warnings are never dropped", 1.0, 1, [(0, True)] + [(0, False)] * 3, 4, 0),
    ("--event-qps 0 drops nothing", 0.0, 1, [(0, True)] * 5, 5, 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("qps", "burst", "binds", "recorded", "dropped"),
    [case[1:] for case in RATE_CASES],
    ids=[case[0] for case in RATE_CASES],
)
def test_gpuassigned_events_are_rate_limited(
    *,
    qps: float,
    burst: int,
    binds: list[tuple[float, bool]],
    recorded: int,
    dropped: int,
    caplog: pytest.LogCaptureFixture,
) -> None:
    recorder = FakeRecorder()
    clock = ManualClock()
    sink = ApiEventSink(recorder, rate=EventRate(qps, burst, clock))

    async def bind_all() -> None:
        for later_s, ok in binds:
            clock.now_s += later_s
            await sink.emit(BindEvent("ns", "p", "uid-1", "n3", ok, "bound" if ok else "no"))
        await sink.drain()

    run(bind_all())
    assert (len(recorder.calls), sink.emitted, sink.dropped) == (recorded, recorded, dropped)
    if dropped:
        assert "GPUAssigned Event(s) not recorded, over --event-qps" in caplog.text


@pytest.mark.parametrize(("qps", "burst"), [(-1.0, 5), (1.0, 0)], ids=["negative qps", "no burst"])
def test_an_event_rate_out_of_range_is_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="event rate"):
        EventRate(qps, burst)


@pytest.mark.parametrize(
    "recorder",
    [
        FakeRecorder(error=ApiCallError("POST events ns/p", Failure.FORBIDDEN, "no")),
        FakeRecorder(delay_s=1),
    ],
    ids=["API error", "timeout"],
)
def test_event_failures_are_logged_not_raised(
    recorder: FakeRecorder, caplog: pytest.LogCaptureFixture
) -> None:
    sink = ApiEventSink(recorder, timeout_s=0.01)
    emitted(sink, BindEvent("ns", "p", "uid-1", "n3", True, "bound"))
    assert (sink.emitted, sink.failed) == (0, 1)
    assert "recording Event GPUAssigned on pod ns/p failed" in caplog.text


def test_an_unexpected_event_error_is_logged_and_drain_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug while recording (not an API error) must not stop the extender's shutdown."""
    sink = ApiEventSink(FakeRecorder(error=RuntimeError("bug")))
    emitted(sink, BindEvent("ns", "p", "uid-1", "n3", True, "bound"))
    assert "recording an Event failed unexpectedly" in caplog.text


def test_events_need_a_uid(caplog: pytest.LogCaptureFixture) -> None:
    recorder = FakeRecorder()
    emitted(ApiEventSink(recorder), BindEvent("ns", "p", "", "n3", False, "unknown pod"))
    assert recorder.calls == []
    assert "no Event for pod ns/p" in caplog.text


def test_a_skipped_pod_gets_a_warning_event_once() -> None:
    """A bound pod the ledger cannot record is said on it: the feeder hands each newly skipped
    pod to ``on_skip`` (the live extender's ``ApiEventSink.skipped``), which records a Warning
    naming why."""
    recorder = FakeRecorder()
    sink = ApiEventSink(recorder)
    seen: list[tuple[str, str]] = []

    def on_skip(skipped: SkippedPod, pod: Mapping[str, Any] | None) -> None:
        seen.append((skipped.pod, pod["metadata"]["uid"] if pod else ""))

        async def record() -> None:
            sink.skipped(skipped, pod["metadata"]["uid"] if pod else "")
            await sink.drain()

        run(record())

    feeder = StateFeeder(ExtenderState(), on_skip=on_skip)
    feeder.on_node(upsert("Node", "n1", node_json("n1", [GPU, GPU])))
    bad = bound_pod("a", "n1", 1, 8138, uid="uid-a")
    bad["metadata"]["annotations"][ALLOCATION] = "{oops"
    feeder.on_pod(upsert("Pod", "default/a", bad))
    feeder.on_pod(upsert("Pod", "default/a", bad, bad))  # the same again: no second Event
    assert seen == [("default/a", "uid-a")]
    ((ref, reason, message, kind),) = recorder.calls
    assert (ref, reason, kind) == (PodRef("default", "a", "uid-a"), "GPUAllocationSkipped",
                                   EventType.WARNING)  # fmt: skip
    assert message.startswith("gpushare: pod default/a on node n1: allocation cannot be read: ")
    assert message.endswith("counted as every GPU of the node blocked")
