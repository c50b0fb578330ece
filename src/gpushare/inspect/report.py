"""The inspect report: who holds which GPU, and why a GPU pod is pending. Pure; no I/O.

``build_report(Snapshot(nodes, pods))`` turns the cluster as the API server returns it (Node and
Pod objects as plain JSON dicts) into a ``Report``; ``gpushare.inspect.render`` prints it as
Alibaba's ``kubectl inspect gpushare`` tables or as JSON. Objects are read with
``gpushare.kube.codec`` (formats: its package docstring) and pending pods are checked with
``gpushare.core.handshake.handshake_fit``, the extender's own verdict (the fit under the
device-plugin handshake rule), so the reasons are the extender's.

* **Nodes**: GPU-share nodes (``NodeInfo.gpushare``: label ``gpushare=true`` and GPUs) and any
  node that holds GPU pods, sorted by name. The address is the ``InternalIP`` of
  ``status.addresses`` (``None`` when absent). The unit comes from the node's inventory; a node
  read through Alibaba's fallback (``aliyun.com/gpu-mem`` ÷ ``aliyun.com/gpu-count``) has unit
  ``None``: its amounts are as its capacity counts them, and the renderers say so.
* **Pods** (finished ones, ``Succeeded``/``Failed``, and those asking no GPU are skipped):

  - *bound with an allocation record* count on their GPUs; one whose
    ``ALIYUN_COM_GPU_MEM_ASSIGNED`` is not ``"true"`` is *starting*: the extender chose its GPUs
    but the device plugin has not started it yet (``GpuReport.assumed``, ``PodReport.assigned``;
    the field keeps the name of the JSON key);
  - *bound without a record* (bound around the extender) hold memory in kube-scheduler's count
    but no GPU: they count in the node's ``unplaced`` (Alibaba's ``PENDING(Allocated)``);
  - the records are counted as the extender counts them: each node's in a ledger
    (``gpushare.core.ledger``, through ``gpushare.core.skipped.record_bound``), in the order a
    restarted extender commits them (the API server lists pods by namespace, then name);
  - *bound with a record the ledger refuses* (over a GPU's memory or compute, beside a GPU held
    whole, on a GPU index the node lacks) *or that cannot be read* are *skipped pods*
    (``NodeReport.skipped``), charged as the extender charges them
    (``gpushare.core.skipped``): on the GPUs they name (every GPU for an index the node
    lacks), or the whole node blocked. The charges lower the GPUs' ``free`` and the fit of
    pending pods, not ``allocated``;
  - *not bound* are pending: ``handshake_fit`` on every GPU-share node (only the ``node`` given, if
    any) says why they do not fit, with the numbers, the GPUs held for preemptors of at least
    their priority counted (``gpushare.core.preemption.with_holds``, as the extender counts
    them).

* **Holds** (``Snapshot.holds``, from the extender's holds ConfigMap): the GPUs kept for a
  preemptor while its victims terminate (``HoldReport``: each victim running, terminating or
  gone); a pending pod that holds GPUs says it waits for its victims.

* **Amounts** are integers in the node's unit; totals are summed per unit (``UnitTotal``), since
  GiB and MiB nodes may share a cluster.
* **Problems**: an object the codec cannot read (``CodecError``), a pod on a node missing from
  the snapshot, a skipped pod (``SkippedPod.describe``: why, and what it is counted as): one
  line each, naming the object; the rest of the report is still built. No GPU is ever
  allocated above its capacity: the ledger refuses the record that would put it there.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpushare.core.affinity import NodeConstraints
from gpushare.core.ask import PodAsk
from gpushare.core.fit import FitResult, FitStatus
from gpushare.core.handshake import GPUSHARE_SCHEDULER, PendingPod, handshake_fit
from gpushare.core.ledger import Ledger
from gpushare.core.model import Allocation, NodeState, PodRequest
from gpushare.core.preemption import Hold, with_holds
from gpushare.core.resolve import NodeView, NotOnNode, on_node, resolve
from gpushare.core.serves import Serves
from gpushare.core.skipped import SkippedPod, charged, record_bound, unreadable
from gpushare.kube.codec import (
    CodecError,
    MemoryUnit,
    NodeInfo,
    alibaba_annotations,
    node_info,
    node_internal_ip,
    object_labels,
    object_name,
    phase_finished,
    pod_allocation,
    pod_deleting,
    pod_finished,
    pod_key,
    pod_node_name,
    pod_priority,
    pod_request,
)
from gpushare.kube.codec.affinity import pod_node_constraints
from gpushare.kube.codec.handshake import pending_pod
from gpushare.kube.codec.record import fast_pod_record
from gpushare.kube.codec.resolve import node_view

UNKNOWN_UNIT = "unit unknown"


def unit_label(unit: str | None) -> str:
    """``"GiB"``/``"MiB"``, or ``"unit unknown"`` for a node read through Alibaba's fallback."""
    return unit if unit is not None else UNKNOWN_UNIT


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The cluster as read from the API server: Node objects and the pods that ask
    ``aliyun.com/gpu-mem`` (all namespaces), each a plain JSON dict as the API returns it."""

    nodes: tuple[Mapping[str, Any], ...] = ()
    pods: tuple[Mapping[str, Any], ...] = ()
    holds: tuple[Hold, ...] = ()
    """The preemption holds (``gpushare.kube.codec.preemption.holds_of`` of the extender's
    holds ConfigMap)."""


@dataclass(frozen=True, slots=True)
class GpuReport:
    """One GPU. ``capacity``, ``allocated`` (every allocation recorded on it, starting pods'
    included), ``assumed`` (the part of ``allocated`` held by *starting* pods, which the device
    plugin has not started yet) and ``free`` are in the node's unit; ``free`` is what a new pod
    could get: 0 on an unhealthy GPU, never negative."""

    index: int
    model: str
    uuid: str
    capacity: int
    allocated: int
    assumed: int
    free: int
    healthy: bool
    compute_milli: int = 0
    """Compute held on it by pods that ask compute (thousandths of the GPU; docs/compute.md)."""
    whole: bool = False
    """Whether a pod holds it whole."""
    isolation: str = ""
    """How shares of it are held and shown, as a pod is told (``enforced (mps)``, ``view
    only``, ...: ``gpushare.core.isolation.Isolation.said``); ``""``: the inventory does not
    say."""


@dataclass(frozen=True, slots=True)
class ContainerReport:
    """What one container got: ``share`` units on each GPU index in ``gpus`` (empty for a pod
    bound without an allocation record), ``compute_milli`` of each (0: compute not asked),
    ``whole``: the GPUs held whole."""

    name: str
    gpus: tuple[int, ...]
    share: int
    compute_milli: int = 0
    whole: bool = False


@dataclass(frozen=True, slots=True)
class PodReport:
    """A pod on ``node``: ``gpus`` is ``(index, amount)`` per GPU it holds, by index (empty
    when it is bound without an allocation record: then ``total`` is what it asks);
    ``assigned`` is false while the device plugin has not started it (*starting*)."""

    namespace: str
    name: str
    node: str
    gpus: tuple[tuple[int, int], ...]
    containers: tuple[ContainerReport, ...]
    assigned: bool
    total: int
    isolation: str = ""
    """How its share is held: ``whole GPU``, or its (first) GPU's ``GpuReport.isolation``;
    ``""`` when unknown (not placed, or the inventory does not say)."""

    @property
    def placed(self) -> bool:
        """True when the pod holds GPUs (it has an allocation record)."""
        return bool(self.gpus)

    def amount(self, index: int) -> int:
        """Units the pod holds on GPU ``index`` (0 when none)."""
        return dict(self.gpus).get(index, 0)

    def compute_on(self, index: int) -> tuple[int, bool]:
        """(compute_milli, held whole) the pod holds on GPU ``index``."""
        milli, whole = 0, False
        for c in self.containers:
            if index in c.gpus:
                milli, whole = milli + c.compute_milli, whole or c.whole
        return milli, whole

    @property
    def two_dimensional(self) -> bool:
        """Whether a container holds compute or whole GPUs."""
        return any(c.compute_milli or c.whole for c in self.containers)


@dataclass(frozen=True, slots=True)
class NodeReport:
    """One node. ``gpushare`` is false (with ``refusal`` saying why) for a node that is not a
    GPU-share node but holds GPU pods. ``allocated`` sums the GPUs' ``allocated`` and
    ``unplaced`` (units of pods bound here without a GPU); ``assumed`` (held by starting pods)
    is part of it; ``total``
    sums capacities; all in ``unit`` (``None``: unknown, Alibaba's fallback, ``source``
    ``"capacity"``)."""

    name: str
    address: str | None
    unit: str | None
    source: str
    gpushare: bool
    refusal: str
    gpus: tuple[GpuReport, ...]
    pods: tuple[PodReport, ...]
    allocated: int
    assumed: int
    unplaced: int
    total: int
    skipped: tuple[SkippedPod, ...] = ()
    """Bound pods whose allocation names a GPU index the node lacks or cannot be read, by pod
    key, with what they are charged with (``gpushare.core.skipped``: the extender's rule).
    Their charges are not in the GPUs' ``allocated`` (no pod names those GPUs) but are in
    their ``free``, as the extender counts them."""
    serves: Serves = Serves.BOTH
    """The kinds of request the node serves (its inventory's ``serves``: docs/node-config.md)."""

    @property
    def healthy(self) -> bool:
        """True when every GPU is healthy."""
        return all(gpu.healthy for gpu in self.gpus)

    @property
    def two_dimensional(self) -> bool:
        """Whether a GPU holds compute or is held whole (compute is then shown)."""
        return any(gpu.compute_milli or gpu.whole for gpu in self.gpus)

    @property
    def unhealthy(self) -> int:
        """The capacity of the node's unhealthy GPUs, in ``unit``."""
        return sum(gpu.capacity for gpu in self.gpus if not gpu.healthy)


@dataclass(frozen=True, slots=True)
class ContainerAsk:
    """What one container of a pending pod asks: ``share`` units on each of ``count`` GPUs,
    of the ``models`` given (empty: any); ``basis``: what ``share`` counts when not the node's
    unit (``"MiB"``, ``"% of the GPU"``); ``compute_milli`` per GPU; ``whole``: whole GPUs."""

    name: str
    share: int
    count: int
    models: tuple[str, ...]
    basis: str = ""
    compute_milli: int = 0
    whole: bool = False


@dataclass(frozen=True, slots=True)
class NodeFit:
    """A pending pod against one node: the core's ``fit`` (``None`` when the node is not a
    GPU-share node: ``refusal`` says why) and ``text``, one line with the numbers and unit."""

    node: str
    unit: str | None
    fit: FitResult | None
    refusal: str
    text: str
    why: str = ""
    """The fixed reason when a GPU-share node refuses the pod before the fit (``fit`` is then
    ``None``): ``NotOnNode.why`` of ``gpushare.core.resolve.on_node``."""

    @property
    def status(self) -> str:
        """``"fits"``, ``"does-not-fit-now"`` or ``"can-never-fit"`` (``FitStatus`` values)."""
        return FitStatus.CAN_NEVER_FIT.value if self.fit is None else self.fit.status.value

    @property
    def reason(self) -> str:
        """The fixed reason text (``gpushare.core.fit.Reason``, or not a GPU-share node)."""
        if self.why:
            return self.why
        return "not a GPU-share node" if self.fit is None else str(self.fit.reason)


@dataclass(frozen=True, slots=True)
class VictimReport:
    """A victim of a hold: pod ``namespace/name`` and its ``state`` now: ``running``,
    ``terminating`` (being deleted) or ``gone``."""

    pod: str
    state: str


@dataclass(frozen=True, slots=True)
class HoldReport:
    """GPUs held on ``node`` for the preemptor ``pod`` (priority ``priority``) while its
    ``victims`` terminate: ``containers`` is what it is to get; ``evictor`` who evicts
    (``gpushare`` or ``kube-scheduler``); ``expires_in_s`` seconds left (negative: expired,
    about to be dropped)."""

    pod: str
    node: str
    priority: int
    containers: tuple[ContainerReport, ...]
    victims: tuple[VictimReport, ...]
    evictor: str
    expires_in_s: float

    def describe(self) -> str:
        """``GPU 0 (16) on node n1 for ns/p, waiting for ns/a (terminating), ns/b (running)``."""
        gpus = "; ".join(
            f"GPU {','.join(map(str, c.gpus))} ({'whole' if c.whole else c.share})"
            for c in self.containers
        )
        victims = ", ".join(f"{v.pod} ({v.state})" for v in self.victims) or "nobody"
        return f"{gpus} on node {self.node} for {self.pod}, waiting for {victims}"


@dataclass(frozen=True, slots=True)
class PendingReport:
    """A GPU pod not bound to a node: what it ``asks`` (``total`` units over its GPU
    containers, in the unit of whichever node takes it), why per node (``nodes``, by name) and
    ``reason``, one line summarising them; ``waiting``: the GPUs held for it while its victims
    terminate (it then waits for them, whatever the nodes say now)."""

    namespace: str
    name: str
    asks: tuple[ContainerAsk, ...]
    total: int
    nodes: tuple[NodeFit, ...]
    reason: str
    waiting: HoldReport | None = None


@dataclass(frozen=True, slots=True)
class BypassedPod:
    """A GPU pod bound to ``node`` without a GPU assignment: ``scheduler`` (its
    ``spec.schedulerName``) placed it without gpushare's extender, so it holds no GPU and the
    device plugin refuses to start it; ``use`` is the scheduler that calls the extender (the
    one most placed GPU pods name, other than ``scheduler``; the chart's ``gpushare-scheduler``
    when none)."""

    namespace: str
    name: str
    node: str
    scheduler: str
    use: str

    def describe(self) -> str:
        """One warning line naming the pod and what to do."""
        return (
            f"pod {self.namespace}/{self.name} on node {self.node} asks GPU memory but was "
            f"placed by scheduler {self.scheduler!r}, bypassing gpushare: it has no GPU and "
            f"will not start; set spec.schedulerName: {self.use} and recreate it"
        )


@dataclass(frozen=True, slots=True)
class UnitTotal:
    """Cluster totals over the nodes in one ``unit`` (``None``: unknown): ``allocated``,
    ``total`` and ``unhealthy`` (capacity of unhealthy GPUs) in that unit."""

    unit: str | None
    allocated: int
    total: int
    unhealthy: int
    nodes: int

    @property
    def percent(self) -> int:
        """``allocated`` as a whole percentage of ``total``, truncated (Alibaba's ``%d``)."""
        return self.allocated * 100 // self.total if self.total > 0 else 0

    @property
    def unhealthy_percent(self) -> int:
        """``unhealthy`` as a whole percentage of ``total``, truncated."""
        return self.unhealthy * 100 // self.total if self.total > 0 else 0


@dataclass(frozen=True, slots=True)
class Report:
    """The whole report: ``nodes`` by name, ``pending`` pods by namespace/name, ``totals`` per
    unit (GiB, MiB, then unknown; only units present), ``problems`` (one line per unreadable or
    inconsistent object) and the ``node`` filter it was built with (``None``: all nodes)."""

    nodes: tuple[NodeReport, ...]
    pending: tuple[PendingReport, ...]
    totals: tuple[UnitTotal, ...]
    problems: tuple[str, ...]
    node: str | None = None
    holds: tuple[HoldReport, ...] = ()
    """GPUs held for preemptors (on ``node`` only, when given), by preemptor."""
    bypassed: tuple[BypassedPod, ...] = ()
    """GPU pods bound without a GPU assignment (another scheduler placed them), by pod."""


# -- reading the snapshot ----------------------------------------------------------------------


def _line(error: Exception) -> str:
    return " ".join(str(error).split())


@dataclass(slots=True)
class _Book:
    """What the pods say about one node: (allocation, assigned) of placed pods, pods bound
    without a record, and pods whose allocation cannot be read (they block the node)."""

    placed: list[tuple[Allocation, bool]] = field(default_factory=list)
    unplaced: list[PodAsk] = field(default_factory=list)
    blocked: list[SkippedPod] = field(default_factory=list)
    reads: list[PodRead] = field(default_factory=list)
    """The reads it was made of, in order (what a kept node report is checked against)."""


@dataclass(frozen=True, slots=True)
class PodRead:
    """What one Pod object says for the report, read once (``read_pod``): ``bound`` node (or
    ``None``); ``finished``; for a GPU pod its ``request``, recorded ``allocation``
    (``None``: bound without a record, or not bound), the handshake pin it holds (``waiting``)
    and ``assigned`` (started by the device plugin); ``problem``: a line for
    ``Report.problems``; ``blocked``: the skipped pod an unreadable allocation makes. A pod
    that asks no GPU or cannot be read has no ``request``."""

    bound: str | None
    finished: bool = False
    request: PodAsk | None = None
    allocation: Allocation | None = None
    waiting: PendingPod | None = None
    assigned: bool = False
    problem: str | None = None
    blocked: SkippedPod | None = None
    priority: int = 0
    """``spec.priority`` of a pod not bound (the holds it must respect depend on it)."""
    scheduler: str = ""
    """``spec.schedulerName`` of a bound GPU pod (``default-scheduler`` when unset)."""
    constraints: NodeConstraints | None = None
    """The nodeSelector and required node affinity of a pod not bound that has any."""


def read_pod(obj: Mapping[str, Any]) -> PodRead:
    """``obj`` (a Pod as JSON) read as the extender reads it (``ExtenderState.observe_pod``).
    Never raises: what cannot be read is a ``problem`` (and, for a bound pod's allocation, a
    ``blocked`` skipped pod)."""
    spec, status = (obj.get("spec"), obj.get("status")) if type(obj) is dict else (None, None)
    if type(spec) is dict and type(status) is dict:  # plain JSON: no walk through _dig
        bound, phase = spec.get("nodeName"), status.get("phase")
        bound = bound if isinstance(bound, str) and bound else None
        finished = phase_finished(phase)
    else:
        bound, finished = pod_node_name(obj) or None, pod_finished(obj)
    if finished:
        return PodRead(bound, finished=True)
    record = fast_pod_record(obj)
    if record is not None:  # well-formed: read once; else each part below, for its error
        request = record.request
        if bound is None:
            return _unbound(obj, request)
        if not request.gpu_containers:
            return PodRead(bound)
        allocation = record.allocation
        return PodRead(
            bound, request=request, allocation=allocation,
            waiting=record.pending,
            assigned=allocation is not None and record.alibaba.assigned is True,
            scheduler=_scheduler(obj),
        )  # fmt: skip
    if bound is None:
        try:
            request = pod_request(obj)
        except CodecError as error:
            return PodRead(None, problem=_line(error))
        return _unbound(obj, request)
    try:
        key = pod_key(obj)
    except CodecError as error:
        return PodRead(bound, problem=_line(error))
    try:  # read as the extender reads a bound pod (ExtenderState.observe_pod)
        allocation = pod_allocation(obj)
        waiting = pending_pod(obj, allocation) if allocation is not None else None
    except CodecError as error:
        skipped = unreadable(key, bound, str(error))
        return PodRead(bound, problem=skipped.describe(), blocked=skipped)
    try:
        request = pod_request(obj)
        assigned = allocation is not None and alibaba_annotations(obj).assigned is True
    except CodecError as error:
        return PodRead(bound, problem=_line(error))
    if not request.gpu_containers:
        return PodRead(bound)
    return PodRead(
        bound, request=request, allocation=allocation, waiting=waiting, assigned=assigned,
        scheduler=_scheduler(obj),
    )  # fmt: skip


def _unbound(obj: Mapping[str, Any], request: PodAsk) -> PodRead:
    """The read of a pod not bound that asks ``request``: with its node constraints when it
    asks GPUs and has any (unreadable ones are a problem, and then not honoured)."""
    if not request.gpu_containers:
        return PodRead(None, priority=pod_priority(obj))
    try:
        constraints = pod_node_constraints(obj)
    except CodecError as error:
        return PodRead(None, request=request, priority=pod_priority(obj), problem=_line(error))
    return PodRead(
        None, request=request, priority=pod_priority(obj),
        constraints=constraints if constraints.any else None,
    )  # fmt: skip


DEFAULT_SCHEDULER = "default-scheduler"
"""kube-scheduler's profile for pods that name no ``schedulerName``."""


def _scheduler(obj: Mapping[str, Any]) -> str:
    """``spec.schedulerName`` of ``obj`` (``default-scheduler`` when unset)."""
    spec = obj.get("spec")
    name = spec.get("schedulerName") if isinstance(spec, Mapping) else None
    return name if isinstance(name, str) and name else DEFAULT_SCHEDULER


Read = TypeVar("Read")
NodeRead = tuple[NodeInfo, str | None] | str
"""A Node object read: its ``node_info`` and internal IP, or the problem line of a node that
cannot be read."""


def read_node(obj: Mapping[str, Any]) -> NodeRead:
    """``node_info`` and ``node_internal_ip`` of Node ``obj``, or why it cannot be read."""
    try:
        return node_info(obj), node_internal_ip(obj)
    except CodecError as error:
        return _line(error)


class SnapshotReader:
    """``read_pod`` and ``read_node`` with memory: an object read before is not read again.
    Objects are known by identity, so they must not change after they are read (the extender's
    state replaces a pod's or a node's dict on every change; one ``build_report`` call's
    snapshot never changes). Keep one reader across reports of the same source (the extender
    keeps one per app); each cluster-wide ``build_report`` forgets the objects its snapshot no
    longer holds."""

    def __init__(self) -> None:
        self._reads: dict[int, tuple[Mapping[str, Any], PodRead]] = {}
        self._nodes: dict[int, tuple[Mapping[str, Any], NodeRead]] = {}
        self._reports: dict[str, _KeptReport] = {}

    def node_report(
        self,
        name: str,
        node_read: NodeRead,
        book: _Book,
        pod_rows: bool,
        build: Callable[[], _KeptReport],
    ) -> _KeptReport:
        """The report of node ``name`` made of ``node_read`` and ``book``'s reads: the one kept
        from the last cluster-wide report when it was made of the very same reads (the node and
        its pods unchanged since: the reads are the remembered ones), else ``build()``'s, kept
        for the next."""
        kept = self._reports.get(name)
        if (
            kept is not None
            and kept.pod_rows == pod_rows
            and kept.node_read is node_read
            and len(kept.reads) == len(book.reads)
            and all(a is b for a, b in zip(kept.reads, book.reads, strict=True))
        ):
            return kept
        made = build()
        self._reports[name] = made
        return made

    def forget_reports_but(self, names: Iterable[str]) -> None:
        """Keep the node reports of ``names`` only (the nodes of the latest report)."""
        keep = set(names)
        self._reports = {n: r for n, r in self._reports.items() if n in keep}

    def read_nodes(self, nodes: Sequence[Mapping[str, Any]]) -> list[NodeRead]:
        """``read_node`` of each of ``nodes``, in order; only these are remembered after."""
        reads, self._nodes = _remembered(self._nodes, nodes, read_node)
        return reads

    def read_all(self, pods: Sequence[Mapping[str, Any]]) -> list[PodRead]:
        """``read_pod`` of each of ``pods``, in order; only these are remembered after."""
        reads, self._reads = _remembered(self._reads, pods, read_pod)
        return reads


def _remembered(
    known: dict[int, tuple[Mapping[str, Any], Read]],
    objects: Sequence[Mapping[str, Any]],
    read: Callable[[Mapping[str, Any]], Read],
) -> tuple[list[Read], dict[int, tuple[Mapping[str, Any], Read]]]:
    """``read`` of each of ``objects`` (the ``known`` read of the very same object when there
    is one), and what to remember now: these objects alone."""
    reads, kept = [], {}
    for obj in objects:
        entry = known.get(id(obj))
        if entry is None or entry[0] is not obj:
            entry = (obj, read(obj))
        kept[id(obj)] = entry
        reads.append(entry[1])
    return reads, kept


def build_report(
    snapshot: Snapshot,
    *,
    node: str | None = None,
    pending: Mapping[str, Sequence[PendingPod]] | None = None,
    reader: SnapshotReader | None = None,
    pod_rows: bool = True,
    now_s: float = 0.0,
) -> Report:
    """The report of ``snapshot`` (module doc); with ``node``, of that node alone (pending pods
    are then checked against it only; it is shown even when it is not a GPU-share node).
    Pending pods are checked with ``gpushare.core.handshake.handshake_fit``, the extender's own
    verdict: ``pending`` gives the pods that pin equal pods on each node (the extender passes
    its own, whose pins expire after its handshake timeout); by default they are read from the
    snapshot (every bound pod the device plugin has not started yet pins). ``reader``: a
    ``SnapshotReader`` kept from earlier reports of the same source, so that unchanged pods
    and nodes are not read again (a report of one ``node`` reads only that node, its pods and
    the unbound ones).
    ``pod_rows=False`` leaves every ``NodeReport.pods`` empty (the GPUs' and nodes' amounts are
    the same): the summary table shows no pod, so ``kubectl inspect gpushare`` skips building
    a row per pod (docs/extender.md, "``/inspect`` at scale"). ``now_s`` (seconds since the
    Unix epoch) says which holds have expired. Never raises on unreadable objects: they become
    ``Report.problems``."""
    problems: list[str] = []
    infos: dict[str, tuple[NodeInfo, str | None]] = {}
    node_reads: Iterable[NodeRead]
    if node is None:
        node_reads = (reader or SnapshotReader()).read_nodes(snapshot.nodes)
    else:  # the node alone, not remembered
        node_reads = (read_node(obj) for obj in snapshot.nodes if object_name(obj) == node)
    for node_read in node_reads:
        if isinstance(node_read, str):
            problems.append(node_read)
            continue
        if node_read[0].mismatch:
            problems.append(node_read[0].mismatch)
        infos[node_read[0].node.name] = node_read
    if node is not None and node not in infos and not problems:
        problems.append(f"node {node}: not found")

    books: dict[str, _Book] = {}
    pins: dict[str, list[PendingPod]] = {}
    unbound: list[tuple[str, PodAsk, int, NodeConstraints | None]] = []
    bypassed: list[tuple[str, str, str]] = []  # (pod key, node, scheduler)
    schedulers: Counter[str] = Counter()  # of the pods placed with an allocation record
    reads: Iterable[PodRead]
    if node is None:
        reads = (reader or SnapshotReader()).read_all(snapshot.pods)
    else:  # the node's pods and the unbound ones only, not remembered
        reads = (
            read_pod(obj) for obj in snapshot.pods if (pod_node_name(obj) or None) in (None, node)
        )
    for read in reads:
        if read.finished:
            continue
        if read.problem is not None:
            problems.append(read.problem)
        if read.bound is None:
            if read.request is not None:
                unbound.append((read.request.key, read.request, read.priority, read.constraints))
            continue
        book = books.setdefault(read.bound, _Book())
        book.reads.append(read)
        if read.blocked is not None:
            book.blocked.append(read.blocked)
        if read.request is None:
            continue
        if read.allocation is None:
            book.unplaced.append(read.request)
            bypassed.append((read.request.key, read.bound, read.scheduler))
        else:
            book.placed.append((read.allocation, read.assigned))
            schedulers[read.scheduler] += 1
        if read.waiting is not None and pending is None:
            pins.setdefault(read.bound, []).append(read.waiting)

    for name in sorted(set(books) - set(infos)):
        book = books[name]
        count = len(book.placed) + len(book.unplaced) + len(book.blocked)
        problems.append(f"node {name}: {count} GPU pod(s) bound to it; node missing or unreadable")
    nodes: list[NodeReport] = []
    states: dict[str, NodeState] = {}
    for name in sorted(infos):
        info, address = infos[name]
        book = books.get(name, _Book())
        if not (info.gpushare or book.placed or book.unplaced or book.blocked or name == node):
            continue
        if node is None and reader is not None:  # the cluster view, asked again and again

            def build(
                info: NodeInfo = info, address: str | None = address, book: _Book = book
            ) -> _KeptReport:
                lines: list[str] = []
                made, made_state = _node_report(info, address, book, lines, pod_rows)
                return _KeptReport(
                    infos[info.node.name], tuple(book.reads), pod_rows, made, made_state,
                    tuple(lines),
                )  # fmt: skip

            kept = reader.node_report(name, infos[name], book, pod_rows, build)
            report, state = kept.report, kept.state
            problems.extend(kept.problems)
        else:
            report, state = _node_report(info, address, book, problems, pod_rows)
        nodes.append(report)
        states[name] = state
    if node is None and reader is not None:
        reader.forget_reports_but(states)
    candidates = [n for n in nodes if n.gpushare or n.name == node]
    held: Mapping[str, Sequence[PendingPod]] = pins if pending is None else pending
    holds = [h for h in snapshot.holds if node is None or h.node == node]
    hold_reports = _hold_reports(holds, snapshot.pods, now_s)
    waiting = {h.pod: h for h in hold_reports}
    labels = _node_labels(snapshot.nodes) if any(item[3] for item in unbound) else {}
    pending_reports = [
        _pending_report(
            key, request, candidates, states, held,
            holding=_Holding(holds, priority, now_s, waiting.get(key)),
            constraints=constraints, labels=labels,
        )
        for key, request, priority, constraints in sorted(unbound, key=lambda item: item[0])
    ]  # fmt: skip
    bypassed_pods = tuple(
        BypassedPod(
            key.partition("/")[0], key.partition("/")[2], bound, scheduler,
            _scheduler_to_use(schedulers, scheduler),
        )
        for key, bound, scheduler in sorted(bypassed)
    )  # fmt: skip
    return Report(
        tuple(nodes), tuple(pending_reports), _totals(nodes), tuple(problems), node,
        tuple(hold_reports), bypassed_pods,
    )  # fmt: skip


def _scheduler_to_use(placed_by: Counter[str], bypassing: str) -> str:
    """The scheduler that calls gpushare's extender, for a pod ``bypassing`` it: the one most
    pods with an allocation record name, other than ``bypassing`` (a bound pod without a
    record was not placed through the extender), else the chart's ``gpushare-scheduler``."""
    for name, _ in placed_by.most_common():
        if name != bypassing:
            return name
    return GPUSHARE_SCHEDULER


def _node_labels(nodes: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, str]]:
    """Each node's labels by name (what nodeSelector and node affinity match)."""
    return {object_name(obj): object_labels(obj) for obj in nodes}


@dataclass(frozen=True, slots=True)
class _KeptReport:
    """A node's report and state as ``SnapshotReader`` keeps them, with what they were made
    of: the node's read, its pods' reads (compared by identity), ``pod_rows``, and the problem
    lines its making added."""

    node_read: NodeRead
    reads: tuple[PodRead, ...]
    pod_rows: bool
    report: NodeReport
    state: NodeState
    problems: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class _Holding:
    """The holds a pending pod of ``priority`` must respect at ``now_s``, and its own."""

    holds: Sequence[Hold]
    priority: int
    now_s: float
    own: HoldReport | None


def _hold_reports(
    holds: Sequence[Hold], pods: Sequence[Mapping[str, Any]], now_s: float
) -> list[HoldReport]:
    """Each hold with its victims' state now (from the snapshot's pods)."""
    if not holds:
        return []
    deleting: dict[str, bool] = {}
    for obj in pods:
        try:
            deleting[pod_key(obj)] = pod_deleting(obj)
        except CodecError:
            continue
    reports = []
    for hold in sorted(holds, key=lambda h: h.pod):
        victims = tuple(
            VictimReport(
                v,
                "gone" if v not in deleting else "terminating" if deleting[v] else "running",
            )
            for v in hold.victims
        )
        containers = tuple(
            ContainerReport(c.container, c.gpu_indices, c.gpu_share, c.compute_milli, c.exclusive)
            for c in hold.containers
        )
        reports.append(
            HoldReport(
                hold.pod, hold.node, hold.priority, containers, victims, hold.evictor,
                hold.expires_s - now_s,
            )
        )  # fmt: skip
    return reports


def _node_report(
    info: NodeInfo, address: str | None, book: _Book, problems: list[str], pod_rows: bool
) -> tuple[NodeReport, NodeState]:
    """The report of node ``info`` and its state as the extender counts it: the placed pods'
    allocations recorded in a ledger of the node (``gpushare.core.skipped.record_bound``), in
    the order a restarted extender commits them (the API server lists pods by namespace, then
    name); one the ledger refuses is a skipped pod, charged and named in ``problems``."""
    gpus = info.node.gpus
    position = {gpu.index: i for i, gpu in enumerate(gpus)}
    said = [i.said() if i is not None else "" for i in info.isolation] or [""] * len(gpus)
    assumed = [0] * len(gpus)
    pods: list[PodReport] = []
    skipped = list(book.blocked)
    ledger = Ledger(clock=_no_clock, assume_ttl_s=0.0)  # committed records only: no clock
    ledger.upsert_node(info.node)
    for allocation, assigned in sorted(book.placed, key=lambda entry: entry[0].pod):
        refusal = record_bound(ledger, allocation, info.node)
        if refusal is not None:
            skipped.append(refusal)
            problems.append(refusal.describe())
            continue
        per_gpu = allocation.per_gpu()
        if not assigned:
            for index, amount in per_gpu.items():
                assumed[position[index]] += amount
        if not pod_rows:
            continue
        namespace, _, pod_name = allocation.pod.partition("/")
        pods.append(
            PodReport(
                namespace, pod_name, info.node.name, tuple(sorted(per_gpu.items())),
                tuple([ContainerReport(c.container, c.gpu_indices, c.gpu_share,
                                       c.compute_milli, c.exclusive)
                       for c in allocation.containers]),
                assigned, sum(per_gpu.values()),
                _pod_isolation(allocation, said, position),
            )
        )  # fmt: skip
    recorded = ledger.state(info.node.name)
    used = recorded.gpu_used
    compute = recorded.gpu_compute_used or (0,) * len(gpus)
    whole = recorded.gpu_whole or (False,) * len(gpus)
    unplaced = 0
    for asked in sorted(book.unplaced, key=lambda r: r.key) if pod_rows else book.unplaced:
        resolved = resolve(asked, node_view(info))
        request = resolved if isinstance(resolved, PodRequest) else asked
        unplaced += request.gpu_total
        if not pod_rows:
            continue
        namespace, _, pod_name = request.key.partition("/")
        containers = tuple(ContainerReport(c.name, (), c.gpu_share) for c in request.gpu_containers)
        pods.append(
            PodReport(namespace, pod_name, info.node.name, (), containers, False, request.gpu_total)
        )
    state = charged(recorded, skipped)  # the extender's rule
    reports = []
    for i, gpu in enumerate(gpus):
        uuid = info.uuids[i] if i < len(info.uuids) else ""
        reports.append(
            GpuReport(gpu.index, gpu.model, uuid, gpu.capacity, used[i], assumed[i],
                      max(state.gpu_free[i], 0), gpu.healthy, compute[i], whole[i], said[i])
        )  # fmt: skip
    pods.sort(key=lambda p: (p.namespace, p.name))
    report = NodeReport(
        info.node.name, address, info.unit, info.source, info.gpushare, info.refusal,
        tuple(reports), tuple(pods), sum(used) + unplaced, sum(assumed), unplaced,
        sum(gpu.capacity for gpu in gpus), tuple(sorted(skipped, key=lambda p: p.pod)),
        info.serves,
    )  # fmt: skip
    return report, state


def _pod_isolation(allocation: Allocation, said: list[str], position: dict[int, int]) -> str:
    """``PodReport.isolation`` of a placed pod (``said``: per GPU position); ``""`` on a node
    whose inventory says nothing of it."""
    if not any(said):
        return ""
    if any(c.exclusive for c in allocation.containers):
        return "whole GPU"
    indices = sorted(allocation.per_gpu())
    return said[position[indices[0]]] if indices else ""


def _no_clock() -> float:
    """The clock of a report's ledger, which records no assumed allocation to expire."""
    return 0.0


def _pending_report(
    key: str,
    request: PodAsk,
    candidates: list[NodeReport],
    states: Mapping[str, NodeState],
    pending: Mapping[str, Sequence[PendingPod]],
    *,
    holding: _Holding,
    constraints: NodeConstraints | None = None,
    labels: Mapping[str, Mapping[str, str]] | None = None,
) -> PendingReport:
    fits = []
    for report in candidates:
        label = unit_label(report.unit)
        if constraints is not None and not constraints.allows(
            report.name, (labels or {}).get(report.name, {})
        ):
            refusal = f"the pod's {constraints.describe()} does not match the node"
            text = f"node {report.name}: {refusal}"
            fits.append(NodeFit(report.name, report.unit, None, refusal, text, NOT_ALLOWED))
            continue
        if not report.gpushare:
            text = f"node {report.name}: not a GPU-share node ({report.refusal})"
            fits.append(NodeFit(report.name, report.unit, None, report.refusal, text))
            continue
        state = states[report.name]
        if holding.holds:
            state = with_holds(
                state, holding.holds, pod=key, priority=holding.priority, now_s=holding.now_s
            )
        unit = None if report.unit is None else MemoryUnit(report.unit)
        uuids = tuple(gpu.uuid for gpu in report.gpus)
        view = NodeView(state.node, unit.mib if unit else None, report.serves, uuids)
        placed = on_node(request, view)  # the extender's rule
        if isinstance(placed, NotOnNode):
            text = f"node {report.name}: {placed.text}"
            fits.append(NodeFit(report.name, report.unit, None, placed.text, text, placed.why))
            continue
        result = handshake_fit(state, placed, pending.get(report.name, ()))
        text = f"node {report.name}: " + (
            "fits" if result.fits else f"{result.describe()} ({label})"
        )
        fits.append(NodeFit(report.name, report.unit, result, "", text))
    namespace, _, name = key.partition("/")
    asks = tuple(
        ContainerAsk(c.name, c.gpu_share, c.gpu_count, tuple(sorted(c.allowed_models)),
                     c.memory_basis, c.compute_milli, c.exclusive)
        for c in request.gpu_containers
    )  # fmt: skip
    reason = _summary(fits)
    if holding.own is not None:
        reason = f"waits for its victims: {holding.own.describe()} | {reason}"
    return PendingReport(namespace, name, asks, request.gpu_total, tuple(fits), reason, holding.own)


def _ruled_out_by(fits: list[NodeFit]) -> str:
    """What ruled nodes out, from their refusal (``the pod's nodeSelector does not match``)."""
    refusal = next(f.refusal for f in fits if f.why == NOT_ALLOWED)
    return refusal.removeprefix("the pod's ").removesuffix(" does not match the node")


def _names(nodes: list[str], limit: int = 3) -> str:
    shown = ", ".join(nodes[:limit])
    return shown if len(nodes) <= limit else f"{shown}, +{len(nodes) - limit} more"


NOT_ALLOWED = "not a node the pod may go to"
"""``NodeFit.why`` of a node the pod's nodeSelector or required node affinity rules out."""


def _summary(every: list[NodeFit]) -> str:
    """One line over the nodes the pod may go to (its nodeSelector and required node affinity
    honoured): the node's own text when one node was checked, else nodes grouped by reason."""
    fits = [f for f in every if f.why != NOT_ALLOWED]
    if len(fits) < len(every):
        ruled_out = len(every) - len(fits)
        scope = f"{ruled_out} of {len(every)} node(s) ruled out by {_ruled_out_by(every)}"
        if not fits:
            return f"fits nowhere it may go: {scope}, and no other GPU-share node"
        fitting = [f.node for f in fits if f.fit is not None and f.fit.fits]
        if not fitting:
            return f"fits nowhere it may go ({scope}): {_summary(fits)}"
        return f"{_summary(fits)} ({scope})"
    if not fits:
        return "no GPU-share node"
    fitting = [f.node for f in fits if f.fit is not None and f.fit.fits]
    if fitting:
        return (
            f"fits now on {len(fitting)} of {len(fits)} node(s) ({_names(fitting)}): "
            "kube-scheduler has not placed it yet, or another constraint holds it back"
        )
    if len(fits) == 1:
        return fits[0].text
    groups: dict[str, list[NodeFit]] = {}
    for fit in fits:
        groups.setdefault(fit.reason, []).append(fit)
    parts = []
    for reason, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        if len(members) == 1:
            parts.append(members[0].text)
            continue
        requested = {m.fit.requested for m in members if m.fit is not None}
        numbers = f"; requested {requested.pop()}" if len(requested) == 1 else ""
        parts.append(
            f"{reason} on {len(members)} nodes ({_names([m.node for m in members])}){numbers}"
        )
    return " | ".join(parts)


def _totals(nodes: list[NodeReport]) -> tuple[UnitTotal, ...]:
    groups = [[n for n in nodes if n.unit == unit] for unit in (*MemoryUnit, None)]
    return tuple(
        UnitTotal(members[0].unit, sum(n.allocated for n in members),
                  sum(n.total for n in members), sum(n.unhealthy for n in members), len(members))
        for members in groups if members
    )  # fmt: skip
