"""The codec between Kubernetes JSON and the core: requests, allocations, nodes — and garbage.

Alibaba's annotation formats are those of gpushare-scheduler-extender ``pkg/utils/pod.go``
(``PatchPodAnnotationSpec``) and gpushare-device-plugin ``pkg/gpu/nvidia/podutils.go``.
"""

from __future__ import annotations

import contextlib
import json
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.ask import ContainerAsk
from gpushare.core.model import Allocation, ContainerAllocation, ContainerRequest, Gpu, Node
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    ALIYUN_ASSUME_TIME,
    ALIYUN_DEV,
    ALIYUN_IDX,
    ALIYUN_KEYS,
    ALIYUN_POD,
    ALLOCATION,
    GPU_COUNT,
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    GPU_MODELS_ANNOTATION,
    INVENTORY,
    CodecError,
    MemoryUnit,
    alibaba_annotations,
    allocation_annotations,
    node_info,
    parse_quantity,
    pod_allocation,
    pod_request,
)
from gpushare.kube.codec.pods import INIT_CONTAINER_REFUSAL
from gpushare.testing import strategies
from gpushare.testing.extender import alibaba_node_json, node_json, plain_node_json, pod_json
from gpushare.testing.nodes import FakeGpu

MIB_16G = 16276

# -- quantities ------------------------------------------------------------------------------

QUANTITIES = [
    ("plain", "8", Fraction(8)),
    ("json integer", 8, Fraction(8)),
    ("kilo", "1k", Fraction(1000)),
    ("kibi", "2Ki", Fraction(2048)),
    ("gibi", "1Gi", Fraction(1024**3)),
    ("exponent", "1e3", Fraction(1000)),
    ("upper exponent", "12E1", Fraction(120)),
    ("milli", "500m", Fraction(1, 2)),
    ("decimal", "1.5", Fraction(3, 2)),
    ("exa suffix, not exponent", "1E", Fraction(10**18)),
    ("negative", "-4", Fraction(-4)),
]


@pytest.mark.parametrize(
    ("text", "expected"), [q[1:] for q in QUANTITIES], ids=[q[0] for q in QUANTITIES]
)
def test_parse_quantity(text: object, expected: Fraction) -> None:
    assert parse_quantity(text) == expected


@pytest.mark.parametrize(
    "text", ["", "abc", "1.2.3", "1 Gi", "1gi", "0x10", True, None, 1.5, "1e999", "9" * 70]
)
def test_parse_quantity_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="quantity"):
        parse_quantity(text)


# -- pod requests ----------------------------------------------------------------------------


def containers_of(pod: dict[str, Any]) -> list[tuple[str, int, int, frozenset[str]]]:
    return [
        (c.name, c.gpu_share, c.gpu_count, c.allowed_models) for c in pod_request(pod).containers
    ]


def with_container_limits(pod: dict[str, Any], **extra: str) -> dict[str, Any]:
    for container in pod["spec"]["containers"]:
        for kind in ("limits", "requests"):
            container["resources"][kind].update(extra)
    return pod


def _set(obj: Any, path: str, value: object) -> Any:
    """``obj`` with ``value`` at ``path`` (dot-separated; ``{GPU_MEM}``-style keys as ``@``)."""
    target: Any = obj
    *parents, last = [GPU_MEM if part == "@" else part for part in path.split(".")]
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return obj


