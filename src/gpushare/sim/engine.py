"""One simulator run: submit a pod stream to a cluster, one pod at a time, with one policy.

The paper's mechanics (docs/simulator.md, "One run", step 4; the artifact's simulator): no
departures, no
retries; a pod that fits nowhere is dropped but still counts as arrived. Every decision is the
core's ``Placer`` (filter with ``check_fit``, score with the policy, ties by a per-run random node
order, GPUs by the policy); this module only keeps the books the paper plots.

**Like the cluster** (``LikeCluster``; ``gpushare simulate --like-cluster``; docs/simulator.md,
"Like the cluster"): the pods go where kube-scheduler + ``gpushare extender`` would put them
rather than where the policy alone would. Every pod, as kube-scheduler does, is first filtered
on CPU, memory and total GPU memory (the extended resource) over the nodes in name order from a
rotating start, stopping at ``num_feasible_nodes_to_find`` feasible nodes
(``gpushare.core.kubescheduler.scan_feasible``). A pod that asks no GPU is then placed on one
of those by kube-scheduler's own scores (``gpushare.core.kubescheduler.score``), ties drawn
with a generator seeded by ``LikeCluster.seed``; the extender is never asked about it. For a
GPU pod the extender filters those nodes (``check_fit``) and maps the policy's values on the
rest to 0–10 (``gpushare.core.extenderscore.to_priorities``); kube-scheduler adds that, times
the extender's weight and 10, to its own scores and takes the best (ties drawn likewise); the
policy chooses the GPUs there. The policy sees what the extender sees: GPUs only, no CPU or
memory on nodes or pods (``blind_node``, ``blind_pod``; the extender reads neither), and no
count of a node's pods by kind (``NodeState.workload_tags``, which ``clustering`` reads: the
extender's ledger keeps none), while kube-scheduler's filter and scores and the metrics see
all. With
``learn_workload`` the policy (one of ``LEARNING_POLICIES``) is the extender's: built on an M
learned from the GPU pods seen so far (``gpushare.core.learned.KnownPods``, rebuilt as the
extender rebuilds it, ``node_local_context``); the fragmentation metric keeps the given M.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from gpushare.core import kubescheduler
from gpushare.core.extenderscore import extender_score, to_priorities
from gpushare.core.fragmentation import TargetWorkload, compute_of, gpu_idle
from gpushare.core.learned import LEARNING_POLICIES, KnownPods, node_local_context
from gpushare.core.model import Allocation, Node, NodeState, PodRequest
from gpushare.core.placement import Decision, Placer
from gpushare.core.policies import make_policy
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
    ``final_states`` is the cluster after the last pod; ``placed_on`` the node (by name) each
    pod of the stream went to, in stream order (``None``: dropped).
    """

    arrived: FloatArray
    allocated: FloatArray
    fragmentation: FloatArray
    idle: FloatArray
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    placed: int = 0
    final_states: list[NodeState] = field(default_factory=list)
    placed_on: list[str | None] = field(default_factory=list)


EXTENDER_WEIGHT = 10
"""The extender's weight in kube-scheduler's configuration (the chart's ``scheduler.weight``)."""


@dataclass(frozen=True, slots=True)
class LikeCluster:
    """A run placed as kube-scheduler + ``gpushare extender`` place (module doc). ``seed``
    seeds the draw among kube-scheduler's equal best nodes; ``percentage_of_nodes_to_score``
    is kube-scheduler's (0: adaptive, its default and the chart's); ``learn_workload``: the
    policy learns M from the GPU pods seen, as the extender does (for ``LEARNING_POLICIES``);
    ``extender_weight``: the extender's weight in kube-scheduler's configuration."""

    seed: int
    percentage_of_nodes_to_score: int = 0
    learn_workload: bool = True
    extender_weight: int = EXTENDER_WEIGHT

    def __post_init__(self) -> None:
        kubescheduler.num_feasible_nodes_to_find(0, self.percentage_of_nodes_to_score)


