"""What preemption knows of the cluster beside pods and nodes: its holds and the
PodDisruptionBudgets. Fed by the cache (``ClusterCache(budgets=True, holds=...)``) on the
extender's event loop; read by filter, prioritize, bind and the preemption controller.

:class:`HoldBook` holds the preemption holds (``gpushare.core.preemption.Hold``) by preemptor
key. Two sources write it: the holds ConfigMaps (``gpushare.kube.holds``: the holds are spread
over shards), each whole on every watch event of it (``replace``), and this replica's own
decisions (``put``/``drop``) before a ConfigMap shows them. A local write is kept over the
ConfigMaps until one shows it (or ``local_ttl_s`` passes: a replica that lost the lead forgets
what it wrote but never saw), so a late watch event of an older ConfigMap never hides a hold
just made. A preemptor found in two shards (written under another shard count) counts once:
the hold created last (``source`` names the ConfigMap it was read from). Every change calls
``touch(node)`` for the nodes it affects (``ExtenderState.touch``: per-node caches see it).

What the ConfigMap says is input, not instructions: each hold read from it is capped as it is
read (``capped``): created no later than now, expiring at most ``max_life_s`` after it was
created (``--preemption-hold-max``), and of a priority no pod can exceed
(:data:`HIGHEST_PRIORITY`). Whether its preemptor and victims are what it says is checked
against the API server by the preemption loop before it counts for an eviction
(``gpushare.extender.preemption``, "Trust").

:class:`BudgetBook` holds the PodDisruptionBudgets (``gpushare.kube.codec.preemption``). A
budget whose selector cannot be read selects nothing and is logged once.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from gpushare.core.preemption import Hold
from gpushare.kube.codec import CodecError, Json, object_name
from gpushare.kube.codec.preemption import (
    DisruptionBudget,
    budgets_of,
    disruption_budget,
    holds_of,
)
from gpushare.kube.watch import Action, Change

__all__ = ["HIGHEST_PRIORITY", "BudgetBook", "HoldBook", "capped"]

log = logging.getLogger(__name__)

HIGHEST_PRIORITY = 2_000_001_000
"""The highest priority a pod can have: ``system-node-critical`` (Kubernetes'
``scheduling.SystemCriticalPriority`` + 1000, ``pkg/apis/scheduling/types.go``)."""


def capped(hold: Hold, *, now_s: float, max_life_s: float) -> Hold:
    """``hold`` as far as anyone may ask (module doc): created at most at ``now_s``
    (seconds since the Unix epoch), lasting what it says but at most ``max_life_s`` from its
    creation, of a priority of at most :data:`HIGHEST_PRIORITY`; ``hold`` itself when nothing
    is cut."""
    life_s = hold.expires_s - hold.created_s
    if hold.created_s <= now_s and life_s <= max_life_s and hold.priority <= HIGHEST_PRIORITY:
        return hold
    created_s = min(hold.created_s, now_s)
    return dataclasses.replace(
        hold,
        created_s=created_s,
        expires_s=created_s + max(0.0, min(life_s, max_life_s)),
        priority=min(hold.priority, HIGHEST_PRIORITY),
    )


class HoldBook:
    """The preemption holds this replica knows (module doc). ``touch`` is called with each node
    whose holds changed; ``freed`` with each node where a hold ended or changed (GPUs may have
    come free there; not for a hold added, which only takes GPUs, nor for one dropped with
    ``frees=False``: its preemptor bound on its GPUs); ``clock`` (monotonic seconds) times
    local writes; ``max_life_s``
    (seconds) and ``wall_clock`` (seconds since the Unix epoch) cap the holds the ConfigMap
    brings (``capped``)."""

    def __init__(
        self,
        touch: Callable[[str], None] = lambda _node: None,
        *,
        freed: Callable[[str], None] = lambda _node: None,
        local_ttl_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
        max_life_s: float = 600.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._touch = touch
        self._freed = freed
        self._local_ttl_s = local_ttl_s
        self._clock = clock
        self._max_life_s = max_life_s
        self._wall_clock = wall_clock
        self._stored: dict[str, Hold] = {}  # by preemptor key, as the ConfigMaps say
        self._sources: dict[str, str] = {}  # preemptor key -> the ConfigMap it was read from
        self._shards: dict[str, list[Hold]] = {}  # ConfigMap name -> the holds read there
        self._read: dict[str, dict[str, tuple[str, Hold]]] = {}  # name -> key -> (value, hold)
        self._problems: dict[str, list[str]] = {}  # ConfigMap name -> its refused entries
        self._local: dict[str, tuple[Hold | None, float]] = {}  # key -> (hold or drop, when)
        self._view: dict[str, Hold] = {}
        self._by_node: dict[str, dict[str, Hold]] = {}

    # -- writing ---------------------------------------------------------------------------

    def on_change(self, change: Change) -> None:
        """The cache's listener for the holds ConfigMaps."""
        name = change.key.rpartition("/")[2]
        self.replace(None if change.action is Action.DELETE else change.obj, source=name)

    def replace(self, configmap: Json | None, *, source: str | None = None) -> None:
        """Everything ConfigMap ``source`` (default: ``configmap``'s own name) holds now
        (``None``: it is gone)."""
        if source is None:
            source = object_name(configmap) if configmap is not None else ""
        known = self._read.setdefault(source, {})
        holds, problems = holds_of(configmap, known)
        if problems and problems != self._problems.get(source):
            for problem in problems:
                log.warning("preemption hold refused: %s", problem)
        self._problems[source] = problems
        now_s = self._wall_clock()
        self._shards[source] = [
            capped(hold, now_s=now_s, max_life_s=self._max_life_s) for hold in holds
        ]
        if configmap is None:
            del self._shards[source], self._read[source], self._problems[source]
        stored: dict[str, Hold] = {}
        sources: dict[str, str] = {}
        for name in sorted(self._shards):
            for read in self._shards[name]:
                seen = stored.get(read.pod)
                if seen is None or read.created_s > seen.created_s:
                    stored[read.pod], sources[read.pod] = read, name
        self._stored, self._sources = stored, sources
        now = self._clock()
        for key, (hold, at) in list(self._local.items()):
            if self._stored.get(key) == hold or now - at > self._local_ttl_s:
                del self._local[key]  # a ConfigMap shows it (or it is too old to keep)
        self._rebuild()

    def put(self, hold: Hold) -> None:
        """This replica made ``hold`` (it writes it to the ConfigMap next)."""
        self._local[hold.pod] = (hold, self._clock())
        self._rebuild()

    def drop(self, key: str, *, frees: bool = True) -> Hold | None:
        """This replica ended the hold of pod ``key`` (it writes that next); the hold, if
        there was one. ``frees=False``: its GPUs stay taken (its preemptor bound on them), so
        ``freed`` is not called for it."""
        old = self._view.get(key)
        self._local[key] = (None, self._clock())
        self._rebuild(quiet=key if not frees else None)
        return old

    def _rebuild(self, quiet: str | None = None) -> None:
        view = dict(self._stored)
        for key, (hold, _) in self._local.items():
            if hold is None:
                view.pop(key, None)
            else:
                view[key] = hold
        freed = {h.node for k, h in self._view.items() if view.get(k) != h and k != quiet}
        changed = {h.node for k, h in self._view.items() if view.get(k) != h}
        changed |= {h.node for k, h in view.items() if self._view.get(k) != h}
        self._view = view
        by_node: dict[str, dict[str, Hold]] = {}
        for key, hold in view.items():
            by_node.setdefault(hold.node, {})[key] = hold
        self._by_node = by_node
        for node in sorted(changed):
            self._touch(node)
        for node in sorted(freed):
            self._freed(node)

    # -- reading ---------------------------------------------------------------------------

    def of(self, key: str) -> Hold | None:
        """The hold of preemptor ``key``, or ``None``."""
        return self._view.get(key)

    def on(self, node: str) -> tuple[Hold, ...]:
        """The holds on ``node``, by preemptor key."""
        holds = self._by_node.get(node)
        return tuple(holds[k] for k in sorted(holds)) if holds else ()

    @property
    def problems(self) -> list[str]:
        """The ConfigMap entries refused, as each ConfigMap was last read, one line each."""
        return [p for name in sorted(self._problems) for p in self._problems[name]]

    def source(self, key: str) -> str:
        """The ConfigMap the hold of preemptor ``key`` was read from (``""``: none, or only
        this replica's own write so far)."""
        return self._sources.get(key, "")

    def all(self) -> list[Hold]:
        """Every hold, by preemptor key."""
        return [self._view[k] for k in sorted(self._view)]

    def __len__(self) -> int:
        return len(self._view)


