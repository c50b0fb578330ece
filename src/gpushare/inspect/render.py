"""Renderers of the inspect ``Report``: Alibaba's two tables, and JSON. Pure; no I/O.

The layout is Alibaba's ``kubectl inspect gpushare`` (``cmd/inspect/display.go`` of
AliyunContainerService/gpushare-device-plugin; sample output in gpushare-scheduler-extender's
``docs/userguide.md``), which operators read and scripts grep: the summary is ``NAME IPADDRESS
GPU0(Allocated/Total) ... GPU Memory(<unit>)`` with one ``allocated/total`` cell per GPU, a
``-----`` line, then ``Allocated/Total GPU Memory In Cluster:`` and ``a/b (p%)`` on the next
line; ``-d`` prints per node ``NAME:``/``IPADDRESS:``, a ``NAME NAMESPACE GPU0(Allocated) ...``
table of its pods, ``Allocated :  a (p%)`` and ``Total :  b``, a ``-----`` line, and at the end
``Allocated/Total GPU Memory In Cluster:  a/b (p%)``. Columns are separated as Go's
``tabwriter`` (padding 2, spaces) separates them; percentages are whole and truncated (``%d``
of the float), so 1/165 shows ``(0%)``. ``PENDING(Allocated)`` is Alibaba's column for units
of pods bound to a node without a GPU (``NodeReport.unplaced``); it appears only when there
are such pods.

Plain text rather than rich: the output is the same in a terminal, a pipe and a golden file,
and a fixed-width layout is all Alibaba's format needs.

Where gpushare differs, on purpose:

* nodes are sorted by name; trailing spaces are stripped; a ``-----`` line is as wide as the
  widest line above it (Alibaba: the length of the first row's raw text plus 20, or 10 with -d);
* a node without a given GPU index shows ``-`` (Alibaba: ``0/0``); GPU columns are the union
  of the nodes' indices, so nodes with different GPU counts or sparse indices line up;
* an unhealthy GPU shows ``4/16 (unhealthy)`` (summary) and an ``UNHEALTHY:`` line (detail),
  and ``Unhealthy/Total GPU Memory In Cluster:`` follows the cluster line when any GPU is;
* units: ``GPU Memory(GiB)`` when every node has the same unit; with several, the column is
  ``GPU Memory`` and each cell and cluster total carries its unit (``1/88 GiB``), one total line
  per unit; nodes read through Alibaba's fallback say ``unit unknown``; the detail adds ``UNIT:``;
* detail rows: one per pod with its amount on each GPU (a multi-GPU pod fills several cells),
  and for a pod with several GPU containers one ``  - <container>`` row per container below it;
  a ``STATE`` column (``assigned``: the device plugin has given its containers their GPUs;
  ``starting``: bound with its GPUs chosen, not yet started by the device plugin, Alibaba's
  "assumed, not assigned"; ``unplaced``: bound without a GPU) appears when a pod on the node
  is not assigned; an
  ``ISOLATION`` column (``enforced (mps)``, ``enforced (driver)``, ``advisory (library)``,
  ``view only``, ``none``, ``whole GPU``: docs/share-view.md) when the node's inventory says
  how its shares are held;
* compute (docs/compute.md): only when some pod holds compute or whole GPUs, GPU columns read
  ``GPU0(Allocated/Total,Compute)`` with cells ``8/16,50%`` (the compute held by pods that ask
  it, in % of the GPU) or ``16/16,whole``, and pod cells ``8,50%`` or ``16,whole``; pending
  pods' asks show ``7680MiB``, ``100%mem``, ``compute 50%``, ``2x whole``. A cluster where no
  pod asks compute reads exactly as before;
* sections Alibaba has not: pending GPU pods with the reason they do not fit (one line per pod
  in the summary, one per node checked with ``-d``), notes (nodes that are not GPU-share nodes
  but hold pods, unknown units) and problems (objects that could not be read).

``report_json`` is the same report as JSON (shape: its docstring).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushare.core.ask import MIB_BASIS
from gpushare.inspect.report import (
    BypassedPod,
    ContainerAsk,
    ContainerReport,
    GpuReport,
    HoldReport,
    NodeFit,
    NodeReport,
    PendingReport,
    PodReport,
    Report,
    UnitTotal,
    unit_label,
)

__all__ = ["render_detail", "render_pod", "render_summary", "report_json"]

PADDING = 2
CLUSTER_LINE = "Allocated/Total GPU Memory In Cluster:"
UNHEALTHY_LINE = "Unhealthy/Total GPU Memory In Cluster:"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as Go's ``tabwriter`` (padding 2, spaces) prints tab-terminated cells, stripped."""
    widths: list[int] = []
    for row in rows:
        for i, cell in enumerate(row):
            if i == len(widths):
                widths.append(0)
            widths[i] = max(widths[i], len(cell))
    return [
        "".join(cell.ljust(widths[i] + PADDING) for i, cell in enumerate(row)).rstrip()
        for row in rows
    ]


