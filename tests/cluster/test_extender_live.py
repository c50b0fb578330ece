"""The real extender against the real control plane: design.md section 1, end to end.

``gpushare.extender.live.LiveExtender`` (what ``gpushare extender --kubeconfig`` runs) serves on
a loopback port in a thread of the test process, with its own RBAC-limited ServiceAccount. A
second kube-scheduler (profile ``gpushare-live``) calls it for filter, prioritize and bind
(``nodeCacheCapable: true``, ``managedResources: aliyun.com/gpu-mem``,
``ignoredByScheduler: false``), exactly as deployed. Nodes are kwok nodes with the
``gpushare.io/gpu-inventory`` annotation, in MiB. The GPU pods already on them are created bound,
carrying the annotations a bind records (Alibaba's only on N1–N3, as Alibaba's extender leaves
them; ours as well on N4), so the extender must rebuild its ledger from the API server alone.

Proved here:

* ``/readyz`` is 503 while the caches cannot list (the ServiceAccount may not list nodes yet)
  and 200 once nodes and pods are listed; ``/inspect`` then shows the ledger rebuilt from the
  pods' annotations;
* (a) nodes N1, N2, N3 with two 16,276 MiB GPUs each, N1 with 4,069 MiB free in total, N2 with
  4,069 + 4,069, N3 with 8,138 on GPU0: a pod asking 8,138 MiB lands on N3 with
  ``ALIYUN_COM_GPU_MEM_IDX`` "0"; the watch confirms the allocation (no longer assumed); a
  second such pod stays Pending, kube-scheduler's event naming kube-scheduler's own refusal
  (``Insufficient aliyun.com/gpu-mem``) and ours for N2 with the numbers;
* (b) on a node whose GPUs have 12,207 / 8,138 / 4,069 / 16,276 MiB free, a pod asking 8,138
  gets GPU1 (binpack);
* each bound pod carries a ``GPUAssigned`` Event from ``gpushare-extender`` naming its GPU, and
  the ledger has no violations;
* a deleted pod's GPU goes back (the Pending pod then lands there) and so does a finished one's;
* the command itself, ``gpushare extender --kubeconfig``, serves, syncs and stops on SIGTERM.

Every wait polls an API or HTTP condition with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Namespace, Pod
from lightkube.types import PatchType

from gpushare.extender.live import LiveOptions
from gpushare.kube.codec import GPU_MEM, MemoryUnit
from gpushare.kube.watch import Backoff
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    wait_for,
    wait_until,
)
from gpushare.testing.live_extender import ExtenderThread, http_get
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import EXTENDER_RULES_BUT_NODES as EXTENDER_RULES
from gpushare.testing.rbac import READ_NODES

pytestmark = pytest.mark.cluster

NAMESPACE = "live"
SCHEDULER_NAME = "gpushare-live"
GROUP_LABEL = "gpushare.io/test-group"
GPU = 16_276  # MiB, one whole GPU
QUARTER, HALF, THREE_QUARTERS = 4_069, 8_138, 12_207
N1, N2, N3, N4 = "live-n1", "live-n2", "live-n3", "live-n4"
WAIT_S = 30.0


@dataclass(frozen=True)
class Placed:
    """A GPU pod that already runs: ``amount`` MiB on GPU ``gpu`` of ``node``."""

    name: str
    node: str
    gpu: int
    amount: int
    ours: bool = False  # also gpushare.io/allocation (else only Alibaba's annotations)


PLACED = [
    # N1: 0 + 4,069 free (16,276 + 12,207 used): kube-scheduler's own check refuses 8,138.
    Placed("n1-a", N1, 0, GPU),
    Placed("n1-b", N1, 1, THREE_QUARTERS),
    # N2: 4,069 + 4,069 free: 8,138 in total, but on no single GPU.
    Placed("n2-a", N2, 0, THREE_QUARTERS),
    Placed("n2-b", N2, 1, THREE_QUARTERS),
    # N3: 8,138 free, all on GPU0.
    Placed("n3-a", N3, 0, HALF),
    Placed("n3-b", N3, 1, GPU),
    # N4: 12,207 / 8,138 / 4,069 / 16,276 free.
    Placed("n4-a", N4, 0, QUARTER, ours=True),
    Placed("n4-b", N4, 1, HALF, ours=True),
    Placed("n4-c", N4, 2, THREE_QUARTERS, ours=True),
]


def annotations_for(placed: Placed) -> dict[str, str]:
    """What a bind records for ``placed`` (Alibaba's formats; ours too when ``ours``)."""
    annotations = {
        "ALIYUN_COM_GPU_MEM_IDX": str(placed.gpu),
        "ALIYUN_COM_GPU_MEM_POD": str(placed.amount),
        "ALIYUN_COM_GPU_MEM_DEV": str(GPU),
        "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
        "ALIYUN_COM_GPU_MEM_ASSUME_TIME": str(time.time_ns()),
    }
    if placed.ours:
        document = {
            "node": placed.node,
            "unit": "MiB",
            "containers": [{"name": "main", "gpus": [placed.gpu], "share": placed.amount}],
        }
        annotations["gpushare.io/allocation"] = json.dumps(document, separators=(",", ":"))
    return annotations


def make_pod(
    name: str,
    gpu_mem: int,
    *,
    node: str | None = None,
    annotations: Mapping[str, str] | None = None,
    selector: Mapping[str, str] | None = None,
) -> Pod:
    limits = {"cpu": "100m", "memory": "64Mi", GPU_MEM: str(gpu_mem)}
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE, annotations=dict(annotations or {})),
        spec=PodSpec(
            schedulerName=SCHEDULER_NAME,
            nodeName=node,
            nodeSelector=dict(selector) if selector else None,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/live:0",
                    resources=ResourceRequirements(limits=limits),
                )
            ],
        ),
    )


