"""The extender's GPU-aware preemption (``gpushare.extender.preemption``): the ``preempt`` verb,
the extender's own preemption of what kube-scheduler never sends, holds in filter and bind (and
filter's and prioritize's cached answers on nodes with holds), and the reconcile loop — with a
recording evictor, hold store and Event sink, on manual clocks.

The wire format is checked through the ASGI app (``POST /gpushare-scheduler/preempt``, Go
field names); the rest calls the ``Preemptor`` and ``Scheduler`` directly on one event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpushare.core.model import ContainerAllocation
from gpushare.core.policies import make_policy
from gpushare.core.preemption import Hold, best_preemption
from gpushare.extender.app import create_app
from gpushare.extender.holds import HIGHEST_PRIORITY, BudgetBook, HoldBook
from gpushare.extender.preemption import (
    EVENT_BLOCKED,
    EVENT_EXPIRED,
    EVENT_PREEMPTING,
    EVENT_VICTIM,
    PreemptionOptions,
    Preemptor,
)
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderPreemptionArgs,
    MetaPod,
    MetaVictims,
)
from gpushare.kube.codec import MemoryUnit, pod_key, pod_priority, pod_request, pod_uid
from gpushare.kube.codec.preemption import DisruptionBudget, holds_data, holds_of
from gpushare.testing.clock import ManualClock
from gpushare.testing.extender import (
    PodsOnServer,
    RecordingBinder,
    RecordingEvictor,
    RecordingHoldStore,
    RecordingNotes,
    bound_pod,
    node_json,
    pod_json,
)

LOW, HIGH = 100, 1000
NOW_S = 1_800_000_000.0
EARLY, LATE = "2026-11-27T01:00:00Z", "2026-11-27T02:00:00Z"
PREFIX = "/gpushare-scheduler"


@dataclass
class Rig:
    """One extender's state, preemptor and scheduler with recording adapters."""

    state: ExtenderState = field(default_factory=lambda: ExtenderState(handshake_timeout_s=0))
    evictor: RecordingEvictor = field(default_factory=RecordingEvictor)
    store: RecordingHoldStore = field(default_factory=RecordingHoldStore)
    notes: RecordingNotes = field(default_factory=RecordingNotes)
    wall: ManualClock = field(default_factory=lambda: ManualClock(NOW_S))
    clock: ManualClock = field(default_factory=ManualClock)
    budgets: BudgetBook = field(default_factory=BudgetBook)
    server: PodsOnServer = field(default_factory=PodsOnServer)
    leading: bool = True
    preemptor: Preemptor = field(init=False)
    scheduler: Scheduler = field(init=False)
    binder: RecordingBinder = field(default_factory=RecordingBinder)

    def __post_init__(self) -> None:
        self.preemptor = Preemptor(
            self.state,
            HoldBook(self.state.cluster.touch, clock=self.clock, wall_clock=self.wall),
            self.budgets,
            evictor=self.evictor,
            store=self.store,
            events=self.notes,
            reader=self.server,
            deciding=lambda: self.leading,
            options=PreemptionOptions(wait_s=2.0, hold_margin_s=30.0),
            wall_clock=self.wall,
            clock=self.clock,
        )
        self.scheduler = Scheduler(
            self.state, make_policy("binpack"), self.binder, preemptor=self.preemptor
        )

    def pending(self, pod: dict[str, Any]) -> dict[str, Any]:
        """``pod`` (unbound) on the API server, and so in the extender's cache."""
        self.server.pods[pod_key(pod)] = pod
        self.state.observe_pod(pod)
        return pod

    def gone(self, key: str) -> None:
        """Pod ``key`` deleted from the API server (and so from the cache)."""
        self.server.pods.pop(key, None)
        self.state.forget_pod(key)

    def node(self, name: str, gpus: int = 2, gib: int = 16) -> None:
        self.state.upsert_node(node_json(name, [gib] * gpus, unit=MemoryUnit.GIB))

    def filter(self, pod: dict[str, Any], *nodes: str) -> tuple[list[str], dict[str, str]]:
        result = self.scheduler.filter(ExtenderArgs(pod=pod, node_names=list(nodes)))
        return list(result.node_names or ()), dict(result.failed_nodes or {})


def low(rig: Rig, name: str, node: str, *where: Any, **kw: Any) -> dict[str, Any]:
    """A priority-100 pod on ``node``: ``where`` is (GPU, GiB) and optionally its start time."""
    gpu, gib, *started = where
    return bound_pod(
        rig.state, name, node, {gpu: gib}, priority=LOW, started=(started or [EARLY])[0], **kw
    )


def high(gib: int, name: str = "high", priority: int = HIGH, **kw: Any) -> dict[str, Any]:
    return pod_json(name, gib, priority=priority, **kw)


def uid(name: str) -> str:
    return pod_uid(pod_json(name))


def offer(*nodes: str, victims: tuple[str, ...] = ()) -> dict[str, MetaVictims | None]:
    return {n: MetaVictims([MetaPod(uid(v)) for v in victims]) for n in nodes}


@pytest.fixture
def rig() -> Rig:
    rig = Rig()
    rig.state.cluster.mark_synced()
    return rig


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


# --- the preempt verb ----------------------------------------------------------------------


