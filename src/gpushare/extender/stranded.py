"""Say on the pod when kube-scheduler will not retry it as nodes grow (docs/interfaces.md,
Pitfalls: 31).

kube-scheduler's NodeResourcesFit filter leaves out the resources an extender entry marks
``ignoredByScheduler``, but its queueing hint for node changes counts them. A pod asking one
that no node advertises (``UNADVERTISED_NAMES``: HAMi's ``nvidia.com/gpumem`` and
``nvidia.com/gpucores``, the Tencent fork's, ``aliyun.com/gpu-core.percentage``) and refused by
that filter for another resource ("Insufficient nvidia.com/gpu" in the second after a kubelet
restart, "Insufficient cpu" on a full cluster) is therefore not retried when a node gets room or
joins: only when a scheduled pod is deleted (any, anywhere), or by kube-scheduler's flush of
unschedulable pods 5 minutes later. The extender was never asked about such a pod (the filter
refused every node first), so its requeue (``gpushare.extender.requeue``) cannot help: a change
of the pod itself does not requeue a pod that a plugin refused. Measured on v1.37.1 by
``tests/cluster/test_extender_stranded.py``.

What the extender can do is say so. :meth:`StrandedPods.on_pod` sees every change of a GPU pod;
the first time an unbound pod asking such a resource carries kube-scheduler's
``PodScheduled=False``/``Unschedulable`` condition naming an insufficient resource, it records a
``Warning`` Event ``NotRetriedOnNodeGrowth`` on the pod and logs it: once per condition (pod UID
and transition time), only while this replica decides, at most ``limit`` pods remembered.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter

from gpushare.kube.codec import (
    Json,
    pod_condition,
    pod_deleting,
    pod_finished,
    pod_node_name,
    pod_resource_names,
    pod_uid,
)
from gpushare.kube.codec.dialects import UNADVERTISED_NAMES
from gpushare.kube.watch import Action, Change

__all__ = ["STRANDED_REASON", "PodNotes", "Stranded", "StrandedPods", "stranded"]

log = logging.getLogger(__name__)

STRANDED_REASON = "NotRetriedOnNodeGrowth"
"""The reason of the Event recorded on such a pod."""

MAX_NAMES_SHOWN = 3
"""Resource names quoted in one message; the rest are counted."""

_SCANNED_CHARS = 4096
"""How much of kube-scheduler's condition message is searched for "Insufficient <resource>"
(its per-node reasons come first; the message can be long on big clusters)."""

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9](?:[A-Za-z0-9./_-]{0,251}[A-Za-z0-9])?)")
"""A resource name (it starts and ends with a letter or digit) after kube-scheduler's word."""


class PodNotes(Protocol):
    """Records an Event on a pod (``gpushare.extender.apiserver.ApiEventSink.note``)."""

    def note(self, pod: str, uid: str, reason: str, message: str, *, warning: bool = False) -> None:
        """An Event on pod ``namespace/name`` (UID ``uid``), in the background."""
        ...


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:MAX_NAMES_SHOWN])
    more = len(names) - MAX_NAMES_SHOWN
    return f"{shown} and {more} more" if more > 0 else shown


@dataclass(frozen=True, slots=True)
class Stranded:
    """What is said on a pod kube-scheduler will not retry as nodes grow: the Event
    ``message`` and ``since``, the ``lastTransitionTime`` of the ``PodScheduled`` condition
    that says it (RFC 3339 as written, ``""`` when missing): one Event per condition."""

    message: str
    since: str


def stranded(pod: Json) -> Stranded | None:
    """What to say on ``pod`` when kube-scheduler will not retry it as nodes grow (module
    doc), else ``None``: the pod is bound, finished or being deleted, asks no
    ``UNADVERTISED_NAMES`` resource, or its ``PodScheduled`` condition is not kube-scheduler's
    ``Unschedulable`` naming an insufficient resource. Names quoted are bounded
    (``MAX_NAMES_SHOWN``); the condition's message is searched in its first ``_SCANNED_CHARS``
    characters. Pure."""
    if pod_node_name(pod) or pod_finished(pod) or pod_deleting(pod):
        return None
    ignored = sorted(pod_resource_names(pod) & UNADVERTISED_NAMES)
    if not ignored:
        return None
    condition = pod_condition(pod, "PodScheduled")
    if condition is None or condition.status != "False" or condition.reason != "Unschedulable":
        return None
    found = _INSUFFICIENT.findall(condition.message[:_SCANNED_CHARS])
    insufficient = [n for n in dict.fromkeys(found) if n not in UNADVERTISED_NAMES]
    if not insufficient:
        return None
    message = (
        f"kube-scheduler refused this pod on its own resource check (Insufficient "
        f"{_names(insufficient)}). The pod asks {_names(ignored)}, which no node advertises, "
        "so kube-scheduler will not retry it when a node gets room or joins: it retries when "
        "a scheduled pod is deleted, or within 5 minutes (docs/troubleshooting.md)"
    )
    return Stranded(message, condition.last_transition)


@dataclass(frozen=True, slots=True)
class _Seen:
    uid: str
    since: str  # the condition's lastTransitionTime


class StrandedPods:
    """Watches GPU pods for the ones kube-scheduler will not retry as nodes grow (module doc).
    ``events``: where the Event goes; ``deciding``: whether this replica acts now; ``limit``:
    pods remembered (the oldest forgotten first)."""

    def __init__(
        self,
        events: PodNotes,
        *,
        deciding: Callable[[], bool] = lambda: True,
        limit: int = 10_000,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self._events = events
        self._deciding = deciding
        self._limit = limit
        self._seen: dict[str, _Seen] = {}
        self.said = Counter(
            "gpushare_extender_stranded_pods",
            "Pods kube-scheduler refused on its own resource check that ask a resource no node "
            "advertises: it does not retry them when a node grows (NotRetriedOnNodeGrowth "
            "Events).",
            registry=registry if registry is not None else CollectorRegistry(),
        )

    def on_pod(self, change: Change) -> None:
        """A GPU pod was added, changed or deleted (a cache listener: never blocks)."""
        if change.action is Action.DELETE:
            self._seen.pop(change.key, None)
            return
        if not self._deciding():
            return
        pod = change.obj
        found = stranded(pod)
        if found is None:
            return
        seen = _Seen(pod_uid(pod), found.since)
        if self._seen.get(change.key) == seen:
            return
        self._seen.pop(change.key, None)
        if len(self._seen) >= self._limit:
            del self._seen[next(iter(self._seen))]
        self._seen[change.key] = seen
        self.said.inc()
        log.warning("pod %s: %s", change.key, found.message)
        if seen.uid:
            self._events.note(change.key, seen.uid, STRANDED_REASON, found.message, warning=True)
