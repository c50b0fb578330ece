"""``kubectl inspect gpushare``'s report, pure: who holds which GPU and why a GPU pod is pending.

``build_report(Snapshot(nodes, pods))`` reads the cluster (plain JSON dicts, as the API server
returns them) into a ``Report`` (``gpushare.inspect.report``); ``render_summary``,
``render_detail`` and ``report_json`` print it as Alibaba's tables or as JSON
(``gpushare.inspect.render``). No I/O here: the kubectl plugin and the extender's ``/inspect``
read the API server and call these.
"""

from gpushare.inspect.render import render_detail, render_summary, report_json
from gpushare.inspect.report import (
    ContainerAsk,
    ContainerReport,
    GpuReport,
    NodeFit,
    NodeReport,
    PendingReport,
    PodReport,
    Report,
    Snapshot,
    UnitTotal,
    build_report,
)

__all__ = [
    "ContainerAsk",
    "ContainerReport",
    "GpuReport",
    "NodeFit",
    "NodeReport",
    "PendingReport",
    "PodReport",
    "Report",
    "Snapshot",
    "UnitTotal",
    "build_report",
    "render_detail",
    "render_summary",
    "report_json",
]
