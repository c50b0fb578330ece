"""The node and pod list schemas: required and optional columns, integer columns and ranges."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from gpushare.sim.trace.constants import GPU_CAPACITY_MILLI, MAX_GPUS_PER_NODE, MAX_GPUS_PER_POD


@dataclass(frozen=True, slots=True)
class _IntColumn:
    name: str
    low: int
    high: int
    accepted: str


@dataclass(frozen=True, slots=True)
class _Schema:
    kind: str  # "node" / "pod", for messages
    required: tuple[str, ...]
    optional: tuple[str, ...]
    ints: tuple[_IntColumn, ...]

    def describe(self) -> str:
        text = ",".join(self.required)
        if self.optional:
            text += f" (optional: {','.join(self.optional)})"
        return text


_INT64_MAX: Final = 2**63 - 1

_NODE_SCHEMA: Final = _Schema(
    kind="node",
    required=("sn", "cpu_milli", "memory_mib", "gpu", "model"),
    optional=(),
    ints=(
        _IntColumn("cpu_milli", 0, _INT64_MAX, "a non-negative 64-bit integer (milli-CPU)"),
        _IntColumn("memory_mib", 0, _INT64_MAX, "a non-negative 64-bit integer (MiB)"),
        _IntColumn("gpu", 0, MAX_GPUS_PER_NODE, f"an integer from 0 to {MAX_GPUS_PER_NODE}"),
    ),
)

_POD_SCHEMA: Final = _Schema(
    kind="pod",
    required=("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"),
    optional=("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time", "scheduled_time"),
    ints=(
        _IntColumn("cpu_milli", 0, _INT64_MAX, "a non-negative 64-bit integer (milli-CPU)"),
        _IntColumn("memory_mib", 0, _INT64_MAX, "a non-negative 64-bit integer (MiB)"),
        _IntColumn("num_gpu", 0, MAX_GPUS_PER_POD, f"an integer from 0 to {MAX_GPUS_PER_POD}"),
        _IntColumn(
            "gpu_milli", 0, GPU_CAPACITY_MILLI, f"an integer from 0 to {GPU_CAPACITY_MILLI}"
        ),
    ),
)
