"""Golden-output tests of the inspect renderers (``gpushare.inspect.render``).

Each named case builds a fixed snapshot with the shared fakes and compares the summary view, the
``-d`` view and the JSON with ``tests/fixtures/inspect/<case>.{summary.txt,detail.txt,json}``.
Regenerate them after an intended change with::

    GPUSHARE_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_inspect_render.py

and read the diff before committing it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from gpushare.core.model import ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.inspect import Snapshot, build_report, render_detail, render_summary, report_json
from gpushare.kube.codec import ALIYUN_ASSIGNED, INVENTORY, MemoryUnit, node_info
from gpushare.testing.dialects import (
    bound_dialect_pod,
    dialect_pod_json,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.extender import alibaba_node_json, node_json, pod_json
from gpushare.testing.nodes import FakeGpu
from gpushare.testing.pods import bound_gpu_pod

GOLDEN = Path(__file__).parent / "fixtures" / "inspect"
UPDATE = os.environ.get("GPUSHARE_UPDATE_GOLDEN") == "1"

Json = dict[str, Any]


def node(
    name: str, gpus: Sequence[int | FakeGpu], ip: str, unit: MemoryUnit = MemoryUnit.GIB
) -> Json:
    """A GPU-share node (``gpu_node``) with an InternalIP."""
    result = node_json(name, gpus, unit=unit)
    result["status"]["addresses"] = [
        {"type": "Hostname", "address": name},
        {"type": "InternalIP", "address": ip},
    ]
    return result


def bound(
    namespace: str,
    name: str,
    on: Json,
    containers: Sequence[tuple[str, tuple[int, ...], int]],
    *,
    assigned: bool = True,
) -> Json:
    """A pod bound to ``on`` with the extender's annotations; started by the device plugin
    (``ALIYUN_COM_GPU_MEM_ASSIGNED: "true"``) unless ``assigned`` is false."""
    info = node_info(on)
    pod: Json = bound_gpu_pod(
        namespace, name, info.node, containers, assume_ns=1_700_000_000_000_000_000,
        unit=info.unit or MemoryUnit.GIB,
    ).to_dict()  # fmt: skip
    if assigned:
        pod["metadata"]["annotations"][ALIYUN_ASSIGNED] = "true"
    return pod


def two_nodes_165() -> Snapshot:
    """A 4×22 GiB node and a 7×11 GiB node with one 1 GiB pod: 1/165 (0%)."""
    a = node("gpu-a", [22] * 4, "192.168.0.10")
    b = node("gpu-b", [11] * 7, "192.168.0.11")
    return Snapshot((a, b), (bound("default", "binpack-1", b, [("binpack-1", (0,), 1)]),))


def t4_notebooks() -> Snapshot:
    """One 14 GiB T4 and three 4 GiB notebook pods: 12/14."""
    t4 = node("t4-node", [FakeGpu(0, 14, "Tesla-T4")], "10.0.3.7")
    pods = tuple(bound("notebooks", f"nb-{i}", t4, [("notebook", (0,), 4)]) for i in (1, 2, 3))
    return Snapshot((t4,), pods)


def pending_nowhere() -> Snapshot:
    """A 10 GiB pod: n1's GPUs have 4 free each, n2's only GPU is 8 GiB."""
    n1 = node("n1", [16, 16], "10.0.0.1")
    n2 = node("n2", [8], "10.0.0.2")
    pods = (
        bound("default", "a", n1, [("main", (0,), 12)]),
        bound("default", "b", n1, [("main", (1,), 12)]),
        pod_json("big", 10, namespace="ml"),
    )
    return Snapshot((n1, n2), pods)


def unhealthy_gpu() -> Snapshot:
    """GPU1 went unhealthy while a pod held 4 GiB of it."""
    n = node("n1", [FakeGpu(0, 16), FakeGpu(1, 16, healthy=False)], "10.0.0.1")
    return Snapshot((n,), (bound("default", "old", n, [("main", (1,), 4)]),))


def multi_gpu() -> Snapshot:
    """A pod whose c0 has 8 GiB on GPUs 0 and 1 and whose c1 has 4 on GPU 2, beside a small one."""
    n = node("n1", [16] * 4, "10.0.0.1")
    pods = (
        bound("research", "train", n, [("c0", (0, 1), 8), ("c1", (2,), 4)]),
        bound("default", "small", n, [("main", (0,), 2)]),
    )
    return Snapshot((n,), pods)


def starting_pod() -> Snapshot:
    """One pod started by the device plugin, one bound but not yet started (starting)."""
    n = node("n1", [16, 16], "10.0.0.1")
    pods = (
        bound("default", "running", n, [("main", (0,), 4)]),
        bound("default", "starting", n, [("main", (1,), 6)], assigned=False),
    )
    return Snapshot((n,), pods)


def node_filter() -> Snapshot:
    """``pending_nowhere``, rendered for node n1 alone."""
    return pending_nowhere()


def garbage_inventory() -> Snapshot:
    """A node whose inventory annotation is not JSON, beside a good one."""
    good = node("good", [16], "10.0.0.1")
    bad = node("bad", [16], "10.0.0.2")
    bad["metadata"]["annotations"][INVENTORY] = "{not json"
    return Snapshot((good, bad), (bound("default", "p", good, [("main", (0,), 4)]),))


def mixed_units() -> Snapshot:
    """A GiB node, a MiB node and an Alibaba node (capacity only, unit unknown) with a pod bound
    to it without an allocation record (Alibaba's PENDING column)."""
    gib = node("gib", [16], "10.0.0.1")
    mib = node("mib", [16276, 16276], "10.0.0.2", unit=MemoryUnit.MIB)
    old = alibaba_node_json("old", 30, 2)
    pods = (
        bound("default", "g", gib, [("main", (0,), 8)]),
        bound("default", "m", mib, [("main", (1,), 8138)]),
        pod_json("stray", 3, node="old"),
    )
    return Snapshot((gib, mib, old), pods)


def compute_and_whole() -> Snapshot:
    """docs/compute.md on one node of three 16 GiB GPUs: an Alibaba pod of 4 and gpu-manager's
    README pod 1 (8 GiB, 50 % compute) share GPU 0, README pod 2 holds GPUs 1 and 2 whole;
    pending: a HAMi whole GPU (no GPU holds nothing) and a HAMi 25 % share of 3,000 MiB."""
    n = node("n1", [16] * 3, "10.0.0.1")
    core_node = node_info(n).node
    pods = (
        bound("default", "alibaba", n, [("main", (0,), 4)]),
        bound_dialect_pod(gpu_manager_readme_pod_1("tencent", "ml"), core_node,
                          [ContainerAllocation("nvidia", (0,), 8, 500)]),
        bound_dialect_pod(gpu_manager_readme_pod_2("whole", "ml"), core_node,
                          [ContainerAllocation("nvidia", (1, 2), 16, 1000, exclusive=True)]),
        dialect_pod_json("hami-whole", {"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}},
                         namespace="ml"),
        dialect_pod_json("hami-share", {"main": {"nvidia.com/gpumem": 3000,
                                                 "nvidia.com/gpucores": 60}}, namespace="ml"),
    )  # fmt: skip
    return Snapshot((n,), pods)


def preemption_hold() -> Snapshot:
    """docs/usage.md, "Priorities and preemption", case 2 midway: on two 16 GiB GPUs of 12 GiB
    lows, the newer low is terminating for a priority-1000 pod asking 8 GiB whose hold keeps
    8 GiB of GPU 1; a priority-100 pod asking 10 GiB counts the hold as taken."""
    n = node("n1", [16, 16], "10.0.0.1")
    terminating = bound("default", "low-b", n, [("main", (1,), 12)])
    terminating["metadata"]["deletionTimestamp"] = "2026-11-27T00:00:00Z"
    pods = (
        bound("default", "low-a", n, [("main", (0,), 12)]),
        terminating,
        pod_json("high", 8, priority=1000),
        pod_json("late-low", 10, priority=100),
    )
    hold = Hold(
        "default/high", "uid-high", "n1", 1000, (ContainerAllocation("main", (1,), 8),),
        ("default/low-b",), ("uid-b",), created_s=0.0, expires_s=60.0, evictor="gpushare",
    )  # fmt: skip
    return Snapshot((n,), pods, (hold,))


CASES: list[tuple[str, Callable[[], Snapshot], str | None]] = [
    ("two_nodes_165", two_nodes_165, None),
    ("t4_notebooks", t4_notebooks, None),
    ("pending_nowhere", pending_nowhere, None),
    ("unhealthy_gpu", unhealthy_gpu, None),
    ("multi_gpu", multi_gpu, None),
    ("starting_pod", starting_pod, None),
    ("node_filter", node_filter, "n1"),
    ("garbage_inventory", garbage_inventory, None),
    ("mixed_units", mixed_units, None),
    ("compute_and_whole", compute_and_whole, None),
    ("preemption_hold", preemption_hold, None),
]


def check_golden(path: Path, text: str) -> None:
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    if not path.exists():
        pytest.fail(f"{path} missing: run with GPUSHARE_UPDATE_GOLDEN=1 to write it")
    assert text == path.read_text(encoding="utf-8"), (
        f"{path.name} differs; if intended, regenerate with GPUSHARE_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize(("case", "make", "only"), CASES, ids=[c[0] for c in CASES])
def test_golden_views(case: str, make: Callable[[], Snapshot], only: str | None) -> None:
    report = build_report(make(), node=only)
    check_golden(GOLDEN / f"{case}.summary.txt", render_summary(report))
    without_rows = build_report(make(), node=only, pod_rows=False)  # as kubectl builds it
    assert render_summary(without_rows) == render_summary(report)
    check_golden(GOLDEN / f"{case}.detail.txt", render_detail(report))
    data = report_json(report)
    check_golden(GOLDEN / f"{case}.json", json.dumps(data, indent=2) + "\n")
    assert json.loads(json.dumps(data)) == data


def test_alibaba_cluster_lines() -> None:
    """The summary's last lines, as scripts grep them."""
    text = render_summary(build_report(two_nodes_165()))
    assert text.endswith("Allocated/Total GPU Memory In Cluster:\n1/165 (0%)\n")
    t4 = render_summary(build_report(t4_notebooks()))
    assert t4.splitlines()[0].split() == [
        "NAME", "IPADDRESS", "GPU0(Allocated/Total)", "GPU", "Memory(GiB)",
    ]  # fmt: skip
    assert t4.splitlines()[1].split() == ["t4-node", "10.0.3.7", "12/14", "12/14"]
    assert "12/14 (85%)" in t4


def test_detail_lists_the_notebooks_on_gpu0() -> None:
    lines = render_detail(build_report(t4_notebooks())).splitlines()
    rows = [line.split() for line in lines if line.startswith("nb-")]
    assert rows == [[f"nb-{i}", "notebooks", "4"] for i in (1, 2, 3)]
    assert ["Allocated", ":", "12", "(85%)"] in [line.split() for line in lines]
    assert lines[-1] == "Allocated/Total GPU Memory In Cluster:  12/14 (85%)"


def test_columns_line_up() -> None:
    """Every cell of a column starts where its header does (Go tabwriter, padding 2)."""
    lines = render_summary(build_report(two_nodes_165())).splitlines()
    header, rows = lines[0], lines[1:3]
    starts = [header.index(h) for h in ("IPADDRESS", "GPU0(", "GPU6(", "GPU Memory")]
    for row in rows:
        assert all(row[s - 2 : s] == "  " and row[s] != " " for s in starts), row


def test_empty_report() -> None:
    report = build_report(Snapshot())
    assert render_summary(report) == (
        "NAME  IPADDRESS  GPU Memory\n"
        "---------------------------\n"
        "Allocated/Total GPU Memory In Cluster:\n"
        "0/0 (0%)\n"
    )
    assert render_detail(report) == "\n\nAllocated/Total GPU Memory In Cluster:  0/0 (0%)\n"
    assert report_json(report) == {
        "node": None, "nodes": [], "pending": [], "totals": [], "problems": [],
    }  # fmt: skip


def test_json_key_order_is_stable() -> None:
    data = report_json(build_report(multi_gpu()))
    assert list(data) == ["node", "nodes", "pending", "totals", "problems"]
    assert list(data["nodes"][0])[:4] == ["name", "address", "unit", "source"]
    (train,) = [pod for pod in data["nodes"][0]["pods"] if pod["name"] == "train"]
    assert train["gpus"] == [
        {"index": 0, "amount": 8}, {"index": 1, "amount": 8}, {"index": 2, "amount": 4},
    ]  # fmt: skip
