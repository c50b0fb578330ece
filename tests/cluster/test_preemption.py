"""GPU-aware preemption on the real control plane (docs/usage.md, "Priorities and
preemption"): kube-scheduler v1.37.1 with its
DefaultPreemption, two ``gpushare extender`` processes with leader election behind a Service
stand-in, the chart's extender entry (``preemptVerb: preempt``), kwok nodes of two 16 GiB GPUs,
PriorityClasses low = 100, mid = 500, high = 1000.

Each case seeds low-priority pods where it says (``gpushare.testing.preemption``: they linger
while terminating, so every eviction is seen), sends a high-priority pod through kube-scheduler
and judges from the pods alone: which pods were evicted, where the preemptor is bound (its
``gpushare.io/allocation``), that nothing went over capacity. The right outcome of the table of
docs/usage.md, "What kube-scheduler does without gpushare's preemption", case by case:

=====  ==================================================  ====  ===============================
case   before (GPU0 / GPU1)                                asks  right outcome
=====  ==================================================  ====  ===============================
1      8+8 / 8+8 of lows, the two newest on two GPUs       16    the 2 lows of one GPU, bound there
2      12 / 12 of lows                                     8     one 12 GiB low, bound there
3      A: high+low / high+low; B: low+low / high+high      16    B's 2 lows only
3'     three nodes like A, one like B                      16    2 evicted, not 8
4      a full node of 8 GiB lows                           20    nothing (no GPU is that big)
=====  ==================================================  ====  ===============================

Cases 1, 3, 3', 4, the multi-GPU pod and the PodDisruptionBudget go through kube-scheduler's
``preempt`` call (it evicts the extender's victims); case 2 and the compute share are the ones
kube-scheduler never sends (the node totals fit), so the leading extender preempts itself
after ``--preemption-wait``; the last test kills that leader while its victims terminate.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import ResourceQuotaSpec
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.policy_v1 import PodDisruptionBudgetSpec
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import ResourceQuota
from lightkube.resources.policy_v1 import PodDisruptionBudget
from lightkube.types import PatchType

from gpushare.kube.holds import HOLD_SHARDS, HoldsRef
from gpushare.testing.controlplane import (
    ControlPlane,
    free_ports,
    gpushare_extender,
    gpushare_profile,
    wait_for,
    wait_until,
)
from gpushare.testing.failover import Replica
from gpushare.testing.preemption import (
    ISSUE_CASES,
    Case,
    Scenario,
    Seed,
    create_hold_shards,
    preemptor,
    read_hold_shards,
)
from gpushare.testing.rbac import EXTENDER_RULES
from gpushare.testing.service_proxy import ServiceProxy

pytestmark = pytest.mark.cluster

SCHEDULER = "gpushare-preempt"
HOLDS = ("kube-system", "gpushare-preemption-holds-test")
HOLDS_REF = HoldsRef(*HOLDS, HOLD_SHARDS)
LEASE_NAMESPACE = "kube-system"
APART_S = 1.1  # start times are whole seconds: one more second orders two pods


@dataclass
class Stack:
    kube: Client
    replicas: list[Replica]
    lease: str

    def leader(self) -> Replica | None:
        try:
            lease = self.kube.get(Lease, self.lease, namespace=LEASE_NAMESPACE)
        except Exception:
            return None
        holder = lease.spec.holderIdentity if lease.spec is not None else None
        found = [r for r in self.replicas if r.identity == holder]
        return found[0] if found else None

    def holds(self) -> dict[str, str]:
        return read_hold_shards(self.kube, HOLDS_REF)


@pytest.fixture(scope="module")
def stack(control_plane: ControlPlane) -> Iterator[Stack]:
    with contextlib.ExitStack() as exits:
        kube = exits.enter_context(control_plane.client())
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-preempt", LEASE_NAMESPACE, EXTENDER_RULES
        )
        # The holds ConfigMaps, as the chart creates them (the extender may only patch them).
        create_hold_shards(kube, HOLDS_REF)
        lease = f"gpushare-preempt-{uuid.uuid4().hex[:6]}"
        args = (
            "--policy=binpack",
            f"--preemption-holds={HOLDS[0]}/{HOLDS[1]}",
            "--preemption-wait=1",
            "--log-level=debug",
        )
        replicas = [
            Replica(i, port, kubeconfig, lease, control_plane.root / "preempt", args=args)
            for i, port in enumerate(free_ports(2))
        ]
        for replica in replicas:
            replica.start()
            exits.callback(replica.stop)
        proxy = exits.enter_context(ServiceProxy([("127.0.0.1", r.port) for r in replicas]))
        found = Stack(kube, replicas, lease)
        # Both replicas ready behind the proxy before kube-scheduler calls: a preempt call that
        # finds no ready backend is lost (the pod then waits for kube-scheduler's next try).
        wait_until(
            "both replicas ready and a leader",
            lambda: len(proxy.ready) == len(replicas) and found.leader() is not None,
            90,
        )
        exits.enter_context(
            control_plane.scheduler(
                "kube-scheduler-preempt",
                profiles=[gpushare_profile(SCHEDULER)],  # the chart's: dry run cut at 10 nodes
                extenders=[gpushare_extender(proxy.url + "/gpushare-scheduler", dialects=True)],
                podInitialBackoffSeconds=1,
                podMaxBackoffSeconds=2,
            )
        )
        yield found


def case(stack: Stack, name: str, nodes: dict[str, list[int]]) -> Case:
    return Case(stack.kube, name, nodes, SCHEDULER)


def gpu_of(c: Case, pods: set[str]) -> set[tuple[str, tuple[int, ...]]]:
    """Where each of ``pods`` held its GPUs."""
    return {placed for p in pods if (placed := c.placement(p)) is not None}


@contextlib.contextmanager
def issue_case(stack: Stack, scenario: Scenario) -> Iterator[Case]:
    """The documented case ``scenario`` (``gpushare.testing.preemption.ISSUE_CASES``: the table
    of docs/usage.md, "What kube-scheduler does without gpushare's preemption"), seeded."""
    namespace = "pre-case" + scenario.name.replace("'", "p")
    with Case(stack.kube, namespace, scenario.nodes, SCHEDULER) as c:
        c.seed_waves(scenario.waves)
        yield c


CASE_1, CASE_2, CASE_3, CASE_3P, CASE_4 = ISSUE_CASES


def test_case_1_evicts_the_two_lows_of_one_gpu_and_binds_there(stack: Stack) -> None:
    with issue_case(stack, CASE_1) as c:
        c.submit(preemptor("high", CASE_1.ask))
        evicted = c.wait_terminating(2)
        assert len(evicted) == 2
        (gpus,) = {placed[1] for placed in gpu_of(c, evicted)}
        assert c.nominated("high") == "s1"
        c.release(evicted)
        assert c.wait_bound("high") == ("s1", gpus)
        assert c.terminating() == set()
        assert c.overcommitted() == []


def test_case_2_evicts_one_12_gib_low_that_kube_scheduler_never_sends(stack: Stack) -> None:
    with issue_case(stack, CASE_2) as c:
        c.submit(preemptor("high", CASE_2.ask))
        assert c.wait_terminating(1) == {"b"}, "the most recently started 12 GiB low"
        assert [v for v in stack.holds().values() if '"pre-case2/high"' in v]
        # While b terminates, GPU 1's freed 8 GiB are held: a low pod asking 10 does not fit.
        c.submit(preemptor("late-low", 10, priority="gpushare-low"))
        c.release({"b"})
        assert c.wait_bound("high") == ("s2", (1,))
        time.sleep(3)  # kube-scheduler retries late-low with backoff (1-2 s)
        assert c.placement("late-low") is None, "GPU 1 was held for high; GPU 0 has 4 free"
        assert c.terminating() == set()
        assert c.overcommitted() == []
        wait_for(
            "the hold ends",
            lambda: not [v for v in stack.holds().values() if "pre-case2/high" in v] or None,
            30,
        )


def test_case_3_evicts_node_bs_two_lows_only(stack: Stack) -> None:
    with issue_case(stack, CASE_3) as c:
        c.submit(preemptor("high", CASE_3.ask))
        assert c.wait_terminating(2) == {"s3-b-l0", "s3-b-l1"}
        c.release()
        assert c.wait_bound("high") == ("s3-b", (0,))
        assert c.overcommitted() == []


def test_case_3_prime_evicts_2_pods_where_kube_scheduler_evicts_8(stack: Stack) -> None:
    with issue_case(stack, CASE_3P) as c:
        c.submit(preemptor("high", CASE_3P.ask))
        assert c.wait_terminating(2) == {"s3p-b-l0", "s3p-b-l1"}
        c.release()
        assert c.wait_bound("high") == ("s3p-b", (0,))
        assert c.terminating() == set()


def test_case_4_a_pod_no_gpu_can_hold_evicts_nothing(stack: Stack) -> None:
    with issue_case(stack, CASE_4) as c:
        c.submit(preemptor("high", CASE_4.ask))
        time.sleep(6)  # several scheduling cycles with backoff 1-2 s
        assert c.terminating() == set()
        assert c.placement("high") is None


def test_a_multi_gpu_pod_gets_both_gpus_freed(stack: Stack) -> None:
    """kube-scheduler's node total asks one 12 GiB victim; two GPUs of 8 need both."""
    with case(stack, "pre-multi", {"mg-n": [16, 16]}) as c:
        c.seed(Seed("a", "mg-n", {0: 12}), Seed("b", "mg-n", {1: 12}))
        c.submit(preemptor("high", 8, gpus=2))
        assert c.wait_terminating(2) == {"a", "b"}
        c.release()
        assert c.wait_bound("high") == ("mg-n", (0, 1))
        assert c.overcommitted() == []