def _rule(lines: Sequence[str]) -> str:
    return "-" * max((len(line) for line in lines), default=0)


def _percent(part: int, whole: int) -> int:
    return part * 100 // whole if whole > 0 else 0


def _common_unit(report: Report) -> str | None:
    """The unit label shared by every node, or ``None`` when they differ (or there are none)."""
    labels = {unit_label(node.unit) for node in report.nodes}
    return labels.pop() if len(labels) == 1 else None


def _indices(report: Report) -> list[int]:
    return sorted({gpu.index for node in report.nodes for gpu in node.gpus})


def _cluster_values(totals: Sequence[UnitTotal], *, unhealthy: bool = False) -> list[str]:
    """``a/b (p%)`` per unit (with the unit when there are several); ``0/0 (0%)`` when empty."""
    if not totals:
        return ["0/0 (0%)"]
    values = []
    for total in totals:
        part = total.unhealthy if unhealthy else total.allocated
        percent = total.unhealthy_percent if unhealthy else total.percent
        unit = f" {unit_label(total.unit)}" if len(totals) > 1 else ""
        values.append(f"{part}/{total.total}{unit} ({percent}%)")
    return values


def _compute(milli: int, whole: bool) -> str:
    """``whole``, or the compute in % of the GPU (``50%``, ``2.5%``)."""
    return "whole" if whole else f"{milli / 10:g}%"


def _asks(pod: PendingReport) -> str:
    """``8``, ``2x4`` (4 on each of 2 GPUs), ``c0 2x4 + c1 2``; allowed models in brackets;
    dialects: ``7680MiB compute 50%``, ``100%mem``, ``2x whole``."""
    parts = []
    for ask in pod.asks:
        share = {"": str(ask.share), MIB_BASIS: f"{ask.share}MiB"}.get(
            ask.basis, f"{ask.share}%mem"
        )
        if ask.whole:
            share = " whole"
        amount = f"{ask.count}x{share}" if ask.count > 1 or ask.whole else share
        amount += f" compute {_compute(ask.compute_milli, False)}" if ask.compute_milli else ""
        models = f" [{','.join(ask.models)}]" if ask.models else ""
        name = f"{ask.name} " if len(pod.asks) > 1 else ""
        parts.append(f"{name}{amount}{models}")
    return " + ".join(parts)


def _notes(report: Report) -> list[str]:
    notes = []
    for node in report.nodes:
        if not node.gpushare:
            why = "; shown for the GPU pods bound to it" if node.pods else ""
            notes.append(f"node {node.name}: not a GPU-share node ({node.refusal}){why}")
        if node.unit is None and node.gpus:
            notes.append(
                f"node {node.name}: unit unknown (no gpushare.io/gpu-inventory annotation, an "
                "Alibaba device plugin): amounts as its aliyun.com/gpu-mem capacity counts them"
            )
    return notes


def _hold_lines(report: Report) -> list[str]:
    """The holds as a table: preemptor, node, GPUs, victims (with their state), time left."""
    if not report.holds:
        return []
    rows = [["PREEMPTOR", "PRIORITY", "NODE", "GPUS", "VICTIMS", "EVICTOR", "EXPIRES IN"]]
    for hold in report.holds:
        gpus = "; ".join(
            f"GPU{','.join(map(str, c.gpus))}:{'whole' if c.whole else c.share}"
            for c in hold.containers
        )
        victims = ", ".join(f"{v.pod} ({v.state})" for v in hold.victims) or "-"
        expires = f"{hold.expires_in_s:.0f}s" if hold.expires_in_s > 0 else "expired"
        rows.append([hold.pod, str(hold.priority), hold.node, gpus, victims, hold.evictor, expires])
    return _table(rows)


