"""Fake GPU-share nodes for the cluster tests: kwok nodes that look like gpushare nodes.

A node built by :func:`gpu_node` carries what a memory-shared node carries in a real cluster
once our device plugin has registered (docs/design.md, "Units" and "Node modes"):

* label ``gpushare=true`` (the Alibaba-compatible node label), plus ``type=kwok``;
* annotation ``kwok.x-k8s.io/node: fake``, so that kwok manages it (Ready, heartbeats, and
  pods bound to it become Running);
* ``status.capacity``: ``cpu``, ``memory``, ``pods``, ``aliyun.com/gpu-mem`` = the sum of every
  GPU's memory in the node's unit, ``aliyun.com/gpu-count`` = the number of GPUs;
* ``status.allocatable``: the same, except that ``aliyun.com/gpu-mem`` and
  ``aliyun.com/gpu-count`` count only healthy GPUs (as the kubelet does for unhealthy devices);
* annotation ``gpushare.io/gpu-inventory``: the per-GPU inventory, the node's memory unit
  included, as compact JSON::

      {"unit": "GiB",
       "gpus": [{"index": 0, "uuid": "GPU-...", "model": "Tesla-V100-SXM2-16GB",
                 "memory": 16, "healthy": true}, ...]}

  ``unit`` is ``"GiB"`` or ``"MiB"``; ``memory`` is the whole GPU in that unit (an integer);
  ``index`` is the device index (NVML order, 0..n-1); ``uuid`` is the NVML UUID (fakes derive a
  stable one from the node name and index); ``healthy`` is false for a GPU that takes no new
  allocations. The extender and the inspect tool read the unit and the per-GPU capacities from
  here; a node without the annotation (an Alibaba device plugin) falls back to
  ``gpu-mem ÷ gpu-count``.

:func:`plain_node` builds a kwok node without GPUs (a node that must never receive a
``aliyun.com/gpu-mem`` pod), :func:`create_nodes` creates nodes and waits until kwok reports
them Ready.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import NodeSpec, NodeStatus, Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node

from gpushare.core.serves import Serves
from gpushare.deviceplugin.dialects import DEFAULT_SPLIT_COUNT, resources_for
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.kube.codec import (
    GPU_COUNT,
    GPU_MEM,
    GPUSHARE_LABEL,
    INVENTORY,
    InventoryGpu,
    MemoryUnit,
)
from gpushare.kube.codec import inventory_annotation as encode_inventory
from gpushare.kube.codec.nodeconfig import NODE_CONFIG_KEY
from gpushare.testing.controlplane import (
    KWOK_NODE_ANNOTATION,
    KWOK_NODE_ANNOTATION_VALUE,
    wait_until,
)

DEFAULT_MODEL = "Tesla-V100-SXM2-16GB"
_UUID_NAMESPACE = uuid.UUID("6f1d5c1e-93b5-4a4b-9c1e-2f6b0c1d9a77")


@dataclass(frozen=True)
class FakeGpu:
    """One GPU of a fake node; ``memory`` is in the node's unit."""

    index: int
    memory: int
    model: str = DEFAULT_MODEL
    uuid: str = ""
    healthy: bool = True

    def inventory_gpu(self, node_name: str) -> InventoryGpu:
        """This GPU as the codec's inventory entry (a stable fake UUID when none is set)."""
        gpu_uuid = self.uuid or fake_gpu_uuid(node_name, self.index)
        return InventoryGpu(self.index, gpu_uuid, self.model, self.memory, self.healthy)

    def to_json(self, node_name: str) -> dict[str, object]:
        """This GPU's entry of the inventory annotation (``InventoryGpu.to_json``)."""
        return self.inventory_gpu(node_name).to_json()


