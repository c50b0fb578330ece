"""The extender's ``Binder`` and ``EventSink`` on the API server (``gpushare.kube``).

:class:`ApiBinder` adapts :class:`gpushare.kube.binder.PodBinder` (create ``pods/binding`` with the
pod's UID as a precondition and the allocation annotations, merged atomically with the node) to
the extender's ``Binder`` protocol, whose three answers mean:

=================================  ===========================================================
``None`` — bound                   the binder succeeded; or ``ALREADY_BOUND`` **to the same
                                   node** (a retried bind whose first answer was lost: the
                                   retry must succeed; docs/interfaces.md, Pitfalls: 9)
error text — certainly not bound   ``ALREADY_BOUND`` to another node; ``NOT_FOUND`` (gone,
                                   recreated, being deleted); ``FORBIDDEN``; ``INVALID``;
                                   ``CONFLICT`` after the binder's tries; ``THROTTLED``; and a
                                   failure reading the pod to explain a 409 — the pod cannot
                                   have been bound by this call
exception — outcome unknown        a server error or a lost reply *while creating the
                                   Binding* (it may have been stored), or the whole bind
                                   running past ``timeout_s``
=================================  ===========================================================

On an unknown outcome the extender keeps the assumed allocation until the watch shows the pod
or the assumption expires, so no GPU is given twice meanwhile.

:class:`ApiEventSink` records each bind's outcome as an Event on the pod through
:class:`gpushare.kube.events.EventRecorder`: reason ``GPUAssigned`` (``Normal``, the message
names node, container(s) and GPU index(es)) or ``FailedBinding`` (``Warning``, the bind's error
text); and, for a bound pod the ledger skipped (``gpushare.extender.state``, "Skipped pods"),
``GPUAllocationSkipped`` (``Warning``, why and what it is counted as). Events are best effort:
a failure or a timeout is logged, never raised.

Events never hold up a bind: each is created by a task of its own after the call returns
(``drain`` waits for them). ``GPUAssigned`` events are rate-limited like kubelet's
(``--event-qps``/``--event-burst``, ``EventRate``): one is an API write per GPU pod, as
expensive as the bind itself, and in a burst of thousands of pods they cost the API server and
the extender as much as the binding; beyond the rate they are dropped and counted (``dropped``,
logged), while the allocation stays in the pod's annotations and ``kubectl inspect gpushare``.
Warnings are never dropped. docs/extender.md, "5,000 nodes", has the measurement.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpushare.core.skipped import SkippedPod
from gpushare.extender.bindapi import BindEvent, Binding
from gpushare.kube.binder import BindResult
from gpushare.kube.codec import ALLOCATION, pod_annotation
from gpushare.kube.errors import BindError, BindStage, Failure, KubeError
from gpushare.kube.events import EventType
from gpushare.kube.refs import PodRef

log = logging.getLogger(__name__)

ASSIGNED_REASON = "GPUAssigned"
"""Event reason of a successful bind."""
FAILED_REASON = "FailedBinding"
"""Event reason of a failed bind."""
SKIPPED_REASON = "GPUAllocationSkipped"
"""Event reason (``Warning``) on a bound pod whose allocation the ledger could not record."""
_UNKNOWN_WHILE_BINDING = frozenset({Failure.SERVER, Failure.UNREACHABLE})
EVENT_QPS = 5.0
"""``GPUAssigned`` events a second, sustained (``--event-qps``; 0: no limit)."""
EVENT_BURST = 25
"""``GPUAssigned`` events at once after a quiet spell (``--event-burst``; client-go's event
spam filter allows 25 at once too)."""
DROP_LOG_INTERVAL_S = 60.0
"""Dropped events are logged at most this often (with the count since the last line)."""


@dataclass(slots=True)
class EventRate:
    """A token bucket: ``burst`` tokens, refilled at ``per_s`` a second; ``take`` spends one or
    says there is none. ``per_s`` 0 never refuses (kubelet's ``--event-qps 0``). Not
    aiolimiter's ``AsyncLimiter``: that one makes callers wait on one event loop, while an
    event over the rate is dropped here, never waited for. ``clock``: monotonic seconds."""

    per_s: float = EVENT_QPS
    burst: int = EVENT_BURST
    clock: Callable[[], float] = time.monotonic
    _tokens: float = field(init=False)
    _at: float = field(init=False)

    def __post_init__(self) -> None:
        if self.per_s < 0 or self.burst < 1:
            raise ValueError(f"event rate {self.per_s}/s, burst {self.burst}: need >= 0 and >= 1")
        self._tokens, self._at = float(self.burst), self.clock()

    def take(self) -> bool:
        """Spend a token: ``True``, or ``False`` when none is left (the event is dropped)."""
        if self.per_s == 0:
            return True
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.per_s)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


class BindingCall(Protocol):
    """The API call under :class:`ApiBinder`: :class:`gpushare.kube.binder.PodBinder`'s
    ``bind`` (annotate, then create ``pods/binding``), or a test's stand-in."""

    async def bind(self, pod: PodRef, node: str, annotations: Mapping[str, str]) -> BindResult:
        """Annotate and bind ``pod``; raises ``BindError``."""
        ...


class PodEventRecorder(Protocol):
    """What :class:`ApiEventSink` needs: :class:`gpushare.kube.events.EventRecorder`'s call."""

    async def pod_event(
        self, pod: PodRef, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> str:
        """Create an Event on ``pod``; raises ``ApiCallError``."""
        ...


class ApiBinder:
    """The extender's ``Binder`` over ``gpushare.kube`` (module doc). ``timeout_s`` bounds one
    whole bind (reads, patches, retries); keep it below kube-scheduler's ``httpTimeout``."""

    def __init__(self, binder: BindingCall, *, timeout_s: float = 20.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._binder = binder
        self._timeout_s = timeout_s

    async def bind(self, binding: Binding) -> str | None:
        """Bind ``binding`` (see the module doc for what each answer means)."""
        if not binding.uid:
            return f"pod {binding.namespace}/{binding.name} has no UID to bind it safely with"
        pod = PodRef(binding.namespace, binding.name, binding.uid)
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._binder.bind(pod, binding.node, binding.annotations)
        except BindError as error:
            return self._judge(binding, error)
        except TimeoutError:
            raise TimeoutError(
                f"bind {pod.key} to {binding.node}: no answer within {self._timeout_s:g}s"
            ) from None
        return None

    @staticmethod
    def _judge(binding: Binding, error: BindError) -> str | None:
        """``None`` (bound), an error text (not bound), or re-raise ``error`` (unknown)."""
        if error.failure is Failure.ALREADY_BOUND and error.bound_node == binding.node:
            observed = error.observed_pod or {}
            recorded = pod_annotation(observed, ALLOCATION)
            wanted = binding.annotations.get(ALLOCATION)
            if recorded != wanted:
                log.warning(
                    "pod %s/%s was already bound to %s with allocation %s, not %s; "
                    "the watch will bring the recorded one",
                    binding.namespace,
                    binding.name,
                    binding.node,
                    recorded,
                    wanted,
                )
            return None
        if error.stage is BindStage.BIND and error.failure in _UNKNOWN_WHILE_BINDING:
            raise error
        return str(error)


class ApiEventSink:
    """The extender's ``EventSink`` over ``gpushare.kube`` (module doc). ``timeout_s`` bounds
    one Event creation; ``rate`` limits ``GPUAssigned`` events; ``emitted``, ``failed`` and
    ``dropped`` (over the rate) count them. Call ``emit`` and ``skipped`` on the event loop."""

    def __init__(
        self, recorder: PodEventRecorder, *, timeout_s: float = 5.0, rate: EventRate | None = None
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._recorder = recorder
        self._timeout_s = timeout_s
        self._rate = rate or EventRate()
        self._tasks: set[asyncio.Task[None]] = set()
        self._drops_logged_at: float | None = None
        self._drops_unlogged = 0
        self.emitted = 0
        self.failed = 0
        self.dropped = 0

    async def emit(self, event: BindEvent) -> None:
        """Record ``event`` on its pod, in the background (module doc); a ``GPUAssigned`` one
        over the rate is dropped. Never raises for API trouble."""
        if event.ok and not self._rate.take():
            self._drop(event)
            return
        reason, kind = (
            (ASSIGNED_REASON, EventType.NORMAL) if event.ok else (FAILED_REASON, EventType.WARNING)
        )
        self._spawn(
            self._record(
                event.namespace,
                event.name,
                event.uid,
                reason=reason,
                message=event.message,
                kind=kind,
            )
        )

    def note(self, pod: str, uid: str, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event ``reason`` on pod ``namespace/name`` (UID ``uid``), in the background,
        never dropped (preemption's Events, ``gpushare.extender.preemption``); never raises
        for API trouble."""
        namespace, _, name = pod.partition("/")
        kind = EventType.WARNING if warning else EventType.NORMAL
        self._spawn(self._record(namespace, name, uid, reason=reason, message=message, kind=kind))

    def skipped(self, skipped: SkippedPod, uid: str) -> None:
        """A ``Warning`` ``GPUAllocationSkipped`` Event on the skipped pod (UID ``uid``) saying
        why and what it is counted as, in the background; never raises for API trouble."""
        namespace, _, name = skipped.pod.partition("/")
        message = "gpushare: " + skipped.describe()
        self._spawn(
            self._record(
                namespace, name, uid, reason=SKIPPED_REASON, message=message, kind=EventType.WARNING
            )
        )

    async def drain(self) -> None:
        """Wait until every Event started so far is created or has failed; never raises (a
        task's unexpected error is logged when it ends)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("recording an Event failed unexpectedly", exc_info=error)

    def _drop(self, event: BindEvent) -> None:
        self.dropped += 1
        self._drops_unlogged += 1
        now = self._rate.clock()
        if self._drops_logged_at is None or now - self._drops_logged_at >= DROP_LOG_INTERVAL_S:
            log.warning(
                "%d GPUAssigned Event(s) not recorded, over --event-qps %g/--event-burst %d "
                "(latest: pod %s/%s); the allocations are in the pods' annotations",
                self._drops_unlogged,
                self._rate.per_s,
                self._rate.burst,
                event.namespace,
                event.name,
            )
            self._drops_logged_at, self._drops_unlogged = now, 0

    async def _record(
        self, namespace: str, name: str, uid: str, *, reason: str, message: str, kind: EventType
    ) -> None:
        """One Event on pod ``namespace/name`` (UID ``uid``), bounded by ``timeout_s``; a pod
        without UID gets none (logged); API trouble is logged and counted, never raised."""
        key = f"{namespace}/{name}"
        if not (uid and namespace and name):
            log.warning("no Event for pod %s: it has no UID (%s)", key, message)
            return
        pod = PodRef(namespace, name, uid)
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._recorder.pod_event(pod, reason, message, kind)
        except (KubeError, TimeoutError) as error:
            self.failed += 1
            log.warning("recording Event %s on pod %s failed: %s", reason, key, error or "timeout")
            return
        self.emitted += 1
