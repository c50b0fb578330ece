"""300 pods in every dialect at once, through kube-scheduler and ``gpushare extender`` (a
process), which is SIGKILLed mid-burst and started again (docs/compute.md, "Metrics and the
mixed run").

Nodes (kwok, ``gpushare.io/gpu-inventory``): 8 with four 16 GiB GPUs counted in GiB and 8 with
four 24,576 MiB GPUs counted in MiB. Pods (``gpushare.testing.outcome2d.dialect_workload``,
seeded): Alibaba ``aliyun.com/gpu-mem`` on one GPU and on two (``gpushare.io/gpu-count``) and
with ``aliyun.com/gpu-core.percentage``, ``gpushare.io/exclusive`` whole GPUs (these, in the
node's unit, select the GiB nodes), Tencent ``vcuda-core``/``vcuda-memory`` shares (some not a
whole GiB) and whole GPUs of 100 and 200, HAMi ``nvidia.com/gpu`` with ``gpumem`` or
``gpumem-percentage``, with and without ``gpucores``, over one or two GPUs, and whole GPUs
(``gpucores: 100``). They ask more than fits, so some stay Pending.

All 300 are created in one burst; once 60 are bound (or half are sent, on a slow machine) the
extender is killed with SIGKILL (binds in flight lost with it) and started again at once on the
same port, rebuilding its ledger from the API server. When every pod is bound or fits
nowhere, the pods' annotations alone (never the extender's state:
``gpushare.testing.outcome2d``) prove: every bound pod has one record,
for its node and unit, matching its request resolved into that unit (compute and ``whole``
included); no GPU above capacity in memory or above 1000 in compute; no GPU held whole holds
anything else; and every Pending pod fits no node it may use in what those records leave free
(``outcome2d.fits_by_count``, a count that does not ask the core).
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from gpushare.kube.codec import MemoryUnit
from gpushare.testing.controlplane import ControlPlane, free_ports, gpushare_extender, wait_for
from gpushare.testing.dialects import dialect_pod_json
from gpushare.testing.failover import Replica, bound_count, start_burst
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.outcome2d import (
    DialectOutcome,
    DialectSpec,
    NodeGpus,
    dialect_workload,
    gpu_problems,
    judge_dialects,
    read_dialect_outcome,
)
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import EXTENDER_RULES

pytestmark = pytest.mark.cluster

NAMESPACE = "mixed"
SCHEDULER_NAME = "gpushare-mixed"
GROUP = "gpushare.io/test-group"
UNIT_LABEL = "gpushare.io/test-unit"
PODS = 300
KILL_AFTER = 60  # bound pods before the SIGKILL
SETTLE_S = 120.0
NODES: dict[str, NodeGpus] = {
    **{f"mixed-g{i}": NodeGpus(MemoryUnit.GIB, (16,) * 4) for i in range(8)},
    **{f"mixed-m{i}": NodeGpus(MemoryUnit.MIB, (24576,) * 4) for i in range(8)},
}
SPECS = dialect_workload(PODS, seed=20261124)
BY_NAME = {s.name: s for s in SPECS}


def pod_body(spec: DialectSpec) -> dict[str, object]:
    body = dialect_pod_json(
        spec.name, spec.limits, namespace=NAMESPACE, scheduler=SCHEDULER_NAME,
        annotations=spec.annotations or None,
    )  # fmt: skip
    selector = {GROUP: NAMESPACE}
    if spec.units:
        (unit,) = spec.units
        selector[UNIT_LABEL] = unit
    body["spec"]["nodeSelector"] = selector
    del body["metadata"]["uid"]
    return body


@dataclass
class Run:
    outcome: DialectOutcome
    problems: list[str]
    bound_at_kill: int
    burst_running_at_kill: bool
    timings: dict[str, float] = field(default_factory=dict)


@pytest.fixture(scope="module")
def run(control_plane: ControlPlane) -> Iterator[Run]:
    timings: dict[str, float] = {}
    start = time.monotonic()
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        create_nodes(
            kube,
            [
                gpu_node(name, list(gpus.capacities), unit=gpus.unit,
                         labels={GROUP: NAMESPACE, UNIT_LABEL: gpus.unit},
                         dialects=["tencent", "hami"])
                for name, gpus in NODES.items()
            ],
        )  # fmt: skip
        stack.callback(delete_nodes, kube, list(NODES))
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        stack.callback(delete_namespace, kube, NAMESPACE)
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-mixed", "kube-system", EXTENDER_RULES
        )
        (port,) = free_ports(1)
        extender = Replica(0, port, kubeconfig, None, control_plane.root / "mixed-extender")
        extender.start()
        stack.callback(extender.stop)
        wait_for("extender /readyz", lambda: extender.ready() or None, 60)
        stack.enter_context(
            control_plane.scheduler(
                "kube-scheduler-mixed",
                profiles=[{"schedulerName": SCHEDULER_NAME}],
                extenders=[
                    gpushare_extender(f"http://127.0.0.1:{port}/gpushare-scheduler", dialects=True)
                ],
                podInitialBackoffSeconds=1,
                podMaxBackoffSeconds=1,
            )
        )
        timings["setup"] = time.monotonic() - start

        t0 = time.monotonic()
        bodies = [pod_body(spec) for spec in SPECS]
        burst = start_burst(control_plane, NAMESPACE, bodies, name="mixed-burst")

        def enough() -> bool | None:
            # However slowly a loaded machine binds, the kill lands while pods still arrive:
            # at KILL_AFTER bound, or once half the burst is sent and something is bound.
            bound = bound_count(kube, NAMESPACE)
            return bound >= KILL_AFTER or (burst.sent >= PODS // 2 and bound >= 1) or None

        wait_for(f"{KILL_AFTER} pods bound or half the burst sent", enough, 90)
        extender.kill()
        burst_running_at_kill = burst.running()
        bound_at_kill = bound_count(kube, NAMESPACE)
        timings["kill"] = time.monotonic() - t0
        extender.start()  # as the kubelet would restart the container
        wait_for("restarted extender /readyz", lambda: extender.ready() or None, 60)
        timings["restarted"] = time.monotonic() - t0
        burst.join()
        timings[f"create {PODS}"] = burst.took_s or 0.0
        assert burst.failures == []

        def settled() -> bool | None:
            outcome = read_dialect_outcome(kube, NAMESPACE, BY_NAME, NODES)
            if outcome.problems or gpu_problems(outcome, NODES):
                return True  # no point waiting: the assertions report them
            if len(outcome.bound) + len(outcome.pending) != PODS:
                return None
            return not judge_dialects(outcome, BY_NAME, NODES) or None

        with contextlib.suppress(Exception):  # the problems below say what is wrong
            wait_for("every pod bound or fitting nowhere", settled, SETTLE_S)
        timings["settled"] = time.monotonic() - t0
        outcome = read_dialect_outcome(kube, NAMESPACE, BY_NAME, NODES)
        problems = judge_dialects(outcome, BY_NAME, NODES)
        timings["total"] = time.monotonic() - start
        print("timings (s):", {k: round(v, 2) for k, v in timings.items()})
        yield Run(outcome, problems, bound_at_kill, burst_running_at_kill, timings)


def test_annotations_show_no_overcommit_in_either_dimension_and_no_pod_left_that_fits(
    run: Run,
) -> None:
    assert run.problems == []
    assert len(run.outcome.bound) + len(run.outcome.pending) == PODS


def test_every_dialect_and_whole_gpus_landed_on_both_units(run: Run) -> None:
    bound = Counter(BY_NAME[name].kind for name in run.outcome.bound)
    pending = Counter(BY_NAME[name].kind for name in run.outcome.pending)
    print("bound:", dict(bound), "pending:", dict(pending))
    assert set(bound) == {s.kind for s in SPECS}, "every kind of pod bound somewhere"
    assert run.outcome.pending, "the workload asks more than fits: some pods stay Pending"
    for unit in MemoryUnit:
        holds = [h for h in run.outcome.holds if NODES[h.node].unit is unit]
        assert any(h.whole for h in holds), f"a GPU held whole on a {unit} node"
        assert any(h.compute_milli and not h.whole for h in holds), f"compute shared on {unit}"


def test_the_extender_was_killed_mid_burst(run: Run) -> None:
    print(f"bound at the kill: {run.bound_at_kill}, at the end: {len(run.outcome.bound)}")
    assert 1 <= run.bound_at_kill < len(run.outcome.bound)
    assert run.burst_running_at_kill, "the burst had created every pod before the kill"
