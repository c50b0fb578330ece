"""The device plugin's Prometheus metrics, served on their own port, from their own registry.

Series (Prometheus naming: snake case, ``_total`` counters, units in the names). Every series
carries ``node``, the plugin's node, so that they join the extender's per-GPU series
(``gpushare.extender.metrics``) on ``node`` and ``gpu``:

================================================  =========  ================  ===================
series                                            type       labels            meaning
================================================  =========  ================  ===================
gpushare_device_plugin_gpu_memory_capacity_bytes  gauge      node, gpu, uuid,  the GPU's memory
                                                             model             (inventory)
gpushare_device_plugin_gpu_healthy                gauge      node, gpu, uuid,  1 healthy, 0 not
                                                             model             (ListAndWatch)
gpushare_device_plugin_allocate_requests_total    counter    node, outcome     Allocate calls;
                                                                               outcome ok,
                                                                               rejected (a gRPC
                                                                               error: no pending
                                                                               pod matches,
                                                                               ambiguous, record
                                                                               refused), error
                                                                               (a bug)
gpushare_device_plugin_allocate_duration_seconds  histogram  node              time to answer
                                                                               Allocate, 1 ms to
                                                                               10 s buckets
gpushare_device_plugin_registrations_total        counter    node              registrations with
                                                                               kubelet (1 + its
                                                                               restarts)
gpushare_device_plugin_nvml_errors_total          counter    node              NVML queries failed
                                                                               in scrapes (NVML)
gpushare_device_plugin_node_config_invalid        gauge      node              1 while the node
                                                                               config cannot be
                                                                               read
                                                                               (``deviceplugin.
                                                                               nodeconfig``)
gpushare_device_plugin_node_config_deferred       gauge      node              1 while a node
                                                                               config waits for
                                                                               pods
gpushare_device_plugin_mps_daemon_up              gauge      node              1 while the managed
                                                                               MPS control daemon
                                                                               answers (only with
                                                                               ``--mps-managed``)
gpushare_gpu_memory_used_bytes                    gauge      node, gpu, uuid   used memory (NVML)
gpushare_gpu_utilization_ratio                    gauge      node, gpu, uuid   share of NVML's
                                                                               last sample period
                                                                               a kernel ran, 0-1
                                                                               (NVML)
gpushare_gpu_process_memory_used_bytes            gauge      node, gpu, uuid,  memory of one
                                                             pid, pod,         compute process on
                                                             namespace,        the GPU, with its
                                                             container         pod (NVML)
================================================  =========  ================  ===================

``gpu`` is the NVML index, ``uuid`` the NVML UUID, ``model`` the product name. Inventory and
NVML series are read at scrape time (a custom collector): nothing is kept in sync by hand.

**Processes to pods.** NVML reports each compute process by its PID in the host's PID
namespace. ``/proc/<pid>/cgroup`` names the pod's cgroup, which holds the pod UID and the
container ID (``pod_of_cgroup``: cgroup v1 and v2, cgroupfs and systemd drivers, containerd,
CRI-O and Docker); the pods of the node, indexed by UID (``pods_by_uid``), give namespace, name
and container name. Whatever cannot be resolved (a process outside Kubernetes, a pod the plugin
does not watch, a container that is not in the pod's status yet) has ``""`` labels. The plugin
must see the host's processes: ``hostPID: true`` in its DaemonSet, or the host's ``/proc``
mounted and passed as ``proc_root``. A process whose memory NVML cannot report
(``NVML_VALUE_NOT_AVAILABLE``) has no series.

**Serving.** ``serve_metrics`` uses prometheus-client's own WSGI server in a thread
(``start_http_server``) rather than an ASGI app on the plugin's event loop: that loop answers
kubelet's Allocate and ListAndWatch, and a scrape makes blocking calls (NVML, which can stall
for seconds on a failing GPU, and ``/proc`` reads) that must not hold it; it also installs no
signal handlers (uvicorn's would take SIGTERM from the daemon). The callables given to
``DevicePluginMetrics`` are therefore called from the server's thread: they must only read
(e.g. copy a list, as ``DevicePluginService.gpus`` does). The default port is
``DEFAULT_METRICS_PORT``, 9445: not the extender's (12345) nor a usual node agent's
(node-exporter 9100, NVIDIA's dcgm-exporter 9400).

No global default registry is used: each ``DevicePluginMetrics`` owns (or is given) its registry.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import Nvml, NvmlError
from gpushare.kube.codec import object_name, object_namespace, pod_container_names, pod_uid

__all__ = [
    "ALLOCATE_OUTCOMES",
    "DEFAULT_METRICS_HOST",
    "DEFAULT_METRICS_PORT",
    "DURATION_BUCKETS",
    "CgroupPod",
    "DevicePluginMetrics",
    "MetricsServer",
    "PodContainers",
    "pod_of_cgroup",
    "pod_of_pid",
    "pods_by_uid",
    "serve_metrics",
]

log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9445
DEFAULT_METRICS_HOST = "0.0.0.0"
"""Every interface: Prometheus scrapes the plugin's pod from outside."""
ALLOCATE_OUTCOMES = ("ok", "rejected", "error")
# Allocate is ~10-20 ms (docs/deviceplugin.md, "Speed": an annotation patch round trip);
# a slow API server stretches it to seconds.
DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_GPU_LABELS = ["node", "gpu", "uuid", "model"]
_NVML_LABELS = ["node", "gpu", "uuid"]
_PROCESS_LABELS = ["node", "gpu", "uuid", "pid", "pod", "namespace", "container"]


