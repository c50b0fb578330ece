"""FGD's target workload M from the pods the extender knows, instead of a fixed placeholder.

:class:`WorkloadTracker` keeps the request (``PodRequest``) of every GPU pod the extender
knows, by ``namespace/name``:

* on a cluster, every pod of the :class:`~gpushare.kube.cache.ClusterCache` (bound and
  pending pods asking ``aliyun.com/gpu-mem``) through :meth:`WorkloadTracker.on_pod`; finished
  (``Succeeded``/``Failed``) and deleted pods leave it;
* in any mode, every pod the policy scores or places (:meth:`WorkloadTracker.observe`: the
  pending pods kube-scheduler asks about; the only source with ``--in-memory``).

**One whole GPU** (``gpu_unit``, FGD's normalisation and the placeholder M's unit) is either
given (``--gpu-unit``) or derived from the node inventory (``scoring.derived_gpu_unit``: the
capacity most GPUs have, from ``ExtenderState.gpu_capacities``), checked again every
``unit_check_s`` seconds (at every call while no GPU is known); a new unit rebuilds the policy.

M is ``TargetWorkload.from_pods`` over those requests (shapes in the node unit already, as the
ledger and ``scoring`` use them: ``aliyun.com/gpu-mem`` per GPU, ``gpu_count`` GPUs). It is
rebuilt lazily, on the next score, once ``refresh_changes`` pods changed or ``refresh_s``
seconds passed with at least one change; until the first GPU pod is known, M is
``scoring.default_workload``. The pods and the count of changes are
``gpushare.core.learned.KnownPods``, which the simulator's cluster-like runs use too.

:class:`AdaptiveFgd` is the policy the extender runs for ``fgd``/``fgd-cpu``/``fgd-spare``: the
core policy rebuilt on each new M. Its ``generation`` changes with M, so the scheduler keeps
caching its values and drops them only when M moves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.learned import LEARNING_POLICIES, KnownPods
from gpushare.core.model import ContainerAllocation, NodeState, PodRequest
from gpushare.core.policies import Policy, TieBreak, tie_break_of
from gpushare.extender.scoring import (
    DEFAULT_GPU_UNIT,
    default_workload,
    derived_gpu_unit,
    extender_policy,
)
from gpushare.kube.codec import CodecError, pod_finished, pod_request
from gpushare.kube.watch import Action, Change

log = logging.getLogger(__name__)

WORKLOAD_POLICIES = LEARNING_POLICIES
"""The policies whose scores depend on the target workload."""


class WorkloadTracker:
    """The GPU pods the extender knows and the target workload M built from them (module
    doc). ``gpu_unit``: one whole GPU in node units, or ``None`` to derive it from
    ``gpu_capacities`` (GPU capacity → count; ``ValueError`` without it). ``clock``: monotonic
    seconds."""

    def __init__(
        self,
        gpu_unit: int | None,
        *,
        gpu_capacities: Callable[[], Mapping[int, int]] | None = None,
        refresh_s: float = 60.0,
        refresh_changes: int = 100,
        coverage: float = 0.95,
        unit_check_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if gpu_unit is None and gpu_capacities is None:
            raise ValueError("gpu_unit=None (derived) needs gpu_capacities")
        self._capacities = gpu_capacities if gpu_unit is None else None
        self.gpu_unit = DEFAULT_GPU_UNIT if gpu_unit is None else gpu_unit
        self.unit_check_s = unit_check_s
        self._unit_known = gpu_unit is not None
        self._unit_checked_at = clock()
        self._unit_changed = False
        self.refresh_s = refresh_s
        self._known = KnownPods(refresh_changes=refresh_changes, coverage=coverage)
        self._clock = clock
        self._check_unit(force=True)
        self._refreshed_at = clock()
        self._workload = default_workload(self.gpu_unit)

    @property
    def from_pods(self) -> bool:
        """True once M comes from pods (else the placeholder)."""
        return self._known.from_pods

    @property
    def pods(self) -> int:
        """How many GPU pods are known."""
        return self._known.pods

    def observe(self, pod: PodRequest) -> None:
        """A pod's request (a pod being scored or placed); CPU-only pods are ignored."""
        self._known.observe(pod)

    def forget(self, key: str) -> None:
        """Pod ``key`` is gone (deleted or finished)."""
        self._known.forget(key)

    def on_pod(self, change: Change) -> None:
        """A ``ClusterCache`` pod listener: bound and pending pods count, finished and
        deleted pods leave; a pod whose spec cannot be read is skipped."""
        obj = change.obj
        if change.action is Action.DELETE or pod_finished(obj):
            self.forget(change.key)
            return
        try:
            request = pod_request(obj)
        except (CodecError, ValueError) as error:
            log.debug("pod %s left out of the target workload: %s", change.key, error)
            return
        if request.plain is None:  # MiB, percent, GPU types or UUIDs: its shape is the node's
            log.debug(
                "pod %s left out of the target workload: resolved per node (memory in MiB or "
                "%%, GPU types or UUIDs)",
                change.key,
            )
            return
        self.observe(request.plain)

    def _check_unit(self, *, force: bool = False) -> None:
        """Derive ``gpu_unit`` again when it is derived and due (module doc)."""
        if self._capacities is None:
            return
        now = self._clock()
        if not force and self._unit_known and now - self._unit_checked_at < self.unit_check_s:
            return
        self._unit_checked_at = now
        capacities = self._capacities()
        self._unit_known = any(count > 0 for count in capacities.values())
        unit = derived_gpu_unit(capacities, self.gpu_unit)
        if unit != self.gpu_unit:
            log.info(
                "one whole GPU is %d node units (the capacity most GPUs have; was %d)",
                unit, self.gpu_unit,
            )  # fmt: skip
            self.gpu_unit = unit
            self._unit_changed = True

    def due(self) -> bool:
        """True when M should be rebuilt (module doc)."""
        self._check_unit()
        if self._unit_changed:
            return True
        if self._known.changes == 0:
            return False
        if self._known.due():
            return True
        return self._clock() - self._refreshed_at >= self.refresh_s

    def refresh(self) -> TargetWorkload:
        """Rebuild M now from the known pods (the placeholder when there are none)."""
        self._unit_changed = False
        self._refreshed_at = self._clock()
        learned = self._known.rebuild()
        self._workload = default_workload(self.gpu_unit) if learned is None else learned
        log.debug("target workload from %d pods: %s", self._known.pods, self._workload)
        return self._workload

    def workload(self) -> TargetWorkload:
        """The current M, rebuilt first when :meth:`due`."""
        if self.due():
            self.refresh()
        return self._workload