class _KubeScheduler:
    """kube-scheduler's side of a cluster-like run: the rotating scan over the nodes in name
    order, and its choice among them: its own scores, plus the extender's priorities for GPU
    pods (module doc)."""

    def __init__(self, states: Sequence[NodeState], like: LikeCluster) -> None:
        self.extender_weight = like.extender_weight
        self.order = sorted(range(len(states)), key=lambda i: states[i].node.name)
        self.wanted = kubescheduler.num_feasible_nodes_to_find(
            len(states), like.percentage_of_nodes_to_score
        )
        self.start = 0
        self.rng = random.Random(like.seed)
        count = len(states)
        self.cpu_free = np.zeros(count)
        self.memory_free = np.zeros(count)
        self.gpu_free = np.zeros(count)
        for i, state in enumerate(states):
            self.update(i, state)

    def update(self, i: int, state: NodeState) -> None:
        """Node ``i`` (placer index) is now ``state``."""
        node = state.node
        self.cpu_free[i] = math.inf if node.cpu_milli is None else state.cpu_free_milli
        self.memory_free[i] = (
            math.inf if node.memory_mib is None else node.memory_mib - state.memory_used_mib
        )
        self.gpu_free[i] = sum(g.capacity for g in node.gpus) - sum(state.gpu_used)

    def candidates(self, pod: PodRequest) -> list[int]:
        """The nodes kube-scheduler scores for ``pod`` (placer indices); moves the start on.
        Its filter: CPU, memory and the pod's total GPU memory (``aliyun.com/gpu-mem``, an
        extended resource to it) against what is free."""
        feasible = np.ones(len(self.order), dtype=np.bool_)
        if pod.cpu_milli > 0:
            feasible &= self.cpu_free >= pod.cpu_milli
        if pod.memory_mib > 0:
            feasible &= self.memory_free >= pod.memory_mib
        if pod.gpu_total > 0:
            feasible &= self.gpu_free >= pod.gpu_total
        in_order = feasible[self.order].tolist()
        found, looked = kubescheduler.scan_feasible(in_order, self.start, self.wanted)
        self.start = (self.start + looked) % len(self.order)
        return [self.order[position] for position in found]

    def choose(
        self,
        states: Sequence[NodeState],
        pod: PodRequest,
        nodes: list[int],
        priorities: dict[int, int] | None = None,
    ) -> int:
        """kube-scheduler's node for ``pod`` among ``nodes`` (not empty): its own scores plus,
        for a pod the extender is asked about, the extender's ``priorities`` (0–10) times its
        weight and 10; one of the best, drawn."""
        if len(nodes) == 1:
            return nodes[0]
        # The trace's pods set their CPU and memory requests (the replay writes both), so
        # the non-zero defaults never apply: requested and non-zero requested are the same.
        request = kubescheduler.Resources(pod.cpu_milli, pod.memory_mib)
        scores = []
        for i in nodes:
            state = states[i]
            used = kubescheduler.Resources(state.cpu_used_milli, state.memory_used_mib)
            allocatable = kubescheduler.Resources(
                state.node.cpu_milli or 0, state.node.memory_mib or 0
            )
            total = kubescheduler.score(allocatable, used, used, request, request)
            if priorities is not None:
                total += extender_score(priorities[i], self.extender_weight)
            scores.append(total)
        best = kubescheduler.best_nodes(scores)
        return nodes[best[0] if len(best) == 1 else self.rng.choice(best)]


def blind_node(node: Node) -> Node:
    """``node`` as the extender knows it: its GPUs, no CPU or memory (its node inventory
    carries none; kube-scheduler's own filter checks them)."""
    return dataclasses.replace(node, cpu_milli=None, memory_mib=None)


def blind_pod(pod: PodRequest) -> PodRequest:
    """``pod`` as the extender reads it: its GPU containers, no CPU or memory request
    (``gpushare.kube.codec`` reads only the GPU ask), so FGD's M and every score see none."""
    return dataclasses.replace(pod, cpu_milli=0, memory_mib=0)


