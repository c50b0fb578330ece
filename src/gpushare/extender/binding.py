"""The extender's bind path (``gpushare.extender.scheduler`` module doc): per-pod and
decide-and-assume locks, the reservation in the ledger, and the ``Binder`` call."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from gpushare.core.ask import PodAsk
from gpushare.core.explain import Placement, placement_message
from gpushare.core.fit import Reason
from gpushare.core.handshake import PinStatus, forced_fit, handshake_verdict
from gpushare.core.model import Allocation, PodRequest
from gpushare.core.policies import Policy
from gpushare.core.resolve import NotOnNode, on_node
from gpushare.extender.bindapi import Binder, BindEvent, Binding, EventSink
from gpushare.extender.outcomes import (
    NOT_SYNCED,
    UNKNOWN_NODE,
    describe_fit,
    not_gpushare,
)
from gpushare.extender.preemption import Preemptor
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import ExtenderBindingArgs, ExtenderBindingResult
from gpushare.kube.codec import (
    PLACEMENT,
    CodecError,
    NodeInfo,
    allocation_annotations,
    pod_node_name,
    pod_priority,
    pod_request,
    pod_uid,
)
from gpushare.kube.codec.resolve import node_view

log = logging.getLogger(__name__)


class PodLocks:
    """One ``asyncio.Lock`` per pod key, kept while someone holds or awaits it: binds of one
    pod run one at a time."""

    def __init__(self) -> None:
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def hold(self, key: str) -> AsyncIterator[None]:
        """Hold pod ``key``'s lock for the ``async with`` body."""
        lock, users = self._locks.get(key, (None, 0))
        if lock is None:
            lock = asyncio.Lock()
        self._locks[key] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[key]
            if users == 1:
                del self._locks[key]
            else:
                self._locks[key] = (lock, users - 1)

    def __len__(self) -> int:
        """Pods whose lock is held or awaited now."""
        return len(self._locks)


PLACEMENTS_KEPT = 1024
"""Pods whose filter and prioritize answers are kept for their bind (``Placements``)."""


class Placements:
    """What filter and prioritize answered for each pod, kept for its bind's explanation
    (``gpushare.core.explain``): per-cycle scratch state, keyed by pod ``namespace/name``, a
    new cycle's filter replacing the last; at most ``limit`` pods (the oldest dropped first),
    and a bind takes its pod's out."""

    def __init__(self, limit: int = PLACEMENTS_KEPT) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._limit = limit
        self._kept: dict[str, Placement] = {}

    def note(self, key: str, placement: Placement) -> None:
        """Keep ``placement`` as pod ``key``'s latest answer."""
        self._kept.pop(key, None)
        if len(self._kept) >= self._limit:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = placement

    def get(self, key: str) -> Placement | None:
        """Pod ``key``'s latest answer, or ``None``."""
        return self._kept.get(key)

    def take(self, key: str) -> Placement | None:
        """Pod ``key``'s latest answer, forgotten (its bind explains it), or ``None``."""
        return self._kept.pop(key, None)

    def __len__(self) -> int:
        """Pods kept."""
        return len(self._kept)


class LoopLock:
    """One ``asyncio.Lock`` per running event loop (a lock belongs to the loop it was first
    used on; an app may be served by one loop after another, as in tests)."""

    def __init__(self) -> None:
        self._current: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def lock(self) -> asyncio.Lock:
        """The running loop's lock."""
        loop = asyncio.get_running_loop()
        if self._current is None or self._current[0] is not loop:
            self._current = (loop, asyncio.Lock())
        return self._current[1]


