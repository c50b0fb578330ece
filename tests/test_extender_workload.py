"""FGD's target workload in the extender (``gpushare.extender.workload``): the placeholder until
GPU pods are known, then ``TargetWorkload.from_pods`` over the bound and pending pods of the
cluster cache and the pods the policy scores, rebuilt after enough changes or time; finished and
deleted pods leave it; the app's ``fgd`` scores with it."""

from __future__ import annotations

import json

import pytest

from gpushare.core.fragmentation import TargetWorkload, TaskShape
from gpushare.core.model import ContainerRequest, NodeState, PodRequest
from gpushare.extender import ExtenderState, create_app
from gpushare.extender.bindapi import UnwiredBinder
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.scoring import default_workload, derived_gpu_unit
from gpushare.extender.wire import ExtenderArgs, decode, encode
from gpushare.extender.workload import AdaptiveFgd, WorkloadTracker, live_policy
from gpushare.kube.codec import MemoryUnit, node_info
from gpushare.kube.watch import Action, Change
from gpushare.testing.core import pod_request as build_pod
from gpushare.testing.extender import node_json, plain_request, pod_json, seed_bound_pods


def _pod(key: str, share: int, count: int = 1) -> PodRequest:
    return build_pod(("main", share, count), key=key)


def _change(obj: dict[str, object], action: Action = Action.UPSERT) -> Change:
    metadata = obj["metadata"]
    assert isinstance(metadata, dict)
    return Change("Pod", action, f"{metadata['namespace']}/{metadata['name']}", obj)


def _weights(workload: TargetWorkload) -> dict[TaskShape, float]:
    return dict(zip(workload.shapes, workload.weights, strict=True))


def test_placeholder_until_pods_are_known() -> None:
    tracker = WorkloadTracker(16)
    assert tracker.workload() == default_workload(16)
    assert not tracker.from_pods
    tracker.observe(PodRequest("default/cpu", (ContainerRequest("main", 0, 0),)))
    assert tracker.workload() == default_workload(16)


def test_cache_pods_shape_the_workload() -> None:
    now = [0.0]
    tracker = WorkloadTracker(16, refresh_changes=1_000, refresh_s=60, clock=lambda: now[0])
    for i in range(3):
        tracker.on_pod(_change(pod_json(f"half-{i}", 8)))  # pending
    tracker.on_pod(_change(pod_json("whole", 16, node="n1")))  # bound
    first = tracker.workload()  # the first pods replace the placeholder at once
    assert tracker.from_pods
    assert _weights(first) == {TaskShape(0, 8, 1): 0.75, TaskShape(0, 16, 1): 0.25}

    tracker.on_pod(_change(pod_json("quarter", 4)))
    assert tracker.workload() is first  # one change: not yet
    now[0] = 61.0
    second = tracker.workload()  # a minute later
    assert _weights(second) == {
        TaskShape(0, 8, 1): 0.6,
        TaskShape(0, 16, 1): 0.2,
        TaskShape(0, 4, 1): 0.2,
    }

    tracker.on_pod(_change(pod_json("whole", 16, node="n1"), Action.DELETE))
    finished = pod_json("quarter", 4)
    finished["status"] = {"phase": "Succeeded"}
    tracker.on_pod(_change(finished))
    tracker.on_pod(_change(pod_json("garbage", None, limits={"aliyun.com/gpu-mem": "x"})))
    assert tracker.pods == 3
    now[0] = 200.0
    assert _weights(tracker.workload()) == {TaskShape(0, 8, 1): 1.0}


def test_refresh_after_n_changes() -> None:
    tracker = WorkloadTracker(16, refresh_changes=2, refresh_s=1e9)
    tracker.observe(_pod("a/one", 16, 2))
    assert _weights(tracker.workload()) == {TaskShape(0, 16, 2): 1.0}
    tracker.observe(_pod("a/two", 4))
    assert _weights(tracker.workload()) == {TaskShape(0, 16, 2): 1.0}
    tracker.observe(_pod("a/three", 4))
    assert _weights(tracker.workload()) == {TaskShape(0, 4, 1): 2 / 3, TaskShape(0, 16, 2): 1 / 3}


def test_policy_workload_reflects_scored_pods() -> None:
    policy = live_policy("fgd", 16)
    assert isinstance(policy, AdaptiveFgd)
    assert policy.workload == default_workload(16)
    before = policy.generation
    node = node_info(node_json("n1", [16, 16], unit=MemoryUnit.GIB)).node
    state = NodeState.empty(node)
    for i in range(4):
        policy.score(state, _pod(f"default/p{i}", 4))
    assert _weights(policy.workload) == {TaskShape(0, 4, 1): 1.0}
    assert policy.generation != before  # cached scores of the old M are dropped
    assert live_policy("binpack", 16) == "binpack"


