"""One read of the cluster for ``kubectl inspect gpushare``: every Node and the GPU-memory pods.

:func:`read_cluster` lists straight from the API server (no watch, no cache, no extender), so
the inspect tool works when the extender is down. The objects are the API server's JSON as
plain dicts (``plain_dict``), as the cache keeps them; the caller turns them into a report.

RBAC: ``nodes`` ``list`` (cluster-wide) and ``pods`` ``list`` (all namespaces, or the one given):
:data:`RBAC_RULES`. The preemption holds ConfigMaps are read too when the first is named
(``configmaps`` ``get`` in its namespace): the first, then its shards, as many as its
annotation ``gpushare.io/preemption-hold-shards`` says (``gpushare.kube.holds.shards_of``; the
extender's default where it says nothing); when they cannot be read the report goes on without
holds and says why (``ClusterObjects.holds_problem``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from lightkube import AsyncClient
from lightkube.resources.core_v1 import ConfigMap, Node, Pod

from gpushare.kube.cache import requests_gpu
from gpushare.kube.errors import CLIENT_ERRORS, ApiCallError, Failure, api_call_error
from gpushare.kube.holds import HOLD_SHARDS, HoldsRef, shards_of
from gpushare.kube.watch import JsonObject, plain_dict

__all__ = [
    "LIST_NODES",
    "LIST_PODS",
    "RBAC_RULES",
    "ClusterObjects",
    "read_cluster",
    "server_url",
]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
)
"""The ClusterRole rules :func:`read_cluster` needs (PolicyRule JSON)."""

LIST_NODES = "LIST nodes"
"""``ApiCallError.what`` of a failed node list."""
LIST_PODS = "LIST pods"
"""``ApiCallError.what`` of a failed pod list (all namespaces; ``LIST pods in NS`` for one)."""


@dataclass(frozen=True)
class ClusterObjects:
    """Every Node, and the pods asking a GPU (``requests_gpu``), as plain dicts (read-only);
    the holds ConfigMaps (every shard, ``gpushare.kube.holds``) that were asked for and exist
    (``holds_problem`` says why they could not be read, ``None`` when they were or are absent:
    no holds)."""

    nodes: tuple[JsonObject, ...]
    pods: tuple[JsonObject, ...]
    holds: tuple[JsonObject, ...] = ()
    holds_problem: str | None = None


async def read_cluster(
    client: AsyncClient,
    *,
    namespace: str | None = None,
    chunk_size: int = 500,
    holds: tuple[str, str] | None = None,
) -> ClusterObjects:
    """List all nodes, then the pods asking a GPU (``requests_gpu``: ``aliyun.com/gpu-mem`` or
    a dialect's resource, any container or init container, limits or requests) in every
    namespace, or only in ``namespace``.

    Raises :class:`~gpushare.kube.errors.ApiCallError` (``what`` is :data:`LIST_NODES`, or
    :data:`LIST_PODS` with `` in NAMESPACE`` when one is given) when a list fails.
    """
    try:
        nodes = tuple([plain_dict(node) async for node in client.list(Node, chunk_size=chunk_size)])
    except CLIENT_ERRORS as error:
        raise api_call_error(LIST_NODES, error) from error
    what = LIST_PODS if namespace is None else f"{LIST_PODS} in {namespace}"
    try:
        pods = tuple(
            [
                plain_dict(pod)
                async for pod in client.list(Pod, namespace=namespace or "*", chunk_size=chunk_size)
                if requests_gpu(pod)
            ]
        )
    except CLIENT_ERRORS as error:
        raise api_call_error(what, error) from error
    if holds is None:
        return ClusterObjects(nodes, pods)
    namespace_, first = holds
    try:
        found = await _configmap(client, namespace_, first)
        shards = shards_of(found, HOLD_SHARDS)
        others = HoldsRef(namespace_, first, shards).names[1:]
        read = [found, *await asyncio.gather(*(_configmap(client, namespace_, n) for n in others))]
    except ApiCallError as failure:
        return ClusterObjects(nodes, pods, holds_problem=f"preemption holds not shown: {failure}")
    return ClusterObjects(nodes, pods, tuple(c for c in read if c is not None))


async def _configmap(client: AsyncClient, namespace: str, name: str) -> JsonObject | None:
    """ConfigMap ``namespace/name``, ``None`` when there is none; ``ApiCallError`` else."""
    try:
        return plain_dict(await client.get(ConfigMap, name, namespace=namespace))
    except CLIENT_ERRORS as error:
        failure = api_call_error(f"GET configmaps {namespace}/{name}", error)
        if failure.failure is Failure.NOT_FOUND:
            return None
        raise failure from error


def server_url(client: AsyncClient) -> str:
    """The API server URL ``client`` talks to (its kubeconfig cluster's ``server``), for
    messages."""
    return str(client.config.cluster.server)
