"""A request resolved for one node: a dialect's GPU memory in the node's unit, its GPU types and
UUIDs as the node's GPUs (``resolve``); and the whole rule before any fit (``on_node``). Pure.

The adapter (``gpushare.kube.codec.pod_request``) reads memory written in another system's
dialect as it is written: MiB (gpu-manager's ``vcuda-memory``, HAMi's ``gpumem``) or a
percentage of each GPU (HAMi's ``gpumem-percentage``, and HAMi's default of the whole memory),
recorded in ``ContainerAsk.memory_basis`` of the pod's ``gpushare.core.ask.PodAsk``. The core
places only requests in the node's unit (``PodRequest``), so the extender resolves every ask
against each candidate node before the fit (filter, prioritize) and against the chosen node at
bind:

* **MiB** on a MiB node: as written; on a GiB node: **rounded up** to whole GiB (4,097 MiB is
  5 GiB), so a container never gets less than it asked. A node whose unit is unknown (no
  inventory annotation: Alibaba's capacity fallback) cannot take it.
* **Percent** of each GPU: of the largest GPU capacity the container may use on that node (its
  allowed models; all GPUs when none is allowed, for the fit to say so), **rounded up**. On a
  node whose GPUs differ in size a container may then fit only the larger ones: it never gets
  less than its share of the GPU it lands on.

GPU types (HAMi's ``nvidia.com/use-gputype``/``nouse-gputype``, ``ContainerAsk.gpu_types``)
are resolved first: the node's GPU models that contain one of the types asked (any case) and
none of those excluded become the container's ``allowed_models`` (within any it had); a node
with none of them cannot take the pod (``NO_GPU_TYPE``), as HAMi's filter says. GPU UUIDs
(``nvidia.com/use-gpuuuid``/``nouse-gpuuuid``, ``ContainerAsk.gpu_uuids``) then become the
positions of the node's GPUs named (and not avoided), ``allowed_positions``; a node with none
of them, or whose UUIDs are unknown (no inventory), cannot take it (``NO_GPU_UUID``).

An ask already in the node's terms (every ``aliyun.com/gpu-mem`` pod) resolves to its
``PodAsk.plain`` on every node, the same object.

The node is seen through a :class:`NodeView` (its GPUs, its memory unit in MiB, what it serves,
its GPUs' UUIDs; ``gpushare.kube.codec.resolve.node_view`` makes one from a ``NodeInfo``).
``on_node`` is the whole rule for a request on one node before any fit: refused when the node
does not serve its kind of request (``gpushare.core.serves``: whole GPUs, shares, or both),
else resolved. The extender's filter, prioritize and bind and the inspect report all call it,
so they refuse the same pods with the same sentence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from gpushare.core.ask import MIB_BASIS, PERCENT_BASIS, ContainerAsk, PodAsk
from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.core.serves import Serves, serves_refusal
from gpushare.core.text import shown_names

__all__ = [
    "NOT_SERVED",
    "NO_GPU_TYPE",
    "NO_GPU_UUID",
    "UNRESOLVED",
    "NodeView",
    "NotOnNode",
    "on_node",
    "resolve",
]

NOT_SERVED = "the node does not serve this kind of request"
"""``NotOnNode.why`` of a pod asking whole GPUs of a ``shared`` node, or a share of a ``whole``
node (``gpushare.core.serves``)."""
UNRESOLVED = "memory not resolvable into the node's unit"
"""``NotOnNode.why`` of a pod whose memory cannot be put in the node's unit (MiB on a node of
unknown unit, percent on a node without GPUs)."""


NO_GPU_TYPE = "no GPU of the types the pod asks"
"""``NotOnNode.why`` of a pod whose ``nvidia.com/use-gputype``/``nouse-gputype`` leave it no GPU
model of the node."""


NO_GPU_UUID = "none of the GPUs the pod names"
"""``NotOnNode.why`` of a pod whose ``nvidia.com/use-gpuuuid``/``nouse-gpuuuid`` leave it no GPU
of the node."""


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as a request is resolved against it: ``node`` (its GPUs), ``unit_mib`` (MiB in one
    unit of its GPU memory: 1024 for GiB, 1 for MiB; ``None`` when unknown), what it ``serves``,
    and its GPUs' ``uuids`` by position (``""`` or none when unknown)."""

    node: Node
    unit_mib: int | None
    serves: Serves = Serves.BOTH
    uuids: tuple[str, ...] = ()


class NotOnNode(NamedTuple):
    """Why a request can never be on a node: ``why``, the fixed reason (``NOT_SERVED``,
    ``UNRESOLVED``), and ``text``, the sentence with the names."""

    why: str
    text: str


def on_node(ask: PodAsk, view: NodeView) -> PodRequest | NotOnNode:
    """``ask`` as the node of ``view`` can place it (module doc): ``NotOnNode`` when the node
    does not serve its kind of request, else ``resolve``'s request in the node's terms, or
    ``NotOnNode`` with why not."""
    refusal = serves_refusal(view.serves, ask)
    if refusal:
        return NotOnNode(NOT_SERVED, refusal)
    return resolve(ask, view)


