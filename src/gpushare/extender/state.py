"""What the extender knows, as two parts with their own state, and how the API server feeds
them.

``ExtenderState`` joins :class:`~gpushare.extender.cluster.ClusterView` (``cluster``: nodes, the
last copy of each GPU pod, per-node versions, readiness) and
:class:`~gpushare.extender.reservations.Reservations` (``reservations``: the ledger of
committed and assumed allocations, the pods pending the device plugin's start, the skipped
pods). Queries go to the part that owns the answer; ``ExtenderState`` keeps what changes both
and what counts from both:

* the feed from the API-server caches (``gpushare.kube``): ``upsert_node`` / ``remove_node`` /
  ``observe_pod`` / ``forget_pod`` — one call per watch event, after the initial list; the
  ledger is thus rebuilt purely from pods and nodes (docs/design.md, "Source of truth"); with
  ``--in-memory`` only (no API server), nodes sent in ``Nodes`` requests; on a cluster a
  request never changes a node;
* ``schedulable_state``: a node as filter, prioritize, bind and preemption count it.

The scheduler itself remembers pods seen in filter requests (``cluster.remember_pod``) and
assumes allocations at bind (``reservations.assume`` / ``release`` / ``expire``).

All calls must happen on the event loop that serves the extender (the ledger is not
thread-safe): a feeder running in a thread hands its events over with
``loop.call_soon_threadsafe``. Every change moves the node's ``cluster.version`` so that
per-node results can be cached.

**Skipped pods** (``tests/test_extender_skipped.py``). A bound pod holds *something* on its node
even when the ledger cannot record it, so its GPUs are never taken as free on a guess.
``SkippedPod`` records what it is charged with, on top of the ledger, in every
``schedulable_state`` (so in filter, prioritize and bind), by ``gpushare.core.skipped``'s rule,
the one the inspect report uses too: an allocation that cannot be read blocks the whole node,
one naming a GPU index the node lacks is charged on every GPU, one that does not fit is charged
on the GPUs it names.

Units the ledger holds on a GPU index the node no longer has (the node shrank) are charged to
every GPU too. A skipped pod is retried when its node changes and, for over-capacity ones, when
a pod on the node goes; it leaves the list when it is recorded, finishes or goes.
``reservations.skipped`` lists them (``/inspect``, ``/metrics``).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from gpushare.core.ledger import LedgerOutcome, LedgerResult
from gpushare.core.model import Allocation, Node, NodeState
from gpushare.core.skipped import SkipKind, SkippedPod, charged, refused_by, unreadable
from gpushare.extender.cluster import ClusterView
from gpushare.extender.reservations import (
    DEFAULT_ASSUME_TTL_S,
    DEFAULT_HANDSHAKE_TIMEOUT_S,
    Reservations,
)
from gpushare.kube.codec import (
    CodecError,
    Json,
    NodeInfo,
    node_info,
    pod_allocation,
    pod_finished,
    pod_key,
    pod_node_name,
)
from gpushare.kube.codec.handshake import pending_pod
from gpushare.kube.codec.record import fast_pod_record

__all__ = ["DEFAULT_ASSUME_TTL_S", "DEFAULT_HANDSHAKE_TIMEOUT_S", "ExtenderState"]


class ExtenderState:
    """The cluster view and the reservations, fed together (module doc).

    ``clock`` (seconds, monotonic) times assumed allocations, which expire ``assume_ttl_s``
    after ``reservations.assume`` unless a watch event confirms them. ``cluster.synced``
    starts ``False`` until the feeder calls ``cluster.mark_synced``. ``handshake_timeout_s``:
    how long a bound pod not yet started by the device plugin pins equal pods to its GPUs (0
    turns the rule off); ``wall_clock_ns`` reads assume times against it.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        assume_ttl_s: float = DEFAULT_ASSUME_TTL_S,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self.cluster = ClusterView()
        """Nodes, pods, versions, readiness."""
        self.reservations = Reservations(
            self.cluster.touch,
            clock=clock,
            assume_ttl_s=assume_ttl_s,
            handshake_timeout_s=handshake_timeout_s,
            wall_clock_ns=wall_clock_ns,
        )
        """The ledger, the pending pods and the skipped pods."""
        self._states: dict[str, tuple[int, NodeState]] = {}

    # -- nodes -----------------------------------------------------------------------------

    def upsert_node(self, obj: Json) -> NodeInfo:
        """Add or update a Kubernetes Node; ``CodecError`` (nothing changed) on garbage."""
        info = node_info(obj)
        self.upsert_node_info(info)
        self.cluster.put_node_object(info.node.name, obj)
        return info

    def upsert_node_info(self, info: NodeInfo) -> None:
        """Add or update an already decoded node (a no-op when nothing changed); the pods
        bound to it before it was known are recorded now, the skipped ones tried again."""
        name = info.node.name
        if not self.cluster.put_node(info):
            return
        self.reservations.upsert_node(info.node)
        for key in self.reservations.waiting_on(name):
            pod = self.cluster.api_pod(key)
            if pod is not None and pod_node_name(pod) == name:
                self.observe_pod(pod)  # bound before its node was known: record it now
        self._retry_skipped(name, all_kinds=True)

    def remove_node(self, name: str) -> None:
        """Forget node ``name``; allocations on it stay until their pods go (``Ledger``)."""
        if self.cluster.drop_node(name) is not None:
            self.reservations.remove_node(name)

    def schedulable_state(self, name: str) -> NodeState | None:
        """Node ``name`` as filter, prioritize, bind and preemption must count it: the ledger's
        allocations (committed + assumed), plus what skipped pods are charged with and units
        on GPU indices the node lacks (a whole-node block included); ``None`` for an unknown
        node. Cached per ``cluster.version``."""
        if self.cluster.node(name) is None:
            return None
        version = self.cluster.version(name)
        cached = self._states.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        reservations = self.reservations
        state = charged(
            reservations.ledger_state(name),
            reservations.skipped(name),
            reservations.units_off_node(name),
        )
        self._states[name] = (version, state)
        return state

    # -- pods ------------------------------------------------------------------------------

    def observe_pod(self, pod: Json) -> LedgerResult | Allocation | None:
        """A pod from the API server (list or watch ``ADDED``/``MODIFIED``).

        Finished pods (``Succeeded``/``Failed``) release their allocation (returned). A bound
        pod's recorded allocation is committed: the ``LedgerResult`` says how (a rejection
        means the cluster holds more than the GPU has: report it; ``UNKNOWN_NODE``: it is
        recorded when the node arrives). The API server wins over an assumption that differs.
        Otherwise ``None``. ``CodecError`` (nothing changed) on garbage annotations.
        """
        key = pod_key(pod)
        cluster, reservations = self.cluster, self.reservations
        cluster.drop_request(key)  # the API server's copy supersedes a request's
        if pod_finished(pod):
            return self.forget_pod(key)
        node = pod_node_name(pod)
        record = fast_pod_record(pod)  # a well-formed pod, read once; else part by part
        try:
            if record is not None:
                allocation, pending = record.allocation, record.pending
            else:
                allocation = pod_allocation(pod)
                pending = pending_pod(pod, allocation) if allocation is not None and node else None
        except CodecError as error:
            if node:  # bound: it holds something we cannot read; block the node
                cluster.keep_pod(key, pod)
                reservations.skip(unreadable(key, node, str(error)))
            raise
        cluster.keep_pod(key, pod)
        if allocation is None or not node:
            reservations.unskip(key)
            return None
        reservations.put_pending(allocation.node, pending, key)
        result = reservations.commit(allocation)
        if result.outcome is LedgerOutcome.UNKNOWN_NODE:
            reservations.wait_for_node(allocation.node, key)
        if result.outcome is LedgerOutcome.CONFLICT:
            previous = reservations.release(key)
            result = reservations.commit(allocation)
            if not result.ok and previous is not None:
                reservations.assume(previous)
        if result.ok or result.outcome is LedgerOutcome.UNKNOWN_NODE:
            reservations.unskip(key)
        else:
            reservations.skip(self._skipped_pod(allocation, result))
        return result

    def _skipped_pod(self, allocation: Allocation, result: LedgerResult) -> SkippedPod:
        """What a bound pod whose allocation the ledger refused is charged with."""
        info = self.cluster.node(allocation.node)
        node = info.node if info is not None else Node(allocation.node, ())
        return refused_by(allocation, node, result)

    def forget_pod(self, key: str) -> Allocation | None:
        """Pod ``namespace/name`` is gone (watch ``DELETED``) or finished: drop it and release
        its GPUs (skipped pods on its node that did not fit are tried again)."""
        self.cluster.forget_pod(key)
        skipped = self.reservations.skipped_pod(key)
        self.reservations.unskip(key)
        released = self.reservations.release(key)
        node = released.node if released is not None else skipped.node if skipped else None
        if node is not None:
            self._retry_skipped(node, all_kinds=False)
        return released

    def _retry_skipped(self, node: str, *, all_kinds: bool) -> None:
        """Observe again the pods skipped on ``node`` (all, or the over-capacity ones after a
        pod there went): they may fit the ledger now."""
        for skipped in self.reservations.skipped(node):
            if not all_kinds and skipped.kind is not SkipKind.OVER_CAPACITY:
                continue
            pod = self.cluster.api_pod(skipped.pod)
            if pod is None:
                self.reservations.unskip(skipped.pod)
                continue
            with contextlib.suppress(CodecError):  # still unreadable: still skipped
                self.observe_pod(pod)
