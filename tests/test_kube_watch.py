"""``gpushare.kube.watch.Reflector`` with a scripted list+watch source (no API server).

The source's list answers are set per test; its watch streams read events (or exceptions to
raise) from a queue, one stream per watch call, recording the resourceVersion each call starts
from. What the reflector reports is checked change by change. The real API server is exercised
by ``tests/cluster/test_kube_adapter.py``.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, TypeVar

import httpx2
import pytest
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec, PodStatus, ResourceRequirements
from lightkube.models.meta_v1 import ManagedFieldsEntry, ObjectMeta, Status
from lightkube.resources.core_v1 import Node, Pod

from gpushare.kube.cache import requests_gpu_mem
from gpushare.kube.snapshot import read_cluster
from gpushare.kube.watch import Backoff, Change, Reflector

T = TypeVar("T")
NOW = Backoff(initial_s=0.0, max_s=0.0, jitter=0.0)
END = object()  # ends the current watch stream normally


def pod(name: str, rv: int, *, gpu: bool = True, phase: str | None = None) -> Pod:
    limits = {"aliyun.com/gpu-mem": "4"} if gpu else {"cpu": "1"}
    return Pod(
        metadata=ObjectMeta(name=name, namespace="ns", resourceVersion=str(rv)),
        spec=PodSpec(
            containers=[Container(name="c", resources=ResourceRequirements(limits=limits))]
        ),
        status=PodStatus(phase=phase) if phase else None,
    )


class ScriptedList:
    """One list answer; with ``gate``, it waits for the gate to open (``entered`` is set when
    the reflector starts reading it), so that a test can act while a list is in flight."""

    def __init__(self, items: list[Pod], rv: str, gate: asyncio.Event | None = None) -> None:
        self.items = items
        self.resourceVersion = rv
        self.gate = gate
        self.entered = asyncio.Event()

    async def _items(self) -> AsyncIterator[Pod]:
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        for item in self.items:
            yield item

    def __aiter__(self) -> AsyncIterator[Pod]:
        return self._items()


class Source:
    """Scripted list answers and watch events; records what the reflector asked."""

    def __init__(self) -> None:
        self.lists: list[ScriptedList] = []
        self.events: asyncio.Queue[object] = asyncio.Queue()
        self.watched_from: list[str] = []

    def list(self) -> ScriptedList:
        return self.lists.pop(0)

    async def watch(self, rv: str, timeout_s: int) -> AsyncIterator[tuple[str, Any]]:
        self.watched_from.append(rv)
        while True:
            item = await self.events.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, tuple)
            yield item


class Collector:
    def __init__(self) -> None:
        self.changes: list[Change] = []
        self._new = asyncio.Event()

    def __call__(self, change: Change) -> None:
        self.changes.append(change)
        self._new.set()

    async def until(self, count: int) -> list[Change]:
        async with asyncio.timeout(5):
            while len(self.changes) < count:
                self._new.clear()
                await self._new.wait()
        return self.changes

    def summary(self) -> list[tuple[str, str]]:
        return [(c.action.value, c.key) for c in self.changes]


def reflector(source: Source, sink: Callable[[Change], None]) -> Reflector:
    return Reflector(
        kind="Pod",
        list_fn=source.list,
        watch_fn=source.watch,
        key=lambda p: f"{p.metadata.namespace}/{p.metadata.name}",
        sink=sink,
        keep=requests_gpu_mem,
        backoff=NOW,
        rng=random.Random(0),
    )


def run(test: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return asyncio.run(test())


async def started(source: Source, sink: Callable[[Change], None]) -> tuple[Reflector, Any]:
    r = reflector(source, sink)
    task = asyncio.create_task(r.run())
    async with asyncio.timeout(5):
        await r.synced.wait()
    return r, task


async def stopped(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def expired() -> ApiError:
    return ApiError(status=Status(code=410, reason="Expired", message="too old"))


def test_list_then_watch_reports_every_change_of_kept_objects() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([pod("a", 1), pod("cpu", 2, gpu=False)], "10"))
        r, task = await started(source, seen)
        assert seen.summary() == [("upsert", "ns/a")]
        assert seen.changes[0].previous is None
        for event in [
            ("ADDED", pod("b", 11)),
            ("ADDED", pod("cpu2", 12, gpu=False)),  # never kept
            ("MODIFIED", pod("a", 13, phase="Succeeded")),
            ("DELETED", pod("b", 14, phase="Failed")),
            ("MODIFIED", pod("a", 15, gpu=False)),  # no longer passes the filter
        ]:
            source.events.put_nowait(event)
        changes = await seen.until(5)
        assert seen.summary() == [
            ("upsert", "ns/a"),
            ("upsert", "ns/b"),
            ("upsert", "ns/a"),
            ("delete", "ns/b"),
            ("delete", "ns/a"),
        ]
        assert [c.released for c in changes] == [False, False, True, True, True]
        finished = changes[2]
        assert finished.previous is changes[0].obj
        deleted = changes[3]
        assert deleted.obj["status"]["phase"] == "Failed", "the final state of a deleted pod"
        assert deleted.previous is changes[1].obj
        assert r.snapshot() == {}
        assert source.watched_from == ["10"]
        await stopped(task)

    run(scenario)


Listed = TypeVar("Listed", Pod, Node)


def managed(p: Listed) -> Listed:
    """``p`` with ``metadata.managedFields`` as the API server returns them."""
    assert p.metadata is not None
    p.metadata.managedFields = [
        ManagedFieldsEntry(
            manager="kube-scheduler",
            operation="Update",
            fieldsType="FieldsV1",
            fieldsV1={"f:spec": {"f:nodeName": {}}},
        )
    ]
    return p


def test_stored_objects_leave_out_managed_fields() -> None:
    # managedFields were half of every stored pod (10.8 KiB a pod, 5.0
    # without) in an extender holding 50,000; nothing of gpushare reads them.
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([managed(pod("listed", 1))], "10"))
        r, task = await started(source, seen)
        for event in [("ADDED", managed(pod("added", 11))), ("DELETED", managed(pod("added", 12)))]:
            source.events.put_nowait(event)
        changes = await seen.until(3)
        assert [c.action.value for c in changes] == ["upsert", "upsert", "delete"]
        for change in changes:
            metadata = change.obj["metadata"]
            assert "managedFields" not in metadata, change.key
            assert metadata["namespace"] == "ns", "the rest of the metadata is kept"
            assert change.obj["spec"]["containers"][0]["name"] == "c"
        assert all("managedFields" not in o["metadata"] for o in r.snapshot().values())
        await stopped(task)

    run(scenario)


def test_kubectl_inspects_listing_leaves_out_managed_fields_too() -> None:
    """``read_cluster`` (the kubectl plugin's 20,000 pods) reads objects as the cache does."""

    class Client:
        def list(self, kind: type, **_: object) -> AsyncIterator[Any]:
            items = (
                [managed(pod("p", 1))]
                if kind is Pod
                else [managed(Node(metadata=ObjectMeta(name="n1")))]
            )

            async def listed() -> AsyncIterator[Any]:
                for item in items:
                    yield item

            return listed()

    objects = asyncio.run(read_cluster(Client()))  # type: ignore[arg-type]
    assert [o["metadata"]["name"] for o in (*objects.nodes, *objects.pods)] == ["n1", "p"]
    assert all("managedFields" not in o["metadata"] for o in (*objects.nodes, *objects.pods))


def test_expiry_relists_and_reports_only_the_difference() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([pod("a", 1), pod("b", 2)], "10"))
        r, task = await started(source, seen)
        source.lists.append(ScriptedList([pod("a", 1), pod("c", 30), pod("b", 31)], "40"))
        source.events.put_nowait(expired())
        await seen.until(4)
        assert seen.summary()[2:] == [("upsert", "ns/c"), ("upsert", "ns/b")]
        assert seen.changes[3].previous is seen.changes[1].obj
        # Deleted during the gap: reported as a delete by the next relist.
        source.lists.append(ScriptedList([pod("c", 30)], "50"))
        source.events.put_nowait(expired())
        await seen.until(6)
        assert seen.summary()[4:] == [("delete", "ns/a"), ("delete", "ns/b")]
        assert set(r.snapshot()) == {"ns/c"}
        stats = r.stats
        assert (stats.lists, stats.relists, stats.expired, stats.errors) == (3, 2, 2, 0)
        assert source.watched_from == ["10", "40", "50"]
        await stopped(task)

    run(scenario)


