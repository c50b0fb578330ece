"""Say loudly when a GPU pod bypassed gpushare's scheduler.

A pod asking ``aliyun.com/gpu-mem`` (or a dialect's resource) created without the
``schedulerName`` of the scheduler wired to the extender is placed by another scheduler (the
default one, when it names none): bound to a node with no GPU assignment. It holds no GPU in
gpushare's count (``kubectl inspect gpushare``'s ``PENDING(Allocated)``), and the device
plugin refuses to start it (``UnexpectedAdmissionError``: "no GPU assignment from gpushare's
scheduler"). :class:`BypassedPods` sees every change of a GPU pod (a cache listener, as
``gpushare.extender.stranded``) and, for each such pod:

* records a ``Warning`` Event ``GPUPodBypassedScheduler`` on it naming the scheduler that
  placed it and the one to use, once per pod UID, only while this replica decides (at most
  ``limit`` pods remembered), and logs it;
* counts it in the gauge ``gpushare_extender_bypassed_pods`` (every replica), until it is
  deleted or finishes.

The scheduler to use is the ``schedulerName`` of the latest GPU pod seen with gpushare's
allocation record (the extender placed it, so its scheduler calls the extender) unless that is
the bypassing pod's own, else the chart's ``gpushare-scheduler``; ``kubectl inspect
gpushare`` names it alike (the one most such pods name).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge

from gpushare.core.handshake import GPUSHARE_SCHEDULER
from gpushare.extender.stranded import PodNotes
from gpushare.kube.codec import (
    ALLOCATION,
    CodecError,
    Json,
    pod_annotation,
    pod_deleting,
    pod_finished,
    pod_node_name,
    pod_uid,
)
from gpushare.kube.codec.record import pod_record
from gpushare.kube.watch import Action, Change

__all__ = ["BYPASSED_REASON", "Bypassed", "BypassedPods", "bypassed"]

log = logging.getLogger(__name__)

BYPASSED_REASON = "GPUPodBypassedScheduler"
"""The reason of the Warning Event recorded on such a pod."""
DEFAULT_SCHEDULER = "default-scheduler"
"""The scheduler of a pod that names none."""


@dataclass(frozen=True, slots=True)
class Bypassed:
    """A GPU pod bound to ``node`` by ``scheduler`` without a GPU assignment."""

    node: str
    scheduler: str

    def message(self, use: str) -> str:
        """The Event's text: what happened and what to do (``use``: the scheduler to name)."""
        return (
            f"gpushare: this pod asks GPU memory but was placed on node {self.node} by "
            f"scheduler {self.scheduler!r}, which does not call gpushare's extender: it has no "
            "GPU assigned and the device plugin will refuse to start it. Set "
            f"spec.schedulerName: {use} and recreate the pod"
        )


def _scheduler(pod: Json) -> str:
    spec = pod.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER


def bypassed(pod: Json) -> Bypassed | None:
    """What ``pod`` bypassed (module doc), else ``None``: not bound, finished, being deleted,
    asking no GPU, carrying an allocation record (ours or Alibaba's), or unreadable (then it
    is a skipped pod, ``gpushare.extender.state``). Pure."""
    node = pod_node_name(pod)
    if not node or pod_finished(pod) or pod_deleting(pod):
        return None
    try:
        record = pod_record(pod)
    except CodecError:
        return None
    if not record.request.gpu_containers or record.allocation is not None:
        return None
    return Bypassed(node, _scheduler(pod))


class BypassedPods:
    """Watches GPU pods for the ones placed around gpushare (module doc). ``events``: where
    the Event goes (``gpushare.extender.stranded.PodNotes``); ``deciding``: whether this
    replica records Events now; ``limit``: pods whose Event is remembered."""

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
        self._now: set[str] = set()  # pod keys bypassing now
        self._said: dict[str, str] = {}  # pod key -> UID whose Event was recorded
        self.use = GPUSHARE_SCHEDULER
        """The scheduler to name (module doc)."""
        Gauge(
            "gpushare_extender_bypassed_pods",
            "GPU pods bound without a GPU assignment by a scheduler that does not call "
            "gpushare's extender (GPUPodBypassedScheduler Events); they cannot start.",
            registry=registry if registry is not None else CollectorRegistry(),
        ).set_function(lambda: float(len(self._now)))

    @property
    def count(self) -> int:
        """GPU pods bypassing gpushare now."""
        return len(self._now)

    def on_pod(self, change: Change) -> None:
        """A GPU pod was added, changed or deleted (a cache listener: never blocks)."""
        key = change.key
        if change.action is Action.DELETE:
            self._now.discard(key)
            self._said.pop(key, None)
            return
        pod = change.obj
        if pod_node_name(pod) and pod_annotation(pod, ALLOCATION):
            self.use = _scheduler(pod)
        found = bypassed(pod)
        if found is None:
            self._now.discard(key)
            return
        self._now.add(key)
        uid = pod_uid(pod)
        if not self._deciding() or not uid or self._said.get(key) == uid:
            return
        self._said.pop(key, None)
        if len(self._said) >= self._limit:
            del self._said[next(iter(self._said))]
        self._said[key] = uid
        use = self.use if self.use != found.scheduler else GPUSHARE_SCHEDULER
        message = found.message(use)
        log.warning("pod %s: %s", key, message)
        self._events.note(key, uid, BYPASSED_REASON, message, warning=True)
