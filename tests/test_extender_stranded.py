"""The extender says on a pod when kube-scheduler will not retry it as nodes grow
(docs/interfaces.md, Pitfalls: 31): which pods, what the Event says, and that it is
said once per condition, only while deciding, and forgotten with the pod. The behaviour of
kube-scheduler itself is measured in tests/cluster/test_extender_stranded.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from gpushare.extender.stranded import STRANDED_REASON, StrandedPods, stranded
from gpushare.kube.watch import Action, Change
from gpushare.testing.dialects import dialect_pod_json
from gpushare.testing.extender import RecordingNotes
from gpushare.testing.pods import with_condition

FIT_REFUSAL = (
    "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint "
    "{gpu: busy}. preemption: 0/3 nodes are available: 3 Preemption is not helpful for "
    "scheduling."
)
HAMI_SHARE = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048, "nvidia.com/gpucores": 30}


def hami_pod(
    limits: dict[str, str | int] | None = None,
    *,
    message: str = FIT_REFUSAL,
    reason: str = "Unschedulable",
    status: str = "False",
    name: str = "hami",
    since: str = "2026-11-28T00:00:00Z",
    **extra: Any,
) -> dict[str, Any]:
    pod = dialect_pod_json(name, {"main": limits or HAMI_SHARE}, namespace="ns")
    pod["metadata"]["uid"] = f"uid-{name}"
    for path, value in extra.items():
        section, key = path.split("__")
        pod.setdefault(section, {})[key] = value
    return with_condition(pod, "PodScheduled", status, reason, message, since=since)


@dataclass(frozen=True)
class Case:
    id: str
    pod: dict[str, Any]
    says: list[str] = field(default_factory=list)  # fragments of the message; [] = nothing


CASES = [
    Case(
        "a HAMi share refused by kube-scheduler for nvidia.com/gpu",
        hami_pod(),
        [
            "(Insufficient nvidia.com/gpu)",
            "asks nvidia.com/gpucores, nvidia.com/gpumem",
            "will not retry it when a node gets room",
            "within 5 minutes",
        ],
    ),
    Case(
        "refused for cpu and memory: both named once, in kube-scheduler's order",
        hami_pod(
            message="0/4 nodes are available: 2 Insufficient cpu, 2 Insufficient memory, "
            "1 Insufficient cpu."
        ),
        ["(Insufficient cpu, memory)"],
    ),
    Case(
        "a Tencent fork share (nvidia.com/vcuda-memory is not advertised)",
        hami_pod({"nvidia.com/vcuda-core": 50, "nvidia.com/vcuda-memory": 4}),
        ["asks nvidia.com/vcuda-core, nvidia.com/vcuda-memory"],
    ),
    Case(
        "many insufficient resources: three named, the rest counted",
        hami_pod(
            message="0/9 nodes are available: "
            + ", ".join(f"1 Insufficient example.com/r{i}" for i in range(9))
        ),
        ["example.com/r0, example.com/r1, example.com/r2 and 6 more"],
    ),
    Case(
        "a pod asking only advertised resources is retried: nothing said",
        hami_pod({"nvidia.com/gpu": 1}),
    ),
    Case(
        "a Tencent share (vcuda-core and vcuda-memory are advertised): nothing said",
        hami_pod({"tencent.com/vcuda-core": 50, "tencent.com/vcuda-memory": 4}),
    ),
    Case(
        "the extender refused it (no Insufficient): kube-scheduler retries it",
        hami_pod(message="0/1 nodes are available: 1 gpushare: GPU 0 has 2 GiB free."),
    ),
    Case(
        "kube-scheduler never says Insufficient of an ignored resource: nothing said",
        hami_pod(message="0/1 nodes are available: 1 Insufficient nvidia.com/gpumem."),
    ),
    Case("not Unschedulable (a scheduling gate)", hami_pod(reason="SchedulingGated")),
    Case("scheduled", hami_pod(status="True", reason="", message="")),
    Case("bound, whatever its old condition says", hami_pod(spec__nodeName="n1")),
    Case("finished", hami_pod(status__phase="Failed")),
    Case("being deleted", hami_pod(metadata__deletionTimestamp="2026-11-28T00:00:01Z")),
    Case(
        "an insufficient resource beyond the scanned part of a huge message is not read",
        hami_pod(message="x" * 5000 + " Insufficient nvidia.com/gpu"),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_which_pods_kube_scheduler_will_not_retry_as_nodes_grow(case: Case) -> None:
    found = stranded(case.pod)
    if not case.says:
        assert found is None
        return
    assert found is not None
    assert found.since == case.pod["status"]["conditions"][0]["lastTransitionTime"]
    for fragment in case.says:
        assert fragment in found.message


class Unread(dict[str, Any]):
    """A pod that fails the test when anything reads it."""

    def __getitem__(self, key: str) -> Any:
        raise AssertionError(f"read {key!r}")

    def get(self, key: str, default: Any = None) -> Any:
        raise AssertionError(f"read {key!r}")


def upsert(pod: dict[str, Any]) -> Change:
    key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    return Change("Pod", Action.UPSERT, key, pod)


def test_said_once_per_condition_again_on_a_new_one_and_forgotten_with_the_pod() -> None:
    notes = RecordingNotes()
    pods = StrandedPods(notes)
    pods.on_pod(upsert(hami_pod()))
    pods.on_pod(upsert(hami_pod()))  # kube-scheduler's flush: the same condition again
    assert notes.reasons("ns/hami") == [STRANDED_REASON]
    assert notes.notes[0][3] is True  # a Warning
    pods.on_pod(upsert(hami_pod(since="2026-11-28T00:05:00Z")))  # a new refusal
    assert notes.reasons("ns/hami") == [STRANDED_REASON] * 2
    pods.on_pod(Change("Pod", Action.DELETE, "ns/hami", hami_pod()))
    pods.on_pod(upsert(hami_pod(since="2026-11-28T00:05:00Z")))  # recreated
    assert notes.reasons("ns/hami") == [STRANDED_REASON] * 3
    assert pods.said._value.get() == 3


def test_a_follower_says_nothing_and_a_bounded_memory_forgets_the_oldest() -> None:
    notes = RecordingNotes()
    follower = StrandedPods(notes, deciding=lambda: False)
    follower.on_pod(upsert(hami_pod()))
    follower.on_pod(Change("Pod", Action.UPSERT, "ns/hami", Unread(hami_pod())))  # not read
    assert notes.notes == []
    leader = StrandedPods(notes, limit=2)
    for name in ("a", "b", "c", "a"):
        leader.on_pod(upsert(hami_pod(name=name)))
    assert [pod for pod, *_ in notes.notes] == ["ns/a", "ns/b", "ns/c", "ns/a"]
    with pytest.raises(ValueError, match="limit must be >= 1"):
        StrandedPods(notes, limit=0)
