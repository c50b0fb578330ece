"""Nodes: a Kubernetes Node → ``NodeInfo`` (the core ``Node`` with its GPUs, the unit, whether
it is a GPU-share node). Inventory format: the package docstring. Pure; no I/O."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gpushare.core.isolation import Enforcement, Isolation
from gpushare.core.model import Gpu, Node
from gpushare.core.serves import Serves
from gpushare.kube.codec.common import (
    GPU_COUNT,
    GPU_MEM,
    GPUSHARE_LABEL,
    INVENTORY,
    CodecError,
    Json,
    MemoryUnit,
    annotations_of,
    is_int,
    mapping,
    parse_json,
    shown,
    whole_quantity,
)

_UNIT_NAMES = frozenset(unit.value for unit in MemoryUnit)
MAX_GPU_UNITS = 1 << 24
"""The largest GPU an inventory may announce, in its unit (16 TiB in MiB; an H100 has 81,559
MiB): anything above is not a GPU but a forged or broken annotation."""

# -- nodes -----------------------------------------------------------------------------------

_INVENTORY_ACCEPTED = (
    '{"unit": "GiB"|"MiB", "gpus": [{"index": 0, "memory": 16, "model": "...", "uuid": "...", '
    '"healthy": true}, ...]} with distinct indices >= 0 and memory > 0'
)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """A node as the extender sees it.

    ``node`` has the GPUs the node publishes (none when it publishes none); ``gpushare`` tells
    a memory-shared node: labelled ``gpushare=true`` **and** publishing GPUs (inventory or
    capacity). An unlabelled node keeps its GPUs here so that pods already placed on it are
    still counted, but takes no new GPU-memory pods. ``unit`` is the ``MemoryUnit`` from the
    inventory, ``None`` when unknown; ``source`` is ``"inventory"``, ``"capacity"`` (Alibaba's
    fallback) or ``"none"``; ``uuids`` per GPU position (``""`` when unknown); ``labelled``:
    label ``gpushare=true``; ``serves``: the kinds of request the node serves (the inventory's
    ``serves``, ``both`` when absent); ``isolation`` per GPU position: how its shares are
    held and shown (``None``: the inventory does not say).
    """

    node: Node
    gpushare: bool
    unit: MemoryUnit | None = None
    source: str = "none"
    uuids: tuple[str, ...] = ()
    labelled: bool = False
    serves: Serves = Serves.BOTH
    mismatch: str = ""
    isolation: tuple[Isolation | None, ...] = ()

    @property
    def refusal(self) -> str:
        """Why the node takes no GPU-memory pods (``""`` when it is a GPU-share node)."""
        if self.gpushare:
            return ""
        if not self.labelled:
            return f"no label {GPUSHARE_LABEL}=true"
        return (
            f"label {GPUSHARE_LABEL}=true but no {INVENTORY} annotation and no {GPU_MEM} capacity"
        )


def _inventory(
    raw: str, subject: str
) -> tuple[MemoryUnit, list[Gpu], list[str], Serves, list[Isolation | None]]:
    def bad(problem: str) -> CodecError:
        return CodecError(subject, f"annotation {INVENTORY}", raw, problem, _INVENTORY_ACCEPTED)

    document = parse_json(raw, subject, INVENTORY, _INVENTORY_ACCEPTED)
    named = document.get("unit") if isinstance(document, dict) else None
    if not isinstance(named, str) or named not in _UNIT_NAMES:
        raise bad("unit missing or unknown")
    unit = MemoryUnit(named)
    serves = document.get("serves", Serves.BOTH.value)
    if not isinstance(serves, str) or serves not in tuple(Serves):
        raise bad('serves unknown (its values: "shared", "whole", "both"; absent: both)')
    items = document.get("gpus")
    if not isinstance(items, list) or len(items) > 1024:
        raise bad("no gpus list of at most 1024 GPUs")
    gpus: list[tuple[Gpu, str, Isolation | None]] = []
    for item in items:
        if not isinstance(item, dict):
            raise bad("a GPU entry is not an object")
        index, memory = item.get("index"), item.get("memory")
        model, uuid, healthy = (
            item.get("model", ""),
            item.get("uuid", ""),
            item.get("healthy", True),
        )
        if not (is_int(index) and index >= 0 and is_int(memory) and 0 < memory <= MAX_GPU_UNITS):
            raise bad(
                f"GPU {shown(index)}: index must be an integer >= 0 and memory 1.."
                f"{MAX_GPU_UNITS:,} (units of the inventory)"
            )
        if not (isinstance(model, str) and isinstance(uuid, str) and isinstance(healthy, bool)):
            raise bad(f"GPU {index}: model and uuid must be strings, healthy a boolean")
        gpus.append((Gpu(index, model, memory, healthy), uuid, _isolation(item, index, bad)))
    indices = [gpu.index for gpu, _, _ in gpus]
    if len(set(indices)) != len(indices):
        raise bad(f"GPU indices repeat: {indices}")
    gpus.sort(key=lambda entry: entry[0].index)
    return (
        unit,
        [gpu for gpu, _, _ in gpus],
        [uuid for _, uuid, _ in gpus],
        Serves(serves),
        [isolation for _, _, isolation in gpus],
    )


def _isolation(item: Json, index: int, bad: Callable[[str], CodecError]) -> Isolation | None:
    """A GPU entry's ``enforcement`` and ``view`` (both or neither)."""
    enforcement, view = item.get("enforcement"), item.get("view")
    if enforcement is None and view is None:
        return None
    if enforcement not in tuple(Enforcement) or not isinstance(view, bool):
        raise bad(
            f"GPU {index}: enforcement must be mps, driver, library or none and view a boolean "
            "(both or neither)"
        )
    return Isolation(Enforcement(enforcement), view)