class AdaptiveFgd:
    """Policy ``name`` (one of ``WORKLOAD_POLICIES``) on the tracker's current M (module
    doc). The pods it scores and places are observed by the tracker."""

    def __init__(self, name: str, tracker: WorkloadTracker) -> None:
        if name not in WORKLOAD_POLICIES:
            accepted = ", ".join(sorted(WORKLOAD_POLICIES))
            raise KeyError(f"{name!r} does not use a target workload; expected one of {accepted}")
        self._name = name
        self.tracker = tracker
        self._built_for: TargetWorkload | None = None
        self._generation = 0
        self._inner_tie_break: TieBreak | None = None
        self._inner = self._current()

    @property
    def name(self) -> str:
        return self._name

    @property
    def deterministic(self) -> bool:
        """Scores depend only on the node state and the pod, for one ``generation``."""
        return True

    @property
    def generation(self) -> int:
        """Changes whenever M (and so every score) changes: the scheduler drops cached values."""
        self._current()
        return self._generation

    @property
    def workload(self) -> TargetWorkload:
        """The M the policy scores with now."""
        return self.tracker.workload()

    def _current(self) -> Policy:
        workload = self.tracker.workload()
        if workload is not self._built_for:
            self._inner = extender_policy(
                self._name, gpu_unit=self.tracker.gpu_unit, workload=workload
            )
            self._inner_tie_break = tie_break_of(self._inner)
            self._built_for = workload
            self._generation += 1
        return self._inner

    def score(self, state: NodeState, pod: PodRequest) -> float:
        self.tracker.observe(pod)
        return self._current().score(state, pod)

    def tie_break(self, state: NodeState, pod: PodRequest) -> float:
        self._current()
        tie_break = self._inner_tie_break
        return float(tie_break(state, pod)) if tie_break is not None else 0.0

    def choose_gpus(self, state: NodeState, pod: PodRequest) -> tuple[ContainerAllocation, ...]:
        self.tracker.observe(pod)
        return self._current().choose_gpus(state, pod)


def live_policy(
    name: str,
    gpu_unit: int | None,
    tracker: WorkloadTracker | None = None,
    gpu_capacities: Callable[[], Mapping[int, int]] | None = None,
) -> Policy | str:
    """What the extender passes to ``create_app``: an :class:`AdaptiveFgd` for the
    ``WORKLOAD_POLICIES`` (on ``tracker``, or a new one on ``gpu_unit``, ``None``: derived
    from ``gpu_capacities``), else the name itself."""
    if name not in WORKLOAD_POLICIES:
        return name
    return AdaptiveFgd(name, tracker or WorkloadTracker(gpu_unit, gpu_capacities=gpu_capacities))