def test_disconnect_resumes_from_the_last_resource_version_seen() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([], "10"))
        r, task = await started(source, seen)
        source.events.put_nowait(("ADDED", pod("a", 17)))
        source.events.put_nowait(httpx2.ReadError("peer closed"))
        source.events.put_nowait(("ADDED", pod("b", 18)))
        await seen.until(2)
        source.events.put_nowait(END)  # a normal end of the watch term resumes too
        source.events.put_nowait(("ADDED", pod("c", 19)))
        await seen.until(3)
        assert source.watched_from == ["10", "17", "18"]
        stats = r.stats
        assert (stats.lists, stats.rewatches, stats.errors) == (1, 1, 1)
        assert stats.last_error == "unreachable (no reply): ReadError: peer closed"
        await stopped(task)

    run(scenario)


def test_a_failing_listener_does_not_stop_the_reflector() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()

        def sink(change: Change) -> None:
            seen(change)
            if change.key == "ns/bad":
                raise RuntimeError("listener bug")

        source.lists.append(ScriptedList([pod("bad", 1)], "10"))
        _r, task = await started(source, sink)
        source.events.put_nowait(("ADDED", pod("good", 11)))
        await seen.until(2)
        assert seen.summary() == [("upsert", "ns/bad"), ("upsert", "ns/good")]
        await stopped(task)

    run(scenario)