class BindVerb:
    """The bind verb (``gpushare.extender.scheduler`` module doc): ``policy``'s GPU half on the
    chosen node, the allocation assumed in ``state``, then ``binder.bind``. ``events`` records
    each outcome; ``clock_ns`` gives the wall-clock nanoseconds written as
    ``ALIYUN_COM_GPU_MEM_ASSUME_TIME``. Binds of one pod are serialised (``PodLocks``), and
    the decide-and-assume step of all binds runs under one lock (``LoopLock``). With a
    ``preemptor``, the GPUs held for preemptors are counted for the pods they bind, a
    preemptor bound where its GPUs are held takes them, and its hold then ends."""

    def __init__(
        self,
        state: ExtenderState,
        policy: Policy,
        binder: Binder,
        *,
        events: EventSink | None,
        clock_ns: Callable[[], int],
        preemptor: Preemptor | None = None,
        placements: Placements | None = None,
    ) -> None:
        self._state = state
        self.placements = placements if placements is not None else Placements()
        self._preemptor = preemptor
        self._policy = policy
        self._binder = binder
        self._events = events
        self._clock_ns = clock_ns
        self._pod_locks = PodLocks()
        self._decide = LoopLock()

    def _reserve(
        self, key: str, ask: PodAsk, node: str, now_ns: int, priority: int = 0
    ) -> tuple[Allocation, NodeInfo] | str:
        """Decide and assume the GPUs of the pod that asks ``ask`` on ``node``: the allocation
        and the node, or
        why not (the ledger then unchanged). Under the handshake rule, a pinned pod takes its
        pin's GPUs; the pod is then pending, assumed at ``now_ns``. Synchronous: nothing else
        runs in between."""
        info = self._state.cluster.node(node)
        preemptor = self._preemptor
        state = (
            preemptor.view(node, key, priority)
            if preemptor is not None
            else self._state.schedulable_state(node)
        )
        if info is None or state is None:
            return f"{UNKNOWN_NODE}: {node}"
        if not info.gpushare:
            return f"{not_gpushare(info)}: {node}"
        pod = on_node(ask, node_view(info))
        if isinstance(pod, NotOnNode):
            return f"gpushare: pod {key} cannot be on node {node}: {pod.text}"
        own = self._state.reservations.allocation(key)
        if own is not None and own.node == node and _matches(own, pod):
            return own, info  # a retry: the GPUs chosen before
        if own is not None and not self._state.reservations.is_assumed(key):
            return f"gpushare: pod {key} already holds GPUs on node {own.node}"
        base = state.without(own)
        # The pod's own pending entry never pins it (``pin`` skips its key).
        fit, rule = handshake_verdict(base, pod, self._state.reservations.pending(node))
        if not fit.fits:
            why = describe_fit(fit, info)
            if fit.reason is Reason.HANDSHAKE:
                why = f"{why}: {rule.describe()}"
            return f"gpushare: pod {key} does not fit node {node} now: {why}"
        forced = rule.status is PinStatus.FORCED
        held = preemptor.assignment(key, node, pod) if preemptor is not None else None
        if not forced and held is not None and forced_fit(base, pod, held).fits:
            containers = held  # a preemptor takes the GPUs held for it
        else:
            containers = fit.assignment if forced else self._policy.choose_gpus(base, pod)
        allocation = Allocation(pod=key, node=node, containers=containers)
        if own is not None:
            # a stale assumption from an attempt on another node
            self._state.reservations.release(key)
        result = self._state.reservations.assume(allocation)
        if not result.ok:
            if own is not None:
                self._state.reservations.assume(own)
            return f"gpushare: {result.describe()}"
        self._state.reservations.note_pending(allocation, pod, now_ns)
        return allocation, info

    async def bind(self, args: ExtenderBindingArgs) -> ExtenderBindingResult:
        """The bind verb (module doc); the ``Error`` text names what went wrong."""
        key = f"{args.pod_namespace}/{args.pod_name}"
        async with self._pod_locks.hold(key):
            message, allocation, explained = await self._bind(key, args)
        if self._events is not None:
            ok = not message
            text = (
                message
                or explained
                or _describe_allocation(key, args.node, allocation, self._state)
            )
            event = BindEvent(args.pod_namespace, args.pod_name, args.pod_uid, args.node, ok, text)
            try:
                await self._events.emit(event)
            except Exception:
                log.exception("recording the bind event of pod %s failed", key)
        return ExtenderBindingResult(message)

    async def _bind(
        self, key: str, args: ExtenderBindingArgs
    ) -> tuple[str, Allocation | None, str]:
        """(the error, ``""`` when bound; the allocation; the explanation recorded on the pod,
        ``""`` when none was written)."""
        # The API server's copy when the watch has brought this incarnation, else the copy of
        # kube-scheduler's filter request (the pod is new): a request body never overrides
        # what the API server says of the pod it names (its request, its priority).
        pod = self._state.cluster.api_pod(key)
        if pod is None or (args.pod_uid and pod_uid(pod) != args.pod_uid):
            pod = self._state.cluster.pod(key)
        if pod is None:
            return f"gpushare: pod {key} unknown to the extender (never seen)", None, ""
        if args.pod_uid and pod_uid(pod) and pod_uid(pod) != args.pod_uid:
            return f"gpushare: pod {key} has UID {pod_uid(pod)}, not {args.pod_uid}", None, ""
        bound = pod_node_name(pod)
        if bound:
            if bound == args.node:
                return "", self._state.reservations.allocation(key), ""
            return (
                f"gpushare: pod {key} is already bound to node {bound}, not {args.node}",
                None,
                "",
            )
        try:
            request = pod_request(pod)
        except CodecError as error:
            return f"gpushare: {error}", None, ""
        allocation: Allocation | None = None
        annotations: dict[str, str] = {}
        explained = ""
        if request.gpu_containers:
            if not self._state.cluster.synced:
                return NOT_SYNCED, None, ""
            now_ns = self._clock_ns()
            async with self._decide.lock():
                reserved = self._reserve(key, request, args.node, now_ns, pod_priority(pod))
            if isinstance(reserved, str):
                return reserved, None, ""
            allocation, info = reserved
            annotations = allocation_annotations(
                allocation, info.node, now_ns=now_ns, unit=info.unit
            )
            bound_text = _describe_allocation(key, args.node, allocation, self._state)
            explained = placement_message(bound_text, self.placements.get(key), args.node)
            annotations[PLACEMENT] = explained
        namespace, name = key.split("/", 1)
        binding = Binding(namespace, name, args.pod_uid or pod_uid(pod), args.node, annotations)
        try:
            failure = await self._binder.bind(binding)
        except Exception as error:  # the binder's "outcome unknown" (a timeout, no API server)
            log.warning(
                "binding pod %s to node %s: outcome unknown, GPUs kept assumed: %s",
                key,
                args.node,
                _one_line(error),
            )
            return (
                f"gpushare: binding pod {key} to node {args.node}: outcome unknown: {error!r}",
                None,
                "",
            )
        if failure is not None:
            if allocation is not None and self._state.reservations.allocation(key) == allocation:
                self._state.reservations.release(key)
            return f"gpushare: binding pod {key} to node {args.node} failed: {failure}", None, ""
        self._state.cluster.record_bound(key, args.node, annotations)
        if self._preemptor is not None:
            self._preemptor.bound(key, args.node)
        self.placements.take(key)
        return "", allocation, explained


