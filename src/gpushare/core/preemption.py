"""GPU-aware preemption: the fewest lower-priority pods to evict so that a pod fits one node's
GPUs, or why no set of them helps. Pure: no I/O, no clock (``now_s`` is an argument).

kube-scheduler's own preemption (``DefaultPreemption``) chooses victims on a node's *total* of an
extended resource: it removes every lower-priority pod, checks the node total, then gives back
("reprieves") the most important victims while the total still fits. On a node of two 16 GiB
GPUs holding 8 + 8 and 8 + 8 GiB, a pod asking 16 GiB gets the two newest pods evicted, which may
sit on different GPUs: the pod still fits no GPU, and the evictions were in vain
(docs/usage.md, "Priorities and preemption"). This module chooses them per GPU, under the fit
rules every other decision uses (``gpushare.core.fit.check_fit``: memory, compute, whole GPUs,
several GPUs and containers, allowed models and positions; and the device-plugin handshake rule,
``gpushare.core.handshake``), so the extender, ``kubectl inspect gpushare`` and any simulation
give one answer.

**Who can be evicted.** Only *residents* of strictly lower priority than the preemptor that are
not already terminating. A terminating resident frees its GPUs anyway: it is counted as gone
and never as a victim. Everything else in the node state (skipped pods' charges, holds of other
preemptors, pods of equal or higher priority) stays.

**Which set** (:class:`VictimCost`, compared as a tuple, smallest first), after kube-scheduler's
``SelectCandidate`` as far as the GPU structure allows:

1. PodDisruptionBudget violations: over every budget, the victims it selects beyond the
   disruptions it allows now (``budgets``; a budget not given allows none);
2. the highest priority among the victims;
3. the number of victims;
4. the work lost: seconds the victims have run, summed (a pod not started loses none).

Every criterion only grows when a victim is added, so the cheapest set is also minimal: no
victim can be left out and the pod still fit (``tests/test_core_preemption.py`` checks both
against brute force). Where kube-scheduler would then compare the sum of priorities, this order
compares the number of victims first: a pod is evicted only when it is needed.

**Search.** Victims with the same footprint (containers, GPUs, amounts, handshake state),
priority and budgets are interchangeable but for the work they lose, so only the most recently
started ones of such a group are ever taken. Branch and bound over the groups, starting from a
greedy minimal set: a branch is cut when its cost already reaches the best set's, or when even
removing every remaining candidate would not make room. At most ``max_checks`` fit checks are
spent per node; the answer then is the best set found, still minimal, with ``exhaustive``
false (never seen below a few hundred checks on 8-GPU nodes; ``bench/preemption.py``).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpushare.core.fit import FitResult, FitStatus
from gpushare.core.handshake import PendingPod, handshake_fit
from gpushare.core.model import Allocation, ContainerAllocation, NodeState, PodRequest

__all__ = [
    "DEFAULT_MAX_CHECKS",
    "Hold",
    "Preemption",
    "PreemptionStatus",
    "Resident",
    "VictimCost",
    "best_preemption",
    "plan_preemption",
    "preemption_floor",
    "with_holds",
]

DEFAULT_MAX_CHECKS = 4000
"""Fit checks one node's search may spend (each a ``check_fit`` under the handshake rule)."""


@dataclass(frozen=True, slots=True)
class Resident:
    """A pod whose GPUs are in a node state: what preemption needs to know of it.

    ``allocation`` is what it holds (its ``pod`` is the key); ``priority`` its
    ``spec.priority``; ``started_s`` when it started running (seconds on the same clock as
    ``now_s``; ``None``: not started, loses no work); ``budgets`` the names of the
    PodDisruptionBudgets that select it; ``terminating``: being deleted already.
    """

    allocation: Allocation
    priority: int = 0
    started_s: float | None = None
    budgets: frozenset[str] = frozenset()
    terminating: bool = False

    @property
    def key(self) -> str:
        """The pod's key (``namespace/name``)."""
        return self.allocation.pod


