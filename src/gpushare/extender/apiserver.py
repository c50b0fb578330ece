"""The extender's ``Binder`` and ``EventSink`` on the API server (``gpushare.kube``).

:class:`ApiBinder` adapts :class:`gpushare.kube.binder.PodBinder` (create ``pods/binding`` with the
pod's UID as a precondition and the allocation annotations, merged atomically with the node) to
the extender's ``Binder`` protocol, whose three answers mean:

=================================  ===========================================================
``None`` — bound                   the binder succeeded; or ``ALREADY_BOUND`` **to the same
                                   node** (a retried bind whose first answer was lost: spec
                                   §1.7 asks for success)
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
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Protocol

from gpushare.core.skipped import SkippedPod
from gpushare.extender.state import BindEvent, Binding
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


class PodBinder(Protocol):
    """What :class:`ApiBinder` needs: :class:`gpushare.kube.binder.PodBinder`'s ``bind``."""

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

    def __init__(self, binder: PodBinder, *, timeout_s: float = 20.0) -> None:
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
    one Event creation; ``emitted`` and ``failed`` count them."""

    def __init__(self, recorder: PodEventRecorder, *, timeout_s: float = 5.0) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self._recorder = recorder
        self._timeout_s = timeout_s
        self.emitted = 0
        self.failed = 0

    async def emit(self, event: BindEvent) -> None:
        """Record ``event`` on its pod; never raises for API trouble."""
        reason, kind = (
            (ASSIGNED_REASON, EventType.NORMAL) if event.ok else (FAILED_REASON, EventType.WARNING)
        )
        await self._record(
            event.namespace, event.name, event.uid, reason=reason, message=event.message, kind=kind
        )

    async def skipped(self, skipped: SkippedPod, uid: str) -> None:
        """A ``Warning`` ``GPUAllocationSkipped`` Event on the skipped pod (UID ``uid``) saying
        why and what it is counted as; never raises for API trouble."""
        namespace, _, name = skipped.pod.partition("/")
        message = "gpushare: " + skipped.describe()
        await self._record(
            namespace, name, uid, reason=SKIPPED_REASON, message=message, kind=EventType.WARNING
        )

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