def _sections(report: Report, pending: list[str]) -> list[str]:
    lines: list[str] = []
    for title, body in (
        ("WARNING: GPU pods placed without gpushare's scheduler (no GPU assigned; the device "
         "plugin refuses to start them):", _bypassed_lines(report)),
        ("Pending GPU pods (not bound to a node):", pending),
        ("GPUs held for preemptors while their victims terminate:", _hold_lines(report)),
        ("Notes:", [f"  {note}" for note in _notes(report)]),
        ("Problems (objects that could not be read or do not add up):",
         [f"  {problem}" for problem in report.problems]),
    ):  # fmt: skip
        if body:
            lines += ["", title, *body]
    return lines


def _bypassed_lines(report: Report) -> list[str]:
    """One row per GPU pod bound without a GPU assignment, and what to do."""
    if not report.bypassed:
        return []
    rows = [["NAMESPACE", "NAME", "NODE", "SCHEDULER"]]
    rows += [[p.namespace, p.name, p.node, p.scheduler] for p in report.bypassed]
    uses = sorted({p.use for p in report.bypassed})
    hint = f"  set spec.schedulerName: {' or '.join(uses)} and recreate them"
    return [*_table(rows), hint]


def render_pod(report: Report, namespace: str, name: str, placement: str) -> str:
    """One pod (``--pod``): where it is and on which GPUs, why it went there (``placement``,
    the ``gpushare.io/placement`` annotation the extender wrote at bind; ``""`` when none), or
    why it waits, or the warning that it bypassed gpushare. ``KeyError`` when the report has
    no such GPU pod. Ends with a newline."""
    rows: list[list[str]] = [["POD:", f"{namespace}/{name}"]]
    placed = [
        (node, pod)
        for node in report.nodes
        for pod in node.pods
        if (pod.namespace, pod.name) == (namespace, name)
    ]
    pending = [p for p in report.pending if (p.namespace, p.name) == (namespace, name)]
    bypassed = [p for p in report.bypassed if (p.namespace, p.name) == (namespace, name)]
    if placed:
        node, pod = placed[0]
        rows.append(["NODE:", node.name])
        for c in pod.containers:
            where = f"GPU {','.join(map(str, c.gpus))}" if c.gpus else "no GPU"
            share = "whole" if c.whole else f"{c.share} {unit_label(node.unit)} each"
            rows.append(["CONTAINER:", f"{c.name}: {where} ({share})" if c.gpus else where])
        rows.append(["STATE:", "assigned" if pod.assigned else "assumed" if pod.placed else
                     "unplaced"])  # fmt: skip
    elif pending:
        rows += [["STATE:", "pending"], ["WAITS:", pending[0].reason]]
    else:
        raise KeyError(f"{namespace}/{name}")
    if bypassed:
        rows.append(["WARNING:", bypassed[0].describe()])
    if placement:
        rows.append(["WHY HERE:", placement])
    elif placed and not bypassed:
        rows.append(["WHY HERE:", "not recorded (bound before gpushare recorded placements)"])
    return "\n".join(_table(rows)) + "\n"


