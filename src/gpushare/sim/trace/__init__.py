"""Load an openb trace (Alibaba cluster-trace-gpu-v2023) into core model objects.

A trace directory holds one node list, ``openb_node_list_gpu_node.csv``, and one or more pod lists,
``openb_pod_list_<workload>.csv`` (format: the trace's README in alibaba/clusterdata,
``cluster-trace-gpu-v2023``). Units are the
trace's own: CPU in milli-cores, memory in MiB, GPU in milli-GPU (1000 = one whole GPU), so every
node's GPUs have ``capacity == 1000``.

Every column is read as text and validated here, vectorised with polars, so that each problem is
reported with its exact position: the file, the 1-based line number (the header is line 1), the
column, the value received and what is accepted, e.g.::

    openb_pod_list_default.csv:17: column gpu_milli: value '1200' is out of range;
    accepted: an integer from 0 to 1000

(one line in the message, wrapped here).

Errors: every user error (missing file or directory, unknown workload, bad header, malformed row,
value out of range, duplicate name, undecodable text) raises one ``TraceError``, a ``ValueError``
listing the first ``MAX_REPORTED`` problems in line order and how many there are in all; an
underlying ``OSError`` or ``UnicodeDecodeError`` is chained as its cause. Nothing else escapes for
bad input.

Pod columns beyond the five the simulator reads (``gpu_spec`` aside) — ``qos``, ``pod_phase`` and
the three time columns — are accepted and ignored (time is not simulated: pods arrive one after
another and never leave; docs/simulator.md, "One run").
Blank lines are skipped (they keep their line numbers). A file with a ``"`` anywhere is parsed
with the standard ``csv`` quoting rules; openb files have none and take the faster path.
"""

from __future__ import annotations

from gpushare.sim.trace.constants import (
    EMBEDDED_WORKLOAD,
    GPU_CAPACITY_MILLI,
    MAX_GPUS_PER_NODE,
    MAX_GPUS_PER_POD,
    MAX_REPORTED,
    NODE_FILE,
    POD_FILE_PREFIX,
)
from gpushare.sim.trace.errors import TraceError, TraceProblem
from gpushare.sim.trace.loaders import (
    Trace,
    available_workloads,
    embedded_trace_dir,
    load_embedded_trace,
    load_nodes,
    load_pods,
    load_trace,
    pod_file,
)

__all__ = [
    "EMBEDDED_WORKLOAD",
    "GPU_CAPACITY_MILLI",
    "MAX_GPUS_PER_NODE",
    "MAX_GPUS_PER_POD",
    "MAX_REPORTED",
    "NODE_FILE",
    "POD_FILE_PREFIX",
    "Trace",
    "TraceError",
    "TraceProblem",
    "available_workloads",
    "embedded_trace_dir",
    "load_embedded_trace",
    "load_nodes",
    "load_pods",
    "load_trace",
    "pod_file",
]
