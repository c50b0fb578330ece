"""A GPU's health from XIDs, the managed MPS daemon and marks by hand, told to every served
resource (``gpushare.deviceplugin.gpuhealth``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest

from gpushare.deviceplugin.gpuhealth import GpuHealth


@dataclass
class Sink:
    """A service that records the health it is told, by GPU."""

    health: dict[int, bool] = field(default_factory=dict)

    async def set_health(self, index: int, healthy: bool) -> None:
        self.health[index] = healthy


@dataclass
class Rig:
    sinks: list[Sink] = field(default_factory=lambda: [Sink(), Sink()])
    publishes: int = 0
    health: GpuHealth = field(init=False)

    def __post_init__(self) -> None:
        self.health = GpuHealth({0: True, 1: True, 2: False}, lambda: self.sinks, self.republish)

    async def republish(self) -> None:
        self.publishes += 1

    def told(self) -> list[dict[int, bool]]:
        return [sink.health for sink in self.sinks]


Step = Callable[[GpuHealth], Awaitable[None]]


def xid(index: int, healthy: bool) -> Step:
    return lambda h: h.xid_changed(index, healthy)


def mps(up: bool) -> Step:
    return lambda h: h.mps_changed(up)


def marks(*marked: int) -> Step:
    return lambda h: h.marks_changed(frozenset(marked))


@pytest.mark.parametrize(
    ("steps", "healthy", "publishes"),
    [
        ([], {0: True, 1: True, 2: False}, 0),
        ([xid(1, False)], {0: True, 1: False, 2: False}, 1),
        ([xid(1, False), xid(1, True)], {0: True, 1: True, 2: False}, 2),
        ([mps(False)], {0: False, 1: False, 2: False}, 1),
        ([xid(0, False), mps(False), mps(True)], {0: False, 1: True, 2: False}, 3),
        ([marks(1)], {0: True, 1: False, 2: False}, 1),
        ([marks(1), marks()], {0: True, 1: True, 2: False}, 2),
        ([marks(0), xid(0, True)], {0: False, 1: True, 2: False}, 2),
        ([xid(7, False)], {0: True, 1: True, 2: False}, 0),
    ],
    ids=[
        "at start each GPU is as the inventory says",
        "a critical XID makes its GPU unhealthy",
        "a recovered GPU comes back",
        "the MPS daemon down makes every GPU unhealthy",
        "the MPS daemon back leaves a GPU with an XID unhealthy",
        "a GPU marked by hand is unhealthy",
        "a mark taken back makes it healthy again",
        "a marked GPU stays unhealthy whatever its XIDs say",
        "a GPU the node does not have is ignored",
    ],
)
def test_a_gpu_is_healthy_only_when_all_three_sources_say_so(
    steps: list[Step], healthy: dict[int, bool], publishes: int
) -> None:
    rig = Rig()

    async def scenario() -> None:
        for step in steps:
            await step(rig.health)

    asyncio.run(scenario())
    assert {i: rig.health.healthy(i) for i in rig.health.indices} == healthy
    assert rig.publishes == publishes, "each change publishes the inventory once"
    for told in rig.told():  # every served resource was told what changed
        assert all(told[i] == healthy[i] for i in told)


def test_every_resource_is_told_every_gpu_when_mps_goes_down() -> None:
    rig = Rig()
    asyncio.run(rig.health.mps_changed(False))
    assert rig.told() == [{0: False, 1: False, 2: False}] * 2
    assert not rig.health.mps_up
