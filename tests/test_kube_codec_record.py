"""A pod read once (``gpushare.kube.codec.record``): the fast path and the full path (the four
public readers one after the other) give the same record, or the same ``CodecError``.

The table holds well-formed pods of every shape the codec reads (the fast path must take
them: ``fast`` is true) and garbage in every part, in pairs whose errors come in a different
order in different readers; any JSON at all is checked by a property test on top.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.model import Gpu, Node
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
    CodecError,
    alibaba_annotations,
    pod_allocation,
    pod_node_name,
    pod_request,
)
from gpushare.kube.codec.common import parse_json
from gpushare.kube.codec.handshake import ASSIGNED_CONTAINERS, pending_pod
from gpushare.kube.codec.record import PodRecord, fast_pod_record, pod_record
from gpushare.testing import strategies
from gpushare.testing.extender import pod_json
from gpushare.testing.pods import bound_gpu_pod

NODE = Node("n1", tuple(Gpu(i, "T4", 16) for i in range(4)))
OURS = json.dumps({"node": "n1", "containers": [{"name": "main", "gpus": [1], "share": 4}]})


def full_path(pod: Any) -> PodRecord:
    """The reference: each public reader on its own, in ``pod_record``'s order."""
    request = pod_request(pod)
    alibaba = alibaba_annotations(pod)
    allocation = pod_allocation(pod)
    bound = pod_node_name(pod) or None
    pending = pending_pod(pod) if bound is not None else None
    return PodRecord(request.key, bound, request, alibaba, allocation, pending)


def outcome(read: Callable[[Any], PodRecord], pod: Any) -> tuple[str, object]:
    try:
        return "read", read(pod)
    except CodecError as error:
        return "refused", str(error)


