"""FGD: fragmentation gradient descent (Weng et al., USENIX ATC 2023, §4; the artifact's
``plugin/fgd_score.go``; ``shared/traces/openb/METHOD.md`` §3).

For each node the pod fits, place the pod hypothetically and measure Δ = F_n'(M) − F_n(M), the
growth of the node's fragmentation with respect to the target workload M. The node score is
⌊100·σ(−Δ/unit)⌋ (σ the logistic function, ``unit`` one whole GPU); the highest score wins.
A one-GPU container goes to the GPU whose hypothetical Δ is smallest (the first such GPU on equal
integer scores); multi-GPU containers take the lowest-index GPUs that fit.

``fgd`` keeps the artifact's integer truncation (for fidelity). Memoisation of F on
(models, free CPU, sorted free GPUs) follows the artifact's ``Flatten`` cache.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpushare.core.fragmentation import (
    FragmentationMeasure,
    TargetWorkload,
    node_fragmentation,
)
from gpushare.core.model import ContainerAllocation, NodeState, PodRequest
from gpushare.core.policies.base import (
    PolicyContext,
    fallback_assignment,
    lowest_free_positions,
    register,
)

Placement = tuple[float, tuple[tuple[int, ...], ...]]
MEMO_LIMIT = 1_000_000
"""Entries per memo before it is cleared (a cache, so clearing only costs recomputation)."""


def sigmoid(x: float) -> float:
    """The logistic function 1 / (1 + e^−x)."""
    return 1.0 / (1.0 + math.exp(-x))


class FragmentationMemo:
    """F_n(M) memoised on what it depends on: GPU models, free CPU and the free GPU multiset.

    ``measure`` is the fragmentation function (default: the paper's ``node_fragmentation``).
    """

    def __init__(
        self, workload: TargetWorkload, measure: FragmentationMeasure = node_fragmentation
    ) -> None:
        self.workload = workload
        self.measure = measure
        self._cache: dict[tuple[object, ...], float] = {}

    def __len__(self) -> int:
        """Entries cached now (at most ``MEMO_LIMIT``)."""
        return len(self._cache)

    def __call__(
        self, models: tuple[str, ...], cpu_free_milli: int | None, free: Sequence[int]
    ) -> float:
        """F_n(M) in GPU units for the given free GPUs (per position) and free CPU."""
        homogeneous = len(set(models)) <= 1
        key: tuple[object, ...] = (
            (models[0] if models else "", cpu_free_milli, tuple(sorted(free)))
            if homogeneous
            else (models, cpu_free_milli, tuple(free))
        )
        value = self._cache.get(key)
        if value is None:
            value = self.measure(free, models, cpu_free_milli, self.workload)
            if len(self._cache) >= MEMO_LIMIT:  # a long-lived extender must not grow forever
                self._cache.clear()
            self._cache[key] = value
        return value


class FgdPolicy:
    """FGD (module doc). ``truncate=False`` scores with the exact −Δ instead of the artifact's
    integer ⌊100·σ(−Δ/unit)⌋."""

    deterministic = True

    def __init__(
        self,
        context: PolicyContext,
        *,
        truncate: bool = True,
        name: str = "fgd",
        measure: FragmentationMeasure = node_fragmentation,
    ) -> None:
        if context.workload is None:
            raise ValueError(f"policy {name} needs a target workload (PolicyContext.workload)")
        self.name = name
        self.context = context
        self.truncate = truncate
        self.frag = FragmentationMemo(context.workload, measure)
        self._placements: dict[tuple[object, ...], Placement] = {}

    @property
    def memo_entries(self) -> int:
        """Placements cached now (at most ``MEMO_LIMIT``)."""
        return len(self._placements)

    def _gpu_score(self, delta: float) -> float:
        if self.truncate:
            return float(int(100.0 * sigmoid(-delta / self.context.gpu_unit)))
        return -delta

    def placement(self, state: NodeState, pod: PodRequest) -> Placement:
        """(score, GPU positions per GPU container in declaration order) for ``pod`` on
        ``state``. Precondition: the pod fits."""
        models = state.node.models
        cpu = state.cpu_free_milli
        free = state.gpu_free
        key = (models, cpu, free, pod.shape)
        cached = self._placements.get(key)
        if cached is not None:
            return cached
        before = self.frag(models, cpu, free)
        cpu_after = None if cpu is None else cpu - pod.cpu_milli
        running = list(free)
        containers = pod.gpu_containers
        positions: dict[int, tuple[int, ...]] = {}
        order = sorted(range(len(containers)), key=lambda i: -containers[i].gpu_share)
        for i in order:
            container = containers[i]
            if container.gpu_count == 1:
                best_score = -math.inf
                best_position = -1
                seen: set[tuple[int, str]] = set()
                for p, amount in enumerate(running):
                    if amount < container.gpu_share or not container.allows(models[p]):
                        continue
                    if (amount, models[p]) in seen:
                        continue
                    seen.add((amount, models[p]))
                    running[p] -= container.gpu_share
                    score = self._gpu_score(self.frag(models, cpu_after, running) - before)
                    running[p] += container.gpu_share
                    if score > best_score:
                        best_score, best_position = score, p
                chosen: list[int] | None = [best_position] if best_position >= 0 else None
            else:
                chosen = lowest_free_positions(running, models, container)
            if chosen is None:
                # Greedy per-container choices can paint a multi-container pod into a corner
                # (mixed models); fall back to the fit check's assignment, which fits.
                running, positions = self._fallback(state, pod)
                break
            for p in chosen:
                running[p] -= container.gpu_share
            positions[i] = tuple(chosen)
        after = self.frag(models, cpu_after, running)
        result: Placement = (
            self._gpu_score(after - before),
            tuple(positions[i] for i in range(len(containers))),
        )
        if len(self._placements) >= MEMO_LIMIT:
            self._placements.clear()
        self._placements[key] = result
        return result

    @staticmethod
    def _fallback(
        state: NodeState, pod: PodRequest
    ) -> tuple[list[int], dict[int, tuple[int, ...]]]:
        position_of = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
        running = list(state.gpu_free)
        positions: dict[int, tuple[int, ...]] = {}
        for i, allocation in enumerate(fallback_assignment(state, pod)):
            chosen = tuple(position_of[index] for index in allocation.gpu_indices)
            for p in chosen:
                running[p] -= allocation.gpu_share
            positions[i] = chosen
        return running, positions

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """⌊100·σ(−Δ/unit)⌋ (or −Δ untruncated): higher means less new fragmentation."""
        return self.placement(state, pod)[0]

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """The GPUs that minimise Δ (module doc)."""
        gpus = state.node.gpus
        _, positions = self.placement(state, pod)
        return tuple(
            ContainerAllocation(c.name, tuple(gpus[p].index for p in chosen), c.gpu_share)
            for c, chosen in zip(pod.gpu_containers, positions, strict=True)
        )


register("fgd", "fragmentation gradient descent (Weng et al., ATC'23), the artifact's scores")(
    FgdPolicy
)