@dataclass(frozen=True, slots=True, order=True)
class VictimCost:
    """What evicting a set of pods costs, compared as a tuple (module doc, "Which set")."""

    pdb_violations: int = 0
    highest_priority: int = 0
    victims: int = 0
    work_lost_s: float = 0.0

    def describe(self) -> str:
        """``2 pod(s), highest priority 100, 0 PodDisruptionBudget violation(s), 1200 s of work
        lost``."""
        return (
            f"{self.victims} pod(s), highest priority {self.highest_priority}, "
            f"{self.pdb_violations} PodDisruptionBudget violation(s), "
            f"{self.work_lost_s:.0f} s of work lost"
        )


class PreemptionStatus(enum.StrEnum):
    """What preemption can do for a pod on one node."""

    FITS = "fits without preemption"
    WAIT = "fits once the terminating pods are gone"
    EVICT = "fits once the victims are evicted"
    NO_HELP = "evicting every lower-priority pod would not make room"
    NEVER = "can never fit the node"
    COSTLIER = "no set here costs less than one found on another node"


_HELPS = frozenset({PreemptionStatus.WAIT, PreemptionStatus.EVICT})


@dataclass(frozen=True, slots=True)
class Preemption:
    """The answer of :func:`plan_preemption` for one node.

    ``victims``: the pod keys to evict, sorted (``EVICT`` only); ``cost`` their
    :class:`VictimCost` (zero for ``WAIT`` and ``FITS``, ``None`` when nothing helps);
    ``assignment``: the GPUs the pod gets once the victims (and terminating pods) are gone;
    ``fit``: the verdict that explains the status (after the victims for ``WAIT``/``EVICT``,
    with every candidate removed for ``NO_HELP``, as it is now for ``FITS``/``NEVER``);
    ``waiting_for``: the terminating pods the pod waits for; ``exhaustive``: the search
    finished within its budget (otherwise the set is minimal but maybe not the cheapest).
    """

    status: PreemptionStatus
    node: str
    fit: FitResult
    victims: tuple[str, ...] = ()
    cost: VictimCost | None = None
    assignment: tuple[ContainerAllocation, ...] = ()
    waiting_for: tuple[str, ...] = ()
    exhaustive: bool = True

    @property
    def helps(self) -> bool:
        """True when the pod fits this node after evicting ``victims`` (maybe none) and
        waiting for the terminating pods."""
        return self.status in _HELPS

    def describe(self) -> str:
        """One line for people: the status with the victims and their cost, or the reason."""
        if self.status is PreemptionStatus.EVICT and self.cost is not None:
            return f"evict {', '.join(self.victims)} ({self.cost.describe()})"
        if self.status is PreemptionStatus.WAIT:
            return f"{self.status}: {', '.join(self.waiting_for)}"
        if self.status in (PreemptionStatus.NO_HELP, PreemptionStatus.NEVER):
            return f"{self.status} ({self.fit.describe()})"
        return str(self.status)


