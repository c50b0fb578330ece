"""kube-scheduler's own node choice for a pod the extender is not asked about: its default score
plugins as they apply to a pod that asks CPU and memory only, and which feasible nodes it
scores at all.

The source is kube-scheduler v1.37.1 (the version the chart and the tests run; paths under
``k8s.io/kubernetes/pkg/scheduler/``). Pure: integers in, integers out, as the Go code
computes them (integer division where Go divides ``int64``; ``int64(float)`` truncation).

**Which plugins score.** ``apis/config/v1/default_plugins.go`` enables, with weights:
``TaintToleration`` 3, ``NodeAffinity`` 2, ``NodeResourcesFit`` 1, ``PodTopologySpread`` 2,
``InterPodAffinity`` 2, ``NodeResourcesBalancedAllocation`` 1, ``ImageLocality`` 1, and
``VolumeBinding`` (weight 1). For a pod with
CPU and memory requests only, no affinity, no tolerations, no volumes, no labels or owner, on
nodes without taints or images, all but two give every node the same score, so they never
change the choice:

* ``TaintToleration`` (``plugins/tainttoleration``) counts the node's ``PreferNoSchedule``
  taints the pod does not tolerate: none anywhere, so 100 everywhere after its reversed
  normalisation.
* ``NodeAffinity`` (``plugins/nodeaffinity``) scores preferred terms: the pod has none
  (``PreScore`` skips).
* ``PodTopologySpread`` (``plugins/podtopologyspread``): the system-default constraints
  (``ScheduleAnyway`` over zone and hostname) get their selector from the Services,
  ReplicaSets, StatefulSets and ReplicationControllers that select the pod
  (``buildDefaultConstraints`` in ``common.go``, ``helper.DefaultSelector``); a pod none
  selects gets an empty selector, hence no constraint, and ``PreScore`` skips.
* ``InterPodAffinity`` (``plugins/interpodaffinity/scoring.go``): no affinity terms on the pod
  or on any pod placed: ``PreScore`` skips.
* ``ImageLocality`` (``plugins/imagelocality``): no node reports the pod's image: 0 everywhere.
* ``VolumeBinding`` (``plugins/volumebinding``): no claims, so no static bindings: ``PreScore``
  skips (with the ``StorageCapacityScoring`` gate it scores the pod's volumes: none).

What remains is ``score`` below: ``NodeResourcesFit`` with its default ``LeastAllocated``
strategy (cpu and memory, weight 1 each) plus ``NodeResourcesBalancedAllocation``, weight 1
each, 0–100 each (``MaxNodeScore``; neither normalises), summed.

**Requests.** ``LeastAllocated`` counts a pod's requests with kube-scheduler's non-zero
defaults: a container that does not set a CPU or memory request counts 100 millicores / 200
MiB (``schedutil.DefaultMilliCPURequest``/``DefaultMemoryRequest``, ``util/pod_resources.go``;
``resource_allocation.go``, ``calculatePodResourceRequest`` with ``NonMissingContainerRequests``
unless ``useRequested``) and a node's ``NonZeroRequested`` sums its pods counted that way. A
request set to zero stays zero. ``BalancedAllocation`` sets ``useRequested``: actual requests,
node ``Requested``; it skips a pod whose requests are all zero (``PreScore`` returns ``Skip``:
no score from it on any node).

**Which nodes.** kube-scheduler filters nodes in its snapshot order from a rotating start
(``nextStartNodeIndex``) and stops once it has ``num_feasible_nodes_to_find`` feasible ones
(``schedule_one.go``, ``findNodesThatPassFilters``, ``numFeasibleNodesToFind``); only those
are scored; the start then moves on by the nodes it looked at. ``scan_feasible`` is that scan
done in order (kube-scheduler filters in parallel, 16 workers by default, so near the cut the
set found can differ by a node or two).

**Ties.** In v1.37.1 the nodes go into a max-heap on (total score, ``Randomizer``) and the top
is taken (``framework/sorted_nodes.go``); ``Randomizer`` is a random integer only for nodes an
extender scored (``prioritizeNodes``), so for a pod no extender is asked about it is 0 and the
heap's top among equal scores is whichever came first out of the parallel filter: in effect
one of the best, not a fixed one. ``best_nodes`` gives that set; the caller draws from it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MAX_NODE_SCORE = 100
"""``fwk.MaxNodeScore``: every score plugin answers 0..100."""

DEFAULT_MILLI_CPU_REQUEST = 100
"""``schedutil.DefaultMilliCPURequest``: a container without a CPU request counts 0.1 CPU."""

DEFAULT_MEMORY_REQUEST_MIB = 200
"""``schedutil.DefaultMemoryRequest`` (200 MiB): a container without a memory request."""

LEAST_ALLOCATED_WEIGHT = 1
"""``NodeResourcesFit``'s weight in the default profile."""

