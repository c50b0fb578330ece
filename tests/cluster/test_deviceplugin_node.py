"""The device plugin publishes the node's GPU inventory to the real API server.

``gpushare.kube.nodes.NodePublisher`` against the session's kube-apiserver, with a
ServiceAccount bound to exactly the rules docs/deviceplugin.md lists (``RBAC_RULES``):

* a kwok node without GPUs (labelled ``gpushare=true`` by the operator, as for Alibaba's
  plugin) gets the inventory annotation and ``aliyun.com/gpu-count`` capacity and allocatable;
  ``node_info`` reads back the unit and every GPU's memory, model, UUID and health; kwok, which
  initialises the node's status after (or around) the publish and then renews its lease, keeps
  what was published;
* a GPU going unhealthy is re-published (allocatable drops by one, the inventory says
  ``healthy: false``), and back; a publish with nothing changed sends no request at all;
* RBAC: those rules suffice, the same identity may not delete the node or patch pods, and an
  identity without ``nodes/status`` ``patch`` gets the error that names the rule to add;
* a missing node, and an unreachable server (retried, then given up), give clear errors.

Requests are counted by a transport between lightkube and the server; every wait polls an
API condition with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest
from lightkube import AsyncClient, Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from gpushare.core.model import Gpu
from gpushare.kube.codec import (
    GPU_COUNT,
    GPU_MEM,
    INVENTORY,
    InventoryGpu,
    inventory_annotation,
    node_info,
)
from gpushare.kube.errors import ApiCallError, Failure
from gpushare.kube.nodes import RBAC_RULES, NodePublisher
from gpushare.testing.controlplane import ControlPlane, wait_until
from gpushare.testing.faults import FaultyTransport
from gpushare.testing.nodes import FakeGpu, create_nodes, delete_nodes, gpu_node, plain_node

pytestmark = pytest.mark.cluster

WAIT_S = 30.0
NAMESPACE = "gpushare-system"
_names = itertools.count()

V100 = "Tesla-V100-SXM2-16GB"
A100 = "NVIDIA-A100-SXM4-40GB"
GPUS = [
    InventoryGpu(0, "GPU-11111111-2222-3333-4444-000000000000", V100, 16276),
    InventoryGpu(1, "GPU-11111111-2222-3333-4444-000000000001", A100, 40536),
]
PLUGIN_RULES = [PolicyRule(**{k: list(v) for k, v in rule.items()}) for rule in RBAC_RULES]


class CountingTransport(httpx2.AsyncBaseTransport):
    """Passes every request on to ``inner`` and keeps ``"METHOD path"`` for each."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.requests: list[str] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(f"{request.method} {request.url.path}")
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


@contextlib.asynccontextmanager
async def plugin_client(
    plane: ControlPlane, kubeconfig: Path, faults: FaultyTransport
) -> AsyncIterator[tuple[AsyncClient, CountingTransport]]:
    """A client for a token kubeconfig over ``faults``, its requests counted."""
    counting = CountingTransport(faults)
    client = AsyncClient(KubeConfig.from_file(kubeconfig), trust_env=False, transport=counting)
    try:
        yield client, counting
    finally:
        await client.close()


@pytest.fixture(scope="module")
def plugin_kubeconfig(control_plane: ControlPlane) -> Path:
    """The device plugin's identity: a ServiceAccount bound to exactly ``RBAC_RULES``."""
    return control_plane.service_account_kubeconfig(
        "gpushare-device-plugin", NAMESPACE, PLUGIN_RULES
    )


@pytest.fixture
def node_names(kube: Client) -> Iterator[list[str]]:
    """Names for this test's nodes; every one is deleted afterwards."""
    names: list[str] = []
    yield names
    delete_nodes(kube, names)


def read_node(kube: Client, name: str) -> dict[str, Any]:
    node: dict[str, Any] = kube.get(Node, name).to_dict()
    return node


def gpu_count(node: dict[str, Any]) -> tuple[str | None, str | None]:
    status = node.get("status") or {}
    return (status.get("capacity") or {}).get(GPU_COUNT), (status.get("allocatable") or {}).get(
        GPU_COUNT
    )


