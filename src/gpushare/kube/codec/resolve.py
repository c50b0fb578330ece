"""A request resolved for one node, from the adapter's side: ``node_view`` turns a decoded node
(``NodeInfo``) into the ``gpushare.core.resolve.NodeView`` the core resolves asks against. The
rule itself (memory in the node's unit, GPU types and UUIDs, what the node serves) is the
core's: ``gpushare.core.resolve``.
"""

from __future__ import annotations

from gpushare.core.resolve import NodeView
from gpushare.kube.codec.nodes import NodeInfo

__all__ = ["node_view"]


def node_view(info: NodeInfo) -> NodeView:
    """The view of node ``info`` that requests are resolved against: its GPUs, its memory unit
    in MiB (``None`` for a node read through Alibaba's capacity fallback), what it serves and
    its GPUs' UUIDs."""
    unit = info.unit
    return NodeView(info.node, unit.mib if unit is not None else None, info.serves, info.uuids)
