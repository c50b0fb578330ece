"""GPU-memory pods for cluster tests and benchmarks: pods already bound to a node, carrying the
allocation annotations the extender writes at bind (``gpushare.kube.codec``), so that the device
plugin's Allocate has something to resolve without a scheduler in the loop; and
:func:`delete_namespace`, a test namespace's clean-up on a control plane without
kube-controller-manager."""

from __future__ import annotations

import json
from collections.abc import Sequence

from lightkube import Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.core.model import Allocation, ContainerAllocation, Node
from gpushare.kube.codec import GPU_COUNT_ANNOTATION, GPU_MEM, MemoryUnit, allocation_annotations

__all__ = ["bound_gpu_pod", "delete_namespace"]

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
