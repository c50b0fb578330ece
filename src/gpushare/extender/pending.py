"""Pods bound (or being bound) by the extender that the device plugin has not started yet: the
input of the handshake rule (``gpushare.core.handshake.pin``).

A pod is pending from the moment its allocation is assumed at bind until the device plugin
marks it assigned (``gpushare.kube.codec.handshake``), it finishes, or it is released. A pending
pod stops pinning ``timeout_s`` after its assume time: by then kubelet has admitted it or is
down, and the device plugin refuses an ambiguous Allocate rather than guess
(``gpushare.core.handshake.match_allocate``). ``timeout_s`` 0 turns pins off, for clusters
without a kubelet (kwok-only tests and simulations).
"""

from __future__ import annotations

from gpushare.core.handshake import PendingPod

__all__ = ["PendingBook"]


class PendingBook:
    """Pending pods per node. ``timeout_s``: how long a pending pod pins (seconds; 0: never)."""

    def __init__(self, timeout_s: float) -> None:
        if timeout_s < 0:
            raise ValueError(f"handshake timeout must be >= 0 seconds, got {timeout_s}")
        self.timeout_ns = int(timeout_s * 1e9)
        self._by_node: dict[str, dict[str, PendingPod]] = {}
        self._node_of: dict[str, str] = {}

    def put(self, node: str, pod: PendingPod | None, key: str) -> set[str]:
        """Record pod ``key`` as ``pod`` on ``node`` (``None``: not pending); the nodes whose
        pending set changed."""
        changed = self.drop(key) if self._node_of.get(key) != node or pod is None else set()
        if pod is None or not self.timeout_ns:
            return changed
        book = self._by_node.setdefault(node, {})
        if book.get(key) != pod:
            book[key] = pod
            self._node_of[key] = node
            changed.add(node)
        return changed

    def drop(self, key: str) -> set[str]:
        """Pod ``key`` is no longer pending; the nodes changed."""
        node = self._node_of.pop(key, None)
        if node is None:
            return set()
        book = self._by_node[node]
        del book[key]
        if not book:
            del self._by_node[node]
        return {node}

    def pending(self, node: str, now_ns: int) -> tuple[PendingPod, ...]:
        """The pods pending on ``node`` that still pin at ``now_ns`` (oldest first)."""
        book = self._by_node.get(node)
        if not book:
            return ()
        live = (p for p in book.values() if now_ns - p.assume_time_ns < self.timeout_ns)
        return tuple(sorted(live, key=lambda p: (p.assume_time_ns, p.key)))

    def expire(self, now_ns: int) -> set[str]:
        """Drop the pods that no longer pin at ``now_ns``; the nodes changed."""
        old = [
            key
            for book in self._by_node.values()
            for key, pod in book.items()
            if now_ns - pod.assume_time_ns >= self.timeout_ns
        ]
        changed: set[str] = set()
        for key in old:
            changed |= self.drop(key)
        return changed
