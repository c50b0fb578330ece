"""Everything the cluster hands over is bounded when it is echoed or believed: a value's
echo in an error never walks the whole value, refusals of long user
lists stay short and the same on every node, an inventory's GPU sizes are bounded, and an
inventory that disagrees with the node's capacity is said to.
"""

from __future__ import annotations

import json
import tracemalloc
from typing import Any

import pytest

from gpushare.core.policies import make_policy
from gpushare.core.text import shown_names
from gpushare.extender.scheduler import Scheduler
from gpushare.extender.state import ExtenderState
from gpushare.extender.wire import ExtenderArgs
from gpushare.inspect import Snapshot, build_report
from gpushare.kube.codec import INVENTORY, CodecError, MemoryUnit, node_info
from gpushare.kube.codec.common import shown
from gpushare.testing.extender import RecordingBinder, node_json, pod_json


def laughs(levels: int) -> list[Any]:
    """A YAML alias bomb as the loader builds it: each level nine references to the last."""
    value: list[Any] = ["lol"] * 9
    for _ in range(levels):
        value = [value] * 9
    return value


def test_an_error_echoes_a_shared_value_without_walking_it() -> None:
    """9^7 = 4.8 million values behind 8 small lists: ``repr`` would build a 30 MB string."""
    tracemalloc.start()
    try:
        error = CodecError("node n1", "data", laughs(7), "not a mapping", "a mapping")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert len(str(error)) < 300
    assert "..." in shown(laughs(7))


@pytest.mark.parametrize(
    ("names", "text"),
    [
        pytest.param(["a"], "a", id="one"),
        pytest.param(["a", "b", "c"], "a/b/c", id="three"),
        pytest.param(
            [f"GPU-{i}" for i in range(5000)],
            "GPU-0/GPU-1/GPU-2 and 4,997 more",
            id="5,000 cut to three and a count",
        ),
        pytest.param(["x" * 200], "x" * 77 + "...", id="a long name cut"),
    ],
)
def test_shown_names(names: list[str], text: str) -> None:
    assert shown_names(names, "/") == text


def test_a_5000_uuid_pod_gets_one_short_refusal_on_every_node() -> None:
    """A 205 KB ``nvidia.com/use-gpuuuid`` on 12 nodes: kube-scheduler writes one line per
    distinct reason into the pod's status, so the reason is short and the same everywhere."""
    state = ExtenderState()
    nodes = [f"n{i:02d}" for i in range(12)]
    for name in nodes:
        state.upsert_node(node_json(name, [16, 16], unit=MemoryUnit.GIB))
    state.cluster.mark_synced()
    uuids = ",".join(f"GPU-{i:08d}-0000-0000-0000-000000000000" for i in range(5000))
    pod = pod_json("many", 4, annotations={"nvidia.com/use-gpuuuid": uuids})
    scheduler = Scheduler(state, make_policy("binpack"), RecordingBinder())
    result = scheduler.filter(ExtenderArgs(pod=pod, node_names=nodes))
    reasons = set((result.failed_and_unresolvable_nodes or {}).values())
    (reason,) = reasons
    assert len(reason) < 400
    assert "and 4,997 more" in reason
    report = build_report(Snapshot(tuple(state.cluster.objects()[0]), (pod,)))
    assert len(json.dumps([f.text for p in report.pending for f in p.nodes])) < 12 * 400


def inventory(memory: int, capacity: str) -> dict[str, Any]:
    node = node_json("n1", [16, 16], unit=MemoryUnit.GIB)
    document = json.loads(node["metadata"]["annotations"][INVENTORY])
    document["gpus"][0]["memory"] = memory
    node["metadata"]["annotations"][INVENTORY] = json.dumps(document)
    node["status"]["capacity"]["aliyun.com/gpu-mem"] = capacity
    return node


def test_a_gpu_of_10_to_the_30_gib_is_refused() -> None:
    with pytest.raises(CodecError, match=r"memory 1\.\.16,777,216"):
        node_info(inventory(10**30, "32"))


@pytest.mark.parametrize(
    ("memory", "capacity", "mismatch"),
    [
        pytest.param(16, "32", "", id="inventory and capacity agree"),
        pytest.param(
            1000,
            "32",
            "annotation gpushare.io/gpu-inventory announces 1,016 GiB of GPU memory and "
            "status.capacity aliyun.com/gpu-mem counts 32",
            id="inventory announces more than the capacity counts",
        ),
    ],
)
def test_an_inventory_that_disagrees_with_the_capacity_is_said_to(
    memory: int, capacity: str, mismatch: str
) -> None:
    info = node_info(inventory(memory, capacity))
    assert (mismatch in info.mismatch) if mismatch else info.mismatch == ""
    report = build_report(Snapshot((inventory(memory, capacity),), ()))
    assert any(mismatch in p for p in report.problems) == bool(mismatch)
