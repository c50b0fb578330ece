"""GPU-memory pods for cluster tests and benchmarks: pods already bound to a node, carrying the
allocation annotations the extender writes at bind (``gpushare.kube.codec``), so that the device
plugin's Allocate has something to resolve without a scheduler in the loop; and
:func:`delete_namespace`, a test namespace's clean-up on a control plane without
kube-controller-manager; :func:`placed_pod_json`, such a pod as the JSON a pods cache holds;
:func:`unschedulable`, the scheduler's reason a pod waits; :func:`pod_states`, what a timed-out
wait on a namespace's pods reports; :func:`with_condition`, a pod JSON carrying a condition."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.core.model import Allocation, ContainerAllocation, Node
from gpushare.kube.codec import GPU_COUNT_ANNOTATION, GPU_MEM, MemoryUnit, allocation_annotations

__all__ = [
    "bound_gpu_pod",
    "delete_namespace",
    "placed_pod_json",
    "pod_states",
    "unschedulable",
    "with_condition",
]

IMAGE = "registry.invalid/gpushare/test:0"


def bound_gpu_pod(
    namespace: str,
    name: str,
    node: Node,
    containers: Sequence[tuple[str, tuple[int, ...], int]],
    *,
    assume_ns: int,
    unit: MemoryUnit = MemoryUnit.GIB,
) -> Pod:
    """Pod ``namespace/name`` bound to ``node`` (``spec.nodeName``) whose GPU containers are
    (name, GPU indices, share per GPU) in spec order; each asks share × GPUs of
    ``aliyun.com/gpu-mem``, several GPUs through ``gpushare.io/gpu-count``. The annotations are
    exactly the extender's, assumed at ``assume_ns`` (nanoseconds since the epoch)."""
    allocation = Allocation(
        f"{namespace}/{name}",
        node.name,
        tuple(ContainerAllocation(c, gpus, share) for c, gpus, share in containers),
    )
    annotations = allocation_annotations(allocation, node, now_ns=assume_ns, unit=unit)
    counts = {c: len(gpus) for c, gpus, _ in containers if len(gpus) > 1}
    if counts:
        annotations[GPU_COUNT_ANNOTATION] = json.dumps(counts)
    return Pod(
        metadata=ObjectMeta(name=name, namespace=namespace, annotations=annotations),
        spec=PodSpec(
            nodeName=node.name,
            containers=[
                Container(
                    name=c,
                    image=IMAGE,
                    resources=ResourceRequirements(limits={GPU_MEM: str(share * len(gpus))}),
                )
                for c, gpus, share in containers
            ],
        ),
    )


def delete_namespace(kube: Client, namespace: str) -> None:
    """Delete every pod of ``namespace`` outright (grace period 0), then the Namespace. With no
    kube-controller-manager (the kwok tier) nothing else would remove the pods; the Namespace
    itself stays Terminating, but the GPUs its pods held are free."""
    for pod in kube.list(Pod, namespace=namespace):
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        kube.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
    kube.delete(Namespace, namespace)


def placed_pod_json(
    name: str,
    node: str,
    placed: Mapping[int, int] | None,
    *,
    phase: str = "Running",
    namespace: str = "ns",
) -> dict[str, Any]:
    """Pod ``namespace/name`` (UID ``name``) on ``node`` as JSON: one container per entry of
    ``placed`` (GPU index → GiB), each asking its GiB of ``aliyun.com/gpu-mem``, with the
    allocation annotation the extender writes; ``None``: not placed yet (one container asking
    1 GiB, no annotation)."""
    annotations: dict[str, str] = {}
    if placed:
        containers = [
            {"name": f"c{i}", "gpus": [gpu], "share": units}
            for i, (gpu, units) in enumerate(placed.items())
        ]
        annotations["gpushare.io/allocation"] = json.dumps(
            {"node": node, "unit": "GiB", "containers": containers}
        )
    return {
        "metadata": {"name": name, "namespace": namespace, "uid": name, "annotations": annotations},
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {GPU_MEM: str(units)}}}
                for i, units in enumerate((placed or {1: 1}).values())
            ],
        },
        "status": {"phase": phase},
    }


def with_condition(
    pod: Mapping[str, Any],
    kind: str,
    status: str,
    reason: str = "",
    message: str = "",
    *,
    since: str = "2026-11-28T00:00:00Z",
) -> dict[str, Any]:
    """A copy of pod JSON ``pod`` whose ``status.conditions`` holds this condition (replacing
    one of the same type), as kube-scheduler writes ``PodScheduled``."""
    entry = {"type": kind, "status": status, "lastTransitionTime": since}
    entry |= {k: v for k, v in (("reason", reason), ("message", message)) if v}
    status_json = dict(pod.get("status") or {})
    kept = [c for c in status_json.get("conditions") or [] if c.get("type") != kind]
    status_json["conditions"] = [*kept, entry]
    return {**pod, "status": status_json}


def unschedulable(kube: Client, namespace: str, name: str) -> str | None:
    """The scheduler's message once pod ``name`` is marked unschedulable (``PodScheduled``
    false), ``None`` before."""
    pod = kube.get(Pod, name, namespace=namespace)
    for condition in (pod.status.conditions or []) if pod.status else []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return condition.message or ""
    return None


def pod_states(kube: Client, namespace: str) -> list[str]:
    """Each pod of ``namespace``: ``name: <phase> on <node>; [<PodScheduled status reason
    message>]``, what a timed-out wait on them reports (``wait_for``'s ``detail``)."""
    states = []
    for pod in kube.list(Pod, namespace=namespace):
        status, spec = pod.status, pod.spec
        conditions = [
            f"{c.status} {c.reason or ''} {c.message or ''}".strip()
            for c in ((status.conditions or []) if status else [])
            if c.type == "PodScheduled"
        ]
        name = pod.metadata.name if pod.metadata else "?"
        node = spec.nodeName if spec else None
        states.append(f"{name}: {status.phase if status else None} on {node}; {conditions}")
    return states