def test_case_1_kube_schedulers_two_victims_on_two_gpus_become_two_on_one(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 8, EARLY)
    low(rig, "b", "n1", 1, 8, EARLY)
    low(rig, "c", "n1", 0, 8, LATE)
    low(rig, "d", "n1", 1, 8, LATE)
    pod = rig.pending(high(16))
    # kube-scheduler's dry run on the node total chose the two newest, one per GPU
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(pod, node_name_to_meta_victims=offer("n1", victims=("c", "d")))
        )
    )
    (victims,) = answer.node_name_to_meta_victims.values()
    chosen = {p.uid for p in victims.pods or ()}
    assert chosen in ({uid("a"), uid("c")}, {uid("b"), uid("d")})
    hold = rig.preemptor.holds.of("default/high")
    assert hold is not None
    assert hold.evictor == "kube-scheduler"
    assert rig.store.holds[hold.uid] == hold, "recorded before kube-scheduler evicts"
    assert rig.evictor.calls == [], "kube-scheduler evicts, not the extender"
    assert rig.notes.reasons("default/high") == [EVENT_PREEMPTING]
    assert {r for v in hold.victims for r in rig.notes.reasons(v)} == {EVENT_VICTIM}


def test_victims_kube_scheduler_never_evicted_are_evicted_after_the_handover(rig: Rig) -> None:
    """kube-scheduler lost the preempt answer (a connection reset as the answer went out): the
    hold stays and, once ``handover_s`` has passed with the victims still running, the leader
    evicts them itself."""
    rig.node("n1", gpus=1)
    low(rig, "a", "n1", 0, 8, EARLY)
    low(rig, "b", "n1", 0, 8, LATE)
    pod = rig.pending(high(16))
    offered = offer("n1", victims=("a", "b"))
    run(rig.preemptor.preempt(ExtenderPreemptionArgs(pod, node_name_to_meta_victims=offered)))
    hold = rig.preemptor.holds.of("default/high")
    assert hold is not None
    assert hold.evictor == "kube-scheduler"
    rig.wall.now_s += 9
    rig.clock.now_s += 9
    run(rig.preemptor.tick())
    assert rig.evictor.calls == [], "kube-scheduler may still evict"
    rig.wall.now_s += 2
    rig.clock.now_s += 2
    run(rig.preemptor.tick())
    assert sorted(rig.evictor.evicted) == ["default/a", "default/b"]
    run(rig.preemptor.tick())
    assert len(rig.evictor.evicted) == 2, "each victim once"


def test_a_candidate_without_victims_as_kubernetes_1_38_sends_it_is_answered(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    low(rig, "b", "n1", 1, 12, LATE)
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(rig.pending(high(8)), node_name_to_meta_victims={"n1": None})
        )
    )
    assert answer.node_name_to_meta_victims == {"n1": MetaVictims([MetaPod(uid("b"))], 0)}


def test_case_4_a_pod_that_can_never_fit_drops_every_candidate(rig: Rig) -> None:
    rig.node("n1")
    for i, gpu in enumerate((0, 0, 1, 1)):
        low(rig, f"p{i}", "n1", gpu, 8)
    offered = offer("n1", victims=("p1", "p2", "p3"))
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(rig.pending(high(20)), node_name_to_meta_victims=offered)
        )
    )
    assert answer.node_name_to_meta_victims == {}
    assert rig.preemptor.holds.of("default/high") is None
    assert rig.preemptor.metrics.preemptions.labels("dropped")._value.get() == 1


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(high(16, preemption_policy="Never"), id="preemptionPolicy Never"),
        pytest.param(pod_json("peer", 16, priority=LOW), id="equal priority"),
        pytest.param(pod_json("cpu"), id="no GPU"),
    ],
)
def test_pods_that_may_not_preempt_keep_nothing(rig: Rig, pod: dict[str, Any]) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 16)
    low(rig, "b", "n1", 1, 16)
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(
                rig.pending(pod), node_name_to_meta_victims=offer("n1", victims=("a",))
            )
        )
    )
    assert answer.node_name_to_meta_victims == {}
    assert rig.evictor.calls == []


def test_kube_schedulers_victims_without_gpus_are_kept(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 16)
    low(rig, "b", "n1", 1, 16, LATE)
    pod = rig.pending(high(16))
    offered: dict[str, MetaVictims | None] = {
        "n1": MetaVictims([MetaPod(uid("a")), MetaPod("cpu-only-uid")])
    }
    answer = run(
        rig.preemptor.preempt(ExtenderPreemptionArgs(pod, node_name_to_meta_victims=offered))
    )
    pods = answer.node_name_to_meta_victims["n1"].pods or []
    assert [p.uid for p in pods] == [uid("b"), "cpu-only-uid"]


def test_a_store_that_fails_keeps_no_hold_and_answers_no_node(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 16)
    low(rig, "b", "n1", 1, 16)
    rig.store.failure = RuntimeError("API server away")
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(
                rig.pending(high(16)), node_name_to_meta_victims=offer("n1", victims=("a",))
            )
        )
    )
    assert answer.node_name_to_meta_victims == {}
    assert rig.preemptor.holds.of("default/high") is None


# --- what kube-scheduler never sends: the extender preempts ---------------------------------


