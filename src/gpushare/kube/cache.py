"""The cluster cache: every Node and every GPU-memory Pod, kept by list+watch, as plain dicts.

:class:`ClusterCache` runs two :class:`~gpushare.kube.watch.Reflector` tasks on one injected
lightkube ``AsyncClient``:

* **Nodes**: all of them (``key`` = name). :func:`is_gpushare_node` tells the memory-shared ones
  (label ``gpushare=true``); :meth:`ClusterCache.gpushare_nodes` lists only those.
* **PodDisruptionBudgets** (``budgets=True``, for preemption): all of them
  (``namespace/name``).
* **The holds ConfigMaps** (``holds=(namespace, name)`` or ``(namespace, names)``, for
  preemption): those objects, each by its own list+watch (``gpushare.kube.holds``: the holds
  are spread over shards; ``gpushare.kube.codec.preemption``).
* **Pods** in every namespace (``key`` = ``namespace/name``) that pass ``pod_filter``; by
  default :func:`requests_gpu`: some container or init container names
  ``aliyun.com/gpu-mem`` or a resource of another dialect gpushare reads
  (``GPU_RESOURCES``: gpu-manager's, HAMi's, ``aliyun.com/gpu-core.percentage``) in its limits
  or requests. The filter runs on the lightkube object, so other pods are never converted or
  stored.

The objects are the API server's JSON as plain dicts (``lightkube`` ``obj.to_dict()``), which is
what ``gpushare.kube.codec`` reads. They are shared, not copied: treat them as read-only.

**Start-up order.** Nodes are listed first, then pods, then budgets and holds when asked; only
then do all watches run, and :attr:`ClusterCache.synced` becomes true (for ``/readyz``).
Listeners therefore see every node before the first pod, so a ledger rebuilt from the callbacks
knows each pod's node.

**Listeners** (``on_node`` / ``on_pod``) receive a :class:`~gpushare.kube.watch.Change` for every
change, in order, synchronously in the cache's task: ``UPSERT`` (added or changed) or
``DELETE`` (deleted, or gone in a relist after a watch gap, or no longer passing the filter).
``change.released`` is true for a pod that holds nothing any more: deleted, or phase
``Succeeded``/``Failed``. A listener must not block; an exception in one is logged and the
cache goes on. Recovery (410, disconnects) is the reflector's; see :mod:`gpushare.kube.watch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node, Pod
from lightkube.resources.policy_v1 import PodDisruptionBudget

from gpushare.kube.codec import GPU_MEM, GPUSHARE_LABEL, is_gpushare_node
from gpushare.kube.codec.dialects import DIALECT_NAMES
from gpushare.kube.configmap import configmap_reflector
from gpushare.kube.watch import (
    Backoff,
    Change,
    JsonObject,
    Reflector,
    WatchStats,
    name_key,
    namespaced_key,
)

__all__ = [
    "BUDGET_RBAC_RULES",
    "GPUSHARE_LABEL",
    "GPU_MEM",
    "GPU_RESOURCES",
    "RBAC_RULES",
    "CacheStats",
    "ClusterCache",
    "Listener",
    "is_gpushare_node",
    "requests_gpu",
    "requests_gpu_mem",
]

RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
)
"""What the cache needs of its identity's RBAC for nodes and pods; the holds ConfigMap's are
``gpushare.kube.holds.rbac_rules``."""
BUDGET_RBAC_RULES: tuple[Mapping[str, Sequence[str]], ...] = (
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["list", "watch"]},
)
"""What it needs more with ``budgets=True``."""

GPU_RESOURCES = frozenset({GPU_MEM}) | DIALECT_NAMES
"""Every extended resource of a pod gpushare places: Alibaba's ``aliyun.com/gpu-mem`` and the
dialects' (``gpushare.kube.codec.dialects``)."""

"""The extended resource a GPU-memory pod asks for."""
"""Node label; value ``"true"`` marks a memory-shared node (Alibaba-compatible)."""
NODE = "Node"
POD = "Pod"
_LOG = logging.getLogger(__name__)

Listener = Callable[[Change], None]


def requests_gpu_mem(pod: Pod) -> bool:
    """Whether some container or init container of ``pod`` names ``aliyun.com/gpu-mem`` in its
    limits or requests (any quantity, as kube-scheduler's ``managedResources`` matching)."""
    return _names_any(pod, _GPU_MEM_ONLY)


