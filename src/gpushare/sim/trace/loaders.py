"""The public loaders: a trace directory (or one of its files) into core model objects."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpushare.core.model import ContainerRequest, Gpu, Node, PodRequest
from gpushare.sim.trace.constants import (
    EMBEDDED_WORKLOAD,
    GPU_CAPACITY_MILLI,
    NODE_FILE,
    POD_FILE_PREFIX,
)
from gpushare.sim.trace.errors import TraceError, TraceProblem
from gpushare.sim.trace.reading import _require_directory
from gpushare.sim.trace.schema import _NODE_SCHEMA, _POD_SCHEMA
from gpushare.sim.trace.validation import _node_checks, _pod_checks, _read_validated


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: the cluster and one workload, in file order.

    ``nodes`` come from ``node_path``, ``pods`` from ``pod_path`` (workload ``workload``).
    """

    nodes: tuple[Node, ...]
    pods: tuple[PodRequest, ...]
    workload: str
    node_path: Path
    pod_path: Path

    @property
    def gpu_capacity_milli(self) -> int:
        """Sum of all GPU capacities, in milli-GPU (6,212,000 for the openb GPU nodes)."""
        return sum(gpu.capacity for node in self.nodes for gpu in node.gpus)

    @property
    def gpu_request_milli(self) -> int:
        """Sum of all pods' GPU requests, in milli-GPU (num_gpu × gpu_milli per pod)."""
        return sum(pod.gpu_total for pod in self.pods)


def load_nodes(path: Path) -> list[Node]:
    """The nodes of an openb node list (columns ``sn,cpu_milli,memory_mib,gpu,model``).

    Each row becomes ``Node(name=sn, gpus=(Gpu(i, model, 1000) for i < gpu), cpu_milli,
    memory_mib)``, in file order. Accepted: unique non-empty ``sn``; ``cpu_milli`` and
    ``memory_mib`` integers >= 0; ``gpu`` from 0 to ``MAX_GPUS_PER_NODE``; a non-empty ``model``
    without ``|`` when ``gpu > 0`` (a CPU-only node may leave it empty).
    Raises ``TraceError`` naming file, line, column and value for any bad input.
    """
    frame = _read_validated(path, _NODE_SCHEMA, _node_checks)
    gpus_by_shape: dict[tuple[str, int], tuple[Gpu, ...]] = {}
    nodes: list[Node] = []
    for name, cpu, memory, count, model in zip(
        frame["sn"].to_list(),
        frame["_v_cpu_milli"].to_list(),
        frame["_v_memory_mib"].to_list(),
        frame["_v_gpu"].to_list(),
        frame["model"].to_list(),
        strict=True,
    ):
        gpus = gpus_by_shape.get((model, count))
        if gpus is None:
            gpus = tuple(
                Gpu(index=i, model=model, capacity=GPU_CAPACITY_MILLI) for i in range(count)
            )
            gpus_by_shape[(model, count)] = gpus
        nodes.append(Node(name=name, gpus=gpus, cpu_milli=cpu, memory_mib=memory))
    return nodes


GpuMilliAs = Literal["memory", "compute"]
"""How ``gpu_milli`` is read: as the memory share (the default) or as the compute share."""


