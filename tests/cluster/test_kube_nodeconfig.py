"""``gpushare.kube.nodeconfig.NodeConfigWatch`` on the real API server: which change reads the
plugin's Node again.

* The start and every ConfigMap change read the Node (``get``) from the watch loop: a selector
  entry may follow labels changed since.
* A label change is found by the poll's own ``get``; applying it reads nothing more.

The daemon around the watch (selector entries following labels end to end) is in
``test_deviceplugin_nodeconfig.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from typing import Any, cast

import pytest
from lightkube import AsyncClient, Client
from lightkube.resources.core_v1 import ConfigMap, Node

from gpushare.kube.client import connect
from gpushare.kube.codec import CodecError, MemoryUnit
from gpushare.kube.codec.nodeconfig import NodeConfig
from gpushare.kube.nodeconfig import NodeConfigWatch
from gpushare.testing.controlplane import ControlPlane, async_wait_until
from gpushare.testing.nodes import apply_node_config, create_nodes, delete_nodes, plain_node

pytestmark = pytest.mark.cluster

WAIT_S = 30.0
WATCH_TASK = "node-config-watch"
_names = itertools.count()


class NodeGets:
    """A real ``AsyncClient`` that also records, per ``get`` of a Node, the name of the asyncio
    task that sent it (the watch loop, or the poll ``gpushare-node-config-node``)."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self.tasks: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    async def get(self, resource: Any, name: str, **options: Any) -> Any:
        if resource is Node:
            task = asyncio.current_task()
            self.tasks.append("" if task is None else task.get_name())
        return await self._client.get(resource, name, **options)

    def by_watch_loop(self) -> int:
        return self.tasks.count(WATCH_TASK)


def test_a_label_change_read_by_the_poll_is_not_read_again_and_a_configmap_change_is(
    control_plane: ControlPlane, kube: Client
) -> None:
    node = f"nc-watch-{next(_names)}-{int(time.time())}"
    configmap = f"config-{node}"
    create_nodes(kube, [plain_node(node, labels={"pool": "small"})])
    apply_node_config(kube, configmap, "nodes:\n- selector: {pool: small}\n  memoryUnit: MiB\n")

    async def scenario() -> None:
        client = connect(control_plane.kubeconfig, trust_env=False)
        gets = NodeGets(client)
        changes: asyncio.Queue[NodeConfig] = asyncio.Queue()

        async def invalid(error: CodecError) -> None:
            raise AssertionError(f"unexpected invalid config: {error}")

        watch = NodeConfigWatch(
            cast(AsyncClient, gets), node, changes.put, invalid,
            namespace="kube-system", name=configmap, node_poll_s=0.3,
        )  # fmt: skip
        task = asyncio.create_task(watch.run(), name=WATCH_TASK)
        try:
            await watch.wait_synced(WAIT_S)
            first = await asyncio.wait_for(changes.get(), WAIT_S)
            assert first.memory_unit is MemoryUnit.MIB
            assert gets.by_watch_loop() == 1  # the start

            # The label goes: the poll reads it, the selector no longer matches.
            await client.patch(Node, node, {"metadata": {"labels": {"pool": None}}})
            second = await asyncio.wait_for(changes.get(), WAIT_S)
            assert second.memory_unit is None
            assert gets.by_watch_loop() == 1  # no second get for what the poll read

            # A ConfigMap change reads the Node again from the watch loop.
            big = "nodes:\n- selector: {pool: big}\n  memoryUnit: MiB\n"
            apply_node_config(kube, configmap, big)
            await async_wait_until(
                "2 reads by the watch loop", lambda: gets.by_watch_loop() == 2, WAIT_S
            )
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        kube.delete(ConfigMap, configmap, namespace="kube-system")
        delete_nodes(kube, [node])


BILLION_LAUGHS = (  # 623 bytes: level 8 expands to 9^8 values wherever something walks it
    'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    + "".join(
        f"{b}: &{b} [{','.join(['*' + a] * 9)}]\n"
        for a, b in zip("abcdefg", "bcdefgh", strict=True)
    )
    + "nodes: [{name: x, serves: *h}]\n"
)
DEEP = "nodes: " + "[" * 5000 + "]" * 5000 + "\n"


def test_a_watch_refuses_an_alias_bomb_and_deep_nesting_and_applies_the_next_good_config(
    control_plane: ControlPlane, kube: Client
) -> None:
    """A 623-byte alias bomb and a document nested 5,000 deep are
    each refused with a line that names the problem (nothing expanded: the message is short),
    and the watch lives on: a valid configuration after them is applied."""
    node = f"nc-attack-{next(_names)}-{int(time.time())}"
    configmap = f"config-{node}"
    create_nodes(kube, [plain_node(node)])
    apply_node_config(kube, configmap, "defaults: {serves: both}\n")

    async def scenario() -> None:
        client = connect(control_plane.kubeconfig, trust_env=False)
        changes: asyncio.Queue[NodeConfig] = asyncio.Queue()
        refused: asyncio.Queue[CodecError] = asyncio.Queue()
        watch = NodeConfigWatch(
            client, node, changes.put, refused.put, namespace="kube-system", name=configmap
        )
        task = asyncio.create_task(watch.run(), name=WATCH_TASK)
        try:
            await watch.wait_synced(WAIT_S)
            await asyncio.wait_for(changes.get(), WAIT_S)
            for text, why in ((BILLION_LAUGHS, "anchors and aliases"), (DEEP, "nested deeper")):
                apply_node_config(kube, configmap, text)
                error = await asyncio.wait_for(refused.get(), WAIT_S)
                assert why in str(error)
                assert len(str(error)) < 600
            apply_node_config(kube, configmap, "defaults: {serves: whole}\n")
            good = await asyncio.wait_for(changes.get(), WAIT_S)
            assert str(good.serves) == "whole"
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await client.close()

    try:
        asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        kube.delete(ConfigMap, configmap, namespace="kube-system")
        delete_nodes(kube, [node])