BALANCED_ALLOCATION_WEIGHT = 1
"""``NodeResourcesBalancedAllocation``'s weight in the default profile."""

MIN_FEASIBLE_NODES_TO_FIND = 100
"""``minFeasibleNodesToFind``: below this many nodes every node is scored."""

MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5
"""``minFeasibleNodesPercentageToFind``: the adaptive percentage never goes lower."""


@dataclass(frozen=True, slots=True)
class Resources:
    """CPU in millicores and memory in MiB: a node's allocatable, its requested sum, or a
    pod's request. Memory in MiB gives the same scores as kube-scheduler's bytes: every ratio
    and every ``(a - r) * 100 // a`` is the same with both amounts scaled by 2**20."""

    cpu_milli: int
    memory_mib: int


def nonzero_request(cpu_milli: int | None, memory_mib: int | None) -> Resources:
    """A container's requests as ``LeastAllocated`` counts them: ``None`` (not set) becomes
    ``DEFAULT_MILLI_CPU_REQUEST`` / ``DEFAULT_MEMORY_REQUEST_MIB``; a value set, zero
    included, stays (``GetNonzeroRequestForResource``: "override if un-set, but not if
    explicitly set to zero")."""
    return Resources(
        DEFAULT_MILLI_CPU_REQUEST if cpu_milli is None else cpu_milli,
        DEFAULT_MEMORY_REQUEST_MIB if memory_mib is None else memory_mib,
    )


def least_requested_score(requested: int, capacity: int) -> int:
    """``leastRequestedScore`` (``noderesources/least_allocated.go``): the unused share of
    ``capacity`` after ``requested``, 0..100, rounded down; 0 without capacity or when over."""
    if capacity == 0 or requested > capacity:
        return 0
    return (capacity - requested) * MAX_NODE_SCORE // capacity


def least_allocated_score(
    requested: Sequence[int], allocatable: Sequence[int], weights: Sequence[int]
) -> int:
    """``leastResourceScorer``: the weighted mean of ``least_requested_score`` over the
    resources the node has (allocatable 0: left out), rounded down; 0 when it has none.
    ``requested`` is the node's sum with the pod's request added."""
    score = weight_sum = 0
    for used, capacity, weight in zip(requested, allocatable, weights, strict=True):
        if capacity == 0:
            continue
        score += least_requested_score(used, capacity) * weight
        weight_sum += weight
    return score // weight_sum if weight_sum else 0


def balanced_resource_score(requested: Sequence[int], allocatable: Sequence[int]) -> int:
    """``balancedResourceScore`` (``noderesources/balanced_allocation.go``): 100·(1 − std) of
    the requested fractions (each capped at 1; resources with allocatable 0 left out),
    truncated; std is |f₁ − f₂|/2 for two resources, 0 for fewer."""
    fractions = [
        min(1.0, used / capacity)
        for used, capacity in zip(requested, allocatable, strict=True)
        if capacity != 0
    ]
    std = 0.0
    if len(fractions) == 2:
        std = abs((fractions[0] - fractions[1]) / 2)
    elif len(fractions) > 2:
        mean = sum(fractions) / len(fractions)
        std = math.sqrt(sum((f - mean) * (f - mean) for f in fractions) / len(fractions))
    return math.trunc((1 - std) * MAX_NODE_SCORE)


