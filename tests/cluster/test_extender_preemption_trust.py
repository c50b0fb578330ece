"""No eviction on anyone's word: the attacks of an adversarial probe replayed on the real
control plane (kube-apiserver v1.37.1), against the live extender running with the chart's
RBAC (``gpushare.testing.rbac``) and a kube-scheduler wired to it as the chart wires it.

The probe's findings, each of which evicted a pod before: a ``filter`` body for a pod that does
not exist with the top priority; a ``preempt`` body that raises a real pod's priority; a hold
merged into the holds ConfigMap that names a higher-priority pod as a victim, or a priority its
preemptor does not have; a hold written to outlast ``--preemption-hold-max``. Here each is sent
to the extender, the extender's loop is seen to have judged it (its metrics), and every pod is
still running, nothing is held for it, and what was forged is gone from the ConfigMap.

Beside them: the extender asks the API server who else may write the holds
(``SubjectAccessReview``) and says so in ``gpushare_extender_holds_foreign_writers`` when an
operator binds ConfigMap write in that namespace to all its ServiceAccounts; and a real
preemptor sent through kube-scheduler still preempts (the checks do not stop the honest path).
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx2 as httpx
import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import ConfigMap, Pod
from lightkube.resources.rbac_authorization_v1 import Role, RoleBinding
from lightkube.types import PatchType

from gpushare.core.model import ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.extender.live import LiveOptions
from gpushare.extender.preemption import PreemptionOptions
from gpushare.kube.codec.preemption import hold_json
from gpushare.kube.holds import HoldsRef
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.live_extender import ExtenderThread, extender_with_scheduler
from gpushare.testing.metrics import sample_sum
from gpushare.testing.preemption import (
    PRIORITIES,
    Case,
    Seed,
    create_hold_shards,
    preemptor,
    read_hold_shards,
)
from gpushare.testing.rbac import EXTENDER_RULES

pytestmark = pytest.mark.cluster

NAMESPACE = "preemption-trust"
SCHEDULER = "gpushare-trust"
NODE = "trust-n1"
HOLDS = (NAMESPACE, "trust-holds")
HOLDS_REF = HoldsRef(*HOLDS, 4)  # a forged hold goes into the first: most UIDs pick another
HOLD_MAX_S = 5.0
TOP = 2**31 - 1


@dataclass
class Rig:
    kube: Client
    case: Case
    extender: ExtenderThread

    def metric(self, name: str, **labels: str) -> float:
        return sample_sum(self.extender.url + "/metrics", name, labels)

    def post(self, verb: str, body: dict[str, Any]) -> dict[str, Any]:
        response = httpx.post(f"{self.extender.url_prefix}/{verb}", json=body, timeout=10)
        assert response.status_code == 200, response.text
        answer: dict[str, Any] = response.json()
        return answer

    def holds(self) -> dict[str, str]:
        return read_hold_shards(self.kube, HOLDS_REF)

    def pod_json(self, name: str) -> dict[str, Any]:
        """Pod ``name`` of the case as the API server has it (what kube-scheduler sends)."""
        pod = self.kube.get(Pod, name, namespace=NAMESPACE)
        obj: dict[str, Any] = pod.to_dict()
        return obj

    def uid(self, name: str) -> str:
        return str(self.pod_json(name)["metadata"]["uid"])

    def pending(self, name: str, priority: str, gib: int = 16) -> dict[str, Any]:
        """A pod of ``priority`` that no scheduler serves: pending for good, real."""
        pod = preemptor(name, gib, priority=priority)
        assert pod.spec is not None
        assert pod.metadata is not None
        pod.metadata.namespace = NAMESPACE
        pod.spec.schedulerName = "nobody"
        self.kube.create(pod)
        return self.pod_json(name)

    def forge_hold(self, hold: Hold) -> None:
        """Merge ``hold`` into the first holds ConfigMap as anyone with write on it could
        (whatever shard its UID picks: every shard is read)."""
        body = {"data": {hold.uid: hold_json(hold)}}
        self.kube.patch(ConfigMap, HOLDS[1], body, namespace=HOLDS[0], patch_type=PatchType.MERGE)

    def all_running(self) -> None:
        """No pod of the case is being deleted: nobody was evicted."""
        assert self.case.terminating() == set()


@pytest.fixture(scope="module")
def rig(control_plane: ControlPlane) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        case = stack.enter_context(Case(kube, NAMESPACE, {NODE: [16, 16]}, SCHEDULER))
        # the holds ConfigMaps, as the chart creates them
        create_hold_shards(kube, HOLDS_REF)
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-trust", "kube-system", EXTENDER_RULES
        )
        options = LiveOptions(
            policy="binpack",
            backoff=Backoff(initial_s=0.05, max_s=0.5),
            holds_configmap=HOLDS,
            hold_shards=HOLDS_REF.shards,
            preemption=PreemptionOptions(wait_s=0.5, hold_max_s=HOLD_MAX_S, handover_s=1.0),
            hold_writers_interval_s=0.5,
        )
        extender = stack.enter_context(
            extender_with_scheduler(control_plane, kubeconfig, options, SCHEDULER)
        )
        # GPU 0 and GPU 1 full: a priority-1000 pod and a priority-100 pod.
        case.seed(
            Seed("vip", NODE, {0: 16}, priority="gpushare-high"),
            Seed("low", NODE, {1: 16}, priority="gpushare-low"),
        )
        yield Rig(kube, case, extender)


def victims_offered(rig: Rig, *names: str) -> dict[str, Any]:
    return {NODE: {"Pods": [{"UID": rig.uid(n)} for n in names], "NumPDBViolations": 0}}


def test_a_filter_for_a_pod_that_does_not_exist_evicts_nobody(rig: Rig) -> None:
    phantom: dict[str, Any] = preemptor("phantom", 16).to_dict()  # never created
    phantom["metadata"].update(namespace=NAMESPACE, uid=str(uuid.uuid4()))
    phantom["spec"]["priority"] = TOP
    before = rig.metric("gpushare_extender_preemption_refusals_total", what="request")
    answer = rig.post("filter", {"Pod": phantom, "NodeNames": [NODE]})
    assert answer["NodeNames"] == []  # no room: the extender's own preemption would start
    wait_for(
        "the extender's loop refuses to preempt for the phantom",
        lambda: (
            rig.metric("gpushare_extender_preemption_refusals_total", what="request") > before
            or None
        ),
    )
    rig.all_running()
    assert rig.holds() == {}


def test_a_preempt_body_cannot_raise_a_real_pods_priority(rig: Rig) -> None:
    decoy = rig.pending("decoy", "gpushare-low")
    assert decoy["spec"]["priority"] == PRIORITIES["gpushare-low"]
    forged = {**decoy, "spec": {**decoy["spec"], "priority": TOP}}
    before = rig.metric("gpushare_extender_preemptions_total", outcome="dropped")
    answer = rig.post(
        "preempt", {"Pod": forged, "NodeNameToMetaVictims": victims_offered(rig, "vip", "low")}
    )
    assert answer.get("NodeNameToMetaVictims") in ({}, None)  # at priority 100 nothing helps
    assert rig.metric("gpushare_extender_preemptions_total", outcome="dropped") == before + 1
    time.sleep(1.5)  # past the handover after which the extender would evict by itself
    rig.all_running()
    assert rig.holds() == {}


def forged_hold(rig: Rig, preemptor_name: str, victim: str, priority: int) -> Hold:
    pod = rig.pod_json(preemptor_name)
    now = time.time()
    return Hold(
        f"{NAMESPACE}/{preemptor_name}", pod["metadata"]["uid"], NODE, priority,
        (ContainerAllocation("main", (0,), 16),), (f"{NAMESPACE}/{victim}",), (rig.uid(victim),),
        now, now + HOLD_MAX_S, "gpushare",
    )  # fmt: skip


@dataclass(frozen=True)
class Forged:
    """A hold forged for pod ``preemptor_name`` (of PriorityClass ``preemptor_class``) naming
    ``victim`` and claiming ``claimed``; ``why``: the extender's words refusing it."""

    preemptor_name: str
    preemptor_class: str
    victim: str
    claimed: int
    why: str


