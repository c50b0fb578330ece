"""The device plugin daemon wired together, with NVML's declared fake: a critical XID reaches
kubelet (devices Unhealthy), the node (inventory and gpu-count) and ``/metrics``, and the GPU
comes back.

``DevicePluginDaemon`` runs in the test's event loop with ``NvmlInventory(FakeNvml)``, the
kubelet stand-in, and the real API server; what the daemon does with a health change is checked
where it lands: kubelet's device list and the Node object.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from lightkube import AsyncClient, Client
from lightkube.resources.core_v1 import Event, Node
from prometheus_client.parser import text_string_to_metric_families

from gpushare.deviceplugin.daemon import DaemonOptions, DevicePluginDaemon
from gpushare.deviceplugin.mps import MPS_DOWN, MPS_RESTARTED, MpsPaths
from gpushare.deviceplugin.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    NvmlInventory,
)
from gpushare.kube.codec import GPU_COUNT, GPU_MEM, GPUSHARE_LABEL, NodeInfo, node_info
from gpushare.testing import mps_control
from gpushare.testing.controlplane import ControlPlane, async_wait_for
from gpushare.testing.daemon import running_daemon
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node
from gpushare.testing.nvml import FakeDevice, FakeNvml

pytestmark = pytest.mark.cluster

WAIT_S = 30.0
GIB = 1 << 30
_names = itertools.count()


async def node_until(
    client: AsyncClient, name: str, predicate: Callable[[NodeInfo, Node], bool]
) -> NodeInfo:
    """Poll node ``name`` until ``predicate(info, node)`` holds."""
    seen: list[Node] = []

    async def holds() -> NodeInfo | None:
        seen[:] = [await client.get(Node, name)]
        info = node_info(seen[0].to_dict())
        return info if predicate(info, seen[0]) else None

    def last() -> str:
        return f"GPU count (capacity, allocatable) {gpu_count(seen[0])}" if seen else "no read"

    return await async_wait_for(f"node {name} as wanted", holds, WAIT_S, detail=last)


def scrape(url: str) -> dict[tuple[str, str], float]:
    """``/metrics`` parsed with prometheus-client's parser: (sample name, gpu label) -> value."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("gpu", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def gpu_count(node: Node) -> tuple[str | None, str | None]:
    status = node.status
    capacity = (status.capacity if status else None) or {}
    allocatable = (status.allocatable if status else None) or {}
    return capacity.get(GPU_COUNT), allocatable.get(GPU_COUNT)


@contextlib.asynccontextmanager
async def running(
    plane: ControlPlane, nvml: FakeNvml, options: DaemonOptions
) -> AsyncIterator[tuple[DevicePluginDaemon, FakeKubelet, AsyncClient]]:
    """The daemon running over ``NvmlInventory(nvml)`` with the kubelet stand-in in
    ``options.socket_dir``; stopped (and its socket checked gone) on exit."""
    async with running_daemon(plane, NvmlInventory(nvml), options, nvml=nvml) as running:
        yield running