REQUESTS: list[tuple[str, dict[str, Any], list[tuple[str, int, int, frozenset[str]]]]] = [
    ("one container", pod_json("p", 4), [("main", 4, 1, frozenset())]),
    ("no GPU", pod_json("p"), [("main", 0, 0, frozenset())]),
    (
        "quantity 1k",
        _set(pod_json("p", 1000), "spec.containers.0.resources.limits.@", "1k"),
        [("main", 1000, 1, frozenset())],
    ),
    (
        "several containers, one without GPU",
        pod_json("p", [4, None, 8]),
        [("c0", 4, 1, frozenset()), ("c1", 0, 0, frozenset()), ("c2", 8, 1, frozenset())],
    ),
    (
        "gpu-count annotation for every container",
        pod_json("p", 16, annotations={GPU_COUNT_ANNOTATION: "2"}),
        [("main", 8, 2, frozenset())],
    ),
    (
        "gpu-count annotation by container",
        pod_json("p", [16, 4], annotations={GPU_COUNT_ANNOTATION: '{"c0": 4}'}),
        [("c0", 4, 4, frozenset()), ("c1", 4, 1, frozenset())],
    ),
    (
        "aliyun.com/gpu-count limit",
        with_container_limits(pod_json("p", 16), **{GPU_COUNT: "2"}),
        [("main", 8, 2, frozenset())],
    ),
    (
        "limit and annotation agree",
        with_container_limits(
            pod_json("p", 16, annotations={GPU_COUNT_ANNOTATION: "2"}), **{GPU_COUNT: "2"}
        ),
        [("main", 8, 2, frozenset())],
    ),
    (
        "models for every container",
        pod_json("p", 4, annotations={GPU_MODELS_ANNOTATION: "A100, V100"}),
        [("main", 4, 1, frozenset({"A100", "V100"}))],
    ),
    (
        "models by container",
        pod_json("p", [4, 4], annotations={GPU_MODELS_ANNOTATION: '{"c1": ["T4"]}'}),
        [("c0", 4, 1, frozenset()), ("c1", 4, 1, frozenset({"T4"}))],
    ),
]


@pytest.mark.parametrize(
    ("pod", "expected"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS]
)
def test_pod_request(
    pod: dict[str, Any], expected: list[tuple[str, int, int, frozenset[str]]]
) -> None:
    assert containers_of(pod) == expected


def test_init_containers_without_gpus_are_not_placed() -> None:
    pod = pod_json("p", 4)
    pod["spec"]["initContainers"] = [{"name": "init", "resources": {"limits": {"cpu": "1"}}}]
    assert containers_of(pod) == [("main", 4, 1, frozenset())]


@pytest.mark.parametrize(
    "limits",
    [{GPU_MEM: "2"}, {GPU_MEM: "4", GPU_COUNT: "2"}],
    ids=["gpu-mem", "gpu-mem over two GPUs"],
)
def test_an_init_container_asking_a_gpu_is_refused_with_the_reason(limits: dict[str, str]) -> None:
    """A real kubelet calls Allocate for init containers too; gpushare places none, so such a
    pod is refused (the filter shows this message) instead of starting on an unplaced GPU."""
    pod = pod_json("p", 4)
    pod["spec"]["initContainers"] = [{"name": "warmup", "resources": {"limits": limits}}]
    with pytest.raises(CodecError, match="init container warmup") as caught:
        pod_request(pod)
    assert INIT_CONTAINER_REFUSAL in str(caught.value)


def test_pod_request_key_and_requests_only() -> None:
    pod = pod_json("p", 4, namespace="ml")
    del pod["spec"]["containers"][0]["resources"]["limits"]
    request = pod_request(pod)
    assert request.key == "ml/p"
    assert request.containers == (ContainerAsk("main", 4, 1),)
    assert request.plain is not None
    assert request.plain.containers == (ContainerRequest("main", 4, 1),)


