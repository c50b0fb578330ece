"""GPU fragmentation with respect to a target workload, after the FGD paper.

Source: Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent", USENIX ATC 2023, §3, and the authors' simulator
(hkust-adsl/kubernetes-scheduler-simulator) ``pkg/utils/frag.go``, whose cases the definition
below follows.

For a node n and a task shape m, F_n(m) is the idle GPU (in the node's unit) that m cannot use:

1. m asks no GPU, or no GPU of the node is of an allowed model → all idle GPU;
2. m does not fit (CPU short, or fewer than k GPUs with free ≥ g) → all idle GPU;
3. m fits → the idle pieces smaller than g, plus idle GPU of excluded models.

F_n(M) = Σ_m p_m · F_n(m) over the target workload M (the popular shapes and their frequencies).

**Two dimensions** (gpushare's generalisation, docs/compute.md): a shape may ask compute
(``compute_milli`` per GPU) next to memory (``gpu_share``), and a GPU may have compute in use.
Then a GPU is usable by m only when it has both the memory and the compute m asks (a shape
asking no compute is not bounded by compute, as in ``gpushare.core.fit``), and a GPU's idle
amount is what is free in *both*: min(free memory, ⌊free compute · capacity / 1000⌋), in the
node's memory unit (``gpu_idle``). The second dimension is passed as a ``ComputeFree``; without
one (``None``: no compute in use on the node and none asked by M) every function here is the
one-dimensional paper's F, computed exactly as before, and with one whose compute is all free
the numbers are the same (``tests/test_core_fragmentation.py``).

``cpu_aware_fragmentation`` is gpushare's extension: in case 3 a shape can use at most
⌊free CPU / d⌋ copies' worth of the idle GPU, so idle GPU that the node's CPU cannot serve counts
too, blended with the paper's F by ``cpu_weight`` β (β = 0 is the paper's F).
"""

from __future__ import annotations

import bisect
import itertools
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from gpushare.core.model import GPU_COMPUTE_MILLI, NodeState, PodRequest


@dataclass(frozen=True, slots=True)
class TaskShape:
    """A task shape (d, g, k, S, c): CPU, GPU memory share per GPU, GPU count, allowed models
    (empty: any) and compute per GPU (``compute_milli``, 0: compute not asked)."""

    cpu_milli: int
    gpu_share: int
    gpu_count: int
    allowed_models: frozenset[str] = frozenset()
    compute_milli: int = 0

    @classmethod
    def of(cls, pod: PodRequest) -> TaskShape:
        """The shape of a pod: its CPU and its largest GPU container (CPU-only: g = k = 0).

        A container asking whole GPUs (``exclusive``) is read as asking all of each GPU's
        compute: a GPU with all its compute free is usable by it (one that holds only memory
        of pods asking no compute is counted usable too: an approximation of "holds nothing").
        """
        gpu_containers = pod.gpu_containers
        if not gpu_containers:
            return cls(pod.cpu_milli, 0, 0)
        main = max(
            gpu_containers,
            key=lambda c: (c.total, c.gpu_share, c.gpu_count * c.compute_milli, c.exclusive),
        )
        compute = GPU_COMPUTE_MILLI if main.exclusive else main.compute_milli
        return cls(pod.cpu_milli, main.gpu_share, main.gpu_count, main.allowed_models, compute)


@dataclass(frozen=True, slots=True)
class ComputeFree:
    """A node's second dimension for the fragmentation measure: free ``compute_milli`` per GPU
    position (0 on an unhealthy GPU or one held whole) and each GPU's memory capacity (to
    express idle compute in the memory unit)."""

    free_milli: tuple[int, ...]
    capacities: tuple[int, ...]

    @classmethod
    def of(cls, state: NodeState) -> ComputeFree:
        """The compute view of ``state``."""
        return cls(state.gpu_compute_free, state.node.capacities)


@dataclass(frozen=True, slots=True)
class TargetWorkload:
    """The target workload M: task shapes and their probabilities (summing to 1).

    Built by ``from_pods`` as in the artifact: shapes ordered by frequency (most common first)
    are kept until they cover at least ``coverage`` of the pods (``podPopularityThreshold``),
    then renormalised.
    """

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]
    two_dimensional: bool = field(init=False, repr=False, compare=False)
    """Whether some shape asks compute (derived): F then needs every node's ``ComputeFree``."""

    def __post_init__(self) -> None:
        if len(self.shapes) != len(self.weights):
            raise ValueError(f"{len(self.shapes)} shapes but {len(self.weights)} weights")
        two_dimensional = any(shape.compute_milli for shape in self.shapes)
        object.__setattr__(self, "two_dimensional", two_dimensional)

    @classmethod
    def from_pods(cls, pods: Iterable[PodRequest], coverage: float = 0.95) -> TargetWorkload:
        """M from a pod list; ``coverage`` in (0, 1]. Raises ``ValueError`` on an empty list.

        Shapes of equal frequency are ordered by CPU, memory share, compute, count and models
        (the order of the terms of F, hence of its floating-point sum)."""
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
                item[0].compute_milli,
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


