"""XID health (`HealthWatcher`) over `FakeNvml`: the rules of NVIDIA's k8s-device-plugin + recovery.

Scenarios are driven step by step: each step changes the fake (an XID, a probe result, a failed
wait) or the clock, then the watcher polls once. The clock is injected; nothing sleeps.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from gpushare.deviceplugin.health import APPLICATION_XIDS, HealthWatcher
from gpushare.deviceplugin.nvml import NvmlError, NvmlInventory
from gpushare.testing.clock import ManualClock
from gpushare.testing.controlplane import async_wait_until
from gpushare.testing.nvml import FakeDevice, FakeNvml

GIB = 2**30
T4 = FakeDevice("GPU-7a1c0000-0000-4000-8000-000000000001", 0, "Tesla T4", 16 * GIB)
A100 = FakeDevice("GPU-a1000000-0000-4000-8000-000000000002", 1, "NVIDIA A100", 80 * GIB)
NO_EVENTS = FakeDevice("GPU-01d00000-0000-4000-8000-000000000003", 2, "Old GPU", GIB, 0)
RECOVERY_S = 300.0
WAIT_S = 0.01


@dataclass(frozen=True)
class Xid:
    index: int | None
    xid: int


@dataclass(frozen=True)
class Event:
    index: int
    event_type: int


@dataclass(frozen=True)
class Advance:
    seconds: float


@dataclass(frozen=True)
class Probe:
    index: int
    ok: bool


@dataclass(frozen=True)
class WaitFails:
    pass


Step = Xid | Event | Advance | Probe | WaitFails
Change = tuple[int, bool]


class Harness:
    """A watcher over a `FakeNvml`, recording every `on_change` call."""

    def __init__(
        self,
        devices: Sequence[FakeDevice],
        *,
        enabled: bool = True,
        ignored_xids: frozenset[int] = frozenset(),
    ) -> None:
        self.fake = FakeNvml(devices)
        self.clock = ManualClock()
        self.changes: list[Change] = []
        gpus = NvmlInventory(self.fake).gpus()
        self.watcher = HealthWatcher(
            self.fake,
            gpus,
            self.on_change,
            recovery_s=RECOVERY_S,
            wait_timeout_s=WAIT_S,
            clock=self.clock,
            enabled=enabled,
            ignored_xids=ignored_xids,
        )

    async def on_change(self, index: int, healthy: bool) -> None:
        self.changes.append((index, healthy))

    async def step(self, step: Step) -> None:
        match step:
            case Xid(index, xid):
                self.fake.inject_xid(index, xid)
            case Event(index, event_type):
                self.fake.inject_event(index, event_type, 0)
            case Advance(seconds):
                self.clock.now_s += seconds
            case Probe(index, ok):
                self.fake.set_probe_ok(index, ok)
            case WaitFails():
                self.fake.fail_next_wait(NvmlError(999, "Unknown Error"))
        await self.watcher.poll_once()


def _scenario(steps: Sequence[Step], devices: Sequence[FakeDevice] = (T4, A100)) -> Harness:
    harness = Harness(devices, ignored_xids=frozenset({94}))

    async def main() -> None:
        harness.watcher.open()
        try:
            for step in steps:
                await harness.step(step)
        finally:
            harness.watcher.close()

    asyncio.run(main())
    return harness


CASES = [
    ("a critical XID marks its GPU unhealthy, once", [Xid(1, 79)], [(1, False)]),
    ("more XIDs on an unhealthy GPU report nothing new", [Xid(0, 79), Xid(0, 48)], [(0, False)]),
    *((f"application XID {xid} is ignored", [Xid(0, xid)], []) for xid in sorted(APPLICATION_XIDS)),
    ("a configured extra XID is ignored", [Xid(0, 94)], []),
    ("a non-XID event is ignored", [Event(0, 0x2)], []),
    ("an all-devices XID marks every GPU unhealthy", [Xid(None, 79)], [(0, False), (1, False)]),
    ("a failed event wait marks every GPU unhealthy", [WaitFails()], [(0, False), (1, False)]),
    ("no recovery before recovery_s", [Xid(0, 79), Advance(RECOVERY_S - 1)], [(0, False)]),
    (
        "recovery after recovery_s with a successful probe",
        [Xid(0, 79), Advance(RECOVERY_S - 1), Advance(1)],
        [(0, False), (0, True)],
    ),
    (
        "no recovery while the probe fails",
        [Xid(0, 79), Probe(0, False), Advance(RECOVERY_S), Advance(RECOVERY_S)],
        [(0, False)],
    ),
    (
        "recovery once the failing probe succeeds again",
        [Xid(0, 79), Probe(0, False), Advance(RECOVERY_S), Probe(0, True)],
        [(0, False), (0, True)],
    ),
    (
        "a new XID during recovery restarts the timer",
        [Xid(0, 79), Advance(200), Xid(0, 79), Advance(200)],
        [(0, False)],
    ),
    (
        "recovery_s after the last XID of a restarted timer",
        [Xid(0, 79), Advance(200), Xid(0, 79), Advance(200), Advance(100)],
        [(0, False), (0, True)],
    ),
    (
        "a GPU that recovered can fail again",
        [Xid(0, 79), Advance(RECOVERY_S), Xid(0, 63)],
        [(0, False), (0, True), (0, False)],
    ),
]


@pytest.mark.parametrize(("steps", "changes"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_health_rules(steps: list[Step], changes: list[Change]) -> None:
    harness = _scenario(steps)
    assert harness.changes == changes
    last = dict(changes)
    assert [harness.watcher.healthy(i) for i in (0, 1)] == [last.get(i, True) for i in (0, 1)]
    assert harness.fake.live_event_sets == 0


def test_a_gpu_without_xid_events_is_logged_and_always_healthy(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, "gpushare.deviceplugin.health"):
        harness = _scenario([Xid(None, 79), Xid(2, 79)], devices=(T4, A100, NO_EVENTS))
    assert harness.watcher.watched == [0, 1]
    assert harness.changes == [(0, False), (1, False)]
    assert harness.watcher.healthy(2)
    assert f"GPU 2 ({NO_EVENTS.uuid}) cannot report XID events" in caplog.text


def test_transitions_are_logged_with_index_uuid_and_xid(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, "gpushare.deviceplugin.health"):
        _scenario([Xid(1, 79), Advance(RECOVERY_S)])
    assert f"GPU 1 ({A100.uuid}) is unhealthy: critical XID 79" in caplog.text
    assert f"GPU 1 ({A100.uuid}) is healthy again" in caplog.text
    assert "since critical XID 79, probe ok" in caplog.text


def test_disabled_health_checking_touches_no_nvml() -> None:
    harness = Harness([T4], enabled=False)
    calls_before = list(harness.fake.calls)

    async def main() -> None:
        await asyncio.wait_for(harness.watcher.run(), 1)

    asyncio.run(main())
    harness.fake.inject_xid(0, 79)
    assert harness.fake.calls == calls_before
    assert harness.changes == []
    assert harness.watcher.healthy(0)


def test_run_reports_an_xid_and_stops_promptly_when_cancelled() -> None:
    """Cancelling does not wait for the NVML wait in flight (30 s here): the task ends at once,
    and the event set is freed when that wait returns (an event ends it below). Waits on
    conditions only: no bound on wall time but the 10 s a hung cancellation would overrun."""
    fake = FakeNvml([T4, A100])
    seen: asyncio.Queue[Change] = asyncio.Queue()

    async def on_change(index: int, healthy: bool) -> None:
        await seen.put((index, healthy))

    gpus = NvmlInventory(fake).gpus()
    watcher = HealthWatcher(fake, gpus, on_change, wait_timeout_s=30.0)  # a long wait in flight

    async def main() -> None:
        task = asyncio.create_task(watcher.run())
        await asyncio.sleep(0)  # run() registers synchronously before its first wait
        assert watcher.watched == [0, 1]
        fake.inject_xid(1, 79)
        assert await asyncio.wait_for(seen.get(), 5) == (1, False)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=10)  # far below the 30 s wait in flight
        assert done == {task}
        assert task.cancelled()
        fake.inject_xid(0, 79)  # ends the wait in flight: its thread frees the event set
        await async_wait_until("the event set freed", lambda: not fake.live_event_sets, 10)

    asyncio.run(main())


def test_poll_before_open_is_an_error() -> None:
    harness = Harness([T4])
    with pytest.raises(RuntimeError, match="before open"):
        asyncio.run(harness.watcher.poll_once())


def test_bad_settings_are_all_reported() -> None:
    async def on_change(index: int, healthy: bool) -> None:
        pass

    with pytest.raises(ValueError, match=r"recovery_s must be >= 0, got -1.*wait_timeout_s"):
        HealthWatcher(FakeNvml([]), [], on_change, recovery_s=-1, wait_timeout_s=0)
