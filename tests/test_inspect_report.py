"""The inspect report (``gpushare.inspect.build_report``): what it counts where, one test a rule.

Each test builds a snapshot (nodes and pods as JSON) and checks what its report must say.
Snapshots are built from the shared fakes (``gpushare.testing``): GPU-share nodes from
``node_json``, bound pods with the extender's own annotations from ``bound_gpu_pod``, pending
pods from ``pod_json``. The renderers' golden files are in ``tests/test_inspect_render.py``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from types import MappingProxyType
from typing import Any

import pytest

from gpushare.core.fit import FitStatus, Reason
from gpushare.core.isolation import Enforcement, Isolation
from gpushare.core.model import ContainerAllocation
from gpushare.core.skipped import SkipKind
from gpushare.inspect import Report, Snapshot, build_report
from gpushare.inspect import report as report_module
from gpushare.inspect.gcpause import gc_paused
from gpushare.inspect.render import render_detail, report_json
from gpushare.inspect.report import PodRead, SnapshotReader, read_pod
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_IDX,
    ALIYUN_POD,
    ALLOCATION,
    GPU_MEM,
    INVENTORY,
    InventoryGpu,
    MemoryUnit,
    inventory_annotation,
    node_info,
)
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.extender import alibaba_node_json, node_json, plain_node_json, pod_json
from gpushare.testing.nodes import FakeGpu, fake_gpu_uuid
from gpushare.testing.pods import bound_gpu_pod

Json = dict[str, Any]


def node(
    name: str, gpus: Sequence[int | FakeGpu], unit: MemoryUnit = MemoryUnit.GIB, ip: str = ""
) -> Json:
    result = node_json(name, gpus, unit=unit)
    if ip:
        result["status"]["addresses"] = [{"type": "InternalIP", "address": ip}]
    return result


def bound(
    name: str,
    on: Json,
    containers: Sequence[tuple[str, tuple[int, ...], int]],
    *,
    assigned: bool = True,
    namespace: str = "default",
) -> Json:
    info = node_info(on)
    pod: Json = bound_gpu_pod(
        namespace, name, info.node, containers, assume_ns=1, unit=info.unit or MemoryUnit.GIB
    ).to_dict()
    if assigned:
        pod["metadata"]["annotations"][ALIYUN_ASSIGNED] = "true"
    return pod


def report(nodes: Sequence[Json], pods: Sequence[Json] = (), only: str | None = None) -> Report:
    return build_report(Snapshot(tuple(nodes), tuple(pods)), node=only)


def test_a_1_gib_pod_over_165_gib_reads_1_of_165_and_0_percent_truncated() -> None:
    """4×22 GiB + 7×11 GiB, one 1 GiB pod: 1/165, 0% (truncated)."""
    a, b = node("a", [22] * 4, ip="192.168.0.10"), node("b", [11] * 7)
    r = report([a, b], [bound("p", b, [("main", (0,), 1)])])
    assert [(n.name, n.allocated, n.total, n.address) for n in r.nodes] == [
        ("a", 0, 88, "192.168.0.10"), ("b", 1, 77, None),
    ]  # fmt: skip
    (total,) = r.totals
    assert (total.unit, total.allocated, total.total, total.percent) == ("GiB", 1, 165, 0)
    gpu0 = r.nodes[1].gpus[0]
    assert (gpu0.capacity, gpu0.allocated, gpu0.assumed, gpu0.free) == (11, 1, 0, 10)
    assert r.problems == ()
    assert r.pending == ()


def test_three_4_gib_notebooks_on_a_14_gib_t4_fill_12_of_14_listed_by_name() -> None:
    """One 14 GiB T4, three 4 GiB notebook pods: 12/14 on GPU0."""
    t4 = node("t4", [FakeGpu(0, 14, "Tesla-T4")])
    r = report([t4], [bound(f"nb-{i}", t4, [("nb", (0,), 4)]) for i in (3, 1, 2)])
    (n,) = r.nodes
    assert (n.allocated, n.total, r.totals[0].percent) == (12, 14, 85)
    assert [(p.name, p.gpus, p.total) for p in n.pods] == [
        (f"nb-{i}", ((0, 4),), 4) for i in (1, 2, 3)
    ]
    assert (n.gpus[0].model, n.gpus[0].free) == ("Tesla-T4", 2)


def test_a_pod_that_fits_nowhere_is_pending_with_each_nodes_reason_and_numbers() -> None:
    """A 10 GiB pod: 4 free per GPU on n1, an 8 GiB GPU on n2; numbers in the reasons."""
    n1, n2 = node("n1", [16, 16]), node("n2", [8])
    pods = [bound("a", n1, [("main", (0,), 12)]), bound("b", n1, [("main", (1,), 12)])]
    r = report([n1, n2], [*pods, pod_json("big", 10, namespace="ml")])
    (p,) = r.pending
    assert (p.namespace, p.name, p.total) == ("ml", "big", 10)
    assert [(f.node, f.status, f.reason) for f in p.nodes] == [
        ("n1", "does-not-fit-now", str(Reason.INSUFFICIENT_GPU)),
        ("n2", "can-never-fit", str(Reason.SHARE_EXCEEDS_GPU)),
    ]
    fit = p.nodes[0].fit
    assert fit is not None
    assert fit.free_per_gpu == (4, 4)
    assert fit.requested == 10
    assert p.nodes[0].text == (
        "node n1: no GPU has enough free; container main; requested 10; "
        "free/capacity per GPU 4/16, 4/16 (GiB)"
    )
    assert p.reason == f"{p.nodes[0].text} | {p.nodes[1].text}"


def test_an_unhealthy_gpu_keeps_its_pods_allocation_offers_nothing_and_counts_unhealthy() -> None:
    """An unhealthy GPU keeps its pod's allocation, offers nothing, counts as unhealthy."""
    n = node("n1", [FakeGpu(0, 16), FakeGpu(1, 16, healthy=False)])
    r = report([n], [bound("old", n, [("main", (1,), 4)]), pod_json("new", 14)])
    gpus = r.nodes[0].gpus
    assert [(g.healthy, g.allocated, g.free) for g in gpus] == [(True, 0, 16), (False, 4, 0)]
    assert not r.nodes[0].healthy
    assert r.nodes[0].unhealthy == 16
    assert (r.totals[0].unhealthy, r.totals[0].unhealthy_percent) == (16, 50)
    assert r.pending[0].nodes[0].status == FitStatus.FITS.value