def test_app_fgd_scores_with_the_cluster_workload() -> None:
    tracker = WorkloadTracker(16)
    policy = live_policy("fgd-cpu", 16, tracker)
    state = ExtenderState()
    state.upsert_node(node_json("n1", [16, 16], unit=MemoryUnit.GIB))
    state.cluster.mark_synced()
    app = create_app(state, policy=policy, gpu_unit=16, expire_interval_s=None)
    assert app.state.scheduler.policy is policy
    tracker.observe(plain_request(pod_json("p", 12)))
    assert _weights(tracker.workload()) == {TaskShape(0, 12, 1): 1.0}


def test_cached_scores_follow_a_new_workload() -> None:
    """After M changes, the long-lived scheduler's prioritize equals a fresh scheduler's
    (in this state the two workloads rank n1 differently: 10 under the default M, 4 once
    6 GiB pods dominate)."""
    tracker = WorkloadTracker(16, refresh_changes=1)  # every observed pod moves M at once
    state = ExtenderState()
    used = {"n0": [10, 10], "n1": [0, 6], "n2": [12, 10]}  # GiB in use on two 16 GiB GPUs
    for name in used:
        state.upsert_node(node_json(name, [16, 16], unit=MemoryUnit.GIB))
    for name, amounts in used.items():
        seed_bound_pods(state, name, amounts)
    state.cluster.mark_synced()
    long_lived = Scheduler(state, AdaptiveFgd("fgd", tracker), UnwiredBinder())
    body = json.dumps({"Pod": pod_json("p", 4), "Nodes": None, "NodeNames": list(used)})
    args = decode(body.encode(), ExtenderArgs, "prioritize")
    before = encode(long_lived.prioritize(args))  # fills the caches under the default M
    for i in range(8):
        tracker.observe(plain_request(pod_json(f"six-{i}", 6)))
    fresh = Scheduler(state, AdaptiveFgd("fgd", tracker), UnwiredBinder())
    expected = encode(fresh.prioritize(args))
    assert expected != before  # the scenario really distinguishes the two workloads
    assert encode(long_lived.prioritize(args)) == expected


# ---- one whole GPU derived from the node inventory (nothing to configure) --------------------


@pytest.mark.parametrize(
    ("capacities", "expected"),
    [
        pytest.param({}, 16, id="no-GPU-known-the-fallback"),
        pytest.param({16: 8}, 16, id="16-GiB-GPUs-in-GiB"),
        pytest.param({16_384: 8, 81_920: 2}, 16_384, id="the-capacity-most-GPUs-have-in-MiB"),
        pytest.param({16: 4, 80: 4}, 80, id="a-tie-goes-to-the-larger"),
        pytest.param({2: 8}, 4, id="at-least-4-for-the-placeholder-quarters"),
        pytest.param({16: 0, 80: 2}, 80, id="counts-of-0-are-gone"),
    ],
)
def test_derived_gpu_unit(capacities: dict[int, int], expected: int) -> None:
    assert derived_gpu_unit(capacities) == expected


def test_the_state_counts_gpus_by_capacity_as_nodes_come_and_go() -> None:
    state = ExtenderState()
    state.upsert_node(node_json("t4-a", [16, 16]))
    state.upsert_node(node_json("t4-b", [16, 16]))
    state.upsert_node(node_json("a100", [80]))
    assert state.cluster.gpu_capacities() == {16: 4, 80: 1}
    state.upsert_node(node_json("t4-b", [80, 80, 80, 80]))  # relabelled with other GPUs
    state.remove_node("t4-a")
    assert state.cluster.gpu_capacities() == {80: 5}


def test_a_derived_unit_follows_the_inventory_and_rebuilds_the_policy() -> None:
    """Before any node the placeholder is in 16ths; once 80 GiB GPUs are known (checked at
    every call while none is), M's placeholder and the policy are rebuilt in 80ths; later
    changes are seen after ``unit_check_s``."""
    now = [0.0]
    state = ExtenderState()
    tracker = WorkloadTracker(
        None, gpu_capacities=state.cluster.gpu_capacities, unit_check_s=5, clock=lambda: now[0]
    )
    policy = AdaptiveFgd("fgd-spare", tracker)
    assert tracker.gpu_unit == 16
    generation = policy.generation
    state.upsert_node(node_json("a100", [80] * 8))
    assert policy.workload == default_workload(80)  # no GPU was known: checked at once
    assert tracker.gpu_unit == 80
    assert policy.generation == generation + 1
    state.upsert_node(node_json("t4", [16] * 16))
    assert tracker.gpu_unit == 80  # not yet: checked every 5 s once GPUs are known
    now[0] = 5.0
    assert policy.workload == default_workload(16)
    assert policy.generation == generation + 2


def test_a_given_unit_never_moves() -> None:
    state = ExtenderState()
    state.upsert_node(node_json("a100", [80] * 8))
    tracker = WorkloadTracker(16, gpu_capacities=state.cluster.gpu_capacities, unit_check_s=0)
    assert tracker.workload() == default_workload(16)
    assert tracker.gpu_unit == 16
