"""The control-plane fixture itself: fake GPU nodes as kwok keeps them, RBAC, and clean teardown."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Node, Pod

from gpushare.kube.codec import GPU_COUNT, GPU_MEM, INVENTORY
from gpushare.testing.controlplane import Binaries, ControlPlane, wait_for
from gpushare.testing.nodes import (
    FakeGpu,
    create_nodes,
    delete_nodes,
    fake_gpu_uuid,
    gpu_node,
    plain_node,
)

pytestmark = pytest.mark.cluster


def test_fake_gpu_node_keeps_its_resources_and_inventory(kube: Client) -> None:
    gpus = [FakeGpu(0, 16), FakeGpu(1, 16, healthy=False), FakeGpu(2, 32, model="A100-SXM4-32GB")]
    try:
        (node,) = create_nodes(kube, [gpu_node("fake-gpu-node", gpus, cpu="8")])
        assert node.metadata is not None
        assert node.status is not None
        assert (node.metadata.labels or {})["gpushare"] == "true"
        assert node.status.capacity is not None
        assert node.status.allocatable is not None
        assert node.status.capacity[GPU_MEM] == "64"
        assert node.status.capacity[GPU_COUNT] == "3"
        assert node.status.allocatable[GPU_MEM] == "48"
        assert node.status.allocatable[GPU_COUNT] == "2"
        assert node.status.allocatable["cpu"] == "8"
        inventory = json.loads((node.metadata.annotations or {})[INVENTORY])
        assert inventory == {
            "unit": "GiB",
            "gpus": [
                {
                    "index": 0,
                    "uuid": fake_gpu_uuid("fake-gpu-node", 0),
                    "model": "Tesla-V100-SXM2-16GB",
                    "memory": 16,
                    "healthy": True,
                },
                {
                    "index": 1,
                    "uuid": fake_gpu_uuid("fake-gpu-node", 1),
                    "model": "Tesla-V100-SXM2-16GB",
                    "memory": 16,
                    "healthy": False,
                },
                {
                    "index": 2,
                    "uuid": fake_gpu_uuid("fake-gpu-node", 2),
                    "model": "A100-SXM4-32GB",
                    "memory": 32,
                    "healthy": True,
                },
            ],
        }
    finally:
        delete_nodes(kube, ["fake-gpu-node"])


def test_default_scheduler_places_a_pod_that_kwok_runs(kube: Client) -> None:
    pod = Pod(
        metadata=ObjectMeta(name="plain-pod", namespace="default"),
        spec=PodSpec(containers=[Container(name="main", image="registry.invalid/plain:0")]),
    )
    try:
        create_nodes(kube, [plain_node("plain-node")])
        kube.create(pod)
        last: list[Pod] = []

        def running() -> Pod | None:
            last[:] = [kube.get(Pod, "plain-pod", namespace="default")]
            assert last[0].spec is not None
            assert last[0].status is not None
            return last[0] if last[0].status.phase == "Running" else None

        current = wait_for("pod plain-pod Running", running, 60, detail=lambda: last[0].status)
        assert current.spec is not None
        assert current.status is not None
        assert current.spec.nodeName == "plain-node"
        assert current.status.podIP
    finally:
        kube.delete(Pod, "plain-pod", namespace="default", grace_period=0)
        delete_nodes(kube, ["plain-node"])


def test_rbac_limits_a_service_account(control_plane: ControlPlane) -> None:
    kubeconfig = control_plane.service_account_kubeconfig(
        "node-reader",
        "kube-system",
        [PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["get", "list"])],
    )
    with control_plane.client(kubeconfig) as client:
        list(client.list(Node))
        with pytest.raises(ApiError) as denied:
            list(client.list(Pod, namespace="kube-system"))
    assert denied.value.status.code == 403


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone once reaped, which stop() does.
    return Path(f"/proc/{pid}").exists()


def test_teardown_on_failure_leaves_nothing_behind(tmp_path: Path) -> None:
    """A second, independent control plane: an exception inside it still stops everything."""
    plane = ControlPlane(Binaries.locate(), log_dir=tmp_path / "logs")
    pids: list[int | None] = []

    def run_and_fail() -> None:
        with plane:
            pids.extend(p.pid for p in plane.processes.values())
            assert len(pids) == 4
            assert all(pid is not None and _alive(pid) for pid in pids)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run_and_fail()
    assert not any(pid is not None and _alive(pid) for pid in pids)
    assert not plane.root.exists()
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == [
        "etcd.log",
        "kube-apiserver.log",
        "kube-scheduler.log",
        "kwok.log",
    ]