def test_a_multi_gpu_pod_is_counted_per_gpu_and_per_container() -> None:
    """c0 takes 8 on GPUs 0 and 1, c1 4 on GPU 2: per GPU and per container."""
    n = node("n1", [16] * 4)
    r = report([n], [bound("train", n, [("c0", (0, 1), 8), ("c1", (2,), 4)])])
    (p,) = r.nodes[0].pods
    assert (p.gpus, p.total, p.amount(1), p.amount(3)) == (((0, 8), (1, 8), (2, 4)), 20, 8, 0)
    assert [(c.name, c.gpus, c.share) for c in p.containers] == [
        ("c0", (0, 1), 8), ("c1", (2,), 4),
    ]  # fmt: skip
    assert [g.allocated for g in r.nodes[0].gpus] == [8, 8, 4, 0]


def test_a_bound_pod_the_device_plugin_has_not_assigned_is_allocated_and_starting() -> None:
    """Bound, ALIYUN_COM_GPU_MEM_ASSIGNED "false": allocated, and starting (``assumed``)."""
    n = node("n1", [16, 16])
    pods = [bound("run", n, [("main", (0,), 4)]), bound("new", n, [("m", (1,), 6)], assigned=False)]
    r = report([n], pods)
    assert [(g.allocated, g.assumed) for g in r.nodes[0].gpus] == [(4, 0), (6, 6)]
    assert [(p.name, p.assigned) for p in r.nodes[0].pods] == [("new", False), ("run", True)]
    assert (r.nodes[0].allocated, r.nodes[0].assumed) == (10, 6)


def test_a_node_filter_reports_that_node_only_and_checks_pending_pods_against_it_alone() -> None:
    """``node=``: that node only; pending pods checked against it alone."""
    n1, n2 = node("n1", [16]), node("n2", [16])
    pods = [bound("a", n1, [("main", (0,), 4)]), bound("b", n2, [("main", (0,), 8)])]
    r = report([n1, n2], [*pods, pod_json("big", 20)], only="n2")
    assert [n.name for n in r.nodes] == ["n2"]
    assert r.node == "n2"
    assert [p.name for p in r.nodes[0].pods] == ["b"]
    assert [f.node for f in r.pending[0].nodes] == ["n2"]
    assert r.totals[0].total == 16


