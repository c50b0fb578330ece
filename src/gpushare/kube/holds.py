"""Keep preemption holds in their ConfigMaps (``gpushare.kube.codec.preemption``, "Holds").

The holds are spread over ``shards`` ConfigMaps (:class:`HoldsRef`): the first is named as
``--preemption-holds`` says, the others ``<name>-1`` … ``<name>-<shards-1>``, and a hold lives in
the one its preemptor's UID picks (:func:`shard_of`, CRC-32 of the UID modulo ``shards``). Each
write of a ConfigMap makes the API server read, patch and store the whole object and send it
whole to every watcher, so its cost grows with the holds it carries: a merge patch of one entry
took 9.2 ms on a ConfigMap of 50 holds and 54.9 ms on one of 900 (medians of 60, the test
control plane on this repository's 2-core machine). Sixteen shards keep a write small while a
burst of preemptions at 1,000 nodes holds ~900 GPUs' worth of holds at once.

:class:`HoldStore` writes holds with JSON merge patches of a shard's ``data``
(``{"data": {"<uid>": "<hold>"}}`` to put, ``{"data": {"<uid>": null}}`` to drop): no
read-modify-write, so it needs no resourceVersion and never conflicts with itself. Writes are
coalesced per shard: one patch is in flight per shard at a time, and every put and drop asked
meanwhile for that shard goes into its next one together (the latest word per preemptor), each
caller returning when the patch that carries its change is answered; shards are written in
parallel. Many preemptors at once cost a few small writes, not one serialised write each on
one object. A hold found in another shard than its own (written under another shard count)
is dropped from where it was read too (``drop(uid, read_from=...)``). Only the leading
extender writes; every replica reads the shards through its cache (``ClusterCache(holds=...)``).
When a shard is missing (the chart creates them all), the first put creates it. Failures raise
:class:`~gpushare.kube.errors.ApiCallError`.

RBAC (:func:`rbac_rules`): ``configmaps`` ``get``, ``list``, ``watch`` (the cache) and
``patch`` on those names, in a Role of their namespace; the chart creates the ConfigMaps, so
``create`` is not granted (the store would create a missing one where it may). Nobody else
should be able to write them (``gpushare.kube.writers``).
"""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from gpushare.core.preemption import Hold
from gpushare.kube.codec.preemption import hold_json
from gpushare.kube.errors import CLIENT_ERRORS, Failure, api_call_error

__all__ = [
    "DEFAULT_HOLDS",
    "HOLD_SHARDS",
    "MAX_HOLD_SHARDS",
    "SHARDS_ANNOTATION",
    "HoldStore",
    "HoldsRef",
    "parse_holds_ref",
    "rbac_rules",
    "shard_of",
    "shards_of",
]

DEFAULT_HOLDS = ("kube-system", "gpushare-preemption-holds")
"""The first holds ConfigMap, ``(namespace, name)``, unless ``--preemption-holds`` says
otherwise (the shards are named after it: :class:`HoldsRef`)."""
HOLD_SHARDS = 16
"""ConfigMaps the holds are spread over unless ``--preemption-hold-shards`` says otherwise."""
MAX_HOLD_SHARDS = 64
"""The most shards ``--preemption-hold-shards`` (and the annotation readers trust) allows."""
SHARDS_ANNOTATION = "gpushare.io/preemption-hold-shards"
"""On the first shard (the chart writes it): how many shards there are, for readers such as
``gpushare inspect`` that are not told (:func:`shards_of`)."""


@dataclass(frozen=True)
class HoldsRef:
    """Where the holds are: ConfigMaps ``namespace/name`` and ``name-1`` … ``name-<shards-1>``
    (module doc). ``ValueError`` for a shard count outside 1..:data:`MAX_HOLD_SHARDS`."""

    namespace: str
    name: str
    shards: int = HOLD_SHARDS
    names: tuple[str, ...] = field(init=False)
    """Every shard's ConfigMap name, the first one's first."""

    def __post_init__(self) -> None:
        if not 1 <= self.shards <= MAX_HOLD_SHARDS:
            raise ValueError(
                f"{self.shards} preemption hold shards: between 1 and {MAX_HOLD_SHARDS} accepted"
            )
        names = (self.name, *(f"{self.name}-{i}" for i in range(1, self.shards)))
        object.__setattr__(self, "names", names)

    def of(self, uid: str) -> str:
        """The name of the ConfigMap the hold of preemptor ``uid`` is written to."""
        return self.names[shard_of(uid, self.shards)]


def shard_of(uid: str, shards: int) -> int:
    """The shard (0..``shards``-1) of the hold of preemptor ``uid``: CRC-32 of its UTF-8 bytes
    modulo ``shards``, the same in every replica and every release."""
    return zlib.crc32(uid.encode()) % shards


