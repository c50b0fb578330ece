"""A synthetic two-dimensional workload: pods that ask GPU memory *and* compute.

openb's pods ask one share per GPU; clusters that run gpu-manager or HAMi pods ask memory and
compute separately, and the two often pull in opposite directions (docs/compute.md). This
workload puts both kinds side by side, on any cluster (the embedded one, or openb's node
list), for ``gpushare simulate --workload synthetic-2d``. The mix is fixed below and was not
tuned to favour any policy; amounts are thousandths of one GPU's memory (the simulator's GPUs
have 1000 units) and of its compute (``compute_milli``):

| kind | share of pods | GPUs | memory per GPU | compute per GPU | vCPU |
|---|---|---|---|---|---|
| CPU-only | 10% | 0 | – | – | 2, 4, 8 or 16 |
| inference (much memory, little compute) | 40% | 1 | 500–800 | 100–300 | 4 |
| training-like share (the opposite) | 35% | 1 | 100–300 | 500–800 | 8 |
| whole GPUs | 15% | 1 (60%), 2 (20%), 4 (12%), 8 (8%) | 1000 | 1000 | 8 per GPU |

Memory and compute are drawn uniformly from steps of 100 within each range, independently. The
pod list is drawn once with ``random.Random(WORKLOAD_SEED)`` (each run's seed then shuffles and
tunes it as for openb); it has ``PODS_PER_GPU`` × the cluster's GPUs pods.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.sim.trace import NODE_FILE, Trace, load_nodes

SYNTHETIC_2D = "synthetic-2d"
"""The workload name ``gpushare simulate --workload`` accepts for this workload."""
WORKLOAD_SEED = 2026
PODS_PER_GPU = 1.25
_WHOLE_COUNTS = ((1, 0.60), (2, 0.20), (4, 0.12), (8, 0.08))


def _steps(low: int, high: int) -> tuple[int, ...]:
    return tuple(range(low, high + 1, 100))


def _pod(rng: random.Random, key: str) -> PodRequest:
    kind = rng.random()
    if kind < 0.10:
        return PodRequest(key, (), cpu_milli=rng.choice((2, 4, 8, 16)) * 1000)
    if kind < 0.50:
        memory, compute, cpu = rng.choice(_steps(500, 800)), rng.choice(_steps(100, 300)), 4000
        container = ContainerRequest("main", memory, 1, compute_milli=compute)
        return PodRequest(key, (container,), cpu_milli=cpu)
    if kind < 0.85:
        memory, compute, cpu = rng.choice(_steps(100, 300)), rng.choice(_steps(500, 800)), 8000
        container = ContainerRequest("main", memory, 1, compute_milli=compute)
        return PodRequest(key, (container,), cpu_milli=cpu)
    draw, count = rng.random(), _WHOLE_COUNTS[-1][0]
    for gpus, weight in _WHOLE_COUNTS:
        if draw < weight:
            count = gpus
            break
        draw -= weight
    container = ContainerRequest("main", 1000, count, compute_milli=1000)
    return PodRequest(key, (container,), cpu_milli=8000 * count)


def two_dimensional_pods(nodes: Sequence[Node]) -> list[PodRequest]:
    """The workload's pods for ``nodes`` (module doc), keys ``2d-<n>``."""
    gpus = sum(len(node.gpus) for node in nodes)
    rng = random.Random(WORKLOAD_SEED)
    return [_pod(rng, f"2d-{n:05d}") for n in range(round(PODS_PER_GPU * gpus))]


def synthetic_trace(trace_dir: Path) -> Trace:
    """The node list of ``trace_dir`` with this workload's pods (``TraceError`` as
    ``load_nodes`` for a missing or bad node list)."""
    node_path = trace_dir / NODE_FILE
    nodes = tuple(load_nodes(node_path))
    return Trace(nodes, tuple(two_dimensional_pods(nodes)), SYNTHETIC_2D, node_path, node_path)
