"""The cache of the extender's filter and prioritize (``gpushare.extender.scheduler`` module
doc): ``NodeShapeCache``, one result per (pod shape, node), valid while the node's ``version``
is the one it was computed at (fit results, filter verdicts, policy values). A pod's shape key
is ``shape_key``.

kube-scheduler sends each request a window of the feasible nodes that starts where the last
one stopped (``percentageOfNodesToScore``: 500 of 5,000 nodes), so consecutive requests seldom
name the same nodes; results are therefore kept per node, for every node ever asked about, and
a request costs a lookup per name plus one evaluation per node changed since it was last asked
about (``values``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

from gpushare.core.ask import PodAsk
from gpushare.core.model import PodRequest

CACHE_LIMIT = 500_000
"""Entries a ``NodeShapeCache`` keeps (summed over its shapes); past it, it starts again."""
SHAPE_LIMIT = 1_024
"""Pod shapes a ``NodeShapeCache`` keeps; past it, it starts again (bounded whatever clients
send)."""

ShapeKey = tuple[object, ...]
Value = TypeVar("Value")


def shape_key(pod: PodRequest | PodAsk) -> ShapeKey:
    """What a fit or a policy value depends on: the shape of the pod's request (or of its ask,
    which every node resolves alike) and its container names (the reasons name the
    container)."""
    return (pod.shape, tuple(c.name for c in pod.containers))


class NodeShapeCache(Generic[Value]):
    """A value per (``shape_key``, node name), kept with the node ``version`` it was computed
    at; at most ``limit`` entries and ``shape_limit`` shapes (then emptied; default
    ``CACHE_LIMIT`` and ``SHAPE_LIMIT``, read when the cache is made)."""

    def __init__(self, limit: int | None = None, shape_limit: int | None = None) -> None:
        self._limit = CACHE_LIMIT if limit is None else limit
        self._shape_limit = SHAPE_LIMIT if shape_limit is None else shape_limit
        self._columns: dict[ShapeKey, dict[str, tuple[int, Value]]] = {}
        self._entries = 0

    def get(self, node: str, shape: ShapeKey, version: int) -> Value | None:
        """The value for ``node`` and ``shape`` at ``version``, or ``None`` (absent or stale)."""
        column = self._columns.get(shape)
        cached = column.get(node) if column is not None else None
        return cached[1] if cached is not None and cached[0] == version else None

    def put(self, node: str, shape: ShapeKey, version: int, value: Value) -> None:
        """Keep ``value`` for ``node`` and ``shape`` at ``version``."""
        column = self._column(shape)
        if node not in column:
            self._entries += 1
        column[node] = (version, value)

    def values(
        self,
        shape: ShapeKey,
        names: Iterable[str],
        version_of: Callable[[str], int],
        compute: Callable[[str], Value],
    ) -> list[Value]:
        """The value of ``shape`` on each of ``names``, in order: the kept one where it was
        computed at the node's current ``version_of(name)``, else ``compute(name)`` (then
        kept). ``compute`` must not change any version."""
        column = self._column(shape)
        found: list[Value] = []
        for name in names:
            version = version_of(name)
            cached = column.get(name)
            if cached is not None and cached[0] == version:
                found.append(cached[1])
                continue
            value = compute(name)
            if cached is None:
                self._entries += 1
            column[name] = (version, value)
            found.append(value)
        return found

    def clear(self) -> None:
        """Forget every value (the policy's scores all changed)."""
        self._columns.clear()
        self._entries = 0

    def _column(self, shape: ShapeKey) -> dict[str, tuple[int, Value]]:
        if self._entries > self._limit or len(self._columns) > self._shape_limit:
            self.clear()
        column = self._columns.get(shape)
        if column is None:
            column = self._columns[shape] = {}
        return column