def bound(
    containers: list[tuple[str, tuple[int, ...], int]] | None = None,
    annotations: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A pod bound to n1 by the extender (``bound_gpu_pod``), with ``annotations`` on top."""
    obj: dict[str, Any] = bound_gpu_pod(
        "ml", "train", NODE, containers or [("main", (1,), 4)], assume_ns=7
    ).to_dict()
    obj["metadata"]["annotations"].update(annotations or {})
    return obj


def alibaba(**annotations: str) -> dict[str, Any]:
    """A pod bound to n1 by Alibaba's extender (its five annotations), ``annotations`` on top."""
    base = {ALIYUN_IDX: "2", ALIYUN_DEV: "16", ALIYUN_POD: "4", ALIYUN_ASSIGNED: "true",
            ALIYUN_ASSUME_TIME: "1568024431384950014"}  # fmt: skip
    return pod_json("p", 4, node="n1", annotations={**base, **annotations})


def asking(gpu_mem: int | list[int | None] | None = 4, /, **annotations: str) -> dict[str, Any]:
    """An unbound pod asking ``gpu_mem`` (``pod_json``) with ``annotations``."""
    return pod_json("p", gpu_mem, annotations=annotations)


def ours(gpus: str = "[1]", share: str = "4") -> str:
    """Our allocation record of container main on n1, GPUs and share as JSON text."""
    return OURS.replace("[1]", gpus).replace("4}", f"{share}}}")


def edit(pod: Any, where: str, **fields: object) -> Any:
    """``pod`` with ``fields`` set in the object at ``where`` (dot-separated, list indices as
    numbers; ``""``: the pod); a field set to ``DROP`` is removed."""
    target = pod
    for part in filter(None, where.split(".")):
        target = target[int(part)] if isinstance(target, list) else target[part]
    for name, value in fields.items():
        if value is DROP:
            target.pop(name)
        else:
            target[name] = value
    return pod


DROP = object()
LIMIT_2 = {GPU_MEM: "2"}
MAIN_ON_1 = '{"name": "main", "gpus": [1], "share": 4}'
RESOURCES = "spec.containers.0.resources"


def limits(pod: dict[str, Any], **values: object) -> dict[str, Any]:
    for container in pod["spec"]["containers"]:
        container["resources"].setdefault("limits", {}).update(values)
    return pod


class Name(str):
    """A pod name of a ``str`` subclass: readable, but not a plain decoded string."""

    __slots__ = ()


def name_subclass() -> str:
    return Name("p")


# (name, pod, the fast path takes it)
GOOD: list[tuple[str, Any, bool]] = [
    ("unbound GPU pod", asking(), True),
    ("unbound CPU-only pod", asking(None), True),
    ("no namespace reads as default", edit(asking(), "metadata", namespace=DROP), True),
    ("bound without a record", pod_json("p", 4, node="n1"), True),
    ("bound CPU-only pod", pod_json("p", node="n1"), True),
    ("bound, just assumed", bound(), True),
    ("bound, started", bound(annotations={ALIYUN_ASSIGNED: "true"}), True),
    ("bound, two containers, first started",
     bound([("b", (1,), 2), ("a", (0, 1), 3)], {ASSIGNED_CONTAINERS: "1"}), True),
    ("bound over two GPUs", bound([("main", (0, 2), 8)]), True),
    ("Alibaba's annotations alone", alibaba(), True),
    ("Alibaba's annotations, not started", alibaba(**{ALIYUN_ASSIGNED: "false"}), True),
    ("Alibaba's device memory with leading zeros", alibaba(**{ALIYUN_DEV: "016"}), True),
    ("Alibaba's annotations, not bound", edit(alibaba(), "spec", nodeName=DROP), True),
    ("our record, not bound yet", asking(**{ALLOCATION: OURS}), True),
    ("gpu-count annotation", asking(16, **{GPU_COUNT_ANNOTATION: "2"}), True),
    ("gpu-count by container", asking([16, 4], **{GPU_COUNT_ANNOTATION: '{"c0": 4}'}), True),
    ("gpu-count limit", limits(asking(16), **{GPU_COUNT: "2"}), True),
    ("models annotation", asking(**{GPU_MODELS_ANNOTATION: "A100, V100"}), True),
    ("models by container", asking([4, 4], **{GPU_MODELS_ANNOTATION: '{"c1": ["T4"]}'}), True),
    ("quantity 1k", limits(asking(1000), **{GPU_MEM: "1k"}), True),
    ("JSON integer quantity",
     edit(asking(), RESOURCES, limits={GPU_MEM: 4}, requests={GPU_MEM: 4}), True),
    ("requests only", edit(asking(), RESOURCES, limits=DROP), True),
    ("no resources", edit(asking(None), "spec.containers.0", resources=DROP), True),
    ("init container without GPU", edit(asking(), "spec", initContainers=[{"name": "i"}]), True),
    ("empty nodeName is not bound", edit(asking(), "spec", nodeName=""), True),
    ("annotations null", edit(asking(), "metadata", annotations=None), True),
    # Readable, but not in the fast path's plain shapes: the full path reads them.
    ("metadata a read-only mapping",
     edit(bound(), "", metadata=MappingProxyType(bound()["metadata"])), False),
    ("annotations a read-only mapping",
     edit(bound(), "metadata", annotations=MappingProxyType(bound()["metadata"]["annotations"])),
     False),
    ("the whole pod a read-only mapping", MappingProxyType(bound()), False),
    ("name a str subclass", edit(asking(), "metadata", name=name_subclass()), False),
]  # fmt: skip

BAD: list[tuple[str, Any]] = [
    ("not an object", []),
    ("no metadata name", edit(asking(), "metadata", name=DROP)),
    ("namespace not a string", edit(asking(), "metadata", namespace=3)),
    ("metadata not an object", edit(asking(), "", metadata=[])),
    ("spec not an object", edit(asking(), "", spec="x")),
    ("annotations not an object", edit(asking(), "metadata", annotations=[])),
    ("annotation not a string", bound(annotations={ALIYUN_POD: 4})),
    # pod_request reads the spec first, pod_allocation the annotations: the first reader wins
    ("spec and annotations both bad",
     edit(edit(asking(), "", spec=1), "metadata", annotations={"k": 1})),
    ("no containers", edit(asking(), "spec", containers=[])),
    ("container not an object", edit(asking(), "spec", containers=[3])),
    ("container without name", edit(asking(), "spec.containers.0", name=DROP)),
    ("resources not an object", edit(asking(), "spec.containers.0", resources=[])),
    ("limits not an object", edit(asking(), RESOURCES, limits=[])),
    ("requests not an object", edit(asking(), RESOURCES, requests=1)),
    ("bad limit and bad requests object",
     edit(limits(asking(), **{GPU_MEM: "x"}), RESOURCES, requests=1)),
    ("bad count limit after a differing request",
     edit(limits(asking(), **{GPU_COUNT: "x"}), f"{RESOURCES}.requests", **{GPU_MEM: "8"})),
    ("fractional gpu-mem", limits(asking(), **{GPU_MEM: "500m"})),
    ("gpu-mem a JSON bool", edit(asking(), RESOURCES, limits={GPU_MEM: True}, requests={})),
    ("limit and request differ", edit(asking(), f"{RESOURCES}.requests", **{GPU_MEM: "8"})),
    ("gpu-count without gpu-mem", limits(asking(None), **{GPU_COUNT: "2"})),
    ("count annotation and limit disagree",
     limits(asking(16, **{GPU_COUNT_ANNOTATION: "4"}), **{GPU_COUNT: "2"})),
    ("total not divisible", asking(10, **{GPU_COUNT_ANNOTATION: "3"})),
    ("count words", asking(8, **{GPU_COUNT_ANNOTATION: "two"})),
    ("count names an unknown container", asking(8, **{GPU_COUNT_ANNOTATION: '{"side": 2}'})),
    ("empty model", asking(8, **{GPU_MODELS_ANNOTATION: "A,,B"})),
    ("init container asking a GPU",
     edit(asking(), "spec", initContainers=[{"name": "i", "resources": {"limits": LIMIT_2}}])),
    ("init containers not a list", edit(asking(), "spec", initContainers={"i": 1})),
    ("nodeName not a string", edit(bound(), "spec", nodeName=7)),
    ("index not a number", alibaba(**{ALIYUN_IDX: "x"})),
    ("padded index", alibaba(**{ALIYUN_IDX: " 1"})),
    ("pod total differs", alibaba(**{ALIYUN_POD: "5"})),
    ("assigned not a flag", alibaba(**{ALIYUN_ASSIGNED: "yes"})),
    ("assume time garbage", alibaba(**{ALIYUN_ASSUME_TIME: "now"})),
    ("device memory zero", alibaba(**{ALIYUN_DEV: "0"})),
    ("device memory zeros", alibaba(**{ALIYUN_DEV: "000"})),
    ("index of 21 digits", alibaba(**{ALIYUN_IDX: "1" * 21})),
    ("index in other digits", alibaba(**{ALIYUN_IDX: "\u0662"})),
    ("flag and index both bad", alibaba(**{ALIYUN_ASSIGNED: "yes", ALIYUN_IDX: "x"})),
    ("Alibaba's alone, several GPUs",
     pod_json("p", 8, node="n1", annotations={GPU_COUNT_ANNOTATION: "2", ALIYUN_IDX: "0"})),
    ("records a GPU but asks none", pod_json("p", None, node="n1", annotations={ALIYUN_IDX: "0"})),
    ("ours not JSON", asking(**{ALLOCATION: "{"})),
    ("ours NaN", asking(**{ALLOCATION: "NaN"})),
    ("ours without node", asking(**{ALLOCATION: "{}"})),
    ("ours names another node", pod_json("p", 4, node="n2", annotations={ALLOCATION: OURS})),
    ("ours does not match the request", asking(8, **{ALLOCATION: OURS})),
    ("ours with empty gpus", asking(**{ALLOCATION: ours(gpus="[]")})),
    ("ours with a bool GPU", asking(**{ALLOCATION: ours(gpus="[true]")})),
    ("ours with a float GPU", asking(**{ALLOCATION: ours(gpus="[1.0]")})),
    ("ours with a negative GPU", asking(**{ALLOCATION: ours(gpus="[-1]")})),
    ("ours with a repeated GPU", asking(**{ALLOCATION: ours(gpus="[1, 1]")})),
    ("ours with a string share", asking(**{ALLOCATION: ours(share='"4"')})),
    ("ours with a huge share", asking(**{ALLOCATION: ours(share=str(10**30))})),
    ("ours with a float share", asking(**{ALLOCATION: ours(share="4.0")})),
    ("ours and Alibaba's index disagree", asking(**{ALLOCATION: OURS, ALIYUN_IDX: "0"})),
    ("ours names a container twice",
     bound(annotations={ALLOCATION: OURS.replace("}]", "}, " + MAIN_ON_1 + "]")})),
    ("progress beyond the containers", bound(annotations={ASSIGNED_CONTAINERS: "2"})),
    ("progress not a number", bound(annotations={ASSIGNED_CONTAINERS: "x"})),
]  # fmt: skip


@pytest.mark.parametrize(("pod", "fast"), [g[1:] for g in GOOD], ids=[g[0] for g in GOOD])
def test_a_readable_pod_gives_the_full_paths_record(pod: Any, fast: bool) -> None:
    expected = full_path(pod)
    assert pod_record(pod) == expected
    found = fast_pod_record(pod)
    assert (found is not None) == fast
    if found is not None:
        assert found == expected


@pytest.mark.parametrize("pod", [b[1] for b in BAD], ids=[b[0] for b in BAD])
def test_garbage_gives_the_full_paths_first_error(pod: Any) -> None:
    kind, expected = outcome(full_path, pod)
    assert kind == "refused"
    assert outcome(pod_record, pod) == (kind, expected)
    assert fast_pod_record(pod) is None


def test_the_record_holds_what_each_reader_says() -> None:
    record = pod_record(bound([("b", (1,), 2), ("a", (0, 1), 3)], {ASSIGNED_CONTAINERS: "1"}))
    assert (record.key, record.bound) == ("ml/train", "n1")
    assert [(c.name, c.gpu_share, c.gpu_count) for c in record.request.containers] == [
        ("b", 2, 1),
        ("a", 3, 2),
    ]
    assert (record.alibaba.assigned, record.alibaba.assume_time_ns) == (False, 7)
    assert record.allocation is not None
    assert record.allocation.per_gpu() == {1: 5, 0: 3}
    assert record.pending is not None
    assert record.pending.done == 1
    unbound = pod_record(pod_json("p", 4, annotations={ALLOCATION: OURS}))
    assert (unbound.bound, unbound.pending) == (None, None)  # a pin is a bound pod's
    assert unbound.allocation is not None


def test_the_fast_path_leaves_the_pod_as_it_was() -> None:
    pod = bound([("b", (1,), 2), ("a", (0, 1), 3)])
    before = copy.deepcopy(pod)
    assert fast_pod_record(pod) is not None
    assert pod == before


# -- any JSON --------------------------------------------------------------------------------

json_values = strategies.json_values(text_size=8, items=3, max_leaves=12)
annotation_values = st.one_of(
    st.sampled_from(["0", "1", "2", "4", "true", "false", "", " 1", OURS,
                     '{"main": 2}', "A100", '{"main": ["T4"]}']),
    st.integers(-1, 20).map(str),
    json_values.map(json.dumps),
    st.builds(
        lambda gpus, share: json.dumps(
            {"node": "n1", "containers": [{"name": "main", "gpus": gpus, "share": share}]}
        ),
        st.lists(st.integers(-1, 3) | st.booleans(), max_size=3),
        st.integers(-1, 9) | st.just(4.0),
    ),
)  # fmt: skip
annotation_keys = st.sampled_from(
    [ALLOCATION, GPU_COUNT_ANNOTATION, GPU_MODELS_ANNOTATION, ASSIGNED_CONTAINERS, *ALIYUN_KEYS]
)
pods = st.builds(
    lambda gpu_mem, extra, annotations, node: limits(
        pod_json("p", gpu_mem, node=node, annotations=annotations), **extra
    ),
    st.none() | st.integers(0, 12) | st.lists(st.none() | st.integers(0, 8), min_size=1),
    st.sampled_from([{}, {GPU_COUNT: "2"}, {GPU_COUNT: "x"}, {GPU_MEM: "1k"}, {GPU_MEM: True}]),
    st.dictionaries(annotation_keys, annotation_values, max_size=5),
    st.sampled_from([None, "n1", "n2", ""]),
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(st.one_of(pods, json_values))
def test_any_pod_gives_the_full_paths_answer(pod: Any) -> None:
    expected = outcome(full_path, pod)
    assert outcome(pod_record, pod) == expected
    found = fast_pod_record(pod)
    if found is not None:
        assert ("read", found) == expected


# -- JSON annotations ------------------------------------------------------------------------

JSON_TEXTS = [
    ("object", '{"node": "n1", "containers": []}'),
    ("repeated key: the last wins", '{"a": 1, "b": 2, "a": 3}'),
    ("big integer", "123456789012345678901234567890"),
    ("negative zero", "-0"),
    ("float", "1.5e2"),
    ("float beyond range", "1e400"),
    ("NaN", "[NaN]"),
    ("Infinity", "-Infinity"),
    ("escaped surrogate pair", '"\\ud83d\\ude00"'),
    ("lone escaped surrogate", '"\\ud800"'),
    ("JSON whitespace around", '\t{"a": [1]}\r\n'),
    ("deep nesting", "[" * 5000 + "]" * 5000),
]


@pytest.mark.parametrize("text", [t[1] for t in JSON_TEXTS], ids=[t[0] for t in JSON_TEXTS])
def test_parse_json_reads_what_json_reads(text: str) -> None:
    try:
        expected: tuple[str, object] = ("read", json.dumps(json.loads(text)))
    except (ValueError, RecursionError):
        expected = ("refused", "not JSON")
    try:
        found: tuple[str, object] = ("read", json.dumps(parse_json(text, "pod p", "k", "JSON")))
    except CodecError as error:
        found = ("refused", "not JSON" if "not JSON" in str(error) else str(error))
    assert found == expected


@pytest.mark.parametrize(
    "text", ["", "{", "{}x", "\u00a0{}", "[1,]", "'a'"], ids=["empty", "open", "trailing",
    "non-JSON space", "trailing comma", "single quotes"],
)  # fmt: skip
def test_parse_json_refuses_what_json_refuses(text: str) -> None:
    with pytest.raises(CodecError, match="not JSON"):
        parse_json(text, "pod p", "k", "JSON")
