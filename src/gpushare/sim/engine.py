"""One simulator run: submit a pod stream to a cluster, one pod at a time, with one policy.

The paper's mechanics (``shared/traces/openb/METHOD.md`` §6, step 6 and §9): no departures, no
retries; a pod that fits nowhere is dropped but still counts as arrived. Every decision goes
through the core: ``check_fit`` filters, ``policy.score`` ranks, ties go to the node earliest in
a per-run random order, ``policy.choose_gpus`` picks GPUs.

Speed comes from caching, not from a second implementation: a node's fit result and score for a
pod shape are kept until that node changes (a version counter per node), so each placement costs
O(nodes) numpy work plus core calls only for the nodes that changed since the shape was last
seen, and identical node states share one computation.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpushare.core.fit import check_fit
from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.model import Allocation, Node, NodeState, PodRequest
from gpushare.core.policies.base import Policy, workload_tag
from gpushare.core.policies.fgd import FragmentationMemo

FloatArray = npt.NDArray[np.float64]
_MEMO_LIMIT = 2_000_000


def pod_kind(pod: PodRequest, gpu_unit: int) -> str:
    """``cpu``, ``share``, ``1-gpu`` or ``multi-gpu``: the failure breakdown's categories."""
    tag = workload_tag(pod, gpu_unit)
    if tag is None:
        return "cpu"
    if tag in ("share", "1-gpu"):
        return tag
    return "multi-gpu"


@dataclass(slots=True)
class RunRecord:
    """Per-event series of one run (index 0 is the empty cluster, then one entry per pod).

    All amounts are in GPU units (milli-GPU for openb): cumulative arrived request, allocated,
    fragmentation F(M) and idle GPU.
    """

    arrived: FloatArray
    allocated: FloatArray
    fragmentation: FloatArray
    idle: FloatArray
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    placed: int = 0
    final_states: list[NodeState] = field(default_factory=list)


@dataclass(slots=True)
class _ShapeCache:
    version: npt.NDArray[np.int64]
    fits: npt.NDArray[np.bool_]
    score: FloatArray


def _state_key(node_type: int, state: NodeState) -> tuple[object, ...]:
    """Everything a fit check or a score may read of a node: its type (GPUs, CPU and memory
    capacity, interned to an int) and what is in use."""
    return (node_type, state.gpu_used, state.cpu_used_milli, state.memory_used_mib, state.tags_key)


def simulate(
    nodes: Sequence[Node],
    stream: Sequence[PodRequest],
    policy: Policy,
    *,
    tie_rank: Sequence[int],
    workload: TargetWorkload,
    gpu_unit: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> RunRecord:
    """Place ``stream`` on ``nodes`` in order with ``policy``; return the per-event series.

    ``tie_rank[i]`` orders node i among equal scores (lowest wins). ``workload`` is M for the
    fragmentation metric. ``progress`` is called with the number of pods done, every 500 pods.
    """
    count = len(nodes)
    if len(tie_rank) != count:
        raise ValueError(f"{len(tie_rank)} tie ranks for {count} nodes")
    rank = np.asarray(tie_rank, dtype=np.int64)
    states = [NodeState.empty(node) for node in nodes]
    models = [node.models for node in nodes]
    type_ids: dict[tuple[object, ...], int] = {}
    node_types = [
        type_ids.setdefault((node.gpus, node.cpu_milli, node.memory_mib), len(type_ids))
        for node in nodes
    ]
    node_version = np.zeros(count, dtype=np.int64)
    state_keys = [_state_key(node_types[i], s) for i, s in enumerate(states)]
    shapes: dict[tuple[object, ...], _ShapeCache] = {}
    memo: dict[tuple[object, ...], tuple[bool, float]] = {}
    frag = FragmentationMemo(workload)
    node_frag = [
        frag(models[i], states[i].cpu_free_milli, states[i].gpu_free) for i in range(count)
    ]
    node_idle = [sum(s.gpu_free) for s in states]
    frag_total = math.fsum(node_frag)
    idle_total = float(sum(node_idle))

    events = len(stream) + 1
    arrived = np.zeros(events)
    allocated = np.zeros(events)
    fragmentation = np.zeros(events)
    idle = np.zeros(events)
    fragmentation[0] = frag_total
    idle[0] = idle_total
    failed: Counter[str] = Counter()
    arrived_total = 0.0
    allocated_total = 0.0
    placed = 0
    deterministic = policy.deterministic

    for event, pod in enumerate(stream, start=1):
        shape = pod.shape
        cache = shapes.get(shape)
        if cache is None:
            cache = _ShapeCache(
                version=np.full(count, -1, dtype=np.int64),
                fits=np.zeros(count, dtype=np.bool_),
                score=np.zeros(count),
            )
            shapes[shape] = cache
        stale = np.flatnonzero(cache.version != node_version)
        if stale.size:
            if len(memo) > _MEMO_LIMIT:
                memo.clear()
            fits_arr, score_arr = cache.fits, cache.score
            for i in stale.tolist():
                key = (state_keys[i], shape)
                hit = memo.get(key)
                if hit is None:
                    fits = check_fit(states[i], pod).fits
                    value = policy.score(states[i], pod) if fits and deterministic else 0.0
                    hit = (fits, value)
                    memo[key] = hit
                fits_arr[i], score_arr[i] = hit
            cache.version[stale] = node_version[stale]
        feasible = np.flatnonzero(cache.fits)
        arrived_total += pod.gpu_total
        if feasible.size == 0:
            failed[pod_kind(pod, gpu_unit)] += 1
        else:
            if deterministic:
                scores = cache.score[feasible]
            else:
                scores = np.array([policy.score(states[i], pod) for i in feasible.tolist()])
            best = feasible[scores == scores.max()]
            chosen = int(best[np.argmin(rank[best])]) if best.size > 1 else int(best[0])
            state = states[chosen]
            allocation = Allocation(
                pod=pod.key,
                node=state.node.name,
                containers=policy.choose_gpus(state, pod),
                cpu_milli=pod.cpu_milli,
                memory_mib=pod.memory_mib,
            )
            state = state.with_allocation(allocation, workload_tag(pod, gpu_unit))
            states[chosen] = state
            state_keys[chosen] = _state_key(node_types[chosen], state)
            node_version[chosen] += 1
            new_frag = frag(models[chosen], state.cpu_free_milli, state.gpu_free)
            frag_total += new_frag - node_frag[chosen]
            node_frag[chosen] = new_frag
            new_idle = sum(state.gpu_free)
            idle_total += new_idle - node_idle[chosen]
            node_idle[chosen] = new_idle
            allocated_total += pod.gpu_total
            placed += 1
        arrived[event] = arrived_total
        allocated[event] = allocated_total
        fragmentation[event] = frag_total
        idle[event] = idle_total
        if progress is not None and event % 500 == 0:
            progress(event)
    if progress is not None:
        progress(len(stream))
    return RunRecord(arrived, allocated, fragmentation, idle, dict(failed), placed, states)
