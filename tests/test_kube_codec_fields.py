"""Plain fields of Kubernetes objects (``gpushare.kube.codec.fields``): each read one way, in one
place, leniently — a missing or mistyped field reads as empty and nothing raises.

"Finished" is the Kubernetes pod lifecycle's terminal phases, ``Succeeded`` and ``Failed``.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

import gpushare
from gpushare.kube.codec import (
    GPUSHARE_LABEL,
    TERMINAL_PHASES,
    PodCondition,
    is_gpushare_node,
    node_internal_ip,
    node_labels,
    object_name,
    object_namespace,
    pod_annotation,
    pod_condition,
    pod_container_names,
    pod_deleting,
    pod_deletion_timestamp,
    pod_finished,
    pod_node_name,
    pod_phase,
    pod_resource_names,
    pod_uid,
)
from gpushare.kube.watch import Action, Change
from gpushare.testing.extender import node_json, plain_node_json, pod_json

UID = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"


def with_status(pod: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {**pod, "status": {**pod.get("status", {}), **status}}


def with_meta(pod: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {**pod, "metadata": {**pod.get("metadata", {}), **meta}}


# -- a pod's phase and "finished" ---------------------------------------------------------------

PHASES = [
    ("pending pod", pod_json("p", 4), "Pending", False),
    ("running (bound) pod", pod_json("p", 4, node="n1"), "Running", False),
    ("succeeded pod", with_status(pod_json("p", 4), phase="Succeeded"), "Succeeded", True),
    ("failed pod", with_status(pod_json("p", 4), phase="Failed"), "Failed", True),
    ("unknown phase", with_status(pod_json("p", 4), phase="Unknown"), "Unknown", False),
    ("no status", {"metadata": {"name": "p"}}, "", False),
    ("status null", {"metadata": {"name": "p"}, "status": None}, "", False),
    ("status not an object", {"status": ["Failed"]}, "", False),
    ("phase not a string", {"status": {"phase": ["Failed"]}}, "", False),
    ("phase in another case", {"status": {"phase": "failed"}}, "failed", False),
]


@pytest.mark.parametrize(
    ("pod", "phase", "finished"), [c[1:] for c in PHASES], ids=[c[0] for c in PHASES]
)
def test_pod_phase_and_finished(pod: dict[str, Any], phase: str, finished: bool) -> None:
    assert (pod_phase(pod), pod_finished(pod)) == (phase, finished)


def test_terminal_phases_are_succeeded_and_failed() -> None:
    assert frozenset({"Succeeded", "Failed"}) == TERMINAL_PHASES


@pytest.mark.parametrize(
    ("pod", "phase", "finished"), [c[1:] for c in PHASES], ids=[c[0] for c in PHASES]
)
def test_a_watch_change_releases_exactly_the_finished_pods(
    pod: dict[str, Any], phase: str, finished: bool
) -> None:
    change = Change("Pod", Action.UPSERT, "default/p", pod)
    assert change.released is finished
    assert Change("Pod", Action.DELETE, "default/p", pod).released


def test_finished_is_written_once() -> None:
    """The phase names appear as code in one module only: every component asks ``pod_finished``
    (or ``TERMINAL_PHASES``), so none can disagree on what holds a GPU."""
    root = Path(gpushare.__file__).parent
    found = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and node.value in ("Succeeded", "Failed")
    }
    assert found == {"kube/codec/fields.py"}


# -- identity and binding ------------------------------------------------------------------------

IDENTITY = [
    (
        "a pod as kube-scheduler sends it",
        pod_json("p", 4, namespace="ml", uid=UID),
        ("p", "ml", UID, ""),
    ),
    ("a bound pod", pod_json("p", 4, namespace="ml", uid=UID, node="n1"), ("p", "ml", UID, "n1")),
    ("no metadata, no spec", {}, ("", "", "", "")),
    ("metadata null", {"metadata": None, "spec": None}, ("", "", "", "")),
    ("no namespace: no default applied", {"metadata": {"name": "p"}}, ("p", "", "", "")),
    ("metadata not an object", {"metadata": "p", "spec": "n1"}, ("", "", "", "")),
    (
        "fields not strings",
        {"metadata": {"name": 1, "namespace": 2, "uid": 3}, "spec": {"nodeName": 4}},
        ("", "", "", ""),
    ),
    ("empty node name: not bound", {"spec": {"nodeName": ""}}, ("", "", "", "")),
]


@pytest.mark.parametrize(
    ("obj", "expected"), [c[1:] for c in IDENTITY], ids=[c[0] for c in IDENTITY]
)
def test_name_namespace_uid_and_node(obj: dict[str, Any], expected: tuple[str, ...]) -> None:
    assert (object_name(obj), object_namespace(obj), pod_uid(obj), pod_node_name(obj)) == expected


DELETION = [
    ("alive", pod_json("p", 4), ""),
    (
        "being deleted",
        with_meta(pod_json("p", 4), deletionTimestamp="2026-11-23T18:00:00Z"),
        "2026-11-23T18:00:00Z",
    ),
    ("timestamp null", with_meta(pod_json("p", 4), deletionTimestamp=None), ""),
    ("timestamp not a string", with_meta(pod_json("p", 4), deletionTimestamp=7), ""),
    ("no metadata", {}, ""),
]


@pytest.mark.parametrize(("pod", "since"), [c[1:] for c in DELETION], ids=[c[0] for c in DELETION])
def test_pod_deletion(pod: dict[str, Any], since: str) -> None:
    assert (pod_deletion_timestamp(pod), pod_deleting(pod)) == (since, bool(since))


ANNOTATIONS = [
    ("present", pod_json("p", 4, annotations={"k": "v"}), "v"),
    ("absent", pod_json("p", 4, annotations={"other": "v"}), None),
    ("no annotations", pod_json("p", 4), None),
    ("annotations null", with_meta(pod_json("p", 4), annotations=None), None),
    ("value not a string", with_meta(pod_json("p", 4), annotations={"k": 1}), None),
    ("no metadata", {}, None),
]


@pytest.mark.parametrize(
    ("pod", "value"), [c[1:] for c in ANNOTATIONS], ids=[c[0] for c in ANNOTATIONS]
)
def test_pod_annotation(pod: dict[str, Any], value: str | None) -> None:
    assert pod_annotation(pod, "k") == value


# -- conditions and resource names ---------------------------------------------------------------

SCHEDULED = {
    "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
    "message": "0/1 nodes are available", "lastTransitionTime": "2026-11-28T00:00:00Z",
}  # fmt: skip
CONDITIONS = [
    ("kube-scheduler's", with_status(pod_json("p", 4), conditions=[SCHEDULED]),
     PodCondition("False", "Unschedulable", "0/1 nodes are available", "2026-11-28T00:00:00Z")),
    ("another type only",
     with_status(pod_json("p", 4), conditions=[{**SCHEDULED, "type": "Ready"}]), None),
    ("fields of the wrong type read empty",
     with_status(pod_json("p", 4), conditions=[{"type": "PodScheduled", "status": True}]),
     PodCondition("", "", "", "")),
    ("conditions not a list", with_status(pod_json("p", 4), conditions={"type": "PodScheduled"}),
     None),
    ("no status", {}, None),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "condition"), [c[1:] for c in CONDITIONS], ids=[c[0] for c in CONDITIONS]
)
def test_pod_condition(pod: dict[str, Any], condition: PodCondition | None) -> None:
    assert pod_condition(pod, "PodScheduled") == condition


def with_containers(*containers: Any, kind: str = "containers") -> dict[str, Any]:
    return {"spec": {kind: list(containers)}}


RESOURCE_NAMES = [
    ("limits and requests of containers and init containers",
     {"spec": {"containers": [{"resources": {"limits": {"a/x": "1"}, "requests": {"cpu": "1"}}}],
               "initContainers": [{"resources": {"limits": {"b/y": "2"}}}]}},
     {"a/x", "cpu", "b/y"}),
    ("no resources", with_containers({"name": "c"}), set()),
    ("resources of the wrong type", with_containers({"resources": {"limits": ["a/x"]}}), set()),
    ("containers not a list", {"spec": {"containers": {"resources": {}}}}, set()),
    ("no spec", {}, set()),
]  # fmt: skip


@pytest.mark.parametrize(
    ("pod", "names"), [c[1:] for c in RESOURCE_NAMES], ids=[c[0] for c in RESOURCE_NAMES]
)
def test_pod_resource_names(pod: dict[str, Any], names: set[str]) -> None:
    assert pod_resource_names(pod) == names


# -- container IDs -------------------------------------------------------------------------------


def statuses(*entries: Any, kind: str = "containerStatuses") -> dict[str, Any]:
    return with_status(pod_json("p", 4, node="n1"), **{kind: list(entries)})


CONTAINERS = [
    (
        "containerd prefix stripped",
        statuses({"name": "main", "containerID": "containerd://abc"}),
        {"abc": "main"},
    ),
    (
        "docker prefix stripped",
        statuses({"name": "main", "containerID": "docker://d0"}),
        {"d0": "main"},
    ),
    (
        "init containers",
        statuses({"name": "init", "containerID": "cri-o://i1"}, kind="initContainerStatuses"),
        {"i1": "init"},
    ),
    (
        "ephemeral containers",
        statuses(
            {"name": "debug", "containerID": "containerd://e1"}, kind="ephemeralContainerStatuses"
        ),
        {"e1": "debug"},
    ),
    ("not started: no ID", statuses({"name": "main"}, {"name": "side", "containerID": ""}), {}),
    ("no statuses", pod_json("p", 4), {}),
    ("statuses not a list", statuses() | {"status": {"containerStatuses": {"name": "main"}}}, {}),
    ("entry not an object", statuses("containerd://abc", None), {}),
    ("name not a string", statuses({"name": 1, "containerID": "containerd://abc"}), {}),
]


@pytest.mark.parametrize(
    ("pod", "names"), [c[1:] for c in CONTAINERS], ids=[c[0] for c in CONTAINERS]
)
def test_pod_container_names(pod: dict[str, Any], names: dict[str, str]) -> None:
    assert pod_container_names(pod) == names


# -- nodes ---------------------------------------------------------------------------------------


def addresses(*entries: Any) -> dict[str, Any]:
    return {"metadata": {"name": "n1"}, "status": {"addresses": list(entries)}}


NODES = [
    ("gpushare node", node_json("n1", [16]), True),
    ("node without the label", plain_node_json("n1"), False),
    ("label not true", {"metadata": {"labels": {GPUSHARE_LABEL: "false"}}}, False),
    ("labels null", {"metadata": {"labels": None}}, False),
    ("no metadata", {}, False),
    ("metadata not an object", {"metadata": "n1"}, False),
]


@pytest.mark.parametrize(("node", "labelled"), [c[1:] for c in NODES], ids=[c[0] for c in NODES])
def test_is_gpushare_node(node: dict[str, Any], labelled: bool) -> None:
    assert is_gpushare_node(node) is labelled


LABELS = [
    ("labels", {"metadata": {"labels": {"pool": "a", GPUSHARE_LABEL: "true"}}},
     {"pool": "a", GPUSHARE_LABEL: "true"}),
    ("no labels", {"metadata": {"name": "n1"}}, {}),
    ("labels null", {"metadata": {"labels": None}}, {}),
    ("labels not an object", {"metadata": {"labels": ["pool=a"]}}, {}),
    ("metadata not an object", {"metadata": "n1"}, {}),
    ("no metadata", {}, {}),
]  # fmt: skip


@pytest.mark.parametrize(("node", "labels"), [c[1:] for c in LABELS], ids=[c[0] for c in LABELS])
def test_node_labels(node: dict[str, Any], labels: dict[str, str]) -> None:
    assert node_labels(node) == labels


INTERNAL_IPS = [
    (
        "first InternalIP",
        addresses(
            {"type": "Hostname", "address": "n1"},
            {"type": "InternalIP", "address": "10.0.0.1"},
            {"type": "InternalIP", "address": "10.0.0.2"},
        ),
        "10.0.0.1",
    ),
    ("only an ExternalIP", addresses({"type": "ExternalIP", "address": "1.2.3.4"}), None),
    (
        "empty address skipped",
        addresses(
            {"type": "InternalIP", "address": ""}, {"type": "InternalIP", "address": "10.0.0.3"}
        ),
        "10.0.0.3",
    ),
    ("entry not an object", addresses("10.0.0.1"), None),
    ("addresses not a list", {"status": {"addresses": {"type": "InternalIP"}}}, None),
    ("no status", {"metadata": {"name": "n1"}}, None),
]


@pytest.mark.parametrize(
    ("node", "address"), [c[1:] for c in INTERNAL_IPS], ids=[c[0] for c in INTERNAL_IPS]
)
def test_node_internal_ip(node: dict[str, Any], address: str | None) -> None:
    assert node_internal_ip(node) == address