FORGED = [
    Forged("decoy-a", "gpushare-low", "vip", 100, "victim preemption-trust/vip has priority 1000"),
    Forged("decoy-b", "gpushare-low", "low", 1000, "it says priority 1000, the API server says"),
]


@pytest.mark.parametrize(
    "forged",
    FORGED,
    ids=["a victim of higher priority", "a priority its preemptor does not have"],
)
def test_a_forged_hold_is_dropped_and_evicts_nobody(
    rig: Rig, forged: Forged, caplog: pytest.LogCaptureFixture
) -> None:
    rig.pending(forged.preemptor_name, forged.preemptor_class)
    before = rig.metric("gpushare_extender_preemption_refusals_total", what="hold")
    hold = forged_hold(rig, forged.preemptor_name, forged.victim, forged.claimed)
    rig.forge_hold(hold)
    wait_for(
        "the extender refuses the forged hold",
        lambda: (
            rig.metric("gpushare_extender_preemption_refusals_total", what="hold") > before or None
        ),
    )
    wait_for(
        "the forged hold dropped from the ConfigMap", lambda: hold.uid not in rig.holds() or None
    )
    rig.all_running()
    assert forged.why in caplog.text


def test_a_hold_written_to_last_a_day_ends_at_the_longest_hold(rig: Rig) -> None:
    rig.pending("waiter", "gpushare-low")
    hold = forged_hold(rig, "waiter", "low", PRIORITIES["gpushare-low"])
    hold = Hold(hold.pod, hold.uid, NODE, hold.priority, hold.containers, (), (),
                hold.created_s, hold.created_s + 86_400, "gpushare")  # fmt: skip
    rig.forge_hold(hold)
    ended = wait_for(
        "the day-long hold ended by the extender",
        lambda: time.time() if hold.uid not in rig.holds() else None,
        timeout=HOLD_MAX_S + 15,
    )
    assert ended - hold.created_s < HOLD_MAX_S + 10  # not a day
    rig.all_running()


