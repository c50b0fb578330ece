"""The device plugin daemon and its node configuration (``gpushare-node-config``) at start and
on label changes, on the real API server with the kubelet stand-in (docs/node-config.md).

* A ConfigMap present before the plugin starts is read before the first publish: the node's
  first inventory, and kubelet's first device list, are the configured ones (no flap through the
  flags' values).
* A selector entry follows the node's labels (read with ``get``, every ``node_config_poll_s``):
  removing the label brings the flags back.
* A restart that finds pods holding GPU memory keeps the unit the node publishes, whatever
  ``--memory-unit`` says: the change of unit waits (Warning Event) until those pods are gone.

The end-to-end path (plugin process, extender, kube-scheduler) is in
``test_deviceplugin_cluster.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lightkube import AsyncClient, Client
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Event, Node, Pod

from gpushare.deviceplugin.daemon import DaemonOptions, DevicePluginDaemon
from gpushare.deviceplugin.inventory import FakeInventory
from gpushare.kube.codec import GPU_MEM, GPUSHARE_LABEL, MemoryUnit, NodeInfo, node_info
from gpushare.testing.controlplane import ControlPlane, async_wait_for
from gpushare.testing.daemon import running_daemon
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.nodes import apply_node_config, create_nodes, delete_nodes, plain_node

pytestmark = pytest.mark.cluster

WAIT_S = 30.0
_names = itertools.count()


@contextlib.asynccontextmanager
async def running(
    plane: ControlPlane, options: DaemonOptions
) -> AsyncIterator[tuple[DevicePluginDaemon, FakeKubelet, AsyncClient]]:
    """The daemon over ``--fake-gpus 2x16GiB:T4`` with the kubelet stand-in; stopped on exit."""
    async with running_daemon(plane, FakeInventory("2x16GiB:T4"), options) as running:
        yield running


async def inventory_until(client: AsyncClient, name: str, wanted: object) -> NodeInfo:
    """Poll node ``name`` until (unit, ((index, capacity), ...)) of its inventory is ``wanted``."""
    seen: list[object] = [None]

    async def holds() -> NodeInfo | None:
        info = node_info((await client.get(Node, name)).to_dict())
        seen[0] = (info.unit, tuple((g.index, g.capacity) for g in info.node.gpus))
        return info if seen[0] == wanted else None

    what = f"the inventory of {name} to be {wanted}"
    return await async_wait_for(what, holds, WAIT_S, detail=lambda: seen[0])


def world(kube: Client, labels: dict[str, str]) -> tuple[str, str, DaemonOptions]:
    """A fresh node (labelled ``labels`` too), its ConfigMap name and the daemon's options."""
    name = f"dp-config-{next(_names)}-{int(time.time())}"
    create_nodes(kube, [plain_node(name, labels={GPUSHARE_LABEL: "true", **labels})])
    options = DaemonOptions(
        node_name=name,
        socket_dir=Path(tempfile.mkdtemp(prefix="gpushare-config-", dir="/tmp")),
        metrics_port=None,
        node_config_name=f"config-{name}",
        node_config_retry_s=0.5,
        node_config_poll_s=0.5,
    )
    return name, f"config-{name}", options


def test_the_first_publish_is_the_configured_one_and_a_selector_follows_the_labels(
    control_plane: ControlPlane, kube: Client
) -> None:
    node, configmap, options = world(kube, {"pool": "small"})
    uuid1 = FakeInventory("2x16GiB:T4").gpus()[1].uuid
    apply_node_config(
        kube, configmap, f"nodes:\n- selector: {{pool: small}}\n  memoryUnit: MiB\n"
        f"  excludeGpus: [{uuid1}]\n",
    )  # fmt: skip

    async def scenario() -> None:
        async with running(control_plane, options) as (daemon, kubelet, client):
            view = await kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity > 0, WAIT_S)
            assert view.capacity == 16 * 1024  # the first list kubelet got: MiB, GPU 0 only
            await daemon.runner.wait_registered()
            await inventory_until(client, node, (MemoryUnit.MIB, ((0, 16 * 1024),)))
            assert daemon.publisher.api_calls == 2  # one publish (annotation, gpu-count)

            # The label goes: the selector no longer matches, the flags apply (no pods here).
            await client.patch(Node, node, {"metadata": {"labels": {"pool": None}}})
            await inventory_until(client, node, (MemoryUnit.GIB, ((0, 16), (1, 16))))
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity == 32, WAIT_S)

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        kube.delete(ConfigMap, configmap, namespace="kube-system")
        delete_nodes(kube, [node])


def gpu_pod(node: str, name: str, mib: int) -> Pod:
    """A running pod on ``node`` holding ``mib`` MiB of GPU 0 (what a bind records)."""
    containers = [{"name": "main", "gpus": [0], "share": mib}]
    allocation = json.dumps({"node": node, "unit": "MiB", "containers": containers})
    return Pod(
        metadata=ObjectMeta(
            name=name, namespace="default", annotations={"gpushare.io/allocation": allocation}
        ),
        spec=PodSpec(
            nodeName=node,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/config:0",
                    resources=ResourceRequirements(limits={GPU_MEM: str(mib)}),
                )
            ],
        ),
    )


def test_a_restart_keeps_the_published_unit_while_pods_hold_memory_in_it(
    control_plane: ControlPlane, kube: Client
) -> None:
    node, configmap, options = world(kube, {})
    apply_node_config(kube, configmap, f"nodes:\n- name: {node}\n  memoryUnit: MiB\n")
    pod = f"holder-{node}"

    async def scenario() -> None:
        async with running(control_plane, options) as (_, _, client):
            await inventory_until(client, node, (MemoryUnit.MIB, ((0, 16384), (1, 16384))))
        kube.create(gpu_pod(node, pod, 4096))
        kube.delete(ConfigMap, configmap, namespace="kube-system")  # back to --memory-unit GiB
        async with running(control_plane, options) as (daemon, kubelet, client):
            view = await kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity > 0, WAIT_S)
            assert view.capacity == 2 * 16384  # still MiB: the pod asked 4096 of them
            await inventory_until(client, node, (MemoryUnit.MIB, ((0, 16384), (1, 16384))))

            async def deferred() -> list[str] | None:
                events = await asyncio.to_thread(
                    lambda: [
                        e.message or ""
                        for e in kube.list(
                            Event, namespace="default", fields={"involvedObject.name": node}
                        )
                        if e.reason == "NodeConfigDeferred"
                    ]
                )
                return events or None

            events = await async_wait_for("a NodeConfigDeferred Event", deferred, WAIT_S)
            assert (
                f"memoryUnit GiB waits until no pod on the node asks GPU memory in MiB "
                f"(1 do: default/{pod})"
            ) in events[0]
            kube.delete(Pod, pod, namespace="default", grace_period=0)
            await inventory_until(client, node, (MemoryUnit.GIB, ((0, 16), (1, 16))))
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.capacity == 32, WAIT_S)
            assert daemon.service.unit is MemoryUnit.GIB

    try:
        asyncio.run(asyncio.wait_for(scenario(), 120))
    finally:
        with contextlib.suppress(Exception):
            kube.delete(Pod, pod, namespace="default", grace_period=0)
        with contextlib.suppress(Exception):
            kube.delete(ConfigMap, configmap, namespace="kube-system")
        delete_nodes(kube, [node])
