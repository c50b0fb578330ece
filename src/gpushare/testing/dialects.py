"""Pods written in the request dialects of the systems gpushare replaces (gpu-manager, its
fork, HAMi, Alibaba's cloud), as plain JSON the way kube-scheduler sends them and the API
server stores them: :func:`dialect_pod_json` for any of them, and gpu-manager's two README
pods (tkestack/gpu-manager ``README.md``, "Pod template example") as written there, save the
annotation (``annotations:`` with a quoted value; README pod 1 writes ``annotation:`` with an
unquoted number, which the API server does not keep: docs/compute.md)."""

from __future__ import annotations

import copy
import functools
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.model import Allocation, ContainerAllocation, Node
from gpushare.kube.codec import ALIYUN_ASSIGNED, MemoryUnit, allocation_annotations

__all__ = [
    "bound_dialect_pod",
    "dialect_pod_json",
    "gpu_manager_readme_pod_1",
    "gpu_manager_readme_pod_2",
    "table_pod",
]

IMAGE = "registry.invalid/gpushare/test:0"


def dialect_pod_json(
    name: str,
    containers: Mapping[str, Mapping[str, str | int]],
    *,
    namespace: str = "default",
    annotations: Mapping[str, str] | None = None,
    node: str | None = None,
    scheduler: str = "gpushare",
) -> dict[str, Any]:
    """Pod ``namespace/name`` whose containers (name → resource limits, also written as
    requests, numbers as quantity strings) are in spec order; ``node`` sets
    ``spec.nodeName`` (a bound pod)."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [
            {
                "name": container,
                "image": IMAGE,
                "resources": {
                    "limits": {k: str(v) for k, v in limits.items()},
                    "requests": {k: str(v) for k, v in limits.items()},
                },
            }
            for container, limits in containers.items()
        ],
    }
    if node is not None:
        spec["nodeName"] = node
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{namespace}/{name}")),
    }
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


table_pod = functools.partial(dialect_pod_json, "p", namespace="ns")
"""``table_pod(containers, annotations=...)``: :func:`dialect_pod_json` for pod ``ns/p``, the
one pod of a table-driven test's row."""


def gpu_manager_readme_pod_1(
    name: str = "vcuda", namespace: str = "default", *, scheduler: str = "gpushare"
) -> dict[str, Any]:
    """README pod 1: container ``nvidia`` with ``tencent.com/vcuda-core: 50`` and
    ``tencent.com/vcuda-memory: 30`` (30 × 256 MiB = 7,680 MiB), soft limit 50."""
    return dialect_pod_json(
        name,
        {"nvidia": {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 30}},
        namespace=namespace,
        annotations={"tencent.com/vcuda-core-limit": "50"},
        scheduler=scheduler,
    )


def gpu_manager_readme_pod_2(
    name: str = "vcuda-2", namespace: str = "default", *, scheduler: str = "gpushare"
) -> dict[str, Any]:
    """README pod 2: container ``nvidia`` with ``tencent.com/vcuda-core: 200`` (two whole
    GPUs) and ``tencent.com/vcuda-memory: 60`` (ignored at 100 and above)."""
    return dialect_pod_json(
        name,
        {"nvidia": {"tencent.com/vcuda-core": 200, "tencent.com/vcuda-memory": 60}},
        namespace=namespace,
        scheduler=scheduler,
    )


def bound_dialect_pod(
    pod: dict[str, Any],
    node: Node,
    containers: Sequence[ContainerAllocation],
    *,
    unit: MemoryUnit = MemoryUnit.GIB,
    assume_ns: int = 1,
    assigned: bool = True,
) -> dict[str, Any]:
    """``pod`` (a dict from :func:`dialect_pod_json`) bound to ``node`` with the annotations
    the extender writes for ``containers`` (``gpushare.io/allocation`` with compute and whole
    GPUs); started by the device plugin unless ``assigned`` is false."""
    allocation = Allocation(
        f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", node.name, tuple(containers)
    )
    annotations = allocation_annotations(allocation, node, now_ns=assume_ns, unit=unit)
    if assigned:
        annotations[ALIYUN_ASSIGNED] = "true"
    bound = copy.deepcopy(pod)
    bound["metadata"].setdefault("annotations", {}).update(annotations)
    bound["spec"]["nodeName"] = node.name
    return bound
