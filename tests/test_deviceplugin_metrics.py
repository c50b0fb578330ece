"""The device plugin's metrics: cgroup lines to pods, the collector over ``FakeNvml`` and a
temporary ``/proc``, served by ``serve_metrics`` on a real port and parsed back with
prometheus-client's parser; and the new NVML calls of ``PynvmlBackend`` over a stand-in pynvml.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import socket
import urllib.request
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.metrics import (
    ALLOCATE_OUTCOMES,
    CgroupPod,
    DevicePluginMetrics,
    PodContainers,
    pod_of_cgroup,
    pod_of_pid,
    pods_by_uid,
    serve_metrics,
)
from gpushare.deviceplugin.nvml import DeviceHandle, NvmlError, NvmlInventory, PynvmlBackend
from gpushare.testing.nvml import FakeDevice, FakeNvml

GIB, MIB = 2**30, 2**20
NODE = "gpu-node-1"
UID = "7f3b9c2a-1d4e-4f6a-9b8c-0e1d2c3b4a59"
UID_ = UID.replace("-", "_")
STATIC_UID = "5d41402abc4b2a76b9719d911017c592"  # a static pod: the hash of its manifest
CID = hashlib.sha256(b"container main").hexdigest()
CID2 = hashlib.sha256(b"container sidecar").hexdigest()
HOST_CID = hashlib.sha256(b"kind node").hexdigest()

# -- cgroup lines to pods ------------------------------------------------------------------------

V1_CGROUPFS = "\n".join(
    f"{n}:{controller}:/kubepods/besteffort/pod{UID}/{CID}"
    for n, controller in [
        (12, "pids"),
        (11, "hugetlb"),
        (10, "memory"),
        (9, "devices"),
        (8, "cpu,cpuacct"),
        (1, "name=systemd"),
    ]
)
V1_SYSTEMD = (
    "13:rdma:/\n"
    f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"docker-{CID}.scope\n"
    f"1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
    f"docker-{CID}.scope\n"
    "0::/\n"
)

CGROUP_CASES = [
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupPod(UID, CID),
        id="v2 systemd containerd burstable: underscores become dashes",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{CID}.scope\n",
        CgroupPod(UID, CID),
        id="v2 systemd guaranteed (no QoS slice)",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/"
        f"crio-{CID}.scope\n",
        CgroupPod(UID, CID),
        id="v2 systemd CRI-O",
    ),
    pytest.param(f"0::/kubepods/burstable/pod{UID}/{CID}\n", CgroupPod(UID, CID), id="v2 cgroupfs"),
    pytest.param(V1_CGROUPFS, CgroupPod(UID, CID), id="v1 cgroupfs docker, every controller"),
    pytest.param(V1_SYSTEMD, CgroupPod(UID, CID), id="v1 systemd docker, hybrid 0::/ line"),
    pytest.param(
        f"0::/system.slice/docker-{HOST_CID}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupPod(UID, CID),
        id="kind: a node in a container, kubelet's own cgroup root",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{STATIC_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
        CgroupPod(STATIC_UID, CID),
        id="static pod: a 32-hex UID",
    ),
    pytest.param(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice\n",
        CgroupPod(UID, ""),
        id="the pod's own cgroup: no container",
    ),
    pytest.param(
        f"4:memory:/kubepods/burstable/pod{UID}\n3:cpu:/kubepods/burstable/pod{UID}/{CID2}\n",
        CgroupPod(UID, CID2),
        id="a line naming the container wins over one naming only the pod",
    ),
    pytest.param("0::/system.slice/containerd.service\n", None, id="host service"),
    pytest.param("0::/user.slice/user-1000.slice/session-3.scope\n", None, id="login session"),
    pytest.param("0::/\n", None, id="cgroup namespace: nothing visible"),
    pytest.param(f"0::/kubepods.slice/{CID}\n", None, id="kubepods without a pod segment"),
    pytest.param("", None, id="empty file"),
    pytest.param("not a cgroup file\n", None, id="garbage"),
]


@pytest.mark.parametrize(("text", "expected"), CGROUP_CASES)
def test_pod_of_cgroup(text: str, expected: CgroupPod | None) -> None:
    assert pod_of_cgroup(text) == expected


def write_cgroup(proc_root: Path, pid: int, text: str) -> None:
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(text)


def test_pod_of_pid_reads_the_injected_proc_root(tmp_path: Path) -> None:
    write_cgroup(tmp_path, 42, f"0::/kubepods/burstable/pod{UID}/{CID}\n")
    assert pod_of_pid(42, tmp_path) == CgroupPod(UID, CID)
    assert pod_of_pid(43, tmp_path) is None  # gone, or not visible from here


def pod(uid: str | None, statuses: Mapping[str, list[dict[str, Any]]]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "trainer", "namespace": "ml"}
    if uid is not None:
        meta["uid"] = uid
    return {"metadata": meta, "status": dict(statuses)}


PODS_CASES = [
    pytest.param(
        [
            pod(
                UID,
                {
                    "containerStatuses": [
                        {"name": "main", "containerID": f"containerd://{CID}"},
                        {"name": "sidecar", "containerID": f"cri-o://{CID2}"},
                    ],
                    "initContainerStatuses": [{"name": "init", "containerID": f"docker://{UID}"}],
                },
            )
        ],
        {UID: PodContainers("ml", "trainer", {CID: "main", CID2: "sidecar", UID: "init"})},
        id="runtime prefixes dropped, init containers too",
    ),
    pytest.param(
        [pod(UID, {"containerStatuses": [{"name": "main"}]})],
        {UID: PodContainers("ml", "trainer", {})},
        id="a container not started yet has no ID",
    ),
    pytest.param([pod(UID, {})], {UID: PodContainers("ml", "trainer", {})}, id="no status"),
    pytest.param([pod(None, {})], {}, id="no UID: left out"),
    pytest.param([], {}, id="no pods"),
]


@pytest.mark.parametrize(("pods", "expected"), PODS_CASES)
def test_pods_by_uid(pods: list[dict[str, Any]], expected: dict[str, PodContainers]) -> None:
    assert pods_by_uid(pods) == expected


# -- the collector, served ------------------------------------------------------------------------

T4 = FakeDevice("GPU-7a1c0000-0000-4000-8000-000000000001", 0, "Tesla T4", 16 * GIB)
A100 = FakeDevice("GPU-a1000000-0000-4000-8000-000000000002", 1, "NVIDIA A100-SXM4-80GB", 80 * GIB)

Key = tuple[str, frozenset[tuple[str, str]]]


def key(name: str, **labels: str) -> Key:
    return name, frozenset(labels.items())


def fetch(url: str) -> tuple[str, str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body.decode(), str(response.headers["Content-Type"])


async def serve_and_scrape(registry: CollectorRegistry) -> tuple[str, str]:
    server = await serve_metrics(registry, "127.0.0.1", 0)
    try:
        assert server.port > 0
        return await asyncio.to_thread(fetch, f"http://127.0.0.1:{server.port}/metrics")
    finally:
        await server.close()


def scrape(metrics: DevicePluginMetrics) -> tuple[dict[Key, float], dict[str, str]]:
    """Every sample by (name, labels) and each family's type, through a real HTTP server."""
    text, content_type = asyncio.run(serve_and_scrape(metrics.registry))
    assert content_type.startswith("text/plain")
    samples: dict[Key, float] = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        if family.name.endswith("_created"):  # prometheus-client's creation times
            continue
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples, types


