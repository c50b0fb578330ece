"""Per-node configuration: the ConfigMap ``gpushare-node-config`` (docs/node-config.md). Pure; no
I/O.

One ConfigMap in the release namespace; its ``data["config.yaml"]`` (YAML, so JSON too; the
decoder is the caller's, :func:`node_config`)::

    defaults:                      # every node (optional)
      serves: both
    nodes:
      - name: gpu-node-1           # one node, by name
        memoryUnit: MiB            # GiB | MiB: the unit of aliyun.com/gpu-mem advertised
        reservedMemory: 10%        # held back per GPU: "10%", 0.1, "2048MiB" or "2GiB"
        excludeGpus: [3, GPU-8f0c...]   # left out of sharing: index or UUID (or "0,3")
        serves: whole              # shared | whole | both
        enforcement: mps           # mps | driver | library | none (absent: the best there is)
        requireEnforcement: true   # refuse shared containers unless mps or driver holds them
      - selector: {gpu.example.com/pool: training}   # nodes by label (matchLabels)
        serves: shared

Shape after peers: HAMi's device-plugin ``nodeconfig`` (``name``, ``filterdevices`` by
``uuid``/``index``) and coldzerofear/vgpu-manager's ``NodeConfig`` (``nodeName``,
``excludeDevices``, ``deviceMemoryScaling`` below 1 holding memory back); gpu-manager's own
flags (``--share-mode``) become ``serves``.

**Precedence, key by key**: the entry naming the node, else the one entry whose selector
matches its labels, else ``defaults``, else the device plugin's flags (``--memory-unit``), else
the built-in defaults (nothing held back, nothing excluded, ``both``). Two entries naming the
same node, or two selectors matching one node, are refused (the error names both entries).

**Errors** (``CodecError``, naming the node, the ConfigMap and the key, e.g.
``node n1: configmap gpushare/gpushare-node-config: nodes[1].reservedMemory='120%': ...``):
the document not YAML, not a mapping, an unknown key anywhere (a typo must not pass silently),
an entry with neither or both of ``name`` and ``selector``; then, for the entries that apply to
the node only, a value outside what is accepted, and (:func:`configured_memory`) a GPU the node
does not have or a reservation that leaves less than one unit. A bad entry for another node is
that node's error, not this one's. Absent ConfigMap or key: an empty configuration.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import NoReturn

from gpushare.core.isolation import Enforcement
from gpushare.core.serves import Serves
from gpushare.kube.codec.common import CodecError, Json, MemoryUnit, is_int, mapping, shown

__all__ = [
    "NODE_CONFIG_KEY",
    "NODE_CONFIG_NAME",
    "GpuFacts",
    "MemoryReserve",
    "NodeConfig",
    "configured_memory",
    "node_config",
]

NODE_CONFIG_NAME = "gpushare-node-config"
"""The ConfigMap's default name (in the release namespace)."""
NODE_CONFIG_KEY = "config.yaml"
"""The ``data`` key holding the document."""

_SETTINGS = (
    "memoryUnit",
    "reservedMemory",
    "excludeGpus",
    "serves",
    "enforcement",
    "requireEnforcement",
)
_ACCEPTED = {
    "memoryUnit": "GiB or MiB",
    "reservedMemory": (
        'memory held back per GPU: a percentage "10%" (0 to under 100), a fraction 0.1 '
        '(0 to under 1), or an amount "2048MiB" / "2GiB"'
    ),
    "excludeGpus": (
        'GPU indices or UUIDs, a list [0, "GPU-..."] or a string "0,3" (the node\'s GPUs)'
    ),
    "serves": "shared, whole or both",
    "enforcement": 'mps, driver, library or none (docs/share-view.md, "Enforcement backends")',
    "requireEnforcement": "true or false",
    "name": "a node name",
    "selector": "a map of label to value, e.g. {gpu.example.com/pool: training}",
}
_DOCUMENT_ACCEPTED = "a YAML mapping with the keys defaults and nodes (docs/node-config.md)"
_AMOUNT = re.compile(r"^\s*(\d{1,9})\s*(MiB|GiB|Mi|Gi)\s*$")
_PERCENT = re.compile(r"^\s*(\d{1,3}(?:\.\d{1,6})?)\s*%\s*$")
_UUID = re.compile(r"^(GPU|MIG)-[0-9A-Za-z-]{1,80}$")


