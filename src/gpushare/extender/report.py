"""The ``/inspect`` report: what is allocated on each GPU-share node, as plain JSON. Pure.

Keys follow Alibaba gpushare's ``pkg/scheduler/gpushare-inspect.go`` (``nodes``, ``name``,
``totalGPU``, ``usedGPU``, ``devs``, ``id``, ``pods``, ``namespace``, ``usedGPU``), so their
tooling keeps working, with gpushare's additions (``unit``, ``source``, per GPU ``model``,
``uuid``, ``healthy``; per pod ``containers`` and ``assumed``). Amounts are in the node's unit.
``violations`` lists broken ledger invariants (empty when all is well). ``gpushare`` is the
report that ``kubectl inspect gpushare -o json`` prints (``gpushare.inspect.render.report_json``),
built from the same nodes and pods the extender holds: per GPU allocated, assumed (bound but not
yet started by the device plugin) and free, health, pending GPU pods with the reason they fit
nowhere, and totals per unit.
"""

from __future__ import annotations

from typing import Any

from gpushare.extender.state import ExtenderState
from gpushare.inspect.render import report_json
from gpushare.inspect.report import Report, Snapshot, build_report, narrow
from gpushare.kube.codec import NodeInfo


def shared_report(state: ExtenderState, node: str | None = None) -> Report:
    """The inspect report (``gpushare.inspect``) of what ``state`` holds, with the extender's
    own pins (they expire after its handshake timeout); of ``node`` alone when given."""
    nodes, pods = state.objects()
    names = [node] if node is not None else [info.node.name for info in state.nodes()]
    pending = {name: state.pending(name) for name in names}
    return build_report(Snapshot(nodes, pods), node=node, pending=pending)


def node_report(
    state: ExtenderState, info: NodeInfo, cluster: Report | None = None
) -> dict[str, Any]:
    """One node: its GPUs, what each holds and for which pods. Its ``gpushare`` report is
    narrowed from ``cluster`` (the report of the whole cluster) when given, else built for the
    node alone."""
    node = info.node
    used = state.ledger.state(node.name).gpu_used
    allocations = state.ledger.allocations(node.name)
    devs: list[dict[str, Any]] = []
    for position, gpu in enumerate(node.gpus):
        pods: list[dict[str, Any]] = []
        for allocation in allocations:
            amount = allocation.per_gpu().get(gpu.index, 0)
            if not amount:
                continue
            namespace, _, name = allocation.pod.partition("/")
            pods.append(
                {
                    "name": name,
                    "namespace": namespace,
                    "usedGPU": amount,
                    "assumed": state.ledger.is_assumed(allocation.pod),
                    "containers": [
                        c.container for c in allocation.containers if gpu.index in c.gpu_indices
                    ],
                }
            )
        devs.append(
            {
                "id": gpu.index,
                "model": gpu.model,
                "uuid": info.uuids[position] if position < len(info.uuids) else "",
                "healthy": gpu.healthy,
                "totalGPU": gpu.capacity,
                "usedGPU": used[position],
                "pods": pods,
            }
        )
    return {
        "name": node.name,
        "gpushare": report_json(
            narrow(cluster, node.name) if cluster is not None else shared_report(state, node.name)
        ),
        "unit": info.unit,
        "source": info.source,
        "totalGPU": sum(gpu.capacity for gpu in node.gpus),
        "usedGPU": sum(used),
        "devs": devs,
    }


def cluster_report(state: ExtenderState) -> dict[str, Any]:
    """Every GPU-share node (sorted by name) and the ledger's broken invariants. The inspect
    report is built once per request, each node's part narrowed from it."""
    cluster = shared_report(state)
    return {
        "nodes": [node_report(state, info, cluster) for info in state.nodes() if info.gpushare],
        "violations": [
            {
                "kind": str(v.kind),
                "node": v.node,
                "gpu": v.gpu_index,
                "used": v.used,
                "capacity": v.capacity,
                "pods": list(v.pods),
            }
            for v in state.ledger.check_invariants()
        ],
        "gpushare": report_json(cluster),
    }
