"""Evict pods through the Eviction API (``pods/{name}/eviction``, ``policy/v1``) for preemption.

An eviction, unlike a delete, is refused by the API server when it would break a
PodDisruptionBudget (HTTP 429 with a ``DisruptionBudget`` cause), honours the pod's
``terminationGracePeriodSeconds`` and gives the pod a ``DisruptionTarget`` condition. Each call
names the pod's UID as a precondition, so a pod recreated under the same name is never evicted
in its place. ``dry_run`` asks the same question without acting (``dryRun=All``): the
extender asks it for every victim before it evicts the first, so that a budget that refuses
one victim leaves them all running.

:meth:`Evictor.evict` answers an :class:`Eviction`: ``EVICTED`` (201; also when the pod is
already being deleted), ``GONE`` (404 or another UID: nothing to do), ``REFUSED`` (429: a
budget; 403: RBAC; 4xx: the request) or ``FAILED`` (5xx or no answer: the outcome is
unknown, try again). RBAC: ``pods/eviction`` ``create``.

Like :mod:`gpushare.kube.binder`, the call goes through a dict-typed subresource: lightkube's
``PodEviction`` would decode the ``Status`` reply as an ``Eviction``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lightkube import AsyncClient
from lightkube.core import resource as lightkube_resource
from lightkube.models.meta_v1 import ObjectMeta

from gpushare.kube.errors import CLIENT_ERRORS, Failure, classify
from gpushare.kube.refs import PodRef

__all__ = ["RBAC_RULES", "Eviction", "EvictionOutcome", "Evictor"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
)
"""What :class:`Evictor` needs of its identity's RBAC."""


class EvictionOutcome(enum.StrEnum):
    """What one eviction did (module doc)."""

    EVICTED = "evicted"
    GONE = "gone"
    REFUSED = "refused"
    FAILED = "failed"


@dataclass(frozen=True, slots=True)
class Eviction:
    """The answer for ``pod``: ``outcome`` and the server's words (``detail``)."""

    pod: PodRef
    outcome: EvictionOutcome
    detail: str = ""
    dry_run: bool = False


class _EvictionRequest(dict[str, Any], lightkube_resource.NamespacedSubResource):
    """``pods/{name}/eviction`` as a plain dict: encodes an ``Eviction``, decodes any reply."""

    _api_info = lightkube_resource.ApiInfo(
        resource=lightkube_resource.ResourceDef("policy", "v1", "Eviction"),
        parent=lightkube_resource.ResourceDef("", "v1", "Pod"),
        plural="pods",
        verbs=["post"],
        action="eviction",
    )

    def __init__(self, body: Mapping[str, Any]) -> None:
        super().__init__(body)
        meta = body.get("metadata") or {}
        self.apiVersion = "policy/v1"
        self.kind = "Eviction"
        self.metadata = ObjectMeta(name=meta.get("name"), namespace=meta.get("namespace"))


class Evictor:
    """Evicts pods through ``client`` (owned by the caller)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    async def evict(self, pod: PodRef, *, dry_run: bool = False) -> Eviction:
        """Evict ``pod`` (this incarnation only), or only ask whether it could be
        (``dry_run``). Never raises for API trouble: the outcome says it."""
        request = _EvictionRequest(
            {
                "apiVersion": "policy/v1",
                "kind": "Eviction",
                "metadata": {"name": pod.name, "namespace": pod.namespace},
                "deleteOptions": {"preconditions": {"uid": pod.uid}},
            }
        )
        try:
            await self._client.create(request, pod.name, namespace=pod.namespace, dry_run=dry_run)
        except CLIENT_ERRORS as exc:
            failure, code, _, detail = classify(exc)
            if failure is Failure.NOT_FOUND or (failure is Failure.CONFLICT and "UID" in detail):
                return Eviction(pod, EvictionOutcome.GONE, detail, dry_run)
            if failure in (Failure.THROTTLED, Failure.FORBIDDEN, Failure.INVALID):
                return Eviction(pod, EvictionOutcome.REFUSED, f"HTTP {code}: {detail}", dry_run)
            return Eviction(pod, EvictionOutcome.FAILED, detail, dry_run)
        return Eviction(pod, EvictionOutcome.EVICTED, "", dry_run)
