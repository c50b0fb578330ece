"""Kubernetes Events on pods and nodes: what GPU(s) a pod got, or why binding or allocating
failed.

:class:`EventRecorder` creates one core/v1 ``Event`` per call in the pod's namespace, named
``<pod>.<random>`` by the server (``generateName``), with ``involvedObject`` = the pod (UID
included), ``source.component`` and ``reportingComponent`` = ``gpushare-extender`` (by default),
``count`` 1, and first/last timestamps from the injected clock. ``kubectl describe pod`` shows
it under *Events*. Messages longer than :data:`MAX_MESSAGE_CHARS` are cut (the events API
caps notes at 1 KiB). :meth:`EventRecorder.node_event` does the same for a Node (an Event of a
cluster-scoped object lives in namespace ``default``, as kubelet's node events do).

Events are best effort: a failure raises :class:`~gpushare.kube.errors.ApiCallError`, and the
caller usually logs it and goes on. RBAC: ``events`` ``create``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from lightkube import AsyncClient
from lightkube.models.core_v1 import EventSource, ObjectReference
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error
from gpushare.kube.refs import PodRef

__all__ = [
    "MAX_MESSAGE_CHARS",
    "RBAC_RULES",
    "REPORTING_COMPONENT",
    "EventRecorder",
    "EventType",
]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
"""What :class:`EventRecorder` needs of its identity's RBAC."""

REPORTING_COMPONENT = "gpushare-extender"
MAX_MESSAGE_CHARS = 1024
_NAME_PREFIX_CHARS = 200  # generateName prefix; the server appends 5 characters


class EventType(enum.StrEnum):
    """The two event types Kubernetes knows."""

    NORMAL = "Normal"
    WARNING = "Warning"


def _utc_now() -> datetime:
    return datetime.now(UTC)


class EventRecorder:
    """Creates Events on pods through ``client`` (owned by the caller).

    ``component`` goes into ``source.component`` and ``reportingComponent``; ``instance``
    (e.g. the extender pod's name) into ``reportingInstance``; ``clock``
    returns the current time (timezone-aware).
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        component: str = REPORTING_COMPONENT,
        instance: str | None = None,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        if not component:
            raise ValueError("component must not be empty")
        self._client = client
        self._component = component
        self._instance = instance
        self._clock = clock

    async def pod_event(
        self, pod: PodRef, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> str:
        """Create an Event on ``pod``; return its name. ``reason`` is a short CamelCase word
        (``GPUAssigned``, ``FailedBinding``). Raises ``ApiCallError``."""
        involved = ObjectReference(
            apiVersion="v1", kind="Pod", name=pod.name, namespace=pod.namespace, uid=pod.uid
        )
        return await self._create(involved, pod.namespace, pod.key, (reason, message, type))

    async def node_event(
        self, node: str, reason: str, message: str, type: EventType = EventType.WARNING
    ) -> str:
        """Create an Event on node ``node`` (namespace ``default``); return its name. Raises
        ``ApiCallError``."""
        involved = ObjectReference(apiVersion="v1", kind="Node", name=node, uid=node)
        return await self._create(involved, "default", f"node {node}", (reason, message, type))

    async def _create(
        self,
        involved: ObjectReference,
        namespace: str,
        what: str,
        note: tuple[str, str, EventType],
    ) -> str:
        reason, message, type = note
        if not reason:
            raise ValueError("reason must not be empty")
        now = self._clock()
        name = involved.name or "object"
        event = Event(
            metadata=ObjectMeta(generateName=f"{name[:_NAME_PREFIX_CHARS]}.", namespace=namespace),
            involvedObject=involved,
            reason=reason,
            message=message[:MAX_MESSAGE_CHARS],
            type=type.value,
            source=EventSource(component=self._component),
            reportingComponent=self._component,
            reportingInstance=self._instance,
            firstTimestamp=now,
            lastTimestamp=now,
            count=1,
        )
        try:
            created = await self._client.create(event)
        except CLIENT_ERRORS as exc:
            raise api_call_error(f"POST events {what} ({reason})", exc) from exc
        meta = created.metadata
        return (meta.name if meta is not None else None) or ""
