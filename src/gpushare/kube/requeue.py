"""Requeue a pending pod in kube-scheduler by setting one of its status conditions.

kube-scheduler parks a pod that every node refused (by plugins or by an extender) until a
cluster event that some plugin registered for may make it schedulable, or at most 5 minutes
(``podMaxInUnschedulablePodsDuration``). Any change of the pod itself requeues a pod that only
an extender refused: kube-scheduler's informer sees an update with a new resourceVersion,
``PriorityQueue.Update`` asks ``isPodWorthRequeuing``, and that answers "requeue after backoff"
for a pod no plugin rejected. Source: ``pkg/scheduler/eventhandlers.go``
(``updatePodInSchedulingQueue``) and ``pkg/scheduler/backend/queue/scheduling_queue.go``
(v1.37).

The change is made where the extender may write with least privilege: the pod's **status**
(``pods/status`` ``patch``, :data:`RBAC_RULES`), never its spec, labels or annotations (``pods``
``patch`` would let the extender change any pod's image). :meth:`PodRequeuer.requeue` sets the
condition :data:`REQUEUE_CONDITION` (``status: "True"``, reason ``GPUViewChanged``, the time in
``lastTransitionTime`` and, to the microsecond, in the message) with a strategic merge patch of
``status.conditions`` (merged by ``type``: kube-scheduler's own ``PodScheduled`` is left as it
is), and the pod's UID in the patch: the API server refuses the patch (409 or 422) when the pod
of that name is another incarnation, and answers 404 when it is gone.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpushare.kube.errors import CLIENT_ERRORS, Failure, classify
from gpushare.kube.refs import PodRef

__all__ = [
    "RBAC_RULES",
    "REQUEUE_CONDITION",
    "REQUEUE_REASON",
    "PodRequeuer",
    "RequeueOutcome",
    "requeue_patch",
]

REQUEUE_CONDITION = "gpushare.io/Requeued"
"""The pod condition the extender sets to requeue a pod it refused (a qualified name, as
Kubernetes asks of a condition type it does not define)."""
REQUEUE_REASON = "GPUViewChanged"
"""The condition's reason: what refused the pod changed, as only the extender sees it."""
RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
)
"""What :class:`PodRequeuer` needs of its identity's RBAC."""


class RequeueOutcome(enum.StrEnum):
    """What one requeue did."""

    REQUEUED = "requeued"
    GONE = "gone"
    """404, or the name now belongs to another incarnation: nothing to requeue."""
    FAILED = "failed"


def requeue_patch(uid: str, at: datetime | None = None) -> dict[str, Any]:
    """The strategic merge patch of a pod's status that sets :data:`REQUEUE_CONDITION` at
    ``at`` (default now) on incarnation ``uid`` (module doc)."""
    when = at or datetime.now(UTC)
    condition = {
        "type": REQUEUE_CONDITION,
        "status": "True",
        "lastTransitionTime": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "reason": REQUEUE_REASON,
        "message": (
            f"gpushare requeued the pod at {when.strftime('%Y-%m-%dT%H:%M:%S.%fZ')}: "
            "what refused it changed (a GPU inventory, a preemption hold, an assumption)"
        ),
    }
    return {"metadata": {"uid": uid}, "status": {"conditions": [condition]}}


class PodRequeuer:
    """Requeues pods through ``client`` (owned by the caller)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def requeue(self, pod: PodRef, at: datetime | None = None) -> tuple[RequeueOutcome, str]:
        """Set :data:`REQUEUE_CONDITION` (``at``, default now) on this incarnation of ``pod``:
        the outcome and the server's words when it did not (``FAILED`` with HTTP 403 when RBAC
        refuses). Never raises for API trouble."""
        try:
            await self._client.patch(
                Pod.Status,
                pod.name,
                requeue_patch(pod.uid, at),
                namespace=pod.namespace,
                patch_type=PatchType.STRATEGIC,
            )
        except CLIENT_ERRORS as exc:
            failure, code, _, detail = classify(exc)
            if failure in (Failure.NOT_FOUND, Failure.CONFLICT, Failure.INVALID):
                return RequeueOutcome.GONE, f"HTTP {code}: {detail}"
            return RequeueOutcome.FAILED, f"HTTP {code}: {detail}" if code else detail
        return RequeueOutcome.REQUEUED, ""
