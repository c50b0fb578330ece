"""The bind path's seams to the API server: what the extender's bind asks of it.

``Binder`` creates the ``pods/binding`` subresource with the allocation's annotations
(docs/interfaces.md, "Binding: ``pods/binding``"; ``gpushare.extender.apiserver.ApiBinder``
implements it on ``gpushare.kube``); ``EventSink`` records each bind's outcome as a Kubernetes
Event (``ApiEventSink``). ``UnwiredBinder`` is the binder of an extender without an API server
(``--in-memory``): it refuses, saying so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

__all__ = ["BindEvent", "Binder", "Binding", "EventSink", "UnwiredBinder"]


@dataclass(frozen=True, slots=True)
class Binding:
    """Bind pod ``namespace/name`` (UID ``uid``, a precondition) to ``node`` and merge
    ``annotations`` into the pod in the same call."""

    namespace: str
    name: str
    uid: str
    node: str
    annotations: Mapping[str, str]


class Binder(Protocol):
    """Creates bindings (``gpushare.kube`` implements it with the API server).

    Return ``None`` when the pod is bound to ``binding.node`` with the annotations merged —
    also when it already was (a retried bind whose first answer was lost); return an error text
    when the pod is certainly not bound; raise when the outcome is unknown (a timeout): the
    extender then keeps the assumed allocation until the watch shows the pod or it expires.
    """

    async def bind(self, binding: Binding) -> str | None:
        """Bind, see the class doc."""
        ...


@dataclass(frozen=True, slots=True)
class BindEvent:
    """What happened to one bind: ``ok`` with the GPUs in ``message``, or why it failed."""

    namespace: str
    name: str
    uid: str
    node: str
    ok: bool
    message: str


class EventSink(Protocol):
    """Records a bind's outcome as a Kubernetes Event on the pod (``gpushare.kube``)."""

    async def emit(self, event: BindEvent) -> None:
        """Record ``event``; failures are the sink's to log, never the bind's."""
        ...


class UnwiredBinder:
    """The binder of an extender started without an API-server connection: refuses, saying so."""

    async def bind(self, binding: Binding) -> str | None:
        """Always an error: nothing can create the Binding."""
        return (
            f"no API binder: pod {binding.namespace}/{binding.name} cannot be bound to "
            f"{binding.node} by an extender running on an in-memory state"
        )
