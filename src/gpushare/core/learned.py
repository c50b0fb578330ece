"""FGD's target workload M learned online, from the GPU pods known so far: the rule the
extender follows (``gpushare.extender.workload.WorkloadTracker``, docs/extender.md,
"Decisions") and the simulator follows in a cluster-like run (``gpushare.sim.engine``).

``KnownPods`` keeps the request of every GPU pod known, by key (``PodRequest.key``), counts
the changes (a pod seen for the first time or with another request, a pod gone) and says when
M is due to be rebuilt by the count alone: at the first change while M does not come from pods
yet, then once ``refresh_changes`` changes gathered. ``rebuild`` is
``TargetWorkload.from_pods`` over the known pods (``coverage``: the paper's 95 % popularity
cut). The extender adds a time rule (``refresh_s``) and a placeholder M for when no GPU pod is
known; both are its own (a clock; a unit). ``node_local_context`` is the context the
extender builds its policies with on such an M. Pure: no clock, no I/O.
"""

from __future__ import annotations

from gpushare.core.fragmentation import TargetWorkload
from gpushare.core.model import PodRequest
from gpushare.core.policies.base import PolicyContext

LEARNING_POLICIES = frozenset({"fgd", "fgd-cpu", "fgd-spare"})
"""The policies whose scores depend on the target workload."""

REFRESH_CHANGES = 100
"""Changes to the known pods after which M is rebuilt (the extender's default)."""

COVERAGE = 0.95
"""``TargetWorkload.from_pods``'s popularity cut for a learned M (the paper's)."""


class KnownPods:
    """The GPU pods known and when M built from them is due (module doc)."""

    def __init__(self, *, refresh_changes: int = REFRESH_CHANGES, coverage: float = COVERAGE):
        if not 0.0 < coverage <= 1.0:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.refresh_changes = max(1, refresh_changes)
        self.coverage = coverage
        self._pods: dict[str, PodRequest] = {}
        self._changes = 0
        self.from_pods = False
        """True once ``rebuild`` built M from pods (until it finds none)."""

    @property
    def pods(self) -> int:
        """How many GPU pods are known."""
        return len(self._pods)

    @property
    def changes(self) -> int:
        """Changes since the last ``rebuild``."""
        return self._changes

    def observe(self, pod: PodRequest) -> None:
        """A pod's request (pending, scored, placed or bound); CPU-only pods are ignored."""
        if not pod.gpu_containers:
            return
        if self._pods.get(pod.key) != pod:
            self._pods[pod.key] = pod
            self._changes += 1

    def forget(self, key: str) -> None:
        """Pod ``key`` is gone (deleted, finished, or never placed)."""
        if self._pods.pop(key, None) is not None:
            self._changes += 1

    def due(self) -> bool:
        """True when M should be rebuilt by the count of changes (module doc)."""
        if self._changes == 0:
            return False
        return self._changes >= self.refresh_changes or not self.from_pods

    def rebuild(self) -> TargetWorkload | None:
        """M from the known pods now (``None`` when none is known: the caller's placeholder);
        the count of changes starts again."""
        self._changes = 0
        self.from_pods = bool(self._pods)
        if not self._pods:
            return None
        return TargetWorkload.from_pods(self._pods.values(), self.coverage)


def node_local_context(workload: TargetWorkload, gpu_unit: int) -> PolicyContext:
    """The ``PolicyContext`` of the extender's policies (``scoring.extender_policy``): M,
    ``gpu_unit`` (one whole GPU in node units) and the largest node taken as 8 such GPUs; no
    cluster and no task shapes, so ``fgd-cpu``/``fgd-spare`` reserve nothing (their rules that
    need the whole cluster are off), and the CPU normalisation is the default."""
    return PolicyContext(workload=workload, gpu_unit=gpu_unit, max_node_gpu=8 * gpu_unit)
