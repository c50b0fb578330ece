"""Small value types naming API objects, shared by the binder and the event recorder."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PodRef"]


@dataclass(frozen=True, slots=True)
class PodRef:
    """One pod incarnation: ``namespace/name`` plus its ``metadata.uid``.

    The UID tells a pod from a later pod of the same name; calls made with a ``PodRef`` never
    act on a recreated pod. Build one from an extender bind request's ``PodNamespace``,
    ``PodName`` and ``PodUID``.
    """

    namespace: str
    name: str
    uid: str

    def __post_init__(self) -> None:
        missing = [f for f in ("namespace", "name", "uid") if not getattr(self, f)]
        if missing:
            raise ValueError(f"PodRef needs a non-empty {', '.join(missing)}: {self!r}")

    @property
    def key(self) -> str:
        """``namespace/name``, the key the cache and the ledger use."""
        return f"{self.namespace}/{self.name}"