BAD_REQUESTS: list[tuple[str, dict[str, Any], str]] = [
    (
        "fractional gpu-mem",
        _set(pod_json("p", 4), "spec.containers.0.resources.limits.@", "500m"),
        "not a whole number",
    ),
    (
        "garbage gpu-mem",
        _set(pod_json("p", 4), "spec.containers.0.resources.limits.@", "lots"),
        "not a quantity",
    ),
    (
        "negative gpu-mem",
        _set(pod_json("p", 4), "spec.containers.0.resources.requests.@", "-4"),
        "not a whole number",
    ),
    (
        "limit and request differ",
        _set(pod_json("p", 4), "spec.containers.0.resources.requests.@", "8"),
        "limit and request differ",
    ),
    (
        "gpu-count without gpu-mem",
        with_container_limits(pod_json("p"), **{GPU_COUNT: "2"}),
        "without aliyun.com/gpu-mem",
    ),
    (
        "count annotation and limit disagree",
        with_container_limits(
            pod_json("p", 16, annotations={GPU_COUNT_ANNOTATION: "4"}), **{GPU_COUNT: "2"}
        ),
        "differs from annotation",
    ),
    (
        "total not divisible by count",
        pod_json("p", 10, annotations={GPU_COUNT_ANNOTATION: "3"}),
        "not divisible by the GPU count 3",
    ),
    ("count zero", pod_json("p", 8, annotations={GPU_COUNT_ANNOTATION: "0"}), "invalid value"),
    ("count words", pod_json("p", 8, annotations={GPU_COUNT_ANNOTATION: "two"}), "invalid value"),
    ("count bad JSON", pod_json("p", 8, annotations={GPU_COUNT_ANNOTATION: "{2"}), "not JSON"),
    (
        "count names an unknown container",
        pod_json("p", 8, annotations={GPU_COUNT_ANNOTATION: '{"side": 2}'}),
        "no such GPU container",
    ),
    ("empty model", pod_json("p", 8, annotations={GPU_MODELS_ANNOTATION: "A,,B"}), "invalid"),
    ("no containers", _set(pod_json("p", 4), "spec.containers", []), "spec.containers"),
    ("container without name", _set(pod_json("p", 4), "spec.containers.0.name", 7), "name"),
    ("pod without name", _set(pod_json("p", 4), "metadata.name", None), "metadata.name"),
    (
        "resources not an object",
        _set(pod_json("p", 4), "spec.containers.0.resources", []),
        "object",
    ),
    (
        "annotation not a string",
        _set(pod_json("p", 4), "metadata.annotations", {GPU_COUNT_ANNOTATION: 2}),
        "not a string",
    ),
]


@pytest.mark.parametrize(
    ("pod", "message"), [b[1:] for b in BAD_REQUESTS], ids=[b[0] for b in BAD_REQUESTS]
)
def test_pod_request_rejects_garbage(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError, match=message) as caught:
        pod_request(pod)
    assert str(caught.value).startswith("pod")
    assert "accepted:" in str(caught.value)


def test_codec_error_names_pod_key_value_and_accepted() -> None:
    pod = pod_json("train-0", 4, namespace="ml", annotations={GPU_COUNT_ANNOTATION: "many"})
    with pytest.raises(CodecError) as caught:
        pod_request(pod)
    error = caught.value
    assert error.subject == "pod ml/train-0"
    assert error.key == f"annotation {GPU_COUNT_ANNOTATION}"
    assert error.value == "many"
    assert "1..1024" in error.accepted
    assert str(error).startswith("pod ml/train-0: annotation gpushare.io/gpu-count='many'")


# -- allocations -----------------------------------------------------------------------------

NODE4 = Node("n1", tuple(Gpu(i, "V100", MIB_16G) for i in range(4)))
NOW_NS = 1_700_000_000_123_456_789


def one(container: str, gpus: tuple[int, ...], share: int) -> ContainerAllocation:
    return ContainerAllocation(container, gpus, share)


ROUND_TRIPS: list[tuple[str, dict[str, Any], Allocation, dict[str, str]]] = [
    (
        "one container on GPU 1",
        pod_json("p", 8138, node="n1"),
        Allocation("default/p", "n1", (one("main", (1,), 8138),)),
        {ALIYUN_IDX: "1", ALIYUN_POD: "8138", ALIYUN_DEV: str(MIB_16G)},
    ),
    (
        "two containers on one GPU",
        pod_json("p", [4069, 2000], node="n1"),
        Allocation("default/p", "n1", (one("c0", (3,), 4069), one("c1", (3,), 2000))),
        {ALIYUN_IDX: "3", ALIYUN_POD: "6069", ALIYUN_DEV: str(MIB_16G)},
    ),
    (
        "one container on two GPUs",
        pod_json("p", 16000, node="n1", annotations={GPU_COUNT_ANNOTATION: "2"}),
        Allocation("default/p", "n1", (one("main", (0, 2), 8000),)),
        {ALIYUN_POD: "16000"},
    ),
    (
        "two containers on different GPUs",
        pod_json("p", [4069, 2000], node="n1"),
        Allocation("default/p", "n1", (one("c0", (0,), 4069), one("c1", (1,), 2000))),
        {ALIYUN_POD: "6069"},
    ),
]


