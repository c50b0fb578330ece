"""The holds ConfigMaps' writer (``gpushare.kube.holds.HoldStore``): puts and drops asked while
a shard's patch is in flight go together into its next one, the latest word per preemptor, and
each caller hears how the patch that carried its change went; each hold lives in the shard its
preemptor's UID picks, and shards are written in parallel. The API server is a stand-in that
holds each patch until the test lets it go (an injected delay: the real one is exercised by
``tests/cluster/test_preemption.py``)."""

from __future__ import annotations

import asyncio
import zlib
from typing import Any, cast

import httpx2
import pytest
from lightkube import AsyncClient

from gpushare.core.model import ContainerAllocation
from gpushare.core.preemption import Hold
from gpushare.kube.errors import ApiCallError
from gpushare.kube.holds import (
    MAX_HOLD_SHARDS,
    SHARDS_ANNOTATION,
    HoldsRef,
    HoldStore,
    shard_of,
    shards_of,
)


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


# --- shards -----------------------------------------------------------------------------------


class ShardedApi:
    """Answers every patch at once, recording ``(ConfigMap name, data)``; counts the patches in
    flight together (the most at once)."""

    def __init__(self) -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def patch(self, kind: object, name: str, body: dict[str, Any], **_: object) -> None:
        self.patches.append((name, dict(body["data"])))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0)
        self.in_flight -= 1


@pytest.mark.parametrize(
    ("shards", "names"),
    [
        pytest.param(1, ("holds",), id="one-shard-is-the-named-configmap"),
        pytest.param(3, ("holds", "holds-1", "holds-2"), id="the-others-are-numbered-from-one"),
    ],
)
def test_the_shards_are_the_named_configmap_then_numbered_ones(
    shards: int, names: tuple[str, ...]
) -> None:
    assert HoldsRef("kube-system", "holds", shards).names == names


@pytest.mark.parametrize("shards", [0, MAX_HOLD_SHARDS + 1], ids=["none", "past-the-most"])
def test_a_shard_count_out_of_range_is_refused_naming_the_range(shards: int) -> None:
    with pytest.raises(ValueError, match=f"between 1 and {MAX_HOLD_SHARDS}"):
        HoldsRef("kube-system", "holds", shards)


def test_a_preemptor_s_shard_is_the_same_everywhere_and_every_shard_is_used() -> None:
    uids = [f"uid-{i}" for i in range(200)]
    assert [shard_of(u, 16) for u in uids] == [zlib.crc32(u.encode()) % 16 for u in uids]
    assert {shard_of(u, 16) for u in uids} == set(range(16))


def test_each_hold_goes_to_its_own_shard_and_shards_are_written_in_parallel() -> None:
    async def scenario() -> tuple[ShardedApi, HoldStore]:
        api = ShardedApi()
        store = HoldStore(cast(AsyncClient, api), "kube-system", "holds", shards=4)
        await asyncio.gather(*(store.put(hold(f"p{i}")) for i in range(40)))
        return api, store

    api, store = asyncio.run(scenario())
    written = {uid: name for name, data in api.patches for uid in data}
    assert written == {f"p{i}": store.ref.of(f"p{i}") for i in range(40)}
    assert store.patches == len(api.patches) == 4  # one coalesced patch per shard
    assert api.most_in_flight == 4


@pytest.mark.parametrize(
    ("read_from", "dropped_in"),
    [
        pytest.param("", {"own"}, id="a-hold-read-from-nowhere-yet-is-dropped-in-its-shard"),
        pytest.param("own", {"own"}, id="a-hold-read-from-its-shard-is-dropped-there"),
        pytest.param("other", {"own", "other"}, id="a-hold-read-from-another-shard-too"),
        pytest.param("elsewhere", {"own"}, id="a-configmap-not-a-shard-is-not-written"),
    ],
)
def test_a_drop_reaches_the_configmap_the_hold_was_read_from(
    read_from: str, dropped_in: set[str]
) -> None:
    async def scenario(store: HoldStore, where: str) -> list[tuple[str, dict[str, Any]]]:
        await store.drop("u", where)
        return api.patches

    api = ShardedApi()
    store = HoldStore(cast(AsyncClient, api), "kube-system", "holds", shards=2)
    own = store.ref.of("u")
    other = next(n for n in store.ref.names if n != own)
    where = {"own": own, "other": other, "": "", "elsewhere": "holds-7"}[read_from]
    patches = asyncio.run(scenario(store, where))
    names = {"own": own, "other": other}
    assert {name for name, _ in patches} == {names[d] for d in dropped_in}
    assert all(data == {"u": None} for _, data in patches)


@pytest.mark.parametrize(
    ("annotations", "shards"),
    [
        pytest.param({SHARDS_ANNOTATION: "4"}, 4, id="the-annotation-says"),
        pytest.param({}, 16, id="no-annotation-the-default"),
        pytest.param({SHARDS_ANNOTATION: "0"}, 16, id="zero-the-default"),
        pytest.param({SHARDS_ANNOTATION: "65"}, 16, id="past-the-most-the-default"),
        pytest.param({SHARDS_ANNOTATION: "four"}, 16, id="not-a-number-the-default"),
        pytest.param({SHARDS_ANNOTATION: 4}, 16, id="not-a-string-the-default"),
    ],
)
def test_readers_take_the_shard_count_from_the_first_shard_s_annotation(
    annotations: dict[str, object], shards: int
) -> None:
    configmap = {"metadata": {"name": "holds", "annotations": annotations}}
    assert shards_of(configmap, 16) == shards