def test_a_compute_share_evicts_the_pod_holding_the_compute(stack: Stack) -> None:
    """Memory fits everywhere (node total and GPUs); 80 % of the compute does not leave 50."""
    with case(stack, "pre-compute", {"cs-n": [16]}) as c:
        c.seed(Seed("busy", "cs-n", {0: 2}, compute=80))
        c.submit(preemptor("high", 2, compute=50))
        assert c.wait_terminating(1) == {"busy"}
        c.release()
        assert c.wait_bound("high") == ("cs-n", (0,))


def test_a_pod_disruption_budget_steers_the_choice_to_the_larger_allowed_set(
    stack: Stack,
) -> None:
    with case(stack, "pre-pdb", {"pdb-n": [16, 16]}) as c:
        c.seed(Seed("guarded", "pdb-n", {0: 16}, labels={"app": "db"}))
        time.sleep(APART_S)  # the guarded pod would be the cheapest: it started first...
        c.seed(Seed("a", "pdb-n", {1: 8}), Seed("b", "pdb-n", {1: 8}))
        stack.kube.create(
            PodDisruptionBudget(
                metadata=ObjectMeta(name="db", namespace=c.name),
                spec=PodDisruptionBudgetSpec(
                    minAvailable=1, selector=LabelSelector(matchLabels={"app": "db"})
                ),
            )
        )
        time.sleep(1)  # the extenders' watch brings the budget
        c.submit(preemptor("high", 16))
        assert c.wait_terminating(2) == {"a", "b"}
        c.release()
        assert c.wait_bound("high") == ("pdb-n", (1,))
        assert "guarded" in c.pods()