@pytest.mark.parametrize(
    ("pod", "allocation", "alibaba"),
    [r[1:] for r in ROUND_TRIPS],
    ids=[r[0] for r in ROUND_TRIPS],
)
def test_allocation_round_trip(
    pod: dict[str, Any], allocation: Allocation, alibaba: dict[str, str]
) -> None:
    annotations = allocation_annotations(allocation, NODE4, now_ns=NOW_NS, unit=MemoryUnit.MIB)
    expected = {
        **alibaba,
        ALIYUN_ASSIGNED: "false",
        ALIYUN_ASSUME_TIME: "1700000000123456789",
    }
    assert {k: v for k, v in annotations.items() if k != ALLOCATION} == expected
    document = json.loads(annotations[ALLOCATION])
    assert document["node"] == "n1"
    assert document["unit"] == "MiB"
    pod["metadata"]["annotations"] = {**pod["metadata"].get("annotations", {}), **annotations}
    assert pod_allocation(pod) == allocation
    read = alibaba_annotations(pod)
    assert read.assigned is False
    assert read.assume_time_ns == NOW_NS


def test_allocation_annotations_empty_for_cpu_only() -> None:
    assert allocation_annotations(Allocation("default/p", "n1", ()), NODE4, now_ns=1) == {}


def alibaba_pod(node: str | None, **annotations: str) -> dict[str, Any]:
    """What Alibaba's extender leaves on a pod (``PatchPodAnnotationSpec``), then ours."""
    base = {
        ALIYUN_IDX: "2",
        ALIYUN_DEV: "16",
        ALIYUN_POD: "4",
        ALIYUN_ASSIGNED: "true",
        ALIYUN_ASSUME_TIME: "1568024431384950014",
    }
    return pod_json("p", 4, node=node, annotations={**base, **annotations})


def test_alibaba_annotations_alone_are_read() -> None:
    assert pod_allocation(alibaba_pod("n1")) == Allocation(
        "default/p", "n1", (one("main", (2,), 4),)
    )
    read = alibaba_annotations(alibaba_pod("n1"))
    assert (read.index, read.pod_total, read.device_memory, read.assigned) == (2, 4, 16, True)
    assert read.assume_time_ns == 1568024431384950014


def test_alibaba_multi_container_pod_sits_on_its_one_gpu() -> None:
    pod = pod_json("p", [3, 1], node="n1", annotations={ALIYUN_IDX: "0", ALIYUN_POD: "4"})
    assert pod_allocation(pod) == Allocation(
        "default/p", "n1", (one("c0", (0,), 3), one("c1", (0,), 1))
    )


@pytest.mark.parametrize(
    "pod",
    [pod_json("p", 4), pod_json("p", 4, node="n1"), alibaba_pod(None)],
    ids=["no annotations", "bound without annotations", "alibaba annotations, not bound"],
)
def test_no_recorded_allocation(pod: dict[str, Any]) -> None:
    assert pod_allocation(pod) is None


OURS = json.dumps({"node": "n1", "containers": [{"name": "main", "gpus": [1], "share": 4}]})

BAD_ALLOCATIONS: list[tuple[str, dict[str, Any], str]] = [
    ("index not a number", alibaba_pod("n1", **{ALIYUN_IDX: "x"}), "ALIYUN_COM_GPU_MEM_IDX"),
    ("negative index", alibaba_pod("n1", **{ALIYUN_IDX: "-1"}), "decimal integer"),
    ("padded index", alibaba_pod("n1", **{ALIYUN_IDX: " 1"}), "decimal integer"),
    ("pod total differs", alibaba_pod("n1", **{ALIYUN_POD: "5"}), "the pod asks 4"),
    ("assigned not a flag", alibaba_pod("n1", **{ALIYUN_ASSIGNED: "yes"}), '"true" or "false"'),
    ("assume time garbage", alibaba_pod("n1", **{ALIYUN_ASSUME_TIME: "now"}), "ASSUME_TIME"),
    ("device memory zero", alibaba_pod("n1", **{ALIYUN_DEV: "0"}), "> 0"),
    (
        "alibaba only, several GPUs",
        pod_json("p", 8, node="n1", annotations={GPU_COUNT_ANNOTATION: "2", ALIYUN_IDX: "0"}),
        "several GPUs",
    ),
    (
        "records a GPU but asks none",
        pod_json("p", None, node="n1", annotations={ALIYUN_IDX: "0"}),
        "asks none",
    ),
    ("ours not JSON", pod_json("p", 4, annotations={ALLOCATION: "{"}), "not JSON"),
    ("ours without node", pod_json("p", 4, annotations={ALLOCATION: "{}"}), "no node"),
    (
        "ours names another node",
        pod_json("p", 4, node="n2", annotations={ALLOCATION: OURS}),
        "bound to n2",
    ),
    (
        "ours does not match the request",
        pod_json("p", 8, annotations={ALLOCATION: OURS}),
        "does not match",
    ),
    (
        "ours with empty gpus",
        pod_json("p", 4, annotations={ALLOCATION: OURS.replace("[1]", "[]")}),
        "non-empty list",
    ),
    (
        "ours with a repeated GPU",
        pod_json("p", 4, annotations={ALLOCATION: OURS.replace("[1]", "[1, 1]")}),
        "repeated GPU",
    ),
    (
        "ours with a string share",
        pod_json("p", 4, annotations={ALLOCATION: OURS.replace("4}", '"4"}')}),
        "share",
    ),
    (
        "ours and alibaba index disagree",
        pod_json("p", 4, annotations={ALLOCATION: OURS, ALIYUN_IDX: "0"}),
        "uses GPUs",
    ),
]