class BudgetBook:
    """The PodDisruptionBudgets (module doc), fed by :meth:`on_change`."""

    def __init__(self) -> None:
        self._budgets: dict[str, DisruptionBudget] = {}
        self.version = 0
        """Changes with every budget added, changed or removed."""

    def on_change(self, change: Change) -> None:
        """The cache's listener for PodDisruptionBudgets."""
        self.version += 1
        if change.action is Action.DELETE:
            self._budgets.pop(change.key, None)
            return
        try:
            self._budgets[change.key] = disruption_budget(change.obj)
        except CodecError as error:
            self._budgets.pop(change.key, None)
            log.warning(
                "PodDisruptionBudget %s counted as selecting nothing: %s", change.key, error
            )

    def selecting(self, pod: Json) -> frozenset[str]:
        """The keys of the budgets that count ``pod``."""
        return budgets_of(pod, self._budgets.values()) if self._budgets else frozenset()

    def allowed(self) -> Mapping[str, int]:
        """Disruptions each budget allows now, by key."""
        return {key: budget.allowed for key, budget in self._budgets.items()}

    def add(self, budgets: Iterable[DisruptionBudget]) -> None:
        """Add or replace ``budgets`` (tests and the in-memory extender)."""
        for budget in budgets:
            self._budgets[budget.key] = budget
        self.version += 1
