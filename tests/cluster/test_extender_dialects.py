"""Pods written for gpu-manager and HAMi, scheduled by the real kube-scheduler through the real
extender (``LiveExtender`` in a thread) onto kwok nodes with the ``gpushare.io/gpu-inventory``
annotation (GiB), next to an Alibaba pod already placed (docs/compute.md).

kube-scheduler's extender entry lists the dialects' resources in ``managedResources``
(``gpushare_extender(..., dialects=True)``): kube-scheduler sends those pods to the extender,
checks the node totals of the resources the device plugin advertises (``tencent.com/vcuda-*``,
``nvidia.com/gpu``: ``ignoredByScheduler: false``, as kubelet counts them) and leaves the
others' amounts to the extender; the nodes advertise what ``gpushare device-plugin
--dialects tencent,hami`` would.

Proved here, in order, on one node of four 16 GiB GPUs whose GPU 0 holds 4 GiB:

* gpu-manager's README pod 1 (vcuda-core 50, 30 × 256 MiB) binds to GPU 0, recorded as 8 GiB
  with 500 compute_milli; a HAMi pod (2,048 MiB, 30 % cores) binds to GPU 0 beside it;
* README pod 2 (vcuda-core 200) takes GPUs 1 and 2 whole (GPU 0, in use, is not taken whole),
  each recorded at its whole memory; an Alibaba pod of 12 GiB then fits GPU 3 only (GPU 0 has
  2 GiB free, 1 and 2 none); a HAMi whole-GPU pod (gpucores 100) then stays Pending with "not
  enough GPUs that hold nothing", and a 3 GiB Alibaba pod lands on GPU 3, the only GPU with
  3 GiB free (that a GPU held whole takes nothing shared even with memory to spare cannot be
  reached through a dialect, none asks 0 memory: test_core_fit and test_core_ledger prove it);
* ``tencent.com/vcuda-core: 150`` stays Pending, its FailedScheduling event giving
  gpu-manager's rule;
* ``kubectl-inspect-gpushare -d`` (the plugin kubectl runs) shows each pod's compute next to
  its memory (``8,50%``, ``16,whole``), the waiting whole-GPU pod with its reason and the
  invalid pod as a problem with gpu-manager's rule;
* a second extender started on the same cluster rebuilds the same ledger from the pods'
  annotations alone, and neither ledger has a violation;
* on a node whose device plugin runs ``--split-count 2``, a third HAMi pod on its one GPU stays
  Pending with kube-scheduler's "Insufficient nvidia.com/gpu" while memory is left, and an
  Alibaba pod still takes that memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from lightkube import ApiError, Client
from lightkube.models.core_v1 import Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod

from gpushare.extender.live import LiveOptions
from gpushare.kube.codec import ALLOCATION
from gpushare.kube.watch import Backoff
from gpushare.testing import core
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.dialects import (
    dialect_pod_json,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.live_extender import ExtenderThread, extender_with_scheduler
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import bound_gpu_pod, delete_namespace

pytestmark = pytest.mark.cluster

NAMESPACE = "dialects"
SCHEDULER_NAME = "gpushare-dialects"
NODE = "dialects-n1"


@dataclass
class Cluster:
    kube: Client
    extender: ExtenderThread
    control_plane: ControlPlane

    def create(self, pod: dict[str, Any]) -> str:
        self.kube.create(cast(Pod, Pod.from_dict(pod)))
        name: str = pod["metadata"]["name"]
        return name

    def bound(self, name: str) -> Pod:
        def probe() -> Pod | None:
            pod = self.kube.get(Pod, name, namespace=NAMESPACE)
            return pod if pod.spec is not None and pod.spec.nodeName else None

        return wait_for(f"pod {name} bound", probe)

    def containers(self, name: str) -> list[dict[str, Any]]:
        """The ``gpushare.io/allocation`` containers of bound pod ``name``."""
        pod = self.bound(name)
        assert pod.metadata is not None
        document = json.loads((pod.metadata.annotations or {})[ALLOCATION])
        assert document["node"] == NODE
        containers: list[dict[str, Any]] = document["containers"]
        return containers

    def failed_scheduling(self, name: str, text: str) -> str:
        """The message of pod ``name``'s FailedScheduling event once it contains ``text``."""

        def probe() -> str | None:
            for event in self.kube.list(
                Event, namespace=NAMESPACE, fields={"involvedObject.name": name}
            ):
                if event.reason == "FailedScheduling" and text in (event.message or ""):
                    return event.message
            return None

        return wait_for(f"FailedScheduling of {name} with {text!r}", probe)

    def pending(self, name: str) -> bool:
        pod = self.kube.get(Pod, name, namespace=NAMESPACE)
        return pod.spec is not None and not pod.spec.nodeName

    def ledger(self, extender: ExtenderThread) -> dict[str, Any]:
        status, report = extender.get(f"/gpushare-scheduler/inspect/{NODE}")
        assert status == 200, report
        return {
            "devs": [
                {
                    "id": d["id"],
                    "compute": d.get("compute"),
                    "whole": d.get("whole"),
                    "pods": sorted(
                        (p["name"], p["usedGPU"], p.get("compute", 0), p.get("whole", False))
                        for p in d["pods"]
                    ),
                }
                for d in report["devs"]
            ]
        }