def simulate(
    nodes: Sequence[Node],
    stream: Sequence[PodRequest],
    policy: Policy,
    *,
    tie_rank: Sequence[int],
    workload: TargetWorkload,
    gpu_unit: int = 1000,
    progress: Callable[[int], None] | None = None,
    like_cluster: LikeCluster | None = None,
) -> RunRecord:
    """Place ``stream`` on ``nodes`` in order with ``policy``; return the per-event series.

    ``tie_rank[i]`` orders node i among equal scores (lowest wins). ``workload`` is M for the
    fragmentation metric. ``progress`` is called with the number of pods done, every 500 pods.
    ``like_cluster``: place as kube-scheduler + the extender would (module doc); ``None``: the
    paper's ideal run, every pod by the policy over every node.
    """
    # Like the cluster, the policy sees what the extender sees: GPUs only (``blind``).
    view = like_cluster is not None
    placer = Placer(
        [NodeState.empty(blind_node(node) if view else node) for node in nodes], policy, tie_rank
    )
    states = [NodeState.empty(node) for node in nodes] if view else list(placer.states)
    frag = FragmentationMemo(workload)
    kube = _KubeScheduler(states, like_cluster) if like_cluster is not None else None
    known = (
        KnownPods()
        if like_cluster is not None
        and like_cluster.learn_workload
        and policy.name in LEARNING_POLICIES
        else None
    )

    def decide(pod: PodRequest) -> Decision | None:
        if kube is None:
            return placer.decide(pod)
        among = kube.candidates(pod)
        if not pod.gpu_containers:
            if not among:
                return None
            chosen = kube.choose(states, pod, among)
            return Decision(chosen, Allocation(pod.key, states[chosen].node.name, ()))
        seen = blind_pod(pod)  # the extender's view; kube-scheduler's scores see the whole pod
        if known is not None:  # the extender knows the pending pod before it scores it
            known.observe(seen)
            if known.due():
                learned = known.rebuild()
                assert learned is not None  # the pod just observed is known
                placer.set_policy(make_policy(policy.name, node_local_context(learned, gpu_unit)))
        fitting, values = placer.values(seen, among)
        if not fitting:
            if known is not None:  # deleted, as the replay deletes it
                known.forget(seen.key)
            return None
        priorities = to_priorities(dict(zip(fitting, values, strict=True)), fitting)
        return placer.place(seen, kube.choose(states, pod, fitting, priorities))

    def measure(state: NodeState) -> tuple[float, int]:
        compute = compute_of(state, workload)
        f = frag(state.node.models, state.cpu_free_milli, state.gpu_free, compute)
        return f, sum(gpu_idle(state.gpu_free, compute))

    measured = [measure(s) for s in states]
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
    placed_on: list[str | None] = []
    for event, pod in enumerate(stream, start=1):
        demand = gpu_demand(pod)
        arrived_total += demand
        decision = decide(pod)
        if decision is None:
            failed[pod_kind(pod, gpu_unit)] += 1
            placed_on.append(None)
        else:
            chosen, tag = decision.node_index, workload_tag(pod, gpu_unit)
            allocation = decision.allocation
            if view:  # the extender's allocation knows no CPU and memory; the node holds them
                allocation = dataclasses.replace(
                    allocation, cpu_milli=pod.cpu_milli, memory_mib=pod.memory_mib
                )
            state = states[chosen].with_allocation(allocation, tag)
            states[chosen] = state
            placed_on.append(state.node.name)
            if not view:
                placer.replace(chosen, state)
            elif pod.gpu_containers:
                # The extender's ledger: GPU pods only, and no workload tags (its node states
                # count no pods by kind: ``gpushare.core.ledger.Ledger.state``), so
                # ``clustering`` sees none there either.
                placer.replace(chosen, placer.states[chosen].with_allocation(decision.allocation))
            if kube is not None:
                kube.update(chosen, state)
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
        arrived, allocated, fragmentation, idle, dict(failed), placed, states, placed_on
    )
