"""The shared builders of core values (``gpushare.testing.core``) build what they say."""

from __future__ import annotations

from gpushare.core.model import ContainerRequest, Gpu, Node, NodeState, PodRequest
from gpushare.testing.core import gpu_node, node_state, pod_request


def test_gpu_node_defaults_and_overrides() -> None:
    assert gpu_node((16, 8)) == Node("node", (Gpu(0, "T4", 16), Gpu(1, "T4", 8)))
    assert gpu_node(
        (16, 8), name="n1", models=("A", "B"), healthy=(True, False), cpu_milli=4000
    ) == Node("n1", (Gpu(0, "A", 16), Gpu(1, "B", 8, healthy=False)), cpu_milli=4000)


def test_node_state_is_empty_unless_used_is_given() -> None:
    assert node_state((16, 8)).gpu_used == (0, 0)
    state = node_state((16, 8), (4, 8), workload_tags={"t": 1}, cpu_used_milli=500)
    assert state == NodeState(gpu_node((16, 8)), (4, 8), cpu_used_milli=500, workload_tags={"t": 1})
    assert state.gpu_free == (12, 0)


def test_pod_request_names_containers_by_position_unless_named() -> None:
    assert pod_request((4, 1), ("sidecar", 2, 2), ContainerRequest("x", 1, 1), cpu_milli=10) == (
        PodRequest(
            "ns/pod",
            (ContainerRequest("c0", 4, 1), ContainerRequest("sidecar", 2, 2),
             ContainerRequest("x", 1, 1)),
            cpu_milli=10,
        )
    )  # fmt: skip
    assert pod_request(("main", 4, 1), key="a/b").key == "a/b"