def test_preemption_policy_never_evicts_nothing(stack: Stack) -> None:
    with case(stack, "pre-never", {"nv-a": [16, 16], "nv-b": [16, 16]}) as c:
        c.seed(
            Seed("a", "nv-a", {0: 16}), Seed("b", "nv-a", {1: 16}),  # total full
            Seed("c", "nv-b", {0: 12}), Seed("d", "nv-b", {1: 12}),  # total fits, GPUs do not
        )  # fmt: skip
        c.submit(preemptor("high", 8, never=True))
        time.sleep(6)
        assert c.terminating() == set()
        assert c.placement("high") is None


def test_the_leader_killed_mid_preemption_loses_no_hold_and_evicts_nothing_more(
    stack: Stack,
) -> None:
    with case(stack, "pre-kill", {"kl-n": [16, 16]}) as c:
        c.seed(Seed("a", "kl-n", {0: 12}))
        time.sleep(APART_S)
        c.seed(Seed("b", "kl-n", {1: 12}))
        c.submit(preemptor("high", 8))
        assert c.wait_terminating(1) == {"b"}
        leader = stack.leader()
        assert leader is not None
        leader.kill()
        leader.start()  # as kubelet restarts its container
        wait_for("a new leader", stack.leader, 60)
        c.submit(preemptor("late-low", 10, priority="gpushare-low"))
        time.sleep(3)
        c.release({"b"})
        assert c.wait_bound("high", 60) == ("kl-n", (1,))
        time.sleep(3)
        assert c.placement("late-low") is None
        assert c.terminating() == set()
        assert set(c.pods()) == {"a", "high", "late-low"}, "b alone was evicted"
        assert c.overcommitted() == []


