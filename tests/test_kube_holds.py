"""The holds ConfigMap's writer (``gpushare.kube.holds.HoldStore``): puts and drops asked while
a patch is in flight go together into the next one, the latest word per preemptor, and each
caller hears how the patch that carried its change went. The API server is a stand-in that
holds each patch until the test lets it go (an injected delay: the real one is exercised by
``tests/cluster/test_preemption.py``)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import httpx2
from lightkube import AsyncClient

from gpushare.core.model import ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.kube.errors import ApiCallError
from gpushare.kube.holds import HoldStore


class GatedApi:
    """Records each merge patch's ``data`` and answers it when ``release`` is called; a patch
    whose data names ``fail_on`` fails with a server error."""

    def __init__(self, fail_on: str = "") -> None:
        self.patches: list[dict[str, Any]] = []
        self._gates: list[asyncio.Event] = []
        self._fail_on = fail_on
        self.open = False
        """Answer every patch at once (no :meth:`release` needed)."""

    async def patch(self, kind: object, name: str, body: dict[str, Any], **_: object) -> None:
        self.patches.append(dict(body["data"]))
        if not self.open:
            gate = asyncio.Event()
            self._gates.append(gate)
            await gate.wait()
        if self._fail_on in body["data"]:
            raise httpx2.HTTPError("injected: the API server did not answer")

    async def release(self) -> None:
        while not self._gates:
            await asyncio.sleep(0)
        self._gates.pop(0).set()


def hold(uid: str) -> Hold:
    containers = (ContainerAllocation("main", (0,), 4),)
    return Hold(f"ns/{uid}", uid, "n1", 1000, containers, (), (), 1.0, 61.0)


def test_writes_asked_during_a_patch_go_together_in_the_next_one() -> None:
    async def scenario() -> tuple[list[dict[str, Any]], int]:
        api = GatedApi()
        store = HoldStore(cast(AsyncClient, api), "kube-system", "holds")
        first = asyncio.create_task(store.put(hold("a")))
        await asyncio.sleep(0)  # the first patch is in flight
        rest = [
            asyncio.create_task(store.put(hold("b"))),
            asyncio.create_task(store.put(hold("c"))),
            asyncio.create_task(store.drop("b")),
        ]
        await api.release()
        await first
        await api.release()
        await asyncio.gather(*rest)
        return api.patches, store.patches

    patches, sent = asyncio.run(scenario())
    assert sent == 2
    assert [sorted(p) for p in patches] == [["a"], ["b", "c"]]
    assert patches[1]["b"] is None  # put then dropped: the latest word


def test_every_caller_of_a_failed_patch_hears_of_it_and_the_next_write_is_tried() -> None:
    async def scenario() -> list[str]:
        api = GatedApi(fail_on="b")
        store = HoldStore(cast(AsyncClient, api), "kube-system", "holds")
        first = asyncio.create_task(store.put(hold("a")))
        await asyncio.sleep(0)
        b, c = asyncio.create_task(store.put(hold("b"))), asyncio.create_task(store.put(hold("c")))
        await api.release()
        await first
        await api.release()
        outcomes = []
        for task in (b, c):
            try:
                await task
                outcomes.append("ok")
            except ApiCallError as error:
                outcomes.append(error.failure.name)
        d = asyncio.create_task(store.put(hold("d")))
        await api.release()
        await d
        outcomes.append("d ok")
        return outcomes

    outcomes = asyncio.run(scenario())
    assert outcomes[2] == "d ok"
    assert outcomes[0] == outcomes[1] != "ok"


def test_a_burst_of_fifty_holds_costs_one_patch() -> None:
    async def scenario() -> int:
        api = GatedApi()
        store = HoldStore(cast(AsyncClient, api), "kube-system", "holds")
        api.open = True  # answered at once: what batches is the burst arriving together
        await asyncio.gather(*(store.put(hold(f"p{i}")) for i in range(50)))
        return store.patches

    assert asyncio.run(scenario()) == 1
