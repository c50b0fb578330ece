"""Encoding a node's GPU inventory: the ``gpushare.io/gpu-inventory`` annotation. Pure; no I/O.

The device plugin publishes it (``gpushare.kube.nodes.NodePublisher``), the test fakes build
it (``gpushare.testing.nodes``), and :func:`gpushare.kube.codec.node_info` reads it back. The
format (the package docstring, ``gpushare.testing.nodes``) is compact JSON::

    {"unit":"GiB","gpus":[{"index":0,"uuid":"GPU-...","model":"Tesla-V100-SXM2-16GB",
                           "memory":16,"healthy":true}]}

with, per GPU, how its shares are held and shown once the device plugin knows
(``gpushare.core.isolation``): ``"enforcement":"mps"|"driver"|"library"|"none"`` and
``"view":true|false`` after ``healthy`` (absent: not said, a device plugin before them); and,
when the node serves one kind of request only (``gpushare.core.serves``, the node's
configuration), ``"serves":"shared"`` or ``"serves":"whole"`` after ``gpus``. Absent (every
annotation written before it existed, and every node serving both): ``both``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass

from gpushare.core.isolation import Isolation
from gpushare.core.serves import Serves
from gpushare.kube.codec.common import MemoryUnit, is_int

__all__ = ["MAX_INVENTORY_GPUS", "InventoryGpu", "inventory_annotation"]

MAX_INVENTORY_GPUS = 1024
"""The most GPUs one inventory may list (what ``node_info`` accepts)."""


@dataclass(frozen=True, slots=True)
class InventoryGpu:
    """One GPU as the inventory annotation lists it.

    ``index``: the device index (NVML order, >= 0); ``uuid``: the NVML UUID (``GPU-...``;
    ``""`` when unknown); ``model``: the product name; ``memory``: the whole GPU in the node's
    unit (``"GiB"``/``"MiB"``), an integer > 0; ``healthy``: false for a GPU that takes no new
    allocations; ``isolation``: how its shares are held and shown (``None``: not said).
    Checked by :func:`inventory_annotation`, not at construction.
    """

    index: int
    uuid: str
    model: str
    memory: int
    healthy: bool = True
    isolation: Isolation | None = None

    def to_json(self) -> dict[str, object]:
        """The GPU's entry of the annotation: ``{"index", "uuid", "model", "memory",
        "healthy"}`` in that order, then ``"enforcement"`` and ``"view"`` when ``isolation``
        is set (unchecked)."""
        entry: dict[str, object] = {
            "index": self.index,
            "uuid": self.uuid,
            "model": self.model,
            "memory": self.memory,
            "healthy": self.healthy,
        }
        if self.isolation is not None:
            entry["enforcement"] = self.isolation.enforcement.value
            entry["view"] = self.isolation.view
        return entry


def _check(gpu: InventoryGpu) -> None:
    if not is_int(gpu.index) or gpu.index < 0:
        raise ValueError(f"GPU index must be an integer >= 0, got {gpu.index!r}")
    where = f"GPU {gpu.index}"
    if not is_int(gpu.memory) or gpu.memory <= 0:
        raise ValueError(f"{where}: memory must be an integer > 0, got {gpu.memory!r}")
    if not isinstance(gpu.uuid, str):
        raise ValueError(f"{where}: uuid must be a string, got {gpu.uuid!r}")
    if not isinstance(gpu.model, str):
        raise ValueError(f"{where}: model must be a string, got {gpu.model!r}")
    if not isinstance(gpu.healthy, bool):
        raise ValueError(f"{where}: healthy must be a boolean, got {gpu.healthy!r}")


def inventory_annotation(
    unit: MemoryUnit | str, gpus: Sequence[InventoryGpu], serves: Serves = Serves.BOTH
) -> str:
    """The ``gpushare.io/gpu-inventory`` value for ``gpus`` in ``unit``: compact JSON
    ``{"unit": unit, "gpus": [...]}``, the GPUs sorted by index, with ``"serves"`` unless
    ``serves`` is ``both`` (module doc).

    ``unit`` must be a ``MemoryUnit`` (or its value, ``"GiB"``, ``"MiB"``); indices distinct
    integers >= 0; ``memory`` an integer > 0; at most ``MAX_INVENTORY_GPUS`` GPUs; no GPUs is
    allowed (a node that publishes none). Raises ``ValueError`` naming the bad value otherwise.
    Inverse: ``node_info`` (unit, per-GPU memory, model and health, ``NodeInfo.uuids``).
    """
    try:
        unit = MemoryUnit(unit)
    except ValueError:
        raise ValueError(f"unit must be one of {', '.join(MemoryUnit)}, got {unit!r}") from None
    if len(gpus) > MAX_INVENTORY_GPUS:
        raise ValueError(f"at most {MAX_INVENTORY_GPUS} GPUs per node, got {len(gpus)}")
    for gpu in gpus:
        _check(gpu)
    indices = sorted(gpu.index for gpu in gpus)
    repeated = sorted({i for i, j in itertools.pairwise(indices) if i == j})
    if repeated:
        raise ValueError(f"GPU indices must be distinct, repeated: {repeated}")
    ordered = sorted(gpus, key=lambda gpu: gpu.index)
    document: dict[str, object] = {"unit": unit, "gpus": [gpu.to_json() for gpu in ordered]}
    if serves is not Serves.BOTH:
        document["serves"] = Serves(serves).value
    return json.dumps(document, separators=(",", ":"))
