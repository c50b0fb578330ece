"""What the extender counts as taken on each GPU: the ledger, the pending pods and the skipped
pods.

:class:`Reservations` owns the three books the decisions read, and tells the cluster view
which node changed (``on_change``: the node's version moves) after every change:

* **the ledger** (``gpushare.core.Ledger``): the allocations recorded on bound pods
  (committed) and those assumed at bind until the watch shows the pod bound or they expire
  after ``assume_ttl_s``;
* **the pending pods** (``gpushare.extender.pending.PendingBook``): bound pods the device plugin
  has not started yet, which pin equal pods to their GPUs for ``handshake_timeout_s``
  (docs/design.md, "The handshake");
* **the skipped pods** (``gpushare.core.skipped``): bound pods the ledger cannot record (an
  allocation that cannot be read, one naming a GPU index the node lacks, one that does not
  fit), charged on top of the ledger by the rule the inspect report uses too
  (``tests/test_extender_skipped.py``); ``drain_new_skips`` hands each new or changed one to
  the feeder once (a log line and a Warning Event). And the bound pods seen before their node
  (``wait_for_node``), recorded when it arrives.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gpushare.core.handshake import PendingPod, pending_pod_of
from gpushare.core.ledger import Ledger, LedgerResult, Violation
from gpushare.core.model import Allocation, Node, NodeState, PodRequest
from gpushare.core.skipped import SkipKind, SkippedPod, held
from gpushare.extender.pending import PendingBook

__all__ = ["DEFAULT_ASSUME_TTL_S", "DEFAULT_HANDSHAKE_TIMEOUT_S", "Reservations"]

DEFAULT_ASSUME_TTL_S = 60.0
"""How long an assumed allocation lives unless its pod is seen bound (``--assume-ttl``)."""
DEFAULT_HANDSHAKE_TIMEOUT_S = 300.0
"""How long a bound pod not yet started by the device plugin keeps equal pods off its GPUs
(``--handshake-timeout``; docs/design.md, "The handshake")."""


class Reservations:
    """The ledger, pending and skipped pods (module doc). ``on_change(node)`` is called after
    every change on a node; ``clock`` (seconds, monotonic) times assumed allocations;
    ``wall_clock_ns`` reads assume times against the handshake timeout (0 turns the rule
    off)."""

    def __init__(
        self,
        on_change: Callable[[str], None],
        *,
        clock: Callable[[], float] = time.monotonic,
        assume_ttl_s: float = DEFAULT_ASSUME_TTL_S,
        handshake_timeout_s: float = DEFAULT_HANDSHAKE_TIMEOUT_S,
        wall_clock_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._changed = on_change
        self._ledger = Ledger(clock, assume_ttl_s)
        self._pending = PendingBook(handshake_timeout_s)
        self._wall_clock_ns = wall_clock_ns
        self._waiting: dict[str, set[str]] = {}  # node -> bound pods seen before the node
        self._skipped: dict[str, SkippedPod] = {}  # pod key -> what it is charged with
        self._skipped_on: dict[str, dict[str, SkippedPod]] = {}  # node -> the same, by pod key
        self._new_skips: list[SkippedPod] = []  # not yet drained by the feeder
        self.skips_recorded: dict[SkipKind, int] = dict.fromkeys(SkipKind, 0)
        """Skipped pods recorded so far, by kind (``/metrics``)."""

    # -- the ledger's nodes ----------------------------------------------------------------

    def upsert_node(self, node: Node) -> None:
        """The ledger counts against ``node`` from now on."""
        self._ledger.upsert_node(node)

    def remove_node(self, name: str) -> None:
        """The ledger forgets node ``name``; allocations on it stay until their pods go."""
        self._ledger.remove_node(name)

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
        allocations): unlike ``ExtenderState.schedulable_state``, what skipped pods are
        charged with is left out. ``KeyError`` for an unknown node."""
        return self._ledger.state(name)

    def units_off_node(self, name: str) -> int:
        """Units the ledger holds on GPU indices node ``name`` no longer has."""
        return self._ledger.units_off_node(name)

    def used_with_skipped(self, name: str) -> tuple[int, ...]:
        """Memory units counted on each GPU of node ``name`` (position order), as ``/inspect``
        and ``/metrics`` show them: the ledger's plus what skipped pods are charged with
        (``gpushare.core.skipped.held``); a whole-node block is not memory and is left out
        (``ExtenderState.schedulable_state`` counts it)."""
        state = self._ledger.state(name)
        extra = held(state.node, self.skipped(name))
        return tuple(u + h for u, h in zip(state.gpu_used, extra, strict=True))

    def ledger_violations(self) -> list[Violation]:
        """The ledger's broken invariants (``Ledger.check_invariants``): a GPU over capacity,
        an allocation on a GPU index its node lacks; empty when all is well."""
        return self._ledger.check_invariants()

    def commit(self, allocation: Allocation) -> LedgerResult:
        """Record a bound pod's ``allocation`` (``Ledger.apply``, unhealthy GPUs allowed: the
        pod holds them whatever their health)."""
        result = self._ledger.apply(allocation, allow_unhealthy=True)
        self._changed(allocation.node)
        return result

    def assume(self, allocation: Allocation) -> LedgerResult:
        """``Ledger.assume``: the allocation our bind is about to record."""
        result = self._ledger.assume(allocation)
        self._changed(allocation.node)
        return result

    def release(self, key: str) -> Allocation | None:
        """``Ledger.release``; the pod is no longer pending either."""
        for node in self._pending.drop(key):
            self._changed(node)
        allocation = self._ledger.release(key)
        if allocation is not None:
            self._changed(allocation.node)
        return allocation

    def expire(self) -> list[Allocation]:
        """``Ledger.expire``: drop assumed allocations past their deadline, and pending pods
        past the handshake timeout."""
        expired = self._ledger.expire()
        for allocation in expired:
            for node in self._pending.drop(allocation.pod):
                self._changed(node)
            self._changed(allocation.node)
        for node in self._pending.expire(self._wall_clock_ns()):
            self._changed(node)
        return expired

    # -- the device-plugin handshake ---------------------------------------------------------

    def put_pending(self, node: str, pod: PendingPod | None, key: str) -> None:
        """Pod ``key`` on ``node`` is pending as ``pod`` (``None``: started, or no longer)."""
        for changed in self._pending.put(node, pod, key):
            self._changed(changed)

    def note_pending(
        self, allocation: Allocation, request: PodRequest, assume_time_ns: int
    ) -> None:
        """``allocation`` of ``request`` was just assumed at bind (at ``assume_time_ns``): its
        pod is pending on its node."""
        pod = pending_pod_of(allocation, request, assume_time_ns)
        self.put_pending(allocation.node, pod, allocation.pod)

    def pending(self, node: str) -> tuple[PendingPod, ...]:
        """The pods on ``node`` that pin equal pods now (``gpushare.core.handshake.pin``)."""
        return self._pending.pending(node, self._wall_clock_ns())

    # -- pods seen before their node -------------------------------------------------------

    def wait_for_node(self, node: str, key: str) -> None:
        """Bound pod ``key`` names ``node``, not known yet: record it when it arrives."""
        self._waiting.setdefault(node, set()).add(key)

    def waiting_on(self, node: str) -> list[str]:
        """The pods waiting for ``node`` (sorted), forgotten here."""
        return sorted(self._waiting.pop(node, ()))

    # -- skipped pods ----------------------------------------------------------------------

    def skipped(self, node: str | None = None) -> list[SkippedPod]:
        """The bound pods the ledger does not hold (on ``node``, or all), by pod key."""
        pods = self._skipped if node is None else self._skipped_on.get(node)
        return [pods[key] for key in sorted(pods)] if pods else []

    def skipped_pod(self, key: str) -> SkippedPod | None:
        """What pod ``key`` is charged with, when it is skipped."""
        return self._skipped.get(key)

    def drain_new_skips(self) -> list[SkippedPod]:
        """The skipped pods recorded or changed since the last call, in order."""
        new, self._new_skips = self._new_skips, []
        return new

    def skip(self, skipped: SkippedPod) -> None:
        """Charge ``skipped`` (replacing what its pod was charged with before)."""
        if self._skipped.get(skipped.pod) == skipped:
            return
        self.unskip(skipped.pod)
        self._skipped[skipped.pod] = skipped
        self._skipped_on.setdefault(skipped.node, {})[skipped.pod] = skipped
        self._new_skips.append(skipped)
        self.skips_recorded[skipped.kind] += 1
        self._changed(skipped.node)

    def unskip(self, key: str) -> None:
        """Pod ``key`` is no longer charged as skipped (recorded, finished or gone)."""
        skipped = self._skipped.pop(key, None)
        if skipped is not None:
            on_node = self._skipped_on[skipped.node]
            del on_node[key]
            if not on_node:
                del self._skipped_on[skipped.node]
            self._changed(skipped.node)
