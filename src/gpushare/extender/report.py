"""The ``/inspect`` report: what is allocated on each GPU-share node, as plain JSON. Pure.

Keys follow Alibaba gpushare's ``pkg/scheduler/gpushare-inspect.go`` (``nodes``, ``name``,
``totalGPU``, ``usedGPU``, ``devs``, ``id``, ``pods``, ``namespace``, ``usedGPU``), so their
tooling keeps working, with gpushare's additions (``unit``, ``source``, per GPU ``model``,
``uuid``, ``healthy``; per pod ``containers`` and ``bindInFlight``: bound by this extender, not
yet seen bound by its watch, the ledger's *assumed*; the ``gpushare`` report's ``assumed`` key
is the memory of *starting* pods, bound but not yet started by the device plugin, Alibaba's
"assumed, not assigned"). Amounts are in the node's unit.
Compute (docs/compute.md) adds keys only where there is some: per GPU ``compute`` (thousandths
held by pods that ask compute) and ``whole`` on a node where a GPU holds either, per pod
``compute`` and ``whole`` when it holds them there.
``violations`` lists broken ledger invariants (empty when all is well) and what the *skipped*
pods break (``ExtenderState``, "Skipped pods": bound pods the ledger could not record: over
capacity counting them, a GPU index the node lacks, an allocation that cannot be read);
``skipped`` lists those pods with what they are counted as, per node too (``blocked``: pods
that block the whole node); per GPU ``usedGPU`` includes their charges and ``pods`` names them
(``skipped``: why). ``gpushare`` is the
report that ``kubectl inspect gpushare -o json`` prints (``gpushare.inspect.render.report_json``),
built from the same nodes and pods the extender holds: per GPU allocated, ``assumed`` (held by
starting pods: bound but not yet started by the device plugin) and free, health, pending GPU
pods with the reason they fit nowhere, and totals per unit. The cluster view (``/inspect``)
carries it once, for the whole cluster; ``/inspect/<node>`` carries the node's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushare.core.ledger import ViolationKind
from gpushare.core.preemption import Hold
from gpushare.core.skipped import SkipKind, SkippedPod
from gpushare.extender.state import ExtenderState
from gpushare.inspect.render import report_json
from gpushare.inspect.report import Report, Snapshot, SnapshotReader, build_report
from gpushare.kube.codec import NodeInfo


def shared_report(
    state: ExtenderState,
    node: str | None = None,
    reader: SnapshotReader | None = None,
    *,
    holds: Sequence[Hold] = (),
    now_s: float = 0.0,
) -> Report:
    """The inspect report (``gpushare.inspect``) of what ``state`` holds, with the extender's
    own pins (they expire after its handshake timeout) and its preemption ``holds`` (timed
    against ``now_s``, seconds since the epoch); of ``node`` alone when given.
    ``reader``: the ``SnapshotReader`` kept between requests (objects unchanged since are not read
    again)."""
    nodes, pods = state.cluster.objects()
    names = [node] if node is not None else [info.node.name for info in state.cluster.nodes()]
    pending = {name: state.reservations.pending(name) for name in names}
    return build_report(
        Snapshot(nodes, pods, tuple(holds)), node=node, pending=pending, reader=reader,
        now_s=now_s,
    )  # fmt: skip


def node_report(
    state: ExtenderState,
    info: NodeInfo,
    *,
    shared: bool = True,
    holds: Sequence[Hold] = (),
    now_s: float = 0.0,
) -> dict[str, Any]:
    """One node: its GPUs, what each holds and for which pods; with ``shared``, also its
    ``gpushare`` report (``shared_report`` of the node alone). The cluster view leaves it out:
    it carries the whole cluster's ``gpushare`` report once."""
    node = info.node
    used = state.reservations.used_with_skipped(node.name)
    allocations = state.reservations.allocations(node.name)
    skipped = state.reservations.skipped(node.name)
    holders: dict[int, list[dict[str, Any]]] = {gpu.index: [] for gpu in node.gpus}
    for pod in skipped:
        for index, amount in pod.charges:
            if amount and index in holders:
                namespace, _, name = pod.pod.partition("/")
                holders[index].append(
                    {"name": name, "namespace": namespace, "usedGPU": amount, "bindInFlight": False,
                     "containers": [], "skipped": str(pod.kind)}
                )  # fmt: skip
    for allocation in allocations:  # each read once, not once per GPU
        namespace, _, name = allocation.pod.partition("/")
        in_flight = state.reservations.is_assumed(allocation.pod)
        compute, whole = allocation.per_gpu_compute(), allocation.whole_gpus()
        for index, amount in allocation.per_gpu().items():
            if amount and index in holders:
                entry = {"name": name, "namespace": namespace, "usedGPU": amount,
                         "bindInFlight": in_flight, "containers": [
                             c.container for c in allocation.containers
                             if index in c.gpu_indices]}  # fmt: skip
                if compute.get(index):
                    entry["compute"] = compute[index]
                if index in whole:
                    entry["whole"] = True
                holders[index].append(entry)
    devs: list[dict[str, Any]] = []
    recorded = state.reservations.ledger_state(node.name)
    two_dimensional = any(recorded.gpu_compute_used) or any(recorded.gpu_whole)
    for position, gpu in enumerate(node.gpus):
        dev: dict[str, Any] = {
            "id": gpu.index,
            "model": gpu.model,
            "uuid": info.uuids[position] if position < len(info.uuids) else "",
            "healthy": gpu.healthy,
            "totalGPU": gpu.capacity,
            "usedGPU": used[position],
        }
        if two_dimensional:
            dev["compute"] = recorded.gpu_compute_used[position]
            dev["whole"] = recorded.gpu_whole[position]
        devs.append(dev | {"pods": holders[gpu.index]})
    result: dict[str, Any] = {"name": node.name}
    if shared:
        result["gpushare"] = report_json(shared_report(state, node.name, holds=holds, now_s=now_s))
    return result | {
        "unit": info.unit,
        "source": info.source,
        "totalGPU": sum(gpu.capacity for gpu in node.gpus),
        "usedGPU": sum(used),
        "devs": devs,
        "blocked": [pod.pod for pod in skipped if pod.whole_node],
        "skipped": [skipped_json(pod) for pod in skipped],
    }