def fake_gpu_uuid(node_name: str, index: int) -> str:
    """A stable NVML-style UUID (``GPU-<uuid>``) for GPU ``index`` of ``node_name``."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node_name}/{index}')}"


def inventory_annotation(
    node_name: str,
    gpus: Sequence[FakeGpu],
    unit: MemoryUnit = MemoryUnit.GIB,
    serves: Serves = Serves.BOTH,
) -> str:
    """The ``gpushare.io/gpu-inventory`` value for ``gpus`` (see the module docstring); the
    codec's encoder (``gpushare.kube.codec.inventory_annotation``), so ``ValueError`` for a bad
    unit, repeated indices or memory <= 0. ``serves``: what the node serves
    (docs/node-config.md)."""
    return encode_inventory(unit, [g.inventory_gpu(node_name) for g in gpus], serves)


def _as_gpus(gpus: Sequence[int | FakeGpu], model: str) -> list[FakeGpu]:
    result: list[FakeGpu] = []
    for i, g in enumerate(gpus):
        result.append(g if isinstance(g, FakeGpu) else FakeGpu(index=i, memory=g, model=model))
    if sorted(g.index for g in result) != list(range(len(result))):
        raise ValueError(f"GPU indices must be 0..{len(result) - 1}: {result}")
    if any(g.memory <= 0 for g in result):
        raise ValueError(f"GPU memory must be > 0: {result}")
    return result


def _kwok_node(
    name: str,
    *,
    capacity: Mapping[str, str],
    allocatable: Mapping[str, str],
    labels: Mapping[str, str],
    annotations: Mapping[str, str],
    taints: Sequence[Taint] = (),
) -> Node:
    return Node(
        metadata=ObjectMeta(
            name=name,
            labels={"type": "kwok", "kubernetes.io/hostname": name, **labels},
            annotations={KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE, **annotations},
        ),
        spec=NodeSpec(taints=list(taints)) if taints else None,
        status=NodeStatus(capacity=dict(capacity), allocatable=dict(allocatable)),
    )


def gpu_node(
    name: str,
    gpus: Sequence[int | FakeGpu],
    *,
    unit: MemoryUnit = MemoryUnit.GIB,
    model: str = DEFAULT_MODEL,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    serves: Serves = Serves.BOTH,
    dialects: Sequence[str] = (),
    split_count: int = DEFAULT_SPLIT_COUNT,
    taints: Sequence[Taint] = (),
) -> Node:
    """A kwok GPU-share node; ``gpus`` are per-GPU memories in ``unit`` (or :class:`FakeGpu`);
    ``serves`` the kinds of request its inventory says it serves; ``dialects`` (``tencent``,
    ``hami``) adds the devices ``gpushare device-plugin --dialects ... --split-count
    split_count`` advertises for them (``deviceplugin.dialects.resources_for``); ``taints``
    keep pods without a toleration off the node.

    >>> gpu_node("n1", [16, 16]).status.capacity["aliyun.com/gpu-mem"]
    '32'
    >>> gpu_node("n1", [16, 16], dialects=["hami"], split_count=4).status.allocatable[
    ...     "nvidia.com/gpu"]
    '8'
    """
    devices = _as_gpus(gpus, model)
    healthy = [g for g in devices if g.healthy]
    base = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    served = resources_for(dialects, split_count)

    def advertised(among: Sequence[FakeGpu]) -> dict[str, str]:
        physical = [
            PhysicalGpu(g.index, g.uuid, g.index, g.model, g.memory * unit.mib) for g in among
        ]
        return {
            r.resource: str(sum(r.per_gpu(p) for p in physical))
            for r in served
            if r.per_gpu is not None
        }

    return _kwok_node(
        name,
        capacity={
            **base,
            GPU_MEM: str(sum(g.memory for g in devices)),
            GPU_COUNT: str(len(devices)),
            **advertised(devices),
        },
        allocatable={
            **base,
            GPU_MEM: str(sum(g.memory for g in healthy)),
            GPU_COUNT: str(len(healthy)),
            **advertised(healthy),
        },
        labels={GPUSHARE_LABEL: "true", **(labels or {})},
        annotations={
            INVENTORY: inventory_annotation(name, devices, unit, serves),
            **(annotations or {}),
        },
        taints=taints,
    )


def plain_node(
    name: str,
    *,
    cpu: str = "32",
    memory: str = "256Gi",
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
) -> Node:
    """A kwok node without GPUs and without the ``gpushare`` label."""
    resources = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return _kwok_node(
        name, capacity=resources, allocatable=resources, labels=labels or {}, annotations={}
    )


def _is_ready(node: Node) -> bool:
    conditions = node.status.conditions if node.status is not None else None
    return any(c.type == "Ready" and c.status == "True" for c in conditions or ())


def create_nodes(client: Client, nodes: Iterable[Node], *, timeout: float = 60.0) -> list[Node]:
    """Create ``nodes`` and wait until kwok has made every one Ready; return them as read back."""
    names: list[str] = []
    for node in nodes:
        if node.metadata is None or not node.metadata.name:
            raise ValueError("every node needs metadata.name")
        client.create(node)
        names.append(node.metadata.name)
    pending = list(names)
    ready: dict[str, Node] = {}

    def all_ready() -> bool:
        for name in list(pending):
            current = client.get(Node, name)
            if _is_ready(current):
                ready[name] = current
                pending.remove(name)
        return not pending

    wait_until(
        "kwok to make the nodes Ready",
        all_ready,
        timeout,
        detail=lambda: f"not Ready: {', '.join(pending)}",
    )
    return [ready[n] for n in names]


def delete_nodes(client: Client, names: Iterable[str]) -> None:
    """Delete nodes, ignoring those already gone."""
    for name in names:
        try:
            client.delete(Node, name)
        except ApiError as exc:
            if exc.status.code != 404:
                raise


def apply_node_config(kube: Client, name: str, text: str, namespace: str = "kube-system") -> None:
    """Create or replace the node-configuration ConfigMap ``namespace/name`` with ``text`` as
    its ``config.yaml`` (docs/node-config.md), by server-side apply."""
    kube.apply(
        ConfigMap(
            metadata=ObjectMeta(name=name, namespace=namespace), data={NODE_CONFIG_KEY: text}
        ),
        field_manager="test",
        force=True,
    )