def shards_of(first: Mapping[str, object] | None, default: int) -> int:
    """The shard count the first shard's :data:`SHARDS_ANNOTATION` gives (ConfigMap JSON), or
    ``default`` where it is absent or not an integer in 1..:data:`MAX_HOLD_SHARDS`."""
    metadata = first.get("metadata") if first is not None else None
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    text = annotations.get(SHARDS_ANNOTATION) if isinstance(annotations, dict) else None
    if isinstance(text, str) and text.isdigit() and 1 <= int(text) <= MAX_HOLD_SHARDS:
        return int(text)
    return default


def rbac_rules(names: str | Sequence[str]) -> tuple[Mapping[str, Sequence[str]], ...]:
    """The Role rules (in the ConfigMaps' namespace) for the holds ConfigMaps ``names`` (one
    name or ``HoldsRef.names``): read them (the cache) and patch them (:class:`HoldStore`)."""
    return (
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [names] if isinstance(names, str) else list(names),
            "verbs": ["get", "list", "watch", "patch"],
        },
    )


def parse_holds_ref(text: str) -> tuple[str, str]:
    """``namespace/name`` → ``(namespace, name)``; ``ValueError`` naming the value otherwise."""
    namespace, slash, name = text.partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise ValueError(
            f"{text!r} is not NAMESPACE/NAME (e.g. kube-system/gpushare-preemption-holds)"
        )
    return namespace, name


class _ShardWriter:
    """The coalescing writer of one shard (module doc)."""

    def __init__(self, client: AsyncClient, namespace: str, name: str) -> None:
        self._client = client
        self._namespace = namespace
        self._name = name
        self._pending: dict[str, str | None] = {}
        self._waiting: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self.patches = 0

    async def write(self, data: dict[str, str | None]) -> None:
        """Queue ``data`` for the next patch and wait for that patch (module doc)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.update(data)
        self._waiting.append(done)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(
                self._drain(), name=f"gpushare-holds-writer-{self._name}"
            )
        await done

    async def _drain(self) -> None:
        while self._pending:
            data, waiting = self._pending, self._waiting
            self._pending, self._waiting = {}, []
            try:
                self.patches += 1
                await self._patch(data)
            except Exception as error:
                for done in waiting:
                    if not done.done():
                        done.set_exception(error)
            except BaseException:  # cancelled (shutdown): so are the callers waiting on it
                for done in waiting + self._waiting:
                    done.cancel()
                raise
            else:
                for done in waiting:
                    if not done.done():
                        done.set_result(None)

    async def _patch(self, data: dict[str, str | None]) -> None:
        what = f"PATCH configmaps {self._namespace}/{self._name}"
        try:
            await self._client.patch(
                ConfigMap,
                self._name,
                {"data": data},
                namespace=self._namespace,
                patch_type=PatchType.MERGE,
            )
            return
        except CLIENT_ERRORS as exc:
            error = api_call_error(what, exc)
            if error.failure is not Failure.NOT_FOUND:
                raise error from exc
        kept = {k: v for k, v in data.items() if v is not None}
        body = ConfigMap(metadata=ObjectMeta(name=self._name, namespace=self._namespace), data=kept)
        try:
            await self._client.create(body)
        except CLIENT_ERRORS as exc:
            error = api_call_error(f"POST configmaps {self._namespace}/{self._name}", exc)
            if error.failure is Failure.CONFLICT:  # created meanwhile: patch it now
                await self._patch(data)
                return
            raise error from exc


class HoldStore:
    """Puts and drops holds in the ConfigMaps of ``ref`` (or ``namespace/name``, one shard)
    through ``client`` (module doc)."""

    def __init__(self, client: AsyncClient, namespace: str, name: str, shards: int = 1) -> None:
        self.ref = HoldsRef(namespace, name, shards)
        self._writers = {n: _ShardWriter(client, namespace, n) for n in self.ref.names}

    @property
    def patches(self) -> int:
        """Patches sent, over every shard (tests, benchmarks)."""
        return sum(writer.patches for writer in self._writers.values())

    async def put(self, hold: Hold) -> None:
        """Record ``hold`` under its preemptor's UID, in its shard (replacing any earlier
        one)."""
        await self._writers[self.ref.of(hold.uid)].write({hold.uid: hold_json(hold)})

    async def drop(self, uid: str, read_from: str = "") -> None:
        """Remove the hold of preemptor ``uid`` from its shard, and from ConfigMap
        ``read_from`` too when it was read from another of this store's shards (nothing
        where there is none)."""
        names = {self.ref.of(uid)}
        if read_from in self._writers:
            names.add(read_from)
        await asyncio.gather(*(self._writers[n].write({uid: None}) for n in sorted(names)))
