"""Pods the extender refused are requeued when what refused them changes (real kube-scheduler).

kube-scheduler parks a pod the extender refused on every node until a cluster event one of its
plugins registered for, or at most 5 minutes. A change of a node's ``gpushare.io/gpu-inventory``
annotation alone (the device plugin's served kinds, capacity unchanged) is no such event: no
plugin registers for ``Node/UpdateNodeAnnotation`` (v1.37). The extender requeues the pods it
refused before the change by touching their ``gpushare.io/requeued-at`` annotation
(``gpushare.extender.requeue``). Proved here:

* a pod refused for a preemption hold (GPUs kept for a pod of higher priority; kube-scheduler
  never sees holds) and parked is bound within seconds of the hold's end, not after the
  5-minute flush, and carries the annotation; ``gpushare_extender_requeues_total`` counts it;
* a shared pod refused by a node that serves whole GPUs only is bound within seconds of the
  inventory saying ``both`` (kube-scheduler retries on the annotation change too, but its
  informer may see it before the extender's watch: the requeue covers that race);
* ``PodRequeuer`` touches only the incarnation it names: a pod recreated under the same name
  (another UID) is ``gone`` and keeps its annotations, as is a pod deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.core.model import ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.core.serves import Serves
from gpushare.extender.live import LiveOptions
from gpushare.kube.client import connect
from gpushare.kube.codec import INVENTORY
from gpushare.kube.codec.preemption import holds_data
from gpushare.kube.refs import PodRef
from gpushare.kube.requeue import REQUEUE_CONDITION, PodRequeuer, RequeueOutcome
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.live_extender import ExtenderThread, extender_with_scheduler
from gpushare.testing.metrics import sample_sum
from gpushare.testing.nodes import (
    FakeGpu,
    create_nodes,
    delete_nodes,
    gpu_node,
    inventory_annotation,
)
from gpushare.testing.outcome import Ask, Spec, make_pod
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import EXTENDER_RULES

pytestmark = pytest.mark.cluster

NAMESPACE = "requeue"
SCHEDULER_NAME = "gpushare-requeue"
NODE = "requeue-n1"
HELD_NODE = "requeue-n2"
HOLDS = (NAMESPACE, "requeue-holds")
WAIT_S = 30.0  # far below kube-scheduler's 5-minute flush of parked pods


@dataclass
class Rig:
    kube: Client
    extender: ExtenderThread
    control_plane: ControlPlane


@pytest.fixture(scope="module")
def rig(control_plane: ControlPlane) -> Iterator[Rig]:
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        create_nodes(
            kube, [gpu_node(NODE, [16, 16], serves=Serves.WHOLE), gpu_node(HELD_NODE, [16])]
        )
        stack.callback(delete_nodes, kube, [NODE, HELD_NODE])
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        stack.callback(delete_namespace, kube, NAMESPACE)
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-requeue", "kube-system", [*EXTENDER_RULES]
        )
        options = LiveOptions(
            policy="binpack", backoff=Backoff(initial_s=0.05, max_s=0.5), holds_configmap=HOLDS
        )
        extender = stack.enter_context(
            extender_with_scheduler(control_plane, kubeconfig, options, SCHEDULER_NAME)
        )
        yield Rig(kube, extender, control_plane)


def shared_pod(name: str, gib: int, node: str = NODE, scheduler_name: str = SCHEDULER_NAME) -> Pod:
    spec = Spec(name, (Ask("main", 1, gib),))
    selector = {"kubernetes.io/hostname": node}
    return make_pod(
        spec, namespace=NAMESPACE, scheduler_name=scheduler_name, node_selector=selector
    )


def refused(rig: Rig, name: str, why: str) -> None:
    """Wait until kube-scheduler reports the extender's refusal ``why`` for pod ``name``."""

    def found() -> bool | None:
        events = rig.kube.list(Event, namespace=NAMESPACE, fields={"involvedObject.name": name})
        return (
            any(e.reason == "FailedScheduling" and why in (e.message or "") for e in events) or None
        )

    wait_for(f"kube-scheduler refuses {name} with the extender's reason", found)


def requeued(pod: Pod) -> bool:
    """Whether the requeuer's condition is in ``pod``'s status."""
    conditions = (pod.status.conditions if pod.status is not None else None) or []
    return any(c.type == REQUEUE_CONDITION and c.status == "True" for c in conditions)


def bound(rig: Rig, name: str) -> Pod:
    def probe() -> Pod | None:
        pod = rig.kube.get(Pod, name, namespace=NAMESPACE)
        return pod if pod.spec is not None and pod.spec.nodeName else None

    return wait_for(f"pod {name} bound", probe, WAIT_S)


