"""One simulator run: submit a pod stream to a cluster, one pod at a time, with one policy.

The paper's mechanics (docs/simulator.md, "One run", step 4; the artifact's simulator): no
departures, no
retries; a pod that fits nowhere is dropped but still counts as arrived. Every decision is the
core's ``Placer`` (filter with ``check_fit``, score with the policy, ties by a per-run random node
order, GPUs by the policy); this module only keeps the books the paper plots.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpushare.core.fragmentation import TargetWorkload, compute_of, gpu_idle
from gpushare.core.model import Node, NodeState, PodRequest
from gpushare.core.placement import Placer
from gpushare.core.policies.base import Policy, workload_tag
from gpushare.core.policies.fgd import FragmentationMemo
from gpushare.sim.workload import gpu_demand

FloatArray = npt.NDArray[np.float64]


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

    All amounts are in GPU units (milli-GPU for openb): cumulative arrived and allocated
    request (``gpu_demand`` of the pods arrived and placed, as the paper counts requests),
    fragmentation F(M) and idle GPU (``gpu_idle`` per GPU: with two dimensions, what is free in
    both memory and compute). With two dimensions pods that ask opposite amounts can share a GPU,
    so allocated request can exceed capacity minus idle; the curves count allocated GPU as
    capacity minus idle (``gpushare.sim.metrics.bin_by_arrived``), the same number with one
    dimension.
    ``final_states`` is the cluster after the last pod.
    """

    arrived: FloatArray
    allocated: FloatArray
    fragmentation: FloatArray
    idle: FloatArray
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    placed: int = 0
    final_states: list[NodeState] = field(default_factory=list)


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
    placer = Placer([NodeState.empty(node) for node in nodes], policy, tie_rank)
    frag = FragmentationMemo(workload)

    def measure(state: NodeState) -> tuple[float, int]:
        compute = compute_of(state, workload)
        f = frag(state.node.models, state.cpu_free_milli, state.gpu_free, compute)
        return f, sum(gpu_idle(state.gpu_free, compute))

    measured = [measure(s) for s in placer.states]
    node_frag = [f for f, _ in measured]
    node_idle = [idle for _, idle in measured]
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
    for event, pod in enumerate(stream, start=1):
        demand = gpu_demand(pod)
        arrived_total += demand
        decision = placer.decide(pod)
        if decision is None:
            failed[pod_kind(pod, gpu_unit)] += 1
        else:
            chosen = decision.node_index
            state = placer.states[chosen].with_allocation(
                decision.allocation, workload_tag(pod, gpu_unit)
            )
            placer.replace(chosen, state)
            new_frag, new_idle = measure(state)
            frag_total += new_frag - node_frag[chosen]
            node_frag[chosen] = new_frag
            idle_total += new_idle - node_idle[chosen]
            node_idle[chosen] = new_idle
            allocated_total += demand
            placed += 1
        arrived[event] = arrived_total
        allocated[event] = allocated_total
        fragmentation[event] = frag_total
        idle[event] = idle_total
        if progress is not None and event % 500 == 0:
            progress(event)
    if progress is not None:
        progress(len(stream))
    return RunRecord(
        arrived, allocated, fragmentation, idle, dict(failed), placed, list(placer.states)
    )