def pod(name: str, limits: dict[str, str | int], **annotations: str) -> dict[str, Any]:
    return dialect_pod_json(
        name, {"main": limits}, namespace=NAMESPACE, scheduler=SCHEDULER_NAME,
        annotations=annotations or None,
    )  # fmt: skip


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane) -> Iterator[Cluster]:
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        create_nodes(kube, [gpu_node(NODE, [16] * 4, dialects=["tencent", "hami"])])
        stack.callback(delete_nodes, kube, [NODE])
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        stack.callback(delete_namespace, kube, NAMESPACE)
        node = core.gpu_node([16] * 4, name=NODE)
        kube.create(bound_gpu_pod(NAMESPACE, "alibaba-4", node, [("main", (0,), 4)], assume_ns=1))
        # binpack: the expected GPUs below are its choices (the default is fgd-spare).
        options = LiveOptions(
            policy="binpack", backoff=Backoff(initial_s=0.05, max_s=0.5), access_log=False
        )
        extender = stack.enter_context(
            extender_with_scheduler(
                control_plane, control_plane.kubeconfig, options, SCHEDULER_NAME, dialects=True
            )
        )
        yield Cluster(kube, extender, control_plane)


def test_shares_in_gpu_manager_and_hami_dialects_land_beside_an_alibaba_pod(
    cluster: Cluster,
) -> None:
    tencent = cluster.create(
        gpu_manager_readme_pod_1("readme-1", NAMESPACE, scheduler=SCHEDULER_NAME)
    )
    assert cluster.containers(tencent) == [
        {"name": "nvidia", "gpus": [0], "share": 8, "compute": 500}
    ]
    hami = cluster.create(
        pod("hami-share", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048,
                           "nvidia.com/gpucores": 30})
    )  # fmt: skip
    assert cluster.containers(hami) == [{"name": "main", "gpus": [0], "share": 2, "compute": 300}]


def test_whole_gpus_take_only_unused_gpus_and_count_their_whole_memory(cluster: Cluster) -> None:
    whole = cluster.create(
        gpu_manager_readme_pod_2("readme-2", NAMESPACE, scheduler=SCHEDULER_NAME)
    )
    assert cluster.containers(whole) == [
        {"name": "nvidia", "gpus": [1, 2], "share": 16, "compute": 1000, "whole": True}
    ]
    # GPU 0 has 2 GiB free, 1 and 2 none (held whole, recorded at 16): 12 GiB fits only GPU 3.
    big = cluster.create(pod("alibaba-12", {"aliyun.com/gpu-mem": 12}))
    assert cluster.containers(big) == [{"name": "main", "gpus": [3], "share": 12}]
    # No GPU holds nothing now: a HAMi whole GPU waits, with the reason.
    waiting = cluster.create(pod("hami-whole", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}))
    cluster.failed_scheduling(waiting, "not enough GPUs that hold nothing for whole GPUs")
    # GPU 0 has 2 GiB free, 1 and 2 none, 3 has 4: 3 GiB fits GPU 3 only.
    small = cluster.create(pod("alibaba-3", {"aliyun.com/gpu-mem": 3}))
    assert cluster.containers(small) == [{"name": "main", "gpus": [3], "share": 3}]
    assert cluster.pending(waiting)


