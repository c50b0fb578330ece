"""GPU-aware preemption in the extender: kube-scheduler's ``preempt`` verb, the preemptions
kube-scheduler never asks about, and holds that keep freed GPUs for their preemptors.

kube-scheduler (v1.37) preempts on node totals and asks an extender only about the nodes where
its own dry run found victims (docs/usage.md, "Priorities and preemption", has the whole story).
:class:`Preemptor` fills both gaps with one decision, ``gpushare.core.preemption``:

* **preempt** (``POST <prefix>/preempt``): for each candidate node kube-scheduler sends, the
  cheapest GPU-correct victim set on that node, or the node is dropped (nothing helps, or the
  pod can never fit there). The nodes the pod's last filter refused by GPU alone (kube-scheduler
  sends them no victims in 1.37, so they never reach this verb) are weighed too. Only the one
  best node is answered, so the extender knows where the pod will go and holds its GPUs there;
  kube-scheduler then evicts the victims and nominates the pod. If the victims are still
  running ``handover_s`` after the answer (kube-scheduler never got it: a connection reset, a
  timeout, a restart), the leader evicts them itself, as for a hold of its own. When the best
  node is one
  kube-scheduler did not send, the extender answers no node and preempts there itself. A
  candidate with no victims (Kubernetes 1.38 sends them) is weighed like any other; an answer
  never names a node without victims (1.37 refuses that).
* **the cases kube-scheduler never sends** (a node whose total fits but whose GPUs do not): a
  filter that passed no node notes the nodes it refused for want of GPU room
  (:meth:`Preemptor.unschedulable`). If no ``preempt`` call for the pod comes within
  ``wait_s`` (kube-scheduler's PostFilter runs right after the filter, in the same scheduling
  cycle), the leader preempts itself: it chooses the best node, checks every victim's eviction
  with a dry run (a PodDisruptionBudget that refuses one leaves them all running), records
  the hold, then evicts them through the Eviction API (graceful termination, budgets checked
  by the API server).
* **holds**: the GPUs a preemptor is to get are held for it while its victims terminate: pods of
  lower or equal priority cannot take them (``gpushare.core.preemption.with_holds``, in filter,
  prioritize and bind), pods of higher priority can; the preemptor itself passes the filter on
  the hold's node only (``Scheduler``). A hold ends when the preemptor binds (its
  bind takes the held GPUs), is deleted, finishes or is recreated, or at ``expires``
  (the longest grace period among its victims plus ``hold_margin_s``, at most ``hold_max_s``).
  Holds live in a ConfigMap (``gpushare.kube.holds``) written before any eviction, so a
  restarted or new leader keeps them and only finishes evicting the victims a hold names: it
  never chooses again for a pod that holds GPUs.

Only the replica that decides (the leader) preempts or writes holds; every replica reads them.
A pod with ``preemptionPolicy: Never`` never preempts; pods of equal or higher priority are
never victims.

**Trust.** Nothing a request body or a hold says is taken as the preemptor's word. The
preemptor is the API server's pod: the extender's cache of it (a watch of the API server) for
deciding, read anew (``reader``, a ``GET``) before any eviction. A ``filter`` or ``preempt``
body only names a pod (namespace, name and UID); a pod the API server does not have pending
under that UID is refused (``gpushare_extender_preemption_refusals_total{what="request"}``),
and its priority, ``preemptionPolicy`` and request are always read from the API server's copy.
A hold (the extender's own or one read from the ConfigMap, ``gpushare.extender.holds``: capped
in time and priority as it is read) is checked at every round of the loop and again, against
the fresh read, before its victims are evicted: its preemptor pending, of the hold's priority
and allowed to preempt; each victim still there on the hold's node, holding GPUs there (the
ledger's allocation) and of lower priority than the preemptor. A hold that fails is dropped
(from the ConfigMap too), with a warning naming what failed, and nobody is evicted for it
(``...refusals_total{what="hold"}``; its end ``refused``).

Events name node, GPU and amounts on the preemptor (``GPUPreemption``,
``GPUPreemptionBlocked``, ``GPUPreemptionHoldExpired``) and on each victim
(``PreemptedForGPU``); metrics: :class:`PreemptionMetrics`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpushare.core.ask import PodAsk
from gpushare.core.handshake import PendingPod
from gpushare.core.model import Allocation, ContainerAllocation, NodeState, PodRequest
from gpushare.core.preemption import (
    DEFAULT_MAX_CHECKS,
    Hold,
    Preemption,
    PreemptionStatus,
    Resident,
    VictimCost,
    best_preemption,
    plan_preemption,
    preemption_floor,
    with_holds,
)
from gpushare.core.resolve import NotOnNode, on_node
from gpushare.extender.holds import BudgetBook, HoldBook
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import (
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    MetaPod,
    MetaVictims,
)
from gpushare.kube.codec import (
    CodecError,
    Json,
    pod_deleting,
    pod_finished,
    pod_key,
    pod_node_name,
    pod_preempts,
    pod_priority,
    pod_request,
    pod_started_s,
    pod_uid,
)
from gpushare.kube.codec.resolve import node_view
from gpushare.kube.evictions import Eviction, EvictionOutcome
from gpushare.kube.refs import PodRef

__all__ = [
    "EVENT_BLOCKED",
    "EVENT_EXPIRED",
    "EVENT_PREEMPTING",
    "EVENT_VICTIM",
    "PreemptionEvents",
    "PreemptionMetrics",
    "PreemptionOptions",
    "Preemptor",
]

log = logging.getLogger(__name__)

EVENT_PREEMPTING = "GPUPreemption"
"""Event reason on a preemptor: its victims, node, GPUs and amounts."""
EVENT_VICTIM = "PreemptedForGPU"
"""Event reason on each victim: who it makes room for, where and how much."""
EVENT_BLOCKED = "GPUPreemptionBlocked"
"""Warning reason on a preemptor whose victims may not be evicted (a PodDisruptionBudget)."""
EVENT_EXPIRED = "GPUPreemptionHoldExpired"
"""Warning reason on a preemptor whose hold ended before it bound."""
UNEVICTABLE = 2**31
"""The priority given to a pod that must not be a victim (a bind in flight, a pod unknown)."""
EXTENDER = "gpushare"
SCHEDULER = "kube-scheduler"
READ_LIMIT = 200_000
"""Pods whose reading (``Preemptor.residents``) is kept at most; past it, all are read anew."""
_Weighable = tuple[NodeState, PodRequest, list[Resident], tuple[PendingPod, ...]]
"""A node as a preemptor weighs it: its state, the request there, residents, pending pods."""
FLOOR_LIMIT = 100_000
"""Remembered preemption floors (``Preemptor.plans``) at most; past it, all are computed anew."""


@dataclass(frozen=True, slots=True)
class PreemptionOptions:
    """How the extender preempts (module doc). ``wait_s``: after a filter that passed no node,
    how long to wait for kube-scheduler's ``preempt`` call before preempting itself;
    ``hold_margin_s``/``hold_max_s``/``default_grace_s``: a hold's life (the longest victim
    grace period, ``terminationGracePeriodSeconds``, default ``default_grace_s``, plus the
    margin, at most the maximum); ``retry_s``: how long a pod for which nothing helped (or a
    budget refused) is not planned for again; ``max_checks``: the search budget per node
    (``gpushare.core.preemption``); ``interval_s``: how often holds are reconciled;
    ``handover_s``: how long after answering ``preempt`` the extender leaves the evictions to
    kube-scheduler (which evicts within a second of the answer) before evicting itself."""

    wait_s: float = 2.0
    hold_margin_s: float = 30.0
    hold_max_s: float = 600.0
    default_grace_s: float = 30.0
    retry_s: float = 10.0
    max_checks: int = DEFAULT_MAX_CHECKS
    interval_s: float = 0.5
    handover_s: float = 10.0


class PreemptionEvents(Protocol):
    """Records an Event on a pod (``gpushare.extender.apiserver.ApiEventSink.note``)."""

    def note(self, pod: str, uid: str, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on pod ``namespace/name`` (UID ``uid``), in the background."""
        ...