def requests_gpu(pod: Pod) -> bool:
    """Whether some container or init container of ``pod`` names one of ``GPU_RESOURCES`` in
    its limits or requests (any quantity, as kube-scheduler's ``managedResources`` matching)."""
    return _names_any(pod, GPU_RESOURCES)


_GPU_MEM_ONLY = frozenset({GPU_MEM})


def _names_any(pod: Pod, names: frozenset[str]) -> bool:
    """Whether some container or init container of ``pod`` names one of ``names``."""
    spec = pod.spec
    if spec is None:
        return False
    for container in (*spec.containers, *(spec.initContainers or ())):
        resources = container.resources
        if resources is not None and not names.isdisjoint(
            (*(resources.limits or ()), *(resources.requests or ()))
        ):
            return True
    return False


@dataclass(frozen=True, slots=True)
class CacheStats:
    """The reflectors' counters (see :class:`~gpushare.kube.watch.WatchStats`)."""

    nodes: WatchStats
    pods: WatchStats


class ClusterCache:
    """Nodes and GPU-memory pods from list+watch (see the module docstring).

    Use as an async context manager (or :meth:`start` / :meth:`stop`). ``client`` is owned by
    the caller. ``backoff`` paces retries after failures; ``watch_timeout_s`` bounds one watch
    request (seconds); ``chunk_size`` is the page size of lists; ``rng`` jitters the backoff.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        pod_filter: Callable[[Pod], bool] = requests_gpu,
        backoff: Backoff | None = None,
        watch_timeout_s: int = 300,
        chunk_size: int = 500,
        rng: random.Random | None = None,
        budgets: bool = False,
        holds: tuple[str, str | Sequence[str]] | None = None,
    ) -> None:
        if watch_timeout_s < 1:
            raise ValueError(f"watch_timeout_s must be >= 1, got {watch_timeout_s}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self._client = client
        self._node_listeners: list[Listener] = []
        self._pod_listeners: list[Listener] = []
        self._budget_listeners: list[Listener] = []
        self._holds_listeners: list[Listener] = []
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        rng = rng or random.Random()
        backoff = backoff or Backoff()
        self._nodes = Reflector(
            kind=NODE,
            list_fn=lambda: client.list(Node, chunk_size=chunk_size),
            watch_fn=lambda rv, timeout_s: client.watch(
                Node, resource_version=rv, server_timeout=timeout_s
            ),
            key=name_key,
            sink=lambda change: self._notify(self._node_listeners, change),
            backoff=backoff,
            watch_timeout_s=watch_timeout_s,
            rng=rng,
        )
        self._pods = Reflector(
            kind=POD,
            list_fn=lambda: client.list(Pod, namespace="*", chunk_size=chunk_size),
            watch_fn=lambda rv, timeout_s: client.watch(
                Pod, namespace="*", resource_version=rv, server_timeout=timeout_s
            ),
            key=namespaced_key,
            keep=pod_filter,
            sink=lambda change: self._notify(self._pod_listeners, change),
            backoff=backoff,
            watch_timeout_s=watch_timeout_s,
            rng=rng,
        )
        self._extra: list[Reflector] = []
        if budgets:
            self._extra.append(
                Reflector(
                    kind="PodDisruptionBudget",
                    list_fn=lambda: client.list(
                        PodDisruptionBudget, namespace="*", chunk_size=chunk_size
                    ),
                    watch_fn=lambda rv, timeout_s: client.watch(
                        PodDisruptionBudget,
                        namespace="*",
                        resource_version=rv,
                        server_timeout=timeout_s,
                    ),
                    key=namespaced_key,
                    sink=lambda change: self._notify(self._budget_listeners, change),
                    backoff=backoff,
                    watch_timeout_s=watch_timeout_s,
                    rng=rng,
                )
            )
        namespace, names = holds if holds is not None else ("", ())
        for name in [names] if isinstance(names, str) else names:
            self._extra.append(
                configmap_reflector(
                    client,
                    namespace,
                    name,
                    lambda change: self._notify(self._holds_listeners, change),
                    backoff=backoff,
                    watch_timeout_s=watch_timeout_s,
                )
            )

    # ---- listeners ---------------------------------------------------------------------

    def on_node(self, listener: Listener) -> None:
        """Call ``listener`` with every node change from now on (register before start to
        see the initial list)."""
        self._node_listeners.append(listener)

    def on_pod(self, listener: Listener) -> None:
        """Call ``listener`` with every pod change from now on (see :meth:`on_node`)."""
        self._pod_listeners.append(listener)

    def on_budget(self, listener: Listener) -> None:
        """Call ``listener`` with every PodDisruptionBudget change (``budgets=True``)."""
        self._budget_listeners.append(listener)

    def on_holds(self, listener: Listener) -> None:
        """Call ``listener`` with every change of a holds ConfigMap (``holds=...``; the
        change's ``key`` is the ConfigMap's name)."""
        self._holds_listeners.append(listener)

    @staticmethod
    def _notify(listeners: list[Listener], change: Change) -> None:
        for listener in listeners:
            try:
                listener(change)
            except Exception:  # one broken listener must not starve the others
                _LOG.exception("listener %r failed on %s %s", listener, change.action, change.key)

    # ---- lifecycle ---------------------------------------------------------------------

    async def __aenter__(self) -> ClusterCache:
        self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    def start(self) -> None:
        """Start listing and watching in a background task (needs a running event loop)."""
        if self._task is not None:
            raise RuntimeError("ClusterCache already started")
        self._task = asyncio.get_running_loop().create_task(self._run(), name="gpushare-cache")

    async def stop(self) -> None:
        """Stop every watch and wait for the task to end; the snapshots stay readable."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            nodes = group.create_task(self._nodes.run(), name="gpushare-cache-nodes")
            await self._wait_or_fail(self._nodes.synced, nodes)
            pods = group.create_task(self._pods.run(), name="gpushare-cache-pods")
            await self._wait_or_fail(self._pods.synced, pods)
            for extra in self._extra:
                task = group.create_task(extra.run(), name=f"gpushare-cache-{extra.kind}")
                await self._wait_or_fail(extra.synced, task)
            self._synced.set()

    @staticmethod
    async def _wait_or_fail(synced: asyncio.Event, task: asyncio.Task[None]) -> None:
        waiter = asyncio.ensure_future(synced.wait())
        try:
            await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
        if task.done():
            task.result()  # a reflector only ends on a bug: let it propagate

    # ---- state -------------------------------------------------------------------------

    @property
    def synced(self) -> bool:
        """True once nodes and then pods have been listed (it stays true across relists)."""
        return self._synced.is_set()

    async def wait_synced(self, timeout_s: float) -> None:
        """Wait until :attr:`synced`; ``TimeoutError`` after ``timeout_s`` seconds. Raises the
        cache task's own error if it died."""
        task = self._task
        if task is None:
            raise RuntimeError("ClusterCache not started")
        async with asyncio.timeout(timeout_s):
            await self._wait_or_fail(self._synced, task)

    @property
    def stale(self) -> bool:
        """True while nodes or pods may lag the API server: a reflector failed twice in a row
        and has not listed since (``Reflector.stale``)."""
        return self._nodes.stale or self._pods.stale or any(r.stale for r in self._extra)

    async def relist(self) -> None:
        """List nodes, then pods (then budgets and holds, at once), again now and return once every
        list is applied (the listeners have seen every difference). Needs a synced cache;
        waits while the API server is away: bound it with a timeout."""
        if not self.synced:
            raise RuntimeError("ClusterCache.relist needs a synced cache")
        await self._nodes.relist()
        await self._pods.relist()
        await asyncio.gather(*(extra.relist() for extra in self._extra))  # the holds' shards

    @property
    def stats(self) -> CacheStats:
        """List, relist, resume and error counters of both reflectors."""
        return CacheStats(nodes=self._nodes.stats, pods=self._pods.stats)

    def nodes(self) -> dict[str, JsonObject]:
        """Every node by name (a new dict; the node dicts are shared and read-only)."""
        return self._nodes.snapshot()

    def gpushare_nodes(self) -> dict[str, JsonObject]:
        """The nodes labelled ``gpushare=true``, by name."""
        return {k: v for k, v in self._nodes.snapshot().items() if is_gpushare_node(v)}

    def node(self, name: str) -> JsonObject | None:
        """The node ``name``, or ``None``."""
        return self._nodes.get(name)

    def pods(self) -> dict[str, JsonObject]:
        """Every kept pod by ``namespace/name`` (a new dict; the pod dicts are read-only)."""
        return self._pods.snapshot()

    def pod(self, namespace: str, name: str) -> JsonObject | None:
        """The pod ``namespace/name`` if it is kept, or ``None``."""
        return self._pods.get(f"{namespace}/{name}")