@pytest.mark.parametrize(
    ("pod", "message"), [b[1:] for b in BAD_ALLOCATIONS], ids=[b[0] for b in BAD_ALLOCATIONS]
)
def test_pod_allocation_rejects_garbage(pod: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError, match=message) as caught:
        pod_allocation(pod)
    assert str(caught.value).startswith("pod default/p")


# -- nodes -----------------------------------------------------------------------------------


def test_node_from_inventory() -> None:
    gpus = [FakeGpu(0, 16, "V100"), FakeGpu(1, 40, "A100", healthy=False)]
    info = node_info(node_json("n1", gpus, unit=MemoryUnit.GIB))
    assert info.node == Node("n1", (Gpu(0, "V100", 16), Gpu(1, "A100", 40, healthy=False)))
    assert (info.gpushare, info.unit, info.source, info.labelled) == (
        True,
        "GiB",
        "inventory",
        True,
    )
    assert all(uuid.startswith("GPU-") for uuid in info.uuids)


def inventory_node(document: object) -> dict[str, Any]:
    node = node_json("n1", [16])
    node["metadata"]["annotations"][INVENTORY] = (
        document if isinstance(document, str) else json.dumps(document)
    )
    return node


def test_inventory_indices_are_sorted() -> None:
    document = {
        "unit": "MiB",
        "gpus": [{"index": 1, "memory": 8}, {"index": 0, "memory": 16}],
    }
    info = node_info(inventory_node(document))
    assert [(g.index, g.capacity, g.model, g.healthy) for g in info.node.gpus] == [
        (0, 16, "", True),
        (1, 8, "", True),
    ]


def gpu(**fields: object) -> dict[str, object]:
    return {"index": 0, "memory": 16, "model": "V100", "uuid": "GPU-0", "healthy": True, **fields}


BAD_INVENTORIES: list[tuple[str, object, str]] = [
    ("not JSON", "{unit", "not JSON"),
    ("not an object", "[]", "unit"),
    ("unknown unit", {"unit": "KiB", "gpus": []}, "unit"),
    ("gpus not a list", {"unit": "GiB", "gpus": {}}, "gpus list"),
    ("negative index", {"unit": "GiB", "gpus": [gpu(index=-1)]}, "index must be"),
    ("zero memory", {"unit": "GiB", "gpus": [gpu(memory=0)]}, "memory > 0"),
    ("memory as string", {"unit": "GiB", "gpus": [gpu(memory="16")]}, "memory > 0"),
    ("boolean index", {"unit": "GiB", "gpus": [gpu(index=True)]}, "index must be"),
    ("healthy as string", {"unit": "GiB", "gpus": [gpu(healthy="yes")]}, "healthy a boolean"),
    ("repeated index", {"unit": "GiB", "gpus": [gpu(), gpu()]}, "repeat"),
]


