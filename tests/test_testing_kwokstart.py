"""The device plugin's handshake record for kwok nodes (gpushare.testing.kwokstart), which the
demo runs so that its pods do not stay *starting* for ever: which pods get a record, and that
the record is exactly the one the device plugin writes after a pod's last Allocate."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from gpushare.core.model import Gpu, Node
from gpushare.kube.codec import ALIYUN_ASSIGNED
from gpushare.kube.codec.handshake import ASSIGNED_CONTAINERS, pending_pod
from gpushare.testing.kwokstart import HandshakeRecord, KwokDevicePlugin, handshake_records
from gpushare.testing.pods import bound_gpu_pod

KWOK = Node("kwok-0", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
REAL = Node("real-0", (Gpu(0, "T4", 16),))
ONE = [("main", (0,), 4)]
TWO = [("b", (1,), 2), ("a", (0, 1), 3)]
STARTED = {ASSIGNED_CONTAINERS: "1", ALIYUN_ASSIGNED: "true"}


def pod(
    name: str,
    node: Node = KWOK,
    containers: Sequence[tuple[str, tuple[int, ...], int]] = ONE,
    **fields: Any,
) -> dict[str, Any]:
    """Pod ``ns/name`` bound to ``node`` with the extender's annotations; ``fields``:
    ``annotations`` (added), ``phase``, ``deleting``."""
    obj: dict[str, Any] = bound_gpu_pod("ns", name, node, containers, assume_ns=7).to_dict()
    obj["metadata"]["annotations"].update(fields.get("annotations", {}))
    if "phase" in fields:
        obj["status"] = {"phase": fields["phase"]}
    if fields.get("deleting"):
        obj["metadata"]["deletionTimestamp"] = "2026-11-28T00:00:00Z"
    return obj


@pytest.mark.parametrize(
    ("pods", "expected"),
    [
        pytest.param([pod("p")], [("p", {ASSIGNED_CONTAINERS: "1", ALIYUN_ASSIGNED: "true"})],
                     id="bound-not-started-gets-every-container-answered"),
        pytest.param([pod("p", containers=TWO, annotations={ASSIGNED_CONTAINERS: "1"})],
                     [("p", {ASSIGNED_CONTAINERS: "2", ALIYUN_ASSIGNED: "true"})],
                     id="half-started-multi-container-pod-gets-the-rest"),
        pytest.param([pod("p", annotations=STARTED)], [], id="started-pod-is-left-alone"),
        pytest.param([pod("p", REAL)], [], id="pod-on-a-node-with-a-real-device-plugin-is-left"),
        pytest.param([pod("p", phase="Succeeded")], [], id="finished-pod-is-left"),
        pytest.param([pod("p", deleting=True)], [], id="deleting-pod-is-left"),
        pytest.param([pod("p", annotations={ASSIGNED_CONTAINERS: "x"})], [],
                     id="unreadable-record-is-left-to-the-extender-to-report"),
        pytest.param([pod("a"), pod("b", annotations=STARTED), pod("c", REAL), pod("d")],
                     [("a", {ASSIGNED_CONTAINERS: "1", ALIYUN_ASSIGNED: "true"}),
                      ("d", {ASSIGNED_CONTAINERS: "1", ALIYUN_ASSIGNED: "true"})],
                     id="only-the-kwok-nodes-unstarted-pods"),
    ],
)  # fmt: skip
def test_the_kwok_nodes_unstarted_pods_get_the_device_plugins_record(
    pods: list[dict[str, Any]], expected: list[tuple[str, dict[str, str]]]
) -> None:
    records = handshake_records(pods, [KWOK.name])
    assert records == [HandshakeRecord("ns", name, notes) for name, notes in expected]


def test_a_recorded_pod_is_no_longer_pending() -> None:
    """The record ends the handshake as the device plugin's does: nothing left to start."""
    obj = pod("p", containers=TWO)
    (record,) = handshake_records([obj], [KWOK.name])
    obj["metadata"]["annotations"].update(record.annotations)
    assert pending_pod(obj) is None
    assert handshake_records([obj], [KWOK.name]) == []


@pytest.mark.parametrize("interval_s", [0.0, -1.0], ids=["zero", "negative"])
def test_the_interval_must_be_positive(interval_s: float) -> None:
    with pytest.raises(ValueError, match="interval_s must be positive"):
        KwokDevicePlugin(None, [KWOK.name], interval_s=interval_s)  # type: ignore[arg-type]