class ReadsPods(Protocol):
    """Reads one pod from the API server now (``gpushare.kube.podreader.PodReader``)."""

    async def read(self, pod: PodRef) -> Json | None:
        """This incarnation of ``pod`` as the API server has it; ``None`` when it is gone;
        raises on API trouble."""
        ...


class Evicts(Protocol):
    """Evicts pods (``gpushare.kube.evictions.Evictor``)."""

    async def evict(self, pod: PodRef, *, dry_run: bool = False) -> Eviction:
        """Evict ``pod`` (or only ask, ``dry_run``); never raises for API trouble."""
        ...


class HoldWriter(Protocol):
    """Keeps holds where a new leader finds them (``gpushare.kube.holds.HoldStore``)."""

    async def put(self, hold: Hold) -> None:
        """Record ``hold``; raises on API trouble."""
        ...

    async def drop(self, uid: str, read_from: str = "") -> None:
        """Remove the hold of preemptor ``uid`` (also from ConfigMap ``read_from``, where the
        book read it); raises on API trouble."""
        ...


class _HoldCount(Collector):
    def __init__(self, holds: HoldBook) -> None:
        self._holds = holds

    def describe(self) -> Iterable[Metric]:
        return [self._family()]

    def collect(self) -> Iterable[Metric]:
        family = self._family()
        family.add_metric([], float(len(self._holds)))
        return [family]

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "gpushare_extender_preemption_holds",
            "GPUs held for preemptors while their victims terminate, in holds.",
        )


