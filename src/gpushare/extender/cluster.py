"""The cluster as the extender sees it: nodes, the last copy of each GPU pod, and versions.

:class:`ClusterView` keeps what the API-server caches and kube-scheduler's requests bring, and
nothing the extender decides (that is ``gpushare.extender.reservations``):

* **nodes**: each decoded (``NodeInfo``) and as the API server sent it (for ``/inspect``);
  how many GPUs of each capacity the known nodes have (``gpu_capacities``, for the policies'
  whole-GPU unit);
* **pods**: the last copy of each GPU pod from the API server (or from our own bind, until the
  watch brings the API server's), and, apart from them and bounded, the copies of pods seen
  only in filter requests (``remember_pod``: kube-scheduler's informer copy, which bind reads
  when the watch has not brought the pod yet);
* **versions**: a counter per node that changes whenever anything a per-node result depends on
  changes there (``touch``), so such results can be cached;
* **readiness**: ``synced`` once the initial list of nodes and pods has been fed in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from gpushare.kube.codec import Json, NodeInfo, bound_copy, pod_key, pod_node_name, pod_uid

__all__ = ["REQUESTED_LIMIT", "ClusterView"]

REQUESTED_LIMIT = 1024
"""Pods kept from filter requests alone (``remember_pod``): bounded, whatever clients send."""


class ClusterView:
    """Nodes, pods, versions and readiness (module doc). All calls on the extender's event
    loop."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeInfo] = {}
        self._gpu_capacities: Counter[int] = Counter()  # GPUs of the known nodes by capacity
        self._node_objects: dict[str, Json] = {}  # the Node as the API server sent it
        self._pods: dict[str, dict[str, Any]] = {}  # from the API server (and our binds)
        self._requested: dict[str, dict[str, Any]] = {}  # from filter requests, bounded
        self._versions: dict[str, int] = {}
        self._synced = False

    # -- readiness -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once the initial list of nodes and pods has been fed in."""
        return self._synced

    def mark_synced(self) -> None:
        """The feeder has listed every node and pod: decisions may be made."""
        self._synced = True

    # -- nodes -----------------------------------------------------------------------------

    def put_node(self, info: NodeInfo) -> bool:
        """Add or update a decoded node; whether anything changed (the version moves then)."""
        name = info.node.name
        old = self._nodes.get(name)
        if old == info:
            return False
        if old is not None:
            self._gpu_capacities.subtract(gpu.capacity for gpu in old.node.gpus)
        self._gpu_capacities.update(gpu.capacity for gpu in info.node.gpus)
        self._nodes[name] = info
        self.touch(name)
        return True

    def put_node_object(self, name: str, obj: Json) -> None:
        """Keep Node ``name`` as the API server sent it (what ``objects`` returns)."""
        self._node_objects[name] = obj

    def drop_node(self, name: str) -> NodeInfo | None:
        """Forget node ``name``; what it was, or ``None`` when it was not known."""
        self._node_objects.pop(name, None)
        old = self._nodes.pop(name, None)
        if old is not None:
            self._gpu_capacities.subtract(gpu.capacity for gpu in old.node.gpus)
            self.touch(name)
        return old

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name``, or ``None``."""
        return self._nodes.get(name)

    def nodes(self) -> list[NodeInfo]:
        """Every known node, sorted by name."""
        return [self._nodes[name] for name in sorted(self._nodes)]

    def gpu_capacities(self) -> dict[int, int]:
        """How many GPUs of the known nodes have each capacity (node units), kept as nodes
        come and go (O(distinct capacities))."""
        return {capacity: count for capacity, count in self._gpu_capacities.items() if count > 0}

    def objects(self) -> tuple[tuple[Json, ...], tuple[Json, ...]]:
        """(Node objects, GPU pods) as last seen, for ``gpushare.inspect.report.Snapshot``;
        nodes known only from ``Nodes`` requests and pods known only from filter requests are
        left out (no request changes what ``/inspect`` reports)."""
        return tuple(self._node_objects.values()), tuple(self._pods.values())

    # -- versions --------------------------------------------------------------------------

    def version(self, name: str) -> int:
        """A counter that changes whenever node ``name`` or anything counted on it changes."""
        return self._versions.get(name, 0)

    def touch(self, name: str) -> None:
        """Something per-node results depend on changed on node ``name`` (the node, an
        allocation, a skipped or pending pod, a preemption hold): its ``version`` changes."""
        self._versions[name] = self._versions.get(name, 0) + 1

    # -- pods ------------------------------------------------------------------------------

    def pod(self, key: str) -> Json | None:
        """The last copy of pod ``namespace/name`` (from the API server, or from a filter
        request when that came later), or ``None``."""
        asked = self._requested.get(key)
        return asked if asked is not None else self._pods.get(key)

    def api_pod(self, key: str) -> Json | None:
        """The API server's copy of pod ``namespace/name`` (or our bind's), or ``None``."""
        return self._pods.get(key)

    def remember_pod(self, pod: Json) -> None:
        """Keep the copy of a pod from a filter request unless the kept copy of the same pod
        (same UID) is bound: a pod being scheduled is not. Request copies are kept apart from
        the API server's: at most ``REQUESTED_LIMIT`` (the oldest go first), never in
        ``objects`` (so never in ``/inspect``), dropped when the API server's copy arrives; a
        copy that claims to be bound is ignored. ``CodecError`` without a name."""
        key = pod_key(pod)
        if pod_node_name(pod):
            return  # kube-scheduler filters only unbound pods: a "bound" copy is forged
        known = self._pods.get(key)
        if known is None or not pod_node_name(known) or pod_uid(known) != pod_uid(pod):
            self._requested.pop(key, None)
            if len(self._requested) >= REQUESTED_LIMIT:
                del self._requested[next(iter(self._requested))]
            self._requested[key] = dict(pod)

    def keep_pod(self, key: str, pod: Json) -> None:
        """Keep the API server's copy of pod ``key``; it supersedes a request's."""
        self._requested.pop(key, None)
        self._pods[key] = dict(pod)

    def drop_request(self, key: str) -> None:
        """Forget the request copy of pod ``key`` (the API server's is on its way)."""
        self._requested.pop(key, None)

    def forget_pod(self, key: str) -> None:
        """Forget every copy of pod ``key``."""
        self._pods.pop(key, None)
        self._requested.pop(key, None)

    def record_bound(self, key: str, node: str, annotations: Mapping[str, str]) -> None:
        """Our bind of ``key`` to ``node`` succeeded: keep the copy it leaves
        (``kube.codec.bound_copy``) until the watch brings the API server's."""
        pod = self.pod(key)
        if pod is None:
            return
        self._requested.pop(key, None)
        self._pods[key] = bound_copy(pod, node, annotations)
