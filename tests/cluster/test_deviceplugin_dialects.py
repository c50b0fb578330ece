"""The device plugin daemon serving the request dialects (``--dialects tencent,hami``) against
the real API server, with the kubelet stand-in: the four resources registered, each on its own
socket; a health change reaches every one of them; gpu-manager's README pod and a HAMi pod,
bound as the extender binds them, get their GPUs from the pods the daemon watches (the pods
cache keeps the dialects' pods) and are recorded as started.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import tempfile
import time
from pathlib import Path
from typing import cast

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.core.model import ContainerAllocation, Gpu
from gpushare.core.model import Node as CoreNode
from gpushare.deviceplugin.daemon import DaemonOptions
from gpushare.deviceplugin.nvml import NvmlInventory
from gpushare.kube.codec import ALIYUN_ASSIGNED, GPU_MEM, GPUSHARE_LABEL
from gpushare.testing.controlplane import ControlPlane
from gpushare.testing.daemon import running_daemon
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json, gpu_manager_readme_pod_1
from gpushare.testing.kubelet import ResourceView
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node
from gpushare.testing.nvml import FakeDevice, FakeNvml

pytestmark = pytest.mark.cluster

WAIT_S = 30.0
GIB = 1 << 30
VCORE, VMEM, NVGPU = "tencent.com/vcuda-core", "tencent.com/vcuda-memory", "nvidia.com/gpu"
_names = itertools.count()


def allocatable_is(count: int, view: ResourceView) -> bool:
    return view.allocatable == count


def test_dialect_resources_are_served_follow_health_and_answer_their_pods(
    control_plane: ControlPlane, kube: Client
) -> None:
    name = f"dp-dialects-{next(_names)}-{int(time.time())}"
    namespace = "default"
    create_nodes(kube, [plain_node(name, labels={GPUSHARE_LABEL: "true"})])
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-dl-", dir="/tmp"))
    nvml = FakeNvml([FakeDevice(f"GPU-{name}-{i}", i, "Tesla-T4", 16 * GIB) for i in range(2)])
    core = CoreNode(name, (Gpu(0, "Tesla-T4", 16), Gpu(1, "Tesla-T4", 16)))
    tencent = bound_dialect_pod(
        gpu_manager_readme_pod_1(f"{name}-vcuda", namespace),
        core, [ContainerAllocation("nvidia", (1,), 8, 500)], assigned=False,
    )  # fmt: skip
    hami = bound_dialect_pod(
        dialect_pod_json(
            f"{name}-hami", {"cuda": {NVGPU: 1, "nvidia.com/gpumem": 2048}}, namespace=namespace
        ),
        core, [ContainerAllocation("cuda", (0,), 2)], assigned=False,
    )  # fmt: skip
    for pod in (tencent, hami):
        del pod["metadata"]["uid"]
        kube.create(cast(Pod, Pod.from_dict(pod)))
    expected = {GPU_MEM: 32, VCORE: 200, VMEM: 128, NVGPU: 20}

    async def scenario() -> None:
        options = DaemonOptions(
            node_name=name,
            socket_dir=socket_dir,
            recovery_s=1.0,
            metrics_port=None,
            node_config=False,
            unhealthy_configmap=False,
            dialects=("tencent", "hami"),
        )
        inventory = NvmlInventory(nvml)
        async with running_daemon(control_plane, inventory, options, nvml=nvml) as running:
            daemon, kubelet, _ = running
            for resource, count in expected.items():
                await kubelet.wait_for_devices(
                    resource, functools.partial(allocatable_is, count), WAIT_S
                )
            assert {r.endpoint for r in kubelet.registrations} == {
                "aliyungpushare.sock",
                "gpushare-vcuda-core.sock",
                "gpushare-vcuda-memory.sock",
                "gpushare-nvidia-gpu.sock",
            }

            answer = await kubelet.allocate(VMEM, size=30)
            assert dict(answer.container_responses[0].envs) == {}
            answer = await kubelet.allocate(VCORE, size=50)
            assert dict(answer.container_responses[0].envs) == {
                "NVIDIA_VISIBLE_DEVICES": f"GPU-{name}-1"
            }
            answer = await kubelet.allocate(NVGPU, size=1)
            envs = dict(answer.container_responses[0].envs)
            assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-{name}-0"
            assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"

            nvml.inject_xid(1, 79)  # every resource loses GPU 1's devices
            for resource, count in expected.items():
                await kubelet.wait_for_devices(
                    resource, functools.partial(allocatable_is, count // 2), WAIT_S
                )
            await daemon.allocator.drain_events()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
        for pod in (tencent, hami):
            stored = kube.get(Pod, pod["metadata"]["name"], namespace=namespace)
            assert stored.metadata is not None
            assert stored.metadata.annotations is not None
            assert stored.metadata.annotations[ALIYUN_ASSIGNED] == "true"
    finally:
        for pod in (tencent, hami):
            kube.delete(Pod, pod["metadata"]["name"], namespace=namespace, grace_period=0)
        delete_nodes(kube, [name])