def render_summary(report: Report) -> str:
    """Alibaba's default view (module doc): one row per node, then the cluster totals, then
    pending pods, notes and problems. Ends with a newline."""
    indices = _indices(report)
    unit = _common_unit(report)
    unplaced = any(node.unplaced for node in report.nodes)
    compute = any(node.two_dimensional for node in report.nodes)
    column = "Allocated/Total,Compute" if compute else "Allocated/Total"
    header = ["NAME", "IPADDRESS", *(f"GPU{i}({column})" for i in indices)]
    header += ["PENDING(Allocated)"] if unplaced else []
    header.append(f"GPU Memory({unit})" if unit is not None else "GPU Memory")
    rows = [header]
    for node in report.nodes:
        gpus = {gpu.index: gpu for gpu in node.gpus}
        row = [node.name, node.address or "unknown"]
        for index in indices:
            gpu = gpus.get(index)
            cell = "-" if gpu is None else f"{gpu.allocated}/{gpu.capacity}"
            if gpu is not None and compute:
                cell += f",{_compute(gpu.compute_milli, gpu.whole)}"
            row.append(cell if gpu is None or gpu.healthy else f"{cell} (unhealthy)")
        row += [str(node.unplaced) if node.unplaced else ""] if unplaced else []
        memory = f"{node.allocated}/{node.total}"
        row.append(memory if unit is not None else f"{memory} {unit_label(node.unit)}")
        rows.append(row)
    lines = _table(rows)
    lines += [_rule(lines), CLUSTER_LINE, *_cluster_values(report.totals)]
    if any(total.unhealthy for total in report.totals):
        lines += [UNHEALTHY_LINE, *_cluster_values(report.totals, unhealthy=True)]
    pending = _table(
        [["NAMESPACE", "NAME", "GPU MEMORY", "REASON"]]
        + [[p.namespace, p.name, _asks(p), p.reason] for p in report.pending]
    )
    lines += _sections(report, pending if report.pending else [])
    return "\n".join(lines) + "\n"


def _pod_rows(node: NodeReport, pod: PodReport, state: bool, isolation: bool) -> list[list[str]]:
    indices = [gpu.index for gpu in node.gpus]
    row = [pod.name, pod.namespace, *(_pod_cell(pod, i, node.two_dimensional) for i in indices)]
    row += [str(pod.total) if not pod.placed else "0"] if node.unplaced else []
    if state:
        row.append("assigned" if pod.assigned else "starting" if pod.placed else "unplaced")
    if isolation:
        row.append(pod.isolation or "-")
    rows = [row]
    if len(pod.containers) > 1:
        for container in pod.containers:
            amounts = [str(container.share if i in container.gpus else 0) for i in indices]
            rows.append([f"  - {container.name}", "", *amounts])
    return rows


def _pod_cell(pod: PodReport, index: int, compute: bool) -> str:
    """The pod's amount on GPU ``index``; with ``compute``, ``8,50%`` or ``16,whole`` where it
    holds compute there."""
    amount = str(pod.amount(index))
    if compute and pod.two_dimensional:
        milli, whole = pod.compute_on(index)
        if milli or whole:
            amount += f",{_compute(milli, whole)}"
    return amount


def _node_block(node: NodeReport) -> list[str]:
    head = [["NAME:", node.name], ["IPADDRESS:", node.address or "unknown"]]
    head.append(["UNIT:", unit_label(node.unit)])
    unhealthy = [f"GPU{gpu.index}" for gpu in node.gpus if not gpu.healthy]
    if unhealthy:
        head.append(["UNHEALTHY:", ", ".join(unhealthy)])
    if not node.gpushare:
        head.append(["NOTE:", f"not a GPU-share node ({node.refusal})"])
    state = any(not pod.assigned for pod in node.pods)
    column = "Allocated,Compute" if node.two_dimensional else "Allocated"
    header = ["NAME", "NAMESPACE", *(f"GPU{gpu.index}({column})" for gpu in node.gpus)]
    header += ["PENDING(Allocated)"] if node.unplaced else []
    header += ["STATE"] if state else []
    isolation = any(pod.isolation for pod in node.pods)
    header += ["ISOLATION"] if isolation else []
    rows = [header]
    for pod in node.pods:
        rows += _pod_rows(node, pod, state, isolation)
    rows.append(["Allocated :", f"{node.allocated} ({_percent(node.allocated, node.total)}%)"])
    rows.append(["Total :", str(node.total)])
    table = _table(rows)
    return ["", *_table(head), "", *table, _rule(table)]


def _fit_lines(pod: PendingReport) -> list[str]:
    lines = [f"{pod.namespace}/{pod.name}  asks {_asks(pod)}"]
    if pod.waiting is not None:
        lines.append(f"  waits for its victims: {pod.waiting.describe()}")
    fits: Sequence[NodeFit] = pod.nodes
    lines += [f"  {fit.text}" for fit in fits] or ["  no GPU-share node"]
    return lines


