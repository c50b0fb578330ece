"""A smaller cluster from a trace (``gpushare.sim.sample``): a seeded sample of its nodes in
file order, and the pods at least one sampled node could hold."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.sim.sample import sample_nodes, servable_pods
from gpushare.testing.core import gpu_node, pod_request

CLUSTER = [gpu_node((1000,) * (1 + i % 4), name=f"n{i:02d}") for i in range(20)]


@pytest.mark.parametrize("seed", [0, 42, 7])
def test_the_sample_is_seeded_and_kept_in_file_order(seed: int) -> None:
    sample = sample_nodes(CLUSTER, 8, seed)
    assert sample == sample_nodes(CLUSTER, 8, seed)
    assert len({n.name for n in sample}) == 8
    assert [n.name for n in sample] == sorted(n.name for n in sample)


def test_other_seeds_sample_other_nodes() -> None:
    assert sample_nodes(CLUSTER, 8, 42) != sample_nodes(CLUSTER, 8, 43)


def test_a_sample_of_every_node_is_the_trace() -> None:
    assert sample_nodes(CLUSTER, len(CLUSTER), 42) == CLUSTER


@pytest.mark.parametrize("count", [0, -1, 21], ids=["none", "negative", "more than the trace"])
def test_a_sample_size_outside_the_trace_is_refused_with_the_range(count: int) -> None:
    with pytest.raises(ValueError, match=f"node sample of {count}: accepted 1 to 20"):
        sample_nodes(CLUSTER, count, 42)


@dataclass(frozen=True)
class ServableCase:
    id: str
    nodes: list[Node]
    pod: PodRequest
    kept: bool


TWO_T4 = gpu_node((1000, 1000), name="t4", model="T4", cpu_milli=8000, memory_mib=16384)
FOUR_V100 = gpu_node((1000,) * 4, name="v100", model="V100", cpu_milli=32000, memory_mib=65536)


def on_models(share: int, count: int, *models: str, cpu: int = 0) -> PodRequest:
    container = ContainerRequest("main", share, count, allowed_models=frozenset(models))
    return pod_request(container, cpu_milli=cpu)


SERVABLE_CASES = [
    ServableCase("a share any node holds", [TWO_T4], pod_request((500, 1)), True),
    ServableCase("a CPU-only pod that fits a node's CPU", [TWO_T4],
                 pod_request(cpu_milli=8000), True),
    ServableCase("more CPU than any node has", [TWO_T4], pod_request(cpu_milli=8001), False),
    ServableCase("more memory than any node has", [TWO_T4],
                 pod_request(memory_mib=16385), False),
    ServableCase("more GPUs than the largest node's", [TWO_T4],
                 pod_request((1000, 4)), False),
    ServableCase("as many GPUs as one node of the sample has", [TWO_T4, FOUR_V100],
                 pod_request((1000, 4)), True),
    ServableCase("a model the sample lacks", [TWO_T4], on_models(500, 1, "V100"), False),
    ServableCase("a model one node has", [TWO_T4, FOUR_V100], on_models(500, 1, "V100"), True),
    ServableCase("the model on one node, the CPU only on another", [TWO_T4, FOUR_V100],
                 on_models(500, 1, "T4", cpu=16000), False),
]  # fmt: skip


@pytest.mark.parametrize("case", SERVABLE_CASES, ids=[c.id for c in SERVABLE_CASES])
def test_a_pod_is_kept_when_one_sampled_node_could_hold_it_empty(case: ServableCase) -> None:
    assert servable_pods([case.pod], case.nodes) == ([case.pod] if case.kept else [])


def test_servable_pods_keep_their_order_and_leave_out_the_rest() -> None:
    pods = [pod_request((500, 1), key=f"ns/p{i}", cpu_milli=6000 * (i % 3)) for i in range(6)]
    kept = servable_pods(pods, [TWO_T4])
    assert [p.key for p in kept] == ["ns/p0", "ns/p1", "ns/p3", "ns/p4"]