def is_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def assert_published(node: dict[str, Any], unit: str, gpus: list[InventoryGpu]) -> None:
    """``node_info`` reads ``gpus`` back, and gpu-count says all / healthy."""
    info = node_info(node)
    assert (info.source, info.unit, info.gpushare) == ("inventory", unit, True)
    assert info.node.gpus == tuple(Gpu(g.index, g.model, g.memory, g.healthy) for g in gpus)
    assert info.uuids == tuple(g.uuid for g in gpus)
    healthy = sum(1 for g in gpus if g.healthy)
    assert gpu_count(node) == (str(len(gpus)), str(healthy))


def test_publish_to_a_node_without_gpus(
    control_plane: ControlPlane, kube: Client, plugin_kubeconfig: Path, node_names: list[str]
) -> None:
    name = f"dp-bare-{next(_names)}"
    node_names.append(name)
    create_nodes(kube, [plain_node(name, labels={"gpushare": "true"})])

    async def scenario() -> None:
        faults = FaultyTransport.for_control_plane(control_plane, client_certificate=False)
        async with plugin_client(control_plane, plugin_kubeconfig, faults) as (client, counted):
            publisher = NodePublisher(client)
            assert await publisher.node_exists(name)
            assert await publisher.publish(name, "MiB", GPUS)
            assert counted.requests == [
                f"GET /api/v1/nodes/{name}",
                f"PATCH /api/v1/nodes/{name}",
                f"PATCH /api/v1/nodes/{name}/status",
            ]
            assert publisher.api_calls == 3

    asyncio.run(scenario())
    node = read_node(kube, name)
    assert_published(node, "MiB", GPUS)
    assert node["metadata"]["annotations"][INVENTORY] == inventory_annotation("MiB", GPUS)
    assert GPU_MEM not in node["status"]["capacity"]  # the kubelet's, from the device list
    assert node["status"]["capacity"]["cpu"] == "32"  # the rest of the status is untouched

    # The node stops being Ready (as when heartbeats stop): kwok's node-initialize stage writes
    # the whole status again (conditions, addresses, nodeInfo, capacity and allocatable from
    # what it finds) after the publish, and keeps what was published.
    assert is_ready(node)
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    patched = kube.patch(Node.Status, name, not_ready, patch_type=PatchType.STRATEGIC)
    assert patched.metadata is not None
    ours = int(patched.metadata.resourceVersion or 0)

    def rewritten() -> bool:  # kwok may answer before we can read the NotReady state
        again = read_node(kube, name)
        return is_ready(again) and int(again["metadata"]["resourceVersion"]) > ours

    wait_until(f"kwok to make {name} Ready again", rewritten, WAIT_S)
    node = read_node(kube, name)
    assert any(
        entry.get("manager") == "kwok" and entry.get("subresource") == "status"
        for entry in node["metadata"].get("managedFields") or []
    ), node["metadata"].get("managedFields")
    assert_published(node, "MiB", GPUS)


def test_health_flips_are_republished_and_no_change_sends_nothing(
    control_plane: ControlPlane, kube: Client, plugin_kubeconfig: Path, node_names: list[str]
) -> None:
    name = f"dp-gpu-{next(_names)}"
    node_names.append(name)
    fakes = [FakeGpu(0, 16), FakeGpu(1, 16)]
    create_nodes(kube, [gpu_node(name, fakes)])
    healthy = [fake.inventory_gpu(name) for fake in fakes]
    flipped = [healthy[0], InventoryGpu(1, healthy[1].uuid, V100, 16, healthy=False)]

    async def scenario() -> None:
        faults = FaultyTransport.for_control_plane(control_plane, client_certificate=False)
        async with plugin_client(control_plane, plugin_kubeconfig, faults) as (client, counted):
            publisher = NodePublisher(client)
            assert await publisher.publish(name, "GiB", healthy)
            assert_published(read_node(kube, name), "GiB", healthy)

            assert await publisher.publish(name, "GiB", flipped)
            node = read_node(kube, name)
            assert_published(node, "GiB", flipped)
            assert gpu_count(node) == ("2", "1")
            assert node_info(node).node.gpus[1].healthy is False

            assert await publisher.publish(name, "GiB", healthy)
            assert gpu_count(read_node(kube, name)) == ("2", "2")

            sent = len(counted.requests)
            assert sent == 6
            assert not await publisher.publish(name, "GiB", list(reversed(healthy)))
            assert len(counted.requests) == sent  # nothing changed: no request at all
            assert (publisher.api_calls, publisher.skipped) == (6, 1)

            assert await publisher.publish(name, "GiB", healthy, force=True)
            assert len(counted.requests) == sent + 2

    asyncio.run(scenario())


