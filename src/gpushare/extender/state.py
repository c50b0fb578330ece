"""What the extender knows: nodes, pods and the ledger — and the seams to the API server.

``ExtenderState`` holds the ``gpushare.core.Ledger`` (committed and assumed allocations), the
node inventory (``NodeInfo`` by name, decoded by ``gpushare.kube.codec``) and the last copy of
each GPU pod. It is fed in two ways:

* by the API-server caches (``gpushare.kube``) through ``upsert_node`` / ``remove_node`` /
  ``observe_pod`` / ``forget_pod`` / ``mark_synced`` — one call per watch event, after the
  initial list; the ledger is thus rebuilt purely from pods and nodes (docs/design.md,
  "Source of truth");
* by the scheduler itself: pods seen in filter requests (``remember_pod``), allocations
  assumed at bind (``assume`` / ``release`` / ``expire``) — and, with ``--in-memory`` only (no
  API server), nodes sent in ``Nodes`` requests; on a cluster a request never changes a node.

All calls must happen on the event loop that serves the extender (the ledger is not
thread-safe): a feeder running in a thread hands its events over with
``loop.call_soon_threadsafe``. Every change bumps the node's ``version`` so that per-node results
can be cached.

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
``skipped`` lists them (``/inspect``, ``/metrics``); ``drain_new_skips`` hands each new or
changed one to the feeder once (a log line and a Warning Event).

The bind path's seams to the API server (``Binder``, ``EventSink``) are
``gpushare.extender.bindapi``'s.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from gpushare.core.handshake import PendingPod, pending_pod_of
from gpushare.core.ledger import Ledger, LedgerOutcome, LedgerResult, Violation
from gpushare.core.model import Allocation, Node, NodeState, PodRequest
from gpushare.core.skipped import SkipKind, SkippedPod, charged, held, refused, unreadable
from gpushare.extender.pending import PendingBook
from gpushare.kube.codec import (
    CodecError,
    Json,
    NodeInfo,
    bound_copy,
    node_info,
    pod_allocation,
    pod_finished,
    pod_key,
    pod_node_name,
    pod_uid,
)
from gpushare.kube.codec.handshake import pending_pod
from gpushare.kube.codec.record import fast_pod_record

REQUESTED_LIMIT = 1024
"""Pods kept from filter requests alone (``remember_pod``): bounded, whatever clients send."""


DEFAULT_ASSUME_TTL_S = 60.0
"""How long an assumed allocation lives unless its pod is seen bound (``--assume-ttl``)."""
DEFAULT_HANDSHAKE_TIMEOUT_S = 300.0
"""How long a bound pod not yet started by the device plugin keeps equal pods off its GPUs
(``--handshake-timeout``; docs/design.md, "The handshake")."""


class ExtenderState:
    """Ledger + node inventory + pods (module doc).

    ``clock`` (seconds, monotonic) times assumed allocations, which expire ``assume_ttl_s``
    after ``assume`` unless a watch event confirms them. ``synced`` starts ``False`` until the
    feeder calls ``mark_synced``. ``handshake_timeout_s``: how long a bound pod
    not yet started by the device plugin pins equal pods to its GPUs (``PendingBook``; 0 turns
    the rule off); ``wall_clock_ns`` reads assume times against it.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.monotonic,
        assume_ttl_s: float = DEFAULT_ASSUME_TTL_S,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._ledger = Ledger(clock, assume_ttl_s)
        self._pending = PendingBook(handshake_timeout_s)
        self._wall_clock_ns = wall_clock_ns
        self._nodes: dict[str, NodeInfo] = {}
        self._gpu_capacities: Counter[int] = Counter()  # GPUs of the known nodes by capacity
        self._node_objects: dict[str, Json] = {}  # the Node as the API server sent it
        self._pods: dict[str, dict[str, Any]] = {}  # from the API server (and our binds)
        self._requested: dict[str, dict[str, Any]] = {}  # from filter requests, bounded
        self._versions: dict[str, int] = {}
        self._states: dict[str, tuple[int, NodeState]] = {}
        self._waiting: dict[str, set[str]] = {}  # node -> bound pods seen before the node
        self._skipped: dict[str, SkippedPod] = {}  # pod key -> what it is charged with
        self._skipped_on: dict[str, dict[str, SkippedPod]] = {}  # node -> the same, by pod key
        self._new_skips: list[SkippedPod] = []  # not yet drained by the feeder
        self.skips_recorded: dict[SkipKind, int] = dict.fromkeys(SkipKind, 0)
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

    def upsert_node(self, obj: Json) -> NodeInfo:
        """Add or update a Kubernetes Node; ``CodecError`` (nothing changed) on garbage."""
        info = node_info(obj)
        self.upsert_node_info(info)
        self._node_objects[info.node.name] = obj
        return info

    def upsert_node_info(self, info: NodeInfo) -> None:
        """Add or update an already decoded node (a no-op when nothing changed)."""
        name = info.node.name
        old = self._nodes.get(name)
        if old == info:
            return
        if old is not None:
            self._gpu_capacities.subtract(gpu.capacity for gpu in old.node.gpus)
        self._gpu_capacities.update(gpu.capacity for gpu in info.node.gpus)
        self._nodes[name] = info
        self._ledger.upsert_node(info.node)
        self._bump(name)
        for key in sorted(self._waiting.pop(name, ())):
            pod = self._pods.get(key)
            if pod is not None and pod_node_name(pod) == name:
                self.observe_pod(pod)  # bound before its node was known: record it now
        self._retry_skipped(name, all_kinds=True)

    def remove_node(self, name: str) -> None:
        """Forget node ``name``; allocations on it stay until their pods go (``Ledger``)."""
        self._node_objects.pop(name, None)
        old = self._nodes.pop(name, None)
        if old is not None:
            self._gpu_capacities.subtract(gpu.capacity for gpu in old.node.gpus)
            self._ledger.remove_node(name)
            self._bump(name)

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name``, or ``None``."""
        return self._nodes.get(name)

    def gpu_capacities(self) -> dict[int, int]:
        """How many GPUs of the known nodes have each capacity (node units), kept as nodes
        come and go (O(distinct capacities))."""
        return {capacity: count for capacity, count in self._gpu_capacities.items() if count > 0}

    def nodes(self) -> list[NodeInfo]:
        """Every known node, sorted by name."""
        return [self._nodes[name] for name in sorted(self._nodes)]

    def objects(self) -> tuple[tuple[Json, ...], tuple[Json, ...]]:
        """(Node objects, GPU pods) as last seen, for ``gpushare.inspect.report.Snapshot``;
        nodes known only from ``Nodes`` requests and pods known only from filter requests are
        left out (no request changes what ``/inspect`` reports)."""
        return tuple(self._node_objects.values()), tuple(self._pods.values())

    def version(self, name: str) -> int:
        """A counter that changes whenever node ``name`` or an allocation on it changes."""
        return self._versions.get(name, 0)

    def schedulable_state(self, name: str) -> NodeState | None:
        """Node ``name`` as filter, prioritize, bind and preemption must count it: the ledger's
        allocations (committed + assumed), plus what skipped pods are charged with and units
        on GPU indices the node lacks (a whole-node block included); ``None`` for an unknown
        node. Cached per ``version``."""
        if name not in self._nodes:
            return None
        version = self._versions.get(name, 0)
        cached = self._states.get(name)
        if cached is not None and cached[0] == version:
            return cached[1]
        state = self._charged(self._ledger.state(name))
        self._states[name] = (version, state)
        return state

    def _charged(self, state: NodeState) -> NodeState:
        """``state`` plus what skipped pods and units on missing GPU indices are charged with
        (``gpushare.core.skipped.charged``)."""
        name = state.node.name
        return charged(state, self.skipped(name), self._ledger.units_off_node(name))

    def used_with_skipped(self, name: str) -> tuple[int, ...]:
        """Memory units counted on each GPU of node ``name`` (position order), as ``/inspect``
        and ``/metrics`` show them: the ledger's plus what skipped pods are charged with
        (``gpushare.core.skipped.held``); a whole-node block is not memory and is left out
        (``schedulable_state`` counts it)."""
        state = self._ledger.state(name)
        extra = held(state.node, self.skipped(name))
        return tuple(u + h for u, h in zip(state.gpu_used, extra, strict=True))

    def skipped(self, node: str | None = None) -> list[SkippedPod]:
        """The bound pods the ledger does not hold (on ``node``, or all), by pod key."""
        pods = self._skipped if node is None else self._skipped_on.get(node)
        return [pods[key] for key in sorted(pods)] if pods else []

    def drain_new_skips(self) -> list[SkippedPod]:
        """The skipped pods recorded or changed since the last call, in order."""
        new, self._new_skips = self._new_skips, []
        return new

    def _skip(self, skipped: SkippedPod) -> None:
        if self._skipped.get(skipped.pod) == skipped:
            return
        self._unskip(skipped.pod)
        self._skipped[skipped.pod] = skipped
        self._skipped_on.setdefault(skipped.node, {})[skipped.pod] = skipped
        self._new_skips.append(skipped)
        self.skips_recorded[skipped.kind] += 1
        self._bump(skipped.node)

    def _unskip(self, key: str) -> None:
        skipped = self._skipped.pop(key, None)
        if skipped is not None:
            on_node = self._skipped_on[skipped.node]
            del on_node[key]
            if not on_node:
                del self._skipped_on[skipped.node]
            self._bump(skipped.node)

    def _retry_skipped(self, node: str, *, all_kinds: bool) -> None:
        """Observe again the pods skipped on ``node`` (all, or the over-capacity ones after a
        pod there went): they may fit the ledger now."""
        for skipped in self.skipped(node):
            if not all_kinds and skipped.kind is not SkipKind.OVER_CAPACITY:
                continue
            pod = self._pods.get(skipped.pod)
            if pod is None:
                self._unskip(skipped.pod)
                continue
            with contextlib.suppress(CodecError):  # still unreadable: still skipped
                self.observe_pod(pod)

    # -- pods ------------------------------------------------------------------------------

    def pod(self, key: str) -> Json | None:
        """The last copy of pod ``namespace/name`` (from the API server, or from a filter
        request when that came later), or ``None``."""
        asked = self._requested.get(key)
        return asked if asked is not None else self._pods.get(key)

    def remember_pod(self, pod: Json) -> None:
        """Keep the copy of a pod from a filter request (kube-scheduler's informer copy, which
        bind reads when the watch has not brought the pod yet) unless the kept copy of the same
        pod (same UID) is bound: a pod being scheduled is not. Request copies are kept apart
        from the API server's: at most ``REQUESTED_LIMIT`` (the oldest go first), never in
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

    def observe_pod(self, pod: Json) -> LedgerResult | Allocation | None:
        """A pod from the API server (list or watch ``ADDED``/``MODIFIED``).

        Finished pods (``Succeeded``/``Failed``) release their allocation (returned). A bound
        pod's recorded allocation is committed: the ``LedgerResult`` says how (a rejection
        means the cluster holds more than the GPU has: report it; ``UNKNOWN_NODE``: it is
        recorded when the node arrives). The API server wins over an assumption that differs.
        Otherwise ``None``. ``CodecError`` (nothing changed) on
        garbage annotations.
        """
        key = pod_key(pod)
        self._requested.pop(key, None)  # the API server's copy supersedes a request's
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
                self._pods[key] = dict(pod)
                self._skip(unreadable(key, node, str(error)))
            raise
        self._pods[key] = dict(pod)
        if allocation is None or not node:
            self._unskip(key)
            return None
        for node in self._pending.put(allocation.node, pending, key):
            self._bump(node)
        result = self._ledger.apply(allocation, allow_unhealthy=True)
        if result.outcome is LedgerOutcome.UNKNOWN_NODE:
            self._waiting.setdefault(allocation.node, set()).add(key)
        if result.outcome is LedgerOutcome.CONFLICT:
            previous = self.release(key)
            result = self._ledger.apply(allocation, allow_unhealthy=True)
            if not result.ok and previous is not None:
                self._ledger.assume(previous)
        if result.ok or result.outcome is LedgerOutcome.UNKNOWN_NODE:
            self._unskip(key)
        else:
            self._skip(self._skipped_pod(allocation, result))
        self._bump(allocation.node)
        return result

    def _skipped_pod(self, allocation: Allocation, result: LedgerResult) -> SkippedPod:
        """What a bound pod whose allocation the ledger refused is charged with."""
        info = self._nodes.get(allocation.node)
        node = info.node if info is not None else Node(allocation.node, ())
        return refused(
            allocation, node, result.describe().partition(f" on node {allocation.node}: ")[2]
        )

    def forget_pod(self, key: str) -> Allocation | None:
        """Pod ``namespace/name`` is gone (watch ``DELETED``) or finished: drop it and release
        its GPUs (skipped pods on its node that did not fit are tried again)."""
        self._pods.pop(key, None)
        self._requested.pop(key, None)
        skipped = self._skipped.get(key)
        self._unskip(key)
        released = self.release(key)
        node = released.node if released is not None else skipped.node if skipped else None
        if node is not None:
            self._retry_skipped(node, all_kinds=False)
        return released

    def record_bound(self, key: str, node: str, annotations: Mapping[str, str]) -> None:
        """Our bind of ``key`` to ``node`` succeeded: update the kept copy until the watch
        brings the API server's."""
        pod = self.pod(key)
        if pod is None:
            return
        self._requested.pop(key, None)
        self._pods[key] = bound_copy(pod, node, annotations)

    # -- allocations -----------------------------------------------------------------------

    def allocation(self, key: str) -> Allocation | None:
        """Pod ``namespace/name``'s allocation in the ledger, assumed or committed, or ``None``
        (a skipped pod has none: ``skipped``)."""
        return self._ledger.allocation(key)

    def is_assumed(self, key: str) -> bool:
        """True when pod ``namespace/name`` holds an assumed allocation (bound by us, not yet
        seen bound by the watch)."""
        return self._ledger.is_assumed(key)

    def allocations(self, node: str) -> tuple[Allocation, ...]:
        """The allocations the ledger records on ``node`` (committed + assumed), sorted by pod
        key; empty for a node with none, known or not. Skipped pods are not among them."""
        return self._ledger.allocations(node)

    def allocation_count(self) -> int:
        """How many allocations the ledger records on the nodes it knows."""
        return sum(len(self._ledger.allocations(n)) for n in self._ledger.node_names())

    def ledger_state(self, name: str) -> NodeState:
        """Node ``name`` with only what the ledger records on it (committed + assumed
        allocations): unlike ``schedulable_state``, what skipped pods are charged with is left
        out. ``KeyError`` for an unknown node."""
        return self._ledger.state(name)

    def ledger_violations(self) -> list[Violation]:
        """The ledger's broken invariants (``Ledger.check_invariants``): a GPU over capacity,
        an allocation on a GPU index its node lacks; empty when all is well."""
        return self._ledger.check_invariants()

    def assume(self, allocation: Allocation) -> LedgerResult:
        """``Ledger.assume``, keeping versions right."""
        result = self._ledger.assume(allocation)
        self._bump(allocation.node)
        return result

    def release(self, key: str) -> Allocation | None:
        """``Ledger.release``, keeping versions right; the pod is no longer pending."""
        for node in self._pending.drop(key):
            self._bump(node)
        allocation = self._ledger.release(key)
        if allocation is not None:
            self._bump(allocation.node)
        return allocation

    def expire(self) -> list[Allocation]:
        """``Ledger.expire``: drop assumed allocations past their deadline, and pending pods
        past the handshake timeout."""
        expired = self._ledger.expire()
        for allocation in expired:
            for node in self._pending.drop(allocation.pod):
                self._bump(node)
            self._bump(allocation.node)
        for node in self._pending.expire(self._wall_clock_ns()):
            self._bump(node)
        return expired

    # -- the device-plugin handshake ---------------------------------------------------------

    def note_pending(
        self, allocation: Allocation, request: PodRequest, assume_time_ns: int
    ) -> None:
        """``allocation`` of ``request`` was just assumed at bind (at ``assume_time_ns``): its
        pod is pending on its node."""
        pod = pending_pod_of(allocation, request, assume_time_ns)
        for node in self._pending.put(allocation.node, pod, allocation.pod):
            self._bump(node)

    def pending(self, node: str) -> tuple[PendingPod, ...]:
        """The pods on ``node`` that pin equal pods now (``gpushare.core.handshake.pin``)."""
        return self._pending.pending(node, self._wall_clock_ns())

    def touch(self, name: str) -> None:
        """Something beside the ledger that per-node results depend on changed on node
        ``name`` (a preemption hold, ``gpushare.extender.holds``): its ``version`` changes."""
        self._bump(name)

    def _bump(self, name: str) -> None:
        self._versions[name] = self._versions.get(name, 0) + 1