@dataclass
class Live:
    """What the tests get: the admin client and the running extender."""

    kube: Client
    extender: ExtenderThread
    readyz_before_sync: list[int]

    def bound(self, name: str) -> Pod:
        """Wait until pod ``name`` is bound; return it."""

        def probe() -> Pod | None:
            pod = self.kube.get(Pod, name, namespace=NAMESPACE)
            return pod if pod.spec is not None and pod.spec.nodeName else None

        return wait_for(f"pod {name} bound", probe)

    def events(self, name: str, reason: str) -> list[Event]:
        """Wait until pod ``name`` has an Event with ``reason``; return those events."""

        def probe() -> list[Event] | None:
            found = [
                e
                for e in self.kube.list(
                    Event, namespace=NAMESPACE, fields={"involvedObject.name": name}
                )
                if e.reason == reason
            ]
            return found or None

        return wait_for(f"event {reason} on pod {name}", probe)

    def gpu_pods(self, node: str) -> dict[int, dict[str, tuple[int, bool]]]:
        """``/inspect/<node>``: GPU index → pod name → (MiB, bind in flight)."""
        status, report = self.extender.get(f"/gpushare-scheduler/inspect/{node}")
        assert status == 200, report
        return {
            dev["id"]: {p["name"]: (p["usedGPU"], p["bindInFlight"]) for p in dev["pods"]}
            for dev in report["devs"]
        }


@pytest.fixture(scope="module")
def live(control_plane: ControlPlane) -> Iterator[Live]:
    """Nodes, placed pods, the extender (synced) and a kube-scheduler that calls it."""
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(control_plane.client())
        a, b = {GROUP_LABEL: "design-a"}, {GROUP_LABEL: "design-b"}
        create_nodes(
            kube,
            [
                *(gpu_node(n, [GPU, GPU], unit=MemoryUnit.MIB, labels=a) for n in (N1, N2, N3)),
                gpu_node(N4, [GPU] * 4, unit=MemoryUnit.MIB, labels=b),
            ],
        )
        stack.callback(delete_nodes, kube, [N1, N2, N3, N4])
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        stack.callback(delete_namespace, kube, NAMESPACE)
        for placed in PLACED:
            kube.create(
                make_pod(
                    placed.name,
                    placed.amount,
                    node=placed.node,
                    annotations=annotations_for(placed),
                )
            )
        # The extender's identity may not list nodes yet: its caches cannot sync.
        kubeconfig = control_plane.service_account_kubeconfig(
            "gpushare-extender-live", "kube-system", [*EXTENDER_RULES]
        )
        # Alibaba's rule: the expected GPUs below are binpack's (the default is fgd-spare).
        options = LiveOptions(
            policy="binpack", backoff=Backoff(initial_s=0.05, max_s=0.5), access_log=False
        )
        extender = stack.enter_context(ExtenderThread(kubeconfig, options))
        before = [extender.get("/readyz")[0] for _ in range(3)]
        control_plane.service_account_token(
            "gpushare-extender-live", "kube-system", [READ_NODES, *EXTENDER_RULES]
        )
        wait_for("extender /readyz 200", lambda: extender.get("/readyz")[0] == 200 or None)
        stack.enter_context(
            control_plane.scheduler(
                "kube-scheduler-live",
                profiles=[{"schedulerName": SCHEDULER_NAME}],
                extenders=[gpushare_extender(extender.url_prefix)],
            )
        )
        yield Live(kube, extender, before)


def test_ready_after_sync_with_the_ledger_rebuilt(live: Live) -> None:
    assert live.readyz_before_sync == [503, 503, 503]
    assert live.extender.get("/readyz") == (200, {"ready": True})
    expected: dict[str, dict[int, dict[str, tuple[int, bool]]]] = {}
    for placed in PLACED:
        gpus = expected.setdefault(placed.node, {})
        gpus.setdefault(placed.gpu, {})[placed.name] = (placed.amount, False)
    for node, gpus in expected.items():
        report = live.gpu_pods(node)
        assert {i: pods for i, pods in report.items() if pods} == gpus, node


