"""Requeue a pending pod in kube-scheduler by touching one of its annotations.

kube-scheduler parks a pod that every node refused (by plugins or by an extender) until a
cluster event that some plugin registered for may make it schedulable, or at most 5 minutes
(``podMaxInUnschedulablePodsDuration``). A change of the pod itself always requeues a pod that
an extender refused: ``PriorityQueue.Update`` asks ``isPodWorthRequeuing``, which answers
"requeue after backoff" for a pod no plugin rejected. Source: ``pkg/scheduler/backend/queue/
scheduling_queue.go`` and ``eventhandlers.go`` (v1.37).

:meth:`PodRequeuer.requeue` merges :data:`REQUEUE_ANNOTATION` (an RFC 3339 time) into the pod,
with its UID in the patch: the API server refuses the patch (409 or 422) when the pod of that
name is another incarnation, and answers 404 when it is gone. RBAC: ``pods`` ``patch``.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpushare.kube.errors import CLIENT_ERRORS, Failure, classify
from gpushare.kube.refs import PodRef

__all__ = ["REQUEUE_ANNOTATION", "PodRequeuer", "RequeueOutcome"]

REQUEUE_ANNOTATION = "gpushare.io/requeued-at"
"""The pod annotation the extender writes to requeue a pod it refused (RFC 3339 UTC time)."""


class RequeueOutcome(enum.StrEnum):
    """What one requeue did."""

    REQUEUED = "requeued"
    GONE = "gone"
    """404, or the name now belongs to another incarnation: nothing to requeue."""
    FAILED = "failed"


class PodRequeuer:
    """Touches pods through ``client`` (owned by the caller)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def requeue(self, pod: PodRef, at: datetime | None = None) -> tuple[RequeueOutcome, str]:
        """Write :data:`REQUEUE_ANNOTATION` (``at``, default now) on this incarnation of
        ``pod``: the outcome and the server's words when it did not. Never raises for API
        trouble."""
        stamp = (at or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        patch = {"metadata": {"uid": pod.uid, "annotations": {REQUEUE_ANNOTATION: stamp}}}
        try:
            await self._client.patch(
                Pod, pod.name, patch, namespace=pod.namespace, patch_type=PatchType.MERGE
            )
        except CLIENT_ERRORS as exc:
            failure, code, _, detail = classify(exc)
            if failure in (Failure.NOT_FOUND, Failure.CONFLICT, Failure.INVALID):
                return RequeueOutcome.GONE, f"HTTP {code}: {detail}"
            return RequeueOutcome.FAILED, detail
        return RequeueOutcome.REQUEUED, ""
