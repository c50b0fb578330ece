"""Keep preemption holds in their ConfigMap (``gpushare.kube.codec.preemption``, "Holds").

:class:`HoldStore` writes holds with JSON merge patches of the ConfigMap's ``data``
(``{"data": {"<uid>": "<hold>"}}`` to put, ``{"data": {"<uid>": null}}`` to drop): no
read-modify-write, so it needs no resourceVersion and never conflicts with itself. Writes are
coalesced: one patch is in flight at a time, and every put and drop asked meanwhile goes into
the next one together (the latest word per preemptor), each caller returning when the patch
that carries its change is answered. Many preemptors at once cost a few writes, not one
serialised write each on the one object. Only the
leading extender writes; every replica reads the ConfigMap through its cache
(``ClusterCache(holds=...)``). When the ConfigMap is missing (the chart creates it), the first
put creates it. Failures raise :class:`~gpushare.kube.errors.ApiCallError`.

RBAC (:func:`rbac_rules`): ``configmaps`` ``get``, ``list``, ``watch`` (the cache) and
``patch`` on that name, in a Role of its namespace; the chart creates the ConfigMap, so
``create`` is not granted (the store would create a missing one where it may). Nobody else
should be able to write it (``gpushare.kube.writers``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap
from lightkube.types import PatchType

from gpushare.core.preemption import Hold
from gpushare.kube.codec.preemption import hold_json
from gpushare.kube.errors import CLIENT_ERRORS, Failure, api_call_error

__all__ = ["DEFAULT_HOLDS", "HoldStore", "parse_holds_ref", "rbac_rules"]

DEFAULT_HOLDS = ("kube-system", "gpushare-preemption-holds")
"""The holds ConfigMap, ``(namespace, name)``, unless ``--preemption-holds`` says otherwise."""


def rbac_rules(name: str) -> tuple[Mapping[str, Sequence[str]], ...]:
    """The Role rules (in the ConfigMap's namespace) for the holds ConfigMap ``name``: read it
    (the cache) and patch it (:class:`HoldStore`)."""
    return (
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": [name],
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


class HoldStore:
    """Puts and drops holds in ConfigMap ``namespace/name`` through ``client`` (module doc)."""

    def __init__(self, client: AsyncClient, namespace: str, name: str) -> None:
        self._client = client
        self.namespace = namespace
        self.name = name
        self._pending: dict[str, str | None] = {}
        self._waiting: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self.patches = 0
        """Patches sent (tests, benchmarks)."""

    async def put(self, hold: Hold) -> None:
        """Record ``hold`` under its preemptor's UID (replacing any earlier one)."""
        await self._write({hold.uid: hold_json(hold)})

    async def drop(self, uid: str) -> None:
        """Remove the hold of preemptor ``uid`` (nothing when there is none)."""
        await self._write({uid: None})

    async def _write(self, data: dict[str, str | None]) -> None:
        """Queue ``data`` for the next patch and wait for that patch (module doc)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.update(data)
        self._waiting.append(done)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(), name="gpushare-holds-writer")
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
        what = f"PATCH configmaps {self.namespace}/{self.name}"
        try:
            await self._client.patch(
                ConfigMap,
                self.name,
                {"data": data},
                namespace=self.namespace,
                patch_type=PatchType.MERGE,
            )
            return
        except CLIENT_ERRORS as exc:
            error = api_call_error(what, exc)
            if error.failure is not Failure.NOT_FOUND:
                raise error from exc
        kept = {k: v for k, v in data.items() if v is not None}
        body = ConfigMap(metadata=ObjectMeta(name=self.name, namespace=self.namespace), data=kept)
        try:
            await self._client.create(body)
        except CLIENT_ERRORS as exc:
            error = api_call_error(f"POST configmaps {self.namespace}/{self.name}", exc)
            if error.failure is Failure.CONFLICT:  # created meanwhile: patch it now
                await self._patch(data)
                return
            raise error from exc