def render_detail(report: Report) -> str:
    """Alibaba's ``-d`` view (module doc): per node its pods' allocation on each GPU and the
    node's totals, then the cluster totals, then pending pods with one reason line per node
    checked, notes and problems. Starts with an empty line, as Alibaba's; ends with a newline."""
    lines: list[str] = []
    for node in report.nodes:
        lines += _node_block(node)
    rows = [[CLUSTER_LINE, value] for value in _cluster_values(report.totals)]
    if any(total.unhealthy for total in report.totals):
        rows += [[UNHEALTHY_LINE, v] for v in _cluster_values(report.totals, unhealthy=True)]
    lines += ["", "", *_table(rows)]
    pending = [line for pod in report.pending for line in _fit_lines(pod)]
    lines += _sections(report, pending)
    return "\n".join(lines) + "\n"


# -- JSON ----------------------------------------------------------------------------------------


def _node_json(node: NodeReport) -> dict[str, Any]:
    return {
        "name": node.name,
        "address": node.address,
        "unit": node.unit,
        "source": node.source,
        "gpushare": node.gpushare,
        "refusal": node.refusal,
        "serves": str(node.serves),
        "healthy": node.healthy,
        "allocated": node.allocated,
        "assumed": node.assumed,
        "unplaced": node.unplaced,
        "unhealthy": node.unhealthy,
        "total": node.total,
        "gpus": [_gpu_json(gpu, compute=node.two_dimensional) for gpu in node.gpus],
        "pods": [
            _with(
                {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "assigned": pod.assigned,
                    "placed": pod.placed,
                    "total": pod.total,
                    "gpus": [{"index": index, "amount": amount} for index, amount in pod.gpus],
                    "containers": [_container_json(c) for c in pod.containers],
                },
                isolation=pod.isolation,
            )
            for pod in node.pods
        ],
    }


def _gpu_json(gpu: GpuReport, *, compute: bool) -> dict[str, Any]:
    data: dict[str, Any] = {
        "index": gpu.index,
        "model": gpu.model,
        "uuid": gpu.uuid,
        "healthy": gpu.healthy,
        "capacity": gpu.capacity,
        "allocated": gpu.allocated,
        "assumed": gpu.assumed,
        "free": gpu.free,
    }
    if compute:
        data["compute_milli"], data["whole"] = gpu.compute_milli, gpu.whole
    return _with(data, isolation=gpu.isolation)


def _with(data: dict[str, Any], **optional: object) -> dict[str, Any]:
    """``data`` with each of ``optional`` that is set (not 0, empty or false) added."""
    data.update((key, value) for key, value in optional.items() if value)
    return data


def _container_json(c: ContainerReport) -> dict[str, Any]:
    data: dict[str, Any] = {"name": c.name, "gpus": list(c.gpus), "share": c.share}
    return _with(data, compute_milli=c.compute_milli, whole=c.whole)


def _ask_json(a: ContainerAsk) -> dict[str, Any]:
    data: dict[str, Any] = {
        "container": a.name, "share": a.share, "count": a.count, "models": list(a.models),
    }  # fmt: skip
    return _with(data, basis=a.basis, compute_milli=a.compute_milli, whole=a.whole)


def _fit_json(fit: NodeFit) -> dict[str, Any]:
    result = fit.fit
    return {
        "node": fit.node,
        "unit": fit.unit,
        "status": fit.status,
        "reason": fit.reason,
        "container": None if result is None else result.container,
        "requested": None if result is None else result.requested,
        "available": None if result is None else result.available,
        "free_per_gpu": [] if result is None else [max(f, 0) for f in result.free_per_gpu],
        "capacity_per_gpu": [] if result is None else list(result.capacity_per_gpu),
        "text": fit.text,
    } | (
        {"compute_free_per_gpu": [max(f, 0) for f in result.compute_free_per_gpu]}
        if result is not None and result.compute_free_per_gpu
        else {}
    )


