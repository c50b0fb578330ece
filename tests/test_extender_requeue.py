"""Requeueing the pods the extender refused everywhere (``gpushare.extender.requeue``).

kube-scheduler parks a pod the extender refused until a cluster event some plugin registered
for; an inventory annotation, a preemption hold or a release its own informer saw first is not
one. The requeuer remembers refusals and, after such a change, touches each pod refused before
it once (the real patch is proved in ``tests/cluster/test_extender_requeue.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from gpushare.extender.app import create_app
from gpushare.extender.feed import StateFeeder
from gpushare.extender.requeue import RequeueOptions, Requeuer
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import ExtenderArgs
from gpushare.kube.codec import Json, pod_key
from gpushare.kube.refs import PodRef
from gpushare.kube.requeue import RequeueOutcome
from gpushare.kube.watch import Action, Change
from gpushare.testing.controlplane import async_wait_until
from gpushare.testing.extender import bound_pod, node_json, pod_json


@dataclass
class Clock:
    now_s: float = 100.0

    def __call__(self) -> float:
        return self.now_s


@dataclass
class Rig:
    """A requeuer over a recording ``requeue`` and a dict of pods by key."""

    clock: Clock = field(default_factory=Clock)
    pods: dict[str, Json] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    answers: dict[str, RequeueOutcome] = field(default_factory=dict)
    deciding: bool = True
    holding: set[str] = field(default_factory=set)
    """Pods that hold GPUs for their preemption (waiting for their victims)."""
    options: RequeueOptions = field(default_factory=RequeueOptions)
    requeuer: Requeuer = field(init=False)

    def __post_init__(self) -> None:
        async def requeue(pod: PodRef) -> tuple[RequeueOutcome, str]:
            self.calls.append(pod.key)
            outcome = self.answers.get(pod.key, RequeueOutcome.REQUEUED)
            return outcome, "" if outcome is RequeueOutcome.REQUEUED else "HTTP 500: boom"

        self.requeuer = Requeuer(
            requeue,
            self.pods.get,
            deciding=lambda: self.deciding,
            waiting=self.holding.__contains__,
            options=self.options,
            clock=self.clock,
        )

    def refuse(self, *names: str) -> None:
        for name in names:
            pod = self.pods.setdefault(f"default/{name}", pod_json(name, 4))
            self.requeuer.refused(pod)

    def round(self) -> float | None:
        self.calls.clear()
        return asyncio.run(self.requeuer.requeue_due())


Step = Callable[[Rig], object]


@dataclass(frozen=True)
class Case:
    name: str
    steps: tuple[Step, ...]
    requeued: list[str]
    next_s: float | None = None
    due_after: list[str] = field(default_factory=list)
    options: RequeueOptions = field(default_factory=RequeueOptions)


def refuse(*names: str) -> Step:
    return lambda rig: rig.refuse(*names)


def change(rig: Rig) -> None:
    rig.requeuer.changed("n1")


def release(rig: Rig) -> None:
    rig.requeuer.released("n1")


def wait(seconds: float) -> Step:
    def step(rig: Rig) -> None:
        rig.clock.now_s += seconds

    return step


def first_round(rig: Rig) -> None:
    rig.round()


def bind(name: str) -> Step:
    def step(rig: Rig) -> None:
        rig.pods[f"default/{name}"] = pod_json(name, 4, node="n1")

    return step


def delete(name: str) -> Step:
    return lambda rig: rig.pods.pop(f"default/{name}")


def recreate(name: str) -> Step:
    def step(rig: Rig) -> None:
        rig.pods[f"default/{name}"] = pod_json(name, 4, uid="another-incarnation")

    return step


def answer(name: str, outcome: RequeueOutcome) -> Step:
    def step(rig: Rig) -> None:
        rig.answers[f"default/{name}"] = outcome

    return step


def follower(rig: Rig) -> None:
    rig.deciding = False


def holds(name: str) -> Step:
    return lambda rig: rig.holding.add(f"default/{name}")


def hold_ends(name: str) -> Step:
    return lambda rig: rig.holding.discard(f"default/{name}")


CASES = [
    Case("nothing changed: nothing is requeued", (refuse("a", "b"),), []),
    Case(
        "a node change requeues every pod refused before it, oldest refusal first",
        (refuse("b", "a"), change, refuse("c")),
        ["default/b", "default/a"],
        due_after=[],
    ),
    Case(
        "a pod refused again after the change waits for the next one",
        (refuse("a"), change, refuse("a")),
        [],
    ),
    Case(
        "a release requeues only pods refused within the race window before it",
        (refuse("old"), wait(6), refuse("recent"), wait(1), release),
        ["default/recent"],
    ),
    Case(
        "bound, deleted and recreated pods are dropped without a call",
        (refuse("a", "b", "c", "d"), bind("a"), delete("b"), recreate("c"), change),
        ["default/d"],
    ),
    Case(
        "a pod requeued moments ago waits for its interval; the round says how long",
        (refuse("a"), change, first_round, refuse("a"), wait(3), change),
        [],
        next_s=7.0,
        due_after=["default/a"],
    ),
    Case(
        "after its interval the pod is requeued again",
        (refuse("a"), change, first_round, refuse("a"), wait(10), change),
        ["default/a"],
    ),
    Case(
        "a round requeues at most a batch; the next round comes at once",
        (refuse("a", "b", "c"), change),
        ["default/a", "default/b"],
        next_s=0.0,
        due_after=["default/c"],
        options=RequeueOptions(batch=2),
    ),
    Case(
        "past the limit the oldest refusal is forgotten",
        (refuse("a", "b", "c"), change),
        ["default/b", "default/c"],
        options=RequeueOptions(limit=2),
    ),
    Case(
        "a pod gone at the API server is dropped",
        (refuse("a"), answer("a", RequeueOutcome.GONE), change),
        ["default/a"],
        due_after=[],
    ),
    Case(
        "a failed call pauses the loop for the first backoff and stays due",
        (refuse("a", "b"), answer("a", RequeueOutcome.FAILED), change),
        ["default/a"],
        next_s=1.0,
        due_after=["default/a", "default/b"],
    ),
    Case(
        "a preemptor waiting for its victims is passed over: their going moves it",
        (refuse("a", "b"), holds("a"), change),
        ["default/b"],
        due_after=[],
    ),
    Case(
        "once its hold ends it is requeued at the next change again",
        (refuse("a"), holds("a"), change, first_round, hold_ends("a"), change),
        ["default/a"],
    ),
    Case(
        "a follower requeues nothing and forgets its refusals",
        (refuse("a"), change, follower),
        [],
        due_after=[],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_requeuer(case: Case) -> None:
    rig = Rig(options=case.options)
    for step in case.steps:
        step(rig)
    assert rig.round() == case.next_s
    assert rig.calls == case.requeued
    assert rig.requeuer.due() == case.due_after


def test_failures_back_off_doubling_are_logged_once_a_minute_and_reset_by_a_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Under RBAC that refuses the patch every requeue fails the same way: one call per pause,
    the pause doubling up to its maximum, one warning a minute; the first success resets it."""
    rig = Rig(options=RequeueOptions(failure_backoff_s=1.0, max_failure_backoff_s=8.0))
    names = [f"p{i}" for i in range(20)]
    rig.refuse(*names)
    for name in names:
        rig.answers[f"default/{name}"] = RequeueOutcome.FAILED
    rig.requeuer.changed("n1")
    pauses, calls = [], 0
    with caplog.at_level(logging.WARNING, logger="gpushare.extender.requeue"):
        for _ in range(6):
            pause = rig.round()
            calls += len(rig.calls)
            assert pause is not None
            assert rig.round() == pytest.approx(pause)  # paused: nothing is tried meanwhile
            assert rig.calls == []
            pauses.append(pause)
            rig.clock.now_s += pause
    assert pauses == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert calls == 6  # one failing call per pause, not one per refused pod
    assert len(caplog.records) == 1  # 31 s of failures: one warning
    assert "HTTP 500: boom" in caplog.text
    rig.answers.clear()
    rig.clock.now_s += 60
    assert rig.round() is None
    assert len(rig.calls) == 20  # the whole backlog goes through
    assert rig.requeuer.requeues.labels("failed")._value.get() == 6
    rig.answers["default/p0"] = RequeueOutcome.FAILED
    rig.refuse("p0")
    rig.requeuer.changed("n1")
    rig.clock.now_s += 60
    assert rig.round() == 1.0  # reset by the successes: the first pause again