def _one_line(error: BaseException) -> str:
    """``error`` as one log line: its type and its text with whitespace runs collapsed."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _describe_allocation(
    key: str, node: str, allocation: Allocation | None, state: ExtenderState
) -> str:
    """``pod ns/n bound to node n3: container main on GPU 1 (8138 MiB each)``; with compute
    ``(8 GiB, 50% compute each)``, whole GPUs ``(whole)``."""
    info = state.cluster.node(node)
    unit = f" {info.unit}" if info is not None and info.unit else ""
    parts = [
        f"container {c.container} on GPU {','.join(map(str, c.gpu_indices))} "
        + (
            "(whole)"
            if c.exclusive
            else f"({c.gpu_share}{unit}, {c.compute_milli / 10:g}% compute each)"
            if c.compute_milli
            else f"({c.gpu_share}{unit} each)"
        )
        for c in (allocation.containers if allocation is not None else ())
    ]
    return f"gpushare: pod {key} bound to node {node}" + (": " + "; ".join(parts) if parts else "")


def _matches(allocation: Allocation, pod: PodRequest) -> bool:
    """Whether ``allocation`` gives each GPU container of ``pod`` (in the node's unit) what it
    asks (a pod recreated under the same name may ask differently): whole GPUs are recorded at
    their capacity."""
    got = {
        c.container: (0, len(c.gpu_indices), 0, True)
        if c.exclusive
        else (c.gpu_share, len(c.gpu_indices), c.compute_milli, False)
        for c in allocation.containers
    }
    return got == {
        c.name: (c.gpu_share, c.gpu_count, c.compute_milli, c.exclusive) for c in pod.gpu_containers
    }
