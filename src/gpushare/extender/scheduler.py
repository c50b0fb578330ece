"""The extender's decisions: filter, prioritize and bind over an ``ExtenderState``. No HTTP.

* **where node state comes from** — the ``ExtenderState`` alone (on a cluster: the API server's
  watch). A ``Nodes`` request (``nodeCacheCapable: false``) names the candidates by
  ``metadata.name`` only; the node objects in the body are never read into the state, so no
  request can change what a GPU holds (a body claiming a node has 8 × 80 GiB changes
  nothing; ``tests/test_extender_app.py``). Only ``nodes_from_requests=True``
  (``gpushare extender --in-memory``, a test and benchmark mode with no API server and no binder)
  learns nodes from the body.
* **filter** — per candidate node, ``gpushare.core.fit.check_fit`` of the pod on the node with
  everything allocated there, assumed allocations included: passes (``NodeNames`` or ``Nodes``,
  matching the request), ``FailedNodes`` (does not fit now) or ``FailedAndUnresolvableNodes``
  (can never fit: not a GPU-share node, unknown to the extender, a node that does not serve
  the pod's kind of request (``gpushare.core.serves``: whole GPUs, shares, or both, from the
  node's configuration), request larger than any GPU, model excluded). Reasons carry the
  numbers. Bound pods the ledger skipped count too
  (``ExtenderState``, "Skipped pods"): a GPU over capacity shows a negative free and takes
  nothing, and the reason names the skipped pods and what they are counted as. Reserves
  nothing. A pod asking no GPU passes everywhere.
* **prioritize** — the policy's node half on the nodes the pod fits, mapped to 0–10
  (``gpushare.extender.scoring``).
* **the handshake rule** (``gpushare.core.handshake``): on a node where a bound pod waits for the
  device plugin, a pod whose first GPU container asks as much fits only on exactly that pod's
  GPUs (or not at all now), so that the device plugin can tell equal pods apart in any
  admission order. Filter, prioritize and bind all apply it. When the rule holds the pod and
  no node passes, the filter answers with an ``Error`` as well as its ``FailedNodes``
  (``held_error``): kube-scheduler then retries the pod with backoff (1–10 s) instead of parking
  it until an event. The event that frees it (kubelet admitting the equal pod) reaches
  kube-scheduler and this extender's watch separately; a retry that came first would otherwise
  be refused again and wait for the 5-minute flush.
* **bind** — the policy's GPU half on the chosen node, the allocation *assumed* in the ledger,
  then ``Binder.bind`` with the annotations that record it (``gpushare.kube.codec``). A retried
  bind of a pod already bound there succeeds without a second allocation; a bind that would not
  fit fails with an ``Error`` and leaves the ledger as it was; a binder's definite failure
  releases the assumption. Binds of one pod are serialised, and the decide-and-assume step of
  all binds runs under one ``asyncio.Lock``, so concurrent binds never overcommit a GPU.

**Preemption** (``gpushare.extender.preemption``, when a ``Preemptor`` is given): the GPUs held
for a preemptor while its victims terminate count as taken for pods of lower or equal priority
in filter, prioritize and bind, the refusal names the holds, and a filter that passes no node
tells the preemptor which nodes refused the pod for want of GPU room now (kube-scheduler 1.37
never asks the ``preempt`` verb about them when their totals fit).

A pod whose memory is written in MiB or percent (gpu-manager's and HAMi's dialects) is resolved
into each node's unit before its fit there (``gpushare.core.resolve``): filter, prioritize
and bind place it as the equal pod in that unit; a node it cannot be resolved on (MiB on a node
of unknown unit) can never take it, with the reason.

A pod's own allocation never counts against itself (a retry after an unknown binder outcome
must still fit where it was placed). Fit results are cached per (pod shape, node) until the
node's ``version`` changes (``gpushare.extender.memo.NodeShapeCache``). For a GPU pod that
holds nothing, so are the filter's verdicts (over a ``NodeNames`` list) and, under a
deterministic policy, prioritize's values, for every node ever asked about: kube-scheduler's
windows of 500 of 5,000 nodes rotate, and a request costs a lookup per name plus an evaluation
per node changed since. Expected failures are values (result fields); exceptions are bugs.

**Caches on nodes with preemption holds.** What a node with holds looks like to a pod without a
hold of its own (``Hold.binds``, ``gpushare.core.preemption.with_holds``) depends only on the
pod's shape, its priority, the node's ``version`` (putting or dropping a hold touches its node)
and the clock, through the holds' expiries alone. Such a pod's verdicts, fits and values are
cached on held nodes too:

* the column: with a preemptor, the verdicts' and values' column is the pod's shape *and
  priority* (``_column``) on every node. It is the simpler of the two correct keys: a request
  stays one pass over one column, where a column of its own for held nodes would split each
  request's names in two and merge the answers; and pods take their priorities from a handful
  of PriorityClasses, so the split costs one more evaluation per node and class, not per pod.
  The fits (looked up node by node) add the priority on held nodes only.
* the version: a held node's is its cluster ``version`` while the clock (read once a request)
  is before the earliest ``expires_s`` of its holds, and a new one at every call from then until
  the reconciler drops the holds (which touches the node): an expired hold never keeps a node
  refused. That earliest expiry is itself kept per node version, so a request reads no hold
  on a node unchanged since it was last asked about.

The refusal's hold note (``hold_note``) depends on the pod only through its priority and its own
hold, so a cached verdict says it right. A pod with a hold of its own (its view leaves that hold
out) is evaluated afresh on every node with holds, as are all pods with ``_cache_held`` off.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from gpushare.core.ask import PodAsk
from gpushare.core.explain import Placement
from gpushare.core.fit import FitResult, FitStatus, Reason, check_fit
from gpushare.core.handshake import handshake_fit
from gpushare.core.model import Allocation, NodeState, PodRequest
from gpushare.core.policies import Policy, generational, tie_break_of
from gpushare.core.resolve import NotOnNode, on_node
from gpushare.extender.bindapi import Binder, EventSink
from gpushare.extender.binding import BindVerb, Placements
from gpushare.extender.memo import NodeShapeCache, ShapeKey, shape_key
from gpushare.extender.outcomes import (
    NOT_GPUSHARE,
    NOT_SYNCED,
    UNKNOWN_NODE,
    Verdict,
    describe_fit,
    held_error,
    hold_note,
    node_reasons,
    not_gpushare,
    skipped_note,
)
from gpushare.extender.preemption import Preemptor
from gpushare.extender.scoring import policy_value, to_priorities
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import (
    ExtenderArgs,
    ExtenderBindingArgs,
    ExtenderBindingResult,
    ExtenderFilterResult,
    HostPriority,
    NodeList,
    RequestError,
)
from gpushare.kube.codec import (
    CodecError,
    Json,
    node_info,
    object_name,
    object_namespace,
    pod_priority,
    pod_request,
    pod_uid,
)
from gpushare.kube.codec.resolve import node_view

__all__ = [
    "NOT_GPUSHARE",
    "NOT_SYNCED",
    "UNKNOWN_NODE",
    "Scheduler",
    "describe_fit",
    "not_gpushare",
]

log = logging.getLogger(__name__)


class Scheduler:
    """Filter, prioritize and bind (module doc); bind is ``gpushare.extender.binding.BindVerb``.
    ``clock_ns`` gives the wall-clock nanoseconds written as ``ALIYUN_COM_GPU_MEM_ASSUME_TIME``;
    ``events`` records bind outcomes; ``nodes_from_requests`` lets ``Nodes`` requests add or
    change nodes (``--in-memory`` only; never on a cluster, where the API server is the only
    source of node state); ``on_refused`` is called with each GPU pod the filter passes on no
    node without an ``Error`` (``gpushare.extender.requeue``)."""

    def __init__(
        self,
        state: ExtenderState,
        policy: Policy,
        binder: Binder,
        *,
        events: EventSink | None = None,
        clock_ns: Callable[[], int] = time.time_ns,
        nodes_from_requests: bool = False,
        preemptor: Preemptor | None = None,
        on_refused: Callable[[Json], None] | None = None,
    ) -> None:
        self.state = state
        self.on_refused = on_refused
        self.nodes_from_requests = nodes_from_requests
        self.policy = policy
        self.preemptor = preemptor
        self._tie_break = tie_break_of(policy)
        self._generational = generational(policy)
        self.placements = Placements()
        """Each pod's filter and prioritize answers, for its bind's explanation."""
        self._bind_verb = BindVerb(
            state,
            policy,
            binder,
            events=events,
            clock_ns=clock_ns,
            preemptor=preemptor,
            placements=self.placements,
        )
        self._uncached = 0  # counts down: a unique "version" for nodes evaluated afresh
        self._cache_held = True
        """Whether pods without a hold of their own are answered from the caches on nodes with
        preemption holds (module doc); ``False`` only to measure the uncached path against it
        (``bench/extender_holds.py``)."""
        self._fits: NodeShapeCache[FitResult] = NodeShapeCache()
        # the earliest expiry of the holds on each node (inf: none), per node version
        self._earliest_expiry: NodeShapeCache[float] = NodeShapeCache()
        self._last_names: list[str] = []  # the last NodeNames, when they had no duplicates
        self._verdicts: NodeShapeCache[Verdict] = NodeShapeCache()
        self._node_values: NodeShapeCache[float | None] = NodeShapeCache()
        self._generation = self._policy_generation()

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """The bind verb (module doc); the ``Error`` text names what went wrong."""
        return await self._bind_verb.bind(args)

    # -- filter and prioritize -------------------------------------------------------------

    def _candidates(self, args: ExtenderArgs) -> tuple[list[str], dict[str, str], bool]:
        """(candidate names in order, names that could not be read → reason, names mode)."""
        if args.node_names is not None:
            if args.node_names != self._last_names:  # the same list again: already unique
                self._last_names = list(dict.fromkeys(args.node_names))
                if len(self._last_names) != len(args.node_names):
                    unique, self._last_names = self._last_names, []
                    return unique, {}, True
            return list(self._last_names), {}, True
        if args.nodes is None:
            raise RequestError("neither NodeNames nor Nodes is set; one of them must be")
        names: list[str] = []
        broken: dict[str, str] = {}
        for i, item in enumerate(args.nodes.items or ()):
            if not self.nodes_from_requests:  # the name only: state comes from the API server
                name = _item_name(item)
                if name is None:
                    broken[f"Nodes.items[{i}]"] = "gpushare: node without metadata.name"
                else:
                    names.append(name)
                continue
            try:
                info = node_info(item)
            except CodecError as error:
                broken[_item_name(item) or f"Nodes.items[{i}]"] = f"gpushare: {error}"
                continue
            self.state.upsert_node_info(info)
            names.append(info.node.name)
        return list(dict.fromkeys(names)), broken, False

    def _column(self, ask: PodAsk | PodRequest, priority: int) -> ShapeKey:
        """The caches' column of a pod of ``priority`` asking ``ask``: its ``shape_key``, and with
        a preemptor its priority too (which holds bind it, ``Hold.binds``; module doc)."""
        shape = shape_key(ask)
        return shape if self.preemptor is None else (*shape, priority)

    def _shared(self, key: str) -> bool:
        """Whether the answers for pod ``key`` on nodes with preemption holds may come from and
        go to the caches: it has no hold of its own (module doc)."""
        return self._cache_held and (self.preemptor is None or self.preemptor.holds.of(key) is None)

    def _versions(self, key: str) -> Callable[[str], int]:
        """``_version`` for pod ``key`` in one request (the clock read once)."""
        now_s = 0.0 if self.preemptor is None else self.preemptor.now()
        return functools.partial(self._version, shared=self._shared(key), now_s=now_s)

    def _version(self, name: str, *, shared: bool, now_s: float) -> int:
        """The node's version for the caches: ``cluster.version``; on a node with preemption
        holds a new one at every call for a pod that is not ``shared`` (``_shared``), or once
        ``now_s`` (the holds' wall clock) reaches the earliest ``expires_s`` of the holds there
        (module doc)."""
        version = self.state.cluster.version(name)
        if self.preemptor is None:
            return version
        earliest_s = self._earliest_expiry.get(name, (), version)
        if earliest_s is None:  # the holds on a node change only with its version
            holds = self.preemptor.holds.on(name)
            earliest_s = min((hold.expires_s for hold in holds), default=math.inf)
            self._earliest_expiry.put(name, (), version, earliest_s)
        if earliest_s != math.inf and (not shared or now_s >= earliest_s):
            self._uncached -= 1
            return self._uncached
        return version

    def _view(self, name: str, pod: PodRequest, priority: int) -> NodeState | None:
        """Node ``name`` as ``pod`` of ``priority`` sees it: with the GPUs held for
        preemptors it must not take (``gpushare.extender.preemption``)."""
        if self.preemptor is not None and self.preemptor.held(name):
            return self.preemptor.view(name, pod.key, priority)
        return self.state.schedulable_state(name)

    def _fit(
        self, name: str, pod: PodRequest, own: Allocation | None, priority: int = 0
    ) -> FitResult | None:
        """The fit of ``pod`` on node ``name`` now, or ``None`` for an unknown node; the
        handshake rule applied (``gpushare.core.handshake.handshake_fit``) and the holds
        that bind a pod of ``priority`` counted."""
        state = self._view(name, pod, priority)
        if state is None:
            return None
        if own is not None and own.node == name:
            return handshake_fit(state.without(own), pod, self.state.reservations.pending(name))
        shape, version = shape_key(pod), self.state.cluster.version(name)
        if self.preemptor is not None and self.preemptor.held(name):
            shared = self._shared(pod.key)
            if not shared:
                return handshake_fit(state, pod, self.state.reservations.pending(name))
            version = self._version(name, shared=shared, now_s=self.preemptor.now())
            shape = self._column(pod, priority)
        result = self._fits.get(name, shape, version)
        if result is None:
            result = check_fit(state, pod)
            self._fits.put(name, shape, version, result)
        return handshake_fit(state, pod, self.state.reservations.pending(name), result)

    def _policy_generation(self) -> int:
        return 0 if self._generational is None else self._generational.generation

    def _drop_values_on_new_generation(self) -> None:
        """Cached values belong to one policy ``generation`` (``core.policies.Generational``)."""
        generation = self._policy_generation()
        if generation != self._generation:
            self._node_values.clear()
            self._generation = generation

    def _value(self, state: NodeState, pod: PodRequest, own: Allocation | None) -> float:
        """The policy's value of ``state`` (a node ``pod`` fits), the pod's own allocation left
        out. Not cached here: ``_prioritize_memoised`` keeps the values of a pod that holds
        nothing per node; a pod that holds an allocation is a retry, rare."""
        return policy_value(self.policy, state.without(own), pod, tie_break=self._tie_break)

    def filter(self, args: ExtenderArgs) -> ExtenderFilterResult:
        """The filter verb (module doc). ``RequestError`` when no candidates are given."""
        names, unresolvable, names_mode = self._candidates(args)
        failed: dict[str, str] = {}
        held: dict[str, str] = {}
        passed: list[str] = []
        error = ""
        try:
            pod = pod_request(args.pod)
            self.state.cluster.remember_pod(args.pod)
        except CodecError as codec_error:
            pod, error = None, f"gpushare: {codec_error}"
        if pod is not None and pod.gpu_containers and not self.state.cluster.synced:
            pod, error = None, NOT_SYNCED
        if pod is not None and not pod.gpu_containers:
            passed = names
        elif pod is not None:
            own = self.state.reservations.allocation(pod.key)
            priority = pod_priority(args.pod)
            if names_mode and own is None:  # kept per node until it changes (module doc)
                outcome = functools.partial(self._outcome, ask=pod, own=None, priority=priority)
                column = self._column(pod, priority)
                verdicts = self._verdicts.values(column, names, self._versions(pod.key), outcome)
            else:
                verdicts = [self._outcome(name, pod, own, priority) for name in names]
            for name, verdict in zip(names, verdicts, strict=True):
                if verdict.status is FitStatus.FITS:
                    passed.append(name)
                elif verdict.status is FitStatus.DOES_NOT_FIT_NOW:
                    failed[name] = verdict.reason
                else:
                    unresolvable[name] = verdict.reason
                if verdict.held:
                    held[name] = verdict.reason
            passed = self._to_own_hold(args.pod, pod.key, passed, failed)
        if pod is not None and not passed and failed and self.preemptor is not None:
            self.preemptor.unschedulable(args.pod, pod, list(failed))
        if not error:
            error = held_error(passed, held)
        if pod is not None and pod.gpu_containers and passed:  # a new cycle: kept for bind
            self.placements.note(pod.key, Placement(self.policy.name, (), len(passed)))
        refused = pod is not None and pod.gpu_containers and not passed and not error
        if refused and self.on_refused is not None:
            self.on_refused(args.pod)
        if (refused or error) and log.isEnabledFor(logging.DEBUG):
            reasons = {**failed, **unresolvable}
            log.debug("filter: %s", _no_node_passed(args.pod, reasons, error))
        if names_mode or args.nodes is None:
            return ExtenderFilterResult(None, passed, failed, unresolvable, error)
        keep = set(passed)
        items = [item for item in args.nodes.items or () if _item_name(item) in keep]
        nodes = NodeList(items, args.nodes.metadata or {})
        return ExtenderFilterResult(nodes, None, failed, unresolvable, error)

    def _to_own_hold(
        self, pod: Json, key: str, passed: list[str], failed: dict[str, str]
    ) -> list[str]:
        """A pod whose victims are leaving a node for it (its live hold there) passes only
        that node: bound anywhere else, its victims would have been evicted in vain. The other
        nodes it would fit go to ``failed`` with why. Unchanged for a pod without a hold, or
        with one for another incarnation (UID) or past its expiry (holds end by then)."""
        if self.preemptor is None:
            return passed
        hold = self.preemptor.waiting(key)
        if (
            hold is None
            or hold.uid != pod_uid(pod)
            or self.preemptor.now() >= hold.expires_s
            or passed == [hold.node]
        ):
            return passed
        for name in passed:
            if name != hold.node:
                failed[name] = (
                    f"gpushare: GPUs are held for this pod on node {hold.node} while its "
                    "preemption victims leave; it goes there"
                )
        return [name for name in passed if name == hold.node]

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        """The prioritize verb (module doc). ``RequestError`` for a pod that cannot be read or
        no candidates (kube-scheduler ignores a failed prioritize)."""
        names, _, _ = self._candidates(args)
        try:
            pod = pod_request(args.pod)
        except CodecError as error:
            raise RequestError(f"gpushare: {error}") from None
        values: dict[str, float] = {}
        if pod.gpu_containers and self.state.cluster.synced:
            self._drop_values_on_new_generation()
            own = self.state.reservations.allocation(pod.key)
            priority = pod_priority(args.pod)
            if own is None and self.policy.deterministic:
                return self._prioritize_memoised(names, pod, priority)
            for name in names:
                value = self._node_value(name, pod, own, priority)
                if value is not None:
                    values[name] = value
        scores = to_priorities(values, names)
        if values:
            self._note_scores(pod.key, values, scores)
        return [HostPriority(name, scores[name]) for name in names]

    def _note_scores(self, key: str, values: dict[str, float], scores: dict[str, int]) -> None:
        """Keep the scores sent for pod ``key`` on the nodes it fits (``values``), for the
        explanation of its bind (``gpushare.core.explain``)."""
        fitting = {name: scores[name] for name in values}
        self.placements.note(key, Placement.of(self.policy.name, fitting, len(fitting)))

    def _outcome(
        self, name: str, ask: PodAsk, own: Allocation | None, priority: int = 0
    ) -> Verdict:
        """The filter's verdict on node ``name`` for the pod that asks ``ask``: ``FITS``,
        ``DOES_NOT_FIT_NOW`` with the reason (``held`` when the handshake rule refused it) or
        ``CAN_NEVER_FIT`` with the reason (also for an unknown or non-GPU-share node)."""
        info = self.state.cluster.node(name)
        result = None
        if info is not None and info.gpushare:
            pod = on_node(ask, node_view(info))
            if isinstance(pod, NotOnNode):
                return Verdict(FitStatus.CAN_NEVER_FIT, f"gpushare: {pod.text}")
            result = self._fit(name, pod, own, priority)
        if info is None or result is None:
            why = UNKNOWN_NODE if info is None else not_gpushare(info)
            return Verdict(FitStatus.CAN_NEVER_FIT, why)
        if result.status is FitStatus.FITS:
            return Verdict(FitStatus.FITS)
        why = (
            f"gpushare: {describe_fit(result, info)}{skipped_note(self.state, name)}"
            f"{self._hold_note(name, ask.key, priority)}"
        )
        return Verdict(result.status, why, held=result.reason is Reason.HANDSHAKE)

    def _hold_note(self, name: str, key: str, priority: int) -> str:
        """``; held for preemptor ns/p (priority 1000): GPU 0 16`` for the holds on ``name``
        that keep GPUs from pod ``key`` of ``priority`` (``""`` when none)."""
        if self.preemptor is None or not self.preemptor.held(name):
            return ""
        return hold_note(self.preemptor.holds.on(name), key, priority, self.preemptor.now())

    def _node_value(
        self, name: str, ask: PodAsk, own: Allocation | None, priority: int = 0
    ) -> float | None:
        """The policy's value of node ``name`` for the pod that asks ``ask``, or ``None`` where
        it does not fit (or the node is unknown, or does not serve the pod's kind of
        request)."""
        info = self.state.cluster.node(name)
        if info is None:
            return None
        pod = on_node(ask, node_view(info))
        if isinstance(pod, NotOnNode):
            return None
        result = self._fit(name, pod, own, priority)
        state = self._view(name, pod, priority)
        if result is not None and result.fits and state is not None:
            return self._value(state, pod, own)
        return None

    def _prioritize_memoised(
        self, names: list[str], pod: PodAsk, priority: int
    ) -> list[HostPriority]:
        """``prioritize`` of a GPU pod holding nothing under a deterministic policy: the same
        scores as the loop, each node's value kept until its ``version`` changes."""
        found = self._node_values.values(
            self._column(pod, priority),
            names,
            self._versions(pod.key),
            lambda name: self._node_value(name, pod, None, priority),
        )
        values = {name: v for name, v in zip(names, found, strict=True) if v is not None}
        scores = to_priorities(values, names)
        if values:
            self._note_scores(pod.key, values, scores)
        return [HostPriority(name, scores[name]) for name in names]


def _item_name(item: dict[str, Any]) -> str | None:
    """``metadata.name`` of a node in a ``Nodes`` request, or ``None``."""
    return object_name(item) or None


def _no_node_passed(pod: Json, reasons: dict[str, str], error: str) -> str:
    """One debug line for a filter that passed no node: the pod and its ``Error`` (``held``:
    the handshake rule; kube-scheduler retries with backoff) or its nodes' ``reasons``
    (kube-scheduler parks it until a cluster event or a requeue)."""
    key = f"{object_namespace(pod)}/{object_name(pod)}"
    if error:
        return f"pod {key}: error {error}"
    return f"pod {key}: refused on every node (no backoff retry): {node_reasons(reasons)}"
