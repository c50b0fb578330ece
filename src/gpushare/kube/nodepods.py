"""The device plugin's view of pods: the GPU-memory pods bound to its own node, and the
annotation patch that records a handshake step.

:class:`NodePods` keeps a list+watch cache (``gpushare.kube.watch.Reflector``) of the pods with
``spec.nodeName`` = the node that ask ``aliyun.com/gpu-mem``, so that Allocate reads memory, not
the API server. A pod kubelet is admitting may not have reached the cache yet (both watch the
same binding): ``list_now`` lists the node's pods directly for that case.

RBAC: ``pods`` ``get``, ``list``, ``watch`` and ``patch``; ``events`` ``create`` for Allocate's
Events (:data:`RBAC_RULES`, ``docs/deviceplugin.md``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable, Mapping, Sequence

from lightkube import AsyncClient
from lightkube.core.client import FieldValue
from lightkube.resources.core_v1 import Pod
from lightkube.types import PatchType

from gpushare.kube.cache import requests_gpu_mem
from gpushare.kube.errors import CLIENT_ERRORS, api_call_error
from gpushare.kube.watch import Backoff, Change, JsonObject, Reflector, namespaced_key, plain_dict

__all__ = ["RBAC_RULES", "NodePods"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
"""The ClusterRole rules the device plugin's Allocate needs (PolicyRule JSON): this module's pod
reads and patches, and the Events it records (``gpushare.kube.events``)."""


def _ignore(_change: Change) -> None:
    return None


class NodePods:
    """GPU-memory pods bound to node ``node_name`` (module doc). ``client`` is the caller's;
    ``keep`` chooses the pods kept (``requests_gpu`` also keeps the request dialects' pods,
    for a plugin that serves them: ``gpushare.deviceplugin.dialects``; the DRA driver keeps
    the pods with claims); ``on_change`` hears each change the cache takes in."""

    def __init__(
        self,
        client: AsyncClient,
        node_name: str,
        *,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
        keep: Callable[[Pod], bool] = requests_gpu_mem,
        on_change: Callable[[Change], None] = _ignore,
    ) -> None:
        self._client = client
        self._keep = keep
        self.node_name = node_name
        self._fields: dict[str, FieldValue] = {"spec.nodeName": node_name}
        self._task: asyncio.Task[None] | None = None
        self._reflector = Reflector(
            kind="Pod",
            list_fn=lambda: client.list(Pod, namespace="*", fields=self._fields),
            watch_fn=lambda rv, timeout_s: client.watch(
                Pod,
                namespace="*",
                fields=self._fields,
                resource_version=rv,
                server_timeout=timeout_s,
            ),
            key=namespaced_key,
            keep=keep,
            sink=on_change,
            backoff=backoff or Backoff(),
            watch_timeout_s=watch_timeout_s,
            rng=random.Random(),
        )

    def start(self) -> None:
        """List and watch in a background task (needs a running event loop)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._reflector.run(), name="gpushare-node-pods"
            )

    async def stop(self) -> None:
        """Stop watching; the last snapshot stays readable."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def wait_synced(self, timeout_s: float) -> None:
        """Return once the first list is in; ``TimeoutError`` after ``timeout_s`` seconds."""
        async with asyncio.timeout(timeout_s):
            await self._reflector.synced.wait()

    @property
    def stale(self) -> bool:
        """True while the cache may lag the API server (``Reflector.stale``)."""
        return self._reflector.stale

    def pods(self) -> list[JsonObject]:
        """The cached pods (plain dicts, read-only)."""
        return list(self._reflector.snapshot().values())

    async def list_now(self) -> list[JsonObject]:
        """The node's GPU-memory pods straight from the API server. ``ApiCallError`` on
        failure."""
        try:
            return [
                plain_dict(pod)
                async for pod in self._client.list(Pod, namespace="*", fields=self._fields)
                if self._keep(pod)
            ]
        except CLIENT_ERRORS as error:
            raise api_call_error(f"LIST pods on node {self.node_name}", error) from error

    async def patch_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge ``annotations`` into pod ``namespace/name``. ``ApiCallError`` on failure."""
        patch = {"metadata": {"annotations": dict(annotations)}}
        try:
            await self._client.patch(
                Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE
            )
        except CLIENT_ERRORS as error:
            raise api_call_error(f"PATCH pod {namespace}/{name}", error) from error