@pytest.mark.parametrize(
    ("document", "message"), [b[1:] for b in BAD_INVENTORIES], ids=[b[0] for b in BAD_INVENTORIES]
)
def test_inventory_garbage(document: object, message: str) -> None:
    with pytest.raises(CodecError, match=message) as caught:
        node_info(inventory_node(document))
    assert str(caught.value).startswith("node n1: annotation gpushare.io/gpu-inventory=")
    assert '"unit": "GiB"|"MiB"' in caught.value.accepted


FALLBACKS = [
    ("alibaba capacity", alibaba_node_json("a", 32, 2), (16, 16)),
    ("uneven capacity floors", alibaba_node_json("a", 33, 2), (16, 16)),
    ("memory without count", alibaba_node_json("a", 32, 0), ()),
]


@pytest.mark.parametrize(
    ("node", "capacities"), [f[1:] for f in FALLBACKS], ids=[f[0] for f in FALLBACKS]
)
def test_alibaba_fallback(node: dict[str, Any], capacities: tuple[int, ...]) -> None:
    info = node_info(node)
    assert info.node.capacities == capacities
    assert (info.gpushare, info.unit, info.source) == (True, None, "capacity")


def test_plain_node_is_not_gpushare() -> None:
    info = node_info(plain_node_json("cpu-0"))
    assert (info.gpushare, info.node.gpus, info.labelled) == (False, (), False)
    assert info.refusal == "no label gpushare=true"


@pytest.mark.parametrize(
    "node",
    [node_json("n1", [16, 16]), alibaba_node_json("a", 32, 2)],
    ids=["inventory", "alibaba capacity"],
)
def test_a_node_without_the_label_is_not_gpushare_but_keeps_its_gpus(
    node: dict[str, Any],
) -> None:
    del node["metadata"]["labels"]["gpushare"]
    info = node_info(node)
    assert (info.gpushare, info.labelled, info.node.capacities) == (False, False, (16, 16))
    assert info.refusal == "no label gpushare=true"


def test_a_labelled_node_without_gpus_is_not_gpushare() -> None:
    node = plain_node_json("cpu-0")
    node["metadata"]["labels"] = {"gpushare": "true"}
    info = node_info(node)
    assert (info.gpushare, info.labelled) == (False, True)
    assert info.refusal == (
        "label gpushare=true but no gpushare.io/gpu-inventory annotation and no "
        "aliyun.com/gpu-mem capacity"
    )
    assert node_info(node_json("n1", [16])).refusal == ""


BAD_NODES: list[tuple[str, dict[str, Any], str]] = [
    ("no name", {"metadata": {}}, "metadata.name"),
    ("not an object", [], "not an object"),  # type: ignore[list-item]
    (
        "capacity garbage",
        _set(alibaba_node_json("a", 32, 2), "status.capacity.@", "lots"),
        "aliyun.com/gpu-mem",
    ),
    ("more GPUs than units", alibaba_node_json("a", 2, 4), "at least one"),
]


@pytest.mark.parametrize(
    ("node", "message"), [b[1:] for b in BAD_NODES], ids=[b[0] for b in BAD_NODES]
)
def test_node_garbage(node: dict[str, Any], message: str) -> None:
    with pytest.raises(CodecError, match=message):
        node_info(node)


# -- any JSON: a CodecError or a value, never another exception ------------------------------

json_values = strategies.json_values(text_size=8, items=4, max_leaves=20)
annotation_keys = st.sampled_from(
    [ALLOCATION, GPU_COUNT_ANNOTATION, GPU_MODELS_ANNOTATION, INVENTORY, *ALIYUN_KEYS]
)
annotation_values = st.one_of(
    st.text(max_size=12),
    st.integers(-3, 20).map(str),
    json_values.map(json.dumps),
)
pods = st.builds(
    lambda gpu_mem, count, annotations, node: with_container_limits(
        pod_json("p", gpu_mem, node=node, annotations=annotations), **count
    ),
    st.one_of(st.none(), st.integers(0, 40)),
    st.sampled_from([{}, {GPU_COUNT: "2"}, {GPU_COUNT: "x"}]),
    st.dictionaries(annotation_keys, annotation_values, max_size=4),
    st.sampled_from([None, "n1"]),
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(pods, json_values))
def test_any_pod_is_read_or_rejected_with_codec_error(pod: Any) -> None:
    for read in (pod_request, pod_allocation, alibaba_annotations, node_info):
        with contextlib.suppress(CodecError):
            read(pod)