def test_a_node_with_a_garbage_inventory_is_one_problem_and_the_rest_is_reported() -> None:
    """A node with a garbage inventory: one problem line, the rest still reported."""
    good, bad = node("good", [16]), node("bad", [16])
    bad["metadata"]["annotations"][INVENTORY] = "{not json"
    r = report([good, bad], [bound("p", good, [("main", (0,), 4)])])
    assert [n.name for n in r.nodes] == ["good"]
    (problem,) = r.problems
    assert problem.startswith("node bad: annotation gpushare.io/gpu-inventory=")
    assert "JSON" in problem


def test_a_garbage_allocation_and_a_pod_on_a_missing_node_are_problems() -> None:
    """A pod with a garbage allocation and a pod on a node absent from the snapshot."""
    n = node("n1", [16])
    broken = bound("broken", n, [("main", (0,), 4)])
    broken["metadata"]["annotations"][ALLOCATION] = "[]"
    elsewhere = bound("far", node("gone", [16]), [("main", (0,), 4)])
    r = report([n], [broken, elsewhere])
    assert r.nodes[0].pods == ()
    assert len(r.problems) == 2
    assert r.problems[0].startswith(
        "pod default/broken on node n1: allocation cannot be read: "
        "annotation gpushare.io/allocation="
    )
    assert r.problems[0].endswith("; counted as every GPU of the node blocked")
    assert r.problems[1] == "node gone: 1 GPU pod(s) bound to it; node missing or unreadable"


def on_gpu_index(name: str, node_name: str, index: str, amount: str) -> Json:
    """A started pod bound to ``node_name`` with Alibaba's annotations: ``amount`` GiB on GPU
    ``index`` (raw annotation values, so that they can be garbage)."""
    notes = {ALIYUN_ASSIGNED: "true", ALIYUN_IDX: index, ALIYUN_POD: amount}
    return pod_json(name, 4, node=node_name, annotations=notes)


def test_a_pod_on_a_gpu_index_the_node_lacks_is_charged_on_every_gpu_and_is_a_problem() -> None:
    """A pod on GPU 7 of a 2-GPU node: charged on both GPUs (less free), as the extender
    charges it (``gpushare.core.skipped``), and named in the problems with what it is counted
    as; ``allocated`` counts only the pods that name the GPU."""
    n = node("n1", [16, 16])
    r = report([n], [bound("a", n, [("main", (0,), 8)]), on_gpu_index("ghost", "n1", "7", "4")])
    (n1,) = r.nodes
    assert [(g.allocated, g.free) for g in n1.gpus] == [(8, 4), (0, 12)]
    assert n1.allocated == 8
    assert [p.name for p in n1.pods] == ["a"]
    (ghost,) = n1.skipped
    assert (ghost.pod, ghost.kind, ghost.charges, ghost.missing) == (
        "default/ghost", SkipKind.UNKNOWN_GPU, ((0, 4), (1, 4)), ((7, 4),)
    )  # fmt: skip
    assert r.problems == (
        "pod default/ghost on node n1: allocation names a GPU the node does not have: node has "
        "no such GPU; GPU 7; requested 4; free/capacity per GPU 8/16, 16/16; counted as 4 on "
        "GPU 0, 4 on GPU 1",
    )


def test_an_unreadable_allocation_blocks_every_gpu_of_its_node() -> None:
    """A bound pod whose ``ALIYUN_COM_GPU_MEM_POD`` is not a number holds an unknown amount on
    an unknown GPU: every GPU of its node is blocked (free 0), nothing else counted."""
    n = node("n1", [16, 16])
    r = report([n, node("n2", [16])], [on_gpu_index("odd", "n1", "0", "four"), pod_json("p", 2)])
    n1 = r.nodes[0]
    assert [(g.allocated, g.free) for g in n1.gpus] == [(0, 0), (0, 0)]
    assert [(s.pod, s.kind, s.whole_node) for s in n1.skipped] == [
        ("default/odd", SkipKind.UNREADABLE, True)
    ]
    (fit_n1, fit_n2) = r.pending[0].nodes
    assert (fit_n1.reason, fit_n2.reason) == (str(Reason.INSUFFICIENT_GPU), str(Reason.FITS))
    (problem,) = r.problems
    assert problem.startswith("pod default/odd on node n1: allocation cannot be read: ")
    assert problem.endswith("; counted as every GPU of the node blocked")