def gpu_labels(device: FakeDevice, index: int, *, model: bool = False) -> dict[str, str]:
    labels = {"node": NODE, "gpu": str(index), "uuid": device.uuid}
    return {**labels, "model": device.name} if model else labels


def process(device: FakeDevice, index: int, pid: int, *names: str) -> Key:
    pod_name, namespace, container = names if names else ("", "", "")
    return key(
        "gpushare_gpu_process_memory_used_bytes",
        **gpu_labels(device, index),
        pid=str(pid),
        pod=pod_name,
        namespace=namespace,
        container=container,
    )


def nvml_node(tmp_path: Path) -> tuple[FakeNvml, list[PhysicalGpu], DevicePluginMetrics]:
    """A T4 and an A100 with processes: 100 in pod ml/trainer (container main) on both GPUs,
    101 in a pod the plugin does not know, 102 outside Kubernetes, 103 gone from /proc, 104
    with no memory figure, 105 in the pod's own cgroup."""
    fake = FakeNvml([T4, A100])
    gpus = NvmlInventory(fake).gpus()
    gpus[1] = replace(gpus[1], healthy=False)
    fake.set_memory_used(0, 5 * GIB)
    fake.set_memory_used(1, 30 * GIB)
    fake.set_utilization(0, 37)
    fake.set_utilization(1, 100)
    fake.set_processes(0, [(100, 3 * GIB), (101, 512 * MIB), (102, GIB), (103, GIB), (104, None)])
    fake.set_processes(1, [(100, 2 * GIB), (105, 256 * MIB), (100, GIB)])
    kube = f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice"
    write_cgroup(tmp_path, 100, f"{kube}/cri-containerd-{CID}.scope\n")
    other = f"0::/kubepods/besteffort/pod{STATIC_UID}/{CID2}\n"
    write_cgroup(tmp_path, 101, other)
    write_cgroup(tmp_path, 102, "0::/system.slice/nvidia-persistenced.service\n")
    write_cgroup(tmp_path, 105, f"{kube}\n")
    index = pods_by_uid(
        [pod(UID, {"containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}]})]
    )
    calls: list[int] = []

    def pods() -> Mapping[str, PodContainers]:
        calls.append(1)
        return index

    metrics = DevicePluginMetrics(
        NODE, lambda: gpus, nvml=fake, pods=pods, proc_root=tmp_path, registry=CollectorRegistry()
    )
    return fake, gpus, metrics


def test_nvml_series_served_and_parsed(tmp_path: Path) -> None:
    _, _, metrics = nvml_node(tmp_path)
    samples, types = scrape(metrics)

    expected = {
        key("gpushare_device_plugin_gpu_memory_capacity_bytes", **gpu_labels(T4, 0, model=True)): (
            16 * GIB
        ),
        key(
            "gpushare_device_plugin_gpu_memory_capacity_bytes", **gpu_labels(A100, 1, model=True)
        ): 80 * GIB,
        key("gpushare_device_plugin_gpu_healthy", **gpu_labels(T4, 0, model=True)): 1,
        key("gpushare_device_plugin_gpu_healthy", **gpu_labels(A100, 1, model=True)): 0,
        key("gpushare_gpu_memory_used_bytes", **gpu_labels(T4, 0)): 5 * GIB,
        key("gpushare_gpu_memory_used_bytes", **gpu_labels(A100, 1)): 30 * GIB,
        key("gpushare_gpu_utilization_ratio", **gpu_labels(T4, 0)): 0.37,
        key("gpushare_gpu_utilization_ratio", **gpu_labels(A100, 1)): 1.0,
        process(T4, 0, 100, "trainer", "ml", "main"): 3 * GIB,
        process(T4, 0, 101): 512 * MIB,  # a pod this plugin does not watch
        process(T4, 0, 102): GIB,  # not in Kubernetes
        process(T4, 0, 103): GIB,  # gone from /proc
        process(A100, 1, 100, "trainer", "ml", "main"): 3 * GIB,  # listed twice: summed
        process(A100, 1, 105, "trainer", "ml", ""): 256 * MIB,  # the pod's cgroup, no container
    }
    nvml_families = {
        "gpushare_device_plugin_gpu_memory_capacity_bytes",
        "gpushare_device_plugin_gpu_healthy",
        "gpushare_gpu_memory_used_bytes",
        "gpushare_gpu_utilization_ratio",
        "gpushare_gpu_process_memory_used_bytes",
    }
    found = {k: v for k, v in samples.items() if k[0] in nvml_families}
    assert found == expected  # pid 104 (no memory figure) has no series
    assert all(types[name] == "gauge" for name in nvml_families)
    assert types["gpushare_device_plugin_allocate_requests"] == "counter"
    assert types["gpushare_device_plugin_allocate_duration_seconds"] == "histogram"
    assert types["gpushare_device_plugin_registrations"] == "counter"
    assert samples[key("gpushare_device_plugin_nvml_errors_total", node=NODE)] == 0


def test_allocate_and_registration_series() -> None:
    metrics = DevicePluginMetrics(NODE, list, registry=CollectorRegistry())
    metrics.observe_allocate("ok", 0.012)
    metrics.observe_allocate("ok", 0.02)
    metrics.observe_allocate("rejected", 0.004)
    metrics.observe_registration()
    samples, _ = scrape(metrics)
    requests = "gpushare_device_plugin_allocate_requests_total"
    expected_requests = {"ok": 2, "rejected": 1, "error": 0}
    assert set(expected_requests) == set(ALLOCATE_OUTCOMES)
    for outcome, count in expected_requests.items():
        assert samples[key(requests, node=NODE, outcome=outcome)] == count
    duration = "gpushare_device_plugin_allocate_duration_seconds"
    assert samples[key(f"{duration}_count", node=NODE)] == 3
    assert samples[key(f"{duration}_bucket", node=NODE, le="0.01")] == 1
    assert samples[key(f"{duration}_bucket", node=NODE, le="0.025")] == 3
    assert samples[key(f"{duration}_sum", node=NODE)] == pytest.approx(0.036)
    assert samples[key("gpushare_device_plugin_registrations_total", node=NODE)] == 1
    with pytest.raises(ValueError, match="outcome must be one of"):
        metrics.observe_allocate("FAILED_PRECONDITION", 0.1)
    assert REGISTRY.get_sample_value(requests, {"node": NODE, "outcome": "ok"}) is None


def test_without_nvml_only_the_inventory_and_the_counters() -> None:
    gpus = [PhysicalGpu(0, "GPU-fa4e0000-0000-4000-8000-000000000000", 0, "T4", 16 * 1024)]
    metrics = DevicePluginMetrics(NODE, lambda: gpus)
    samples, types = scrape(metrics)
    assert set(types) == {
        "gpushare_device_plugin_gpu_memory_capacity_bytes",
        "gpushare_device_plugin_gpu_healthy",
        "gpushare_device_plugin_allocate_requests",
        "gpushare_device_plugin_allocate_duration_seconds",
        "gpushare_device_plugin_registrations",
    }
    labels = {"node": NODE, "gpu": "0", "uuid": gpus[0].uuid, "model": "T4"}
    assert samples[key("gpushare_device_plugin_gpu_memory_capacity_bytes", **labels)] == 16 * GIB
    assert samples[key("gpushare_device_plugin_gpu_healthy", **labels)] == 1


def test_failing_nvml_queries_drop_their_series_and_are_counted(tmp_path: Path) -> None:
    fake, _, metrics = nvml_node(tmp_path)
    fake.set_probe_ok(1, False)  # nvmlDeviceGetMemoryInfo fails on the A100 (GPU lost)
    samples, _ = scrape(metrics)
    assert key("gpushare_gpu_memory_used_bytes", **gpu_labels(T4, 0)) in samples
    assert key("gpushare_gpu_memory_used_bytes", **gpu_labels(A100, 1)) not in samples
    assert samples[key("gpushare_gpu_utilization_ratio", **gpu_labels(A100, 1))] == 1.0
    assert samples[key("gpushare_device_plugin_nvml_errors_total", node=NODE)] == 1
    fake.shutdown()  # NVML shut down under the server: every query fails, the scrape still works
    samples, _ = scrape(metrics)
    assert not any(name.startswith("gpushare_gpu_") for name, _ in samples)
    assert samples[key("gpushare_device_plugin_nvml_errors_total", node=NODE)] == 3


def test_close_releases_the_port() -> None:
    async def run() -> int:
        server = await serve_metrics(CollectorRegistry(), "127.0.0.1", 0)
        await server.close()
        await server.close()  # idempotent
        return server.port

    port = asyncio.run(run())
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # free again


# -- PynvmlBackend's metric calls ---------------------------------------------------------------


def test_pynvml_backend_metric_calls() -> None:
    """Over a stand-in pynvml: pynvml's own structs, a process without a memory figure, and
    pynvml's error type."""
    pynvml = importlib.import_module("pynvml")  # untyped (no stubs): its attributes are Any

    def processes(handle: object) -> list[object]:
        return [
            SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB),
            SimpleNamespace(pid=4243, usedGpuMemory=None),  # NVML_VALUE_NOT_AVAILABLE
        ]

    def lost(handle: object) -> object:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    module = SimpleNamespace(
        NVMLError=pynvml.NVMLError,
        nvmlDeviceGetMemoryInfo=lambda handle: pynvml.c_nvmlMemory_t(
            total=16 * GIB, free=11 * GIB, used=5 * GIB
        ),
        nvmlDeviceGetUtilizationRates=lambda handle: pynvml.c_nvmlUtilization_t(gpu=37, memory=12),
        nvmlDeviceGetComputeRunningProcesses=processes,
    )
    backend = PynvmlBackend(module)
    device = DeviceHandle(object())
    assert backend.device_memory_used_bytes(device) == 5 * GIB
    assert backend.device_utilization_gpu_percent(device) == 37
    assert backend.device_compute_processes(device) == [(4242, 3 * GIB), (4243, None)]
    failing = PynvmlBackend(SimpleNamespace(NVMLError=pynvml.NVMLError, **dict.fromkeys(
        ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetUtilizationRates",
         "nvmlDeviceGetComputeRunningProcesses"), lost)))  # fmt: skip
    for call in (
        failing.device_memory_used_bytes,
        failing.device_utilization_gpu_percent,
        failing.device_compute_processes,
    ):
        with pytest.raises(NvmlError) as raised:
            call(device)
        assert raised.value.code == pynvml.NVML_ERROR_GPU_IS_LOST