def test_case_2_the_extender_evicts_one_12_gib_pod_after_the_wait(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    low(rig, "b", "n1", 1, 12, LATE)
    pod = rig.pending(high(8))
    passed, failed = rig.filter(pod, "n1")
    assert (passed, list(failed)) == ([], ["n1"])

    async def scenario() -> None:
        await rig.preemptor.tick()
        assert rig.evictor.calls == [], "kube-scheduler may still call preempt"
        rig.clock.now_s += 2.5
        await rig.preemptor.tick()

    run(scenario())
    assert rig.evictor.calls == [("default/b", True), ("default/b", False)]
    hold = rig.store.holds[uid("high")]
    assert (hold.node, hold.victims, hold.evictor) == ("n1", ("default/b",), "gpushare")
    assert [c.gpu_indices for c in hold.containers] == [(1,)]
    assert rig.notes.reasons("default/high") == [EVENT_PREEMPTING]
    assert rig.notes.reasons("default/b") == [EVENT_VICTIM]


def test_a_preempt_call_within_the_wait_decides_instead(rig: Rig) -> None:
    rig.node("n1")
    rig.node("n2")
    low(rig, "a", "n1", 0, 12)  # n1: the filter's node, 12 / 12 of lows
    low(rig, "b", "n1", 1, 12)
    low(rig, "c", "n2", 0, 16)  # n2: full; kube-scheduler offers it
    low(rig, "d", "n2", 1, 16, LATE)
    pod = rig.pending(high(8))
    rig.filter(pod, "n1")
    offered = offer("n2", victims=("d",))
    answer = run(
        rig.preemptor.preempt(ExtenderPreemptionArgs(pod, node_name_to_meta_victims=offered))
    )
    assert list(answer.node_name_to_meta_victims) == ["n2"]
    rig.clock.now_s += 10
    run(rig.preemptor.tick())
    assert rig.evictor.calls == [], "the plan ended with the preempt call"


def test_a_budget_that_refuses_a_victim_blocks_every_eviction(rig: Rig) -> None:
    rig.node("n1", gpus=1)
    low(rig, "a", "n1", 0, 8, labels={"app": "x"})
    low(rig, "b", "n1", 0, 8, LATE, labels={"app": "x"})
    refusal = "Cannot evict pod as it would violate the pod's disruption budget."
    rig.evictor.refuse |= {"default/a": refusal, "default/b": refusal}
    pod = rig.pending(high(16))
    rig.filter(pod, "n1")
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    assert [dry for _, dry in rig.evictor.calls] == [True, True]
    assert rig.preemptor.holds.of("default/high") is None
    assert rig.store.holds == {}
    assert rig.notes.reasons("default/high") == [EVENT_BLOCKED]


def test_a_pod_disruption_budget_steers_the_choice(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "guarded", "n1", 0, 16, LATE, labels={"app": "db"})
    low(rig, "a", "n1", 1, 8)
    low(rig, "b", "n1", 1, 8)
    rig.budgets.add([DisruptionBudget("default/db", "default", {"app": "db"}, (), 0, frozenset())])
    offered = offer("n1", victims=("guarded",))
    answer = run(
        rig.preemptor.preempt(
            ExtenderPreemptionArgs(rig.pending(high(16)), node_name_to_meta_victims=offered)
        )
    )
    chosen = {p.uid for p in answer.node_name_to_meta_victims["n1"].pods or []}
    assert chosen == {uid("a"), uid("b")}


def test_a_follower_never_evicts(rig: Rig) -> None:
    rig.node("n1", gpus=1)
    low(rig, "a", "n1", 0, 16)
    pod = rig.pending(high(8))
    rig.filter(pod, "n1")
    rig.leading = False
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    assert rig.evictor.calls == []


# --- holds -----------------------------------------------------------------------------------


def held(rig: Rig) -> Hold:
    """Case 2 decided by the extender: a 8 GiB hold on n1 GPU 1, victim b still running."""
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    low(rig, "b", "n1", 1, 12, LATE)
    pod = rig.pending(high(8))
    rig.filter(pod, "n1")
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    hold = rig.preemptor.holds.of("default/high")
    assert hold is not None
    return hold


def test_the_held_gpu_refuses_lower_priority_pods_and_admits_higher(rig: Rig) -> None:
    hold = held(rig)
    rig.state.forget_pod("default/b")  # the victim is gone: GPU 1 has 16 free
    low_pod = pod_json("other", 10, priority=LOW)
    passed, failed = rig.filter(low_pod, "n1")
    assert passed == []
    assert "held for preemptors" in failed["n1"]
    assert "default/high (priority 1000)" in failed["n1"]
    passed, _ = rig.filter(pod_json("urgent", 10, priority=HIGH + 1), "n1")
    assert passed == ["n1"]
    passed, _ = rig.filter(pod_json("small", 8, priority=LOW), "n1")
    assert passed == ["n1"], "16 free, 8 held: 8 remain for anyone"
    assert hold.expires_s == NOW_S + 30 + 30  # the default grace period plus the margin


def test_the_preemptor_binds_onto_its_held_gpus_and_the_hold_ends(rig: Rig) -> None:
    hold = held(rig)
    rig.state.forget_pod("default/b")
    passed, _ = rig.filter(high(8), "n1")
    assert passed == ["n1"]

    async def bind() -> None:
        args = ExtenderBindingArgs("high", "default", uid("high"), "n1")
        assert (await rig.scheduler.bind(args)).error == ""
        await rig.preemptor.drain()

    run(bind())
    allocation = rig.state.reservations.allocation("default/high")
    assert allocation is not None
    assert allocation.containers == hold.containers
    assert rig.preemptor.holds.of("default/high") is None
    assert rig.store.holds == {}


@pytest.mark.parametrize(
    ("after_s", "passes"),
    [
        pytest.param(0, ["n1"], id="while-held-only-the-held-node-passes"),
        pytest.param(61, ["n1", "n2"], id="past-the-hold-every-node-that-fits"),
    ],
)
def test_a_preemptor_goes_where_its_victims_leave(
    rig: Rig, after_s: float, passes: list[str]
) -> None:
    """Room elsewhere must not take a preemptor whose victims are leaving for it: bound
    anywhere else, they would have been evicted in vain."""
    held(rig)
    rig.state.forget_pod("default/b")
    rig.node("n2")  # an empty node appears
    rig.wall.now_s += after_s
    passed, failed = rig.filter(high(8), "n1", "n2")
    assert passed == passes
    if passes == ["n1"]:
        assert "held for this pod on node n1" in failed["n2"]


def test_holds_end_when_they_expire_or_the_preemptor_goes(rig: Rig) -> None:
    held(rig)
    rig.wall.now_s += 61
    run(rig.preemptor.tick())
    assert rig.preemptor.holds.of("default/high") is None
    assert rig.notes.reasons("default/high")[-1] == EVENT_EXPIRED
    second = Rig()
    second.state.cluster.mark_synced()
    held(second)
    second.gone("default/high")
    run(second.preemptor.tick())
    assert second.preemptor.holds.of("default/high") is None


def test_a_new_leader_finishes_the_evictions_of_a_hold_and_decides_nothing_new(
    rig: Rig,
) -> None:
    """The old leader recorded a hold and died before evicting: the new one evicts exactly the
    victims the hold names, once."""
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    low(rig, "b", "n1", 1, 12, LATE)
    pod = rig.pending(high(8))
    recorded = Hold(
        "default/high", uid("high"), "n1", HIGH,
        rig.preemptor.plans(pod, pod_request(pod), ["n1"])[0].assignment,
        ("default/b",), (uid("b"),), NOW_S - 5, NOW_S + 55,
    )  # fmt: skip
    rig.preemptor.holds.replace({"metadata": {}, "data": holds_data([recorded])})
    rig.filter(pod, "n1")  # still waiting: no new plan
    rig.clock.now_s += 5
    run(rig.preemptor.tick())
    run(rig.preemptor.tick())
    assert rig.evictor.evicted == ["default/b"]


# --- the wire format -------------------------------------------------------------------------


def test_the_preempt_verb_speaks_go_field_names(rig: Rig) -> None:
    rig.node("n1", gpus=1)
    low(rig, "a", "n1", 0, 16)
    app = create_app(rig.state, preemptor=rig.preemptor, expire_interval_s=None)
    body = {
        "Pod": rig.pending(high(8)),
        "NodeNameToVictims": None,
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": uid("a")}], "NumPDBViolations": 0}},
    }
    with TestClient(app) as client:
        answer = client.post(f"{PREFIX}/preempt", content=json.dumps(body))
        garbage = client.post(f"{PREFIX}/preempt", content=b'{"Pod": 3}')
    assert answer.status_code == 200
    assert answer.json() == {
        "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": uid("a")}], "NumPDBViolations": 0}}
    }
    assert garbage.status_code == 400