def plan_preemption(
    state: NodeState,
    pod: PodRequest,
    priority: int,
    residents: Sequence[Resident],
    *,
    now_s: float,
    pending: Sequence[PendingPod] = (),
    budgets: Mapping[str, int] | None = None,
    max_checks: int = DEFAULT_MAX_CHECKS,
    better_than: VictimCost | None = None,
) -> Preemption:
    """The cheapest set of ``residents`` to evict so that ``pod`` (priority ``priority``, its
    request in the node's unit) fits ``state`` (module doc).

    ``state`` is the node with everything on it, the residents' allocations included;
    ``pending`` the node's pods waiting for their device-plugin start (the handshake rule: a
    victim's entry goes with it); ``budgets`` the disruptions each PodDisruptionBudget allows
    now, by the names in ``Resident.budgets``; ``now_s`` the clock of ``Resident.started_s``.
    ``better_than``: the cost of the best set found on other nodes: only a cheaper one is
    looked for (``COSTLIER`` when there is none), which cuts most of the search when a
    preemptor's candidate nodes are weighed one after another (``best_preemption`` then picks
    the same node). ``ValueError`` for ``max_checks`` < 1.
    """
    if max_checks < 1:
        raise ValueError(f"max_checks must be >= 1, got {max_checks}")
    name = state.node.name
    now = handshake_fit(state, pod, pending)
    if now.fits:
        return Preemption(
            PreemptionStatus.FITS, name, now, cost=VictimCost(), assignment=now.assignment
        )
    if now.status is FitStatus.CAN_NEVER_FIT:
        return Preemption(PreemptionStatus.NEVER, name, now)
    leaving = [r for r in residents if r.terminating and r.key != pod.key]
    candidates = [
        r for r in residents if r.priority < priority and not r.terminating and r.key != pod.key
    ]
    search = _Search(
        _without(state, leaving),
        pod,
        pending=[p for p in pending if p.key not in {r.key for r in leaving}],
        candidates=candidates,
        budgets=budgets or {},
        now_s=now_s,
        max_checks=max_checks,
    )
    waiting_for = tuple(sorted(r.key for r in leaving))
    after = search.verdict([])
    if after.fits:
        return Preemption(
            PreemptionStatus.WAIT, name, after, cost=VictimCost(), assignment=after.assignment,
            waiting_for=waiting_for,
        )  # fmt: skip
    everything = search.verdict(candidates)
    if not everything.fits:
        return Preemption(PreemptionStatus.NO_HELP, name, everything)
    if better_than is not None and search.lower_bound() >= better_than:
        return Preemption(PreemptionStatus.COSTLIER, name, everything)
    found = search.cheapest(better_than)
    if found is None:
        return Preemption(PreemptionStatus.COSTLIER, name, everything)
    chosen, exhaustive = found
    fit = search.verdict(chosen)
    return Preemption(
        PreemptionStatus.EVICT,
        name,
        fit,
        victims=tuple(sorted(r.key for r in chosen)),
        cost=search.cost(chosen),
        assignment=fit.assignment,
        waiting_for=waiting_for,
        exhaustive=exhaustive,
    )


def best_preemption(options: Iterable[Preemption]) -> Preemption | None:
    """The option that helps at the least cost (node name on ties), or ``None`` when none
    helps: how a preemptor's node is chosen among its candidates."""
    helping = [o for o in options if o.helps and o.cost is not None]
    if not helping:
        return None
    return min(helping, key=lambda o: (o.cost, o.node))


@dataclass(frozen=True, slots=True)
class Hold:
    """GPUs kept for a preemptor while its victims terminate.

    Pod ``pod`` (UID ``uid``, priority ``priority``) is to get ``containers`` on node ``node``
    once ``victims`` (pod keys; ``victim_uids`` their UIDs, same order) are gone. ``evictor``
    says who evicts them (``"gpushare"``: the extender, through the Eviction API;
    ``"kube-scheduler"``: its own preemption, with the victims the extender chose);
    ``created_s``/``expires_s``: wall-clock seconds since the Unix epoch (a hold outlives the
    process that made it, so it is timed by the wall clock).
    """

    pod: str
    uid: str
    node: str
    priority: int
    containers: tuple[ContainerAllocation, ...]
    victims: tuple[str, ...]
    victim_uids: tuple[str, ...]
    created_s: float
    expires_s: float
    evictor: str = "gpushare"

    @property
    def allocation(self) -> Allocation:
        """What the hold keeps, as an allocation of its pod on its node."""
        return Allocation(self.pod, self.node, self.containers)

    def binds(self, pod: str, priority: int, now_s: float) -> bool:
        """Whether the hold keeps its GPUs from pod ``pod`` of ``priority`` at ``now_s``: it
        has not expired, and ``pod`` is another pod of at most the preemptor's priority (a pod
        of higher priority may take them, as kube-scheduler's nominated pods count only against
        pods of lower or equal priority)."""
        return pod != self.pod and priority <= self.priority and now_s < self.expires_s