def test_an_invalid_vcuda_core_stays_pending_with_gpu_managers_rule(cluster: Cluster) -> None:
    name = cluster.create(
        pod("vcuda-150", {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 4})
    )
    message = cluster.failed_scheduling(name, "above 100 only multiples of 100")
    assert "tencent.com/vcuda-core=150" in message, message
    assert cluster.pending(name)


def test_kubectl_inspect_gpushare_shows_compute_and_whole_gpus(cluster: Cluster) -> None:
    plugin = Path(sys.executable).parent / "kubectl-inspect-gpushare"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8",
           "KUBECONFIG": str(cluster.control_plane.kubeconfig)}  # fmt: skip
    done = subprocess.run(
        [str(plugin), "-d", NODE], env=env, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split()[0]: line.split()[2:6] for line in done.stdout.splitlines() if line}
    assert rows["readme-1"] == ["8,50%", "0", "0", "0"], done.stdout
    assert rows["hami-share"] == ["2,30%", "0", "0", "0"], done.stdout
    assert rows["readme-2"] == ["0", "16,whole", "16,whole", "0"], done.stdout
    assert rows["alibaba-12"] == ["0", "0", "0", "12"], done.stdout
    assert "not enough GPUs that hold nothing for whole GPUs" in done.stdout
    assert "above 100 only multiples of 100" in done.stdout  # the unreadable pod, a problem


def test_a_restarted_extender_rebuilds_the_same_ledger(cluster: Cluster) -> None:
    def confirmed() -> bool | None:  # the watch has confirmed every bind: none only assumed
        report = cluster.extender.get(f"/gpushare-scheduler/inspect/{NODE}")[1]
        return not any(p["bindInFlight"] for d in report["devs"] for p in d["pods"]) or None

    wait_for("binds confirmed", confirmed)
    options = LiveOptions(
        policy="binpack", backoff=Backoff(initial_s=0.05, max_s=0.5), access_log=False
    )
    with ExtenderThread(cluster.control_plane.kubeconfig, options) as second:
        wait_for("second extender /readyz 200", lambda: second.get("/readyz")[0] == 200 or None)
        assert cluster.ledger(second) == cluster.ledger(cluster.extender)
        for extender in (second, cluster.extender):
            status, report = extender.get("/gpushare-scheduler/inspect")
            assert status == 200
            assert report["violations"] == []


SPLIT_NODE = "dialects-split"
SPLIT_TAINT = Taint(key="gpushare.io/test-split", value="true", effect="NoSchedule")


def on_split_node(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` pinned to ``SPLIT_NODE`` (its node selector and the taint's toleration)."""
    body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": SPLIT_NODE}
    body["spec"]["tolerations"] = [
        {"key": SPLIT_TAINT.key, "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    return body


def test_hami_pods_per_gpu_stop_at_the_device_plugins_split_count(cluster: Cluster) -> None:
    """kube-scheduler counts ``nvidia.com/gpu`` against the node's allocatable (GPUs ×
    ``--split-count``), as kubelet will at admission: the extender need not know the split
    count, and never binds a pod that kubelet would refuse for want of devices."""
    create_nodes(
        cluster.kube,
        [gpu_node(SPLIT_NODE, [16], dialects=["hami"], split_count=2, taints=[SPLIT_TAINT])],
    )
    try:
        asked: dict[str, str | int] = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1024}
        for name in ("split-1", "split-2"):
            cluster.create(on_split_node(pod(name, asked)))
            assert cluster.bound(name).spec.nodeName == SPLIT_NODE  # type: ignore[union-attr]
        third = cluster.create(on_split_node(pod("split-3", asked)))
        cluster.failed_scheduling(third, "Insufficient nvidia.com/gpu")
        # 14 GiB are still free on the GPU: memory is not what holds the third pod back.
        memory = cluster.create(on_split_node(pod("split-alibaba", {"aliyun.com/gpu-mem": 8})))
        assert cluster.bound(memory).spec.nodeName == SPLIT_NODE  # type: ignore[union-attr]
        assert cluster.pending(third)
    finally:
        for name in ("split-1", "split-2", "split-3", "split-alibaba"):
            with contextlib.suppress(ApiError):  # one not created when a step failed
                cluster.kube.delete(Pod, name, namespace=NAMESPACE, grace_period=0)
        delete_nodes(cluster.kube, [SPLIT_NODE])
