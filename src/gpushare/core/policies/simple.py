"""gpushare's own simple policies: ``binpack``, ``spread`` and ``alibaba``.

* ``binpack`` — Alibaba gpushare's GPU rule (the GPU with the least free that still fits, lowest
  index on a tie; ``pkg/cache/nodeinfo.go`` ``allocateGPUID``) and, for the node, the node where
  that GPU is fullest after placement, then the node with the least GPU left.
* ``spread`` — the opposite: the emptiest node and the GPU with the most free.
* ``alibaba`` — what an Alibaba gpushare cluster does today: kube-scheduler's default node scoring
  (``NodeResourcesFit`` with ``LeastAllocated`` on cpu and memory, weights 1) picks the node, then
  ``binpack`` picks the GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpushare.core.fit import best_fit_positions
from gpushare.core.model import ContainerAllocation, ContainerRequest, NodeState, PodRequest
from gpushare.core.policies.base import (
    PolicyContext,
    assign_sequentially,
    best_fit_gpus,
    register,
)


def _cpu_used_fraction(state: NodeState, pod: PodRequest) -> float:
    node_cpu = state.node.cpu_milli
    if not node_cpu:
        return 0.0
    return (state.cpu_used_milli + pod.cpu_milli) / node_cpu


def _gpu_used_fraction_after(state: NodeState, pod: PodRequest) -> float:
    total = sum(gpu.capacity for gpu in state.node.gpus)
    if total == 0:
        return 0.0
    return 1.0 - (sum(state.gpu_free) - pod.gpu_total) / total


@dataclass(frozen=True, slots=True)
class BinpackPolicy:
    """Fill GPUs, then nodes (module doc). Scores are floats in [0, 100]."""

    context: PolicyContext
    name: str = "binpack"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """50 × fullness of the chosen GPUs after placement + 50 × GPU fullness of the node;
        CPU-only pods: 100 × CPU fullness of the node after placement."""
        if not pod.gpu_containers:
            return 100.0 * _cpu_used_fraction(state, pod)
        chosen = best_fit_gpus(state, pod)
        position = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
        free = state.gpu_free
        left = 0
        capacity = 0
        for container in chosen:
            for index in container.gpu_indices:
                p = position[index]
                left += free[p] - container.gpu_share
                capacity += state.node.gpus[p].capacity
        return 50.0 * (1.0 - left / capacity) + 50.0 * _gpu_used_fraction_after(state, pod)

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """The GPU with the least free that still fits, lowest index on ties."""
        return best_fit_gpus(state, pod)


def _worst_fit_positions(
    free: list[int], models: tuple[str, ...], container: ContainerRequest
) -> list[int] | None:
    candidates = [
        (-amount, p)
        for p, amount in enumerate(free)
        if amount >= container.gpu_share and container.allows_at(p, models[p])
    ]
    if len(candidates) < container.gpu_count:
        return None
    candidates.sort()
    return sorted(p for _, p in candidates[: container.gpu_count])


@dataclass(frozen=True, slots=True)
class SpreadPolicy:
    """Spread load: the node with the most GPU (CPU for CPU-only pods) left; the GPU with the
    most free. Scores are floats in [0, 100]."""

    context: PolicyContext
    name: str = "spread"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """100 × the fraction of the node left free after placement."""
        if not pod.gpu_containers:
            return 100.0 * (1.0 - _cpu_used_fraction(state, pod))
        return 100.0 * (1.0 - _gpu_used_fraction_after(state, pod))

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """The GPU with the most free, lowest index on ties."""
        return assign_sequentially(state, pod, _worst_fit_positions)


@dataclass(frozen=True, slots=True)
class AlibabaPolicy:
    """Default kube-scheduler node scoring, then ``binpack`` for the GPU (module doc).

    ``LeastAllocated``: Σ_r ⌊(capacity_r − requested_r)·100 / capacity_r⌋ / #r over cpu and
    memory, integer arithmetic as in ``noderesources/least_allocated.go``.
    """

    context: PolicyContext
    name: str = "alibaba"
    deterministic: bool = True

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """Integer 0–100."""
        node = state.node
        scores: list[int] = []
        for capacity, used, asked in (
            (node.cpu_milli, state.cpu_used_milli, pod.cpu_milli),
            (node.memory_mib, state.memory_used_mib, pod.memory_mib),
        ):
            if capacity:
                requested = used + asked
                scores.append(
                    0 if requested > capacity else (capacity - requested) * 100 // capacity
                )
        return float(sum(scores) // len(scores)) if scores else 0.0

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """Binpack's GPU rule."""
        return assign_sequentially(state, pod, best_fit_positions)


register("binpack", "Alibaba's GPU rule (least free that fits) and the fullest node")(BinpackPolicy)
register("spread", "the emptiest node and the GPU with the most free")(SpreadPolicy)
register("alibaba", "Alibaba gpushare today: kube-scheduler least-allocated node, binpack GPU")(
    AlibabaPolicy
)
