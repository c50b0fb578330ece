"""GPU fragmentation with respect to a target workload, after the FGD paper.

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023, §3; the artifact's ``pkg/utils/frag.go``;
formalised in ``shared/traces/openb/METHOD.md`` §2.

For a node n and a task shape m, F_n(m) is the idle GPU (in the node's unit) that m cannot use:

1. m asks no GPU, or no GPU of the node is of an allowed model → all idle GPU;
2. m does not fit (CPU short, or fewer than k GPUs with free ≥ g) → all idle GPU;
3. m fits → the idle pieces smaller than g, plus idle GPU of excluded models.

F_n(M) = Σ_m p_m · F_n(m) over the target workload M (the popular shapes and their frequencies).

``cpu_aware_fragmentation`` is gpushare's extension: in case 3 a shape can use at most
⌊free CPU / d⌋ copies' worth of the idle GPU, so idle GPU that the node's CPU cannot serve counts
too, blended with the paper's F by ``cpu_weight`` β (β = 0 is the paper's F).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gpushare.core.model import NodeState, PodRequest


@dataclass(frozen=True, slots=True)
class TaskShape:
    """A task shape (d, g, k, S): CPU, GPU share per GPU, GPU count, allowed models (empty: any)."""

    cpu_milli: int
    gpu_share: int
    gpu_count: int
    allowed_models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, pod: PodRequest) -> TaskShape:
        """The shape of a pod: its CPU and its largest GPU container (CPU-only: g = k = 0)."""
        gpu_containers = pod.gpu_containers
        if not gpu_containers:
            return cls(pod.cpu_milli, 0, 0)
        main = max(gpu_containers, key=lambda c: (c.total, c.gpu_share))
        return cls(pod.cpu_milli, main.gpu_share, main.gpu_count, main.allowed_models)


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """The target workload M: task shapes and their probabilities (summing to 1).

    Built by ``from_pods`` as in the artifact: shapes ordered by frequency (most common first)
    are kept until they cover at least ``coverage`` of the pods (``podPopularityThreshold``),
    then renormalised.
    """

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError(f"{len(self.shapes)} shapes but {len(self.weights)} weights")

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], coverage: float = 0.95) -> TargetWorkload:
        """M from a pod list; ``coverage`` in (0, 1]. Raises ``ValueError`` on an empty list."""
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        counts = Counter(TaskShape.of(pod) for pod in pods)
        total = sum(counts.values())
        if total == 0:
            raise ValueError("cannot build a target workload from no pods")
        ranked = sorted(
            counts.items(),
            key=lambda item: (
                -item[1],
                item[0].cpu_milli,
                item[0].gpu_share,
                item[0].gpu_count,
                sorted(item[0].allowed_models),
            ),
        )
        kept: list[tuple[TaskShape, int]] = []
        covered = 0
        for shape, count in ranked:
            kept.append((shape, count))
            covered += count
            if covered >= coverage * total:
                break
        return cls(
            shapes=tuple(shape for shape, _ in kept),
            weights=tuple(count / covered for _, count in kept),
        )


def shape_fragmentation(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    shape: TaskShape,
) -> int:
    """F_n(m): idle GPU units on a node that task shape m cannot use (module doc, cases 1–3).

    ``free`` and ``models`` are per GPU position; ``cpu_free_milli`` ``None`` means unconstrained.
    """
    idle = sum(free)
    if shape.gpu_count == 0:
        return idle
    if cpu_free_milli is not None and cpu_free_milli < shape.cpu_milli:
        return idle
    allowed = shape.allowed_models
    fitting = 0
    unusable = 0
    for amount, model in zip(free, models, strict=True):
        if allowed and model not in allowed:
            unusable += amount
        elif amount >= shape.gpu_share:
            fitting += 1
        else:
            unusable += amount
    if fitting < shape.gpu_count:
        return idle
    return unusable


def shape_terms(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    workload: TargetWorkload,
) -> list[tuple[float, int, TaskShape]]:
    """(p_m, F_n(m), m) for every shape of M: the paper's per-shape terms.

    Nodes whose GPUs are all one model (every openb node) take a fast path: with the free list
    sorted, "how many GPUs hold g" and "idle below g" are a bisection and a prefix sum.
    """
    pairs = zip(workload.shapes, workload.weights, strict=True)
    if len(set(models)) > 1:
        return [
            (weight, shape_fragmentation(free, models, cpu_free_milli, shape), shape)
            for shape, weight in pairs
        ]
    model = models[0] if models else ""
    ordered = sorted(free)
    below = [0, *itertools.accumulate(ordered)]
    idle = below[-1]
    count = len(ordered)
    terms: list[tuple[float, int, TaskShape]] = []
    for shape, weight in pairs:
        if (
            shape.gpu_count == 0
            or (shape.allowed_models and model not in shape.allowed_models)
            or (cpu_free_milli is not None and cpu_free_milli < shape.cpu_milli)
        ):
            terms.append((weight, idle, shape))
            continue
        smaller = bisect.bisect_left(ordered, shape.gpu_share)
        paper = idle if count - smaller < shape.gpu_count else below[smaller]
        terms.append((weight, paper, shape))
    return terms


def node_fragmentation(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    workload: TargetWorkload,
) -> float:
    """F_n(M) = Σ_m p_m · F_n(m), in GPU units."""
    return sum(
        weight * paper for weight, paper, _ in shape_terms(free, models, cpu_free_milli, workload)
    )


def state_fragmentation(state: NodeState, workload: TargetWorkload) -> float:
    """F_n(M) of a node state (unhealthy GPUs count as not idle)."""
    return node_fragmentation(
        state.gpu_free,
        tuple(gpu.model for gpu in state.node.gpus),
        state.cpu_free_milli,
        workload,
    )


FragmentationMeasure = Callable[[Sequence[int], Sequence[str], "int | None", TargetWorkload], float]
"""F_n(M) as a function of (free per GPU, models per GPU, free CPU or None, M)."""


def cpu_aware_fragmentation(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    workload: TargetWorkload,
    cpu_weight: float = 0.7,
) -> float:
    """F_n(M) with CPU-limited use (module doc), in GPU units.

    For a shape that fits, the paper counts the pieces smaller than g; here the usable idle GPU
    is also capped at ⌊free CPU / d⌋ · k · g, and F = paper_F + β · (CPU-capped F − paper_F).
    Motivation (openb): GPU pods ask ~11 vCPU per GPU and the 8-GPU G2 nodes offer 12, so CPU
    placed badly strands whole GPUs that the paper's F, which only asks "does one copy fit",
    does not see.
    """
    idle = sum(free)
    return sum(
        weight * _cpu_capped(paper, idle, shape, cpu_free_milli, cpu_weight)
        for weight, paper, shape in shape_terms(free, models, cpu_free_milli, workload)
    )


def _cpu_capped(
    paper: int, idle: int, shape: TaskShape, cpu_free_milli: int | None, cpu_weight: float
) -> float:
    """One shape's term of ``cpu_aware_fragmentation`` from its paper F_n(m)."""
    if paper == idle or shape.cpu_milli == 0 or cpu_free_milli is None:
        return paper
    copies = cpu_free_milli // shape.cpu_milli
    capped = idle - min(idle - paper, copies * shape.gpu_share * shape.gpu_count)
    return paper + cpu_weight * (capped - paper)