def balanced_allocation_score(
    requested: Sequence[int], allocated: Sequence[int], allocatable: Sequence[int]
) -> int:
    """``balancedResourceScorer`` (v1.37.1): the change in balance the pod brings, mapped to
    50..100: ``50 + (50 + with − without) // 2``, ``with``/``without`` the
    ``balanced_resource_score`` with and without the pod (75: no change; towards 100: better
    balanced; towards 50: worse)."""
    with_pod = balanced_resource_score(requested, allocatable)
    without_pod = balanced_resource_score(allocated, allocatable)
    return MAX_NODE_SCORE // 2 + (MAX_NODE_SCORE // 2 + with_pod - without_pod) // 2


def score(
    allocatable: Resources,
    requested: Resources,
    nonzero_requested: Resources,
    pod: Resources,
    pod_nonzero: Resources,
) -> int:
    """The total kube-scheduler gives a node for a CPU-and-memory pod (module doc):
    ``LeastAllocated`` on the node's ``nonzero_requested`` plus the pod's ``pod_nonzero``,
    plus ``BalancedAllocation`` on ``requested`` plus ``pod`` (skipped, 0, when the pod
    requests nothing), each times its weight. 0..200."""
    capacity = (allocatable.cpu_milli, allocatable.memory_mib)
    least = least_allocated_score(
        (nonzero_requested.cpu_milli + pod_nonzero.cpu_milli,
         nonzero_requested.memory_mib + pod_nonzero.memory_mib),
        capacity,
        (1, 1),
    )  # fmt: skip
    total = LEAST_ALLOCATED_WEIGHT * least
    if pod.cpu_milli or pod.memory_mib:
        before = (requested.cpu_milli, requested.memory_mib)
        after = (requested.cpu_milli + pod.cpu_milli, requested.memory_mib + pod.memory_mib)
        total += BALANCED_ALLOCATION_WEIGHT * balanced_allocation_score(after, before, capacity)
    return total


def num_feasible_nodes_to_find(nodes: int, percentage: int = 0) -> int:
    """How many feasible nodes kube-scheduler looks for before it stops filtering
    (``numFeasibleNodesToFind``): every node below ``MIN_FEASIBLE_NODES_TO_FIND``; else
    ``percentage`` of them (``percentageOfNodesToScore``; 0, the default: adaptive, 50 % −
    nodes/125, at least 5 %), at least ``MIN_FEASIBLE_NODES_TO_FIND``. ``ValueError`` for a
    percentage outside 0..100 (kube-scheduler's validation)."""
    if not 0 <= percentage <= 100:
        raise ValueError(f"percentageOfNodesToScore must be in 0..100, got {percentage}")
    if nodes < MIN_FEASIBLE_NODES_TO_FIND:
        return nodes
    if percentage == 0:
        percentage = max(50 - nodes // 125, MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(nodes * percentage // 100, MIN_FEASIBLE_NODES_TO_FIND)


def scan_feasible(feasible: Sequence[bool], start: int, wanted: int) -> tuple[list[int], int]:
    """The nodes kube-scheduler scores, in order: from ``start`` (wrapping around), the first
    ``wanted`` positions where ``feasible`` is true; and how many nodes it looked at, by which
    the next start moves (``(start + looked) % len(feasible)``)."""
    count = len(feasible)
    found: list[int] = []
    looked = 0
    for step in range(count):
        looked = step + 1
        position = (start + step) % count
        if feasible[position]:
            found.append(position)
            if len(found) == wanted:
                break
    return found, looked


def best_nodes(scores: Sequence[int]) -> list[int]:
    """The positions of the highest score (module doc, "Ties"); empty for no scores."""
    if not scores:
        return []
    top = max(scores)
    return [i for i, s in enumerate(scores) if s == top]
