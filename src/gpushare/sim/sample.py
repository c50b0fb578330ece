"""A smaller cluster from a trace: a seeded sample of its nodes, and the pods those nodes can
hold (docs/simulator.md, "The simulator against the real scheduler": the openb sample the
replay runs on kwok nodes, where the whole 1,213-node trace would take too long).

The pods are then tuned to the sample's capacity as for any run
(``gpushare.sim.workload.make_run``): shuffled, then random pods removed until the stream's GPU
request is 130 % of the sample's GPU capacity. Pure: no I/O.
"""

from __future__ import annotations

import random
from collections.abc import Hashable, Sequence

from gpushare.core.fit import check_fit
from gpushare.core.model import Node, NodeState, PodRequest


def sample_nodes(nodes: Sequence[Node], count: int, seed: int) -> list[Node]:
    """``count`` of ``nodes``, drawn without replacement by ``random.Random(seed).sample``
    over their positions, kept in their given (file) order. ``ValueError`` when ``count`` is not
    from 1 to ``len(nodes)``."""
    if not 1 <= count <= len(nodes):
        raise ValueError(f"node sample of {count}: accepted 1 to {len(nodes)} (the trace's nodes)")
    chosen = sorted(random.Random(seed).sample(range(len(nodes)), count))
    return [nodes[i] for i in chosen]


def servable_pods(pods: Sequence[PodRequest], nodes: Sequence[Node]) -> list[PodRequest]:
    """The pods of ``pods`` that fit at least one of ``nodes`` while it is empty (``check_fit``:
    allowed GPU models, GPU count and share, CPU and memory), in their given order. A pod
    that no node of the sample could ever hold is left out, as the full trace's cluster could
    hold every pod of its own workload."""
    shapes = {_shape(node): node for node in nodes}  # equal nodes answer alike
    empty = [NodeState.empty(node) for node in shapes.values()]
    answers: dict[Hashable, bool] = {}
    kept: list[PodRequest] = []
    for pod in pods:
        key = (pod.containers, pod.cpu_milli, pod.memory_mib)
        fits = answers.get(key)
        if fits is None:
            fits = any(check_fit(state, pod).fits for state in empty)
            answers[key] = fits
        if fits:
            kept.append(pod)
    return kept


def _shape(node: Node) -> Hashable:
    """What a fit check on the empty node reads: its GPUs, CPU and memory (not its name)."""
    return (node.gpus, node.cpu_milli, node.memory_mib)
