"""Requeue the pods the extender refused when what refused them changes.

kube-scheduler parks a pod that the extender refused on every node until a cluster event that
one of its plugins registered for. Some changes that make such a pod fit reach only the
extender: a node's GPU inventory or served kinds (annotations: no plugin registers for
``Node/UpdateNodeAnnotation``), a preemption hold that ends. And an event that does reach both
(a new capacity) may reach kube-scheduler's informer before the extender's watch: the retry it
causes is refused on the old view, and nothing moves the pod again. Either way the pod waits
for kube-scheduler's 5-minute flush. Source: ``pkg/scheduler/backend/queue/scheduling_queue.go``
``isEventOfInterest`` and ``pkg/scheduler/framework/plugins/*/EventsToRegister`` (v1.37).

:class:`Requeuer` closes the gap. The filter reports each GPU pod no node passed, without an
``Error`` (:meth:`Requeuer.refused`). What only the extender sees (:meth:`Requeuer.changed`: a
node whose GPU view changed, from the feed; a node where a hold ended or changed, from the hold
book, but not a hold added, which only takes GPUs, nor one whose preemptor bound on its node,
which took them; an assumption that expired) requeues every pod refused before it. A
release that kube-scheduler sees too (:meth:`Requeuer.released`: a GPU pod deleted or
finished) requeues only the pods refused within ``race_window_s`` before the extender saw it:
those may have been refused on a view that lacked it. A pod that holds GPUs for its
preemption is passed over: what it waits for, its victims going, moves it in kube-scheduler's
queue anyway (in a burst of 1,000 preemptors, requeueing them was 10 % of the extender's
CPU). The loop (:meth:`Requeuer.run`) sets
each such pod's ``gpushare.io/Requeued`` status condition (``gpushare.kube.requeue``; RBAC
``pods/status`` ``patch``), which requeues it after kube-scheduler's backoff; a pod refused
again is recorded again.

A requeue that fails (a 403 when RBAC does not grant it, the API server away) is counted
(``gpushare_extender_requeues_total{outcome="failed"}``), logged as one warning a minute at most
(how many failed since, the last pod and the server's words), and backs the whole loop off:
nothing is tried for ``failure_backoff_s``, doubled at each failure in a row up to
``max_failure_backoff_s``, reset by the first success. Such failures are almost always the same
for every pod, so a burst of refused pods costs one failing call per backoff, not one per pod.

Bounds: at most ``limit`` refused pods are remembered (the oldest refusal is forgotten first),
at most ``batch`` requeued per round, a pod at most once per ``pod_interval_s``, and only while
this replica decides (a follower forwards the filter and refuses nothing itself). A pod that
is gone, bound or recreated under another UID by then is dropped without a call. The series:
``gpushare_extender_requeues_total{outcome}`` and ``gpushare_extender_refused_pods``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpushare.kube.codec import CodecError, Json, pod_key, pod_node_name, pod_uid
from gpushare.kube.refs import PodRef
from gpushare.kube.requeue import RequeueOutcome

__all__ = ["RequeueOptions", "Requeuer"]

log = logging.getLogger(__name__)

Requeue = Callable[[PodRef], Awaitable[tuple[RequeueOutcome, str]]]
"""Requeue one pod: ``gpushare.kube.requeue.PodRequeuer.requeue``."""


@dataclass(frozen=True, slots=True)
class RequeueOptions:
    """``settle_s``: wait after a change for more of a burst (seconds); ``race_window_s``: how
    long before a release a refusal may have been decided on a view that did not have it yet;
    ``pod_interval_s``: the least time between two requeues of one pod; ``batch``: requeues per
    round; ``limit``: refused pods remembered; ``failure_backoff_s``/``max_failure_backoff_s``:
    the pause after a failed requeue, doubled per failure in a row up to the maximum
    (seconds)."""

    settle_s: float = 0.5
    race_window_s: float = 5.0
    pod_interval_s: float = 10.0
    batch: int = 50
    limit: int = 10_000
    failure_backoff_s: float = 1.0
    max_failure_backoff_s: float = 60.0

    def __post_init__(self) -> None:
        if min(self.settle_s, self.race_window_s, self.pod_interval_s) < 0:
            raise ValueError(f"requeue intervals must be >= 0 seconds: {self}")
        if not 0 < self.failure_backoff_s <= self.max_failure_backoff_s:
            raise ValueError(f"requeue backoff must be > 0 and at most its maximum: {self}")
        if self.batch < 1 or self.limit < 1:
            raise ValueError(f"requeue batch and limit must be >= 1: {self}")


@dataclass(slots=True)
class _Refused:
    uid: str
    seen: int  # the change count when it was refused (or last requeued)
    refused_s: float  # monotonic time of the refusal
    requeued_s: float  # monotonic time of its last requeue, or -inf
    raced: bool = False  # refused just before a release the view did not have yet


class Requeuer:
    """The refused pods and the loop that requeues them (module doc). ``lookup`` returns the
    extender's latest copy of a pod (``ExtenderState.pod``); ``deciding``: whether this replica
    acts now; ``waiting``: whether a pod waits for its preemption victims (it holds GPUs:
    kube-scheduler retries it as they go, so it is passed over, as if requeued); ``clock``:
    monotonic seconds."""

    def __init__(
        self,
        requeue: Requeue,
        lookup: Callable[[str], Json | None],
        *,
        deciding: Callable[[], bool] = lambda: True,
        waiting: Callable[[str], bool] = lambda _key: False,
        options: RequeueOptions | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.options = options or RequeueOptions()
        self._requeue = requeue
        self._lookup = lookup
        self._deciding = deciding
        self._waiting = waiting
        self._clock = clock
        self._refused: dict[str, _Refused] = {}  # in refusal order
        self._changes = 0
        self._wake = asyncio.Event()
        self._failures = 0  # failed requeues in a row
        self._paused_until = float("-inf")  # monotonic: no requeue before
        self._failed_since_log = 0
        self._logged_s = float("-inf")
        registry = registry if registry is not None else CollectorRegistry()
        self.requeues = Counter(
            "gpushare_extender_requeues",
            "Refused pods the extender requeued in kube-scheduler after a change, by outcome "
            "(requeued, gone, failed).",
            ["outcome"],
            registry=registry,
        )
        for outcome in RequeueOutcome:
            self.requeues.labels(outcome.value)
        self.refused_pods = Gauge(
            "gpushare_extender_refused_pods",
            "GPU pods the extender refused on every node, remembered to be requeued on a change.",
            registry=registry,
        )
        self.refused_pods.set_function(lambda: len(self._refused))

    def refused(self, pod: Json) -> None:
        """The filter passed no node for ``pod`` (a GPU pod, unbound)."""
        try:
            key, uid = pod_key(pod), pod_uid(pod)
        except CodecError:
            return
        if not uid:
            return
        known = self._refused.pop(key, None)
        if known is None and len(self._refused) >= self.options.limit:
            del self._refused[next(iter(self._refused))]
        last = known.requeued_s if known is not None and known.uid == uid else float("-inf")
        self._refused[key] = _Refused(uid, self._changes, self._clock(), last)

    def changed(self, node: str) -> None:
        """Something only the extender sees changed on ``node`` (its GPU view, a hold, an
        assumption that expired): requeue every pod refused before."""
        self._changes += 1
        self._wake.set()
        log.debug("node %s changed: %d refused pods to requeue", node, len(self._refused))

    def released(self, node: str) -> None:
        """An allocation on ``node`` was released (pod deleted or finished): kube-scheduler
        sees that pod too and retries, but a refusal within ``race_window_s`` before may have
        been decided without the release: requeue those pods."""
        since = self._clock() - self.options.race_window_s
        raced = 0
        for entry in reversed(self._refused.values()):
            if entry.refused_s < since:
                break
            if not entry.raced:
                entry.raced = True
                raced += 1
        if raced:
            self._wake.set()
            log.debug("release on node %s: %d pods refused just before", node, raced)

    def due(self) -> list[str]:
        """The pods to requeue, oldest refusal first."""
        return [k for k, r in self._refused.items() if r.raced or r.seen < self._changes]

    async def run(self) -> None:
        """Requeue after each change, in rounds, until cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await asyncio.sleep(self.options.settle_s)
            wait_s = await self.requeue_due()
            if wait_s is not None:
                await asyncio.sleep(wait_s)
                self._wake.set()

    async def requeue_due(self) -> float | None:
        """One round: requeue up to ``batch`` due pods. ``None`` when none is left due, else
        how long to wait before the next round (seconds)."""
        if not self._deciding():
            self._refused.clear()  # a follower forwards the filter: it refuses nothing
            return None
        now, changes = self._clock(), self._changes
        if now < self._paused_until:
            return self._paused_until - now if self.due() else None
        done = 0
        next_s: float | None = None
        for key in self.due():
            entry = self._refused[key]
            if done >= self.options.batch:
                return 0.0
            ready_s = entry.requeued_s + self.options.pod_interval_s
            if ready_s > now:
                next_s = ready_s - now if next_s is None else min(next_s, ready_s - now)
                continue
            pod = self._lookup(key)
            if pod is None or pod_node_name(pod) or pod_uid(pod) != entry.uid:
                del self._refused[key]
                continue
            if self._waiting(key):  # its victims' going moves it in kube-scheduler's queue
                entry.seen, entry.raced = max(entry.seen, changes), False
                continue
            namespace, _, name = key.partition("/")
            outcome, detail = await self._requeue(PodRef(namespace, name, entry.uid))
            self.requeues.labels(outcome.value).inc()
            done += 1
            current = self._refused.get(key)
            if outcome is RequeueOutcome.GONE or current is None or current.uid != entry.uid:
                if current is entry:
                    del self._refused[key]
                continue
            current.requeued_s = self._clock()  # a refusal meanwhile keeps it (``refused``)
            if outcome is RequeueOutcome.FAILED:
                return self._back_off(key, detail)
            self._failures = 0
            log.info("pod %s requeued: what refused it changed", key)
            current.seen = max(current.seen, changes)  # not due until the next change
            current.raced = False
        return next_s

    def _back_off(self, key: str, detail: str) -> float:
        """A requeue of pod ``key`` failed (``detail``: the server's words): pause the loop,
        log at most once a minute; the pause (seconds)."""
        options = self.options
        pause_s = min(
            options.max_failure_backoff_s, options.failure_backoff_s * 2.0**self._failures
        )
        self._failures += 1
        now = self._clock()
        self._paused_until = now + pause_s
        self._failed_since_log += 1
        if now - self._logged_s >= 60.0:
            log.warning(
                "%d requeue(s) failed since the last report, the last of pod %s: %s; requeues "
                "pause %gs (doubling while they fail, at most %gs)",
                self._failed_since_log, key, detail, pause_s, options.max_failure_backoff_s,
            )  # fmt: skip
            self._failed_since_log, self._logged_s = 0, now
        return pause_s