def test_a_pod_refused_for_a_preemption_hold_is_placed_once_the_hold_ends(rig: Rig) -> None:
    # The preemptor: pending for good (no scheduler serves its name), known to the extender.
    preemptor = rig.kube.create(shared_pod("preemptor", 16, HELD_NODE, "nobody"))
    assert preemptor.metadata is not None
    assert preemptor.metadata.uid is not None
    now_s = time.time()
    hold = Hold(  # of the preemptor's priority, 0 (no PriorityClass), as the API server says
        f"{NAMESPACE}/preemptor", preemptor.metadata.uid, HELD_NODE, 0,
        (ContainerAllocation("main", (0,), 16),), (), (), now_s, now_s + 3600, "kube-scheduler",
    )  # fmt: skip
    rig.kube.create(
        ConfigMap(metadata=ObjectMeta(name=HOLDS[1], namespace=NAMESPACE), data=holds_data([hold]))
    )
    rig.kube.create(shared_pod("low", 4, HELD_NODE))
    refused(rig, "low", f"held for preemptors waiting for their victims: {NAMESPACE}/preemptor")
    parked(rig)
    rig.kube.delete(ConfigMap, HOLDS[1], namespace=NAMESPACE)  # the hold ends

    pod = bound(rig, "low")
    assert requeued(pod)  # nothing else moved it
    url = rig.extender.url + "/metrics"
    outcome = {"outcome": "requeued"}
    assert sample_sum(url, "gpushare_extender_requeues_total", outcome) >= 1.0


def parked(rig: Rig, quiet_s: float = 3.0) -> None:
    """Wait until kube-scheduler has parked the refused pod: no filter call for ``quiet_s``
    (its backoff retries, caused by events during the first attempts, are over)."""
    url = rig.extender.url + "/metrics"
    filters = {"verb": "filter"}
    seen = [sample_sum(url, "gpushare_extender_requests_total", filters), time.monotonic()]

    def quiet() -> bool | None:
        now = sample_sum(url, "gpushare_extender_requests_total", filters)
        if now != seen[0]:
            seen[:] = [now, time.monotonic()]
        return time.monotonic() - seen[1] >= quiet_s or None

    wait_for("kube-scheduler parks the pod", quiet, WAIT_S)


def test_a_pod_refused_by_a_whole_gpu_node_is_placed_once_the_node_serves_shares(
    rig: Rig,
) -> None:
    rig.kube.create(shared_pod("shared", 4))

    def refused() -> bool | None:
        events = rig.kube.list(Event, namespace=NAMESPACE, fields={"involvedObject.name": "shared"})
        why = "the node serves whole GPUs only"
        return (
            any(e.reason == "FailedScheduling" and why in (e.message or "") for e in events) or None
        )

    wait_for("kube-scheduler refuses the pod with the extender's reason", refused)
    parked(rig)
    # Only the annotation changes: capacity and allocatable stay 32.
    gpus = [FakeGpu(index=i, memory=16) for i in range(2)]
    rig.kube.patch(
        Node,
        NODE,
        {"metadata": {"annotations": {INVENTORY: inventory_annotation(NODE, gpus)}}},
        patch_type=PatchType.MERGE,
    )

    pod = bound(rig, "shared")
    assert pod.spec is not None
    assert pod.spec.nodeName == NODE


def test_the_requeue_touches_only_the_incarnation_it_names(rig: Rig) -> None:
    first = rig.kube.create(shared_pod("incarnation", 64))  # fits nowhere: stays Pending
    assert first.metadata is not None
    assert first.metadata.uid is not None
    old = PodRef(NAMESPACE, "incarnation", first.metadata.uid)
    rig.kube.delete(Pod, "incarnation", namespace=NAMESPACE, grace_period=0)

    def deleted() -> bool | None:
        pods = rig.kube.list(Pod, namespace=NAMESPACE, fields={"metadata.name": "incarnation"})
        return not list(pods) or None

    wait_for("pod deleted", deleted)

    async def requeue(pod: PodRef) -> tuple[RequeueOutcome, str]:
        client = connect(rig.control_plane.kubeconfig)
        try:
            return await PodRequeuer(client).requeue(pod)
        finally:
            await client.close()

    assert asyncio.run(requeue(old))[0] is RequeueOutcome.GONE  # deleted
    second = rig.kube.create(shared_pod("incarnation", 64))
    assert second.metadata is not None
    assert second.metadata.uid is not None
    outcome, detail = asyncio.run(requeue(old))
    assert outcome is RequeueOutcome.GONE, detail  # the name belongs to another UID now
    assert not requeued(rig.kube.get(Pod, "incarnation", namespace=NAMESPACE))
    new = PodRef(NAMESPACE, "incarnation", second.metadata.uid)
    assert asyncio.run(requeue(new))[0] is RequeueOutcome.REQUEUED
    pod = rig.kube.get(Pod, "incarnation", namespace=NAMESPACE)
    assert requeued(pod)
    assert pod.metadata is not None
    assert pod.metadata.annotations is None  # the status only: never the pod's metadata