def test_the_loop_requeues_after_a_change_and_settles() -> None:
    rig = Rig(options=RequeueOptions(settle_s=0.01))
    rig.refuse("a")

    async def scenario() -> list[str]:
        task = asyncio.create_task(rig.requeuer.run())
        try:
            rig.requeuer.changed("n1")
            await async_wait_until("a requeue after the change", lambda: bool(rig.calls), 2.0)
            return list(rig.calls)
        finally:
            task.cancel()

    assert asyncio.run(scenario()) == ["default/a"]


def test_options_refuse_nonsense() -> None:
    with pytest.raises(ValueError, match="intervals must be >= 0"):
        RequeueOptions(race_window_s=-1)
    with pytest.raises(ValueError, match="batch and limit must be >= 1"):
        RequeueOptions(batch=0)


# -- the hooks: the filter, the feed --------------------------------------------------------


def _filter(state: ExtenderState, requeuer: Requeuer, pod: Json, nodes: list[str]) -> None:
    app = create_app(state, expire_interval_s=None, requeuer=requeuer)
    app.state.scheduler.filter(ExtenderArgs(pod=dict(pod), node_names=nodes))


REFUSED_LINE = "filter: pod default/p: refused on every node (no backoff retry): "
FILTER_CASES = [
    ("a GPU pod that fits nowhere is remembered", 24, ["n1"], ["default/p"],
     REFUSED_LINE + "n1: gpushare: request is larger than any GPU; container main"),
    ("a GPU pod that fits somewhere is not", 4, ["n1"], [], ""),
    ("a pod asking no GPU is not", None, ["n1"], [], ""),
    ("a GPU pod on unknown nodes only is remembered", 4, ["nowhere"], ["default/p"],
     REFUSED_LINE + "nowhere: gpushare: node unknown to the extender"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("gpu_mem", "nodes", "remembered", "debug_line"),
    [c[1:] for c in FILTER_CASES],
    ids=[c[0] for c in FILTER_CASES],
)
def test_the_filter_reports_pods_it_refused_everywhere(
    gpu_mem: int | None,
    nodes: list[str],
    remembered: list[str],
    debug_line: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Remembered for a requeue, and one debug line with the reasons (a pod parked by
    kube-scheduler must say why in the extender's log)."""
    state = ExtenderState()
    state.upsert_node(node_json("n1", [16, 16]))
    state.cluster.mark_synced()
    rig = Rig()
    with caplog.at_level(logging.DEBUG, logger="gpushare.extender.scheduler"):
        _filter(state, rig.requeuer, pod_json("p", gpu_mem), nodes)
    rig.requeuer.changed("n1")
    assert rig.requeuer.due() == remembered
    lines = [r.getMessage() for r in caplog.records if r.name == "gpushare.extender.scheduler"]
    if debug_line:
        assert len(lines) == 1, lines
        assert lines[0].startswith(debug_line), lines
    else:
        assert lines == []


def test_the_feed_reports_gpu_view_changes_and_releases_not_heartbeats() -> None:
    state = ExtenderState()
    changed: list[str] = []
    released: list[str] = []
    feeder = StateFeeder(state, on_node_change=changed.append, on_release=released.append)
    node = node_json("n1", [16, 16])
    feeder.on_node(Change("Node", Action.UPSERT, "n1", node))
    heartbeat = {**node, "status": {**node["status"], "conditions": [{"type": "Ready"}]}}
    feeder.on_node(Change("Node", Action.UPSERT, "n1", heartbeat))
    feeder.on_node(Change("Node", Action.UPSERT, "n1", node_json("n1", [16, 12])))
    assert changed == ["n1", "n1"]  # added, then GPU 1 shrank; the heartbeat is no change

    pod = bound_pod(state, "a", "n1", {0: 4})
    finished = {**pod, "status": {"phase": "Succeeded"}}
    feeder.on_pod(Change("Pod", Action.UPSERT, pod_key(pod), finished))
    other = bound_pod(state, "b", "n1", {1: 4})
    feeder.on_pod(Change("Pod", Action.DELETE, pod_key(other), other))
    assert released == ["n1", "n1"]
    assert state.reservations.allocation("default/a") is None
