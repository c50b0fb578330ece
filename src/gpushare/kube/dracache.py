"""A list+watch cache of gpushare's DRA objects for the extender's scoring of claim pods
(``gpushare.extender.dra``): the ResourceSlices of gpushare's driver, read into each node's GPUs
(``gpushare.kube.codec.dra.slice_node``), and every ResourceClaim, indexed by the nodes its
allocation results of that driver name. Each node has a version that grows whenever its slice
or the claims on it change, so that a reader can keep what it computed from them until then.

The watch lags the API server: kube-scheduler can ask about a pod whose claims its own informer
has and this cache not yet. ``wait_for_claims`` waits, bounded, until they are here; claims come
on one watch in resourceVersion order, so by then every claim change made before them (another
pod's allocation written before this pod's claim was made) is here too. It does not wait while
the watch of claims is failing (its reflector stale, ``gpushare.kube.watch``): what is missing
then would not come within the wait, and each wait holds kube-scheduler's cycle.

RBAC: ``resourceslices`` and ``resourceclaims`` ``list`` and ``watch`` (cluster-wide).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Collection, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpushare.core.model import Node
from gpushare.kube.codec.common import MemoryUnit
from gpushare.kube.codec.dra import SliceError, slice_node
from gpushare.kube.watch import Action, Backoff, Change, Reflector, name_key, namespaced_key

__all__ = ["RBAC_RULES", "DraCache"]

log = logging.getLogger(__name__)

Json = Mapping[str, Any]

RBAC_RULES: tuple[Mapping[str, list[str]], ...] = (
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "resourceclaims"],
     "verbs": ["list", "watch"]},
)  # fmt: skip
"""The ClusterRole rules this cache needs (PolicyRule JSON)."""


def _pools(claim: Json | None, driver: str) -> set[str]:
    """The pools (gpushare's: nodes) that ``claim``'s allocation results of ``driver`` name."""
    if claim is None:
        return set()
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return {
        str(r.get("pool")) for r in results if isinstance(r, Mapping) and r.get("driver") == driver
    }


class DraCache:
    """gpushare's slices and every claim, through ``client`` (module doc)."""

    def __init__(self, client: AsyncClient, driver: str, *, watch_timeout_s: int = 300) -> None:
        self.driver = driver
        self.slices: dict[str, tuple[Node, MemoryUnit]] = {}
        """Each node's GPUs and memory unit, from its slice."""
        self.claims: dict[tuple[str, str], Json] = {}
        """Every claim by (namespace, name)."""
        self.on_node: dict[str, dict[tuple[str, str], Json]] = {}
        """The claims allocated on each node (by its results of ``driver``)."""
        self._versions: dict[str, int] = {}
        self._claims_changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        rng = random.Random()
        self._claim_reflector = Reflector(
            kind="ResourceClaim",
            list_fn=lambda: client.list(ResourceClaim, namespace="*"),
            watch_fn=lambda rv, timeout_s: client.watch(
                ResourceClaim, namespace="*", resource_version=rv, server_timeout=timeout_s
            ),
            key=namespaced_key,
            sink=self._claim_changed,
            backoff=Backoff(),
            watch_timeout_s=watch_timeout_s,
            rng=rng,
        )
        self._reflectors = [
            Reflector(
                kind="ResourceSlice",
                list_fn=lambda: client.list(ResourceSlice),
                watch_fn=lambda rv, timeout_s: client.watch(
                    ResourceSlice, resource_version=rv, server_timeout=timeout_s
                ),
                key=name_key,
                keep=lambda s: s.spec is not None and s.spec.driver == driver,
                sink=self._slice_changed,
                backoff=Backoff(),
                watch_timeout_s=watch_timeout_s,
                rng=rng,
            ),
            self._claim_reflector,
        ]

    def start(self) -> None:
        """List and watch in background tasks (needs a running event loop)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(r.run(), name=f"gpushare-dra-{r.kind}") for r in self._reflectors
        ]

    async def stop(self) -> None:
        """Stop watching; what was read stays."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def synced(self) -> bool:
        """Both first lists are in."""
        return all(r.synced.is_set() for r in self._reflectors)

    @property
    def claims_failing(self) -> bool:
        """The watch of claims is failing: two failures in a row without an event between
        (``Reflector.stale``); true until a list of claims succeeds."""
        return self._claim_reflector.stale

    async def wait_for_claims(self, keys: Collection[tuple[str, str]], timeout_s: float) -> bool:
        """Wait until both first lists are in and every claim of ``keys`` (namespace, name) is
        known, at most ``timeout_s`` seconds, and not at all while :attr:`claims_failing`;
        whether they are (module doc)."""
        if self.synced and self._knows(keys):
            return True
        if self.claims_failing:
            return False
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.gather(*(r.synced.wait() for r in self._reflectors))
                while not self._knows(keys):
                    await self._claims_changed.wait()  # a new Event after each claim change
        except TimeoutError:
            return False
        return True

    def _knows(self, keys: Collection[tuple[str, str]]) -> bool:
        return all(key in self.claims for key in keys)

    def version(self, node: str) -> int:
        """Grows whenever node ``node``'s slice or the claims on it change."""
        return self._versions.get(node, 0)

    def _touch(self, node: str) -> None:
        self._versions[node] = self._versions.get(node, 0) + 1

    def _slice_changed(self, change: Change) -> None:
        node = str((change.obj.get("spec") or {}).get("nodeName") or "")
        if not node:
            return
        self._touch(node)
        if change.action is Action.DELETE:
            self.slices.pop(node, None)
            return
        try:
            self.slices[node] = slice_node(change.obj)
        except SliceError as error:  # not scored until the driver publishes one that reads
            self.slices.pop(node, None)
            log.warning("ResourceSlice %s of node %s left out: %s", change.key, node, error)

    def _claim_changed(self, change: Change) -> None:
        meta = change.obj.get("metadata") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        before = _pools(change.previous, self.driver)
        after = set() if change.action is Action.DELETE else _pools(change.obj, self.driver)
        for node in before | after:
            self._touch(node)
        for node in before - after:
            self.on_node.get(node, {}).pop(key, None)
        if change.action is Action.DELETE:
            self.claims.pop(key, None)
        else:
            self.claims[key] = change.obj
            for node in after:
                self.on_node.setdefault(node, {})[key] = change.obj
        changed, self._claims_changed = self._claims_changed, asyncio.Event()
        changed.set()  # wakes wait_for_claims