@dataclass(frozen=True, slots=True)
class MemoryReserve:
    """Memory held back on every GPU: ``fraction`` of it (0 <= fraction < 1) or ``mib``."""

    fraction: Fraction = Fraction(0)
    mib: int = 0

    def held_back_mib(self, memory_mib: int) -> int:
        """MiB held back on a GPU of ``memory_mib`` (a fraction rounds up)."""
        return self.mib + math.ceil(memory_mib * self.fraction)

    def __str__(self) -> str:
        if self.mib:
            return f"{self.mib}MiB"
        return f"{float(self.fraction * 100):g}%"


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """The configuration of one node (module doc): ``None`` where nothing sets a key (the
    device plugin's flag or the built-in default then applies). ``excluded_indices`` and
    ``excluded_uuids``: GPUs left out of sharing; ``sources`` names the entries it came from
    (``nodes[0] (name n1)``, ``defaults``), for logs."""

    memory_unit: MemoryUnit | None = None
    reserved: MemoryReserve | None = None
    excluded_indices: frozenset[int] = frozenset()
    excluded_uuids: frozenset[str] = frozenset()
    serves: Serves | None = None
    enforcement: Enforcement | None = None
    require_enforcement: bool | None = None
    sources: tuple[str, ...] = field(default=(), compare=False)

    def describe(self, default_unit: MemoryUnit) -> str:
        """``memoryUnit GiB, reservedMemory 10%, excludeGpus 1, serves both`` (effective)."""
        excluded = sorted(map(str, self.excluded_indices)) + sorted(self.excluded_uuids)
        return (
            f"memoryUnit {self.memory_unit or default_unit}, reservedMemory "
            f"{self.reserved or '0'}, excludeGpus {','.join(excluded) or 'none'}, serves "
            f"{self.serves or Serves.BOTH}"
            f"{f', enforcement {self.enforcement}' if self.enforcement else ''}"
            f"{', requireEnforcement' if self.require_enforcement else ''}"
        )


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """What :func:`configured_memory` needs of one of the node's GPUs."""

    index: int
    uuid: str
    memory_mib: int


