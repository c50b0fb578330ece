"""Which pods the extender's watch and ``kubectl inspect gpushare`` keep (``requests_gpu``):
every pod naming a GPU resource of any dialect gpushare reads, in any container, limits or
requests; no other pod."""

from __future__ import annotations

from typing import Any

import pytest
from lightkube.resources.core_v1 import Pod

from gpushare.kube.cache import requests_gpu, requests_gpu_mem
from gpushare.testing.dialects import dialect_pod_json

CASES = [
    ("Alibaba's gpu-mem", {"aliyun.com/gpu-mem": 4}, True),
    ("gpu-manager's vcuda-core", {"tencent.com/vcuda-core": 100}, True),
    ("the fork's vcuda-memory", {"nvidia.com/vcuda-core": 10, "nvidia.com/vcuda-memory": 9}, True),
    ("HAMi's nvidia.com/gpu", {"nvidia.com/gpu": 1}, True),
    ("HAMi's gpumem alone", {"nvidia.com/gpumem": 1024}, True),
    ("Alibaba cloud's compute percentage", {"aliyun.com/gpu-core.percentage": 30}, True),
    ("CPU only", {"cpu": "1"}, False),
    ("another vendor's GPU", {"amd.com/gpu": 1}, False),
]


@pytest.mark.parametrize(("limits", "kept"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_pods_asking_a_gpu_in_any_dialect_are_kept(limits: dict[str, Any], kept: bool) -> None:
    pod = Pod.from_dict(dialect_pod_json("p", {"main": {"cpu": "100m", **limits}}))
    assert isinstance(pod, Pod)
    assert requests_gpu(pod) is kept
    assert requests_gpu_mem(pod) is ("aliyun.com/gpu-mem" in limits)  # the device plugin's


def test_an_init_container_asking_a_dialect_resource_is_kept() -> None:
    document = dialect_pod_json("p", {"main": {"cpu": "100m"}})
    document["spec"]["initContainers"] = [
        {"name": "init", "resources": {"requests": {"tencent.com/vcuda-core": "50"}}}
    ]
    pod = Pod.from_dict(document)
    assert isinstance(pod, Pod)
    assert requests_gpu(pod)
