"""The device plugin's view of Alibaba's hand-kept health list: ConfigMap
``kube-system/unhealthy-gpu-<node>`` (format: ``gpushare.kube.codec.configmaps``).

:class:`UnhealthyMarks` lists and watches that one ConfigMap (a ``metadata.name`` field
selector, ``gpushare.kube.watch.Reflector``) and calls ``on_change`` with the GPU indices it
marks whenever they change (an empty set when the ConfigMap is deleted or marks none). A value
that cannot be read goes to ``on_invalid`` with the error and changes nothing: the last good
marks stay in force until the ConfigMap is fixed.

RBAC: ``configmaps`` ``get``, ``list``, ``watch`` in ``kube-system`` (:data:`RBAC_RULES`, a
Role there; ``docs/deviceplugin.md``, "RBAC").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping, Sequence

from lightkube import AsyncClient

from gpushare.kube.codec import CodecError
from gpushare.kube.codec.configmaps import (
    UNHEALTHY_NAMESPACE,
    marked_unhealthy,
    unhealthy_configmap_name,
)
from gpushare.kube.configmap import configmap_reflector
from gpushare.kube.watch import Backoff, Change

__all__ = ["RBAC_RULES", "UnhealthyMarks"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]},
)
"""The rules of the device plugin's Role in ``kube-system`` (PolicyRule JSON)."""


class UnhealthyMarks:
    """The GPUs of node ``node_name`` marked unhealthy by hand (module doc). ``gpu_indices``:
    the node's GPUs (a mark naming another is invalid). ``client`` is the caller's."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        gpu_indices: frozenset[int],
        on_change: Callable[[frozenset[int]], Awaitable[None]],
        on_invalid: Callable[[CodecError], Awaitable[None]],
        *,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
    ) -> None:
        self.name = unhealthy_configmap_name(node_name)
        self.marked: frozenset[int] = frozenset()
        self._indices = gpu_indices
        self._on_change = on_change
        self._on_invalid = on_invalid
        self._changed = asyncio.Event()
        self._reflector = configmap_reflector(
            client,
            UNHEALTHY_NAMESPACE,
            self.name,
            self._sink,
            backoff=backoff,
            watch_timeout_s=watch_timeout_s,
        )

    def _sink(self, _change: Change) -> None:
        self._changed.set()

    async def run(self) -> None:
        """Watch until cancelled, calling back on every change of the marks (module doc)."""
        watch = asyncio.get_running_loop().create_task(
            self._reflector.run(), name="gpushare-unhealthy-marks"
        )
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                await self._apply()
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    async def _apply(self) -> None:
        configmap = self._reflector.get(self.name)
        try:
            marked = (
                frozenset() if configmap is None else marked_unhealthy(configmap, self._indices)
            )
        except CodecError as error:
            await self._on_invalid(error)
            return
        if marked != self.marked:
            self.marked = marked
            await self._on_change(marked)
