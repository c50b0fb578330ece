"""Every dialect at once on a real node (docs/compute.md): Alibaba shares, a
``gpushare.io/exclusive`` pod asking less ``gpu-mem`` than a GPU, gpu-manager and HAMi shares,
gpu-manager's whole GPU, all created in one burst on the node of two fake 16 GiB GPUs
(``gpu_stack``: the real kube-scheduler, ``gpushare extender``, the real kubelet and
containerd, ``gpushare device-plugin --dialects tencent,hami``).

Two Tencent pods ask the same ``vcuda-core`` with different memory, and two HAMi pods one
``nvidia.com/gpu`` each with different memory: the device plugin tells each pair apart only by
the order kubelet admits them, so the extender's handshake rule must keep them on one GPU or
make one wait (docs/compute.md, "The handshake rule"). Judged after the burst settles: every
started container's ``NVIDIA_VISIBLE_DEVICES`` names the GPUs on its pod's record; from the
records alone (``gpushare.testing.outcome2d``) no GPU is above capacity in memory or compute,
none held whole holds anything else, and the one Pending pod fits nowhere; no pod failed at
admission (``UnexpectedAdmissionError``).
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node, Pod

from gpushare.kube.codec import MemoryUnit, node_info, pod_allocation
from gpushare.testing.controlplane import wait_for
from gpushare.testing.dialects import dialect_pod_json
from gpushare.testing.node.gpu import SCHEDULER_NAME, GpuStack, container_env, runnable
from gpushare.testing.node.waits import WAIT_S, is_running
from gpushare.testing.outcome2d import (
    Basis,
    DialectAsk,
    DialectSpec,
    NodeGpus,
    judge_dialects,
    read_dialect_outcome,
)
from gpushare.testing.pods import pod_states

pytestmark = pytest.mark.node

SPECS = [
    DialectSpec("ali-4", "alibaba", {"main": {"aliyun.com/gpu-mem": 4}},
                (DialectAsk("main", 1, 4),)),
    DialectSpec("tencent-a", "tencent-share",
                {"main": {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8}},
                (DialectAsk("main", 1, 8 * 256, Basis.MIB, 200),)),
    DialectSpec("tencent-b", "tencent-share",
                {"main": {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 16}},
                (DialectAsk("main", 1, 16 * 256, Basis.MIB, 200),)),
    DialectSpec("hami-a", "hami-mib",
                {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048,
                          "nvidia.com/gpucores": 20}},
                (DialectAsk("main", 1, 2048, Basis.MIB, 200),)),
    DialectSpec("hami-b", "hami-mib",
                {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                          "nvidia.com/gpucores": 20}},
                (DialectAsk("main", 1, 3000, Basis.MIB, 200),)),
    # Whole GPUs, after the shares: one of the two takes the GPU the shares left empty.
    DialectSpec("ali-exclusive", "exclusive", {"main": {"aliyun.com/gpu-mem": 4}},
                (DialectAsk("main", 1, 0, whole=True),), {"gpushare.io/exclusive": "true"}),
    DialectSpec("tencent-whole", "tencent-whole", {"main": {"tencent.com/vcuda-core": 100}},
                (DialectAsk("main", 1, 0, whole=True),)),
]  # fmt: skip
BY_NAME = {spec.name: spec for spec in SPECS}
EQUAL_TO_THE_PLUGIN = [("tencent-a", "tencent-b"), ("hami-a", "hami-b")]


def settled(kube: Client, namespace: str) -> Mapping[str, Pod] | None:
    """The pods once each is running or unbound with a scheduling failure; ``None`` before."""
    pods = {
        p.metadata.name: p
        for p in kube.list(Pod, namespace=namespace)
        if p.metadata and p.metadata.name
    }
    for pod in pods.values():
        if pod.status is not None and pod.status.phase == "Failed":
            raise AssertionError(f"pod {pod.metadata and pod.metadata.name} failed: {pod.status}")
        bound = pod.spec is not None and pod.spec.nodeName
        if bound and not is_running(pod):
            return None
    unbound = [p for p in pods.values() if not (p.spec and p.spec.nodeName)]
    return pods if len(pods) == len(SPECS) and len(unbound) <= 1 else None


def test_every_dialect_at_once_starts_with_its_own_gpus_and_no_overcommit(
    gpu_stack: GpuStack, kube: Client, namespace: str
) -> None:
    for spec in SPECS:
        body = dialect_pod_json(
            spec.name, spec.limits, scheduler=SCHEDULER_NAME, annotations=spec.annotations or None
        )
        kube.create(runnable(body, namespace))
    pods = wait_for(
        "the burst settled",
        lambda: settled(kube, namespace),
        WAIT_S,
        detail=lambda: pod_states(kube, namespace),
    )
    node = gpu_stack.node.name
    running = sorted(name for name, pod in pods.items() if pod.spec and pod.spec.nodeName)
    pending = sorted(set(pods) - set(running))
    # The shares fill GPU 0; one whole-GPU pod takes GPU 1, the other has none left.
    assert len(running) == len(SPECS) - 1, (running, pending)
    assert pending in (["ali-exclusive"], ["tencent-whole"]), pending
    for first, second in EQUAL_TO_THE_PLUGIN:
        assert {first, second} <= set(running)

    uuids = node_info(kube.get(Node, node).to_dict()).uuids
    for name in running:
        allocation = pod_allocation(pods[name].to_dict())
        assert allocation is not None, name
        for container in allocation.containers:
            env = container_env(kube, name, namespace, container.container)
            expected = ",".join(uuids[g] for g in container.gpu_indices)
            assert env.get("NVIDIA_VISIBLE_DEVICES") == expected, (name, env)

    nodes = {node: NodeGpus(MemoryUnit.GIB, (16, 16))}
    outcome = read_dialect_outcome(kube, namespace, BY_NAME, nodes)
    assert sorted(outcome.bound) == running
    assert judge_dialects(outcome, BY_NAME, nodes) == []
    gpu_stack.check_ledger(kube)
