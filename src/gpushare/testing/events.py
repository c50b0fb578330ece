"""Events kept in memory: the ``AllocateEvents`` of the device plugin's tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from gpushare.kube.events import EventType
from gpushare.kube.refs import PodRef

__all__ = ["RecordedEvents"]


@dataclass
class RecordedEvents:
    """Every Event asked for, in order: ``(object, type, reason, message)`` where the object
    is ``pod <namespace>/<name>`` or ``node <name>``."""

    events: list[tuple[str, str, str, str]] = field(default_factory=list)

    async def pod_event(
        self, pod: PodRef, reason: str, message: str, type: EventType = EventType.NORMAL
    ) -> str:
        """Record an Event on ``pod``."""
        self.events.append((f"pod {pod.namespace}/{pod.name}", str(type), reason, message))
        return reason

    async def node_event(
        self, node: str, reason: str, message: str, type: EventType = EventType.WARNING
    ) -> str:
        """Record an Event on node ``node``."""
        self.events.append((f"node {node}", str(type), reason, message))
        return reason

    def reasons(self) -> list[str]:
        """The reasons recorded, in order."""
        return [reason for _, _, reason, _ in self.events]