def load_pods(path: Path, gpu_milli_as: GpuMilliAs = "memory") -> list[PodRequest]:
    """The pods of an openb pod list, in file order, one container ``"main"`` each.

    ``gpu_milli`` is a share of one GPU that openb's pods ask instead of memory (the trace has
    no GPU memory column). ``gpu_milli_as="memory"`` (the default) reads it as the memory share
    ``gpu_share`` (every GPU then has 1000 units of memory), ``"compute"`` as ``compute_milli``
    with no memory asked: the same one-dimensional problem, placed identically by ``fgd``
    and ``fgd-cpu`` (docs/compute.md, "openb: memory or compute").

    Columns ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` are required; ``gpu_spec``, ``qos``,
    ``pod_phase``, ``creation_time``, ``deletion_time`` and ``scheduled_time`` are optional (a
    missing ``gpu_spec`` means any model; the others are ignored). Each row becomes
    ``PodRequest(key=name, containers=(ContainerRequest("main", gpu_share=gpu_milli,
    gpu_count=num_gpu, allowed_models=frozenset(gpu_spec.split("|")))), cpu_milli, memory_mib)``;
    a CPU-only pod has ``gpu_share == gpu_count == 0``.

    Accepted: unique non-empty ``name``; ``cpu_milli``/``memory_mib`` integers >= 0; ``num_gpu``
    from 0 to ``MAX_GPUS_PER_POD``; ``gpu_milli`` from 0 to 1000, with ``gpu_milli == 0`` exactly
    when ``num_gpu == 0`` and ``gpu_milli == 1000`` when ``num_gpu > 1``; ``gpu_spec`` empty or
    model names separated by ``|``. Raises ``TraceError`` for any bad input.
    """
    frame = _read_validated(path, _POD_SCHEMA, _pod_checks)
    containers: dict[tuple[int, int, str], ContainerRequest] = {}
    pods: list[PodRequest] = []
    for name, cpu, memory, count, share, spec in zip(
        frame["name"].to_list(),
        frame["_v_cpu_milli"].to_list(),
        frame["_v_memory_mib"].to_list(),
        frame["_v_num_gpu"].to_list(),
        frame["_v_gpu_milli"].to_list(),
        frame["gpu_spec"].to_list(),
        strict=True,
    ):
        container = containers.get((share, count, spec))
        if container is None:
            models = frozenset(spec.split("|")) if spec else frozenset[str]()
            if gpu_milli_as == "compute":
                container = ContainerRequest(
                    name="main",
                    gpu_share=0,
                    gpu_count=count,
                    allowed_models=models,
                    compute_milli=share,
                )
            else:
                container = ContainerRequest(
                    name="main", gpu_share=share, gpu_count=count, allowed_models=models
                )
            containers[(share, count, spec)] = container
        pods.append(PodRequest(key=name, containers=(container,), cpu_milli=cpu, memory_mib=memory))
    return pods


def pod_file(trace_dir: Path, workload: str) -> Path:
    """The path of workload ``workload``'s pod list in ``trace_dir`` (whether or not it exists)."""
    return trace_dir / f"{POD_FILE_PREFIX}{workload}.csv"


def available_workloads(trace_dir: Path) -> list[str]:
    """Sorted workload names with a pod list in ``trace_dir`` (``default``, ``gpushare40``, ...).

    Raises ``TraceError`` when ``trace_dir`` does not exist or is not a directory.
    """
    _require_directory(trace_dir)
    try:
        entries = list(trace_dir.glob(f"{POD_FILE_PREFIX}*.csv"))
    except OSError as exc:
        raise TraceError(
            trace_dir, [TraceProblem(None, None, None, f"cannot be listed: {exc.strerror}")]
        ) from exc
    names = [p.name[len(POD_FILE_PREFIX) : -len(".csv")] for p in entries if p.is_file()]
    return sorted(name for name in names if name)


def load_trace(trace_dir: Path, workload: str) -> Trace:
    """Load ``<trace_dir>/openb_node_list_gpu_node.csv`` and ``openb_pod_list_<workload>.csv``.

    Raises ``TraceError`` when the directory or node list is missing, when ``workload`` has no
    pod list there (the message lists the available workloads), or for any bad row.
    """
    workloads = available_workloads(trace_dir)
    if workload not in workloads:
        accepted = "one of " + ", ".join(workloads) if workloads else "none: no pod lists here"
        raise TraceError(
            trace_dir,
            [
                TraceProblem(
                    None,
                    None,
                    None,
                    f"has no workload {workload!r} (no file {pod_file(trace_dir, workload).name})",
                    accepted,
                )
            ],
        )
    node_path = trace_dir / NODE_FILE
    pod_path = pod_file(trace_dir, workload)
    return Trace(
        nodes=tuple(load_nodes(node_path)),
        pods=tuple(load_pods(pod_path)),
        workload=workload,
        node_path=node_path,
        pod_path=pod_path,
    )


def embedded_trace_dir() -> Path:
    """The directory of the synthetic trace shipped in the package (``gpushare/sim/data``).

    It holds ``openb_node_list_gpu_node.csv`` and ``openb_pod_list_default.csv``, generated by
    ``bench/make_embedded_trace.py`` (no rows of the Alibaba trace). Raises ``RuntimeError`` if
    the package is installed somewhere that is not a plain directory (e.g. a zip file).
    """
    resource = importlib.resources.files("gpushare.sim").joinpath("data")
    if not isinstance(resource, Path):
        raise RuntimeError(f"gpushare.sim data is not a directory on disk: {resource}")
    return resource


def load_embedded_trace() -> Trace:
    """The shipped synthetic trace: ``load_trace(embedded_trace_dir(), EMBEDDED_WORKLOAD)``."""
    return load_trace(embedded_trace_dir(), EMBEDDED_WORKLOAD)