def test_finished_pods_and_pods_asking_no_gpu_are_not_counted_and_plain_nodes_not_shown() -> None:
    """Finished pods and pods asking no GPU are not counted; plain nodes are not shown."""
    n = node("n1", [16])
    done = bound("done", n, [("main", (0,), 4)])
    done["status"] = {"phase": "Succeeded"}
    r = report([n, plain_node_json("cpu")], [done, pod_json("cpu-only", None)])
    assert [x.name for x in r.nodes] == ["n1"]
    assert r.nodes[0].pods == ()
    assert r.pending == ()


def test_a_pod_bound_without_an_allocation_record_is_reported_as_unplaced() -> None:
    """A pod bound without an allocation record counts in ``unplaced`` (Alibaba's PENDING),
    on a node read through Alibaba's fallback (unit unknown)."""
    r = report([alibaba_node_json("old", 30, 2)], [pod_json("stray", 3, node="old")])
    (n,) = r.nodes
    assert (n.unit, n.source, n.unplaced, n.allocated, n.total) == (None, "capacity", 3, 3, 30)
    assert [(p.name, p.placed, p.total, p.assigned) for p in n.pods] == [("stray", False, 3, False)]
    assert [g.allocated for g in n.gpus] == [0, 0]
    assert (r.totals[0].unit, r.totals[0].total) == (None, 30)


def test_gib_and_mib_nodes_are_totalled_apart() -> None:
    gib, mib = node("g", [16]), node("m", [16276], unit=MemoryUnit.MIB)
    r = report([mib, gib], [bound("x", mib, [("main", (0,), 8138)])])
    assert [(t.unit, t.allocated, t.total) for t in r.totals] == [
        ("GiB", 0, 16), ("MiB", 8138, 16276),
    ]  # fmt: skip


def test_a_node_that_lost_its_label_but_holds_a_pod_is_shown_and_marked() -> None:
    """A node that lost ``gpushare=true`` but still holds a pod is shown, marked."""
    n = node("n1", [16])
    del n["metadata"]["labels"]["gpushare"]
    r = report([n], [bound("p", n, [("main", (0,), 4)]), pod_json("new", 4)])
    assert (r.nodes[0].gpushare, r.nodes[0].refusal) == (False, "no label gpushare=true")
    assert r.pending[0].nodes == ()
    assert r.pending[0].reason == "no GPU-share node"


@pytest.mark.parametrize("rows", [True, False], ids=["with pod rows", "without pod rows"])
def test_a_record_over_capacity_is_skipped_in_the_order_a_restarted_extender_commits(
    rows: bool,
) -> None:
    """Two bound pods whose records overcommit a GPU: the ledger records them by namespace and
    name, as a restarted extender commits the API server's list, so ``a`` is allocated and
    ``b`` skipped, charged where it says it is: the GPU is never allocated above capacity."""
    n = node("n1", [16])
    pods = [bound("b", n, [("main", (0,), 8)]), bound("a", n, [("main", (0,), 12)])]
    r = build_report(Snapshot((n,), tuple(pods)), pod_rows=rows)
    (gpu,) = r.nodes[0].gpus
    assert (gpu.allocated, gpu.free) == (12, 0)
    assert [(s.pod, s.kind, s.charges) for s in r.nodes[0].skipped] == [
        ("default/b", SkipKind.OVER_CAPACITY, ((0, 8),))
    ]
    assert r.problems == (
        "pod default/b on node n1: allocation does not fit the GPU: not enough free on the GPU; "
        "GPU 0; requested 8; available 4; free/capacity per GPU 4/16; counted as 8 on GPU 0",
    )
    assert [p.name for p in r.nodes[0].pods] == (["a"] if rows else [])