def test_without_preemption_kube_schedulers_choice_stands(rig: Rig) -> None:
    app = create_app(rig.state, expire_interval_s=None)
    body = {
        "Pod": high(8),
        "NodeNameToMetaVictims": {
            "n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1},
            "n2": {"Pods": [], "NumPDBViolations": 0},
        },
    }
    with TestClient(app) as client:
        answer = client.post(f"{PREFIX}/preempt", content=json.dumps(body)).json()
    kept = {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}}
    assert answer == {"NodeNameToMetaVictims": kept}


def test_inspect_shows_the_hold_and_the_preemptor_waiting_for_its_victims(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    victim = low(rig, "b", "n1", 1, 12, LATE)
    pod = rig.pending(high(8))  # the watch lists pending GPU pods too
    rig.filter(pod, "n1")
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    rig.state.observe_pod({**victim, "metadata": {**victim["metadata"], "deletionTimestamp": LATE}})
    app = create_app(rig.state, preemptor=rig.preemptor, expire_interval_s=None)
    with TestClient(app) as client:
        report = client.get(f"{PREFIX}/inspect").json()["gpushare"]
    (hold,) = report["holds"]
    assert (hold["pod"], hold["node"], hold["evictor"]) == ("default/high", "n1", "gpushare")
    assert hold["victims"] == [{"pod": "default/b", "state": "terminating"}]
    (pending,) = report["pending"]
    assert pending["waiting"]["pod"] == "default/high"
    assert pending["reason"].startswith("waits for its victims: GPU 1 (8) on node n1")


# --- trust: nothing is decided on a request body's or a hold's word --------------------------

TOP = 2**31 - 1


def refusals(rig: Rig, what: str) -> float:
    return float(rig.preemptor.metrics.refusals.labels(what)._value.get())


def full_node(rig: Rig) -> None:
    """n1: two 16 GiB GPUs full of priority-100 pods a and b."""
    rig.node("n1")
    low(rig, "a", "n1", 0, 16, EARLY)
    low(rig, "b", "n1", 1, 16, LATE)


@pytest.mark.parametrize(
    ("on_server", "body", "counted"),
    [
        (None, high(16, name="phantom", priority=TOP), True),
        (pod_json("decoy", 16, priority=LOW), pod_json("decoy", 16, priority=TOP), False),
        (high(16), high(16, uid="another-incarnation"), True),
        (high(16, node="n2"), high(16), False),
        (high(16, deleting=True), high(16), False),
        (high(16, preemption_policy="Never"), high(16), False),
    ],
    ids=[
        "a pod the API server does not have",
        "a low-priority pod whose body claims the top priority",
        "a pod under another UID",
        "a pod already bound",
        "a pod being deleted",
        "a pod that may not preempt whose body says it may",
    ],
)
def test_a_preempt_body_only_names_the_pod_the_api_server_describes(
    rig: Rig, on_server: dict[str, Any] | None, body: dict[str, Any], counted: bool
) -> None:
    full_node(rig)
    if on_server is not None:
        rig.pending(on_server)
    offered = offer("n1", victims=("a",))
    answer = run(
        rig.preemptor.preempt(ExtenderPreemptionArgs(body, node_name_to_meta_victims=offered))
    )
    run(rig.preemptor.drain())
    rig.clock.now_s += 30
    rig.wall.now_s += 30
    run(rig.preemptor.tick())
    assert answer.node_name_to_meta_victims == {}
    assert rig.preemptor.holds.all() == []
    assert rig.store.holds == {}
    assert rig.evictor.calls == []
    assert refusals(rig, "request") == (1.0 if counted else 0.0)


def test_a_filter_body_for_a_pod_the_api_server_does_not_have_preempts_nothing(
    rig: Rig,
) -> None:
    full_node(rig)
    phantom = high(16, name="phantom", priority=TOP)
    assert rig.filter(phantom, "n1")[0] == []
    rig.clock.now_s += 3  # past the wait for kube-scheduler's preempt call
    run(rig.preemptor.tick())
    assert rig.evictor.calls == []
    assert rig.preemptor.holds.all() == []
    assert refusals(rig, "request") == 1.0


def test_a_filter_body_cannot_raise_a_real_pods_priority(rig: Rig) -> None:
    full_node(rig)
    decoy = rig.pending(pod_json("decoy", 16, priority=LOW))
    assert rig.filter({**decoy, "spec": {**decoy["spec"], "priority": TOP}}, "n1")[0] == []
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    assert rig.evictor.calls == []  # at priority 100 (the API server's) a and b are peers
    assert rig.preemptor.holds.all() == []


def forged(rig: Rig, preemptor: dict[str, Any], victim: str, **changes: Any) -> Hold:
    """A hold as someone with write access to the ConfigMap could write it: ``preemptor`` to
    get GPU 1 of n1 once ``victim`` (``namespace/name``) is evicted by the extender."""
    priority = pod_priority(preemptor)
    hold = Hold(
        pod_key(preemptor), pod_uid(preemptor), "n1", priority,
        (ContainerAllocation("main", (1,), 16),), (victim,), (uid(victim.split("/")[1]),),
        NOW_S - 1, NOW_S + 50,
    )  # fmt: skip
    return dataclasses.replace(hold, **changes)


@pytest.mark.parametrize(
    ("case", "why"),
    [
        ("victim of higher priority", "victim default/vip has priority 1000, not below"),
        ("priority the preemptor does not have", "it says priority 1000, the API server says"),
        ("victim on another node", "victim default/far is on node n2, not n1"),
        ("preemptor that may not preempt", "may not preempt (preemptionPolicy: Never)"),
        ("node the extender does not know", "node nowhere is unknown"),
    ],
)
def test_a_hold_is_checked_against_the_api_server_before_anyone_is_evicted(
    rig: Rig, case: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 8, EARLY)
    bound_pod(rig.state, "vip", "n1", {0: 8}, priority=HIGH, started=EARLY)
    low(rig, "b", "n1", 1, 16, LATE)
    rig.node("n2", gpus=1)
    low(rig, "far", "n2", 0, 16)
    decoy = rig.pending(pod_json("decoy", 16, priority=LOW))
    urgent = rig.pending(high(16, name="urgent"))
    never = rig.pending(high(16, name="never", preemption_policy="Never"))
    hold = {
        "victim of higher priority": forged(rig, decoy, "default/vip"),
        "priority the preemptor does not have": forged(rig, decoy, "default/b", priority=HIGH),
        "victim on another node": forged(rig, urgent, "default/far"),
        "preemptor that may not preempt": forged(rig, never, "default/b"),
        "node the extender does not know": forged(rig, urgent, "default/b", node="nowhere"),
    }[case]
    rig.preemptor.holds.replace({"metadata": {}, "data": holds_data([hold])})
    run(rig.preemptor.tick())
    run(rig.preemptor.drain())
    assert rig.evictor.calls == []
    assert rig.preemptor.holds.all() == []
    assert refusals(rig, "hold") == 1.0
    assert why in caplog.text


def test_the_preemptor_is_read_anew_before_its_victims_are_evicted(rig: Rig) -> None:
    """The cache still has the preemptor; the API server no longer does: nobody is evicted."""
    rig.node("n1")
    low(rig, "a", "n1", 0, 12, EARLY)
    low(rig, "b", "n1", 1, 12, LATE)
    pod = rig.pending(high(8))
    rig.filter(pod, "n1")
    del rig.server.pods["default/high"]  # deleted; the watch has not told the cache yet
    rig.clock.now_s += 3
    run(rig.preemptor.tick())
    assert rig.evictor.evicted == []
    assert "default/high" in rig.server.reads


@pytest.mark.parametrize(
    ("created_s", "expires_s", "priority", "capped_to"),
    [
        (NOW_S - 5, NOW_S + 55, HIGH, (NOW_S - 5, NOW_S + 55, HIGH)),
        (NOW_S - 5, NOW_S + 86_400, HIGH, (NOW_S - 5, NOW_S - 5 + 600, HIGH)),
        (NOW_S + 86_400, NOW_S + 86_460, HIGH, (NOW_S, NOW_S + 60, HIGH)),
        (NOW_S, NOW_S + 60, 2**31, (NOW_S, NOW_S + 60, HIGHEST_PRIORITY)),
    ],
    ids=[
        "within bounds",
        "expiring past the longest hold",
        "created in the future",
        "above any priority",
    ],
)
def test_holds_from_the_configmap_are_capped_as_they_are_read(
    created_s: float, expires_s: float, priority: int, capped_to: tuple[float, float, int]
) -> None:
    book = HoldBook(max_life_s=600, wall_clock=lambda: NOW_S)
    gpu = (ContainerAllocation("main", (0,), 8),)
    hold = Hold("default/p", "u", "n1", priority, gpu, (), (), created_s, expires_s)
    book.replace({"metadata": {}, "data": holds_data([hold])})
    (read,) = book.all()
    assert (read.created_s, read.expires_s, read.priority) == capped_to


def _hold_for(name: str, gib: int) -> Hold:
    gpu = (ContainerAllocation("main", (0,), gib),)
    return Hold(f"default/{name}", f"u-{name}", "n1", HIGH, gpu, (), (), NOW_S, NOW_S + 60)


@pytest.mark.parametrize(
    ("after", "read_again"),
    [
        pytest.param(["a", "b"], set(), id="unchanged-entries-are-not-read-again"),
        pytest.param(["a", "b", "c"], {"u-c"}, id="a-new-entry-is-read"),
        pytest.param(["a"], set(), id="a-dropped-entry-is-forgotten"),
    ],
)
def test_the_holds_configmap_is_read_entry_by_entry_as_it_changes(
    after: list[str], read_again: set[str]
) -> None:
    """A replica sees the ConfigMap after every write: only the entries a write changed are
    read again, and what it reads equals a reading from scratch."""
    known: dict[str, tuple[str, Hold]] = {}
    first, _ = holds_of(
        {"metadata": {}, "data": holds_data([_hold_for("a", 8), _hold_for("b", 4)])}, known
    )
    data = holds_data([_hold_for(n, 8 if n == "a" else 4) for n in after])
    before = {key: hold for key, (_, hold) in known.items()}
    holds, problems = holds_of({"metadata": {}, "data": data}, known)
    assert problems == []
    assert holds == holds_of({"metadata": {}, "data": data})[0]
    assert set(known) == {f"u-{n}" for n in after}
    fresh = {key for key, (_, hold) in known.items() if before.get(key) is not hold}
    assert fresh == read_again
    assert len(first) == 2


def _shard(name: str, holds: list[Hold]) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": holds_data(holds)}


def _older(hold: Hold) -> Hold:
    return dataclasses.replace(hold, created_s=hold.created_s - 5)


@pytest.mark.parametrize(
    ("shards", "gone", "holds", "sources"),
    [
        pytest.param(
            {"h": ["a"], "h-1": ["b"]}, [], {"a": 8, "b": 4}, {"a": "h", "b": "h-1"},
            id="every-shard-s-holds-count",
        ),
        pytest.param(
            {"h": ["a"], "h-1": ["b"]}, ["h-1"], {"a": 8}, {"a": "h"},
            id="a-deleted-shard-takes-only-its-own-holds",
        ),
        pytest.param(
            {"h": ["a-older"], "h-1": ["a"]}, [], {"a": 8}, {"a": "h-1"},
            id="a-preemptor-in-two-shards-counts-once-its-latest-hold",
        ),
        pytest.param(
            {"h": ["a"], "h-1": ["a-older"]}, [], {"a": 8}, {"a": "h"},
            id="whichever-shard-is-read-first",
        ),
    ],
)  # fmt: skip
def test_holds_are_read_from_every_shard(
    shards: dict[str, list[str]],
    gone: list[str],
    holds: dict[str, int],
    sources: dict[str, str],
) -> None:
    book = HoldBook(max_life_s=600, wall_clock=lambda: NOW_S)
    made = {"a": _hold_for("a", 8), "b": _hold_for("b", 4), "a-older": _older(_hold_for("a", 2))}
    for name, entries in shards.items():
        book.replace(_shard(name, [made[e] for e in entries]))
    for name in gone:
        book.replace(None, source=name)
    read = {h.pod.removeprefix("default/"): h.containers[0].gpu_share for h in book.all()}
    assert read == holds
    assert {key: book.source(f"default/{key}") for key in holds} == sources


def test_a_refused_entry_is_said_once_per_shard_and_forgotten_with_its_shard() -> None:
    book = HoldBook(max_life_s=600, wall_clock=lambda: NOW_S)
    book.replace({"metadata": {"name": "h"}, "data": {"u-x": "not a hold"}})
    book.replace({"metadata": {"name": "h-1"}, "data": {"u-y": "nor this"}})
    assert len(book.problems) == 2
    book.replace(None, source="h")
    (problem,) = book.problems
    assert "u-y" in problem


def test_a_hold_written_to_last_a_day_ends_at_the_longest_hold(rig: Rig) -> None:
    rig.node("n1")
    low(rig, "a", "n1", 0, 16, EARLY)
    decoy = rig.pending(pod_json("decoy", 16, priority=LOW))
    hold = forged(rig, decoy, "default/a", victims=(), victim_uids=(), expires_s=NOW_S + 86_400)
    rig.preemptor.holds.replace({"metadata": {}, "data": holds_data([hold])})
    run(rig.preemptor.tick())
    assert rig.preemptor.holds.of("default/decoy") is not None
    rig.wall.now_s += 600
    run(rig.preemptor.tick())
    assert rig.preemptor.holds.of("default/decoy") is None


# --- remembered floors ------------------------------------------------------------------------


def _terminating(rig: Rig) -> None:
    pod = rig.state.cluster.api_pod("default/b1")
    assert pod is not None
    rig.state.observe_pod({**pod, "metadata": {**pod["metadata"], "deletionTimestamp": LATE}})


def _deleted(rig: Rig) -> None:
    rig.gone("default/b1")


def _refilled(rig: Rig) -> None:
    rig.gone("default/a1")
    low(rig, "a3", "n1", 0, 8, EARLY)
    low(rig, "a4", "n1", 0, 8, EARLY)


@pytest.mark.parametrize(
    ("change", "best_node"),
    [
        pytest.param(lambda rig: None, "n1", id="nothing-changed-the-cheaper-node"),
        pytest.param(_terminating, "n2", id="a-resident-terminating-makes-its-node-wait"),
        pytest.param(_deleted, "n2", id="a-resident-gone-makes-room"),
        pytest.param(_refilled, "n2", id="a-node-refilled-costs-more-now"),
    ],
)
def test_remembered_floors_follow_every_change_a_preemptor_reads(
    rig: Rig, change: Any, best_node: str
) -> None:
    """A second preemptor of the same shape after a change chooses as a preemptor that
    remembers nothing would."""
    rig.node("n1")
    rig.node("n2")
    low(rig, "a1", "n1", 0, 16, EARLY)  # n1: one 16 GiB victim on GPU 0
    bound_pod(rig.state, "a2", "n1", {1: 16}, priority=HIGH)  # not a victim
    low(rig, "b1", "n2", 0, 8, LATE)  # n2: two 8 GiB victims on GPU 0 (costlier), newer
    low(rig, "b2", "n2", 0, 8, LATE)
    bound_pod(rig.state, "b3", "n2", {1: 16}, priority=HIGH)  # not a victim
    first = rig.pending(high(16, "h1"))
    request = pod_request(first)
    before = best_preemption(rig.preemptor.plans(first, request, ["n1", "n2"]))
    assert before is not None
    assert before.node == "n1"
    change(rig)
    second = rig.pending(high(16, "h2"))
    asked = pod_request(second)
    remembered = best_preemption(rig.preemptor.plans(second, asked, ["n1", "n2"]))
    fresh = Rig(state=rig.state, budgets=rig.budgets, server=rig.server, wall=rig.wall)
    anew = best_preemption(fresh.preemptor.plans(second, asked, ["n1", "n2"]))
    assert remembered is not None
    assert anew is not None
    assert (remembered.node, remembered.status, remembered.cost) == (
        anew.node, anew.status, anew.cost,
    )  # fmt: skip
    assert remembered.node == best_node


# --- filter and prioritize cached on nodes with holds ----------------------------------------

PREEMPTOR = "default/high"
HELD_UNTIL_S = NOW_S + 60


def _hold_on_n1(rig: Rig) -> None:
    """12 GiB of n1's GPU 1 held for ``default/high`` (priority 1000) until ``HELD_UNTIL_S``."""
    gpu = (ContainerAllocation("main", (1,), 12),)
    rig.preemptor.holds.put(
        Hold(PREEMPTOR, uid("high"), "n1", HIGH, gpu, (), (), NOW_S, HELD_UNTIL_S)
    )


def _hold_dropped(rig: Rig) -> None:
    rig.preemptor.holds.drop(PREEMPTOR)


def _expired(rig: Rig) -> None:
    """The wall clock at the hold's expiry; nothing touches n1 (the reconciler has not run)."""
    rig.wall.now_s = HELD_UNTIL_S


def _unchanged(rig: Rig) -> None:
    pass


def _answers(scheduler: Scheduler, pod: dict[str, Any]) -> tuple[Any, ...]:
    """``pod``'s filter (``NodeNames``) and prioritize answers over n1, n2, n3."""
    names = ["n1", "n2", "n3"]
    found = scheduler.filter(ExtenderArgs(pod=pod, node_names=names))
    scores = scheduler.prioritize(ExtenderArgs(pod=pod, node_names=names))
    return (
        found.node_names,
        found.failed_nodes,
        found.failed_and_unresolvable_nodes,
        found.error,
        scores,
    )


def _asking(name: str, priority: int) -> dict[str, Any]:
    return pod_json(name, 12, priority=priority)


Step = tuple[Any, dict[str, Any], list[str]]


@pytest.mark.parametrize(
    "steps",
    [
        pytest.param(
            [(_unchanged, _asking("above", HIGH + 1), ["n1", "n3"]),
             (_unchanged, _asking("below", LOW), ["n3"])],
            id="a-pod-below-the-holds-priority-after-one-above-is-refused-the-held-gpu",
        ),
        pytest.param(
            [(_unchanged, _asking("above", HIGH + 1), ["n1", "n3"]),
             (_unchanged, _asking("equal", HIGH), ["n3"])],
            id="a-pod-of-the-holds-priority-after-one-above-is-refused-the-held-gpu",
        ),
        pytest.param(
            [(_unchanged, _asking("below", LOW), ["n3"]),
             (_unchanged, _asking("above", HIGH + 1), ["n1", "n3"])],
            id="a-pod-above-the-holds-priority-after-one-below-takes-the-held-gpu",
        ),
        pytest.param(
            [(_unchanged, _asking("first", LOW), ["n3"]),
             (_unchanged, _asking("second", LOW), ["n3"])],
            id="two-pods-below-the-holds-priority-are-both-refused-the-held-gpu",
        ),
        pytest.param(
            [(_unchanged, _asking("before", LOW), ["n3"]),
             (_expired, _asking("after", LOW), ["n1", "n3"])],
            id="the-held-gpu-is-free-at-the-holds-expiry-without-any-touch",
        ),
        pytest.param(
            [(_unchanged, _asking("held", LOW), ["n3"]),
             (_hold_dropped, _asking("dropped", LOW), ["n1", "n3"]),
             (_hold_on_n1, _asking("again", LOW), ["n3"]),
             (_hold_dropped, _asking("dropped-again", LOW), ["n1", "n3"])],
            id="a-hold-dropped-then-put-again-then-dropped",
        ),
        pytest.param(
            [(_hold_dropped, _asking("free", LOW), ["n1", "n3"]),
             (_hold_on_n1, _asking("held", LOW), ["n3"]),
             (_expired, _asking("expired", LOW), ["n1", "n3"])],
            id="a-hold-put-on-a-node-without-holds-ends-at-its-expiry-without-any-touch",
        ),
        pytest.param(
            [(_unchanged, _asking("twin", HIGH), ["n3"]),
             (_unchanged, _asking("high", HIGH), ["n1"]),
             (_unchanged, _asking("twin", HIGH), ["n3"])],
            id="the-preemptor-sees-its-held-gpu-as-its-own-and-its-twin-does-not",
        ),
    ],
)  # fmt: skip
def test_cached_answers_on_nodes_with_holds_equal_a_fresh_schedulers(
    rig: Rig, steps: list[Step]
) -> None:
    """n1 has 8 GiB free on GPU 0 and 16 on GPU 1, 12 of them held for a priority-1000
    preemptor; n2 has 8 free on each GPU; n3 is empty. After each change, a 12 GiB pod gets from
    the long-lived scheduler (its caches filled by the pods before) the filter and prioritize
    answers that a scheduler built just now gives, and passes the nodes the holds leave it."""
    for name in ("n1", "n2", "n3"):
        rig.node(name)
    bound_pod(rig.state, "a1", "n1", {0: 8}, priority=LOW)
    bound_pod(rig.state, "b1", "n2", {0: 8}, priority=LOW)
    bound_pod(rig.state, "b2", "n2", {1: 8}, priority=LOW)
    _hold_on_n1(rig)
    for change, pod, passes in steps:
        change(rig)
        cached = _answers(rig.scheduler, pod)
        fresh = Scheduler(rig.state, make_policy("binpack"), rig.binder, preemptor=rig.preemptor)
        assert cached == _answers(fresh, pod)
        assert cached[0] == passes
        if "n1" not in passes and pod_key(pod) != PREEMPTOR:
            assert f"{PREEMPTOR} (priority {HIGH})" in cached[1]["n1"]


# --- which hold changes free GPUs (the requeue) ---------------------------------------------


def _book_with_calls() -> tuple[HoldBook, list[str], list[str]]:
    touched: list[str] = []
    freed: list[str] = []
    book = HoldBook(touched.append, freed=freed.append, wall_clock=lambda: NOW_S)
    return book, touched, freed


def _moved(hold: Hold, node: str) -> Hold:
    return dataclasses.replace(hold, node=node)


@pytest.mark.parametrize(
    ("change", "touched", "freed"),
    [
        pytest.param("put", ["n1"], [], id="a-hold-that-begins-only-takes-gpus"),
        pytest.param("drop", ["n1"], ["n1"], id="a-hold-that-ends-frees-its-gpus"),
        pytest.param("drop-bound", ["n1"], [], id="a-hold-whose-preemptor-bound-there-frees-none"),
        pytest.param("move", ["n1", "n2"], ["n1"], id="a-hold-that-moves-frees-its-old-node"),
        pytest.param("configmap-drop", ["n1"], ["n1"], id="a-hold-another-replica-ended-frees"),
    ],
)
def test_only_a_hold_that_ends_or_changes_frees_gpus(
    change: str, touched: list[str], freed: list[str]
) -> None:
    book, seen_touched, seen_freed = _book_with_calls()
    hold = _hold_for("a", 8)
    if change != "put":
        book.replace(_shard("h", [hold]))
        seen_touched.clear()
    if change == "put":
        book.put(hold)
    elif change == "drop":
        book.drop(hold.pod)
    elif change == "drop-bound":
        book.drop(hold.pod, frees=False)
    elif change == "move":
        book.put(_moved(hold, "n2"))
    else:
        book.replace(_shard("h", []))
    assert (seen_touched, seen_freed) == (touched, freed)


@pytest.mark.parametrize(
    ("bound_on", "freed"),
    [
        pytest.param("n1", [], id="bound-on-the-hold-s-node-it-took-the-held-gpus"),
        pytest.param("n2", ["n1"], id="bound-elsewhere-the-held-gpus-are-free"),
    ],
)
def test_a_preemptor_s_bind_frees_its_hold_s_gpus_only_when_it_bound_elsewhere(
    rig: Rig, bound_on: str, freed: list[str]
) -> None:
    seen: list[str] = []
    book = HoldBook(freed=seen.append, wall_clock=rig.wall)
    rig.preemptor.holds = book  # the rig's book, with the requeuer's callback
    hold = _hold_for("a", 8)
    book.put(hold)

    async def bind() -> None:  # the store's write is spawned on the loop
        rig.preemptor.bound(hold.pod, bound_on)
        await asyncio.sleep(0.01)

    run(bind())
    assert book.of(hold.pod) is None
    assert seen == freed