def gpu_idle(free: Sequence[int], compute: ComputeFree | None = None) -> list[int]:
    """Idle amount per GPU position in the memory unit: the free memory, or with a second
    dimension what is free in both, min(free memory, ⌊free compute · capacity / 1000⌋)."""
    if compute is None:
        return list(free)
    return [
        min(amount, compute_free * capacity // GPU_COMPUTE_MILLI)
        for amount, compute_free, capacity in zip(
            free, compute.free_milli, compute.capacities, strict=True
        )
    ]


def compute_of(
    state: NodeState, workload: TargetWorkload, pod: PodRequest | None = None
) -> ComputeFree | None:
    """The second dimension F needs for ``state`` under M (and, when given, to place ``pod``):
    ``None`` (the one-dimensional F) when no GPU of the node has compute in use or is held
    whole, no shape of M asks compute and ``pod`` asks neither; else ``ComputeFree.of(state)``."""
    if (
        workload.two_dimensional
        or (pod is not None and pod.two_dimensional)
        or any(state.gpu_compute_used)
        or True in state.gpu_whole
    ):
        return ComputeFree.of(state)
    return None


def shape_fragmentation(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    shape: TaskShape,
    compute: ComputeFree | None = None,
) -> int:
    """F_n(m): idle GPU units on a node that task shape m cannot use (module doc, cases 1–3).

    ``free`` and ``models`` are per GPU position; ``cpu_free_milli`` ``None`` means unconstrained;
    ``compute`` the second dimension (``None``: all compute free, the paper's F). A GPU is
    usable when its model is allowed and it holds m's memory share and, when m asks compute,
    m's compute; idle amounts are ``gpu_idle``.
    """
    idle_per_gpu = gpu_idle(free, compute)
    idle = sum(idle_per_gpu)
    if shape.gpu_count == 0:
        return idle
    if cpu_free_milli is not None and cpu_free_milli < shape.cpu_milli:
        return idle
    allowed = shape.allowed_models
    need = shape.compute_milli if compute is not None else 0
    compute_free = compute.free_milli if compute is not None else free
    fitting = 0
    unusable = 0
    for amount, spare, model, compute_spare in zip(
        free, idle_per_gpu, models, compute_free, strict=True
    ):
        if allowed and model not in allowed:
            unusable += spare
        elif amount >= shape.gpu_share and (not need or compute_spare >= need):
            fitting += 1
        else:
            unusable += spare
    if fitting < shape.gpu_count:
        return idle
    return unusable


def shape_terms(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    workload: TargetWorkload,
    compute: ComputeFree | None = None,
) -> list[tuple[float, int, TaskShape]]:
    """(p_m, F_n(m), m) for every shape of M: the paper's per-shape terms.

    Nodes whose GPUs are all one model (every openb node) take a fast path without a second
    dimension: with the free list sorted, "how many GPUs hold g" and "idle below g" are a
    bisection and a prefix sum. With ``compute``, each shape is ``shape_fragmentation``.
    """
    pairs = zip(workload.shapes, workload.weights, strict=True)
    if len(set(models)) > 1 or compute is not None:
        return [
            (weight, shape_fragmentation(free, models, cpu_free_milli, shape, compute), shape)
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
    compute: ComputeFree | None = None,
) -> float:
    """F_n(M) = Σ_m p_m · F_n(m), in GPU units (``compute``: the second dimension, module doc)."""
    if compute is None and len(set(models)) <= 1:
        return _one_model_sum(free, models[0] if models else "", cpu_free_milli, workload)
    return sum(
        weight * paper
        for weight, paper, _ in shape_terms(free, models, cpu_free_milli, workload, compute)
    )


def _one_model_sum(
    free: Sequence[int],
    model: str,
    cpu_free_milli: int | None,
    workload: TargetWorkload,
    cpu_weight: float | None = None,
) -> float:
    """``node_fragmentation`` (``cpu_weight`` ``None``) or ``cpu_aware_fragmentation`` without a
    second dimension on a one-model node: ``shape_terms``' fast path (and ``_cpu_capped``, one
    copy taking g per GPU) summed in one loop in the same order, so the value is bit-for-bit
    the same. It is the hot path of FGD's score and of the CPU-aware tie-break."""
    ordered = sorted(free)
    below = [0, *itertools.accumulate(ordered)]
    idle = below[-1]
    count = len(ordered)
    total: float = 0
    for shape, weight in zip(workload.shapes, workload.weights, strict=True):
        need = shape.cpu_milli
        if (
            shape.gpu_count == 0
            or (shape.allowed_models and model not in shape.allowed_models)
            or (cpu_free_milli is not None and cpu_free_milli < need)
        ):
            total += weight * idle
            continue
        smaller = bisect.bisect_left(ordered, shape.gpu_share)
        paper = idle if count - smaller < shape.gpu_count else below[smaller]
        if cpu_weight is None or paper == idle or need == 0 or cpu_free_milli is None:
            total += weight * paper
            continue
        copies = cpu_free_milli // need
        capped = idle - min(idle - paper, copies * shape.gpu_share * shape.gpu_count)
        total += weight * (paper + cpu_weight * (capped - paper))
    return total


def state_fragmentation(state: NodeState, workload: TargetWorkload) -> float:
    """F_n(M) of a node state (unhealthy GPUs count as not idle), in both dimensions when the
    node has compute in use or M asks it (``compute_of``)."""
    return node_fragmentation(
        state.gpu_free,
        tuple(gpu.model for gpu in state.node.gpus),
        state.cpu_free_milli,
        workload,
        compute_of(state, workload),
    )


class FragmentationMeasure(Protocol):
    """F_n(M) as a function of (free memory per GPU, models per GPU, free CPU or None, M) and,
    by keyword, the second dimension (``None``: the one-dimensional F)."""

    def __call__(
        self,
        free: Sequence[int],
        models: Sequence[str],
        cpu_free_milli: int | None,
        workload: TargetWorkload,
        *,
        compute: ComputeFree | None = None,
    ) -> float: ...


def cpu_aware_fragmentation(
    free: Sequence[int],
    models: Sequence[str],
    cpu_free_milli: int | None,
    workload: TargetWorkload,
    cpu_weight: float = 0.7,
    *,
    compute: ComputeFree | None = None,
) -> float:
    """F_n(M) with CPU-limited use (module doc), in GPU units.

    For a shape that fits, the paper counts the pieces smaller than g; here the usable idle GPU
    is also capped at ⌊free CPU / d⌋ · k · g, and F = paper_F + β · (CPU-capped F − paper_F).
    Motivation (openb): GPU pods ask ~11 vCPU per GPU and the 8-GPU G2 nodes offer 12, so CPU
    placed badly strands whole GPUs that the paper's F, which only asks "does one copy fit",
    does not see. With two dimensions g is the idle amount one copy takes per GPU,
    max(g, ⌈compute · capacity / 1000⌉) on the node's largest GPU (``copy_idle``).
    """
    if compute is None and len(set(models)) <= 1:
        return _one_model_sum(
            free, models[0] if models else "", cpu_free_milli, workload, cpu_weight
        )
    idle = sum(gpu_idle(free, compute))
    capacity = max(compute.capacities, default=0) if compute is not None else 0
    return sum(
        weight * _cpu_capped(paper, idle, shape, cpu_free_milli, cpu_weight, capacity=capacity)
        for weight, paper, shape in shape_terms(free, models, cpu_free_milli, workload, compute)
    )


def per_gpu_demand(gpu_share: int, compute_milli: int, exclusive: bool, capacity: int) -> int:
    """What a container takes on each of its GPUs, in the memory unit of a GPU of
    ``capacity``: its memory share, or its compute in that unit when larger (rounded up); a
    whole GPU (``exclusive``) is ``capacity``. ``capacity`` 0: the memory share alone."""
    if exclusive:
        return capacity
    if not compute_milli:
        return gpu_share
    return max(gpu_share, -(-compute_milli * capacity // GPU_COMPUTE_MILLI))


def copy_idle(shape: TaskShape, capacity: int) -> int:
    """The idle amount one copy of ``shape`` takes on each of its GPUs, in the memory unit of a
    GPU of ``capacity`` (``per_gpu_demand``; a shape asking whole GPUs asks all their compute);
    ``capacity`` 0: the memory share alone (the one-dimensional F)."""
    return per_gpu_demand(shape.gpu_share, shape.compute_milli, False, capacity)


def _cpu_capped(
    paper: int,
    idle: int,
    shape: TaskShape,
    cpu_free_milli: int | None,
    cpu_weight: float,
    *,
    capacity: int = 0,
) -> float:
    """One shape's term of ``cpu_aware_fragmentation`` from its paper F_n(m)."""
    if paper == idle or shape.cpu_milli == 0 or cpu_free_milli is None:
        return paper
    copies = cpu_free_milli // shape.cpu_milli
    capped = idle - min(idle - paper, copies * copy_idle(shape, capacity) * shape.gpu_count)
    return paper + cpu_weight * (capped - paper)
