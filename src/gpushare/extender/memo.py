"""The caches of the extender's filter and prioritize (``gpushare.extender.scheduler`` module
doc), each an object that owns its entries and its bound:

* ``NodeShapeCache`` — one result per (node, pod shape), valid while the node's ``version`` is
  the one it was computed at (fit results, deterministic policy values);
* ``AnswerMemo`` — the last whole answer per pod shape over one ``NodeNames`` list, with the
  nodes changed since (``ExtenderState.changed_since``) to re-evaluate.

A pod's shape key is ``shape_key``.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from gpushare.core.model import PodRequest
from gpushare.extender.outcomes import Verdict
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import HostPriority

MEMO_LIMIT = 64
"""Pod shapes an ``AnswerMemo`` keeps; past it, it starts again (bounded whatever clients send)."""
CACHE_LIMIT = 500_000
"""Entries a ``NodeShapeCache`` keeps; past it, it starts again."""

ShapeKey = tuple[object, ...]
Answer = tuple[list[str], dict[str, str], dict[str, str], dict[str, str]]
"""A filter answer: passed names, failed, unresolvable and held node → reason."""
Value = TypeVar("Value")


def shape_key(pod: PodRequest) -> ShapeKey:
    """What a fit or a policy value depends on: the pod's shape and its container names (the
    reasons name the container)."""
    return (pod.shape, tuple(c.name for c in pod.containers))


class NodeShapeCache(Generic[Value]):
    """A value per (node name, ``shape_key``), kept with the node ``version`` it was computed
    at; at most ``limit`` entries (then emptied)."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self._limit = limit
        self._entries: dict[tuple[str, ShapeKey], tuple[int, Value]] = {}

    def get(self, node: str, shape: ShapeKey, version: int) -> Value | None:
        """The value for ``node`` and ``shape`` at ``version``, or ``None`` (absent or stale)."""
        cached = self._entries.get((node, shape))
        return cached[1] if cached is not None and cached[0] == version else None

    def put(self, node: str, shape: ShapeKey, version: int, value: Value) -> None:
        """Keep ``value`` for ``node`` and ``shape`` at ``version``."""
        if len(self._entries) > self._limit:
            self._entries.clear()
        self._entries[(node, shape)] = (version, value)

    def clear(self) -> None:
        """Forget every value (the policy's scores all changed)."""
        self._entries.clear()


class ShapeMemo:
    """The last filter or prioritize of one pod shape: its candidate ``names``, the state
    ``epoch`` it reflects, per-node verdicts (``outcomes``) or policy ``values``, and the
    assembled answer (``result``: passed, failed, unresolvable and held, or ``priorities``;
    ``None``: to rebuild)."""

    __slots__ = ("epoch", "members", "names", "outcomes", "priorities", "result", "values")

    def __init__(self, names: list[str], epoch: int) -> None:
        self.names = names
        self.members = set(names)
        self.epoch = epoch
        self.outcomes: dict[str, Verdict] = {}
        self.values: dict[str, float] = {}
        self.result: Answer | None = None
        self.priorities: list[HostPriority] | None = None


class AnswerMemo:
    """The last answer per pod shape (a ``ShapeMemo`` each, at most ``limit`` shapes) over the
    nodes of ``state``."""

    def __init__(self, state: ExtenderState, limit: int = MEMO_LIMIT) -> None:
        self._state = state
        self._limit = limit
        self._memos: dict[ShapeKey, ShapeMemo] = {}

    def entry(self, pod: PodRequest, names: list[str]) -> tuple[ShapeMemo, set[str] | None]:
        """The memo of the last request of ``pod``'s shape over ``names``, and the names to
        re-evaluate in it (``None``: all of them, a fresh memo)."""
        key = shape_key(pod)
        epoch = self._state.epoch
        entry = self._memos.get(key)
        if entry is not None and entry.names == names:
            if entry.epoch == epoch:
                return entry, set()
            changed = self._state.changed_since(entry.epoch)
            if changed is not None:
                entry.epoch = epoch
                entry.result = None
                entry.priorities = None
                return entry, changed & entry.members
        if len(self._memos) > self._limit:
            self._memos.clear()
        entry = ShapeMemo(names, epoch)
        self._memos[key] = entry
        return entry, None

    def clear(self) -> None:
        """Forget every answer (the policy's scores all changed)."""
        self._memos.clear()