def with_holds(
    state: NodeState, holds: Iterable[Hold], *, pod: str, priority: int, now_s: float
) -> NodeState:
    """``state`` with the GPUs of every hold on its node that ``Hold.binds`` pod ``pod`` of
    ``priority`` counted as used (while the victims still run, a held GPU may show less than
    nothing free: it takes nothing). GPU indices the node lacks are ignored."""
    known = {gpu.index for gpu in state.node.gpus}
    for hold in holds:
        if hold.node != state.node.name or not hold.binds(pod, priority, now_s):
            continue
        containers = tuple(
            c for c in hold.containers if all(index in known for index in c.gpu_indices)
        )
        state = state.with_allocation(Allocation(hold.pod, hold.node, containers))
    return state


def _steps(prefix_sums: Sequence[float]) -> list[float]:
    """The items of a prefix-sum sequence (``_Group.work_s``)."""
    return [b - a for a, b in itertools.pairwise(prefix_sums)]


def preemption_floor(
    state: NodeState,
    pod: PodRequest,
    priority: int,
    residents: Sequence[Resident],
    *,
    now_s: float,
    pending: Sequence[PendingPod] = (),
) -> VictimCost | None:
    """A cost no preemption on this node goes below (:func:`plan_preemption`'s arguments):
    zero where the pod fits now or once terminating pods are gone; else one victim of the
    lowest priority and the least work among the candidates; ``None`` where there is no
    candidate (nothing to evict can help). Cheap: no search. Weighing nodes from the lowest
    floor up, a node whose floor is no less than the best set found cannot beat it."""
    if any(r.terminating and r.key != pod.key for r in residents):
        return VictimCost()
    if not _short_everywhere(state, pod) and handshake_fit(state, pod, pending).fits:
        return VictimCost()
    candidates = [
        r for r in residents if r.priority < priority and not r.terminating and r.key != pod.key
    ]
    if not candidates:
        return None
    needed = _fewest_on_one_gpu(state, pod, candidates)
    if needed is None:
        return None
    return _floor(candidates, now_s, needed)


def _short_everywhere(state: NodeState, pod: PodRequest) -> bool:
    """Whether no GPU of the node has the free memory a one-container, one-GPU pod asks (it
    cannot fit now: the fit check is not needed)."""
    containers = pod.gpu_containers
    if len(containers) != 1 or containers[0].gpu_count != 1 or containers[0].exclusive:
        return False
    share = containers[0].gpu_share
    return all(free < share for free in state.gpu_free)


def _fewest_on_one_gpu(
    state: NodeState, pod: PodRequest, candidates: Sequence[Resident]
) -> int | None:
    """For a pod asking a memory share of one GPU (one container, no compute, no whole GPU,
    any GPU of the node): the fewest candidates whose memory, on the GPU that needs fewest,
    makes room (largest first); ``None`` when no GPU can be freed enough. 1 for any other
    pod (a bound: one victim at least)."""
    containers = pod.gpu_containers
    if len(containers) != 1:
        return 1
    (container,) = containers
    if (
        container.gpu_count != 1
        or container.exclusive
        or container.compute_milli
        or container.allowed_models
        or container.allowed_positions
    ):
        return 1
    position = {gpu.index: i for i, gpu in enumerate(state.node.gpus)}
    on_gpu: list[list[int]] = [[] for _ in state.node.gpus]
    for resident in candidates:
        for index, amount in resident.allocation.per_gpu().items():
            if index in position:
                on_gpu[position[index]].append(amount)
    best: int | None = None
    for i, gpu in enumerate(state.node.gpus):
        if not gpu.healthy or gpu.capacity < container.gpu_share:
            continue
        room, count = state.gpu_free[i], 0
        for amount in sorted(on_gpu[i], reverse=True):
            if room >= container.gpu_share:
                break
            room, count = room + amount, count + 1
        if room >= container.gpu_share and (best is None or count < best):
            best = count
    return None if best is None else max(best, 1)


