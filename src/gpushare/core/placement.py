"""Placement decisions over a set of nodes: filter, score, break ties, choose GPUs — cached.

``Placer`` is the simulator's decision loop. For a pod it filters every node with
``check_fit``, scores the fitting ones with the policy's node half, takes the best, breaks ties
with the policy's optional ``tie_break(state, pod)`` (``TieBreaking``; computed only for the tied
nodes) and then the lowest ``tie_rank``, and lets the policy's GPU half choose the GPUs. The
extender does not run it: kube-scheduler picks the node from the extender's filter and
prioritize answers, which call the same core functions (``check_fit``, the policy's halves,
``tie_break``) with caches of their own (``gpushare.extender.scheduler``).

Speed comes from caching, not from a second implementation of any rule: a node's fit result and
score for a pod shape are kept until that node changes (a version counter per node), so a
decision costs O(nodes) numpy work plus core calls only for the nodes that changed since that
shape was last seen; identical node states share one computation. Before any core call, a
numpy pass drops the stale nodes that cannot fit on free CPU, free memory or the largest free
GPU (necessary conditions of ``check_fit``, so the result is the same): in a full cluster most
nodes fail there. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpushare.core.extenderscore import TIE_BREAK_SCALE
from gpushare.core.fit import check_fit
from gpushare.core.model import Allocation, NodeState, PodRequest
from gpushare.core.policies.base import Policy, tie_break_of

_MEMO_LIMIT = 2_000_000


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a pod goes: ``node_index`` into the placer's nodes, and the allocation."""

    node_index: int
    allocation: Allocation


@dataclass(slots=True)
class _ShapeCache:
    version: npt.NDArray[np.int64]
    fits: npt.NDArray[np.bool_]
    score: npt.NDArray[np.float64]
    tie_version: npt.NDArray[np.int64]
    tie: npt.NDArray[np.float64]


