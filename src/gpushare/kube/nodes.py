"""Publishing the node's GPU inventory to the API server (the device plugin's side of a node).

:meth:`NodePublisher.publish` writes, for one node and its GPUs:

1. **The inventory annotation** ``gpushare.io/gpu-inventory`` (format: ``gpushare.kube.codec``,
   encoder :func:`~gpushare.kube.codec.inventory_annotation`): the unit and, per GPU, index,
   UUID, model, memory in the unit and health. The extender and ``inspect`` read it back with
   :func:`~gpushare.kube.codec.node_info`. A JSON merge patch of ``metadata.annotations``
   (``PATCH /api/v1/nodes/{node}``, ``application/merge-patch+json``): other annotations are
   left alone.
2. **``aliyun.com/gpu-count``** in ``status.capacity`` (the number of GPUs) and
   ``status.allocatable`` (the number of healthy GPUs): a JSON patch of the status subresource
   (docs/interfaces.md, "Extended resources", way 2: ``PATCH /api/v1/nodes/{node}/status``,
   ``application/json-patch+json``, ``/`` in the key escaped as ``~1``). On a node with a
   kubelet, the kubelet rebuilds ``allocatable`` from ``capacity`` at every status sync (every
   10 s by default), so there allocatable ends up equal to capacity; under kwok (the tests)
   there is no kubelet, so allocatable is written too. Alibaba's device plugin
   (``patchGPUCount``) also writes both.

``aliyun.com/gpu-mem`` is **not** written here: the kubelet maintains it from the device
plugin's device list (ListAndWatch; capacity = all units, allocatable = units of healthy GPUs).

A publish that would write what the last successful publish of the same node wrote makes no
API call (``force=True`` writes anyway, e.g. after the node object was recreated). Temporary
failures (409 conflict, 429, 5xx, no reply) are retried ``attempts`` times in all with a short
doubling backoff (or the server's ``Retry-After``, capped); then, or at once for a permanent
failure, :meth:`~NodePublisher.publish` raises :class:`~gpushare.kube.errors.ApiCallError`
whose message is one log line: forbidden names the verb, the resource and the RBAC rule to
add; a missing node asks whether ``NODE_NAME`` comes from ``spec.nodeName``.

RBAC (:data:`RBAC_RULES`, docs/deviceplugin.md): ``nodes`` ``get`` (:meth:`node_exists`) and
``patch``; ``nodes/status`` ``patch``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeVar

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from gpushare.core.serves import Serves
from gpushare.kube.codec import GPU_COUNT, INVENTORY, InventoryGpu, inventory_annotation
from gpushare.kube.errors import CLIENT_ERRORS, ApiCallError, Failure, api_call_error

__all__ = ["NODE_NAME_HINT", "RBAC_RULES", "NodePublisher", "json_pointer_key"]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
)
"""The ClusterRole rules :class:`NodePublisher` needs, as ``rbac.authorization.k8s.io/v1``
``PolicyRule`` JSON."""

NODE_NAME_HINT = "is NODE_NAME set from spec.nodeName via the downward API?"

_T = TypeVar("_T")
_Sleep = Callable[[float], Awaitable[None]]
_State = tuple[str, int, int]  # (annotation, GPU count, healthy GPU count)


def json_pointer_key(key: str) -> str:
    """``key`` as one JSON-pointer segment (RFC 6901): ``~`` → ``~0``, ``/`` → ``~1``;
    ``"aliyun.com/gpu-count"`` → ``"aliyun.com~1gpu-count"``."""
    return key.replace("~", "~0").replace("/", "~1")


def _rule_hint(verb: str, resource: str) -> str:
    return (
        f'the ClusterRole needs the rule {{apiGroups: [""], resources: ["{resource}"], '
        f'verbs: ["{verb}"]}} (docs/deviceplugin.md, "RBAC")'
    )


class NodePublisher:
    """Publishes nodes' GPU inventories through ``client`` (owned by the caller).

    ``attempts`` (>= 1): tries per API call for temporary failures; ``backoff_s`` the first
    pause between them (seconds, doubled each time up to ``max_backoff_s``; a server's
    ``Retry-After`` is used instead when given, capped likewise); ``sleep`` is injectable for
    tests. ``api_calls`` counts the requests sent (retries included), ``skipped`` the publishes
    that sent none because nothing had changed.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        attempts: int = 4,
        backoff_s: float = 0.1,
        max_backoff_s: float = 2.0,
        sleep: _Sleep = asyncio.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        if backoff_s < 0 or max_backoff_s < backoff_s:
            raise ValueError(
                f"need 0 <= backoff_s <= max_backoff_s, got {backoff_s} and {max_backoff_s}"
            )
        self._client = client
        self._attempts = attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._sleep = sleep
        self._published: dict[str, _State] = {}
        self._lock = asyncio.Lock()
        self.api_calls = 0
        self.skipped = 0

    async def publish(
        self,
        node_name: str,
        unit: str,
        gpus: Sequence[InventoryGpu],
        *,
        force: bool = False,
        serves: Serves = Serves.BOTH,
    ) -> bool:
        """Write ``gpus`` (memory in ``unit``, ``"GiB"``/``"MiB"``) to node ``node_name``: the
        inventory annotation, then ``aliyun.com/gpu-count`` capacity (all GPUs) and allocatable
        (healthy GPUs); ``serves``: what the node serves (the inventory's ``serves``, docs/
        node-config.md). True when it wrote, False when it skipped because the last successful
        publish to this node wrote the same (never with ``force``).

        Raises ``ValueError`` (before any call) for a bad inventory (``inventory_annotation``),
        :class:`~gpushare.kube.errors.ApiCallError` when the API server refuses or cannot be
        reached after the retries (``NOT_FOUND``: no such node; ``FORBIDDEN``: RBAC). After a
        failure the next publish writes everything again.
        """
        if not node_name:
            raise ValueError(f"empty node name ({NODE_NAME_HINT})")
        annotation = inventory_annotation(unit, gpus, serves)
        state = (annotation, len(gpus), sum(1 for gpu in gpus if gpu.healthy))
        async with self._lock:  # one publish at a time: the last one called wins
            if not force and self._published.get(node_name) == state:
                self.skipped += 1
                return False
            self._published.pop(node_name, None)
            status = await self._annotate(node_name, annotation)
            await self._patch_gpu_count(node_name, status, state[1], state[2])
            self._published[node_name] = state
            return True

    async def node_exists(self, node_name: str) -> bool:
        """Whether node ``node_name`` exists (``GET nodes``; RBAC ``nodes`` ``get``). Raises
        :class:`~gpushare.kube.errors.ApiCallError` for any other failure."""
        try:
            await self._call(node_name, "get", "nodes", lambda: self._client.get(Node, node_name))
        except ApiCallError as error:
            if error.failure is Failure.NOT_FOUND:
                return False
            raise
        return True

    async def _annotate(self, node_name: str, annotation: str) -> dict[str, Any]:
        """Merge-patch the annotation; the node's ``status`` as the reply carries it."""
        patch = {"metadata": {"annotations": {INVENTORY: annotation}}}
        node = await self._call(
            node_name,
            "patch",
            "nodes",
            lambda: self._client.patch(Node, node_name, patch, patch_type=PatchType.MERGE),
        )
        return node.to_dict().get("status") or {}

    async def _patch_gpu_count(
        self, node_name: str, status: Mapping[str, Any], count: int, healthy: int
    ) -> None:
        """JSON-patch ``aliyun.com/gpu-count`` into capacity and allocatable (an ``add``
        replaces an existing member; a missing map is added whole)."""
        operations: list[dict[str, Any]] = []
        for field, value in (("capacity", count), ("allocatable", healthy)):
            if isinstance(status.get(field), Mapping):
                path = f"/status/{field}/{json_pointer_key(GPU_COUNT)}"
                operations.append({"op": "add", "path": path, "value": str(value)})
            else:
                operations.append(
                    {"op": "add", "path": f"/status/{field}", "value": {GPU_COUNT: str(value)}}
                )
        await self._call(
            node_name,
            "patch",
            "nodes/status",
            lambda: self._client.patch(
                Node.Status, node_name, operations, patch_type=PatchType.JSON
            ),
        )

    async def _call(
        self, node_name: str, verb: str, resource: str, request: Callable[[], Awaitable[_T]]
    ) -> _T:
        """``request()`` (``verb`` on ``resource`` ``node_name``) with the retries; failures
        as ``ApiCallError`` (``what``: e.g. ``"patch nodes/status n1"``) with the hints."""
        what = f"{verb} {resource} {node_name}"
        delay = self._backoff_s
        for attempt in range(1, self._attempts + 1):
            self.api_calls += 1
            try:
                return await request()
            except CLIENT_ERRORS as exc:
                error = api_call_error(what, exc)
                if not error.temporary or attempt == self._attempts:
                    raise self._explained(error, node_name, verb, resource) from exc
            pause = error.retry_after_s if error.retry_after_s is not None else delay
            await self._sleep(min(pause, self._max_backoff_s))
            delay = min(delay * 2, self._max_backoff_s)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _explained(
        self, error: ApiCallError, node_name: str, verb: str, resource: str
    ) -> ApiCallError:
        if error.failure is Failure.NOT_FOUND:
            detail = f"node {node_name} not found ({NODE_NAME_HINT})"
        elif error.failure is Failure.FORBIDDEN:
            detail = f"{error.detail}; {_rule_hint(verb, resource)}"
        elif error.temporary:
            detail = f"{error.detail} (gave up after {self._attempts} attempts)"
        else:
            return error
        return ApiCallError(
            error.what,
            error.failure,
            detail,
            status_code=error.status_code,
            retry_after_s=error.retry_after_s,
        )