class _Reader:
    """Reads one ConfigMap for one node, naming both in every error."""

    def __init__(self, configmap: Json, node: str) -> None:
        meta = mapping(configmap.get("metadata"), "configmap", "metadata")
        self.subject = (
            f"node {node}: configmap {meta.get('namespace') or ''}/{meta.get('name') or ''}"
        )

    def error(self, key: str, value: object, problem: str, accepted: str | None = None) -> NoReturn:
        setting = key.rpartition(".")[2].split("[")[0]
        accepted = accepted or _ACCEPTED.get(setting, _DOCUMENT_ACCEPTED)
        raise CodecError(self.subject, key, value, problem, accepted)

    def settings(self, raw: object, where: str, allowed: Sequence[str]) -> Json:
        if not isinstance(raw, dict):
            self.error(where, raw, "not a mapping", f"a mapping with keys {', '.join(allowed)}")
        for key in raw:
            if key not in allowed:
                self.error(
                    f"{where}.{key}", raw[key], "unknown key",
                    f"the keys {', '.join(allowed)}",
                )  # fmt: skip
        return raw

    def config(self, raw: Json, where: str, source: str) -> NodeConfig:
        unit = raw.get("memoryUnit")
        if unit is not None and unit not in tuple(MemoryUnit):
            self.error(f"{where}.memoryUnit", unit, "unknown unit")
        serves = raw.get("serves")
        if serves is not None and serves not in tuple(Serves):
            self.error(f"{where}.serves", serves, "unknown kind")
        enforcement = raw.get("enforcement")
        if enforcement is not None and enforcement not in tuple(Enforcement):
            self.error(f"{where}.enforcement", enforcement, "unknown backend")
        required = raw.get("requireEnforcement")
        if required is not None and not isinstance(required, bool):
            self.error(f"{where}.requireEnforcement", required, "not a boolean")
        indices, uuids = self.excluded(raw.get("excludeGpus"), f"{where}.excludeGpus")
        return NodeConfig(
            memory_unit=None if unit is None else MemoryUnit(unit),
            reserved=self.reserve(raw.get("reservedMemory"), f"{where}.reservedMemory"),
            excluded_indices=indices,
            excluded_uuids=uuids,
            serves=None if serves is None else Serves(serves),
            enforcement=None if enforcement is None else Enforcement(enforcement),
            require_enforcement=required,
            sources=(source,),
        )

    def reserve(self, raw: object, key: str) -> MemoryReserve | None:
        if raw is None:
            return None
        if isinstance(raw, bool):
            self.error(key, raw, "not an amount")
        if isinstance(raw, int | float):
            if not 0 <= raw < 1:
                self.error(
                    key, raw, "a bare number is a fraction of the GPU and must be 0 to under "
                    "1 (write 2048MiB for an amount)",
                )  # fmt: skip
            return MemoryReserve(fraction=Fraction(str(raw)))
        if not isinstance(raw, str):
            self.error(key, raw, "not an amount")
        percent = _PERCENT.match(raw)
        if percent is not None:
            fraction = Fraction(percent[1]) / 100
            if fraction >= 1:
                self.error(key, raw, "100 % or more would leave nothing")
            return MemoryReserve(fraction=fraction)
        amount = _AMOUNT.match(raw)
        if amount is None:
            self.error(key, raw, "not a percentage or an amount in MiB/GiB")
        return MemoryReserve(mib=int(amount[1]) * (1024 if amount[2].startswith("G") else 1))

    def excluded(self, raw: object, key: str) -> tuple[frozenset[int], frozenset[str]]:
        if raw is None:
            return frozenset(), frozenset()
        if isinstance(raw, str):
            items: list[object] = [p.strip() for p in raw.split(",")] if raw.strip() else []
        elif isinstance(raw, list):
            items = raw
        elif is_int(raw):
            items = [raw]
        else:
            self.error(key, raw, "not a list of GPUs")
        indices: set[int] = set()
        uuids: set[str] = set()
        for item in items:
            if is_int(item) and item >= 0:
                indices.add(item)
            elif isinstance(item, str) and item.isascii() and item.isdigit():
                indices.add(int(item))
            elif isinstance(item, str) and _UUID.match(item):
                uuids.add(item)
            else:
                self.error(key, raw, f"{shown(item)} is neither a GPU index nor a GPU UUID")
        return frozenset(indices), frozenset(uuids)


def _merge(first: NodeConfig, then: NodeConfig) -> NodeConfig:
    """``first``'s keys, ``then``'s where ``first`` sets none (exclusions: ``first``'s list
    when it has one)."""
    excluded = bool(first.excluded_indices or first.excluded_uuids)
    return NodeConfig(
        memory_unit=first.memory_unit or then.memory_unit,
        reserved=first.reserved if first.reserved is not None else then.reserved,
        excluded_indices=first.excluded_indices if excluded else then.excluded_indices,
        excluded_uuids=first.excluded_uuids if excluded else then.excluded_uuids,
        serves=first.serves or then.serves,
        enforcement=first.enforcement or then.enforcement,
        require_enforcement=(
            first.require_enforcement
            if first.require_enforcement is not None
            else then.require_enforcement
        ),
        sources=first.sources + then.sources,
    )


