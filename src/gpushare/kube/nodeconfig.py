"""The device plugin's view of the per-node configuration: ConfigMap ``gpushare-node-config``
(format, precedence and errors: ``gpushare.kube.codec.nodeconfig``; docs/node-config.md).

:class:`NodeConfigWatch` lists and watches that one ConfigMap (a ``metadata.name`` field
selector, ``gpushare.kube.watch.Reflector``) and reads the plugin's own Node (``GET``: its
labels choose the selector entries) at start, on every ConfigMap change and every
``node_poll_s``; it calls ``on_change`` with the node's configuration whenever it changes, from
either side, or is good again after an error. A configuration that cannot be read goes to
``on_invalid`` with the error (once per distinct error) and changes nothing: the last good
configuration stays in force until the ConfigMap is fixed; whatever the ConfigMap holds (an
error of any kind while reading it is logged with its traceback and refused the same way), the
watch goes on. What is read is bounded (``yaml_document``: size, no aliases, depth, values) and
everything echoed too (``gpushare.kube.codec.common.shown``). A deleted ConfigMap is an empty
configuration (the flags' values). :meth:`NodeConfigWatch.wait_synced` returns once the
ConfigMap is listed, the Node read and the configuration read, so that the plugin starts with
the configuration rather than moving to it.

The Node is polled with ``get``, not watched, so that the plugin needs no ``list``/``watch``
of every node (the chart's ClusterRole gives it ``get`` and ``patch`` of nodes): a label change
reaches it within ``node_poll_s`` (30 s by default).

RBAC: ``configmaps`` ``get``, ``list``, ``watch`` in the ConfigMap's namespace
(:data:`RBAC_RULES`, a Role there); ``nodes`` ``get`` (``gpushare.kube.nodes.RBAC_RULES``);
docs/deviceplugin.md, "RBAC".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import yaml
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from gpushare.kube.codec import CodecError, node_labels
from gpushare.kube.codec.common import shown
from gpushare.kube.codec.nodeconfig import NODE_CONFIG_NAME, NodeConfig, node_config
from gpushare.kube.configmap import configmap_reflector
from gpushare.kube.errors import CLIENT_ERRORS, api_call_error
from gpushare.kube.watch import Backoff, Change, JsonObject, plain_dict

__all__ = ["RBAC_RULES", "NodeConfigWatch", "yaml_document"]

log = logging.getLogger(__name__)
_READ_ERRORS: tuple[type[Exception], ...] = (ApiError, *CLIENT_ERRORS)

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
)
"""The rules of the device plugin's Role in the ConfigMap's namespace (PolicyRule JSON)."""


MAX_DOCUMENT_BYTES = 256 * 1024
"""The node configuration read at most (a ConfigMap holds 1 MiB; a real one is a few KiB)."""
MAX_DEPTH = 16
"""Nesting levels read at most (the format needs 4)."""
MAX_NODES = 100_000
"""YAML nodes (scalars, lists, maps) read at most."""


class _BoundedLoader(yaml.SafeLoader):
    """PyYAML's safe loader, bounded: no anchors or aliases (an alias repeats a value without
    its bytes: a few hundred bytes can stand for a billion values), at most ``MAX_DEPTH``
    levels (PyYAML composes recursively) and ``MAX_NODES`` nodes."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()  # type: ignore[no-untyped-call]
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None):
            raise yaml.composer.ComposerError(
                None, None, "anchors and aliases (&name, *name) are not accepted",
                event.start_mark,
            )  # fmt: skip
        self._nodes += 1
        if self._nodes > MAX_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"more than {MAX_NODES:,} values", event.start_mark
            )
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", event.start_mark
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def yaml_document(text: str) -> object:
    """``text`` read as YAML (safe, bounded: ``_BoundedLoader``, at most
    ``MAX_DOCUMENT_BYTES``); ``ValueError`` ``not YAML at line N: <problem>``, or naming the
    bound crossed."""
    if len(text.encode("utf-8", "replace")) > MAX_DOCUMENT_BYTES:
        raise ValueError(
            f"{len(text):,} characters: more than the {MAX_DOCUMENT_BYTES // 1024} KiB read"
        )
    try:
        return yaml.load(text, Loader=_BoundedLoader)  # a SafeLoader: no Python objects
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise ValueError(f"not YAML{where}: {problem}") from None


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
        node_poll_s: float = 30.0,
    ) -> None:
        self.node_name = node_name
        self.node: JsonObject | None = None
        """The plugin's Node as last read (``None`` before, or when it could not be read)."""
        self._client = client
        self._node_poll_s = node_poll_s
        self._node_error = ""
        self.namespace = namespace
        self.name = name
        self.config = NodeConfig()
        self._error = ""
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._changed = asyncio.Event()
        self._configmap_changed = False  # the Node is read again only for a ConfigMap change
        self._read_once = asyncio.Event()
        self._configmaps = configmap_reflector(
            client, namespace, name, self._sink, backoff=backoff, watch_timeout_s=watch_timeout_s
        )

    async def _read_node(self) -> None:
        """GET the plugin's Node; a failure is logged once per distinct error and keeps the
        last one read."""
        try:
            node = await self._client.get(Node, self.node_name)
        except _READ_ERRORS as error:
            text = str(api_call_error(f"get nodes {self.node_name}", error))
            if text != self._node_error:
                self._node_error = text
                log.warning("node config: reading the node's labels: %s", text)
            return
        self._node_error = ""
        self.node = plain_dict(node)

    async def _poll_node(self) -> None:
        while True:
            await asyncio.sleep(self._node_poll_s)
            before = node_labels(self.node or {})
            await self._read_node()
            if node_labels(self.node or {}) != before:
                self._changed.set()

    def _sink(self, _change: Change) -> None:
        self._configmap_changed = True
        self._changed.set()

    async def wait_synced(self, timeout_s: float) -> None:
        """Return once the ConfigMap has been listed, the Node read and the configuration
        read; ``TimeoutError`` after ``timeout_s`` seconds."""
        async with asyncio.timeout(timeout_s):
            await self._read_once.wait()

    def read(self) -> NodeConfig:
        """The configuration the ConfigMap gives the node now; ``CodecError`` when it cannot
        be read (module doc)."""
        configmap = self._configmaps.get(self.name)
        return node_config(
            configmap, self.node_name, node_labels(self.node or {}), load=yaml_document
        )

    async def run(self) -> None:
        """Watch until cancelled, calling back on every change (module doc)."""
        loop = asyncio.get_running_loop()
        tasks = [
            loop.create_task(self._configmaps.run(), name="gpushare-node-config"),
            loop.create_task(self._poll_node(), name="gpushare-node-config-node"),
        ]
        try:
            await self._configmaps.synced.wait()
            while True:
                reread = self._configmap_changed or not self._read_once.is_set()
                self._changed.clear()
                self._configmap_changed = False
                if reread:  # a ConfigMap change (or the start): read the labels again too;
                    await self._read_node()  # a label change was read by _poll_node already
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
            await self._refuse(error)
            return
        except Exception as error:  # any content, any bug: the watch goes on and says why
            log.exception("node config: reading ConfigMap %s/%s failed", self.namespace, self.name)
            await self._refuse(
                CodecError(
                    f"node {self.node_name}: configmap {self.namespace}/{self.name}",
                    "data", type(error).__name__, f"cannot be read: {shown(str(error))}",
                    "a document docs/node-config.md describes",
                )
            )  # fmt: skip
            return
        recovered, self._error = bool(self._error), ""
        if recovered or config != self.config or config.sources != self.config.sources:
            self.config = config
            await self._on_change(config)

    async def _refuse(self, error: CodecError) -> None:
        """Tell ``on_invalid`` once per distinct error; the last good configuration stays."""
        if str(error) != self._error:
            self._error = str(error)
            await self._on_invalid(error)