def test_a_namespace_quota_caps_gpu_memory_and_no_preemption_gets_past_it(
    stack: Stack,
) -> None:
    """ResourceQuota on ``requests.aliyun.com/gpu-mem`` caps a team's GPU memory on the real
    API server; a high-priority pod of a team at its quota is refused at admission, so it never
    preempts anyone. (No kube-controller-manager runs in this tier: the status its quota
    controller would compute first is set by the test; admission keeps ``used`` from then on.)
    """
    quota = "gpu-memory"
    with case(stack, "pre-quota", {"q-n": [16, 16]}) as c:
        stack.kube.create(
            ResourceQuota(
                metadata=ObjectMeta(name=quota, namespace=c.name),
                spec=ResourceQuotaSpec(hard={"requests.aliyun.com/gpu-mem": "16"}),
            )
        )
        stack.kube.patch(
            ResourceQuota.Status,
            quota,
            {"status": {"hard": {"requests.aliyun.com/gpu-mem": "16"},
                        "used": {"requests.aliyun.com/gpu-mem": "0"}}},
            namespace=c.name,
            patch_type=PatchType.MERGE,
        )  # fmt: skip
        c.seed(Seed("a", "q-n", {0: 8}), Seed("b", "q-n", {0: 8}))
        used = stack.kube.get(ResourceQuota, quota, namespace=c.name)
        assert used.status is not None
        assert used.status.used == {"requests.aliyun.com/gpu-mem": "16"}
        with pytest.raises(ApiError, match="exceeded quota"):
            c.submit(preemptor("high", 8))
        time.sleep(3)
        assert c.terminating() == set()
        assert set(c.pods()) == {"a", "b"}


def test_every_hold_ended_and_no_replica_logged_a_traceback(stack: Stack) -> None:
    """Every hold ended with its preemptor bound or gone: none is left behind; and nothing
    the replicas did raised (a traceback in a log is a bug, even when the case passed)."""
    wait_for("every hold ended", lambda: not stack.holds() or None, 30)
    process = stack.replicas[0].process
    assert process is not None
    logs = sorted(process.log_path.parent.parent.glob("*/*.log"))
    assert len(logs) >= len(stack.replicas)  # every generation of every replica
    for log in logs:
        text = log.read_text(errors="replace")
        assert "Traceback" not in text, f"{log}:\n{text[-3000:]}"