def test_a_critical_xid_reaches_kubelet_and_the_node_and_the_gpu_comes_back(
    control_plane: ControlPlane, kube: Client
) -> None:
    name = f"dp-health-{next(_names)}-{int(time.time())}"
    create_nodes(kube, [plain_node(name, labels={GPUSHARE_LABEL: "true"})])
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-health-", dir="/tmp"))
    nvml = FakeNvml([FakeDevice(f"GPU-{name}-{i}", i, "Tesla-T4", 16 * GIB) for i in range(2)])

    async def scenario() -> None:
        options = DaemonOptions(
            node_name=name,
            socket_dir=socket_dir,
            recovery_s=1.0,
            metrics_host="127.0.0.1",
            metrics_port=0,
        )
        async with running(control_plane, nvml, options) as (daemon, kubelet, client):
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 32, WAIT_S)
            info = await node_until(client, name, lambda i, n: gpu_count(n) == ("2", "2"))
            await daemon.runner.wait_registered()
            assert daemon.publisher.skipped == 1  # the first registration writes nothing new
            assert [(g.model, g.capacity, g.healthy) for g in info.node.gpus] == [
                ("Tesla-T4", 16, True),
                ("Tesla-T4", 16, True),
            ]
            assert info.uuids == (f"GPU-{name}-0", f"GPU-{name}-1")

            nvml.set_memory_used(0, 3 * GIB)
            assert daemon.metrics_server is not None
            url = f"http://127.0.0.1:{daemon.metrics_server.port}/metrics"
            samples = await asyncio.to_thread(scrape, url)
            assert samples[("gpushare_gpu_memory_used_bytes", "0")] == 3 * GIB
            assert samples[("gpushare_device_plugin_gpu_healthy", "1")] == 1

            nvml.inject_xid(1, 79)  # GPU has fallen off the bus
            view = await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 16, WAIT_S)
            assert view.capacity == 32
            info = await node_until(client, name, lambda i, n: gpu_count(n) == ("2", "1"))
            assert [g.healthy for g in info.node.gpus] == [True, False]
            samples = await asyncio.to_thread(scrape, url)
            assert samples[("gpushare_device_plugin_gpu_healthy", "1")] == 0

            # 1 s without a new critical XID and a working NVML query: healthy again.
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 32, WAIT_S)
            info = await node_until(client, name, lambda i, n: gpu_count(n) == ("2", "2"))
            assert [g.healthy for g in info.node.gpus] == [True, True]

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        delete_nodes(kube, [name])


def test_managed_mps_crash_makes_gpus_unhealthy_posts_events_and_stop_restores(
    control_plane: ControlPlane, kube: Client
) -> None:
    """``--mps-managed`` (docs/usage.md, "Enforced shares (MPS)"): the daemon starts the MPS control
    daemon (the protocol fake) before serving; killing it turns every device Unhealthy at kubelet
    and on the node with a Warning Event, the restart brings them back with a Normal one; stopping
    the plugin quits the daemon and restores the compute modes."""
    name = f"dp-mps-{next(_names)}-{int(time.time())}"
    create_nodes(kube, [plain_node(name, labels={GPUSHARE_LABEL: "true"})])
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-mps-dp-", dir="/tmp"))
    nvml = FakeNvml([FakeDevice(f"GPU-{name}-{i}", i, "Tesla-T4", 16 * GIB) for i in range(2)])
    paths = MpsPaths(socket_dir / "mps")
    binary = mps_control.install(socket_dir / "bin")
    hidden = binary.with_name("hidden")

    wanted = {(MPS_DOWN, "Warning"), (MPS_RESTARTED, "Normal")}

    def reasons() -> list[tuple[str, str]]:
        events = kube.list(Event, namespace="default", fields={"involvedObject.name": name})
        return [(e.reason or "", e.type or "") for e in events]

    async def scenario() -> None:
        options = DaemonOptions(
            node_name=name,
            socket_dir=socket_dir,
            health=False,
            metrics_port=None,
            mps_managed=True,
            mps_root=paths.root,
            mps_control=str(binary),
            mps_check_interval_s=0.1,
        )
        async with running(control_plane, nvml, options) as (_, kubelet, client):
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 32, WAIT_S)
            assert nvml.compute_modes == [COMPUTE_MODE_EXCLUSIVE_PROCESS] * 2
            binary.rename(hidden)  # restarts fail until it is back: the outage is observable
            mps_control.kill_daemon(paths.pipe_dir)
            view = await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 0, WAIT_S)
            assert view.capacity == 32
            hidden.rename(binary)
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == 32, WAIT_S)
            info = await node_until(client, name, lambda i, n: gpu_count(n) == ("2", "2"))
            assert [g.healthy for g in info.node.gpus] == [True, True]

            # The Normal Event is posted right after the health comes back: wait for it before
            # stopping the plugin, whose stop would cancel a post still in flight.
            async def posted() -> bool | None:
                return wanted <= set(await asyncio.to_thread(reasons)) or None

            await async_wait_for(f"Events {wanted}", posted, WAIT_S, detail=reasons)
        assert nvml.compute_modes == [COMPUTE_MODE_DEFAULT] * 2
        assert mps_control.daemon_pid(paths.pipe_dir) is None  # quit

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        with contextlib.suppress(ProcessLookupError, RuntimeError):
            mps_control.kill_daemon(paths.pipe_dir)
        delete_nodes(kube, [name])