def _mismatch(obj: Json, subject: str, announced: int, unit: MemoryUnit) -> str:
    """Why the inventory's ``announced`` units and ``status.capacity`` disagree, or ``""``."""
    status = obj.get("status")
    capacity = status.get("capacity") if isinstance(status, dict) else None
    raw = capacity.get(GPU_MEM) if isinstance(capacity, dict) else None
    if raw is None:
        return ""
    try:
        counted = whole_quantity(raw, subject, f"status.capacity.{GPU_MEM}")
    except CodecError as error:
        return str(error)
    if counted == announced:
        return ""
    return (
        f"{subject}: annotation {INVENTORY} announces {announced:,} {unit} of GPU memory and "
        f"status.capacity {GPU_MEM} counts {counted:,}: kube-scheduler counts the capacity, "
        "gpushare places on the inventory's GPUs (the device plugin publishes both; they "
        "differ for a moment while it re-registers)"
    )


def node_info(obj: Json) -> NodeInfo:
    """Read a Kubernetes Node (module doc). Raises ``CodecError`` on garbage."""
    meta = mapping(mapping(obj, "node", "(the node)").get("metadata"), "node", "metadata")
    name = meta.get("name")
    if not isinstance(name, str) or not name:
        raise CodecError("node", "metadata.name", name, "missing or not a string", "a node name")
    subject = f"node {name}"
    labels = mapping(meta.get("labels"), subject, "metadata.labels")
    labelled = labels.get(GPUSHARE_LABEL) == "true"
    annotations = annotations_of(obj, subject)
    if INVENTORY in annotations:
        unit, gpus, uuids, serves, isolation = _inventory(annotations[INVENTORY], subject)
        return NodeInfo(
            Node(name, tuple(gpus)), labelled, unit, "inventory", tuple(uuids), labelled, serves,
            _mismatch(obj, subject, sum(g.capacity for g in gpus), unit), tuple(isolation),
        )  # fmt: skip
    status = mapping(obj.get("status"), subject, "status")
    capacity = mapping(status.get("capacity"), subject, "status.capacity")
    total = whole_quantity(capacity.get(GPU_MEM, "0"), subject, f"status.capacity.{GPU_MEM}")
    count = whole_quantity(capacity.get(GPU_COUNT, "0"), subject, f"status.capacity.{GPU_COUNT}")
    if total == 0:
        return NodeInfo(Node(name, ()), False, labelled=labelled)
    if count > 1024 or (count and total < count):
        raise CodecError(
            subject, f"status.capacity.{GPU_COUNT}", count, f"for {GPU_MEM} {total}",
            f"1..1024 GPUs and at least one {GPU_MEM} unit per GPU",
        )  # fmt: skip
    share = total // count if count else 0
    fallback = tuple(Gpu(i, "", share) for i in range(count))
    return NodeInfo(Node(name, fallback), labelled, None, "capacity", ("",) * count, labelled)
