"""Pods written for gpu-manager and HAMi start unchanged on a real node: the real
kube-scheduler with ``gpushare extender`` (the dialects' resources in its ``managedResources``),
the real kubelet and containerd, ``gpushare device-plugin --dialects tencent,hami`` (fake GPUs).
kubelet admits them only because the plugin advertises ``tencent.com/vcuda-core``,
``tencent.com/vcuda-memory`` and ``nvidia.com/gpu``, calls Allocate on each, and every started
container's environment (``kubectl logs`` of a container printing ``env``) names the GPU(s)
the extender recorded on its pod, with the variables of its own system.
"""

from __future__ import annotations

from typing import Any

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Node

from gpushare.kube.codec import node_info, pod_allocation
from gpushare.testing.dialects import (
    dialect_pod_json,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.node.gpu import SCHEDULER_NAME, GpuStack, container_env, runnable
from gpushare.testing.node.waits import running

pytestmark = pytest.mark.node


CASES = {
    "gpu-manager-readme-pod-1-vcuda-core-50-memory-30": (
        gpu_manager_readme_pod_1("vcuda", scheduler=SCHEDULER_NAME),
        {"nvidia": 1},
        {},
    ),
    "gpu-manager-readme-pod-2-two-whole-gpus": (
        gpu_manager_readme_pod_2("vcuda-2", scheduler=SCHEDULER_NAME),
        {"nvidia": 2},
        {},
    ),
    "hami-one-gpu-3000-mib-30-percent": (
        dialect_pod_json(
            "hami",
            {"cuda": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}},
            scheduler=SCHEDULER_NAME,
        ),
        {"cuda": 1},
        {"CUDA_DEVICE_MEMORY_LIMIT_0": "3072m", "CUDA_DEVICE_SM_LIMIT": "30"},
    ),
}


@pytest.mark.parametrize(("written", "gpus", "variables"), CASES.values(), ids=list(CASES))
def test_a_dialect_pod_starts_unchanged_with_its_gpu_env(
    gpu_stack: GpuStack,
    kube: Client,
    namespace: str,
    *,
    written: dict[str, Any],
    gpus: dict[str, int],
    variables: dict[str, str],
) -> None:
    name = written["metadata"]["name"]
    kube.create(runnable(written, namespace))
    pod = running(kube, namespace, name)
    allocation = pod_allocation(pod.to_dict())
    assert allocation is not None
    uuids = node_info(kube.get(Node, gpu_stack.node.name).to_dict()).uuids
    for container in allocation.containers:
        env = container_env(kube, name, namespace, container.container)
        assert len(container.gpu_indices) == gpus[container.container]
        expected = ",".join(uuids[g] for g in container.gpu_indices)
        assert env.get("NVIDIA_VISIBLE_DEVICES") == expected, env
        assert {k: env.get(k) for k in variables} == variables
        assert "ALIYUN_COM_GPU_MEM_IDX" not in env