def node_config(
    configmap: Json | None,
    node: str,
    labels: Mapping[str, str],
    *,
    load: Callable[[str], object] = json.loads,
) -> NodeConfig:
    """The configuration of node ``node`` with ``labels`` from ``configmap`` (module doc);
    ``None`` (no ConfigMap): an empty one. ``CodecError`` naming the node and the key.

    ``load`` decodes the document text, ``ValueError`` with the problem when it cannot: JSON
    by default; the device plugin passes a YAML loader (``gpushare.kube.nodeconfig``: the
    codec stays free of a YAML library)."""
    if configmap is None:
        return NodeConfig()
    reader = _Reader(configmap, node)
    data = mapping(configmap.get("data"), reader.subject, "data")
    text = data.get(NODE_CONFIG_KEY)
    if text is None:
        return NodeConfig()
    key = f"data.{NODE_CONFIG_KEY}"
    if not isinstance(text, str):
        reader.error(key, text, "not a string")
    try:
        document = load(text)
    except ValueError as error:
        reader.error(key, text, str(error))
    if document is None:
        return NodeConfig()
    document = reader.settings(document, key, ("defaults", "nodes"))
    entries = document.get("nodes") or []
    if not isinstance(entries, list):
        reader.error("nodes", entries, "not a list", "a list of entries with name or selector")
    named: list[tuple[str, Json]] = []
    selected: list[tuple[str, Json]] = []
    for i, raw in enumerate(entries):
        where = f"nodes[{i}]"
        entry = reader.settings(raw, where, ("name", "selector", *_SETTINGS))
        if ("name" in entry) == ("selector" in entry):
            reader.error(where, entry, "needs exactly one of name and selector", "name or selector")
        if "name" in entry:
            name = entry["name"]
            if not isinstance(name, str) or not name:
                reader.error(f"{where}.name", name, "not a node name")
            if name == node:
                named.append((f"{where} (name {node})", entry))
            continue
        selector = entry["selector"]
        if (
            not isinstance(selector, dict)
            or not selector
            or not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items())
        ):
            reader.error(f"{where}.selector", selector, "not a map of label to value")
        if all(labels.get(k) == v for k, v in selector.items()):
            shown = ",".join(f"{k}={v}" for k, v in selector.items())
            selected.append((f"{where} (selector {shown})", entry))
    for found, what in ((named, "name"), (selected, "selector")):
        if len(found) > 1:
            reader.error(
                f"nodes[].{what}", [source for source, _ in found],
                f"{len(found)} entries apply to the node by {what}; one at most may",
                "one entry per node name, and selectors that do not overlap",
            )  # fmt: skip
    config = NodeConfig()
    defaults = document.get("defaults")
    chain = [*named, *selected]
    if defaults is not None:
        chain.append(("defaults", reader.settings(defaults, "defaults", _SETTINGS)))
    for source, entry in chain:
        where = source.partition(" ")[0]
        config = _merge(config, reader.config(entry, where, source))
    return config


def configured_memory(
    config: NodeConfig, node: str, gpus: Sequence[GpuFacts], unit: MemoryUnit
) -> dict[int, int]:
    """Per GPU index kept for sharing, its memory in MiB once ``config.reserved`` is held back
    (excluded GPUs are absent). ``CodecError`` naming the node and the key: an excluded index
    or UUID the node does not have, or a reservation that leaves less than one ``unit``."""
    subject = f"node {node}: node config ({', '.join(config.sources) or 'none'})"
    indices = {gpu.index for gpu in gpus}
    uuids = {gpu.uuid for gpu in gpus}
    missing = sorted(map(str, config.excluded_indices - indices)) + sorted(
        config.excluded_uuids - uuids
    )
    if missing:
        have = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
        raise CodecError(
            subject, "excludeGpus", ", ".join(missing), f"the node has no such GPU; it has {have}",
            _ACCEPTED["excludeGpus"],
        )  # fmt: skip
    kept: dict[int, int] = {}
    for gpu in gpus:
        if gpu.index in config.excluded_indices or gpu.uuid in config.excluded_uuids:
            continue
        held = config.reserved.held_back_mib(gpu.memory_mib) if config.reserved else 0
        left = gpu.memory_mib - held
        if left < unit.mib:
            raise CodecError(
                subject, "reservedMemory", str(config.reserved),
                f"leaves {max(left, 0)} MiB of GPU {gpu.index}'s {gpu.memory_mib} MiB, less "
                f"than one {unit}", _ACCEPTED["reservedMemory"],
            )  # fmt: skip
        kept[gpu.index] = left
    return kept