def resolve(ask: PodAsk, view: NodeView) -> PodRequest | NotOnNode:
    """The ``PodRequest`` of ``ask`` on the node of ``view``: every container's GPU types and
    UUIDs as the node's models and positions, its memory in the node's unit (module doc); or
    why it cannot be on this node (``NO_GPU_TYPE``, ``NO_GPU_UUID``, ``UNRESOLVED``).
    ``ask.plain`` (the same object) when nothing waits for a node."""
    if ask.plain is not None:  # the common case
        return ask.plain
    containers: list[ContainerRequest] = []
    for c in ask.containers:
        resolved = _container(c, view) if c.per_node else c.request(c.gpu_share)
        if isinstance(resolved, NotOnNode):
            return resolved
        containers.append(resolved)
    return PodRequest(ask.key, tuple(containers), ask.cpu_milli, ask.memory_mib)


def _container(c: ContainerAsk, view: NodeView) -> ContainerRequest | NotOnNode:
    """The ``ContainerRequest`` of ``c`` on the node of ``view``: its GPU types, then its
    UUIDs, then its memory (module doc), or why not."""
    node = view.node
    models = c.allowed_models
    if c.gpu_types or c.excluded_gpu_types:
        chosen = _by_type(c, sorted({gpu.model for gpu in node.gpus}))
        if isinstance(chosen, NotOnNode):
            return chosen
        models = chosen
    positions: frozenset[int] = frozenset()
    if c.gpu_uuids or c.excluded_gpu_uuids:
        found = _by_uuid(c, models, node, view.uuids)
        if isinstance(found, NotOnNode):
            return found
        positions = found
    share = c.gpu_share
    if c.memory_basis == MIB_BASIS:
        if view.unit_mib is None:
            return NotOnNode(UNRESOLVED, (
                f"container {c.name} asks GPU memory in MiB and the node's memory unit is "
                "unknown (no gpushare.io/gpu-inventory annotation)"
            ))  # fmt: skip
        share = -(-c.gpu_share // view.unit_mib)
    elif c.memory_basis == PERCENT_BASIS:
        choice = c.request(c.gpu_share, models, positions)  # its GPUs, as the fit will see them
        sizes = [
            g.capacity for p, g in enumerate(node.gpus) if choice.allows_at(p, g.model)
        ] or node.capacities
        if not sizes:
            return NotOnNode(UNRESOLVED, "node has no GPUs")
        share = -(-max(sizes) * c.gpu_share // 100)
    return c.request(share, models, positions)


def _by_type(c: ContainerAsk, models: list[str]) -> frozenset[str] | NotOnNode:
    """The node's ``models`` that ``c``'s GPU types choose (within the models it allows), or
    ``NO_GPU_TYPE``."""
    allowed = [
        m for m in models
        if (not c.allowed_models or m in c.allowed_models)
        and _names_any(m, c.gpu_types or ("",)) and not _names_any(m, c.excluded_gpu_types)
    ]  # fmt: skip
    if not allowed:
        asked = _choice("GPUs of type", c.gpu_types, c.excluded_gpu_types)
        return NotOnNode(NO_GPU_TYPE, (
            f"container {c.name} asks {asked} (nvidia.com/use-gputype, nouse-gputype) "
            f"and the node's GPUs are {shown_names(sorted(set(models))) or 'none'}"
        ))  # fmt: skip
    return frozenset(allowed)


def _by_uuid(
    c: ContainerAsk, models: frozenset[str], node: Node, uuids: Sequence[str]
) -> frozenset[int] | NotOnNode:
    """The positions of the GPUs of ``node`` (whose GPUs have ``uuids`` by position) that
    ``c``'s UUIDs choose, within ``models`` (empty: any), or ``NO_GPU_UUID``."""
    if len(uuids) != len(node.gpus) or not all(uuids):
        return NotOnNode(NO_GPU_UUID, (
            f"container {c.name} names GPUs by UUID (nvidia.com/use-gpuuuid, "
            "nouse-gpuuuid) and the node's GPU UUIDs are unknown (no gpushare.io/gpu-"
            "inventory annotation)"
        ))  # fmt: skip
    wanted, avoided = set(c.gpu_uuids), set(c.excluded_gpu_uuids)
    positions = frozenset(
        p
        for p, uuid in enumerate(uuids)
        if (not wanted or uuid in wanted) and uuid not in avoided
        and (not models or node.gpus[p].model in models)
    )  # fmt: skip
    if not positions:
        asked = _choice("GPU", c.gpu_uuids, c.excluded_gpu_uuids)
        return NotOnNode(NO_GPU_UUID, (
            f"container {c.name} asks {asked} (nvidia.com/use-gpuuuid, nouse-gpuuuid) "
            f"and none of the node's {len(uuids)} GPUs is one of them"
        ))  # fmt: skip
    return positions


def _choice(what: str, wanted: tuple[str, ...], avoided: tuple[str, ...]) -> str:
    """``"<what> A/B, not C"``: a container's choice of GPUs, for a refusal; long lists are
    cut (``shown_names``: ``A/B/C and 4,997 more``), so that a refusal the same pod gets on
    every node stays short and the same text (kube-scheduler writes one line per distinct
    reason into the pod's status)."""
    parts = [f"{what} {shown_names(wanted, '/')}"] * bool(wanted)
    return ", ".join(parts + [f"not {shown_names(avoided, '/')}"] * bool(avoided))


def _names_any(model: str, types: tuple[str, ...]) -> bool:
    """Whether ``model`` contains one of ``types``, any case (HAMi's type match)."""
    upper = model.upper()
    return any(t.upper() in upper for t in types)
