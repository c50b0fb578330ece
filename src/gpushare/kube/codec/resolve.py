"""A dialect's GPU memory in the node's unit, for one node (``resolve``). Pure; no I/O.

``pod_request`` reads memory written in another system's dialect as it is written: MiB
(gpu-manager's ``vcuda-memory``, HAMi's ``gpumem``) or a percentage of each GPU (HAMi's
``gpumem-percentage``, and HAMi's default of the whole memory), recorded in
``ContainerRequest.memory_basis``. The core places only requests in the node's unit, so the
extender resolves such a request against each candidate node before the fit (filter,
prioritize) and against the chosen node at bind:

* **MiB** on a MiB node: as written; on a GiB node: **rounded up** to whole GiB (4,097 MiB is
  5 GiB), so a container never gets less than it asked. A node whose unit is unknown (no
  ``gpushare.io/gpu-inventory`` annotation: Alibaba's capacity fallback) cannot take it.
* **Percent** of each GPU: of the largest GPU capacity the container may use on that node (its
  allowed models; all GPUs when none is allowed, for the fit to say so), **rounded up**. On a
  node whose GPUs differ in size a container may then fit only the larger ones: it never gets
  less than its share of the GPU it lands on.

GPU types (HAMi's ``nvidia.com/use-gputype``/``nouse-gputype``, ``ContainerRequest.gpu_types``)
are resolved first: the node's GPU models that contain one of the types asked (any case) and
none of those excluded become the container's ``allowed_models`` (within any it had); a node
with none of them cannot take the pod (``NO_GPU_TYPE``), as HAMi's filter says.

A request already in the node's unit (every ``aliyun.com/gpu-mem`` pod) is returned as it is,
the same object.

``on_node`` is the whole rule for a request on one node before any fit: refused when the node
does not serve its kind of request (``gpushare.core.serves``: whole GPUs, shares, or both),
else resolved. The extender's filter, prioritize and bind and the inspect report all call it,
so they refuse the same pods with the same sentence.
"""

from __future__ import annotations

from dataclasses import replace
from typing import NamedTuple

from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.core.serves import Serves, serves_refusal
from gpushare.kube.codec.common import INVENTORY, MemoryUnit
from gpushare.kube.codec.dialects import MemoryBasis

__all__ = [
    "MIB_BASIS",
    "NOT_SERVED",
    "NO_GPU_TYPE",
    "PERCENT_BASIS",
    "UNRESOLVED",
    "NotOnNode",
    "gpu_types_on",
    "on_node",
    "resolve",
]

MIB_BASIS: str = MemoryBasis.MIB
"""``ContainerRequest.memory_basis`` of memory asked in MiB."""
PERCENT_BASIS: str = MemoryBasis.PERCENT
"""``ContainerRequest.memory_basis`` of memory asked in percent of each GPU's memory."""
NOT_SERVED = "the node does not serve this kind of request"
"""``NotOnNode.why`` of a pod asking whole GPUs of a ``shared`` node, or a share of a ``whole``
node (``gpushare.core.serves``)."""
UNRESOLVED = "memory not resolvable into the node's unit"
"""``NotOnNode.why`` of a pod whose memory cannot be put in the node's unit (MiB on a node of
unknown unit, percent on a node without GPUs)."""


NO_GPU_TYPE = "no GPU of the types the pod asks"
"""``NotOnNode.why`` of a pod whose ``nvidia.com/use-gputype``/``nouse-gputype`` leave it no GPU
model of the node."""


class NotOnNode(NamedTuple):
    """Why a request can never be on a node: ``why``, the fixed reason (``NOT_SERVED``,
    ``UNRESOLVED``), and ``text``, the sentence with the names."""

    why: str
    text: str


def on_node(
    request: PodRequest, unit: MemoryUnit | None, node: Node, serves: Serves
) -> PodRequest | NotOnNode:
    """``request`` as node ``node`` (memory unit ``unit``, ``None``: unknown; serving
    ``serves``) can place it (module doc): ``NotOnNode`` when the node does not serve its kind
    of request, else ``resolve``'s request in the node's unit, or ``NotOnNode`` with why not."""
    refusal = serves_refusal(serves, request)
    if refusal:
        return NotOnNode(NOT_SERVED, refusal)
    if request.in_node_units:  # the common case: nothing to resolve
        return request
    typed = gpu_types_on(request, node)
    if isinstance(typed, str):
        return NotOnNode(NO_GPU_TYPE, typed)
    resolved = resolve(typed, unit, node)
    return NotOnNode(UNRESOLVED, resolved) if isinstance(resolved, str) else resolved


def resolve(request: PodRequest, unit: MemoryUnit | None, node: Node) -> PodRequest | str:
    """``request`` with every container's memory in ``node``'s unit (module doc), or why it
    cannot be on this node (a sentence). ``unit``: the node's ``MemoryUnit`` (``None``:
    unknown)."""
    if request.in_node_units:
        return request
    typed = gpu_types_on(request, node)
    if isinstance(typed, str):
        return typed
    containers: list[ContainerRequest] = []
    for c in typed.containers:
        if not c.memory_basis:
            containers.append(c)
            continue
        if c.memory_basis == MIB_BASIS:
            if unit is None:
                return (
                    f"container {c.name} asks GPU memory in MiB and the node's memory unit is "
                    f"unknown (no {INVENTORY} annotation)"
                )
            share = -(-c.gpu_share // unit.mib)
        else:
            sizes = [g.capacity for g in node.gpus if c.allows(g.model)] or node.capacities
            if not sizes:
                return "node has no GPUs"
            share = -(-max(sizes) * c.gpu_share // 100)
        containers.append(replace(c, gpu_share=share, memory_basis=""))
    return PodRequest(request.key, tuple(containers), request.cpu_milli, request.memory_mib)


def gpu_types_on(request: PodRequest, node: Node) -> PodRequest | str:
    """``request`` with each container's ``gpu_types``/``excluded_gpu_types`` turned into the
    ``allowed_models`` of ``node`` (module doc), or why no GPU of the node will do (a
    sentence). The same object when no container names a type."""
    if not any(c.gpu_types or c.excluded_gpu_types for c in request.containers):
        return request
    models = sorted({gpu.model for gpu in node.gpus})
    containers: list[ContainerRequest] = []
    for c in request.containers:
        if not (c.gpu_types or c.excluded_gpu_types):
            containers.append(c)
            continue
        allowed = [
            m for m in models
            if c.allows(m) and _names_any(m, c.gpu_types or ("",))
            and not _names_any(m, c.excluded_gpu_types)
        ]  # fmt: skip
        if not allowed:
            asked = ", ".join(
                [f"type {'/'.join(c.gpu_types)}"] * bool(c.gpu_types)
                + [f"not {'/'.join(c.excluded_gpu_types)}"] * bool(c.excluded_gpu_types)
            )
            return (
                f"container {c.name} asks GPUs of {asked} (nvidia.com/use-gputype, "
                f"nouse-gputype) and the node's GPUs are {', '.join(models) or 'none'}"
            )
        containers.append(
            replace(c, allowed_models=frozenset(allowed), gpu_types=(), excluded_gpu_types=())
        )
    return PodRequest(request.key, tuple(containers), request.cpu_milli, request.memory_mib)


def _names_any(model: str, types: tuple[str, ...]) -> bool:
    """Whether ``model`` contains one of ``types``, any case (HAMi's type match)."""
    upper = model.upper()
    return any(t.upper() in upper for t in types)