class Placer:
    """Cached decisions for ``policy`` over nodes whose states change one at a time.

    ``tie_rank[i]`` orders node i among equal scores and tie-breaks (lowest wins; default: list
    order).
    """

    def __init__(
        self,
        states: Sequence[NodeState],
        policy: Policy,
        tie_rank: Sequence[int] | None = None,
    ) -> None:
        count = len(states)
        if tie_rank is not None and len(tie_rank) != count:
            raise ValueError(f"{len(tie_rank)} tie ranks for {count} nodes")
        self.policy = policy
        self._states = list(states)
        self._rank = np.asarray(tie_rank if tie_rank is not None else range(count), dtype=np.int64)
        self._type_ids: dict[tuple[object, ...], int] = {}
        self._types = [self._type_of(s) for s in self._states]
        self._keys = [self._state_key(i) for i in range(count)]
        self._version = np.zeros(count, dtype=np.int64)
        # What a pod can need at most of node i (``_bounds``): free CPU, free memory (inf where
        # the node does not say) and the largest free memory of one GPU.
        self._cpu_free = np.zeros(count)
        self._memory_free = np.zeros(count)
        self._gpu_free_max = np.zeros(count, dtype=np.int64)
        for i in range(count):
            self._bounds(i)
        self._shapes: dict[tuple[object, ...], _ShapeCache] = {}
        self._memo: dict[tuple[object, ...], tuple[bool, float]] = {}
        self._tie_break = tie_break_of(policy)

    @property
    def states(self) -> Sequence[NodeState]:
        """The current node states, in the order given."""
        return self._states

    def _type_of(self, state: NodeState) -> int:
        node = state.node
        key = (node.gpus, node.cpu_milli, node.memory_mib)
        return self._type_ids.setdefault(key, len(self._type_ids))

    def _state_key(self, i: int) -> tuple[object, ...]:
        """Everything a fit check or score may read of node i: its type (GPUs, CPU and memory
        capacity, interned) and what is in use, compute and GPUs held whole included."""
        s = self._states[i]
        return (
            self._types[i],
            s.gpu_used,
            s.cpu_used_milli,
            s.memory_used_mib,
            s.tags_key,
            s.gpu_compute_used,
            s.gpu_whole,
        )

    def _bounds(self, i: int) -> None:
        state = self._states[i]
        node = state.node
        self._cpu_free[i] = np.inf if node.cpu_milli is None else state.cpu_free_milli
        self._memory_free[i] = (
            np.inf if node.memory_mib is None else node.memory_mib - state.memory_used_mib
        )
        self._gpu_free_max[i] = max(state.gpu_free, default=0)

    def _possible(self, pod: PodRequest, nodes: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        """False where ``pod`` certainly does not fit (``check_fit`` would say so); True where
        only ``check_fit`` can tell."""
        possible = np.ones(nodes.size, dtype=np.bool_)
        if pod.cpu_milli > 0:
            possible &= self._cpu_free[nodes] >= pod.cpu_milli
        if pod.memory_mib > 0:
            possible &= self._memory_free[nodes] >= pod.memory_mib
        if pod.gpu_containers:
            share = max(c.gpu_share for c in pod.gpu_containers)
            if share > 0:
                possible &= self._gpu_free_max[nodes] >= share
        return possible

    def _refresh(self, pod: PodRequest) -> _ShapeCache:
        shape = pod.shape
        cache = self._shapes.get(shape)
        count = len(self._states)
        if cache is None:
            cache = _ShapeCache(
                version=np.full(count, -1, dtype=np.int64),
                fits=np.zeros(count, dtype=np.bool_),
                score=np.zeros(count),
                tie_version=np.full(count, -1, dtype=np.int64),
                tie=np.zeros(count),
            )
            self._shapes[shape] = cache
        stale = np.flatnonzero(cache.version != self._version)
        if stale.size:
            memo = self._memo
            if len(memo) > _MEMO_LIMIT:
                memo.clear()
            deterministic = self.policy.deterministic
            fits_arr, score_arr, states, keys = cache.fits, cache.score, self._states, self._keys
            possible = self._possible(pod, stale)
            fits_arr[stale[~possible]] = False
            score_arr[stale[~possible]] = 0.0
            for i in stale[possible].tolist():
                key = (keys[i], shape)
                hit = memo.get(key)
                if hit is None:
                    fits = check_fit(states[i], pod).fits
                    value = self.policy.score(states[i], pod) if fits and deterministic else 0.0
                    hit = (fits, value)
                    memo[key] = hit
                fits_arr[i], score_arr[i] = hit
            cache.version[stale] = self._version[stale]
        return cache

    def _tie_breaks(
        self, cache: _ShapeCache, nodes: npt.NDArray[np.int64], pod: PodRequest
    ) -> npt.NDArray[np.float64]:
        """The policy's tie-break values for ``nodes``, computed only where stale."""
        assert self._tie_break is not None
        stale = nodes[cache.tie_version[nodes] != self._version[nodes]]
        if stale.size:
            memo, shape = self._memo, pod.shape
            for i in stale.tolist():
                key = (self._keys[i], shape, "tie")
                hit = memo.get(key)
                if hit is None:
                    hit = (True, self._tie_break(self._states[i], pod))
                    memo[key] = hit
                cache.tie[i] = hit[1]
            cache.tie_version[stale] = self._version[stale]
        return cache.tie[nodes]

    def decide(
        self, pod: PodRequest, among: npt.NDArray[np.bool_] | None = None
    ) -> Decision | None:
        """The best node and GPUs for ``pod``, or ``None`` when it fits nowhere. ``among``
        (one flag per node), when given, limits the choice to the nodes flagged (those
        kube-scheduler passes on to the extender). Changes nothing: the caller applies the
        allocation and passes the new state to ``replace``."""
        cache = self._refresh(pod)
        fits = cache.fits if among is None else cache.fits & among
        feasible = np.flatnonzero(fits)
        if feasible.size == 0:
            return None
        if self.policy.deterministic:
            scores = cache.score[feasible]
        else:
            states = self._states
            scores = np.array([self.policy.score(states[i], pod) for i in feasible.tolist()])
        best = feasible[scores == scores.max()]
        if best.size > 1 and self._tie_break is not None:
            ties = self._tie_breaks(cache, best, pod)
            best = best[ties == ties.max()]
        chosen = int(best[np.argmin(self._rank[best])]) if best.size > 1 else int(best[0])
        return self.place(pod, chosen)

    def values(self, pod: PodRequest, among: Sequence[int]) -> tuple[list[int], list[float]]:
        """The nodes of ``among`` that ``pod`` fits (the extender's filter) and the value the
        extender ranks each by: the policy's score plus its tie-break / ``TIE_BREAK_SCALE``
        (``gpushare.core.extenderscore.policy_value``), from the same caches as ``decide``."""
        cache = self._refresh(pod)
        nodes = np.asarray(among, dtype=np.int64)
        fitting = nodes[cache.fits[nodes]]
        if self.policy.deterministic:
            values = cache.score[fitting].copy()
        else:
            states = self._states
            values = np.array([self.policy.score(states[i], pod) for i in fitting.tolist()])
        if self._tie_break is not None and fitting.size:
            values += self._tie_breaks(cache, fitting, pod) / TIE_BREAK_SCALE
        return fitting.tolist(), values.tolist()

    def place(self, pod: PodRequest, index: int) -> Decision:
        """``pod`` on node ``index`` with the GPUs the policy chooses there. Precondition: the
        pod fits the node."""
        state = self._states[index]
        allocation = Allocation(
            pod=pod.key,
            node=state.node.name,
            containers=self.policy.choose_gpus(state, pod),
            cpu_milli=pod.cpu_milli,
            memory_mib=pod.memory_mib,
        )
        return Decision(index, allocation)

    def set_policy(self, policy: Policy) -> None:
        """Decide with ``policy`` from now on (a policy rebuilt on a new target workload);
        every cached score and tie-break is dropped."""
        self.policy = policy
        self._tie_break = tie_break_of(policy)
        self._shapes.clear()
        self._memo.clear()

    def replace(self, index: int, state: NodeState) -> None:
        """Node ``index`` is now ``state`` (after a placement, a release or a health change)."""
        if state.node.name != self._states[index].node.name:
            raise ValueError(
                f"node {index} is {self._states[index].node.name}, not {state.node.name}"
            )
        if state.node is not self._states[index].node:
            self._types[index] = self._type_of(state)
        self._states[index] = state
        self._keys[index] = self._state_key(index)
        self._bounds(index)
        self._version[index] += 1
