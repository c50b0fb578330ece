"""kube-scheduler v1.37.1 does not retry a pod asking an ``ignoredByScheduler`` resource when a
node grows, and the extender says so on the pod (docs/interfaces.md, Pitfalls: 31: found
by a soak, where two HAMi pods created in the second after a kubelet restart waited).

On a kwok node of two GPUs advertising ``nvidia.com/gpu: 0`` (a kubelet restarted, the device
plugin not registered again yet), a HAMi share (``nvidia.com/gpumem``, not advertised) and a
pod asking only ``nvidia.com/gpu`` are both refused by kube-scheduler's NodeResourcesFit. The
extender records ``NotRetriedOnNodeGrowth`` on the HAMi pod only. Then the node advertises its
GPUs: the plain pod is bound at once (it takes one GPU whole); the HAMi pod, which the other GPU
could take, stays Pending, and so it does after gpushare's requeue touch (a change of the pod
itself does not requeue a pod a plugin refused). The deletion of a scheduled pod
(kube-scheduler retries every such pod then) binds it. The steps that wait for nothing to
happen are kube-scheduler's behaviour, observed: if a release fixes it, this test fails, and
docs/interfaces.md and ``gpushare.extender.stranded`` should say which release.
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import pytest
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Node, Pod
from lightkube.types import PatchType

from gpushare.extender.live import LiveOptions
from gpushare.extender.stranded import STRANDED_REASON
from gpushare.kube.codec.dialects import HAMI_GPU
from gpushare.kube.requeue import requeue_patch
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.dialects import dialect_pod_json
from gpushare.testing.live_extender import extender_with_scheduler
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import delete_namespace, unschedulable

pytestmark = pytest.mark.cluster

SCHEDULER_NAME = "gpushare-stranded"
_runs = itertools.count()
QUIET_S = 5.0
"""How long a step that should move nothing is watched (kube-scheduler's retry after a pod
update or a node change comes within about a second of it: the plain pod's bind, below)."""


@dataclass
class Stack:
    kube: Client
    namespace: str
    node: str
    gpus_advertised: int

    def create(self, name: str, limits: dict[str, str | int]) -> None:
        pod = dialect_pod_json(
            name, {"main": limits}, namespace=self.namespace, scheduler=SCHEDULER_NAME
        )
        self.kube.create(cast(Pod, Pod.from_dict(pod)))

    def node_of(self, name: str) -> str | None:
        pod = self.kube.get(Pod, name, namespace=self.namespace)
        return (pod.spec.nodeName if pod.spec is not None else None) or None

    def advertise_gpus(self, count: int) -> None:
        patch: dict[str, Any] = {"status": {"allocatable": {HAMI_GPU: str(count)}}}
        self.kube.patch(Node.Status, self.node, patch, patch_type=PatchType.MERGE)

    def reasons(self, name: str) -> list[str]:
        events = self.kube.list(
            Event, namespace=self.namespace, fields={"involvedObject.name": name}
        )
        return [e.reason or "" for e in events]

    def stays_pending(self, name: str) -> bool:
        deadline = time.monotonic() + QUIET_S
        while time.monotonic() < deadline:
            if self.node_of(name):
                return False
            time.sleep(0.2)
        return True


@pytest.fixture
def stack(control_plane: ControlPlane) -> Iterator[Stack]:
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        run = f"stranded-{next(_runs)}-{int(time.time())}"  # a namespace deleted may linger
        (node,) = create_nodes(kube, [gpu_node(run, [16, 16], dialects=["hami"])])
        assert node.status is not None
        assert node.status.allocatable is not None
        stack.callback(delete_nodes, kube, [run])
        kube.create(Namespace(metadata=ObjectMeta(name=run)))
        stack.callback(delete_namespace, kube, run)
        options = LiveOptions(backoff=Backoff(initial_s=0.05, max_s=0.5), access_log=False)
        stack.enter_context(
            extender_with_scheduler(
                control_plane, control_plane.kubeconfig, options, SCHEDULER_NAME, dialects=True
            )
        )
        yield Stack(kube, run, run, int(node.status.allocatable[HAMI_GPU]))


def test_kube_scheduler_does_not_retry_an_ignored_resource_pod_as_a_node_grows_and_it_is_said(
    stack: Stack,
) -> None:
    stack.advertise_gpus(0)
    stack.create("hami", {HAMI_GPU: 1, "nvidia.com/gpumem": 2048})
    stack.create("plain", {HAMI_GPU: 1})
    for name in ("hami", "plain"):
        message = wait_for(
            f"{name} refused by kube-scheduler",
            lambda name=name: unschedulable(stack.kube, stack.namespace, name),  # type: ignore[misc]
        )
        assert f"Insufficient {HAMI_GPU}" in message
    wait_for(
        f"{STRANDED_REASON} on the HAMi pod",
        lambda: STRANDED_REASON in stack.reasons("hami") or None,
    )
    assert STRANDED_REASON not in stack.reasons("plain")

    stack.advertise_gpus(stack.gpus_advertised)
    assert wait_for("the plain pod bound", lambda: stack.node_of("plain")) == stack.node
    assert stack.stays_pending("hami"), "kube-scheduler retried it: Pitfalls 31 is fixed"

    hami = stack.kube.get(Pod, "hami", namespace=stack.namespace)
    assert hami.metadata is not None
    assert hami.metadata.uid is not None
    touch = requeue_patch(hami.metadata.uid)  # what the requeuer writes
    stack.kube.patch(
        Pod.Status, "hami", touch, namespace=stack.namespace, patch_type=PatchType.STRATEGIC
    )
    assert stack.stays_pending("hami"), "a pod update requeued it: the requeuer could help"

    stack.kube.delete(Pod, "plain", namespace=stack.namespace, grace_period=0)
    assert wait_for("the HAMi pod bound", lambda: stack.node_of("hami")) == stack.node