def test_the_documented_rules_allow_nothing_more(
    control_plane: ControlPlane, kube: Client, plugin_kubeconfig: Path, node_names: list[str]
) -> None:
    name = f"dp-rbac-{next(_names)}"
    node_names.append(name)
    create_nodes(kube, [gpu_node(name, [16])])
    with control_plane.client(plugin_kubeconfig) as plugin:
        with pytest.raises(ApiError) as deleting:
            plugin.delete(Node, name)
        assert deleting.value.status.code == 403
        patch = {"metadata": {"annotations": {"x": "y"}}}
        with pytest.raises(ApiError) as patching:
            plugin.patch(Pod, "any", patch, namespace="default", patch_type=PatchType.MERGE)
        assert patching.value.status.code == 403
    assert read_node(kube, name)["metadata"]["name"] == name

    # Without nodes/status patch: the annotation is written, the status refused, and the error
    # names the verb, the resource and the rule to add.
    no_status = control_plane.service_account_kubeconfig(
        "gpushare-device-plugin-no-status", NAMESPACE, PLUGIN_RULES[:1]
    )

    async def scenario() -> None:
        faults = FaultyTransport.for_control_plane(control_plane, client_certificate=False)
        async with plugin_client(control_plane, no_status, faults) as (client, _):
            publisher = NodePublisher(client)
            with pytest.raises(ApiCallError) as refused:
                await publisher.publish(name, "GiB", GPUS[:1])
            error = refused.value
            assert error.failure is Failure.FORBIDDEN
            assert not error.temporary
            assert error.status_code == 403
            assert publisher.api_calls == 2  # permanent: not retried
            message = str(error)
            assert message.startswith(f"patch nodes/status {name}: forbidden (HTTP 403): ")
            assert 'cannot patch resource "nodes/status"' in message
            assert (
                'the ClusterRole needs the rule {apiGroups: [""], resources: ["nodes/status"], '
                'verbs: ["patch"]}' in message
            )
            # A failed publish is not remembered: the same publish tries again.
            with pytest.raises(ApiCallError):
                await publisher.publish(name, "GiB", GPUS[:1])
            assert publisher.api_calls == 4

    asyncio.run(scenario())


def test_missing_node_and_unreachable_server(
    control_plane: ControlPlane, plugin_kubeconfig: Path
) -> None:
    async def scenario() -> None:
        faults = FaultyTransport.for_control_plane(control_plane, client_certificate=False)
        pauses: list[float] = []
        back_after: list[int] = [2]  # the server comes back after this many pauses

        async def sleep(seconds: float) -> None:
            pauses.append(seconds)
            if len(pauses) in back_after:
                faults.come_back()

        async with plugin_client(control_plane, plugin_kubeconfig, faults) as (client, counted):
            publisher = NodePublisher(client, backoff_s=0.05, sleep=sleep)
            assert not await publisher.node_exists("no-such-node")
            with pytest.raises(ValueError, match="unit must be one of GiB, MiB, got 'GB'"):
                await publisher.publish("no-such-node", "GB", GPUS)
            with pytest.raises(ValueError, match="empty node name"):
                await publisher.publish("", "GiB", GPUS)
            assert publisher.api_calls == 1  # refused before any request
            with pytest.raises(ApiCallError) as missing:
                await publisher.publish("no-such-node", "GiB", GPUS)
            assert missing.value.failure is Failure.NOT_FOUND
            assert str(missing.value) == (
                "patch nodes no-such-node: not found (HTTP 404): node no-such-node not found "
                "(is NODE_NAME set from spec.nodeName via the downward API?)"
            )

            # Unreachable twice, then back: retried with a doubling pause.
            faults.go_down()
            counted.requests.clear()
            assert not await publisher.node_exists("no-such-node")
            assert pauses == [0.05, 0.1]
            assert len(counted.requests) == 3

            # Unreachable for good: given up after the attempts, as a temporary error.
            pauses.clear()
            back_after.clear()
            faults.go_down()
            with pytest.raises(ApiCallError) as unreachable:
                await publisher.node_exists("no-such-node")
            assert unreachable.value.failure is Failure.UNREACHABLE
            assert unreachable.value.temporary
            assert "gave up after 4 attempts" in str(unreachable.value)
            assert pauses == [0.05, 0.1, 0.2]

    asyncio.run(scenario())
