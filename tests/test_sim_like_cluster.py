"""``gpushare simulate --like-cluster``: pods that ask no GPU placed by kube-scheduler's own
scores (ties drawn with the run's seed), every pod only among the nodes kube-scheduler scores,
and the curve it gives on the embedded trace against the ideal run's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.learned import node_local_context
from gpushare.core.model import Node, PodRequest
from gpushare.core.policies import make_policy
from gpushare.sim.engine import LikeCluster, RunRecord, blind_node, blind_pod, simulate
from gpushare.sim.experiment import policy_context, run_one
from gpushare.sim.trace import load_embedded_trace
from gpushare.sim.workload import make_run
from gpushare.testing.core import gpu_node, pod_request


def nodes(count: int) -> list[Node]:
    """``count`` equal nodes of one 1000-unit GPU, 8 CPUs and 16 GiB, named in index order."""
    return [
        gpu_node((1000,), name=f"n{i:03d}", cpu_milli=8000, memory_mib=16384) for i in range(count)
    ]


def run(
    cluster: list[Node],
    stream: list[PodRequest],
    like: LikeCluster | None,
    tie_rank: list[int] | None = None,
) -> RunRecord:
    workload = TargetWorkload.from_pods([p for p in stream if p.gpu_containers] or stream)
    return simulate(
        cluster,
        stream,
        make_policy("bestfit"),
        tie_rank=tie_rank or list(range(len(cluster))),
        workload=workload,
        like_cluster=like,
    )


def hosts(record: RunRecord) -> list[str]:
    """The nodes that hold anything at the end, by name."""
    return [s.node.name for s in record.final_states if s.cpu_used_milli or any(s.gpu_used)]


CPU_POD = pod_request(key="ns/cpu", cpu_milli=1000, memory_mib=2048)


def test_a_pod_without_gpu_goes_to_the_least_allocated_node() -> None:
    gpu_pod = pod_request(("main", 500, 1), key="ns/gpu", cpu_milli=4000, memory_mib=8192)
    record = run(nodes(2), [gpu_pod, CPU_POD], LikeCluster(seed=1))
    states = {s.node.name: s for s in record.final_states}
    assert (states["n000"].cpu_used_milli, states["n001"].cpu_used_milli) == (4000, 1000)


@pytest.mark.parametrize("seed", [1, 2, 3, 42])
def test_equal_best_nodes_are_drawn_with_the_seed(seed: int) -> None:
    record = run(nodes(4), [CPU_POD], LikeCluster(seed=seed))
    assert hosts(record) == [f"n{random.Random(seed).choice(range(4)):03d}"]


def test_the_draw_among_equals_varies_with_the_seed() -> None:
    chosen = {hosts(run(nodes(4), [CPU_POD], LikeCluster(seed=s)))[0] for s in range(20)}
    assert len(chosen) > 1


def tight_last(count: int) -> list[Node]:
    """``nodes(count)`` with the last one's GPU of 600 units: bestfit's clear favourite for
    a pod of 550."""
    cluster = nodes(count)
    last = cluster[-1]
    cluster[-1] = gpu_node((600,), name=last.name, cpu_milli=8000, memory_mib=16384)
    return cluster


def gpu_pods(count: int) -> list[PodRequest]:
    return [
        pod_request(("main", 550, 1), key=f"ns/g{i}", cpu_milli=100, memory_mib=100)
        for i in range(count)
    ]


FIRST_100 = {f"n{i:03d}" for i in range(100)}


@pytest.mark.parametrize(
    ("like", "reaches_the_favourite"),
    [
        pytest.param(None, True, id="ideal: the policy's best of all 120 nodes"),
        pytest.param(LikeCluster(seed=1), False, id="like the cluster: 100 of 120 scored"),
        pytest.param(
            LikeCluster(seed=1, percentage_of_nodes_to_score=100),
            True,
            id="percentageOfNodesToScore 100: all 120 scored",
        ),
    ],
)
def test_a_gpu_pod_is_placed_among_the_nodes_kube_scheduler_scores(
    like: LikeCluster | None, reaches_the_favourite: bool
) -> None:
    (host,) = hosts(run(tight_last(120), gpu_pods(1), like))
    assert (host == "n119") is reaches_the_favourite
    if not reaches_the_favourite:
        assert host in FIRST_100


def test_each_scan_starts_where_the_last_one_stopped() -> None:
    # The first scan finds n000..n099; the second starts at n100 and reaches n119.
    first, second = hosts(run(tight_last(120), gpu_pods(2), LikeCluster(seed=1)))
    assert {first, second} - FIRST_100 == {"n119"}


def favourite_and_roomy() -> list[Node]:
    """n000: a 600-unit GPU and 2 CPUs (bestfit's favourite for 550 units and 1 CPU, and
    the node kube-scheduler's least-allocated score likes least); n001, n002: 1000 units and
    64 CPUs."""
    return [
        gpu_node((600,), name="n000", cpu_milli=2000, memory_mib=16384),
        gpu_node((1000,), name="n001", cpu_milli=64000, memory_mib=16384),
        gpu_node((1000,), name="n002", cpu_milli=64000, memory_mib=16384),
    ]


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(
            pod_request(("main", 550, 1), key="ns/gpu", cpu_milli=1000, memory_mib=100),
            {"n000"},
            id="a GPU pod: the extender's 10 against 0 outweighs kube-scheduler's spreading",
        ),
        pytest.param(
            pod_request(key="ns/cpu", cpu_milli=1000, memory_mib=100),
            {"n001", "n002"},
            id="a pod without GPU: kube-scheduler's spreading alone",
        ),
    ],
)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_gpu_pods_follow_the_extender_and_others_kube_scheduler(
    pod: PodRequest, expected: set[str], seed: int
) -> None:
    (host,) = hosts(run(favourite_and_roomy(), [pod], LikeCluster(seed=seed)))
    assert host in expected


def test_a_percentage_over_100_is_refused() -> None:
    with pytest.raises(ValueError, match="got 150"):
        LikeCluster(seed=1, percentage_of_nodes_to_score=150)


def test_like_the_cluster_leaves_more_unallocated_than_ideal_on_the_embedded_trace() -> None:
    trace = load_embedded_trace()
    ideal = run_one(trace.nodes, trace.pods, "fgd-spare", 42)
    like = run_one(trace.nodes, trace.pods, "fgd-spare", 42, like_cluster=True)
    assert not np.array_equal(ideal.curves.unallocated_pct, like.curves.unallocated_pct)
    assert like.curves.unallocated_pct[100] > ideal.curves.unallocated_pct[100]
    assert like.failed_by_kind.get("cpu", 0) == ideal.failed_by_kind.get("cpu", 0) == 0


def test_learning_m_online_changes_the_cluster_like_run() -> None:
    trace = load_embedded_trace()
    learned = run_one(trace.nodes, trace.pods, "fgd-spare", 42, like_cluster=True)
    nodes_ = list(trace.nodes)
    setup = make_run(nodes_, trace.pods, 42)
    context = policy_context(nodes_, trace.pods, 42)
    assert context.workload is not None
    fixed = simulate(
        nodes_,
        setup.stream,
        make_policy("fgd-spare", node_local_context(context.workload, 1000)),
        tie_rank=setup.tie_rank,
        workload=context.workload,
        like_cluster=LikeCluster(42, learn_workload=False),
    )
    assert fixed.placed != learned.placed


def test_the_policy_sees_what_the_extender_sees_gpus_only() -> None:
    node = gpu_node((1000, 1000), name="n", cpu_milli=8000, memory_mib=16384)
    pod = pod_request(("main", 500, 1), key="ns/p", cpu_milli=4000, memory_mib=8192)
    assert (blind_node(node).cpu_milli, blind_node(node).memory_mib) == (None, None)
    assert blind_node(node).gpus == node.gpus
    assert (blind_pod(pod).cpu_milli, blind_pod(pod).memory_mib) == (0, 0)
    assert (blind_pod(pod).key, blind_pod(pod).containers) == (pod.key, pod.containers)


@pytest.mark.parametrize(
    ("like", "together"),
    [
        pytest.param(
            None, False, id="ideal: clustering keeps a whole-GPU pod off the sharing pod's node"
        ),
        pytest.param(
            LikeCluster(seed=1),
            True,
            id="like the cluster: the extender counts no pods by kind, the fuller node wins",
        ),
    ],
)
def test_clustering_sees_the_pods_by_kind_only_in_the_ideal_run(
    like: LikeCluster | None, together: bool
) -> None:
    cluster = [
        gpu_node((1000, 1000), name=f"n{i:03d}", cpu_milli=8000, memory_mib=16384) for i in range(2)
    ]
    stream = [
        pod_request(("main", 500, 1), key="ns/share", cpu_milli=100, memory_mib=100),
        pod_request(("main", 1000, 1), key="ns/whole", cpu_milli=100, memory_mib=100),
    ]
    workload = TargetWorkload.from_pods(stream)
    record = simulate(
        cluster,
        stream,
        make_policy("clustering", node_local_context(workload, 1000)),
        tie_rank=[0, 1],
        workload=workload,
        like_cluster=like,
    )
    share, whole = record.placed_on
    assert (share == whole) is together


@pytest.mark.parametrize("seed", range(1, 9))
def test_kube_scheduler_scores_a_gpu_pod_on_its_cpu_request_the_extender_does_not_see(
    seed: int,
) -> None:
    # Equal GPUs: the extender gives both nodes 10. kube-scheduler's own scores on the pod's
    # 4 CPUs: least-allocated 50 on 8 CPUs against 93 on 64 (balance agrees), never a draw.
    cluster = [
        gpu_node((1000,), name="n000", cpu_milli=8000, memory_mib=16384),
        gpu_node((1000,), name="n001", cpu_milli=64000, memory_mib=16384),
    ]
    pod = pod_request(("main", 500, 1), key="ns/gpu", cpu_milli=4000)
    assert hosts(run(cluster, [pod], LikeCluster(seed=seed))) == ["n001"]