def skipped_json(pod: SkippedPod) -> dict[str, Any]:
    """One skipped pod (``ExtenderState``, "Skipped pods") as JSON."""
    return {
        "pod": pod.pod,
        "node": pod.node,
        "kind": str(pod.kind),
        "reason": pod.reason,
        "wholeNode": pod.whole_node,
        "charges": [{"gpu": index, "amount": amount} for index, amount in pod.charges],
        **(
            {"compute": [{"gpu": i, "compute_milli": m} for i, m in pod.compute_charges]}
            if pod.compute_charges
            else {}
        ),
        "text": pod.describe(),
    }


def violations(state: ExtenderState) -> list[dict[str, Any]]:
    """The ledger's broken invariants, with what the skipped pods break: a GPU over capacity
    counting the pods that name it (as ``gpushare inspect`` counts; the conservative spread of a
    pod on a missing GPU index over every GPU is in ``usedGPU``, not here), a GPU index a node
    lacks, an allocation that cannot be read. Sorted by node, then GPU (``None`` last)."""
    found: dict[tuple[str, int | None, str], dict[str, Any]] = {}
    for v in state.reservations.ledger_violations():
        found[(v.node, v.gpu_index, str(v.kind))] = {
            "kind": str(v.kind), "node": v.node, "gpu": v.gpu_index, "used": v.used,
            "capacity": v.capacity, "pods": list(v.pods),
        }  # fmt: skip
    over = str(ViolationKind.OVER_CAPACITY)
    for name in sorted({pod.node for pod in state.reservations.skipped()}):
        info = state.cluster.node(name)
        gpus = info.node.gpus if info is not None else ()
        ledger_used = state.reservations.ledger_state(name).gpu_used if info is not None else ()
        named = [p for p in state.reservations.skipped(name) if p.kind is SkipKind.OVER_CAPACITY]
        for position, gpu in enumerate(gpus):
            naming = [p.pod for p in named if dict(p.charges).get(gpu.index)]
            total = ledger_used[position] + sum(dict(p.charges).get(gpu.index, 0) for p in named)
            if total <= gpu.capacity:
                continue
            holders = {
                a.pod for a in state.reservations.allocations(name) if gpu.index in a.per_gpu()
            }
            holders |= set(naming)
            found[(name, gpu.index, over)] = {
                "kind": over, "node": name, "gpu": gpu.index, "used": total,
                "capacity": gpu.capacity, "pods": sorted(holders),
            }  # fmt: skip
    for pod in state.reservations.skipped():
        if pod.kind is SkipKind.UNREADABLE:
            found[(pod.node, None, pod.pod)] = {
                "kind": str(pod.kind), "node": pod.node, "gpu": None, "used": 0, "capacity": 0,
                "pods": [pod.pod],
            }  # fmt: skip
        for index, amount in pod.missing:
            kind = str(ViolationKind.UNKNOWN_GPU)
            entry = found.setdefault(
                (pod.node, index, kind),
                {"kind": kind, "node": pod.node, "gpu": index, "used": 0, "capacity": 0,
                 "pods": []},
            )  # fmt: skip
            entry["used"] += amount
            entry["pods"] = sorted({*entry["pods"], pod.pod})
    return [
        found[key] for key in sorted(found, key=lambda k: (k[0], k[1] is None, k[1] or 0, k[2]))
    ]


def cluster_report(
    state: ExtenderState,
    reader: SnapshotReader | None = None,
    *,
    holds: Sequence[Hold] = (),
    now_s: float = 0.0,
) -> dict[str, Any]:
    """Every GPU-share node (sorted by name, without a ``gpushare`` report each), the ledger's
    broken invariants, and the inspect report of the whole cluster (``gpushare``, with the
    preemption ``holds``), built once per request (``reader``: as in ``shared_report``)."""
    cluster = shared_report(state, reader=reader, holds=holds, now_s=now_s)
    return {
        "nodes": [
            node_report(state, info, shared=False)
            for info in state.cluster.nodes()
            if info.gpushare
        ],
        "violations": violations(state),
        "skipped": [skipped_json(pod) for pod in state.reservations.skipped()],
        "gpushare": report_json(cluster),
    }
