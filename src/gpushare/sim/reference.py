"""Offline references for a finished run: how far a policy is from what placement could reach.

A policy's headline number is the unallocated GPU at 100 % arrived (``gpushare.sim.metrics``).
For the same seed's stream this module computes, over the *headline pods* (``headline_prefix``:
the stream up to the last event that the headline bin averages), two references:

* ``best_fit_decreasing``: a real placement of those pods known in advance, largest GPU request
  first, each by the ``bestfit`` policy through the core's ``Placer`` (same fit checks, CPU,
  memory, models, multi-GPU pods on one node). Achievable, but only by an offline heuristic that
  sees the whole stream; not an optimum, so an online policy may beat it.
* ``allocated_upper_bound``: no placement of those pods can allocate more GPU (a relaxation:
  CPU, memory, GPU models and "one pod's GPUs on one node" are dropped; every GPU is a bin of
  the largest GPU capacity C). It gives the lower bound on unallocated GPU % that any policy,
  online or offline, is held to. Reasoning (bin packing with per-GPU granularity, after the
  Martello–Toth L2 argument): split each pod into per-GPU pieces (``gpu_share`` on each of
  ``gpu_count`` GPUs). A piece larger than C/2 ("big") shares its GPU with no other big piece,
  and only pieces no larger than its leftover C − b fit beside it. If m big pieces are placed,
  they allocate at most the m largest big pieces, and the small pieces (≤ C/2) go into at most
  the m largest leftovers (each takes only pieces that fit it, at most the largest sum of small
  sizes that fits it) plus G − m empty GPUs (likewise at most the largest such sum ≤ C); because
  "fits this leftover" is nested by leftover size, the fractional best filling is greedy over
  sinks in increasing size. The bound is the maximum over m, capped by total capacity.

Both are pure functions of core model values (no I/O); ``reference_for_seed`` applies them to one
seed's set-up as ``gpushare.sim.experiment`` builds it.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.model import Node, PodRequest
from gpushare.core.policies import PolicyContext, make_policy
from gpushare.sim.engine import simulate
from gpushare.sim.metrics import arrived_bins
from gpushare.sim.workload import make_run


def headline_prefix(stream: Sequence[PodRequest], capacity: int, percent: int = 100) -> int | None:
    """How many pods of ``stream`` feed the ``percent`` bin of the curves: up to the last event
    whose arrived-% bin (``metrics.arrived_bins``) is that bin, or one of the bins ±1 when the
    bin itself is empty. ``None`` when none is (the curve
    has no value there). ``capacity`` is the cluster's GPU total in GPU units (> 0)."""
    if capacity <= 0:
        raise ValueError(f"capacity must be > 0 GPU units, got {capacity}")
    bins = arrived_bins(np.cumsum([0, *(pod.gpu_total for pod in stream)]), capacity)
    events = np.flatnonzero(bins == percent)
    if events.size == 0:
        events = np.flatnonzero(np.abs(bins - percent) <= 1)
    if events.size == 0:
        return None
    return int(events[-1])


def gpu_pieces(pods: Sequence[PodRequest]) -> list[int]:
    """Per-GPU pieces of ``pods``: ``gpu_share`` once per GPU of each GPU container."""
    return [c.gpu_share for pod in pods for c in pod.gpu_containers for _ in range(c.gpu_count)]


def allocated_upper_bound(pods: Sequence[PodRequest], gpu_capacities: Sequence[int]) -> int:
    """At most this much GPU (units) of ``pods`` fits on GPUs of ``gpu_capacities`` under any
    placement (module doc for the reasoning). Exact for whole-GPU pieces; ignores CPU, memory,
    models and node boundaries, so it is never below what a real placement reaches."""
    gpus = len(gpu_capacities)
    if gpus == 0:
        return 0
    total_capacity = sum(gpu_capacities)
    bin_capacity = max(gpu_capacities)
    pieces = [p for p in gpu_pieces(pods) if p <= bin_capacity]
    big = sorted((p for p in pieces if 2 * p > bin_capacity), reverse=True)
    small = sorted(p for p in pieces if 2 * p <= bin_capacity)
    small_cumulative = list(itertools.accumulate(small, initial=0))

    def small_at_most(size: int) -> int:
        """Total of the small pieces no larger than ``size``."""
        return small_cumulative[bisect.bisect_right(small, size)]

    # fillable[size]: the most a GPU with ``size`` room holds of small pieces (the largest sum
    # of small sizes, each any number of times, that is <= size).
    fillable = _subset_sums(sorted(set(small)), bin_capacity)

    big_cumulative = list(itertools.accumulate(big, initial=0))
    best = 0
    leftovers: Counter[int] = Counter()  # the m largest leftovers: those of the m smallest bigs
    for placed in range(min(gpus, len(big)) + 1):
        if placed:
            leftovers[bin_capacity - big[len(big) - placed]] += 1
        sinks = sorted([*leftovers.items(), (bin_capacity, gpus - placed)])
        filled = 0
        for size, count in sinks:
            filled += min(fillable[size] * count, small_at_most(size) - filled)
        best = max(best, big_cumulative[placed] + filled)
    return min(best, total_capacity)


