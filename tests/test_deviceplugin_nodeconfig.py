"""What the device plugin advertises under a node configuration, and when a change must wait
(``gpushare.deviceplugin.nodeconfig``; docs/node-config.md, "Changes and running pods")."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import pytest

from gpushare.core.serves import Serves
from gpushare.deviceplugin.inventory import PhysicalGpu, parse_fake_gpus
from gpushare.deviceplugin.nodeconfig import Configured, configure, deferral
from gpushare.kube.codec import CodecError, MemoryUnit
from gpushare.kube.codec.nodeconfig import MemoryReserve, NodeConfig
from gpushare.testing.pods import placed_pod_json

NODE = "gpu-1"
GPUS = parse_fake_gpus("2x16GiB:T4")


def gib(*memory_gib: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, m * 1024) for i, m in enumerate(memory_gib))


def advertised(configured: Configured) -> tuple[tuple[int, int], ...]:
    return tuple((g.index, g.memory_mib) for g in configured.gpus)


@pytest.mark.parametrize(
    ("config", "unit", "memory", "serves"),
    [
        (NodeConfig(), MemoryUnit.GIB, gib(16, 16), Serves.BOTH),
        (NodeConfig(memory_unit=MemoryUnit.MIB), MemoryUnit.MIB, gib(16, 16), Serves.BOTH),
        (NodeConfig(reserved=MemoryReserve(mib=4096)), MemoryUnit.GIB, gib(12, 12), Serves.BOTH),
        (NodeConfig(excluded_indices=frozenset({0})), MemoryUnit.GIB, ((1, 16384),), Serves.BOTH),
        (NodeConfig(serves=Serves.WHOLE), MemoryUnit.GIB, gib(16, 16), Serves.WHOLE),
    ],
    ids=[
        "nothing configured: the flags",
        "the ConfigMap's unit wins over --memory-unit",
        "memory held back per GPU",
        "an excluded GPU is not advertised",
        "what the node serves",
    ],
)
def test_configure(
    config: NodeConfig, unit: MemoryUnit, memory: tuple[tuple[int, int], ...], serves: Serves
) -> None:
    configured = configure(GPUS, config, MemoryUnit.GIB, NODE)
    assert (configured.unit, advertised(configured), configured.serves) == (unit, memory, serves)


def test_a_unit_whose_device_list_would_not_fit_kubelets_message_is_a_bad_memory_unit() -> None:
    big = parse_fake_gpus("16x80GiB:H100")  # 1,310,720 MiB devices: far over 4 MiB
    config = NodeConfig(memory_unit=MemoryUnit.MIB, sources=("nodes[0] (name gpu-1)",))
    with pytest.raises(CodecError) as error:
        configure(big, config, MemoryUnit.GIB, NODE)
    assert str(error.value).startswith(
        "node gpu-1: node config (nodes[0] (name gpu-1)): memoryUnit='MiB': refusing to start"
    )


def pod(name: str, placed: dict[int, int] | None, phase: str = "Running") -> dict[str, Any]:
    """A pod on NODE asking ``sum(placed)`` GiB, with its allocation (GPU → GiB) if placed."""
    return placed_pod_json(name, NODE, placed, phase=phase)


NOW = configure(GPUS, NodeConfig(), MemoryUnit.GIB, NODE)


@pytest.mark.parametrize(
    ("config", "pods", "why"),
    [
        (NodeConfig(reserved=MemoryReserve(mib=4096)), [pod("a", {0: 12})], ""),
        (NodeConfig(reserved=MemoryReserve(mib=8192)), [pod("a", {0: 12})],
         "GPU 0 would advertise 8 GiB but pods hold 12 (ns/a)"),
        (NodeConfig(reserved=MemoryReserve(fraction=Fraction(1, 2))),
         [pod("a", {1: 6}), pod("b", {1: 6})],
         "GPU 1 would advertise 8 GiB but pods hold 12 (ns/a, ns/b)"),
        (NodeConfig(excluded_indices=frozenset({1})), [pod("a", {0: 16})], ""),
        (NodeConfig(excluded_indices=frozenset({1})), [pod("a", {1: 2})],
         "GPU 1 is excluded but pods hold 2 GiB of it (ns/a)"),
        (NodeConfig(excluded_indices=frozenset({1})), [pod("a", {1: 2}, phase="Succeeded")], ""),
        (NodeConfig(memory_unit=MemoryUnit.MIB), [pod("a", None)],
         "memoryUnit MiB waits until no pod on the node asks GPU memory in GiB (1 do: ns/a)"),
        (NodeConfig(memory_unit=MemoryUnit.MIB), [], ""),
        (NodeConfig(serves=Serves.WHOLE), [pod("a", {0: 4})], ""),
    ],
    ids=[
        "holding back what nobody holds applies at once",
        "holding back memory a pod holds waits for it",
        "pods are summed per GPU",
        "excluding a GPU nobody holds applies at once",
        "excluding a GPU a pod holds waits for it",
        "a finished pod holds nothing",
        "a new unit waits while any pod asks GPU memory, placed or not",
        "a new unit applies on a node without GPU pods",
        "what the node serves applies at once (running pods keep their GPUs)",
    ],
)  # fmt: skip
def test_a_change_waits_only_while_it_would_take_memory_from_pods(
    config: NodeConfig, pods: list[dict[str, Any]], why: str
) -> None:
    new = configure(GPUS, config, MemoryUnit.GIB, NODE)
    assert deferral(NOW, new, pods, NODE) == why


def test_the_gpus_keep_their_identity() -> None:
    configured = configure(GPUS, NodeConfig(reserved=MemoryReserve(mib=1)), MemoryUnit.MIB, NODE)
    kept: list[PhysicalGpu] = list(configured.gpus)
    assert [(g.uuid, g.minor, g.model) for g in kept] == [(g.uuid, g.minor, g.model) for g in GPUS]