def test_pod_lands_on_n3_gpu0(live: Live) -> None:
    selector = {GROUP_LABEL: "design-a"}
    live.kube.create(make_pod("want-8138", HALF, selector=selector))
    pod = live.bound("want-8138")
    assert pod.spec is not None
    assert pod.metadata is not None
    assert pod.spec.nodeName == N3
    annotations = pod.metadata.annotations or {}
    assert annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0"
    assert annotations["ALIYUN_COM_GPU_MEM_POD"] == str(HALF)
    assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == str(GPU)
    assert annotations["ALIYUN_COM_GPU_MEM_ASSIGNED"] == "false"
    assert json.loads(annotations["gpushare.io/allocation"]) == {
        "node": N3,
        "unit": "MiB",
        "containers": [{"name": "main", "gpus": [0], "share": HALF}],
    }
    (event,) = live.events("want-8138", "GPUAssigned")
    assert event.type == "Normal"
    assert event.source is not None
    assert event.source.component == "gpushare-extender"
    assert f"bound to node {N3}: container main on GPU 0 ({HALF} MiB each)" in (event.message or "")
    # The watch brings the bound pod back: the allocation is committed, no longer assumed.
    wait_for(
        "want-8138 committed on N3 GPU0",
        lambda: live.gpu_pods(N3)[0].get("want-8138") == (HALF, False) or None,
    )

    # Another such pod fits nowhere: N1 and N3 fail kube-scheduler's own node-total check,
    # N2 (8,138 free in total) fails ours, with the numbers.
    live.kube.create(make_pod("want-8138-too", HALF, selector=selector))
    (failed, *_) = live.events("want-8138-too", "FailedScheduling")
    message = failed.message or ""
    assert "2 Insufficient aliyun.com/gpu-mem" in message, message
    assert (
        "gpushare: no GPU has enough free; container main; requested 8138; "
        "free/capacity per GPU 4069/16276, 4069/16276; unit MiB"
    ) in message, message
    pending = live.kube.get(Pod, "want-8138-too", namespace=NAMESPACE)
    assert pending.spec is not None
    assert not pending.spec.nodeName


def test_binpack_picks_gpu1(live: Live) -> None:
    live.kube.create(make_pod("binpack-8138", HALF, selector={"kubernetes.io/hostname": N4}))
    pod = live.bound("binpack-8138")
    assert pod.spec is not None
    assert pod.metadata is not None
    assert pod.spec.nodeName == N4
    assert (pod.metadata.annotations or {})["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    (event,) = live.events("binpack-8138", "GPUAssigned")
    assert "container main on GPU 1" in (event.message or "")
    wait_for(
        "binpack-8138 committed on N4 GPU1",
        lambda: live.gpu_pods(N4)[1].get("binpack-8138") == (HALF, False) or None,
    )
    status, report = live.extender.get("/gpushare-scheduler/inspect")
    assert status == 200
    assert report["violations"] == []


def test_finished_and_deleted_pods_release_their_gpus(live: Live) -> None:
    # A deleted pod frees its GPU: the pod left Pending above now fits N2's GPU1 alone.
    live.kube.delete(Pod, "n2-b", namespace=NAMESPACE, grace_period=0)
    pod = live.bound("want-8138-too")
    assert pod.spec is not None
    assert pod.metadata is not None
    assert pod.spec.nodeName == N2
    assert (pod.metadata.annotations or {})["ALIYUN_COM_GPU_MEM_IDX"] == "1"
    # A pod that finished (phase Succeeded) frees its GPU too.
    live.kube.patch(
        Pod.Status,
        "n1-a",
        {"status": {"phase": "Succeeded"}},
        namespace=NAMESPACE,
        patch_type=PatchType.MERGE,
    )
    wait_for("N1 GPU0 released", lambda: live.gpu_pods(N1)[0] == {} or None)
    status, report = live.extender.get("/gpushare-scheduler/inspect")
    assert status == 200
    assert report["violations"] == []


def test_the_command_serves_the_cluster_and_stops_on_sigterm(
    control_plane: ControlPlane, tmp_path: Path
) -> None:
    (port,) = free_ports(1)
    argv = gpushare_argv("extender")
    argv += ["--kubeconfig", str(control_plane.kubeconfig), "--host", "127.0.0.1"]
    proc = ManagedProcess("gpushare-extender", [*argv, "--port", str(port)], tmp_path)
    proc.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until(
            "gpushare extender /readyz", lambda: http_get(f"{url}/readyz")[0] == 200, WAIT_S,
            processes=[proc],
        )  # fmt: skip
        assert http_get(f"{url}/healthz") == (200, {"status": "ok"})
    finally:
        proc.stop()
    log = proc.log_path.read_text()
    assert "gpushare.extender.feed: synced:" in log, log
    assert "Finished server process" in log, log