# -- processes to pods --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupPod:
    """The pod a process runs in, from its cgroup: the pod UID (with dashes) and the container
    ID (``""`` when the process sits in the pod's own cgroup)."""

    pod_uid: str
    container_id: str = ""


_UID = (
    r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
    r"|[0-9a-f]{32}"  # a static pod's UID: a hash of its manifest
)
# cgroupfs: "pod<uid>"; systemd: "kubepods-<qos>-pod<uid with _>.slice"
_POD_SEGMENT = re.compile(rf"^(?:[a-z0-9_-]*-)?pod(?P<uid>{_UID})(?:\.slice)?$")
# cgroupfs: "<id>"; systemd: "cri-containerd-<id>.scope", "crio-<id>.scope", "docker-<id>.scope"
_CONTAINER_SEGMENT = re.compile(r"^(?:[a-z][a-z0-9-]*-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")


def pod_of_cgroup(text: str) -> CgroupPod | None:
    """The pod of a process from the text of its ``/proc/<pid>/cgroup``, or ``None``.

    Each line is ``hierarchy:controllers:path`` (v1) or ``0::path`` (v2); the path holds a
    ``kubepods`` segment, then the pod's segment (``pod<uid>`` with cgroupfs,
    ``kubepods-<qos>-pod<uid_with_underscores>.slice`` with systemd), then the container's
    (``<id>``, or ``<runtime>-<id>.scope``). The first line naming a container wins, else the
    first naming a pod. Pure.
    """
    found: CgroupPod | None = None
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3 or "kubepods" not in parts[2]:
            continue
        segments = parts[2].split("/")
        for position, segment in enumerate(segments):
            match = _POD_SEGMENT.match(segment)
            if match is None:
                continue
            uid = match["uid"].replace("_", "-")
            after = segments[position + 1] if position + 1 < len(segments) else ""
            container = _CONTAINER_SEGMENT.match(after)
            if container is not None:
                return CgroupPod(uid, container["id"])
            if found is None:
                found = CgroupPod(uid)
            break
    return found


