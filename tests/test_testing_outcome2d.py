"""The two-dimensional judge of ``tests/cluster/test_extender_mixed.py``
(``gpushare.testing.outcome2d``) finds each violation it promises from the records alone:
table-driven, each case a few pods with hand-written ``gpushare.io/allocation`` records on one
GiB node and one MiB node of two GPUs each, and the problems expected (empty: a clean run). The
pods go in as read back (``ReadBack``) through ``dialect_outcome``, the path
``read_dialect_outcome`` takes, so the problems read as the cluster test reports them."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import pytest

from gpushare.core.fit import FitResult, FitStatus, check_fit
from gpushare.core.model import NodeState, PodRequest
from gpushare.kube.codec import ALLOCATION, MemoryUnit
from gpushare.testing import outcome2d
from gpushare.testing.outcome import ReadBack
from gpushare.testing.outcome2d import (
    Basis,
    DialectAsk,
    DialectOutcome,
    DialectSpec,
    NodeGpus,
    dialect_outcome,
    dialect_workload,
    judge_dialects,
)

NODES = {"g": NodeGpus(MemoryUnit.GIB, (16, 16)), "m": NodeGpus(MemoryUnit.MIB, (24576, 24576))}
UNEVEN = {"u": NodeGpus(MemoryUnit.GIB, (8, 16))}
TENCENT = DialectAsk("main", 1, 5 * 256, Basis.MIB, 500)  # vcuda-core 50, vcuda-memory 5
HAMI_PERCENT = DialectAsk("main", 1, 10, Basis.PERCENT, 300)
WHOLE = DialectAsk("main", 1, 0, whole=True)
ALIBABA_8 = DialectAsk("main", 1, 8)
GIB_ONLY = frozenset({MemoryUnit.GIB})  # a pod in the node's unit (its node selector)


@dataclass(frozen=True)
class Bound:
    """A pod bound to ``node`` with ``record``'s containers (``None``: no record), the record
    naming ``unit`` and ``record_node`` (``None``: the node's unit, ``node``)."""

    name: str
    ask: DialectAsk
    node: str
    record: list[dict[str, object]] | None
    unit: str | None = None
    record_node: str | None = None


@dataclass(frozen=True)
class Case:
    id: str
    bound: tuple[Bound, ...]
    expected: list[str]
    pending: tuple[tuple[str, DialectAsk], ...] = field(default=())
    nodes: Mapping[str, NodeGpus] = field(default_factory=lambda: NODES)
    units: Mapping[str, frozenset[MemoryUnit]] = field(default_factory=dict)  # by pod; else any


def entry(gpus: list[int], share: int, compute: int = 0, whole: bool = False) -> dict[str, object]:
    item: dict[str, object] = {"name": "main", "gpus": gpus, "share": share}
    if compute:
        item["compute"] = compute
    if whole:
        item["whole"] = True
    return item


def judge(case: Case) -> list[str]:
    asks = {b.name: b.ask for b in case.bound} | dict(case.pending)
    specs = {
        name: DialectSpec(name, "k", {}, (ask,), units=case.units.get(name, frozenset()))
        for name, ask in asks.items()
    }
    found = ReadBack(pending=[name for name, _ in case.pending])
    for b in case.bound:
        annotations = {}
        if b.record is not None:
            unit = b.unit or case.nodes[b.node].unit
            document = {"node": b.record_node or b.node, "unit": unit, "containers": b.record}
            annotations[ALLOCATION] = json.dumps(document)
        found.bound.append((b.name, b.node, annotations))
    return judge_dialects(dialect_outcome(found, specs, case.nodes), specs, case.nodes)


CASES = [
    Case("a clean run: shares resolved per unit (1,280 MiB is 2 GiB; 10 % of 24,576 MiB is "
         "2,458), a GPU held whole alone",
         (Bound("t", TENCENT, "g", [entry([0], 2, 500)]),
          Bound("t2", TENCENT, "m", [entry([0], 1280, 500)]),
          Bound("h", HAMI_PERCENT, "m", [entry([0], 2458, 300)]),
          Bound("w", WHOLE, "g", [entry([1], 16, 1000, whole=True)])),
         []),
    Case("compute above 1000 on a GPU",
         (Bound("t1", TENCENT, "g", [entry([0], 2, 500)]),
          Bound("t2", TENCENT, "g", [entry([0], 2, 500)]),
          Bound("h", HAMI_PERCENT, "g", [entry([0], 2, 300)])),
         ["GPU 0 of g: compute over capacity, 1300 > 1000"]),
    Case("memory above capacity on a GPU",
         (Bound("a1", ALIBABA_8, "g", [entry([1], 8)]),
          Bound("a2", ALIBABA_8, "g", [entry([1], 8)]),
          Bound("a3", ALIBABA_8, "g", [entry([1], 8)])),
         ["GPU 1 of g: memory over capacity, 24 > 16"]),
    Case("a GPU held whole shares with a pod that asks no compute",
         (Bound("w", WHOLE, "m", [entry([1], 24576, 1000, whole=True)]),
          Bound("a", DialectAsk("main", 1, 1024, Basis.MIB), "m", [entry([1], 1024)])),
         ["GPU 1 of m: memory over capacity, 25600 > 24576",
          "GPU 1 of m: held whole and shared: ['a', 'w']"]),
    Case("a record that rounds MiB down on a GiB node does not match the request",
         (Bound("t", TENCENT, "g", [entry([0], 1, 500)]),),
         ["t (k) on g: record {'name': 'main', 'gpus': [0], 'share': 1, 'compute': 500} "
          "does not match the request {'gpus': 1, 'share': 2, 'compute': 500, 'whole': False}"]),
    Case("a whole GPU recorded without the flag does not match",
         (Bound("w", WHOLE, "g", [entry([0], 16, 1000)]),),
         ["w (k) on g: record {'name': 'main', 'gpus': [0], 'share': 16, 'compute': 1000} "
          "does not match the request {'gpus': 1, 'share': 16, 'compute': 1000, 'whole': True}"]),
    Case("a container recorded twice (two allocations)",
         (Bound("a", ALIBABA_8, "g", [entry([0], 8), entry([1], 8)]),),
         ["a (k) on g: containers recorded ['main', 'main'], asked ['main']"]),
    Case("a bound pod without a record, and one recorded in another unit",
         (Bound("a", ALIBABA_8, "g", None), Bound("b", ALIBABA_8, "g", [entry([0], 8)], "MiB")),
         ["a (k) on g: bound without gpushare.io/allocation",
          'b (k) on g: record for another node or unit: {"node": "g", "unit": "MiB", "containers": '
          '[{"name": "main", "gpus": [0], "share": 8}]}']),
    Case("a Pending pod that fits (a GPU of m holds nothing: a whole GPU fits there)",
         (Bound("w", WHOLE, "g", [entry([0], 16, 1000, whole=True)]),
          Bound("h", HAMI_PERCENT, "m", [entry([0], 2458, 300)]),
          Bound("a", ALIBABA_8, "g", [entry([1], 8)])),
         ["p (k) is Pending but fits on m"],
         pending=(("p", WHOLE),)),
    Case("a Pending pod that fits nowhere: no GPU holds nothing, compute short everywhere",
         (Bound("w", WHOLE, "g", [entry([0], 16, 1000, whole=True)]),
          Bound("a", DialectAsk("main", 1, 8, compute_milli=600), "g", [entry([1], 8, 600)]),
          Bound("t1", TENCENT, "m", [entry([0], 1280, 500)]),
          Bound("t2", TENCENT, "m", [entry([0], 1280, 500)]),
          Bound("t3", DialectAsk("main", 1, 1024, Basis.MIB, 600), "m", [entry([1], 1024, 600)])),
         [],
         pending=(("p", WHOLE), ("q", TENCENT))),
    Case("a whole GPU records its own capacity: 8 on the 8 GiB GPU of a node of 8 and 16",
         (Bound("w", WHOLE, "u", [entry([0], 8, 1000, whole=True)]),),
         [], nodes=UNEVEN),
    Case("a whole GPU recorded at the largest GPU's capacity does not match",
         (Bound("w", WHOLE, "u", [entry([0], 16, 1000, whole=True)]),),
         ["w (k) on u: record {'name': 'main', 'gpus': [0], 'share': 16, 'compute': 1000, "
          "'whole': True} does not match the request {'gpus': 1, 'share': 8, 'compute': 1000, "
          "'whole': True}"],
         nodes=UNEVEN),
    Case("a Pending share that fits only the larger GPU of an uneven node",
         (Bound("a", DialectAsk("main", 1, 2), "u", [entry([1], 2)]),),
         ["p (k) is Pending but fits on u"],
         pending=(("p", DialectAsk("main", 1, 10)),), nodes=UNEVEN),
    Case("a pod in the node's unit bound to a MiB node it may not use",
         (Bound("a", ALIBABA_8, "m", [entry([0], 8)]),),
         ["a (k) on m: bound to a node it may not use: m"], units={"a": GIB_ONLY}),
    Case("a GiB-only Pending pod while only the MiB node has room: fits nowhere it may go",
         (Bound("w1", WHOLE, "g", [entry([0], 16, 1000, whole=True)]),
          Bound("w2", WHOLE, "g", [entry([1], 16, 1000, whole=True)])),
         [], pending=(("p", ALIBABA_8),), units={"p": GIB_ONLY}),
    Case("the same pod free to use any unit fits on the MiB node",
         (Bound("w1", WHOLE, "g", [entry([0], 16, 1000, whole=True)]),
          Bound("w2", WHOLE, "g", [entry([1], 16, 1000, whole=True)])),
         ["p (k) is Pending but fits on m"], pending=(("p", ALIBABA_8),)),
    Case("a record on a GPU the node lacks",
         (Bound("a", ALIBABA_8, "g", [entry([2], 8)]),),
         ["a (k) on g: no GPU 2 on g"]),
    Case("a record naming GPU 0 twice for a two-GPU ask (one GPU, two entries)",
         (Bound("a", DialectAsk("main", 2, 4), "g", [entry([0, 0], 4)]),),
         ["a (k) on g: record {'name': 'main', 'gpus': [0, 0], 'share': 4} does not match "
          "the request {'gpus': 2, 'share': 4, 'compute': 0, 'whole': False}"]),
    Case("a record naming GPU 0 twice for a two-GPU ask (two distinct GPUs, three entries)",
         (Bound("a", DialectAsk("main", 2, 4), "g", [entry([0, 1, 0], 4)]),),
         ["a (k) on g: record {'name': 'main', 'gpus': [0, 1, 0], 'share': 4} does not match "
          "the request {'gpus': 2, 'share': 4, 'compute': 0, 'whole': False}"]),
    Case("a record on two GPUs for a one-GPU ask",
         (Bound("a", ALIBABA_8, "g", [entry([0, 1], 8)]),),
         ["a (k) on g: record {'name': 'main', 'gpus': [0, 1], 'share': 8} does not match "
          "the request {'gpus': 1, 'share': 8, 'compute': 0, 'whole': False}"]),
    Case("a record naming another node",
         (Bound("a", ALIBABA_8, "g", [entry([0], 8)], record_node="m"),),
         ['a (k) on g: record for another node or unit: {"node": "m", "unit": "GiB", '
          '"containers": [{"name": "main", "gpus": [0], "share": 8}]}']),
]  # fmt: skip


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_judge_finds_each_violation_from_the_records(case: Case) -> None:
    assert judge(case) == case.expected


def refusing_check_fit(state: NodeState, pod: PodRequest) -> FitResult:
    """The core's fit, but saying no wherever it said yes: a core that wrongly refuses."""
    result = check_fit(state, pod)
    if result.status is FitStatus.FITS:
        return replace(result, status=FitStatus.DOES_NOT_FIT_NOW)
    return result


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.pending], ids=[c.id for c in CASES if c.pending]
)
def test_a_one_container_pod_is_judged_without_the_core(
    case: Case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A core that wrongly refuses a Pending pod would leave it Pending and, if asked, agree
    with itself: the judge counts the GPUs that qualify instead."""
    monkeypatch.setattr(outcome2d, "check_fit", refusing_check_fit)
    assert judge(case) == case.expected


def test_a_pod_of_two_gpu_containers_falls_back_to_the_cores_fit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    two = DialectSpec("p", "k", {}, (ALIBABA_8, DialectAsk("side", 1, 8)))
    outcome = DialectOutcome(pending=["p"])
    assert judge_dialects(outcome, {"p": two}, NODES) == ["p (k) is Pending but fits on g"]
    monkeypatch.setattr(outcome2d, "check_fit", refusing_check_fit)
    assert judge_dialects(outcome, {"p": two}, NODES) == []  # the fallback trusts the core


def test_the_workload_is_seeded_and_mixes_every_kind() -> None:
    first, again = dialect_workload(300, 7), dialect_workload(300, 7)
    assert first == again
    assert {s.kind for s in first} == {
        "alibaba", "alibaba-2gpu", "alibaba-core", "exclusive", "tencent-share",
        "tencent-whole", "hami-mib", "hami-percent", "hami-2gpu", "hami-whole",
    }  # fmt: skip
    # pods in the node's unit may use GiB nodes only
    for spec in first:
        resolved = any(a.basis == Basis.NODE and not a.whole for a in spec.asks)
        assert (spec.units == {MemoryUnit.GIB}) == (resolved or spec.kind == "exclusive")
