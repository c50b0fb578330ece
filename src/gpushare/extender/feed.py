"""Feeding ``ExtenderState`` from the API server: ``gpushare.kube.cache.ClusterCache`` changes.

:class:`StateFeeder` is the listener the live extender registers on the cache. The cache calls
it synchronously, in event order, in its own task on the extender's event loop — the loop where
every ``ExtenderState`` change must happen — so no hand-over is needed.

* **Nodes** (every node, so that filter can tell "not a GPU-share node" from "unknown"):
  ``UPSERT`` → ``upsert_node`` (a no-op when nothing the extender reads changed, so status
  heartbeats cost a decode); ``DELETE`` → ``remove_node``. A node whose inventory or capacity
  cannot be read is removed (filter then calls it unknown; the log says why) rather than kept
  with GPUs that may no longer be true; one whose inventory and capacity disagree
  (``NodeInfo.mismatch``) is kept, and the disagreement logged once each time it changes.
* **Pods** (only those asking ``aliyun.com/gpu-mem``): ``UPSERT`` → ``observe_pod``, which
  commits the allocation recorded on a bound pod and releases the allocation of a pod that
  finished (``Succeeded``/``Failed``); ``DELETE`` (deleted, gone in a relist, or no longer
  asking GPU memory) → ``forget_pod``, which releases it. When a relist shows a pod recreated
  under the same name (another UID), the old incarnation is forgotten first.
* **Sync**: :meth:`StateFeeder.mark_when_synced` waits until the cache has listed nodes and then
  pods (the cache lists nodes first, so every bound pod's node is known when the pod arrives)
  and calls ``mark_synced``: ``/readyz`` turns 200 and GPU pods are filtered and bound.

Garbage on a pod that is not bound (annotations that cannot be read) leaves the state as it was
and is logged. A *bound* pod whose allocation cannot be read, names a GPU the node lacks, or does
not fit (the cluster already holds more than a GPU has) is a skipped pod
(``gpushare.extender.state``, "Skipped pods"): still counted, conservatively; one warning line
each time it is skipped anew, and ``on_skip`` (the live extender's Warning Event on the pod).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from gpushare.core.ledger import LedgerOutcome, LedgerResult
from gpushare.core.model import Allocation
from gpushare.core.skipped import SkippedPod
from gpushare.extender.state import ExtenderState
from gpushare.kube.cache import CacheStats, ClusterCache
from gpushare.kube.codec import CodecError, Json, pod_uid
from gpushare.kube.watch import Action, Change

log = logging.getLogger(__name__)


class SyncSource(Protocol):
    """What :meth:`StateFeeder.mark_when_synced` needs of the cache (``ClusterCache``)."""

    async def wait_synced(self, timeout_s: float) -> None:
        """Return once synced; ``TimeoutError`` after ``timeout_s``."""
        ...

    @property
    def stats(self) -> CacheStats:
        """The reflectors' counters."""
        ...


class StateFeeder:
    """Applies cache changes to ``state`` (module doc). ``errors`` counts the changes that
    could not be applied (garbage, refused allocations), for tests and logs; ``on_skip`` is
    called with each newly skipped pod and its object (``None`` when no longer known);
    ``on_node_change`` with the name of each node added or whose GPU view changed, and
    ``on_release`` with the node of each allocation a deleted or finished pod released
    (``gpushare.extender.requeue``)."""

    def __init__(
        self,
        state: ExtenderState,
        on_skip: Callable[[SkippedPod, Json | None], None] | None = None,
        on_node_change: Callable[[str], None] | None = None,
        on_release: Callable[[str], None] | None = None,
    ) -> None:
        self.state = state
        self.errors = 0
        self.on_skip = on_skip
        self.on_node_change = on_node_change
        self.on_release = on_release

    def _report_skips(self) -> int:
        """Log (and hand to ``on_skip``) the pods skipped since the last call; how many."""
        skips = self.state.reservations.drain_new_skips()
        for skipped in skips:
            log.warning(
                "GPU pod skipped by the ledger, counted conservatively: %s", skipped.describe()
            )
            if self.on_skip is not None:
                self.on_skip(skipped, self.state.cluster.pod(skipped.pod))
        return len(skips)

    def attach(self, cache: ClusterCache) -> None:
        """Register on ``cache`` (before it starts, to see the initial lists)."""
        cache.on_node(self.on_node)
        cache.on_pod(self.on_pod)

    def on_node(self, change: Change) -> None:
        """A node was added, changed or deleted."""
        if change.action is Action.DELETE:
            self.state.remove_node(change.key)
            return
        before = self.state.cluster.node(change.key)
        try:
            info = self.state.upsert_node(change.obj)
        except CodecError as error:
            self.errors += 1
            log.warning("node %s cannot be read and is left out: %s", change.key, error)
            self.state.remove_node(change.key)
        else:
            if info.mismatch and (before is None or before.mismatch != info.mismatch):
                log.warning("%s", info.mismatch)
            if before != info and self.on_node_change is not None:
                self.on_node_change(change.key)
        self._report_skips()

    def on_pod(self, change: Change) -> None:
        """A GPU-memory pod was added, changed, finished or deleted."""
        key = change.key
        if change.action is Action.DELETE:
            released = self.state.forget_pod(key)
            if released is not None:
                log.info("pod %s is gone: released its GPUs on %s", key, released.node)
                if self.on_release is not None:
                    self.on_release(released.node)
            self._report_skips()
            return
        previous = change.previous
        if previous is not None and pod_uid(previous) != pod_uid(change.obj):
            self.state.forget_pod(key)  # recreated during a watch gap: the old one is gone
        try:
            result = self.state.observe_pod(change.obj)
        except CodecError as error:
            self.errors += 1
            if not self._report_skips():
                log.warning("pod %s cannot be read; left as it was: %s", key, error)
            return
        if isinstance(result, Allocation) and self.on_release is not None:
            self.on_release(result.node)  # finished
        if (
            isinstance(result, LedgerResult)
            and not result.ok
            and result.outcome is not LedgerOutcome.UNKNOWN_NODE
        ):
            self.errors += 1
        self._report_skips()

    async def mark_when_synced(self, cache: SyncSource, *, log_every_s: float = 30.0) -> None:
        """Wait until ``cache`` has listed nodes and pods, then ``mark_synced``; logs while it
        waits. Raises the cache's own error if it died before syncing."""
        waited = 0.0
        while True:
            try:
                await cache.wait_synced(log_every_s)
                break
            except TimeoutError:
                waited += log_every_s
                stats = cache.stats
                log.warning(
                    "still listing nodes and pods after %.0fs (nodes: %s; pods: %s)",
                    waited,
                    stats.nodes.last_error or "no error",
                    stats.pods.last_error or "no error",
                )
        self.state.cluster.mark_synced()
        log.info(
            "synced: %d nodes (%d GPU-share), %d allocations",
            len(self.state.cluster.nodes()),
            sum(1 for info in self.state.cluster.nodes() if info.gpushare),
            self.state.reservations.allocation_count(),
        )
