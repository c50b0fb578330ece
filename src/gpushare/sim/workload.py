"""The paper's experiment set-up for one run: node tie order, shuffled and tuned pod stream.

Source: docs/simulator.md, "One run", steps 2–3 (the artifact's ``Simulate`` and
``TunePodsByNodeTotalResource``). Go's math/rand is not reproduced bit for bit: runs are
statistically, not event-for-event, equal to the artifact's.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass

from gpushare.core.fragmentation import per_gpu_demand
from gpushare.core.model import Node, PodRequest
from gpushare.sim.trace.constants import GPU_CAPACITY_MILLI


def gpu_demand(pod: PodRequest) -> int:
    """The GPU a pod takes, in milli-GPU (a GPU of the simulator's clusters, openb and the
    embedded one, is ``GPU_CAPACITY_MILLI``): on each GPU of each GPU container, its memory
    share or its compute in the same unit (rounded up), whichever is larger; a whole GPU is
    the capacity (``per_gpu_demand``). For a pod that asks memory only (every openb pod as
    loaded) this is ``pod.gpu_total``. Arrived workload and the stream's tuning count this."""
    return sum(
        per_gpu_demand(c.gpu_share, c.compute_milli, c.exclusive, GPU_CAPACITY_MILLI) * c.gpu_count
        for c in pod.gpu_containers
    )


@dataclass(frozen=True, slots=True)
class RunSetup:
    """One run's inputs: ``tie_rank[i]`` orders node i among equal scores (lowest wins); the pod
    stream in submission order; ``target`` the tuned total GPU request in GPU units."""

    seed: int
    tie_rank: tuple[int, ...]
    stream: tuple[PodRequest, ...]
    target: int


def tune_stream(pods: Sequence[PodRequest], target: int, rng: random.Random) -> list[PodRequest]:
    """Pods (already shuffled) tuned to a total GPU request (``gpu_demand``) of at most
    ``target`` units.

    Below the target, clones drawn uniformly with replacement from ``pods`` are appended until
    the next would exceed it; above it, random pods are removed until the total is at or under.
    Clones get the key ``<key>-clone-<n>``.
    """
    stream = list(pods)
    total = sum(gpu_demand(pod) for pod in stream)
    if not stream:
        return stream
    if total < target:
        gpu_pods = [pod for pod in pods if gpu_demand(pod) > 0]
        if not gpu_pods:
            return stream
        clone = 0
        while True:
            pick = pods[rng.randrange(len(pods))]
            demand = gpu_demand(pick)
            if total + demand > target:
                break
            stream.append(dataclasses.replace(pick, key=f"{pick.key}-clone-{clone}"))
            clone += 1
            total += demand
    while total > target and stream:
        removed = stream.pop(rng.randrange(len(stream)))
        total -= gpu_demand(removed)
    return stream


def make_run(
    nodes: Sequence[Node], pods: Sequence[PodRequest], seed: int, tune_ratio: float = 1.3
) -> RunSetup:
    """Seeded set-up: a random node order for ties, pods sorted by name then shuffled, then tuned
    to ``tune_ratio`` × the cluster's GPU capacity."""
    rng = random.Random(seed)
    order = list(range(len(nodes)))
    rng.shuffle(order)
    tie_rank = [0] * len(nodes)
    for position, node_index in enumerate(order):
        tie_rank[node_index] = position
    stream = sorted(pods, key=lambda pod: pod.key)
    rng.shuffle(stream)
    capacity = sum(gpu.capacity for node in nodes for gpu in node.gpus)
    target = int(tune_ratio * capacity)
    return RunSetup(seed, tuple(tie_rank), tuple(tune_stream(stream, target, rng)), target)
