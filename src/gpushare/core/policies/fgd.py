"""FGD: fragmentation gradient descent (Weng et al., USENIX ATC 2023, §4; the artifact's
``plugin/fgd_score.go``; docs/simulator.md).

For each node the pod fits, place the pod hypothetically and measure Δ = F_n'(M) − F_n(M), the
growth of the node's fragmentation with respect to the target workload M. The node score is
⌊100·σ(−Δ/unit)⌋ (σ the logistic function, ``unit`` one whole GPU); the highest score wins.
A one-GPU container goes to the GPU whose hypothetical Δ is smallest (the first such GPU on equal
integer scores); multi-GPU containers take the lowest-index GPUs that fit.

``fgd`` keeps the artifact's integer truncation (for fidelity). Memoisation of F on
(models, free CPU, sorted free GPUs) follows the artifact's ``Flatten`` cache.

Two dimensions (docs/compute.md): F is the two-dimensional measure of
``gpushare.core.fragmentation`` whenever the node has compute in use, M asks compute or the pod
does; a GPU is a candidate for a container when it holds the container's memory and compute;
a pod asking whole GPUs takes the fit check's assignment (``fallback_assignment``) and is
scored on it. With one dimension (every openb pod, every Alibaba pod) the scores and choices are
computed exactly as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpushare.core.fragmentation import (
    ComputeFree,
    FragmentationMeasure,
    TargetWorkload,
    compute_of,
    node_fragmentation,
)
from gpushare.core.model import ContainerAllocation, ContainerRequest, NodeState, PodRequest
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


def free_after(
    state: NodeState, allocations: Sequence[ContainerAllocation], *, compute: bool = True
) -> tuple[list[int], list[int]]:
    """(free memory, free ``compute_milli``) per GPU position of ``state`` with ``allocations``
    added, as ``NodeState.with_allocation`` leaves them: a GPU an allocation holds whole
    (``exclusive``) has 0 of both, whatever its capacity. ``compute=False``: the second list is
    empty (a caller on the one-dimensional F needs no compute)."""
    position_of = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
    free = list(state.gpu_free)
    compute_free = list(state.gpu_compute_free) if compute else []
    for allocation in allocations:
        for index in allocation.gpu_indices:
            p = position_of[index]
            if allocation.exclusive:
                free[p] = 0
                if compute:
                    compute_free[p] = 0
            else:
                free[p] -= allocation.gpu_share
                if compute:
                    compute_free[p] -= allocation.compute_milli
    return free, compute_free


class FragmentationMemo:
    """F_n(M) memoised on what it depends on: GPU models, free CPU and the free GPU multiset
    (with a second dimension: the multiset of (free memory, free compute, capacity) per GPU).

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
        self,
        models: tuple[str, ...],
        cpu_free_milli: int | None,
        free: Sequence[int],
        compute: ComputeFree | None = None,
    ) -> float:
        """F_n(M) in GPU units for the given free GPUs (per position), free CPU and, when
        given, free compute (``None``: the one-dimensional F)."""
        homogeneous = len(set(models)) <= 1
        key: tuple[object, ...]
        if compute is None:
            key = (
                (models[0] if models else "", cpu_free_milli, tuple(sorted(free)))
                if homogeneous
                else (models, cpu_free_milli, tuple(free))
            )
        else:
            gpus = zip(free, compute.free_milli, compute.capacities, strict=True)
            key = (
                (models[0] if models else "", cpu_free_milli, tuple(sorted(gpus)), "2d")
                if homogeneous
                else (models, cpu_free_milli, tuple(gpus), "2d")
            )
        value = self._cache.get(key)
        if value is None:
            value = self.measure(free, models, cpu_free_milli, self.workload, compute=compute)
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
        assert self.context.workload is not None  # the constructor checked
        compute = compute_of(state, self.context.workload, pod)
        key = (models, cpu, free, compute, pod.shape)
        cached = self._placements.get(key)
        if cached is not None:
            return cached
        before = self.frag(models, cpu, free, compute)
        cpu_after = None if cpu is None else cpu - pod.cpu_milli
        containers = pod.gpu_containers
        running, running_compute, positions = self._place(
            models, cpu_after, free, compute=compute, containers=containers, before=before
        )
        if positions is None:
            # Greedy per-container choices can paint a multi-container pod into a corner
            # (mixed models), and a pod asking whole GPUs takes the fit check's assignment,
            # which fits.
            running, running_compute, positions = self._fallback(state, pod)
        after_compute = (
            None if compute is None else ComputeFree(tuple(running_compute), compute.capacities)
        )
        after = self.frag(models, cpu_after, running, after_compute)
        result: Placement = (
            self._gpu_score(after - before),
            tuple(positions[i] for i in range(len(containers))),
        )
        if len(self._placements) >= MEMO_LIMIT:
            self._placements.clear()
        self._placements[key] = result
        return result

    def _place(
        self,
        models: tuple[str, ...],
        cpu_after: int | None,
        free: tuple[int, ...],
        *,
        compute: ComputeFree | None,
        containers: tuple[ContainerRequest, ...],
        before: float,
    ) -> tuple[list[int], list[int], dict[int, tuple[int, ...]] | None]:
        """The paper's GPU choice: (free memory after, free compute after (empty without a
        second dimension), positions per container, or ``None`` when the greedy choice paints
        itself into a corner or, with ``compute``, a container asks whole GPUs). With
        ``compute`` a GPU is a candidate when it holds the container's memory and compute."""
        running = list(free)
        running_compute = [] if compute is None else list(compute.free_milli)
        if compute is not None and any(c.exclusive for c in containers):
            return running, running_compute, None
        positions: dict[int, tuple[int, ...]] = {}
        order = sorted(
            range(len(containers)),
            key=lambda i: (-containers[i].gpu_share, -containers[i].compute_milli),
        )
        for i in order:
            container = containers[i]
            share, need = container.gpu_share, container.compute_milli
            view = (
                running
                if compute is None
                else [
                    amount if running_compute[p] >= need else -1 for p, amount in enumerate(running)
                ]
            )
            if container.gpu_count == 1:
                best_score = -math.inf
                best_position = -1
                seen: set[tuple[object, ...]] = set()
                for p, amount in enumerate(view):
                    if amount < share or not container.allows_at(p, models[p]):
                        continue
                    seen_key = (
                        (amount, models[p])
                        if compute is None
                        else (amount, running_compute[p], models[p])
                    )
                    if seen_key in seen:
                        continue
                    seen.add(seen_key)
                    running[p] -= share
                    after = None
                    if compute is not None:
                        running_compute[p] -= need
                        after = ComputeFree(tuple(running_compute), compute.capacities)
                    score = self._gpu_score(self.frag(models, cpu_after, running, after) - before)
                    running[p] += share
                    if compute is not None:
                        running_compute[p] += need
                    if score > best_score:
                        best_score, best_position = score, p
                chosen: list[int] | None = [best_position] if best_position >= 0 else None
            else:
                chosen = lowest_free_positions(view, models, container)
            if chosen is None:
                return running, running_compute, None
            for p in chosen:
                running[p] -= share
                if compute is not None:
                    running_compute[p] -= need
            positions[i] = tuple(chosen)
        return running, running_compute, positions

    @staticmethod
    def _fallback(
        state: NodeState, pod: PodRequest
    ) -> tuple[list[int], list[int], dict[int, tuple[int, ...]]]:
        """The fit check's assignment: (free memory after, free compute after, positions)."""
        assignment = fallback_assignment(state, pod)
        position_of = {gpu.index: p for p, gpu in enumerate(state.node.gpus)}
        positions = {
            i: tuple(position_of[index] for index in allocation.gpu_indices)
            for i, allocation in enumerate(assignment)
        }
        running, running_compute = free_after(state, assignment)
        return running, running_compute, positions

    def score(self, state: NodeState, pod: PodRequest) -> float:
        """⌊100·σ(−Δ/unit)⌋ (or −Δ untruncated): higher means less new fragmentation."""
        return self.placement(state, pod)[0]

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        """The GPUs that minimise Δ (module doc); a pod asking whole GPUs gets the fit check's
        assignment (each GPU recorded whole)."""
        if any(c.exclusive for c in pod.gpu_containers):
            return fallback_assignment(state, pod)
        gpus = state.node.gpus
        _, positions = self.placement(state, pod)
        return tuple(
            ContainerAllocation(
                c.name, tuple(gpus[p].index for p in chosen), c.gpu_share, c.compute_milli
            )
            for c, chosen in zip(pod.gpu_containers, positions, strict=True)
        )


register("fgd", "fragmentation gradient descent (Weng et al., ATC'23), the artifact's scores")(
    FgdPolicy
)