def test_the_extender_says_when_others_may_write_its_holds(
    rig: Rig, control_plane: ControlPlane
) -> None:
    gauge = "gpushare_extender_holds_foreign_writers"
    wait_for("the check ran: nobody else", lambda: rig.metric(gauge) == 0.0 or None)
    name = "configmaps-for-all-service-accounts"  # a shortcut an operator might take
    rule = PolicyRule(apiGroups=[""], resources=["configmaps"], verbs=["get", "update", "patch"])
    rig.kube.create(Role(metadata=ObjectMeta(name=name, namespace=NAMESPACE), rules=[rule]))
    binding = RoleBinding(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE),
        roleRef=RoleRef(apiGroup="rbac.authorization.k8s.io", kind="Role", name=name),
        subjects=[
            Subject(
                kind="Group",
                name=f"system:serviceaccounts:{NAMESPACE}",
                apiGroup="rbac.authorization.k8s.io",
            )
        ],
    )
    rig.kube.create(binding)
    try:
        found = wait_for("the grant seen", lambda: rig.metric(gauge) or None)
        assert found == 2.0  # update and patch, for that group
    finally:
        rig.kube.delete(RoleBinding, name, namespace=NAMESPACE)
        rig.kube.delete(Role, name, namespace=NAMESPACE)
    wait_for("the grant gone", lambda: rig.metric(gauge) == 0.0 or None)


def test_a_real_preemptor_still_preempts_through_kube_scheduler(rig: Rig) -> None:
    name = rig.case.submit(preemptor("urgent", 16, priority="gpushare-mid"))
    evicted = rig.case.wait_terminating(1)
    assert evicted == {"low"}  # priority 100 goes for 500; vip (1000) stays
    rig.case.release(["low"])
    assert rig.case.wait_bound(name) == (NODE, (1,))
    assert rig.case.overcommitted() == []
    wait_for("its hold ended at its bind", lambda: rig.holds() == {} or None)