def pod_of_pid(pid: int, proc_root: Path = Path("/proc")) -> CgroupPod | None:
    """``pod_of_cgroup`` of ``<proc_root>/<pid>/cgroup``; ``None`` when it cannot be read (the
    process is gone, or is not visible from here)."""
    try:
        text = (proc_root / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return pod_of_cgroup(text)


@dataclass(frozen=True, slots=True)
class PodContainers:
    """A pod of the node: namespace, name, and container names by container ID (the ID
    without its ``<runtime>://`` prefix)."""

    namespace: str
    name: str
    containers: Mapping[str, str] = field(default_factory=dict)


def pods_by_uid(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodContainers]:
    """Pod JSON objects (e.g. ``NodePods.pods()``) indexed by ``metadata.uid``; container IDs
    from ``status.containerStatuses`` (and init and ephemeral containers). Pods without a UID
    are left out."""
    index: dict[str, PodContainers] = {}
    for pod in pods:
        uid = pod_uid(pod)
        if uid:
            index[uid] = PodContainers(
                object_namespace(pod), object_name(pod), pod_container_names(pod)
            )
    return index


# -- the collector ------------------------------------------------------------------------------


class _StateCollector(Collector):
    """Inventory and NVML series, read at scrape time (module doc)."""

    def __init__(
        self,
        node: str,
        gpus: Callable[[], Sequence[PhysicalGpu]],
        *,
        nvml: Nvml | None,
        pods: Callable[[], Mapping[str, PodContainers]] | None,
        proc_root: Path,
        nvml_errors: Counter | None,
    ) -> None:
        self._node = node
        self._gpus = gpus
        self._nvml = nvml
        self._pods = pods
        self._proc_root = proc_root
        self._nvml_errors = nvml_errors

    def describe(self) -> Iterable[Metric]:
        return list(self._families())

    def collect(self) -> Iterable[Metric]:
        families = self._families()
        capacity, healthy = families[0], families[1]
        gpus = list(self._gpus())
        for gpu in gpus:
            labels = [self._node, str(gpu.index), gpu.uuid, gpu.model]
            capacity.add_metric(labels, float(gpu.memory_mib * 2**20))
            healthy.add_metric(labels, 1.0 if gpu.healthy else 0.0)
        if self._nvml is not None:
            self._collect_nvml(self._nvml, gpus, *families[2:])
        return list(families)

    def _failed(self, gpu: PhysicalGpu, what: str, error: NvmlError) -> None:
        log.debug("metrics: %s of GPU %d (%s) failed: %s", what, gpu.index, gpu.uuid, error)
        if self._nvml_errors is not None:
            self._nvml_errors.labels(self._node).inc()

    def _collect_nvml(
        self,
        nvml: Nvml,
        gpus: Sequence[PhysicalGpu],
        used: GaugeMetricFamily,
        utilization: GaugeMetricFamily,
        processes: GaugeMetricFamily,
    ) -> None:
        pods: Mapping[str, PodContainers] | None = None
        for gpu in gpus:
            labels = [self._node, str(gpu.index), gpu.uuid]
            try:
                device = nvml.device_handle_by_index(gpu.index)
            except NvmlError as error:
                self._failed(gpu, "nvmlDeviceGetHandleByIndex", error)
                continue
            try:
                used.add_metric(labels, float(nvml.device_memory_used_bytes(device)))
            except NvmlError as error:
                self._failed(gpu, "nvmlDeviceGetMemoryInfo", error)
            try:
                percent = nvml.device_utilization_gpu_percent(device)
                utilization.add_metric(labels, percent / 100)
            except NvmlError as error:
                self._failed(gpu, "nvmlDeviceGetUtilizationRates", error)
            try:
                running = nvml.device_compute_processes(device)
            except NvmlError as error:
                self._failed(gpu, "nvmlDeviceGetComputeRunningProcesses", error)
                continue
            by_pid: dict[int, int] = {}
            for pid, amount in running:
                if amount is not None:  # the same PID twice (MIG) is summed: one series
                    by_pid[pid] = by_pid.get(pid, 0) + amount
            if by_pid and pods is None:
                pods = self._pods() if self._pods is not None else {}
            for pid in sorted(by_pid):
                pod_labels = self._pod_labels(pid, pods or {})
                processes.add_metric([*labels, str(pid), *pod_labels], float(by_pid[pid]))

    def _pod_labels(self, pid: int, pods: Mapping[str, PodContainers]) -> tuple[str, str, str]:
        """(pod, namespace, container) of ``pid``, ``""`` where unknown."""
        found = pod_of_pid(pid, self._proc_root)
        if found is None:
            return "", "", ""
        ref = pods.get(found.pod_uid)
        if ref is None:
            return "", "", ""
        return ref.name, ref.namespace, ref.containers.get(found.container_id, "")

    def _families(self) -> tuple[GaugeMetricFamily, ...]:
        inventory = (
            GaugeMetricFamily(
                "gpushare_device_plugin_gpu_memory_capacity_bytes",
                "GPU memory of a GPU in the device plugin's inventory, in bytes.",
                labels=_GPU_LABELS,
            ),
            GaugeMetricFamily(
                "gpushare_device_plugin_gpu_healthy",
                "1 when the device plugin reports a GPU healthy to kubelet, else 0.",
                labels=_GPU_LABELS,
            ),
        )
        if self._nvml is None:
            return inventory
        return (
            *inventory,
            GaugeMetricFamily(
                "gpushare_gpu_memory_used_bytes",
                "GPU memory in use (NVML), in bytes.",
                labels=_NVML_LABELS,
            ),
            GaugeMetricFamily(
                "gpushare_gpu_utilization_ratio",
                "Fraction of NVML's last sample period during which a kernel ran on the GPU.",
                labels=_NVML_LABELS,
            ),
            GaugeMetricFamily(
                "gpushare_gpu_process_memory_used_bytes",
                "GPU memory used by a compute process (NVML), in bytes, with its pod.",
                labels=_PROCESS_LABELS,
            ),
        )


class DevicePluginMetrics:
    """The device plugin's metrics (module doc) on ``registry`` (a fresh one when not given).

    ``node``: the plugin's node; ``gpus``: the current GPUs with health (e.g.
    ``lambda: service.gpus``); ``nvml``: the initialised NVML of the inventory, ``None``
    without one (fake GPUs: no NVML series); ``pods``: the node's pods by UID (e.g.
    ``lambda: pods_by_uid(node_pods.pods())``), called once per scrape that finds a GPU
    process; ``proc_root``: where the host's ``/proc`` is seen. The callables run in the
    metrics server's thread (module doc, "Serving").
    """

    def __init__(
        self,
        node: str,
        gpus: Callable[[], Sequence[PhysicalGpu]],
        *,
        nvml: Nvml | None = None,
        pods: Callable[[], Mapping[str, PodContainers]] | None = None,
        proc_root: Path = Path("/proc"),
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.node = node
        self.registry = registry if registry is not None else CollectorRegistry()
        self._allocate = Counter(
            "gpushare_device_plugin_allocate_requests",
            "Allocate calls from kubelet, by outcome.",
            ["node", "outcome"],
            registry=self.registry,
        )
        self._duration = Histogram(
            "gpushare_device_plugin_allocate_duration_seconds",
            "Time to answer kubelet's Allocate.",
            ["node"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self._registrations = Counter(
            "gpushare_device_plugin_registrations",
            "Successful registrations with kubelet (the first, then one per kubelet restart).",
            ["node"],
            registry=self.registry,
        )
        for outcome in ALLOCATE_OUTCOMES:
            self._allocate.labels(node, outcome)
        self._duration.labels(node)
        self._registrations.labels(node)
        nvml_errors = None
        if nvml is not None:
            nvml_errors = Counter(
                "gpushare_device_plugin_nvml_errors",
                "NVML queries that failed while collecting metrics.",
                ["node"],
                registry=None,
            )
            nvml_errors.labels(node)
        self.registry.register(
            _StateCollector(
                node, gpus, nvml=nvml, pods=pods, proc_root=proc_root, nvml_errors=nvml_errors
            )
        )
        if nvml_errors is not None:
            # after the collector: a scrape's own NVML failures are in that scrape
            self.registry.register(nvml_errors)

    def observe_allocate(self, outcome: str, seconds: float) -> None:
        """One Allocate call answered with ``outcome`` (one of ``ALLOCATE_OUTCOMES``) after
        ``seconds``; ``ValueError`` for another outcome (label values stay bounded)."""
        if outcome not in ALLOCATE_OUTCOMES:
            raise ValueError(
                f"Allocate outcome must be one of {ALLOCATE_OUTCOMES}, got {outcome!r}"
            )
        self._allocate.labels(self.node, outcome).inc()
        self._duration.labels(self.node).observe(seconds)

    def observe_registration(self) -> None:
        """One successful registration with kubelet."""
        self._registrations.labels(self.node).inc()

    def watch_mps(self, up: Callable[[], bool]) -> None:
        """Export ``gpushare_device_plugin_mps_daemon_up``: ``up()`` at each scrape (the managed
        MPS control daemon answers; ``gpushare.deviceplugin.mps.MpsSupervisor.healthy``)."""
        gauge = Gauge(
            "gpushare_device_plugin_mps_daemon_up",
            "1 while the MPS control daemon the device plugin manages answers, else 0.",
            ["node"],
            registry=self.registry,
        )
        gauge.labels(self.node).set_function(lambda: 1.0 if up() else 0.0)

    def exposition(self) -> tuple[bytes, str]:
        """The text exposition and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


# -- serving ------------------------------------------------------------------------------------


class MetricsServer:
    """A running metrics endpoint (``serve_metrics``): ``host`` and ``port`` it listens on
    (the real port when 0 was asked); ``close`` stops it."""

    def __init__(self, httpd: WSGIServer, thread: threading.Thread) -> None:
        self._httpd = httpd
        self._thread = thread
        self._closed = False
        address = httpd.server_address
        self.host = str(address[0])
        self.port = int(address[1])

    async def close(self) -> None:
        """Stop serving and release the port (idempotent; waits up to ~0.5 s for the server
        loop's next poll, in a worker thread)."""
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._httpd.shutdown)
        self._httpd.server_close()
        await asyncio.to_thread(self._thread.join)


async def serve_metrics(
    registry: CollectorRegistry,
    host: str = DEFAULT_METRICS_HOST,
    port: int = DEFAULT_METRICS_PORT,
) -> MetricsServer:
    """Serve ``registry`` over HTTP on ``host``:``port`` (any path; 0: a free port) from a
    daemon thread (module doc, "Serving"). ``OSError`` when the address cannot be bound."""
    httpd, thread = start_http_server(port, addr=host, registry=registry)
    server = MetricsServer(httpd, thread)
    log.info("metrics on http://%s:%d/metrics", server.host, server.port)
    return server