def test_records_that_break_whole_gpus_or_compute_are_skipped_as_the_extender_skips_them() -> None:
    """What the ledger refuses besides memory: a share beside a GPU held whole, and compute
    above one GPU. The report does not sum them in: it skips them, like the extender."""
    n = node("n1", [16, 16])
    on_n = node_info(n).node

    def hami(name: str, limits: dict[str, int], got: ContainerAllocation) -> Json:
        pod = dialect_pod_json(name, {"main": limits}, namespace="default")
        return bound_dialect_pod(pod, on_n, [got])

    pods = [
        hami("a-whole", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100},
             ContainerAllocation("main", (0,), 16, 1000, exclusive=True)),
        bound("b-beside", n, [("main", (0,), 2)]),
        hami("c-compute", {"nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 70},
             ContainerAllocation("main", (1,), 2, 700)),
        hami("d-compute", {"nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 40},
             ContainerAllocation("main", (1,), 2, 400)),
    ]  # fmt: skip
    r = build_report(Snapshot((n,), tuple(pods)))
    (n1,) = r.nodes
    assert [(g.allocated, g.compute_milli, g.whole) for g in n1.gpus] == [
        (16, 1000, True), (2, 700, False),
    ]  # fmt: skip
    assert [(s.pod, s.kind) for s in n1.skipped] == [
        ("default/b-beside", SkipKind.OVER_CAPACITY), ("default/d-compute", SkipKind.OVER_CAPACITY),
    ]  # fmt: skip
    assert [p.split(":")[0] for p in r.problems] == [
        "pod default/b-beside on node n1", "pod default/d-compute on node n1",
    ]  # fmt: skip


def test_a_pod_that_fits_now_is_pending_with_the_nodes_it_fits_on() -> None:
    r = report([node("n1", [16]), node("n2", [4])], [pod_json("p", 8)])
    assert r.pending[0].reason.startswith("fits now on 1 of 2 node(s) (n1): ")


HOSTNAME = "kubernetes.io/hostname"
FULL_N1 = "no GPU has enough free; container main; requested 8; free/capacity per GPU 0/8 (GiB)"


def _in(*names: str) -> list[Json]:
    """Required node affinity: a term whose hostname is one of ``names``."""
    return [{"matchExpressions": [{"key": HOSTNAME, "operator": "In", "values": list(names)}]}]


@pytest.mark.parametrize(
    ("pod", "reason"),
    [
        pytest.param(pod_json("p", 8, node_selector={HOSTNAME: "n1"}),
                     "fits nowhere it may go (3 of 4 node(s) ruled out by nodeSelector): "
                     f"node n1: {FULL_N1}",
                     id="pinned-by-nodeSelector-to-a-full-node-fits-nowhere-it-may-go"),
        pytest.param(pod_json("p", 8, node_affinity=_in("n1")),
                     "fits nowhere it may go (3 of 4 node(s) ruled out by required node "
                     f"affinity): node n1: {FULL_N1}",
                     id="pinned-by-required-node-affinity-to-a-full-node-fits-nowhere"),
        pytest.param(pod_json("p", 8, node_selector={HOSTNAME: "n1"}, node_affinity=_in("n1")),
                     "fits nowhere it may go (3 of 4 node(s) ruled out by nodeSelector and "
                     f"required node affinity): node n1: {FULL_N1}",
                     id="both-constraints-are-named"),
        pytest.param(pod_json("p", 8, node_selector={"zone": "nowhere"}),
                     "fits nowhere it may go: 4 of 4 node(s) ruled out by nodeSelector, and no "
                     "other GPU-share node",
                     id="a-selector-no-node-matches-rules-out-every-node"),
        pytest.param(pod_json("p", 8, node_affinity=_in("n1", "n3")),
                     "fits now on 1 of 2 node(s) (n3): kube-scheduler has not placed it yet, or "
                     "another constraint holds it back (2 of 4 node(s) ruled out by required "
                     "node affinity)",
                     id="fits-counted-over-the-nodes-it-may-go-to-only"),
        pytest.param(pod_json("p", 8),
                     "fits now on 3 of 4 node(s) (n2, n3, n4): kube-scheduler has not placed "
                     "it yet, or another constraint holds it back",
                     id="no-constraint-counts-every-node"),
    ],
)  # fmt: skip
def test_pending_reason_counts_only_the_nodes_the_pod_may_go_to(pod: Json, reason: str) -> None:
    full = node("n1", [8])
    nodes = [full, node("n2", [16]), node("n3", [16]), node("n4", [16])]
    r = report(nodes, [bound("filler", full, [("main", (0,), 8)]), pod])
    (pending,) = r.pending
    assert pending.reason == reason


def test_unreadable_node_affinity_is_a_problem_and_not_honoured() -> None:
    garbage = pod_json("p", 8, node_affinity=[{"matchExpressions": [{"key": 3}]}])
    r = report([node("n1", [16])], [garbage])
    assert r.pending[0].reason.startswith("fits now on 1 of 1 node(s) (n1)")
    (problem,) = r.problems
    assert "pod default/p: spec.affinity.nodeAffinity" in problem
    assert "accepted: {key, operator: In|NotIn|Exists|DoesNotExist|Gt|Lt" in problem


@pytest.mark.parametrize(
    ("placed_by", "stray_scheduler", "use"),
    [
        pytest.param("gpushare-scheduler", None, "gpushare-scheduler",
                     id="no-schedulerName-is-the-default-scheduler-bypassing-gpushare"),
        pytest.param("team-gpu-scheduler", "default-scheduler", "team-gpu-scheduler",
                     id="the-scheduler-to-use-is-the-one-that-placed-the-other-gpu-pods"),
        pytest.param(None, "my-scheduler", "gpushare-scheduler",
                     id="nothing-placed-names-the-charts-scheduler"),
        pytest.param("default-scheduler", None, "gpushare-scheduler",
                     id="the-bypassing-pods-own-scheduler-is-never-the-one-to-use"),
    ],
)  # fmt: skip
def test_a_gpu_pod_placed_by_another_scheduler_is_a_warning_naming_it(
    placed_by: str | None, stray_scheduler: str | None, use: str
) -> None:
    n1 = node("n1", [16])
    pods = [pod_json("stray", 4, node="n1", namespace="team-a", scheduler=stray_scheduler)]
    if placed_by is not None:
        placed = bound("placed", n1, [("main", (0,), 4)])
        placed["spec"]["schedulerName"] = placed_by
        pods.append(placed)
    r = report([n1], pods)
    (bypassed,) = r.bypassed
    shown = stray_scheduler or "default-scheduler"
    assert (bypassed.namespace, bypassed.name, bypassed.node) == ("team-a", "stray", "n1")
    assert (bypassed.scheduler, bypassed.use) == (shown, use)
    assert bypassed.describe() == (
        f"pod team-a/stray on node n1 asks GPU memory but was placed by scheduler {shown!r}, "
        f"bypassing gpushare: it has no GPU and will not start; set spec.schedulerName: {use} "
        "and recreate it"
    )
    assert r.nodes[0].unplaced == 4  # the number shown before, still there


def test_one_reason_on_many_nodes_is_given_once_with_the_first_names() -> None:
    nodes = [node(f"n{i}", [4]) for i in range(5)]
    r = report(nodes, [pod_json("p", 8)])
    assert r.pending[0].reason == (
        "request is larger than any GPU on 5 nodes (n0, n1, n2, +2 more); requested 8"
    )


def test_a_filter_on_an_unknown_node_is_a_problem_and_leaves_no_gpu_share_node() -> None:
    r = report([node("n1", [16])], [pod_json("p", 8)], only="nope")
    assert r.nodes == ()
    assert r.problems == ("node nope: not found",)
    assert r.pending[0].reason == "no GPU-share node"


def test_report_is_pure_and_deterministic() -> None:
    n = node("n1", [16, 16])
    pods = [bound("b", n, [("main", (1,), 4)]), bound("a", n, [("main", (0,), 4)])]
    snapshot = Snapshot((n,), tuple(pods))
    assert build_report(snapshot) == build_report(Snapshot((n,), tuple(reversed(pods))))
    assert snapshot == Snapshot((n,), tuple(pods))


def test_a_kept_pod_reader_reads_only_new_objects_and_reports_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SnapshotReader`` (the extender keeps one for /inspect): the report equals one read afresh,
    problems included, while each object is read once; a replaced object (the extender's
    state replaces a pod's dict on every change) is read again; one the snapshot no longer
    holds is forgotten."""
    reads: list[str] = []

    def counting(obj: Json) -> PodRead:
        reads.append(obj["metadata"]["name"])
        return read_pod(obj)

    monkeypatch.setattr(report_module, "read_pod", counting)
    n1, n2, n3 = node("n1", [16, 16]), node("n2", [8]), node("n3", [16], unit=MemoryUnit.MIB)
    pods = [
        bound("a", n1, [("main", (0,), 12)]),
        bound("b", n1, [("main", (1,), 12)], assigned=False),
        bound("c", n2, [("main", (0,), 9)]),
        on_gpu_index("ghost", "n1", "5", "2"),
        on_gpu_index("odd", "n3", "0", "-1"),
        pod_json("big", 10, namespace="ml"),
    ]
    reader = SnapshotReader()

    def kept(objects: list[Json]) -> Report:
        return build_report(Snapshot((n1, n2, n3), tuple(objects)), reader=reader)

    def fresh(objects: list[Json]) -> Report:
        return build_report(Snapshot((n1, n2, n3), tuple(objects)))

    assert kept(pods) == fresh(pods)
    assert kept(pods) == fresh(pods)
    assert reads.count("a") == 3  # once by the kept reader, once by each fresh report
    started = {**pods[1], "metadata": {**pods[1]["metadata"]}}
    started["metadata"]["annotations"] = {**started["metadata"]["annotations"]}
    started["metadata"]["annotations"][ALIYUN_ASSIGNED] = "true"
    changed = [pods[0], started, *pods[2:]]
    reads.clear()
    assert kept(changed) == fresh(changed)
    assert (reads.count("b"), reads.count("a")) == (2, 1)  # b anew by both; a by fresh only
    reads.clear()
    kept(changed[1:])  # a gone: forgotten
    kept(changed)
    assert reads.count("a") == 1


def test_a_kept_reader_reads_each_node_once_and_again_when_replaced(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same reader remembers Node objects too (``node_info`` is about an eighth of the
    cluster view at 5,000 nodes): the report equals one read afresh, an unreadable node's
    problem included; a replaced node is read again, a node gone is forgotten."""
    reads: list[str] = []
    read_node = report_module.read_node

    def counting(obj: Json) -> report_module.NodeRead:
        reads.append(obj["metadata"]["name"])
        return read_node(obj)

    monkeypatch.setattr(report_module, "read_node", counting)
    n1, n2 = node("n1", [16, 16]), node("n2", [8])
    broken = node("n3", [16])
    broken["metadata"]["annotations"][INVENTORY] = "{not json"
    pods = (bound("a", n1, [("main", (0,), 12)]),)
    reader = SnapshotReader()

    def kept(nodes: tuple[Json, ...]) -> Report:
        return build_report(Snapshot(nodes, pods), reader=reader)

    first = kept((n1, n2, broken))
    assert first == build_report(Snapshot((n1, n2, broken), pods))
    assert any("n3" in problem for problem in first.problems)
    reads.clear()
    assert kept((n1, n2, broken)) == first
    assert reads == []  # nothing read again
    relabelled = {**n2, "metadata": {**n2["metadata"], "labels": {"x": "y"}}}
    kept((n1, relabelled, broken))
    assert reads == ["n2"]
    reads.clear()
    kept((n1, broken))  # n2 gone: forgotten
    kept((n1, n2, broken))
    assert reads == ["n2"]


def _status(phase: object) -> Json:
    pod = bound("p", node("n1", [16]), [("main", (0,), 4)])
    pod["status"] = {"phase": phase} if phase is not None else {}
    return pod


def _garbage_spec_finished() -> Json:
    pod = _status("Failed")
    pod["spec"]["containers"] = "not a list"
    return pod


def _no_status() -> Json:
    pod = bound("p", node("n1", [16]), [("main", (0,), 4)])
    pod.pop("status", None)
    return pod


def _frozen(value: object) -> object:
    """``value`` with every object a read-only mapping: not a plain ``dict``, so ``read_pod``
    takes its general path."""
    if isinstance(value, dict):
        return MappingProxyType({k: _frozen(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_frozen(v) for v in value]
    return value


READ_POD_CASES: list[tuple[str, Callable[[], Json], bool, str | None]] = [
    ("running pod is read", lambda: _status("Running"), False, "n1"),
    ("succeeded pod is finished", lambda: _status("Succeeded"), True, "n1"),
    ("failed pod with a garbage spec is finished, not a problem", _garbage_spec_finished,
     True, "n1"),
    ("phase not a string is not finished", lambda: _status(["Failed"]), False, "n1"),
    ("no phase is not finished", lambda: _status(None), False, "n1"),
    ("no status is not finished", _no_status, False, "n1"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("make", "finished", "node_name"),
    [c[1:] for c in READ_POD_CASES],
    ids=[c[0] for c in READ_POD_CASES],
)
def test_read_pod_reads_plain_json_as_any_mapping(
    make: Callable[[], Json], finished: bool, node_name: str | None
) -> None:
    """``read_pod`` reads plain JSON dicts without walking paths; any other mapping type goes
    the general way: both give the same read."""
    pod = make()
    read = read_pod(pod)
    assert (read.finished, read.bound) == (finished, node_name)
    assert read_pod(_frozen(pod)) == read  # type: ignore[arg-type]


@pytest.mark.parametrize("enabled", [True, False], ids=["gc on stays on", "gc off stays off"])
def test_gc_paused_restores_the_collector(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("a failing report")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_a_kept_reader_counts_again_only_the_nodes_whose_pods_or_node_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cluster view keeps each node's report (its ledger count, problems included) while
    the node and its pods are the same objects: a changed pod recounts its node alone, and the
    report still equals one built afresh; a report of one node (``node=``) keeps nothing."""
    counted: list[str] = []
    node_report = report_module._node_report

    def counting(info: Any, *args: Any) -> Any:
        counted.append(info.node.name)
        return node_report(info, *args)

    monkeypatch.setattr(report_module, "_node_report", counting)
    n1, n2 = node("n1", [16, 16]), node("n2", [8])
    pods = [
        bound("a", n1, [("main", (0,), 12)]),
        bound("b", n1, [("main", (0,), 12)]),  # over capacity: skipped, a problem line
        bound("c", n2, [("main", (0,), 4)]),
    ]
    reader = SnapshotReader()

    def kept(objects: list[Json]) -> Report:
        return build_report(Snapshot((n1, n2), tuple(objects)), reader=reader)

    first = kept(pods)
    assert counted == ["n1", "n2"]
    counted.clear()
    assert kept(pods) == first
    assert counted == []
    assert len(first.problems) == 1  # kept with the node's report
    moved = bound("c", n2, [("main", (0,), 6)])
    counted.clear()
    again = kept([*pods[:2], moved])
    assert counted == ["n2"]
    assert again == build_report(Snapshot((n1, n2), (*pods[:2], moved)))
    counted.clear()
    build_report(Snapshot((n1, n2), tuple(pods)), node="n1", reader=reader)
    assert counted == ["n1"]


def test_each_placed_pod_says_how_its_share_is_held_where_the_inventory_says_it() -> None:
    """The inventory publishes each GPU's backend and view (docs/share-view.md): a share on an
    MPS node is ``enforced (mps)``, a whole GPU ``whole GPU``; JSON and ``-d`` say it."""
    held = Isolation(Enforcement.MPS, True)
    n = node("n", [16, 16])
    gpus = [InventoryGpu(i, fake_gpu_uuid("n", i), "T4", 16, True, held) for i in (0, 1)]
    n["metadata"]["annotations"][INVENTORY] = inventory_annotation(MemoryUnit.GIB, gpus)
    exclusive = {"gpushare.io/exclusive": "true"}
    whole = bound_dialect_pod(
        dialect_pod_json("w", {"main": {GPU_MEM: 4}}, annotations=exclusive),
        node_info(n).node, [ContainerAllocation("main", (1,), 16, 1000, True)],
    )  # fmt: skip
    r = report([n], [bound("a", n, [("main", (0,), 4)]), whole])
    (got,) = r.nodes
    assert [(p.name, p.isolation) for p in got.pods] == [
        ("a", "enforced (mps)"),
        ("w", "whole GPU"),
    ]
    assert [g.isolation for g in got.gpus] == ["enforced (mps)", "enforced (mps)"]
    data = report_json(r)["nodes"][0]
    assert [p["isolation"] for p in data["pods"]] == ["enforced (mps)", "whole GPU"]
    assert data["gpus"][0]["isolation"] == "enforced (mps)"
    detail = render_detail(r)
    assert "ISOLATION" in detail
    assert "enforced (mps)" in detail
    unsaid = report([node("m", [16])], [bound("b", node("m", [16]), [("main", (0,), 4)])])
    assert unsaid.nodes[0].pods[0].isolation == ""
    assert "isolation" not in report_json(unsaid)["nodes"][0]["pods"][0]
    assert "ISOLATION" not in render_detail(unsaid)
