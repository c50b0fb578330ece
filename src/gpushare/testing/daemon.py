"""The device plugin daemon run in a test's event loop, with the kubelet stand-in, against a
real control plane (``tests/cluster``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from lightkube import AsyncClient

from gpushare.deviceplugin.daemon import DaemonOptions, DevicePluginDaemon
from gpushare.deviceplugin.inventory import Inventory
from gpushare.deviceplugin.nvml import Nvml
from gpushare.kube.client import connect
from gpushare.testing.controlplane import ControlPlane
from gpushare.testing.kubelet import FakeKubelet

__all__ = ["running_daemon"]


@contextlib.asynccontextmanager
async def running_daemon(
    plane: ControlPlane,
    inventory: Inventory,
    options: DaemonOptions,
    *,
    nvml: Nvml | None = None,
    stop_timeout_s: float = 30.0,
) -> AsyncIterator[tuple[DevicePluginDaemon, FakeKubelet, AsyncClient]]:
    """``DevicePluginDaemon`` over ``inventory`` (``nvml`` for health), with the kubelet
    stand-in in ``options.socket_dir`` and an admin client of ``plane``; stopped on exit, its
    socket checked gone."""
    client = connect(plane.kubeconfig, trust_env=False)
    kubelet = FakeKubelet(options.socket_dir)
    await kubelet.start()
    daemon = DevicePluginDaemon(client, inventory, options, nvml=nvml)
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    try:
        yield daemon, kubelet, client
    finally:
        stop.set()
        try:
            await asyncio.wait_for(task, stop_timeout_s)
        finally:  # a daemon that failed or hung still leaves no kubelet or connection behind
            try:
                await kubelet.stop()
            finally:
                await client.close()
    assert not daemon.runner.socket_path.exists()