def _subset_sums(sizes: Sequence[int], limit: int) -> list[int]:
    """``best[r]`` for r in 0..``limit``: the largest sum ≤ r of ``sizes`` (each used any number
    of times), by a bit set of reachable sums."""
    mask = (1 << (limit + 1)) - 1
    reachable = 1  # bit i set: sum i is reachable
    for size in sizes:
        step = size
        while step <= limit:  # multiplicities 0..2^k - 1 of ``size``, by doubling
            reachable |= (reachable << step) & mask
            step *= 2
    best, last = [], 0
    for total in range(limit + 1):
        if reachable >> total & 1:
            last = total
        best.append(last)
    return best


def best_fit_decreasing(
    nodes: Sequence[Node], pods: Sequence[PodRequest], tie_rank: Sequence[int] | None = None
) -> int:
    """GPU units allocated when ``pods`` are placed largest GPU request first (then largest CPU,
    then key), each by the ``bestfit`` policy through the core's ``Placer``; a pod that fits
    nowhere is dropped. ``tie_rank`` orders nodes among equal scores (default: list order)."""
    if not pods or not nodes:
        return 0
    ordered = sorted(pods, key=lambda pod: (-pod.gpu_total, -pod.cpu_milli, pod.key))
    context = PolicyContext(
        max_node_cpu_milli=max((n.cpu_milli or 0) for n in nodes) or 1,
        max_node_gpu=max(sum(g.capacity for g in n.gpus) for n in nodes) or 1,
    )
    record = simulate(
        nodes,
        ordered,
        make_policy("bestfit", context),
        tie_rank=tie_rank if tie_rank is not None else range(len(nodes)),
        workload=TargetWorkload.from_pods(ordered),
    )
    return int(record.allocated[-1])


@dataclass(frozen=True, slots=True)
class Reference:
    """One seed's offline references at ``percent`` arrived: unallocated GPU % of capacity left
    by best-fit-decreasing and its lower bound over any placement (NaN when the stream never
    reaches that bin), over the first ``pods`` pods of the stream."""

    seed: int
    percent: int
    pods: int
    bfd_unallocated_pct: float
    bound_unallocated_pct: float


def reference_for_seed(
    nodes: Sequence[Node],
    pods: Sequence[PodRequest],
    seed: int,
    *,
    tune_ratio: float = 1.3,
    percent: int = 100,
) -> Reference:
    """The references of ``seed``'s run (same set-up as ``experiment.run_one``: stream and node
    tie order from ``workload.make_run``). Both numbers are NaN (no reference) when a pod asks
    compute or whole GPUs: the references count memory only and would bound nothing."""
    if any(pod.two_dimensional for pod in pods):
        return Reference(seed, percent, 0, math.nan, math.nan)
    setup = make_run(nodes, pods, seed, tune_ratio)
    capacities = [gpu.capacity for node in nodes for gpu in node.gpus]
    capacity = sum(capacities)
    count = headline_prefix(setup.stream, capacity, percent)
    if count is None:
        return Reference(seed, percent, 0, math.nan, math.nan)
    headline = setup.stream[:count]

    def unallocated(allocated: int) -> float:
        return 100.0 * (capacity - allocated) / capacity

    return Reference(
        seed=seed,
        percent=percent,
        pods=count,
        bfd_unallocated_pct=unallocated(best_fit_decreasing(nodes, headline, setup.tie_rank)),
        bound_unallocated_pct=unallocated(allocated_upper_bound(headline, capacities)),
    )
