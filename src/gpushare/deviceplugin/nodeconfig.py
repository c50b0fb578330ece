"""The node's configuration (``gpushare-node-config``, docs/node-config.md) turned into what the
device plugin advertises, and the rule that keeps a change safe for pods holding GPUs.

* :func:`configure`: the GPUs kept for sharing (excluded ones left out), each with its memory
  after the reservation, the unit (the ConfigMap's, else ``--memory-unit``) and what the node
  serves. ``CodecError`` naming the node and the key for a configuration the node cannot take
  (an unknown GPU, a reservation leaving less than one unit, a device list over kubelet's
  message limit in the new unit).
* :func:`deferral`: why a configuration must wait (``""`` when it may apply now). A change
  never takes memory from under a pod: it waits while a pod on the node holds GPU memory
  (pods not finished, from their allocation annotations) on a GPU it would exclude, or more
  than the GPU would advertise; a change of unit waits while any pod on the node asks GPU
  memory (their requests, annotations and kubelet's device counts are in the old unit). The
  daemon keeps the configuration in force, reports the wait, and tries again as pods come and
  go.
* :class:`NodeConfigMetrics`: ``gpushare_device_plugin_node_config_invalid`` (1 while the
  ConfigMap cannot be read for this node) and ``gpushare_device_plugin_node_config_deferred``
  (1 while a configuration waits), both labelled ``node``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from prometheus_client import CollectorRegistry, Gauge

from gpushare.core.serves import Serves
from gpushare.deviceplugin.inventory import DeviceListTooLargeError, PhysicalGpu, check_message_size
from gpushare.kube.codec import CodecError, Json, MemoryUnit, pod_allocation, pod_finished, pod_key
from gpushare.kube.codec.nodeconfig import GpuFacts, NodeConfig, configured_memory

__all__ = ["Configured", "NodeConfigMetrics", "configure", "deferral"]


@dataclass(frozen=True, slots=True)
class Configured:
    """What the plugin advertises under a configuration: ``gpus`` (kept for sharing, memory
    after the reservation, in index order), ``unit``, ``serves``, and the ``config`` itself."""

    gpus: tuple[PhysicalGpu, ...]
    unit: MemoryUnit
    serves: Serves
    config: NodeConfig

    def describe(self) -> str:
        """``memoryUnit GiB, reservedMemory 10%, excludeGpus 1, serves both; 1 GPU(s) shared:
        0 14 GiB``."""
        shown = ", ".join(f"{g.index} {g.units(self.unit)} {self.unit}" for g in self.gpus)
        return (
            f"{self.config.describe(self.unit)}; {len(self.gpus)} GPU(s) shared: {shown or 'none'}"
        )


def configure(
    physical: Sequence[PhysicalGpu], config: NodeConfig, default_unit: MemoryUnit, node: str
) -> Configured:
    """``physical`` under ``config`` (module doc); ``default_unit``: ``--memory-unit``."""
    unit = config.memory_unit or default_unit
    facts = [GpuFacts(g.index, g.uuid, g.memory_mib) for g in physical]
    memory = configured_memory(config, node, facts, unit)
    gpus = tuple(replace(g, memory_mib=memory[g.index]) for g in physical if g.index in memory)
    try:
        check_message_size(gpus, unit)
    except DeviceListTooLargeError as error:
        raise CodecError(
            f"node {node}: node config ({', '.join(config.sources)})", "memoryUnit", str(unit),
            str(error), "a unit whose device list fits (GiB)",
        ) from None  # fmt: skip
    return Configured(gpus, unit, config.serves or Serves.BOTH, config)


def _holders(pods: Sequence[Json], node: str) -> tuple[list[str], dict[int, tuple[int, list[str]]]]:
    """(keys of the node's pods that are not finished, per GPU index: units held and by whom)."""
    keys: list[str] = []
    held: dict[int, tuple[int, list[str]]] = {}
    for pod in pods:
        if pod_finished(pod):
            continue
        key = pod_key(pod)
        keys.append(key)
        try:
            allocation = pod_allocation(pod)
        except CodecError:
            continue  # unreadable: counted by the unit rule; the extender reports it
        if allocation is None or allocation.node != node:
            continue
        for index, units in allocation.per_gpu().items():
            total, who = held.get(index, (0, []))
            held[index] = (total + units, [*who, key])
    return keys, held


def deferral(current: Configured, new: Configured, pods: Sequence[Json], node: str) -> str:
    """Why ``new`` must wait while ``current`` is in force with ``pods`` (the node's GPU-memory
    pods) on node ``node``; ``""`` when it may apply now (module doc)."""
    keys, held = _holders(pods, node)
    if new.unit != current.unit and keys:
        shown = ", ".join(sorted(keys)[:5]) + (", ..." if len(keys) > 5 else "")
        return (
            f"memoryUnit {new.unit} waits until no pod on the node asks GPU memory in "
            f"{current.unit} ({len(keys)} do: {shown})"
        )
    capacity = {g.index: g.units(new.unit) for g in new.gpus}
    problems: list[str] = []
    for index in sorted(held):
        units, who = held[index]
        if index not in capacity:
            problems.append(
                f"GPU {index} is excluded but pods hold {units} {current.unit} of it "
                f"({', '.join(sorted(who))})"
            )
        elif capacity[index] < units:
            problems.append(
                f"GPU {index} would advertise {capacity[index]} {new.unit} but pods hold "
                f"{units} ({', '.join(sorted(who))})"
            )
    return "; ".join(problems)


class NodeConfigMetrics:
    """The two node-config gauges (module doc) of node ``node`` on ``registry``."""

    def __init__(self, registry: CollectorRegistry, node: str) -> None:
        self._invalid = Gauge(
            "gpushare_device_plugin_node_config_invalid",
            "1 while the node's entry in the node-config ConfigMap cannot be read (the last "
            "good configuration stays in force)",
            ["node"],
            registry=registry,
        ).labels(node=node)
        self._deferred = Gauge(
            "gpushare_device_plugin_node_config_deferred",
            "1 while a node configuration waits for pods holding GPU memory to leave",
            ["node"],
            registry=registry,
        ).labels(node=node)

    def set(self, *, invalid: bool | None = None, deferred: bool | None = None) -> None:
        """Set either gauge (``None``: unchanged)."""
        if invalid is not None:
            self._invalid.set(int(invalid))
        if deferred is not None:
            self._deferred.set(int(deferred))