def _floor(candidates: Sequence[Resident], now_s: float, needed: int) -> VictimCost:
    """No set of ``candidates`` (not empty) costs less: ``needed`` victims at least, the
    highest of them of the lowest priority here, losing the least work ``needed`` of them
    can."""
    works = sorted(
        0.0 if r.started_s is None else max(0.0, now_s - r.started_s) for r in candidates
    )
    return VictimCost(0, min(r.priority for r in candidates), needed, sum(works[:needed]))


def _without(state: NodeState, gone: Iterable[Resident]) -> NodeState:
    for resident in gone:
        state = state.without(resident.allocation)
    return state


@dataclass(frozen=True, slots=True)
class _Delta:
    """What one resident holds, by GPU position: memory, compute and whole GPUs, and its CPU
    and memory."""

    memory: tuple[tuple[int, int], ...]
    compute: tuple[tuple[int, int], ...]
    whole: tuple[int, ...]
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class _Group:
    """Interchangeable candidates (same footprint, priority and budgets), the most recently
    started first: a set takes a prefix of them."""

    members: tuple[Resident, ...]
    priority: int
    budgets: frozenset[str]
    work_s: tuple[float, ...]  # prefix sums of the members' work lost: work_s[k] for k members


class _Search:
    """Branch and bound over candidate groups for one node (module doc, "Search")."""

    def __init__(
        self,
        base: NodeState,
        pod: PodRequest,
        *,
        pending: Sequence[PendingPod],
        candidates: Sequence[Resident],
        budgets: Mapping[str, int],
        now_s: float,
        max_checks: int,
    ) -> None:
        self._base = base
        self._pod = pod
        self._pending = list(pending)
        self._pending_keys = {p.key: p for p in self._pending}
        self._budgets = budgets
        self._now_s = now_s
        self._checks_left = max_checks
        self._exhausted = False
        self._position = {gpu.index: p for p, gpu in enumerate(base.node.gpus)}
        self._deltas: dict[int, _Delta] = {}
        self.groups = self._group(candidates)

    def work(self, resident: Resident) -> float:
        """Seconds ``resident`` has run (0 when not started or started in the future)."""
        if resident.started_s is None:
            return 0.0
        return max(0.0, self._now_s - resident.started_s)

    def _group(self, candidates: Sequence[Resident]) -> list[_Group]:
        by_key: dict[tuple[int, tuple[str, ...], object], list[Resident]] = {}
        for resident in candidates:
            allocation = resident.allocation
            pending = self._pending_keys.get(resident.key)
            footprint = (
                allocation.containers,
                allocation.cpu_milli,
                allocation.memory_mib,
                None if pending is None else (pending.steps, pending.done, pending.resource),
            )
            by_key.setdefault(
                (resident.priority, tuple(sorted(resident.budgets)), footprint), []
            ).append(resident)
        groups: list[_Group] = []
        for same in by_key.values():
            members = sorted(same, key=lambda r: (self.work(r), r.key))
            sums = [0.0]
            for member in members:
                sums.append(sums[-1] + self.work(member))
            groups.append(
                _Group(tuple(members), members[0].priority, members[0].budgets, tuple(sums))
            )
        # Groups of lower priority and without budgets first, larger footprints first among
        # them: cheap sets are found early. The first member's key makes the order total.
        groups.sort(
            key=lambda g: (
                bool(g.budgets), g.priority, sorted(g.budgets),
                -sum(c.gpu_share * len(c.gpu_indices) for c in g.members[0].allocation.containers),
                g.members[0].key,
            )
        )  # fmt: skip
        return groups

    def verdict(self, removed: Iterable[Resident]) -> FitResult:
        """The pod's fit once ``removed`` (and the terminating pods) are gone."""
        gone = list(removed)
        keys = {r.key for r in gone}
        pending = [p for p in self._pending if p.key not in keys] if keys else self._pending
        return handshake_fit(self._state_without(gone), self._pod, pending)

    def _delta(self, resident: Resident) -> _Delta:
        """What ``resident`` holds per GPU position (computed once per search)."""
        found = self._deltas.get(id(resident))
        if found is None:
            position = self._position
            memory: dict[int, int] = {}
            compute: dict[int, int] = {}
            whole: list[int] = []
            for c in resident.allocation.containers:
                for index in c.gpu_indices:
                    p = position.get(index)
                    if p is None:
                        continue
                    memory[p] = memory.get(p, 0) + c.gpu_share
                    if c.compute_milli:
                        compute[p] = compute.get(p, 0) + c.compute_milli
                    if c.exclusive:
                        whole.append(p)
            allocation = resident.allocation
            found = _Delta(
                tuple(memory.items()), tuple(compute.items()), tuple(whole),
                allocation.cpu_milli, allocation.memory_mib,
            )  # fmt: skip
            self._deltas[id(resident)] = found
        return found

    def _state_without(self, gone: Sequence[Resident]) -> NodeState:
        """The base state with ``gone`` taken away, built once (as ``NodeState.without`` one
        allocation after another would, without the states in between)."""
        if not gone:
            return self._base
        base = self._base
        used = list(base.gpu_used)
        compute = list(base.gpu_compute_used)
        whole = list(base.gpu_whole)
        cpu, memory = base.cpu_used_milli, base.memory_used_mib
        two_dimensional = False
        for resident in gone:
            delta = self._delta(resident)
            for p, amount in delta.memory:
                used[p] -= amount
            for p, amount in delta.compute:
                compute[p] -= amount
                two_dimensional = True
            for p in delta.whole:
                whole[p] = False
                two_dimensional = True
            cpu -= delta.cpu_milli
            memory -= delta.memory_mib
        return NodeState(
            node=base.node,
            gpu_used=tuple(used),
            cpu_used_milli=cpu,
            memory_used_mib=memory,
            workload_tags=base.workload_tags,
            gpu_compute_used=tuple(compute) if two_dimensional else base.gpu_compute_used,
            gpu_whole=tuple(whole) if two_dimensional else base.gpu_whole,
        )

    def _fits(self, removed: Iterable[Resident]) -> bool:
        self._checks_left -= 1
        if self._checks_left < 0:
            self._exhausted = True
        return self.verdict(removed).fits

    def cost(self, chosen: Sequence[Resident]) -> VictimCost:
        """The :class:`VictimCost` of evicting ``chosen``."""
        selected: dict[str, int] = {}
        for resident in chosen:
            for budget in resident.budgets:
                selected[budget] = selected.get(budget, 0) + 1
        violations = sum(
            max(0, count - self._budgets.get(budget, 0)) for budget, count in selected.items()
        )
        return VictimCost(
            violations,
            max((r.priority for r in chosen), default=0),
            len(chosen),
            sum(self.work(r) for r in chosen),
        )

    def _cost_of(self, counts: Sequence[int]) -> VictimCost:
        selected: dict[str, int] = {}
        highest, victims, work = 0, 0, 0.0
        for group, k in zip(self.groups, counts, strict=False):
            if not k:
                continue
            for budget in group.budgets:
                selected[budget] = selected.get(budget, 0) + k
            highest = max(highest, group.priority)
            victims += k
            work += group.work_s[k]
        violations = sum(
            max(0, count - self._budgets.get(budget, 0)) for budget, count in selected.items()
        )
        return VictimCost(violations, highest, victims, work)

    def _members(self, counts: Sequence[int], full_from: int | None = None) -> list[Resident]:
        """The residents that ``counts`` take, every member of the groups from ``full_from``
        on as well."""
        chosen: list[Resident] = []
        for i, group in enumerate(self.groups):
            if full_from is not None and i >= full_from:
                chosen.extend(group.members)
            elif i < len(counts):
                chosen.extend(group.members[: counts[i]])
        return chosen

    def _greedy(self) -> list[int]:
        """A minimal set by dropping candidates from "all", the costliest first, while the pod
        still fits; as prefix counts per group."""
        kept = [list(group.members) for group in self.groups]
        order = sorted(
            ((i, r) for i, group in enumerate(self.groups) for r in group.members),
            key=lambda item: (bool(item[1].budgets), item[1].priority, self.work(item[1])),
            reverse=True,
        )
        for i, resident in order:
            trial = [r for rs in kept for r in rs if r is not resident]
            if self._fits(trial):
                kept[i] = [r for r in kept[i] if r is not resident]
        return [len(rs) for rs in kept]  # a prefix of as many is as good (module doc)

    def lower_bound(self) -> VictimCost:
        """No set of candidates costs less: the lowest priority, the fewest victims that could
        free the GPUs the pod needs (``_fewest``), the least work that many could lose."""
        count = self._fewest()
        works = sorted(w for g in self.groups for w in _steps(g.work_s))
        return VictimCost(0, min(g.priority for g in self.groups), count, sum(works[:count]))

    def _fewest(self) -> int:
        """At least this many victims are needed (memory alone): for a pod with one GPU
        container asking ``k`` GPUs, each GPU needs its largest candidates until its free
        memory holds the share (all of them for a whole GPU); the ``k`` GPUs needing fewest
        are summed (their ``k``-th smallest when a candidate spans several GPUs, as it may
        free two at once). 1 for any other pod."""
        containers = self._pod.gpu_containers
        if len(containers) != 1:
            return 1
        container = containers[0]
        base = self._base
        on_gpu: list[list[int]] = [[] for _ in base.node.gpus]
        wide = False
        for group in self.groups:
            delta = self._delta(group.members[0])
            wide = wide or len(delta.memory) > 1
            for p, amount in delta.memory:
                on_gpu[p].extend([amount] * len(group.members))
        needs: list[float] = []
        for p, gpu in enumerate(base.node.gpus):
            used = base.gpu_used[p]
            if not gpu.healthy or not container.allows_at(p, gpu.model):
                needs.append(float("inf"))
            elif container.exclusive:
                freed = sum(on_gpu[p])
                whole = base.gpu_whole[p] and not freed
                needs.append(len(on_gpu[p]) if freed >= used and not whole else float("inf"))
            else:
                short = container.gpu_share - (gpu.capacity - used)
                count, freed = 0, 0
                for amount in sorted(on_gpu[p], reverse=True):
                    if freed >= short:
                        break
                    freed, count = freed + amount, count + 1
                needs.append(count if freed >= short else float("inf"))
        needs.sort()
        chosen = needs[: container.gpu_count]
        if len(chosen) < container.gpu_count or chosen[-1] == float("inf"):
            return 1  # cannot tell: the search finds out
        return max(1, int(chosen[-1] if wide else sum(chosen)))

    def cheapest(self, better_than: VictimCost | None = None) -> tuple[list[Resident], bool] | None:
        """The cheapest set found and whether the search was exhaustive; with
        ``better_than``, only a set that costs less counts (``None`` when none was found)."""
        best_counts: list[int] | None
        if better_than is None:
            best_counts = self._greedy()
            best = self._cost_of(best_counts)
        else:
            best_counts, best = None, better_than
        groups = self.groups
        counts: list[int] = []

        def descend(i: int, cost: VictimCost) -> None:
            nonlocal best, best_counts
            if self._exhausted:
                return
            if i == len(groups):
                if cost < best:
                    best, best_counts = cost, list(counts)
                return
            for k in range(len(groups[i].members) + 1):
                counts.append(k)
                here = self._cost_of(counts) if k else cost
                if k and here >= best:
                    counts.pop()
                    break  # more of this group only costs more
                # Can the rest still make room, taken whole?
                if self._fits(self._members(counts, full_from=i + 1)):
                    descend(i + 1, here)
                counts.pop()
                if self._exhausted:
                    return

        descend(0, VictimCost())
        if best_counts is None:
            return None
        return self._members(best_counts), not self._exhausted
