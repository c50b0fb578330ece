"""Pods in the dialects of gpu-manager, its fork, HAMi and Alibaba's cloud read by
``pod_request`` into a ``PodAsk`` (memory in MiB or percent kept as written, in
``memory_basis``), resolved into one node's ``PodRequest`` by ``resolve``, and their
allocations recorded with compute and whole GPUs in ``gpushare.io/allocation``
(docs/compute.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from gpushare.core.ask import MIB_BASIS, PERCENT_BASIS, ContainerAsk, PodAsk
from gpushare.core.fit import check_fit
from gpushare.core.model import (
    Allocation,
    ContainerAllocation,
    ContainerRequest,
    Gpu,
    Node,
    NodeState,
    PodRequest,
)
from gpushare.core.resolve import (
    NO_GPU_TYPE,
    NO_GPU_UUID,
    UNRESOLVED,
    NodeView,
    NotOnNode,
    on_node,
    resolve,
)
from gpushare.core.serves import Serves
from gpushare.kube.codec import (
    ALLOCATION,
    CodecError,
    MemoryUnit,
    pod_allocation,
    pod_request,
)
from gpushare.kube.codec.pods import INIT_CONTAINER_REFUSAL
from gpushare.kube.codec.record import fast_pod_record
from gpushare.testing.core import gpu_node
from gpushare.testing.dialects import (
    bound_dialect_pod,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.dialects import table_pod as _pod
from gpushare.testing.extender import pod_json

ANY: frozenset[str] = frozenset()
TC, FC, HG = "tencent.com/vcuda-core", "nvidia.com/vcuda-core", "nvidia.com/gpu"


def on(resource: str, units: int) -> dict[str, Any]:
    """The Allocate resource of a dialect container and the units kubelet passes there."""
    return {"allocate_resource": resource, "kubelet_units": units}


@dataclass(frozen=True)
class Read:
    id: str
    pod: dict[str, Any]
    containers: tuple[ContainerAsk, ...]


READS = [
    Read("gpu-manager README pod 1: a share, 7,680 MiB and 500 compute_milli",
         gpu_manager_readme_pod_1("p", "ns"),
         (ContainerAsk("nvidia", 7680, 1, ANY, 500, memory_basis=MIB_BASIS, **on(TC, 50)),)),
    Read("gpu-manager README pod 2: two whole GPUs",
         gpu_manager_readme_pod_2("p", "ns"),
         (ContainerAsk("nvidia", 0, 2, ANY, exclusive=True, **on(TC, 200)),)),
    Read("the fork: nvidia.com/vcuda-memory in MiB",
         _pod({"main": {"nvidia.com/vcuda-core": 25, "nvidia.com/vcuda-memory": 4096}}),
         (ContainerAsk("main", 4096, 1, ANY, 250, memory_basis=MIB_BASIS, **on(FC, 25)),)),
    Read("HAMi: two GPUs of 3,000 MiB and 30 % each",
         _pod({"main": {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 3000,
                        "nvidia.com/gpucores": 30}}),
         (ContainerAsk("main", 3000, 2, ANY, 300, memory_basis=MIB_BASIS, **on(HG, 2)),)),
    Read("HAMi: nvidia.com/gpu alone is all the memory of one GPU",
         _pod({"main": {"nvidia.com/gpu": 1}}),
         (ContainerAsk("main", 100, 1, ANY, memory_basis=PERCENT_BASIS, **on(HG, 1)),)),
    Read("HAMi: gpucores 100 is a whole GPU",
         _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}}),
         (ContainerAsk("main", 0, 1, ANY, exclusive=True, **on(HG, 1)),)),
    Read("Alibaba's cloud: gpu-core.percentage next to gpu-mem, memory in node units",
         _pod({"main": {"aliyun.com/gpu-mem": 8, "aliyun.com/gpu-core.percentage": 40}}),
         (ContainerAsk("main", 8, 1, ANY, 400),)),
    Read("gpushare.io/exclusive: gpu-mem's container takes a whole GPU; kubelet passes its "
         "gpu-mem", _pod({"main": {"aliyun.com/gpu-mem": 4}},
                          annotations={"gpushare.io/exclusive": "true"}),
         (ContainerAsk("main", 0, 1, ANY, exclusive=True, kubelet_units=4),)),
    Read("gpushare.io/exclusive with gpushare.io/gpu-count: two whole GPUs",
         _pod({"main": {"aliyun.com/gpu-mem": 16}},
              annotations={"gpushare.io/exclusive": "true", "gpushare.io/gpu-count": "2"}),
         (ContainerAsk("main", 0, 2, ANY, exclusive=True, kubelet_units=16),)),
    Read("gpushare.io/exclusive by container: only the one named",
         _pod({"a": {"aliyun.com/gpu-mem": 4}, "b": {"aliyun.com/gpu-mem": 4}},
              annotations={"gpushare.io/exclusive": '{"b": true}'}),
         (ContainerAsk("a", 4, 1),
          ContainerAsk("b", 0, 1, ANY, exclusive=True, kubelet_units=4))),
    Read("gpushare.io/gpu-models applies to a dialect container too",
         _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}},
              annotations={"gpushare.io/gpu-models": "A100"}),
         (ContainerAsk("main", 1000, 1, frozenset({"A100"}), memory_basis=MIB_BASIS,
                           **on(HG, 1)),)),
    Read("HAMi's use-gputype and nouse-gputype: types for every GPU container",
         _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}, "side": {"cpu": "1"}},
              annotations={"nvidia.com/use-gputype": "A100, H100",
                           "nvidia.com/nouse-gputype": "PCIE"}),
         (ContainerAsk("main", 1000, 1, ANY, memory_basis=MIB_BASIS, **on(HG, 1),
                           gpu_types=("A100", "H100"), excluded_gpu_types=("PCIE",)),
          ContainerAsk("side", 0, 0))),
    Read("HAMi's use-gpuuuid and nouse-gpuuuid: UUIDs for every GPU container, Alibaba's too",
         _pod({"main": {"aliyun.com/gpu-mem": 4}},
              annotations={"nvidia.com/use-gpuuuid": "GPU-a,GPU-b",
                           "nvidia.com/nouse-gpuuuid": "GPU-b"}),
         (ContainerAsk("main", 4, 1, gpu_uuids=("GPU-a", "GPU-b"),
                           excluded_gpu_uuids=("GPU-b",)),)),
    Read("a CPU-only sidecar next to a Tencent container is not a second dialect",
         _pod({"main": {"tencent.com/vcuda-core": 10, "tencent.com/vcuda-memory": 4},
               "side": {"cpu": "100m"}}),
         (ContainerAsk("main", 1024, 1, ANY, 100, memory_basis=MIB_BASIS, **on(TC, 10)),
          ContainerAsk("side", 0, 0))),
]  # fmt: skip


@pytest.mark.parametrize("case", READS, ids=[c.id for c in READS])
def test_a_dialect_pod_is_read_into_a_request(case: Read) -> None:
    request = pod_request(case.pod)
    assert request.containers == case.containers
    record = fast_pod_record(case.pod)  # the fast path reads it alike
    assert record is not None
    assert record.request == request


def test_an_alibaba_pod_reads_exactly_as_before() -> None:
    ask = pod_request(pod_json("p", 8, namespace="ns"))
    assert ask == PodAsk("ns/p", (ContainerAsk("main", 8, 1),))
    assert ask.plain == PodRequest("ns/p", (ContainerRequest("main", 8, 1),))
    assert not ask.two_dimensional


def with_init_container(pod: dict[str, Any], limits: dict[str, str]) -> dict[str, Any]:
    """``pod`` with an init container ``init`` of ``limits``."""
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": limits}}]
    return pod


@dataclass(frozen=True)
class Refused:
    id: str
    pod: dict[str, Any]
    message: str


REFUSALS = [
    Refused("vcuda-core 150: above 100 only multiples of 100",
            _pod({"main": {"tencent.com/vcuda-core": 150, "tencent.com/vcuda-memory": 4}}),
            "pod ns/p container main: tencent.com/vcuda-core=150: above 100 only multiples "
            "of 100 (whole GPUs)"),
    Refused("a share without vcuda-memory",
            _pod({"main": {"tencent.com/vcuda-core": 50}}),
            "cores or memory zero is not permitted in share mode"),
    Refused("HAMi gpucores above 100",
            _pod({"main": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 101}}),
            "nvidia.com/gpucores=101: above 100 %"),
    Refused("a mixed pod: one container Alibaba, another Tencent",
            _pod({"a": {"aliyun.com/gpu-mem": 4},
                  "b": {"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 4}}),
            "GPU containers in two dialects; accepted: one dialect per pod"),
    Refused("a mixed pod: HAMi and the fork",
            _pod({"a": {"nvidia.com/gpu": 1},
                  "b": {"nvidia.com/vcuda-core": 50, "nvidia.com/vcuda-memory": 4}}),
            "GPU containers in two dialects"),
    Refused("an init container asking vcuda-core",
            with_init_container(_pod({"main": {"aliyun.com/gpu-mem": 4}}),
                                {"tencent.com/vcuda-core": "100"}),
            INIT_CONTAINER_REFUSAL),
    Refused("HAMi's nvidia.com/use-gputype naming no type",
            _pod({"main": {"nvidia.com/gpu": 1}}, annotations={"nvidia.com/use-gputype": " , "}),
            "annotation nvidia.com/use-gputype=' , ': names no GPU type or UUID"),
    Refused("gpushare.io/exclusive not a flag",
            _pod({"main": {"aliyun.com/gpu-mem": 4}}, annotations={"gpushare.io/exclusive": "yes"}),
            "annotation gpushare.io/exclusive='yes': invalid value"),
]  # fmt: skip


@pytest.mark.parametrize("case", REFUSALS, ids=[c.id for c in REFUSALS])
def test_a_pod_its_system_refuses_is_refused_with_the_rule(case: Refused) -> None:
    with pytest.raises(CodecError) as error:
        pod_request(case.pod)
    assert case.message in str(error.value)


def test_hamis_annotations_on_a_cpu_pod_and_hamis_policies_constrain_nothing() -> None:
    """A CPU pod may carry HAMi's annotations (it asks no GPU), and HAMi's scheduling-policy
    preferences are read as no constraint (gpushare's policy places)."""
    cpu = _pod(
        {"main": {"cpu": "1"}},
        annotations={"nvidia.com/use-gpuuuid": "GPU-0", "nvidia.com/use-gputype": " , "},
    )
    assert pod_request(cpu).gpu_containers == ()
    preference = _pod({"main": {"nvidia.com/gpu": 1}},
                      annotations={"hami.io/gpu-scheduler-policy": "spread",
                                   "hami.io/node-scheduler-policy": "binpack"})  # fmt: skip
    assert len(pod_request(preference).gpu_containers) == 1


# -- resolving memory into a node's unit ------------------------------------------------------

GIB, MIB = MemoryUnit.GIB, MemoryUnit.MIB


@dataclass(frozen=True)
class Resolve:
    id: str
    container: ContainerAsk
    unit: MemoryUnit | None
    capacities: tuple[int, ...]
    expected: ContainerRequest | str
    models: tuple[str, ...] = ()


RESOLVES = [
    Resolve("MiB on a MiB node: as written",
            ContainerAsk("m", 7680, 1, ANY, 500, memory_basis=MIB_BASIS), MIB, (16384,),
            ContainerRequest("m", 7680, 1, ANY, 500)),
    Resolve("MiB on a GiB node: whole GiB",
            ContainerAsk("m", 4096, 2, memory_basis=MIB_BASIS), GIB, (16, 16),
            ContainerRequest("m", 4, 2)),
    Resolve("MiB on a GiB node: rounded up, never less than asked",
            ContainerAsk("m", 4097, memory_basis=MIB_BASIS), GIB, (16,),
            ContainerRequest("m", 5)),
    Resolve("percent of the GPU, rounded up",
            ContainerAsk("m", 30, memory_basis=PERCENT_BASIS), GIB, (15, 15),
            ContainerRequest("m", 5)),
    Resolve("percent needs no unit: Alibaba's capacity fallback",
            ContainerAsk("m", 100, memory_basis=PERCENT_BASIS), None, (16,),
            ContainerRequest("m", 16)),
    Resolve("percent on GPUs of two sizes: of the largest",
            ContainerAsk("m", 50, memory_basis=PERCENT_BASIS), GIB, (16, 32),
            ContainerRequest("m", 16)),
    Resolve("percent of the largest GPU of an allowed model",
            ContainerAsk("m", 50, 1, frozenset({"small"}), memory_basis=PERCENT_BASIS),
            GIB, (16, 32), ContainerRequest("m", 8, 1, frozenset({"small"})),
            models=("small", "large")),
    Resolve("MiB on a node of unknown unit: cannot be placed there",
            ContainerAsk("m", 1024, memory_basis=MIB_BASIS), None, (16,),
            "container m asks GPU memory in MiB and the node's memory unit is unknown "
            "(no gpushare.io/gpu-inventory annotation)"),
    Resolve("whole GPUs need nothing resolved",
            ContainerAsk("m", 0, 2, exclusive=True), None, (16, 16),
            ContainerRequest("m", 0, 2, exclusive=True)),
]  # fmt: skip


@pytest.mark.parametrize("case", RESOLVES, ids=[c.id for c in RESOLVES])
def test_memory_is_resolved_into_the_node_unit(case: Resolve) -> None:
    node = gpu_node(list(case.capacities), models=list(case.models) or None)
    unit_mib = case.unit.mib if case.unit is not None else None
    result = resolve(PodAsk("ns/p", (case.container,)), NodeView(node, unit_mib))
    if isinstance(case.expected, str):
        assert result == NotOnNode(UNRESOLVED, case.expected)
    else:
        assert isinstance(result, PodRequest)
        assert result.containers == (case.expected,)


def test_an_ask_with_nothing_to_resolve_is_its_plain_request_on_every_node() -> None:
    ask = PodAsk("ns/p", (ContainerAsk("m", 4),))
    assert ask.plain == PodRequest("ns/p", (ContainerRequest("m", 4),))
    for view in (NodeView(gpu_node([16]), None), NodeView(gpu_node([32, 32]), 1024)):
        assert resolve(ask, view) is ask.plain


def test_only_an_ask_in_the_node_terms_has_a_plain_request() -> None:
    assert PodAsk("ns/p", (ContainerAsk("m", 4, 2, compute_milli=300),)).plain is not None
    assert PodAsk("ns/p", (ContainerAsk("m", 4096, memory_basis=MIB_BASIS),)).plain is None
    assert PodAsk("ns/p", (ContainerAsk("m", 4, gpu_types=("A100",)),)).plain is None
    assert PodAsk("ns/p", (ContainerAsk("m", 4, excluded_gpu_uuids=("GPU-a",)),)).plain is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        pytest.param(lambda: ContainerAsk("m", 0, memory_basis=MIB_BASIS), "needs gpu_share > 0",
                     id="a memory basis without memory"),
        pytest.param(lambda: ContainerAsk("m", 4, memory_basis="GiB"), "memory_basis must be",
                     id="an unknown memory basis"),
        pytest.param(lambda: ContainerAsk("m", 4, exclusive=True), "exclusive container",
                     id="what no request can have: an exclusive share"),
    ],
)  # fmt: skip
def test_an_ask_no_request_can_have_is_refused(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


# -- allocations with compute and whole GPUs --------------------------------------------------


@dataclass(frozen=True)
class Record:
    id: str
    pod: dict[str, Any]
    containers: tuple[ContainerAllocation, ...]
    document: list[dict[str, Any]]


RECORDS = [
    Record("a Tencent share records its compute",
           gpu_manager_readme_pod_1("p", "ns"),
           (ContainerAllocation("nvidia", (1,), 8, 500),),
           [{"name": "nvidia", "gpus": [1], "share": 8, "compute": 500}]),
    Record("whole GPUs are recorded whole, at their capacity",
           gpu_manager_readme_pod_2("p", "ns"),
           (ContainerAllocation("nvidia", (0, 2), 16, 1000, exclusive=True),),
           [{"name": "nvidia", "gpus": [0, 2], "share": 16, "compute": 1000, "whole": True}]),
    Record("an Alibaba pod's record is as before",
           pod_json("p", 8, namespace="ns"),
           (ContainerAllocation("main", (1,), 8),),
           [{"name": "main", "gpus": [1], "share": 8}]),
]  # fmt: skip


@pytest.mark.parametrize("case", RECORDS, ids=[c.id for c in RECORDS])
def test_an_allocation_is_recorded_and_read_back(case: Record) -> None:
    node = gpu_node([16, 16, 16], name="n1")
    pod = bound_dialect_pod(case.pod, node, case.containers, unit=GIB, assigned=False)
    document = json.loads(pod["metadata"]["annotations"][ALLOCATION])
    assert document["containers"] == case.document
    assert pod_allocation(pod) == Allocation("ns/p", "n1", case.containers)
    record = fast_pod_record(pod)  # the fast path reads it alike
    assert record is not None
    assert record.allocation == pod_allocation(pod)


def test_a_record_without_compute_or_whole_reads_as_none_asked() -> None:
    old = '{"node":"n1","unit":"GiB","containers":[{"name":"main","gpus":[0],"share":8}]}'
    pod = pod_json("p", 8, namespace="ns", node="n1", annotations={ALLOCATION: old})
    assert pod_allocation(pod) == Allocation("ns/p", "n1", (ContainerAllocation("main", (0,), 8),))


@pytest.mark.parametrize(
    ("item", "message"),
    [({"compute": 1001}, "compute must be 0..1000"),
     ({"whole": 1}, "whole a boolean"),
     ({"compute": 300}, "does not match the pod's request"),
     ({"whole": True, "compute": 1000}, "does not match the pod's request")],
    ids=["compute above one GPU", "whole not a boolean", "compute the pod did not ask",
         "whole GPUs the pod did not ask"],
)  # fmt: skip
def test_a_record_that_disagrees_with_the_pod_is_refused(
    item: dict[str, Any], message: str
) -> None:
    document = {"node": "n1", "containers": [{"name": "main", "gpus": [0], "share": 8, **item}]}
    pod = pod_json("p", 8, namespace="ns", node="n1",
                   annotations={ALLOCATION: json.dumps(document)})  # fmt: skip
    with pytest.raises(CodecError, match=message):
        pod_allocation(pod)


def test_a_dialect_pod_is_placed_only_through_the_request_of_one_node() -> None:
    ask = pod_request(gpu_manager_readme_pod_1("p", "ns"))
    assert ask.plain is None  # 7,680 MiB: no request until a node says its unit
    placed = resolve(ask, NodeView(gpu_node([16]), MemoryUnit.GIB.mib))
    assert isinstance(placed, PodRequest)
    assert check_fit(NodeState.empty(gpu_node([16])), placed).fits


T4, A100_SXM, A100_PCIE = "Tesla-T4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-PCIE-40GB"
MIXED = Node("n", (Gpu(0, T4, 16), Gpu(1, A100_SXM, 40), Gpu(2, A100_PCIE, 40)))


def typed(use: tuple[str, ...] = (), avoid: tuple[str, ...] = (), **kw: Any) -> PodAsk:
    container = ContainerAsk("main", 1, 1, gpu_types=use, excluded_gpu_types=avoid, **kw)
    return PodAsk("ns/p", (container,))


@pytest.mark.parametrize(
    ("request_", "allowed"),
    [
        pytest.param(typed(("a100",)), {A100_SXM, A100_PCIE},
                     id="use-gputype-is-a-substring-of-the-model-any-case"),
        pytest.param(typed(("A100",), ("PCIE",)), {A100_SXM},
                     id="nouse-gputype-takes-models-out"),
        pytest.param(typed((), ("A100",)), {T4}, id="nouse-gputype-alone-leaves-the-rest"),
        pytest.param(typed(("T4", "SXM")), {T4, A100_SXM}, id="several-types-any-of-them"),
        pytest.param(typed(("A100",), allowed_models=frozenset({A100_PCIE})), {A100_PCIE},
                     id="within-gpushare-io-gpu-models"),
        pytest.param(typed(("V100",)), None, id="no-gpu-of-the-type-the-node-cannot-take-it"),
    ],
)  # fmt: skip
def test_hamis_gpu_types_become_the_nodes_models(
    request_: PodAsk, allowed: set[str] | None
) -> None:
    placed = on_node(request_, NodeView(MIXED, MemoryUnit.GIB.mib, Serves.BOTH))
    if allowed is None:
        assert isinstance(placed, NotOnNode)
        assert placed.why == NO_GPU_TYPE
        assert "asks GPUs of type V100" in placed.text
        assert "Tesla-T4" in placed.text
        return
    assert isinstance(placed, PodRequest)
    (container,) = placed.containers
    assert container.allowed_models == frozenset(allowed)
    fit = check_fit(NodeState.empty(MIXED), placed)
    assert fit.fits
    assert {MIXED.gpu(i).model for c in fit.assignment for i in c.gpu_indices} <= allowed


UUIDS = ("GPU-t4", "GPU-sxm", "GPU-pcie")


def named(use: tuple[str, ...] = (), avoid: tuple[str, ...] = (), **kw: Any) -> PodAsk:
    container = ContainerAsk("main", 1, 1, gpu_uuids=use, excluded_gpu_uuids=avoid, **kw)
    return PodAsk("ns/p", (container,))


@pytest.mark.parametrize(
    ("request_", "uuids", "allowed"),
    [
        pytest.param(named(("GPU-pcie",)), UUIDS, {2}, id="use-gpuuuid-names-the-gpu"),
        pytest.param(named(("GPU-t4", "GPU-pcie")), UUIDS, {0, 2}, id="several-uuids-any-of-them"),
        pytest.param(named((), ("GPU-sxm",)), UUIDS, {0, 2}, id="nouse-gpuuuid-leaves-the-rest"),
        pytest.param(named(("GPU-sxm",), gpu_types=("A100",)), UUIDS, {1},
                     id="with-use-gputype-both-apply"),
        pytest.param(named(("GPU-t4",), gpu_types=("A100",)), UUIDS, None,
                     id="a-uuid-of-a-type-not-asked-leaves-nothing"),
        pytest.param(named(("GPU-other",)), UUIDS, None, id="a-uuid-of-another-node"),
        pytest.param(named(("GPU-t4",)), (), None, id="the-nodes-uuids-unknown"),
    ],
)  # fmt: skip
def test_hamis_gpu_uuids_become_the_positions_the_container_may_use(
    request_: PodAsk, uuids: tuple[str, ...], allowed: set[int] | None
) -> None:
    placed = on_node(request_, NodeView(MIXED, MemoryUnit.GIB.mib, Serves.BOTH, uuids))
    if allowed is None:
        assert isinstance(placed, NotOnNode)
        assert placed.why in (NO_GPU_UUID, NO_GPU_TYPE)
        return
    assert isinstance(placed, PodRequest)
    (container,) = placed.containers
    assert container.allowed_positions == frozenset(allowed)
    # Every placement rule honours the positions: the fit, and each one-GPU picker.
    state = NodeState.empty(MIXED)
    for i in range(100):  # fill the allowed GPUs one unit at a time: never another GPU
        fit = check_fit(state, placed)
        if not fit.fits:
            break
        (taken,) = fit.assignment
        assert set(taken.gpu_indices) <= allowed
        state = state.with_allocation(Allocation(f"ns/q{i}", "n", fit.assignment))
    assert not check_fit(state, placed).fits
    assert all(state.gpu_used[p] == 0 for p in range(3) if p not in allowed)