class PreemptionMetrics:
    """The preemption series, on ``registry``:

    * ``gpushare_extender_preemptions_total{outcome}``: ``evicted`` (the extender evicted),
      ``delegated`` (kube-scheduler evicts the victims the extender chose), ``waiting`` (held
      while terminating pods go, nobody evicted), ``dropped`` (a ``preempt`` call whose every
      candidate was dropped: nothing helps), ``blocked`` (an eviction refused: a budget);
    * ``gpushare_extender_preemption_victims_total{evictor}``: victims chosen, by who evicts
      (``gpushare``, ``kube-scheduler``);
    * ``gpushare_extender_preemption_holds``: holds now;
    * ``gpushare_extender_preemption_hold_seconds{end}``: how long holds lasted, by how they
      ended (``bound``, ``gone``, ``expired``, ``superseded``, ``refused``: it failed the
      checks of "Trust", module doc);
    * ``gpushare_extender_preemption_refusals_total{what}``: what preemption refused to act
      on: ``request`` (a ``filter`` or ``preempt`` for a pod the API server does not have
      pending under that UID), ``hold`` (a hold that failed its checks);
    * ``gpushare_extender_preemption_step_seconds{step}``: how long each step of a
      ``preempt`` answer took: ``weigh`` (the candidate nodes weighed), ``record`` (the hold
      written to the ConfigMap); kube-scheduler waits for both in its scheduling cycle.
    """

    OUTCOMES = ("evicted", "delegated", "waiting", "dropped", "blocked")
    ENDS = ("bound", "gone", "expired", "superseded", "refused")
    REFUSED = ("request", "hold")

    def __init__(self, holds: HoldBook, registry: CollectorRegistry) -> None:
        self.preemptions = Counter(
            "gpushare_extender_preemptions",
            "GPU preemptions decided by the extender, by outcome.",
            ["outcome"],
            registry=registry,
        )
        self.victims = Counter(
            "gpushare_extender_preemption_victims",
            "Pods chosen as victims of GPU preemptions, by who evicts them.",
            ["evictor"],
            registry=registry,
        )
        self.hold_seconds = Histogram(
            "gpushare_extender_preemption_hold_seconds",
            "How long GPUs were held for a preemptor, by how the hold ended.",
            ["end"],
            buckets=(0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=registry,
        )
        self.steps = Histogram(
            "gpushare_extender_preemption_step_seconds",
            "How long each step of a preempt answer took (weigh: the candidate nodes; record: "
            "the hold written), seconds.",
            ["step"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=registry,
        )
        self.refusals = Counter(
            "gpushare_extender_preemption_refusals",
            "Preemption requests and holds refused because the API server does not confirm "
            "them, by what was refused.",
            ["what"],
            registry=registry,
        )
        for outcome in self.OUTCOMES:
            self.preemptions.labels(outcome)
        for what in self.REFUSED:
            self.refusals.labels(what)
        for step in ("weigh", "record"):
            self.steps.labels(step)
        for evictor in (EXTENDER, SCHEDULER):
            self.victims.labels(evictor)
        for end in self.ENDS:
            self.hold_seconds.labels(end)
        registry.register(_HoldCount(holds))


@dataclass
class _Plan:
    """A pod a filter found no node for: the nodes refused for want of GPU room, and when the
    extender preempts itself if kube-scheduler has not called ``preempt`` (monotonic)."""

    uid: str
    nodes: set[str]
    due: float


@dataclass
class _Victim:
    """When the extender last tried to evict a victim of a hold (monotonic)."""

    tried: float = field(default=-1e18)


class Preemptor:
    """Preemption for one extender (module doc). ``deciding`` says whether this replica may
    act now (the leader); ``evictor``/``store``/``events`` are the API adapters (``None``:
    nothing is evicted, written or recorded: the in-memory extender); ``reader`` reads the
    preemptor anew before evictions and when the cache lacks it (``None``: the cache's copy
    is the freshest there is); ``wall_clock``/``clock``: seconds since the epoch /
    monotonic."""

    def __init__(
        self,
        state: ExtenderState,
        holds: HoldBook,
        budgets: BudgetBook | None = None,
        *,
        evictor: Evicts | None = None,
        store: HoldWriter | None = None,
        events: PreemptionEvents | None = None,
        reader: ReadsPods | None = None,
        deciding: Callable[[], bool] = lambda: True,
        options: PreemptionOptions | None = None,
        registry: CollectorRegistry | None = None,
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.state = state
        self.holds = holds
        self.budgets = budgets or BudgetBook()
        self.options = options or PreemptionOptions()
        self._evictor = evictor
        self._store = store
        self._events = events
        self._reader = reader
        self._deciding = deciding
        self._wall = wall_clock
        self._clock = clock
        self.metrics = PreemptionMetrics(holds, registry or CollectorRegistry())
        self._plans: dict[str, _Plan] = {}
        self._quiet: dict[str, float] = {}  # pod key -> no new plan before (monotonic)
        self._busy: set[str] = set()
        self._tries: dict[str, _Victim] = {}  # victim UID -> last eviction try
        self._tasks: set[asyncio.Task[None]] = set()
        self._refusals_logged = -1e18  # monotonic: when a refused request was last logged
        self._refusals_quiet = 0  # refused requests not logged since
        # pod key -> (its object, its allocation, the budgets' version, what it reads as):
        # the state replaces a pod's dict on every change, so an entry is valid while both are
        # the very objects it was read from.
        self._read: dict[str, tuple[Json | None, Allocation, int, Resident]] = {}
        # (node, its version, the budgets' version, the shape's number in ``_shapes``) -> the
        # node's preemption floor for a pod of that shape holding nothing (``plans``).
        self._floors: dict[tuple[str, int, int, int], VictimCost | None] = {}
        self._shapes: dict[tuple[object, ...], int] = {}  # (containers, CPU, memory, priority)

    # -- views (filter, prioritize, bind) ----------------------------------------------------

    def now(self) -> float:
        """The wall clock holds are timed by (seconds since the Unix epoch)."""
        return self._wall()

    def held(self, node: str) -> bool:
        """Whether some hold is on ``node`` (its results then depend on the pod's priority)."""
        return bool(self.holds.on(node))

    def view(self, node: str, key: str, priority: int) -> NodeState | None:
        """Node ``node`` as pod ``key`` of ``priority`` sees it: everything allocated, and the
        GPUs held for preemptors it must not take; ``None`` for an unknown node."""
        state = self.state.schedulable_state(node)
        holds = self.holds.on(node)
        if state is None or not holds:
            return state
        return with_holds(state, holds, pod=key, priority=priority, now_s=self._wall())

    def assignment(
        self, key: str, node: str, request: PodRequest
    ) -> tuple[ContainerAllocation, ...] | None:
        """The GPUs held for pod ``key`` (asking ``request``) on ``node``: its bind takes
        them; ``None`` when none are held there for it, or for containers it does not have."""
        hold = self.holds.of(key)
        if hold is None or hold.node != node or self._wall() >= hold.expires_s:
            return None
        if sorted(c.container for c in hold.containers) != sorted(
            c.name for c in request.gpu_containers
        ):
            return None
        return hold.containers

    def waiting(self, key: str) -> Hold | None:
        """The hold pod ``key`` waits on, if any (for ``/inspect``)."""
        return self.holds.of(key)

    # -- the decision --------------------------------------------------------------------

    def residents(self, node: str) -> list[Resident]:
        """The pods with allocations on ``node`` as preemption sees them: a pod not yet seen
        bound (its bind in flight) or unknown is never a victim."""
        residents = []
        version = self.budgets.version
        for allocation in self.state.reservations.allocations(node):
            pod = self.state.cluster.api_pod(allocation.pod)
            known = self._read.get(allocation.pod)
            if (
                known is not None
                and known[0] is pod
                and known[1] is allocation
                and known[2] == version
            ):
                residents.append(known[3])
                continue
            if pod is None or pod_node_name(pod) != node or not pod_uid(pod):
                resident = Resident(allocation, priority=UNEVICTABLE)
            else:
                resident = Resident(
                    allocation,
                    priority=pod_priority(pod),
                    started_s=pod_started_s(pod),
                    budgets=self.budgets.selecting(pod),
                    terminating=pod_deleting(pod),
                )
            self._read[allocation.pod] = (pod, allocation, version, resident)
            residents.append(resident)
        if len(self._read) > READ_LIMIT:
            self._read.clear()  # bounded: pods gone are forgotten now and then
        return residents

    def plans(self, pod: Json, request: PodAsk, nodes: Iterable[str]) -> list[Preemption]:
        """What preemption can do for ``pod`` (read as ``request``) on each of ``nodes``
        (unknown and non-GPU-share nodes left out). Nodes are weighed from the lowest
        ``preemption_floor`` up; once the cheapest set found costs no more than the next
        node's floor, that node and the rest are left out (none can beat it), and a node whose
        best set costs no less than one already found is ``COSTLIER``: ``best_preemption``
        over the list is the best of all the nodes.

        Floors are remembered per node version (``cluster.version``: it moves with the node,
        every event of a pod bound there, its deletion or start included, pending and skipped
        pods and holds), the budgets' version, the pod's
        shape and priority, for pods that hold nothing (no allocation, no hold: the floor is
        then the same for every such pod). A remembered floor was computed at an earlier
        ``now``: for the work lost it can only be lower (work grows with time), so it still
        bounds every set from below. What lapses by the clock alone (a hold past its expiry, a
        pending pod's pin past the handshake timeout) moves the version only when the extender
        next ends it; until then a floor can be too high and its node left out: the choice is
        then a costlier set elsewhere, never a wrong one (every set is checked anew)."""
        key, priority = request.key, pod_priority(pod)
        allowed = self.budgets.allowed()
        now = self._wall()
        shared = self.holds.of(key) is None and self.state.reservations.allocation(key) is None
        if shared and (len(self._floors) >= FLOOR_LIMIT or len(self._shapes) >= FLOOR_LIMIT):
            self._floors.clear()  # bounded: old versions are forgotten now and then
            self._shapes.clear()
        asked = (request.containers, request.cpu_milli, request.memory_mib, priority)
        shape = self._shapes.setdefault(asked, len(self._shapes)) if shared else -1
        floors: list[tuple[VictimCost, int, str]] = []
        version, budgets = self.state.cluster.version, self.budgets.version
        built: dict[str, _Weighable] = {}  # the nodes whose views this call built already
        for name in nodes:
            memo = (name, version(name), budgets, shape)
            if shared and memo in self._floors:
                floor = self._floors[memo]
            else:
                weighed = self._weighable(name, key, request, priority)
                if weighed is None:
                    continue
                built[name] = weighed
                state, placed, residents, pending = weighed
                floor = preemption_floor(
                    state, placed, priority, residents, now_s=now, pending=pending
                )  # fmt: skip
                if shared:
                    self._floors[memo] = floor
            if floor is not None:
                floors.append((floor, len(floors), name))
        floors.sort()
        out = []
        incumbent: VictimCost | None = None  # the cheapest set so far: later nodes must beat it
        for floor, _, name in floors:
            if incumbent is not None and floor >= incumbent:
                break
            weighed = built.get(name) or self._weighable(name, key, request, priority)
            if weighed is None:
                continue
            state, placed, residents, pending = weighed
            plan = plan_preemption(
                state,
                placed,
                priority,
                residents,
                now_s=now,
                pending=pending,
                budgets=allowed,
                max_checks=self.options.max_checks,
                better_than=incumbent,
            )
            out.append(plan)
            if plan.helps and plan.cost is not None:
                incumbent = plan.cost if incumbent is None else min(incumbent, plan.cost)
        return out

    def _weighable(self, name: str, key: str, request: PodAsk, priority: int) -> _Weighable | None:
        """Node ``name`` as pod ``key`` of ``priority`` asking ``request`` weighs it: the
        state without the pod's own allocation, the request on that node, the residents and
        the pending pods; ``None`` for an unknown or non-GPU-share node, or one the pod can
        never be placed on."""
        info = self.state.cluster.node(name)
        view = self.view(name, key, priority)
        if info is None or view is None or not info.gpushare:
            return None
        placed = on_node(request, node_view(info))
        if isinstance(placed, NotOnNode):
            return None
        state = view.without(self.state.reservations.allocation(key))
        return state, placed, self.residents(name), self.state.reservations.pending(name)

    # -- filter: the nodes kube-scheduler will not send -------------------------------------

    def unschedulable(self, pod: Json, request: PodAsk, refused: Sequence[str]) -> None:
        """A filter passed no node for ``pod``; ``refused``: the nodes it refused for want of
        GPU room now (module doc). Cheap: the decision is made later."""
        key, uid = request.key, pod_uid(pod)
        if not refused or not uid or not pod_preempts(pod) or self.holds.of(key) is not None:
            return
        if key in self._busy or self._quiet.get(key, 0.0) > self._clock():
            return
        plan = self._plans.get(key)
        if plan is None or plan.uid != uid:
            self._plans[key] = _Plan(uid, set(refused), self._clock() + self.options.wait_s)
        else:
            plan.nodes.update(refused)

    # -- trust (module doc) ---------------------------------------------------------------

    def _cached(self, key: str, uid: str) -> Json | None:
        """The API server's copy of pod ``key`` in the cache, if it is incarnation ``uid``."""
        pod = self.state.cluster.api_pod(key)
        return pod if pod is not None and uid and pod_uid(pod) == uid else None

    async def _fresh(self, key: str, uid: str) -> Json | None:
        """Incarnation ``uid`` of pod ``key`` read from the API server now (the cache's copy
        without a ``reader``); ``None`` when it is gone; raises on API trouble."""
        namespace, slash, name = key.partition("/")
        if self._reader is None or not slash or not uid:
            return self._cached(key, uid)
        return await self._reader.read(PodRef(namespace, name, uid))

    async def _asked(self, key: str, uid: str) -> Json | None:
        """The pod a request names, as the API server has it, if it is pending (the cache's
        copy, or a fresh read when the cache has none yet). ``None`` when it is bound or
        going (nothing to do), and when there is no such pod: that is counted and logged
        (``_refused_request``)."""
        pod = self._cached(key, uid)
        if pod is None:
            try:
                pod = await self._fresh(key, uid) if self._reader is not None else None
            except Exception as error:
                log.info("preemption: pod %s could not be read: %s", key, error)
                return None
            if pod is None:
                self._refused_request(key, uid)
                return None
        return pod if _is_pending(pod) else None

    def _refused_request(self, key: str, uid: str) -> None:
        """Count a request for a pod the API server does not have pending; log it at most
        once a minute (a forged body must not flood the log)."""
        self.metrics.refusals.labels("request").inc()
        now = self._clock()
        if now - self._refusals_logged < 60.0:
            self._refusals_quiet += 1
            return
        quiet, self._refusals_quiet, self._refusals_logged = self._refusals_quiet, 0, now
        more = f" ({quiet} more such requests in the last minute)" if quiet else ""
        log.warning(
            "preemption refused for pod %s (UID %s): the API server has no such pending pod; "
            "nothing is held or evicted for a request body's word%s",
            key, uid or "none", more,
        )  # fmt: skip

    def _untrusted(self, hold: Hold, preemptor: Json) -> str:
        """Why ``hold`` may not be acted on with ``preemptor`` (the API server's pending
        copy of its pod), or ``""`` (module doc, "Trust")."""
        if not pod_preempts(preemptor):
            return f"its preemptor {hold.pod} may not preempt (preemptionPolicy: Never)"
        priority = pod_priority(preemptor)
        if hold.priority != priority:
            return (
                f"it says priority {hold.priority}, the API server says {hold.pod} has "
                f"priority {priority}"
            )
        if self.state.cluster.node(hold.node) is None:
            return f"node {hold.node} is unknown"
        for victim, uid in zip(hold.victims, hold.victim_uids, strict=True):
            pod = self.state.cluster.api_pod(victim)
            if pod is None or pod_uid(pod) != uid or pod_finished(pod):
                continue  # gone: nothing to evict
            node = pod_node_name(pod)
            if node != hold.node:
                return f"victim {victim} is on node {node or '(none)'}, not {hold.node}"
            allocation = self.state.reservations.allocation(victim)
            if allocation is None or allocation.node != hold.node:
                return f"victim {victim} holds no GPU on node {hold.node}"
            if pod_priority(pod) >= priority:
                return (
                    f"victim {victim} has priority {pod_priority(pod)}, not below the "
                    f"preemptor's {priority}"
                )
        return ""

    def _refuse(self, hold: Hold, why: str) -> None:
        """Drop ``hold``, which failed its checks: nobody is evicted for it."""
        if self.holds.of(hold.pod) is None:
            return
        self.metrics.refusals.labels("hold").inc()
        log.warning(
            "preemption hold of %s (UID %s) on node %s refused and dropped: %s",
            hold.pod, hold.uid, hold.node, why,
        )  # fmt: skip
        self._end(hold, "refused")

    # -- the preempt verb ----------------------------------------------------------------

    async def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        """kube-scheduler's ``preempt`` verb (module doc). The body names the pod; what the
        pod is (priority, ``preemptionPolicy``, request) is the API server's ("Trust")."""
        try:
            key = pod_key(args.pod)
        except CodecError as error:
            log.info("preempt: pod cannot be read, no candidate kept: %s", error)
            return ExtenderPreemptionResult()
        uid = pod_uid(args.pod)
        plan = self._plans.pop(key, None)
        pod = await self._asked(key, uid)
        if pod is None:
            return ExtenderPreemptionResult()
        try:
            request = pod_request(pod)
        except CodecError as error:
            log.info("preempt: pod %s cannot be read, no candidate kept: %s", key, error)
            return ExtenderPreemptionResult()
        offered = _offered(args)
        if not request.gpu_containers or not pod_preempts(pod):
            return ExtenderPreemptionResult()
        if self.holds.of(key) is not None or key in self._busy:
            return ExtenderPreemptionResult()  # its victims are terminating: wait for them
        refused = plan.nodes if plan is not None and plan.uid == uid else set()
        started = self._clock()
        options = self.plans(pod, request, sorted(set(offered) | refused))
        best = best_preemption(options)
        decided = self._clock()
        self.metrics.steps.labels("weigh").observe(decided - started)
        if best is None:
            self.metrics.preemptions.labels("dropped").inc()
            self._quiet[key] = self._clock() + self.options.retry_s
            return ExtenderPreemptionResult()
        if best.node not in offered or best.status is PreemptionStatus.WAIT:
            self._spawn(self._preempt_on(pod, request, best))
            return ExtenderPreemptionResult()
        hold = self._hold(pod, request, best, SCHEDULER)
        self._busy.add(key)
        try:
            if not await self._record(hold):
                return ExtenderPreemptionResult()
        finally:
            self._busy.discard(key)
        self.metrics.steps.labels("record").observe(self._clock() - decided)
        log.debug(
            "preempt %s: %d node(s) weighed in %.1f ms, the hold on %s recorded in %.1f ms",
            key, len(options), 1000 * (decided - started), best.node,
            1000 * (self._clock() - decided),
        )  # fmt: skip
        gpu_pods = self._uids_on(best.node)
        extra = [u for u in offered[best.node] if u not in gpu_pods]
        uids = list(hold.victim_uids) + extra
        self.metrics.preemptions.labels("delegated").inc()
        self.metrics.victims.labels(SCHEDULER).inc(len(hold.victims))
        self._announce(hold, best, SCHEDULER)
        violations = best.cost.pdb_violations if best.cost is not None else 0
        return ExtenderPreemptionResult(
            {best.node: MetaVictims([MetaPod(u) for u in uids], violations)}
        )

    def _uids_on(self, node: str) -> set[str]:
        """The UIDs of the pods holding GPUs on ``node``: kube-scheduler's victims among them
        are replaced by the extender's; its others (chosen for CPU or memory) are kept."""
        uids: set[str] = set()
        for allocation in self.state.reservations.allocations(node):
            pod = self.state.cluster.api_pod(allocation.pod)
            if pod is not None:
                uids.add(pod_uid(pod))
        return uids

    # -- bind ----------------------------------------------------------------------------

    def bound(self, key: str, node: str) -> None:
        """Pod ``key`` is bound to ``node``: its hold, if any, ends (freeing nothing where it
        bound on the hold's node: it took the held GPUs)."""
        hold = self.holds.of(key)
        if hold is not None:
            self._end(hold, "bound", frees=node != hold.node)

    # -- the loop ------------------------------------------------------------------------

    async def run(self) -> None:
        """Preempt for due plans and reconcile holds, every ``interval_s``, while deciding;
        until cancelled."""
        while True:
            await asyncio.sleep(self.options.interval_s)
            if not self._deciding():
                self._plans.clear()
                continue
            try:
                await self.tick()
            except Exception:
                log.exception("preemption: reconciling holds failed; trying again")

    async def tick(self) -> None:
        """One round: the plans whose wait is over, then every hold (module doc)."""
        if not self.state.cluster.synced:
            return  # holds are judged against the pods: all of them must be known
        now = self._clock()
        for key, plan in list(self._plans.items()):
            if plan.due > now:
                continue
            del self._plans[key]
            pod = await self._asked(key, plan.uid)
            if pod is None:
                continue
            try:
                request = pod_request(pod)
            except CodecError:
                continue
            best = best_preemption(self.plans(pod, request, sorted(plan.nodes)))
            if best is None:
                self._quiet[key] = now + self.options.retry_s
                continue
            await self._preempt_on(pod, request, best)
        for key in [k for k, until in self._quiet.items() if until <= now]:
            del self._quiet[key]
        await self._reconcile()

    async def drain(self) -> None:
        """Wait for preemptions started in the background (shutdown, tests)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # -- acting --------------------------------------------------------------------------

    def _spawn(self, work: object) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(work)  # type: ignore[arg-type]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _hold(self, pod: Json, request: PodAsk, best: Preemption, evictor: str) -> Hold:
        """The hold that keeps ``best``'s GPUs for ``pod`` (module doc, "holds")."""
        now = self._wall()
        victims = [self.state.cluster.api_pod(v) for v in best.victims]
        graces = [
            _grace_s(p, self.options.default_grace_s)
            for p in [*victims, *(self.state.cluster.api_pod(w) for w in best.waiting_for)]
            if p is not None
        ]
        life = min(self.options.hold_max_s, max(graces, default=0.0) + self.options.hold_margin_s)
        return Hold(
            pod=request.key,
            uid=pod_uid(pod),
            node=best.node,
            priority=pod_priority(pod),
            containers=best.assignment,
            victims=best.victims,
            victim_uids=tuple(pod_uid(p) if p is not None else "" for p in victims),
            created_s=now,
            expires_s=now + life,
            evictor=evictor,
        )

    async def _record(self, hold: Hold) -> bool:
        """Keep ``hold`` here and in the store; ``False`` (and nothing kept) when the store
        refuses. Lower-priority holds on the same GPUs are superseded."""
        self.holds.put(hold)
        if self._store is not None:
            try:
                await self._store.put(hold)
            except Exception as error:
                self.holds.drop(hold.pod)
                log.warning(
                    "preemption for %s: the hold could not be recorded: %s", hold.pod, error
                )
                return False
        held = {i for c in hold.containers for i in c.gpu_indices}
        for other in self.holds.on(hold.node):
            if (
                other.pod != hold.pod
                and other.priority < hold.priority
                and held & {i for c in other.containers for i in c.gpu_indices}
            ):
                self._end(other, "superseded")
        return True

    async def _preempt_on(self, pod: Json, request: PodAsk, chosen: Preemption) -> None:
        """The extender's own preemption of ``pod`` on ``chosen.node`` (module doc): decided
        again on the state now, every eviction dry-run first, the hold recorded, then the
        victims evicted."""
        key = request.key
        if key in self._busy or self.holds.of(key) is not None or not self._deciding():
            return
        self._busy.add(key)
        try:
            options = self.plans(pod, request, [chosen.node])
            best = options[0] if options and options[0].helps else None
            if best is None:
                self._quiet[key] = self._clock() + self.options.retry_s
                return
            hold = self._hold(pod, request, best, EXTENDER)
            self.holds.put(hold)  # from this instant nobody of lower priority takes the GPUs
            refusals = await self._dry_run(hold)
            if refusals:
                self.holds.drop(key)
                self._quiet[key] = self._clock() + self.options.retry_s
                self.metrics.preemptions.labels("blocked").inc()
                text = "; ".join(refusals)
                log.info("preemption for %s on %s blocked: %s", key, best.node, text)
                self._note(
                    key,
                    hold.uid,
                    EVENT_BLOCKED,
                    f"gpushare: cannot evict on node {best.node}: {text}",
                    warning=True,
                )
                return
            if not await self._record(hold):
                return
            outcome = "evicted" if hold.victims else "waiting"
            self.metrics.preemptions.labels(outcome).inc()
            self.metrics.victims.labels(EXTENDER).inc(len(hold.victims))
            self._announce(hold, best, EXTENDER)
            await self._evict(hold)
        finally:
            self._busy.discard(key)

    async def _dry_run(self, hold: Hold) -> list[str]:
        """Why any victim of ``hold`` may not be evicted (empty: all may)."""
        if self._evictor is None:
            return []
        refusals = []
        for victim, uid in zip(hold.victims, hold.victim_uids, strict=True):
            namespace, _, name = victim.partition("/")
            answer = await self._evictor.evict(PodRef(namespace, name, uid), dry_run=True)
            if (
                answer.outcome is EvictionOutcome.REFUSED
                or answer.outcome is EvictionOutcome.FAILED
            ):
                refusals.append(f"{victim}: {answer.detail or answer.outcome}")
        return refusals

    async def _evict(self, hold: Hold) -> None:
        """Evict the victims of ``hold`` still running and not tried in the last few seconds;
        for a hold answered to kube-scheduler, only once ``handover_s`` has passed. Before the
        first eviction the preemptor is read anew and the hold checked against it ("Trust",
        module doc): a hold that fails is dropped and nobody is evicted."""
        if self._evictor is None:
            return
        handed_over = hold.evictor != EXTENDER
        if handed_over and self._wall() - hold.created_s < self.options.handover_s:
            return
        now = self._clock()
        due: list[tuple[str, str]] = []
        for victim, uid in zip(hold.victims, hold.victim_uids, strict=True):
            pod = self.state.cluster.api_pod(victim)
            if pod is None or pod_uid(pod) != uid or pod_deleting(pod) or pod_finished(pod):
                continue
            tried = self._tries.setdefault(uid, _Victim())
            if now - tried.tried < self.options.retry_s / 2:
                continue
            due.append((victim, uid))
        if not due or not self._deciding():
            return  # only the leader evicts
        try:
            preemptor = await self._fresh(hold.pod, hold.uid)
        except Exception as error:
            log.info("preemption for %s: its pod could not be read, nobody evicted: %s",
                     hold.pod, error)  # fmt: skip
            return
        if preemptor is None or not _is_pending(preemptor):
            return  # gone or bound: the next round ends the hold
        why = self._untrusted(hold, preemptor)
        if why:
            self._refuse(hold, why)
            return
        for victim, uid in due:
            if not self._deciding():
                return
            self._tries[uid].tried = now
            if handed_over:
                log.info(
                    "preemption for %s: %s still runs %.0f s after the answer to kube-scheduler "
                    "(it may never have received it); evicting it",
                    hold.pod, victim, self._wall() - hold.created_s,
                )  # fmt: skip
            namespace, _, name = victim.partition("/")
            answer = await self._evictor.evict(PodRef(namespace, name, uid))
            if answer.outcome is not EvictionOutcome.EVICTED:
                log.info(
                    "evicting %s for %s: %s %s", victim, hold.pod, answer.outcome, answer.detail
                )

    async def _reconcile(self) -> None:
        """End the holds whose preemptor bound, went or expired; finish the extender's
        evictions a hold names (after a restart or a failed call)."""
        now = self._wall()
        for hold in self.holds.all():
            pod = self._cached(hold.pod, hold.uid)
            if pod is None and self._reader is not None:
                try:  # a preemptor the watch has not brought yet
                    pod = await self._fresh(hold.pod, hold.uid)
                except Exception as error:
                    log.info("preemption: the preemptor %s could not be read: %s", hold.pod, error)
                    continue
            if pod is None or pod_finished(pod):
                self._end(hold, "gone")
            elif node := pod_node_name(pod):
                self._end(hold, "bound", frees=node != hold.node)
            elif why := self._untrusted(hold, pod):
                self._refuse(hold, why)
            elif now >= hold.expires_s:
                self._end(hold, "expired")
                self._note(
                    hold.pod,
                    hold.uid,
                    EVENT_EXPIRED,
                    f"gpushare: the GPUs held on node {hold.node} for "
                    f"{hold.expires_s - hold.created_s:.0f} s were released before this pod "
                    "bound; it may preempt again",
                    warning=True,
                )
            else:
                await self._evict(hold)
        live = {u for h in self.holds.all() for u in h.victim_uids}
        for uid in [u for u in self._tries if u not in live]:
            del self._tries[uid]

    def _end(self, hold: Hold, how: str, *, frees: bool = True) -> None:
        """Drop ``hold`` here and, in the background, from the store (and from the
        ConfigMap it was read from, where that is another shard: ``HoldStore.drop``)."""
        read_from = self.holds.source(hold.pod)
        if self.holds.drop(hold.pod, frees=frees) is None:
            return
        self.metrics.hold_seconds.labels(how).observe(max(0.0, self._wall() - hold.created_s))
        if self._store is not None and self._deciding():
            self._spawn(self._forget(hold, read_from))

    async def _forget(self, hold: Hold, read_from: str) -> None:
        assert self._store is not None
        try:
            await self._store.drop(hold.uid, read_from)
        except Exception as error:
            log.warning("preemption: the hold of %s stays recorded: %s", hold.pod, error)

    # -- events --------------------------------------------------------------------------

    def _note(
        self, key: str, uid: str, reason: str, message: str, *, warning: bool = False
    ) -> None:
        if self._events is not None and uid:
            self._events.note(key, uid, reason, message, warning=warning)

    def _announce(self, hold: Hold, best: Preemption, evictor: str) -> None:
        """The Events of a decided preemption: on the preemptor and on each victim."""
        info = self.state.cluster.node(hold.node)
        unit = f" {info.unit}" if info is not None and info.unit else ""
        gpus = _describe_gpus(hold.containers, unit)
        who = "kube-scheduler evicts" if evictor == SCHEDULER else "evicting"
        if hold.victims:
            what = f"{who} {', '.join(hold.victims)} on node {hold.node}"
            if best.cost is not None:
                what += f" ({best.cost.describe()})"
        else:
            what = f"waiting for {', '.join(best.waiting_for)} to terminate on node {hold.node}"
        self._note(
            hold.pod,
            hold.uid,
            EVENT_PREEMPTING,
            f"gpushare: {what}; this pod gets {gpus}, held for it until it binds",
        )
        for victim, uid in zip(hold.victims, hold.victim_uids, strict=True):
            allocation = self.state.reservations.allocation(victim)
            freed = (
                _describe_gpus(allocation.containers, unit)
                if allocation is not None
                else "its GPUs"
            )
            victim_pod = self.state.cluster.api_pod(victim)
            own = pod_priority(victim_pod) if victim_pod is not None else "?"
            self._note(
                victim,
                uid,
                EVENT_VICTIM,
                f"gpushare: preempted to free {freed} of node {hold.node} for pod {hold.pod} "
                f"(priority {hold.priority} > {own})",
            )


def _is_pending(pod: Json) -> bool:
    """Whether ``pod`` waits to be scheduled: unbound, not being deleted, not finished."""
    return not (pod_node_name(pod) or pod_deleting(pod) or pod_finished(pod))


def _offered(args: ExtenderPreemptionArgs) -> dict[str, list[str]]:
    """kube-scheduler's candidates: node → the UIDs of the victims its dry run chose (maybe
    none, from 1.38)."""
    offered: dict[str, list[str]] = {}
    for node, meta in (args.node_name_to_meta_victims or {}).items():
        offered[node] = [p.uid for p in (meta.pods if meta is not None else None) or ()]
    for node, victims in (args.node_name_to_victims or {}).items():
        pods = (victims.pods if victims is not None else None) or ()
        offered.setdefault(node, []).extend(pod_uid(p) for p in pods)
    return offered


def _grace_s(pod: Json, default_s: float) -> float:
    """``spec.terminationGracePeriodSeconds``, or ``default_s``."""
    spec = pod.get("spec")
    value = spec.get("terminationGracePeriodSeconds") if isinstance(spec, dict) else None
    return float(value) if type(value) is int and value >= 0 else default_s


def _describe_gpus(containers: Sequence[ContainerAllocation], unit: str) -> str:
    """``GPU 0 (16 GiB)``, ``GPU 0,1 (8 GiB each)``, ``GPU 1 (whole)`` for ``containers``."""
    parts = []
    for c in containers:
        gpus = ",".join(map(str, c.gpu_indices))
        if c.exclusive:
            parts.append(f"GPU {gpus} (whole)")
            continue
        each = " each" if len(c.gpu_indices) > 1 else ""
        compute = f", {c.compute_milli / 10:g}% compute" if c.compute_milli else ""
        parts.append(f"GPU {gpus} ({c.gpu_share}{unit}{compute}{each})")
    return "; ".join(parts) or "no GPU"
