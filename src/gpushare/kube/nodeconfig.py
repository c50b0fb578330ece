"""The device plugin's view of the per-node configuration: ConfigMap ``gpushare-node-config``
(format, precedence and errors: ``gpushare.kube.codec.nodeconfig``; docs/node-config.md).

:class:`NodeConfigWatch` lists and watches that one ConfigMap and the plugin's own Node (its
labels choose the selector entries; ``metadata.name`` field selectors,
``gpushare.kube.watch.Reflector``), and calls ``on_change`` with the node's configuration
whenever it changes, from either side, or is good again after an error. A configuration that
cannot be read goes to ``on_invalid`` with the error (once per distinct error) and changes
nothing: the last good configuration stays in force until the ConfigMap is fixed. A deleted
ConfigMap is an empty configuration (the flags' values). :meth:`NodeConfigWatch.wait_synced`
returns once both first lists are in and read, so that the plugin starts with the
configuration rather than moving to it.

RBAC: ``configmaps`` ``get``, ``list``, ``watch`` in the ConfigMap's namespace
(:data:`RBAC_RULES`, a Role there), ``nodes`` ``list``, ``watch`` (:data:`NODE_RBAC_RULES`,
the ClusterRole); docs/deviceplugin.md, "RBAC".
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence

import yaml
from lightkube import AsyncClient
from lightkube.core.client import FieldValue
from lightkube.resources.core_v1 import ConfigMap, Node

from gpushare.kube.codec import CodecError, Json
from gpushare.kube.codec.nodeconfig import NODE_CONFIG_NAME, NodeConfig, node_config
from gpushare.kube.watch import Backoff, Change, JsonObject, Reflector

__all__ = ["NODE_RBAC_RULES", "RBAC_RULES", "NodeConfigWatch", "yaml_document"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
)
"""The rules of the device plugin's Role in the ConfigMap's namespace (PolicyRule JSON)."""
NODE_RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
)
"""The ClusterRole rules for watching the plugin's own Node (its labels)."""


def yaml_document(text: str) -> object:
    """``text`` read as YAML (safe); ``ValueError`` ``not YAML at line N: <problem>``."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise ValueError(f"not YAML{where}: {problem}") from None


def _name(obj: object) -> str:
    meta = getattr(obj, "metadata", None)
    return str(getattr(meta, "name", "") or "")


def _labels(node: Json | None) -> Mapping[str, str]:
    meta = (node or {}).get("metadata") or {}
    labels = meta.get("labels") or {}
    return labels if isinstance(labels, dict) else {}


class NodeConfigWatch:
    """The configuration of node ``node_name`` from ConfigMap ``namespace``/``name`` (module
    doc). ``client`` is the caller's. :attr:`config` is the last good one; :attr:`node` the
    last Node object seen (``None`` before the first list, or when the node is gone)."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        on_change: Callable[[NodeConfig], Awaitable[None]],
        on_invalid: Callable[[CodecError], Awaitable[None]],
        *,
        namespace: str,
        name: str = NODE_CONFIG_NAME,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.node_name = node_name
        self.namespace = namespace
        self.name = name
        self.config = NodeConfig()
        self._error = ""
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._changed = asyncio.Event()
        self._read_once = asyncio.Event()
        by_name: dict[str, FieldValue] = {"metadata.name": name}
        by_node: dict[str, FieldValue] = {"metadata.name": node_name}
        self._configmaps = Reflector(
            kind="ConfigMap",
            list_fn=lambda: client.list(ConfigMap, namespace=namespace, fields=by_name),
            watch_fn=lambda rv, timeout_s: client.watch(
                ConfigMap,
                namespace=namespace,
                fields=by_name,
                resource_version=rv,
                server_timeout=timeout_s,
            ),
            key=_name,
            sink=self._sink,
            backoff=backoff or Backoff(),
            watch_timeout_s=watch_timeout_s,
            rng=random.Random(),
        )
        self._nodes = Reflector(
            kind="Node",
            list_fn=lambda: client.list(Node, fields=by_node),
            watch_fn=lambda rv, timeout_s: client.watch(
                Node, fields=by_node, resource_version=rv, server_timeout=timeout_s
            ),
            key=_name,
            sink=self._sink,
            backoff=backoff or Backoff(),
            watch_timeout_s=watch_timeout_s,
            rng=random.Random(),
        )

    @property
    def node(self) -> JsonObject | None:
        """The plugin's Node as last seen."""
        return self._nodes.get(self.node_name)

    def _sink(self, _change: Change) -> None:
        self._changed.set()

    async def wait_synced(self, timeout_s: float) -> None:
        """Return once the ConfigMap and the Node have been listed and the configuration
        read; ``TimeoutError`` after ``timeout_s`` seconds."""
        async with asyncio.timeout(timeout_s):
            await self._read_once.wait()

    def read(self) -> NodeConfig:
        """The configuration the ConfigMap gives the node now; ``CodecError`` when it cannot
        be read (module doc)."""
        configmap = self._configmaps.get(self.name)
        return node_config(configmap, self.node_name, _labels(self.node), load=yaml_document)

    async def run(self) -> None:
        """Watch until cancelled, calling back on every change (module doc)."""
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._configmaps.run(), name="gpushare-node-config"),
            loop.create_task(self._nodes.run(), name="gpushare-node-config-node"),
        ]
        try:
            await self._configmaps.synced.wait()
            await self._nodes.synced.wait()
            while True:
                self._changed.clear()
                await self._apply()
                self._read_once.set()
                await self._changed.wait()
        finally:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _apply(self) -> None:
        try:
            config = self.read()
        except CodecError as error:
            if str(error) != self._error:
                self._error = str(error)
                await self._on_invalid(error)
            return
        recovered, self._error = bool(self._error), ""
        if recovered or config != self.config or config.sources != self.config.sources:
            self.config = config
            await self._on_change(config)
