"""The simulator against a real run of the same pods (``bench/replay.py``; docs/simulator.md,
"The simulator against the real scheduler"): the unallocated-GPU curve of a run, the band the
simulator's curve spans over its draw seeds, how far a real curve lies outside that band, and
the first pod the two runs placed differently.

Every curve is unallocated GPU in % of capacity at each arrived % 0..``max_percent`` (index =
percent), ``NaN`` where the run has not arrived yet. Pure: no clock, no I/O.

**The seed band.** One stream (``gpushare.sim.workload.make_run`` for the stream's seed) is
placed once per simulator seed: that seed draws the node tie order and, like the cluster, the
draw among kube-scheduler's equal best nodes (``LikeCluster.seed``), while the pods and their
order stay the stream's. The band at each arrived % is [min, max] over those runs. A real value
*lies within the band* at an arrived % when ``low - tolerance <= real <= high + tolerance``
(``TOLERANCE_POINTS``: the 0.25 points of the fidelity goal, or the seed spread where that is
wider).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpushare.core.model import Node, PodRequest
from gpushare.sim.engine import LikeCluster, simulate
from gpushare.sim.experiment import policy_context, run_policy
from gpushare.sim.metrics import arrived_bins
from gpushare.sim.workload import make_run

FloatArray = npt.NDArray[np.float64]

MAX_PERCENT = 130
"""The last arrived % compared (the stream is tuned to 130 % of capacity)."""

TOLERANCE_POINTS = 0.25
"""How far (unallocated-GPU points) a real value may lie outside the seed band."""


def unallocated_curve(
    arrived: npt.ArrayLike,
    allocated: npt.ArrayLike,
    capacity: float,
    max_percent: int = MAX_PERCENT,
) -> FloatArray:
    """Unallocated GPU % (100 × (capacity − allocated) / capacity) at each arrived % 0..
    ``max_percent``: the value after the last event whose arrived % (``arrived_bins``) is at or
    below it; ``NaN`` beyond the last event's. ``arrived`` and ``allocated`` are cumulative GPU
    units per event (index 0: the empty cluster), ``capacity`` the cluster's GPU units (> 0).
    ``ValueError`` for series of different lengths, an empty series or a capacity <= 0."""
    arrived_units = np.asarray(arrived, dtype=np.float64)
    allocated_units = np.asarray(allocated, dtype=np.float64)
    if arrived_units.shape != allocated_units.shape or arrived_units.ndim != 1:
        raise ValueError(
            f"arrived {arrived_units.shape} and allocated {allocated_units.shape} must be "
            "series of one length"
        )
    if not arrived_units.size:
        raise ValueError("arrived and allocated hold no event; accepted: at least the empty one")
    if capacity <= 0:
        raise ValueError(f"capacity {capacity} is not a GPU total; accepted: > 0")
    bins = arrived_bins(arrived_units, capacity)
    curve = np.full(max_percent + 1, np.nan)
    for event, b in enumerate(bins.tolist()):
        if 0 <= b <= max_percent:
            curve[b] = 100.0 * (capacity - allocated_units[event]) / capacity
    reached = int(min(bins.max(), max_percent))
    last = np.nan
    for b in range(reached + 1):  # carry the last value over bins no event fell in
        if np.isnan(curve[b]):
            curve[b] = last
        last = curve[b]
    return curve


@dataclass(frozen=True, slots=True)
class SeedBand:
    """Per arrived %: the lowest and highest simulated value over the seeds (``NaN`` where a
    seed's curve is)."""

    low: FloatArray
    high: FloatArray


def seed_band(curves: Sequence[FloatArray]) -> SeedBand:
    """The band [min, max] over ``curves`` (one per seed, of one length) at each arrived %.
    ``ValueError`` for no curve or curves of different lengths."""
    if not curves:
        raise ValueError("no simulated curve; accepted: one per seed, at least one")
    lengths = sorted({len(curve) for curve in curves})
    if len(lengths) != 1:
        raise ValueError(f"curves of lengths {lengths}; accepted: one length")
    stacked = np.vstack(curves)
    return SeedBand(low=stacked.min(axis=0), high=stacked.max(axis=0))


def distance_outside(real: FloatArray, band: SeedBand) -> FloatArray:
    """How far (points) ``real`` lies outside ``band`` at each arrived %: ``low − real`` below
    it, ``real − high`` above it, 0 inside; ``NaN`` where either is. ``ValueError`` for a
    curve of another length than the band."""
    if real.shape != band.low.shape:
        raise ValueError(f"real curve of {real.shape}, band of {band.low.shape}; accepted: equal")
    with np.errstate(invalid="ignore"):
        return np.maximum(np.maximum(band.low - real, real - band.high), 0.0)


@dataclass(frozen=True, slots=True)
class Largest:
    """The largest value of a per-arrived-% series and the arrived % where it is (the first
    such, lowest arrived %)."""

    points: float
    arrived_pct: int


def largest(series: FloatArray) -> Largest | None:
    """The largest non-``NaN`` value of ``series`` and where; ``None`` when all are ``NaN``."""
    if series.size == 0 or bool(np.all(np.isnan(series))):
        return None
    where = int(np.nanargmax(series))
    return Largest(points=float(series[where]), arrived_pct=where)


def within_band(distance: FloatArray, tolerance_points: float = TOLERANCE_POINTS) -> bool:
    """Whether every compared arrived % (not ``NaN``) lies at most ``tolerance_points`` outside
    the band; ``False`` when none is compared."""
    compared = distance[~np.isnan(distance)]
    return bool(compared.size) and bool(np.all(compared <= tolerance_points))


@dataclass(frozen=True, slots=True)
class PlacedDifferently:
    """The first pod of a stream the two runs placed differently: its position (1-based, as
    the replay names pods ``p00001``...), key, and the node each run chose (``None``:
    dropped / refused)."""

    position: int
    key: str
    simulated: str | None
    real: str | None


def first_placed_differently(
    stream: Sequence[PodRequest],
    simulated: Sequence[str | None],
    real: Sequence[str | None],
    *,
    outcome_only: bool = False,
    kinds: Mapping[str, Hashable] | None = None,
) -> PlacedDifferently | None:
    """The first pod whose node differs between ``simulated`` and ``real`` (one node name or
    ``None`` per pod of ``stream``); with ``kinds`` (node name → its kind, e.g. its GPUs, CPU
    and memory), the first on a node of another kind, so that a draw among equal nodes does
    not count; with ``outcome_only``, the first placed by one run and refused by the other.
    ``None`` when every pod agrees. ``ValueError`` for lengths that are not the stream's."""
    if not len(stream) == len(simulated) == len(real):
        raise ValueError(
            f"{len(stream)} pods, {len(simulated)} simulated and {len(real)} real placements; "
            "accepted: one placement per pod on each side"
        )
    for position, (pod, ours, theirs) in enumerate(
        zip(stream, simulated, real, strict=True), start=1
    ):
        if outcome_only or ours is None or theirs is None:
            differs = (ours is None) != (theirs is None)
        else:
            differs = ours != theirs if kinds is None else kinds[ours] != kinds[theirs]
        if differs:
            return PlacedDifferently(position, pod.key, ours, theirs)
    return None


@dataclass(frozen=True, slots=True)
class SimulatedRun:
    """One simulator run of a stream: its ``seed``, ``unallocated_pct`` (``unallocated_curve``),
    pods placed, and the node per pod of the stream (``None``: dropped)."""

    seed: int
    unallocated_pct: FloatArray
    placed: int
    placed_on: tuple[str | None, ...]


def simulate_stream(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    stream: Sequence[PodRequest],
    policy_name: str,
    seed: int,
    *,
    like_cluster: bool = True,
    percentage_of_nodes_to_score: int = 0,
    max_percent: int = MAX_PERCENT,
) -> SimulatedRun:
    """``stream`` (pods of the trace ``pods``) placed on ``nodes`` with ``policy_name``, the
    simulator's draws seeded ``seed`` (module doc: the tie order of ``make_run(nodes, pods,
    seed)``, the policy context's random source and, ``like_cluster``, kube-scheduler's draw
    among equal nodes, ``percentage_of_nodes_to_score`` its own); otherwise the paper's ideal
    run. Module-level so that ``run_in_processes`` can run seeds in parallel."""
    context = policy_context(nodes, pods, seed)
    assert context.workload is not None  # policy_context sets it
    record = simulate(
        nodes,
        stream,
        run_policy(policy_name, context, like_cluster=like_cluster),
        tie_rank=make_run(nodes, pods, seed).tie_rank,
        workload=context.workload,
        like_cluster=LikeCluster(seed, percentage_of_nodes_to_score) if like_cluster else None,
    )
    capacity = float(sum(g.capacity for n in nodes for g in n.gpus))
    curve = unallocated_curve(record.arrived, record.allocated, capacity, max_percent)
    return SimulatedRun(seed, curve, record.placed, tuple(record.placed_on))