def test_a_bug_in_the_reflector_propagates() -> None:
    async def scenario() -> None:
        source = Source()
        source.lists.append(ScriptedList([], "10"))
        r, task = await started(source, Collector())
        source.events.put_nowait(ValueError("not a client error"))
        with pytest.raises(ValueError, match="not a client error"):
            await task
        assert r.stats.errors == 0

    run(scenario)


def test_backoff_grows_and_is_capped() -> None:
    backoff = Backoff(initial_s=0.5, max_s=4.0, factor=2.0, jitter=0.0)
    rng = random.Random(0)
    assert [backoff.delay_s(n, rng) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    jittered = Backoff(initial_s=1.0, max_s=1.0, jitter=0.25)
    assert all(0.75 <= jittered.delay_s(3, rng) <= 1.0 for _ in range(100))


def test_backoff_reports_every_bad_field() -> None:
    with pytest.raises(ValueError, match="initial_s") as caught:
        Backoff(initial_s=-1, max_s=-2, factor=0.5, jitter=2)
    message = str(caught.value)
    for name in ("initial_s", "max_s", "factor", "jitter"):
        assert name in message


def test_two_failures_in_a_row_make_it_stale_until_a_relist_succeeds() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([pod("a", 5)], "10"))
        r, task = await started(source, seen)
        assert not r.stale
        gate = asyncio.Event()
        relist = ScriptedList([pod("a", 5), pod("b", 21)], "30", gate)
        source.lists.append(relist)
        source.events.put_nowait(httpx2.ConnectError("refused"))  # the API server goes away
        source.events.put_nowait(httpx2.ConnectError("refused"))
        async with asyncio.timeout(5):
            await relist.entered.wait()
        assert r.stale, "stale from the second failure until the relist is applied"
        gate.set()
        await seen.until(2)  # recovered by a relist, which brings b
        assert seen.summary() == [("upsert", "ns/a"), ("upsert", "ns/b")]
        assert source.watched_from == ["10", "10", "30"]  # resumed once, then relisted
        assert not r.stale
        stats = r.stats
        assert (stats.lists, stats.rewatches, stats.errors) == (2, 1, 2)
        await stopped(task)

    run(scenario)


def test_one_dropped_stream_is_not_stale() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([], "10"))
        r, task = await started(source, seen)
        source.events.put_nowait(httpx2.ReadError("peer closed"))
        source.events.put_nowait(("ADDED", pod("a", 11)))
        await seen.until(1)
        assert not r.stale
        await stopped(task)

    run(scenario)


def test_relist_ends_the_watch_lists_again_and_returns_once_applied() -> None:
    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([pod("a", 5)], "10"))
        r, task = await started(source, seen)
        await seen.until(1)
        source.lists.append(ScriptedList([pod("a", 5), pod("b", 12)], "12"))
        async with asyncio.timeout(5):
            await r.relist()
        assert seen.summary() == [("upsert", "ns/a"), ("upsert", "ns/b")]
        assert r.stats.lists == 2
        source.events.put_nowait(("ADDED", pod("c", 13)))
        await seen.until(3)
        assert source.watched_from[-1] == "12"  # the watch resumed from the new list
        await stopped(task)

    run(scenario)


def test_relist_asked_while_a_list_is_in_flight_gets_a_list_of_its_own() -> None:
    """A relist asked during a list (one that started before the call) must not wait for the
    watch that follows to end its term: the reflector lists again before watching."""

    async def scenario() -> None:
        source, seen = Source(), Collector()
        source.lists.append(ScriptedList([pod("a", 5)], "10"))
        r, task = await started(source, seen)
        gate = asyncio.Event()
        in_flight = ScriptedList([pod("a", 5)], "20", gate)
        source.lists.append(in_flight)
        source.events.put_nowait(expired())  # the reflector relists by itself
        async with asyncio.timeout(5):
            await in_flight.entered.wait()
        source.lists.append(ScriptedList([pod("a", 5), pod("b", 31)], "31"))
        asked = asyncio.ensure_future(r.relist())
        await asyncio.sleep(0)
        gate.set()
        async with asyncio.timeout(5):
            await asked
        assert seen.summary() == [("upsert", "ns/a"), ("upsert", "ns/b")]
        assert r.stats.lists == 3
        await stopped(task)

    run(scenario)
