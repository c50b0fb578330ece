"""The node configuration applied to what the device plugin advertises: at start, on a change,
waiting while pods hold memory, and refusing what cannot be read
(``gpushare.deviceplugin.configcontrol``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpushare.deviceplugin.configcontrol import NodeConfigController
from gpushare.deviceplugin.inventory import PhysicalGpu, parse_fake_gpus
from gpushare.deviceplugin.nodeconfig import NodeConfigMetrics
from gpushare.kube.codec import CodecError, MemoryUnit
from gpushare.kube.codec.nodeconfig import MemoryReserve, NodeConfig
from gpushare.kube.watch import JsonObject
from gpushare.testing.pods import placed_pod_json

NODE = "gpu-1"
GPUS = parse_fake_gpus("2x16GiB:T4")
HOLD_4 = NodeConfig(reserved=MemoryReserve(mib=4096))
HOLD_8 = NodeConfig(reserved=MemoryReserve(mib=8192))
MIB = NodeConfig(memory_unit=MemoryUnit.MIB)


@dataclass
class Source:
    """A node-config watch that has read ``config`` (``synced``) and node ``node``."""

    config: NodeConfig = field(default_factory=NodeConfig)
    node: JsonObject | None = None
    synced: bool = True
    namespace: str = "kube-system"
    name: str = "gpushare-node-config"

    async def wait_synced(self, timeout_s: float) -> None:
        if not self.synced:
            raise TimeoutError


@dataclass
class Rig:
    pods: list[dict[str, Any]] = field(default_factory=list)
    advertised: list[tuple[tuple[int, ...], MemoryUnit]] = field(default_factory=list)
    events: list[tuple[str, bool]] = field(default_factory=list)
    publishes: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    control: NodeConfigController = field(init=False)

    def __post_init__(self) -> None:
        self.control = NodeConfigController(
            NODE,
            GPUS,
            MemoryUnit.GIB,
            NodeConfigMetrics(self.registry, NODE),
            pods=lambda: self.pods,
            advertise=self.advertise,
            healthy=lambda index: index != 1,
            republish=self.republish,
            node_event=self.event,
            retry_s=0.01,
        )

    async def advertise(self, gpus: list[PhysicalGpu], unit: MemoryUnit) -> None:
        self.advertised.append((tuple(g.memory_mib for g in gpus), unit))

    async def republish(self) -> None:
        self.publishes += 1

    async def event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, warning))

    def gauge(self, name: str) -> float | None:
        return self.registry.get_sample_value(
            f"gpushare_device_plugin_node_config_{name}", {"node": NODE}
        )


def test_at_start_the_configuration_read_applies_without_a_publish_of_its_own() -> None:
    rig = Rig()
    asyncio.run(rig.control.start(Source(HOLD_4), sync_timeout_s=5))
    assert rig.advertised == [((12 * 1024, 12 * 1024), MemoryUnit.GIB)]
    assert rig.publishes == 0, "the daemon's first publish follows"
    assert rig.events == [("NodeConfigApplied", False)]
    assert rig.control.configured.config == HOLD_4


def test_at_start_a_configuration_not_read_in_time_leaves_the_flags_until_it_is() -> None:
    rig = Rig()

    async def scenario() -> None:
        await rig.control.start(Source(synced=False), sync_timeout_s=5)
        assert rig.advertised == []
        await rig.control.changed(HOLD_4)

    asyncio.run(scenario())
    assert rig.advertised == [((12 * 1024, 12 * 1024), MemoryUnit.GIB)]
    assert rig.publishes == 1


def test_a_change_before_start_waits_for_start() -> None:
    rig = Rig()
    asyncio.run(rig.control.changed(HOLD_4))
    assert rig.advertised == []


@pytest.mark.parametrize(
    ("pods", "applied"),
    [
        ([], True),
        ([placed_pod_json("a", NODE, {0: 12})], False),
        ([placed_pod_json("a", NODE, {0: 12}, phase="Succeeded")], True),
    ],
    ids=[
        "no pod: applied at once, published, an Event",
        "a pod holding the memory: waits, says why once",
        "a finished pod holds nothing",
    ],
)
def test_a_change_applies_unless_it_takes_memory_from_pods(
    pods: list[dict[str, Any]], applied: bool
) -> None:
    rig = Rig(pods=pods)

    async def scenario() -> None:
        await rig.control.start(Source(), sync_timeout_s=5)
        await rig.control.changed(HOLD_8)
        await rig.control.changed(HOLD_8)  # the same wait is not reported twice

    asyncio.run(scenario())
    if applied:
        assert rig.advertised == [((8192, 8192), MemoryUnit.GIB)]
        assert rig.publishes == 1
        assert rig.events == [("NodeConfigApplied", False)]
        assert rig.control.wanted is None
        assert rig.gauge("deferred") == 0
    else:
        assert rig.advertised == []
        assert rig.events == [("NodeConfigDeferred", True)]
        assert rig.control.wanted is not None
        assert rig.gauge("deferred") == 1


def test_a_waiting_change_applies_on_a_retry_once_the_pod_is_gone() -> None:
    rig = Rig(pods=[placed_pod_json("a", NODE, {0: 12})])

    async def scenario() -> None:
        await rig.control.start(Source(), sync_timeout_s=5)
        await rig.control.changed(HOLD_8)
        rig.pods.clear()
        retry = asyncio.create_task(rig.control.retry_deferred())
        try:
            async with asyncio.timeout(5):
                while rig.control.wanted is not None:
                    await asyncio.sleep(0.01)
        finally:
            retry.cancel()

    asyncio.run(scenario())
    assert rig.advertised == [((8192, 8192), MemoryUnit.GIB)]
    assert [reason for reason, _ in rig.events] == ["NodeConfigDeferred", "NodeConfigApplied"]


def test_the_applied_gpus_carry_their_health_now() -> None:
    seen: list[list[bool]] = []
    rig = Rig()

    async def advertise(gpus: list[PhysicalGpu], unit: MemoryUnit) -> None:
        seen.append([g.healthy for g in gpus])

    rig.control._advertise = advertise
    asyncio.run(rig.control.start(Source(HOLD_4), sync_timeout_s=5))
    assert seen == [[True, False]]


def test_an_entry_that_cannot_be_read_changes_nothing_and_says_why() -> None:
    rig = Rig()

    async def scenario() -> None:
        await rig.control.start(Source(), sync_timeout_s=5)
        await rig.control.invalid(CodecError("node gpu-1", "memoryUnit", "KiB", "bad", "GiB"))

    asyncio.run(scenario())
    assert rig.advertised == []
    assert rig.events == [("NodeConfigInvalid", True)]
    assert rig.gauge("invalid") == 1


def test_a_new_unit_waits_while_a_pod_asks_memory_in_the_old_one() -> None:
    rig = Rig(pods=[placed_pod_json("a", NODE, None)])

    async def scenario() -> None:
        await rig.control.start(Source(), sync_timeout_s=5)
        await rig.control.changed(MIB)

    asyncio.run(scenario())
    assert rig.advertised == []
    assert rig.control.configured.unit is MemoryUnit.GIB
