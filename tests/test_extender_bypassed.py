"""The extender says loudly when a GPU pod bypassed gpushare's scheduler: which pods count,
what the Warning Event says (the scheduler that placed it and the one to use), that it is said
once per pod UID and only while deciding, and the gauge ``gpushare_extender_bypassed_pods``."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpushare.core.model import Gpu, Node
from gpushare.extender.bypassed import BYPASSED_REASON, BypassedPods, bypassed
from gpushare.kube.watch import Action, Change
from gpushare.testing.extender import RecordingNotes, pod_json
from gpushare.testing.pods import bound_gpu_pod

N1 = Node("n1", (Gpu(0, "Tesla-T4", 16),))


def placed(name: str, scheduler: str) -> dict[str, Any]:
    """A GPU pod gpushare's extender placed (with its allocation record), by ``scheduler``."""
    pod: dict[str, Any] = bound_gpu_pod("ns", name, N1, [("main", (0,), 4)], assume_ns=1).to_dict()
    pod["spec"]["schedulerName"] = scheduler
    return pod


def upsert(pod: dict[str, Any]) -> Change:
    meta = pod["metadata"]
    return Change("Pod", Action.UPSERT, f"{meta['namespace']}/{meta['name']}", pod)


@pytest.mark.parametrize(
    ("pod", "scheduler"),
    [
        pytest.param(pod_json("p", 4, node="n1", scheduler=None), "default-scheduler",
                     id="no-schedulerName-bound-by-the-default-scheduler-bypassed"),
        pytest.param(pod_json("p", 4, node="n1", scheduler="volcano"), "volcano",
                     id="another-scheduler-named-bypassed"),
        pytest.param(pod_json("p", 4, scheduler=None), None,
                     id="not-bound-yet-is-not-bypassed"),
        pytest.param(placed("p", "gpushare-scheduler"), None,
                     id="placed-with-an-allocation-record-is-not-bypassed"),
        pytest.param(pod_json("p", None, node="n1", scheduler=None), None,
                     id="a-pod-asking-no-gpu-is-not-bypassed"),
        pytest.param(pod_json("p", 4, node="n1", scheduler=None, deleting=True), None,
                     id="a-pod-being-deleted-is-not-counted"),
    ],
)  # fmt: skip
def test_which_pods_bypassed_gpushare(pod: dict[str, Any], scheduler: str | None) -> None:
    found = bypassed(pod)
    assert (found.scheduler if found is not None else None) == scheduler


def test_a_bypassing_pod_gets_one_warning_naming_the_scheduler_to_use_and_is_counted() -> None:
    notes, registry = RecordingNotes(), CollectorRegistry()
    pods = BypassedPods(notes, registry=registry)
    pods.on_pod(upsert(placed("good", "team-gpu-scheduler")))
    stray = pod_json("stray", 4, node="n1", namespace="ns", scheduler=None)
    pods.on_pod(upsert(stray))
    pods.on_pod(upsert(stray))  # a status update: said once per UID
    ((key, reason, message, warning),) = notes.notes
    assert (key, reason, warning) == ("ns/stray", BYPASSED_REASON, True)
    assert message == (
        "gpushare: this pod asks GPU memory but was placed on node n1 by scheduler "
        "'default-scheduler', which does not call gpushare's extender: it has no GPU assigned "
        "and the device plugin will refuse to start it. Set spec.schedulerName: "
        "team-gpu-scheduler and recreate the pod"
    )
    assert registry.get_sample_value("gpushare_extender_bypassed_pods") == 1.0
    pods.on_pod(Change("Pod", Action.DELETE, "ns/stray", stray))
    assert registry.get_sample_value("gpushare_extender_bypassed_pods") == 0.0


def test_a_replica_that_does_not_decide_counts_but_records_no_event() -> None:
    notes = RecordingNotes()
    pods = BypassedPods(notes, deciding=lambda: False)
    pods.on_pod(upsert(pod_json("stray", 4, node="n1", namespace="ns", scheduler=None)))
    assert (pods.count, notes.notes) == (1, [])
    assert pods.use == "gpushare-scheduler"  # the chart's, while no placed pod names one
