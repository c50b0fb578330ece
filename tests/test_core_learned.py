"""The target workload learned online (``gpushare.core.learned``): which pods count, when M is
due, what it is built from; the extender's tracker and the simulator's cluster-like runs share
it."""

from __future__ import annotations

import pytest

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.learned import KnownPods, node_local_context
from gpushare.core.model import PodRequest
from gpushare.testing.core import pod_request


def gpu_pod(key: str, share: int = 500, count: int = 1) -> PodRequest:
    return pod_request(("main", share, count), key=key, cpu_milli=4000)


CPU_POD = pod_request(key="ns/cpu", cpu_milli=2000)


@pytest.mark.parametrize(
    ("events", "due"),
    [
        pytest.param([], False, id="nothing known: not due"),
        pytest.param([("observe", CPU_POD)], False, id="a pod asking no GPU is ignored"),
        pytest.param([("observe", gpu_pod("a"))], True, id="the first GPU pod: due at once"),
        pytest.param(
            [("observe", gpu_pod("a")), ("rebuild", None), ("observe", gpu_pod("b"))],
            False,
            id="after a rebuild: not due before refresh_changes changes",
        ),
        pytest.param(
            [("observe", gpu_pod("a")), ("rebuild", None), ("observe", gpu_pod("b")),
             ("forget", gpu_pod("a"))],
            True,
            id="a pod gone counts as a change: two of two",
        ),
        pytest.param(
            [("observe", gpu_pod("a")), ("rebuild", None), ("observe", gpu_pod("a")),
             ("forget", gpu_pod("z"))],
            False,
            id="the same request again and an unknown pod gone change nothing",
        ),
    ],
)  # fmt: skip
def test_m_is_due_at_the_first_gpu_pod_then_every_refresh_changes(
    events: list[tuple[str, PodRequest | None]], due: bool
) -> None:
    known = KnownPods(refresh_changes=2)
    for action, pod in events:
        if action == "observe":
            assert pod is not None
            known.observe(pod)
        elif action == "forget":
            assert pod is not None
            known.forget(pod.key)
        else:
            known.rebuild()
    assert known.due() is due


def test_rebuild_is_from_pods_over_the_known_pods() -> None:
    known = KnownPods()
    pods = [gpu_pod("a"), gpu_pod("b"), gpu_pod("c", 1000, 2)]
    for pod in [*pods, CPU_POD]:
        known.observe(pod)
    assert known.rebuild() == TargetWorkload.from_pods(pods, 0.95)
    assert known.from_pods
    assert (known.pods, known.changes) == (3, 0)


def test_rebuild_with_no_pod_known_leaves_m_to_the_caller() -> None:
    known = KnownPods()
    known.observe(gpu_pod("a"))
    known.forget("ns/pod")
    known.forget(gpu_pod("a").key)
    assert known.rebuild() is None
    assert not known.from_pods


def test_a_coverage_outside_0_to_1_is_refused_with_its_value() -> None:
    with pytest.raises(ValueError, match=r"coverage must be in \(0, 1\], got 1.5"):
        KnownPods(coverage=1.5)


def test_node_local_context_knows_m_and_the_unit_only() -> None:
    workload = TargetWorkload.from_pods([gpu_pod("a")])
    context = node_local_context(workload, 1000)
    assert (context.workload, context.gpu_unit, context.max_node_gpu) == (workload, 1000, 8000)
    assert (context.cluster, context.all_shapes) == ((), None)
