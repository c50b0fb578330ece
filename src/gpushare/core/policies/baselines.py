"""The FGD paper's baselines, as the authors' simulator implements them.

Source: hkust-adsl/kubernetes-scheduler-simulator ``pkg/simulator/plugin/*_score.go``, each
policy's formula in its docstring below. Every node score is an integer 0–100, truncated exactly
where the artifact truncates, because ties (broken by node order) are part of each policy.
``MC`` is the largest node's CPU (``MaxSpecCpu``) and ``MG`` its GPU total (``MaxSpecGpu``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpushare.core.fit import best_fit_positions
from gpushare.core.model import ContainerAllocation, ContainerRequest, NodeState, PodRequest
from gpushare.core.policies.base import (
    PolicyContext,
    assign_sequentially,
    best_fit_gpus,
    is_sharing,
    lowest_free_positions,
    register,
    workload_tag,
)


def _cpu_free(state: NodeState, context: PolicyContext) -> int:
    free = state.cpu_free_milli
    return context.max_node_cpu_milli if free is None else free


@dataclass(frozen=True, slots=True)
class RandomPolicy:
    """``RandomScore``: a uniformly random feasible node; a random GPU that fits for a sharing
    pod, the lowest-index free GPUs otherwise."""

    context: PolicyContext
    name: str = "random"
    deterministic: bool = False

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """A fresh uniform draw: the highest draw wins, so every feasible node is equally likely."""
        return self.context.rng.random()

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Random fitting GPU for sharing pods, lowest-index free GPUs otherwise."""
        if not is_sharing(pod, self.context.gpu_unit):
            return assign_sequentially(state, pod, lowest_free_positions)
        rng = self.context.rng

        def pick(
            free: list[int], models: tuple[str, ...], container: ContainerRequest
        ) -> list[int] | None:
            fitting = lowest_free_positions(free, models, container)
            if fitting is None:
                return None
            candidates = [
                p
                for p, amount in enumerate(free)
                if amount >= container.gpu_share and container.allows_at(p, models[p])
            ]
            return [rng.choice(candidates)]

        return assign_sequentially(state, pod, pick)


@dataclass(frozen=True, slots=True)
class DotProductPolicy:
    """``DotProductScore`` (dimext=merge, norm=max): ⌊100·(1 − ½[(d/MC)(c/MC) + (D/MG)(R/MG)])⌋,
    the node whose free vector has the smallest dot product with the demand; best-fit GPU."""

    context: PolicyContext
    name: str = "dotprod"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Integer 0–100 (the class docstring)."""
        mc, mg = self.context.max_node_cpu_milli, self.context.max_node_gpu
        dot = (pod.cpu_milli / mc) * (_cpu_free(state, self.context) / mc) + (
            pod.gpu_total / mg
        ) * (sum(state.gpu_free) / mg)
        return float(int(100 * (1 - dot / 2)))

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Best-fit GPU."""
        return best_fit_gpus(state, pod)


@dataclass(frozen=True, slots=True)
class ClusteringPolicy:
    """``GpuClusteringScore``: keep pods of one tag (share, 1-gpu, 2-gpu, …) together.

    b = ⌊25·(MG − R)/MG⌋; 75+b on a node holding only this tag, 50+b with others too, 25+b on a
    node with no GPU pods, b otherwise; CPU-only pods score 0 everywhere. Best-fit GPU.
    """

    context: PolicyContext
    name: str = "clustering"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Integer 0–100 (the class docstring)."""
        tag = workload_tag(pod, self.context.gpu_unit)
        if tag is None:
            return 0.0
        mg = self.context.max_node_gpu
        base = 25 * (mg - sum(state.gpu_free)) // mg
        tags = state.workload_tags
        if tags.get(tag, 0) > 0:
            return float(base + (75 if len(tags) == 1 else 50))
        return float(base + (25 if not tags else 0))

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Best-fit GPU."""
        return best_fit_gpus(state, pod)


@dataclass(frozen=True, slots=True)
class PackingPolicy:
    """``GpuPackingScore``: prefer shared GPUs, then free GPUs on used nodes, then idle nodes.

    Idle node: max(33 − G, G). Needs fully free GPUs on a used node: max(50 − #used free, 33).
    Fits on partly used GPUs: max(100 − ⌊Σ free%/10⌋, 50). CPU-only pods: 0. Best-fit GPU.
    """

    context: PolicyContext
    name: str = "packing"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Integer 0–100 (the class docstring; the artifact's ``getPackingScore``)."""
        containers = pod.gpu_containers
        if not containers:
            return 0.0
        unit = self.context.gpu_unit
        capacity = [gpu.capacity for gpu in state.node.gpus]
        free = state.gpu_free
        fully_free = sum(1 for f, c in zip(free, capacity, strict=True) if f == c)
        if fully_free == len(free):
            return float(max(33 - fully_free, fully_free))
        container = containers[0]
        wanted = sum(c.gpu_count for c in containers)
        share = container.gpu_share
        chosen = [p for p in sorted(range(len(free)), key=lambda p: free[p]) if free[p] >= share]
        chosen = chosen[:wanted]
        uses_free = sum(1 for p in chosen if free[p] == capacity[p])
        if uses_free > 0:
            return float(max(50 - uses_free, 33))
        free_percent = sum(free[p] * 100 // unit for p in chosen)
        return float(max(100 - free_percent // 10, 50))

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Best-fit GPU."""
        return best_fit_gpus(state, pod)


@dataclass(frozen=True, slots=True)
class BestFitPolicy:
    """``BestFitScore``: ⌊100·(1 − ½(c − d)/MC − ½(R − D)/MG)⌋, the node left with the least
    free CPU and GPU; best-fit GPU. (The artifact's min-max normalisation across nodes is
    monotone and injective on these integers, so it changes no decision and is omitted.)"""

    context: PolicyContext
    name: str = "bestfit"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Integer 0–100 (the class docstring)."""
        mc, mg = self.context.max_node_cpu_milli, self.context.max_node_gpu
        left = (
            0.5 * (_cpu_free(state, self.context) - pod.cpu_milli) / mc
            + 0.5 * (sum(state.gpu_free) - pod.gpu_total) / mg
        )
        return float(math.trunc((1.0 - left) * 100))

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Best-fit GPU."""
        return assign_sequentially(state, pod, best_fit_positions)


register("random", "paper baseline: a uniformly random feasible node, random GPU")(RandomPolicy)
register("dotprod", "paper baseline: smallest dot product of demand and free resources")(
    DotProductPolicy
)
register("clustering", "paper baseline: group pods of the same GPU tag on nodes")(ClusteringPolicy)
register("packing", "paper baseline: shared GPUs first, then used nodes, then idle nodes")(
    PackingPolicy
)
register("bestfit", "least free CPU and GPU left on the node after placement; best-fit GPU")(
    BestFitPolicy
)