def report_json(report: Report) -> dict[str, Any]:
    """The report as JSON-ready data, keys in this order (amounts in the node's unit)::

        {"node": <filter or null>,
         "nodes": [{"name", "address" (InternalIP or null), "unit" ("GiB"|"MiB"|null),
                    "source", "gpushare", "refusal", "healthy", "allocated", "assumed",
                    "unplaced", "unhealthy", "total",
                    "gpus": [{"index", "model", "uuid", "healthy", "capacity", "allocated",
                              "assumed", "free"}],
                    "pods": [{"namespace", "name", "assigned", "placed", "total",
                              "gpus": [{"index", "amount"}],
                              "containers": [{"name", "gpus": [index], "share"}]}]}],
         "pending": [{"namespace", "name", "total", "reason",
                      "asks": [{"container", "share", "count", "models"}],
                      "nodes": [{"node", "unit", "status", "reason", "container",
                                 "requested", "available", "free_per_gpu",
                                 "capacity_per_gpu", "text"}]}],
         "totals": [{"unit", "allocated", "total", "percent", "unhealthy", "nodes"}],
         "problems": [str],
         "holds": [{"pod", "node", "priority", "evictor", "expiresInSeconds",
                    "containers": [...], "victims": [{"pod", "state"}]}],   (when any)
         "bypassed": [{"namespace", "name", "node", "scheduler", "use", "text"}]}
                                                                         (when any)

    ``assumed`` (per node and GPU; the key is kept for the scripts that read it) is the part of
    ``allocated`` held by *starting* pods, those whose ``assigned`` is false: bound with their
    GPUs chosen, not yet started by the device plugin (the table's ``STATE`` ``starting``).
    ``status`` is ``fits``/``does-not-fit-now``/``can-never-fit``; ``reason`` a fixed text
    (``gpushare.core.fit.Reason``); ``percent`` whole and truncated. Compute (docs/compute.md)
    adds keys only where there is some, so a cluster where no pod asks compute reads as
    before: each GPU's ``compute_milli`` and ``whole`` on a node where a GPU holds either; a
    container's ``compute_milli``/``whole`` when set; an ask's ``basis`` (``"MiB"``,
    ``"% of the GPU"``), ``compute_milli``, ``whole`` when set; a fit's
    ``compute_free_per_gpu`` when the pod asks compute or whole GPUs. A pending pod that
    holds GPUs (preemption) has ``waiting``, its hold as in ``holds``. Where the inventory
    says how shares are held (docs/share-view.md), each GPU and each placed pod has
    ``isolation`` (``"enforced (mps)"``, ``"view only"``, ``"whole GPU"``, ...).
    """
    return (
        {
            "node": report.node,
            "nodes": [_node_json(node) for node in report.nodes],
            "pending": [
                {
                    "namespace": pod.namespace,
                    "name": pod.name,
                    "total": pod.total,
                    "reason": pod.reason,
                    "asks": [_ask_json(a) for a in pod.asks],
                    "nodes": [_fit_json(fit) for fit in pod.nodes],
                }
                | ({"waiting": _hold_json(pod.waiting)} if pod.waiting is not None else {})
                for pod in report.pending
            ],
            "totals": [
                {
                    "unit": total.unit,
                    "allocated": total.allocated,
                    "total": total.total,
                    "percent": total.percent,
                    "unhealthy": total.unhealthy,
                    "nodes": total.nodes,
                }
                for total in report.totals
            ],
            "problems": list(report.problems),
        }
        | ({"holds": [_hold_json(hold) for hold in report.holds]} if report.holds else {})
        | (
            {"bypassed": [_bypassed_json(pod) for pod in report.bypassed]}
            if report.bypassed
            else {}
        )
    )


def _bypassed_json(pod: BypassedPod) -> dict[str, Any]:
    return {
        "namespace": pod.namespace,
        "name": pod.name,
        "node": pod.node,
        "scheduler": pod.scheduler,
        "use": pod.use,
        "text": pod.describe(),
    }


def _hold_json(hold: HoldReport) -> dict[str, Any]:
    return {
        "pod": hold.pod,
        "node": hold.node,
        "priority": hold.priority,
        "evictor": hold.evictor,
        "expiresInSeconds": round(hold.expires_in_s, 1),
        "containers": [_container_json(c) for c in hold.containers],
        "victims": [{"pod": v.pod, "state": v.state} for v in hold.victims],
    }
