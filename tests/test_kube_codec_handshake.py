"""The handshake state on a pod (gpushare.kube.codec.handshake): what the device plugin and the
extender read back from the annotations."""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model import Gpu, Node
from gpushare.kube.codec import ALIYUN_ASSIGNED, CodecError, pod_allocation
from gpushare.kube.codec.handshake import ASSIGNED_CONTAINERS, handshake_annotations, pending_pod
from gpushare.testing.pods import bound_gpu_pod

NODE = Node("n1", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
TWO = [("b", (1,), 2), ("a", (0, 1), 3)]  # spec order b, a


def pod(containers: list[tuple[str, tuple[int, ...], int]], **annotations: str) -> dict[str, Any]:
    obj: dict[str, Any] = bound_gpu_pod("ns", "p", NODE, containers, assume_ns=7).to_dict()
    obj["metadata"]["annotations"].update(annotations)
    return obj


@pytest.mark.parametrize(
    ("annotations", "done", "pending"),
    [
        pytest.param({}, 0, True, id="just-bound-nothing-started"),
        pytest.param({ASSIGNED_CONTAINERS: "1"}, 1, True, id="first-container-started"),
        pytest.param({ASSIGNED_CONTAINERS: "2", ALIYUN_ASSIGNED: "true"}, 2, False,
                     id="all-started-is-not-pending"),
    ],
)  # fmt: skip
def test_pending_pod_reads_progress(annotations: dict[str, str], done: int, pending: bool) -> None:
    found = pending_pod(pod(TWO, **annotations))
    assert (found is not None) == pending
    if found is not None:
        assert found.done == done
        assert found.key == "ns/p"
        assert found.assume_time_ns == 7
        assert [(s.container, s.gpu_indices, s.share) for s in found.steps] == [
            ("b", (1,), 2),
            ("a", (0, 1), 3),
        ]


def test_a_given_allocation_gives_the_same_answer() -> None:
    obj = pod(TWO, **{ASSIGNED_CONTAINERS: "1"})
    assert pending_pod(obj, pod_allocation(obj)) == pending_pod(obj)
    assert pending_pod(obj, None) is None  # the caller read no allocation


@pytest.mark.parametrize("raw", ["3", "-1", "x", "1.0"])
def test_a_bad_progress_count_is_a_codec_error(raw: str) -> None:
    with pytest.raises(CodecError, match=ASSIGNED_CONTAINERS):
        pending_pod(pod(TWO, **{ASSIGNED_CONTAINERS: raw}))


def test_handshake_annotations() -> None:
    found = pending_pod(pod(TWO))
    assert found is not None
    assert handshake_annotations(found, 1) == {ASSIGNED_CONTAINERS: "1", ALIYUN_ASSIGNED: "false"}
    assert handshake_annotations(found, 2) == {ASSIGNED_CONTAINERS: "2", ALIYUN_ASSIGNED: "true"}
    with pytest.raises(ValueError, match="outside"):
        handshake_annotations(found, 3)


def test_steps_follow_the_spec_not_the_annotation() -> None:
    obj = pod(TWO)
    obj["spec"]["containers"].reverse()  # spec a, b; the annotation lists b, a
    found = pending_pod(obj)
    assert found is not None
    assert [s.container for s in found.steps] == ["a", "b"]
