"""Synthesise the small trace shipped in ``gpushare/sim/data`` (openb CSV format).

No row of the Alibaba trace is used: the cluster and workload are drawn from the hand-written
summary numbers below, chosen to give the default openb trace's character (mostly 8-GPU nodes,
small 2/4-GPU nodes of another model, a few 1-GPU nodes; 13% CPU-only pods, 38% GPU-sharing,
48% one whole GPU, 1% multi-GPU; total GPU request just under the cluster's GPU capacity).
The draw is seeded (``random.Random(2023)``), so the output is byte-for-byte reproducible.

Usage::

    python bench/make_embedded_trace.py            # rewrite src/gpushare/sim/data/*.csv
    python bench/make_embedded_trace.py --out DIR  # write the two CSVs into DIR instead

Writes ``openb_node_list_gpu_node.csv`` (columns ``sn,cpu_milli,memory_mib,gpu,model``) and
``openb_pod_list_default.csv`` (the 11 openb pod columns) and prints a summary. Exits with status
1 if the summary numbers give a GPU request outside 95-100% of capacity.
"""

from __future__ import annotations

import argparse
import csv
import io
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

SEED = 2023
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "gpushare" / "sim" / "data"
NODE_FILE = "openb_node_list_gpu_node.csv"
POD_FILE = "openb_pod_list_default.csv"
GPU_MILLI = 1000

T = TypeVar("T")
Row = tuple[str | int, ...]


@dataclass(frozen=True)
class NodeKind:
    """``count`` nodes of ``gpus`` GPUs of ``model``, with ``cpu_milli`` and ``memory_mib``."""

    model: str
    gpus: int
    cpu_milli: int
    memory_mib: int
    count: int


# Made-up GPU models: A8 (big 8-GPU nodes), T4 (small 2/4-GPU nodes), P1 (single-GPU nodes).
NODE_MIX = (
    NodeKind("A8", 8, 96_000, 393_216, 62),
    NodeKind("T4", 2, 64_000, 262_144, 40),
    NodeKind("T4", 4, 96_000, 393_216, 10),
    NodeKind("P1", 1, 16_000, 65_536, 8),
)

POD_COUNT = 820
CPU_ONLY_SHARE = 0.13
SHARING_SHARE = 0.38
MULTI_GPU_SHARE = 0.01  # the rest ask for one whole GPU
# (value, weight) pairs
SHARING_MILLI: tuple[tuple[int, int], ...] = (
    (50, 2),
    (100, 3),
    (200, 2),
    (250, 3),
    (320, 10),
    (470, 12),
    (500, 4),
    (650, 9),
    (810, 14),
    (900, 3),
)
MULTI_GPU_COUNT = ((2, 16), (4, 15), (8, 44))
POD_CPU_MILLI: tuple[tuple[int, int], ...] = (
    (1000, 4),
    (2000, 8),
    (4000, 16),
    (6000, 14),
    (8000, 20),
    (12000, 18),
    (16000, 20),
)
MEMORY_MIB_PER_CPU = (
    4096  # MiB per whole vCPU requested (one value keeps pod shapes few, as in openb)
)
SPEC_SHARE = 0.10  # of single-GPU pods: restricted to the small model
SPECS = (("T4", 4), ("T4|P1", 1))
QOS = (("LS", 60), ("Burstable", 25), ("BE", 10), ("Guaranteed", 5))
PHASES = (("Running", 80), ("Succeeded", 10), ("Failed", 5), ("Pending", 5))
DEMAND_RANGE = (0.95, 1.00)  # accepted total GPU request / GPU capacity

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "pod_phase",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


def _pick(rng: random.Random, table: tuple[tuple[T, int], ...]) -> T:
    values = [value for value, _ in table]
    weights = [weight for _, weight in table]
    return rng.choices(values, weights=weights)[0]


def make_nodes() -> list[tuple[str, int, int, int, str]]:
    """Node rows ``(sn, cpu_milli, memory_mib, gpu, model)`` in ``NODE_MIX`` order."""
    rows: list[tuple[str, int, int, int, str]] = []
    for kind in NODE_MIX:
        for _ in range(kind.count):
            name = f"synth-node-{len(rows):04d}"
            rows.append((name, kind.cpu_milli, kind.memory_mib, kind.gpus, kind.model))
    return rows


def make_pods(rng: random.Random) -> list[Row]:
    """Pod rows in ``POD_COLUMNS`` order, kinds in exact proportions, shuffled by ``rng``."""
    cpu_only = round(POD_COUNT * CPU_ONLY_SHARE)
    sharing = round(POD_COUNT * SHARING_SHARE)
    multi = round(POD_COUNT * MULTI_GPU_SHARE)
    kinds = ["cpu"] * cpu_only + ["share"] * sharing + ["multi"] * multi
    kinds += ["whole"] * (POD_COUNT - len(kinds))
    rng.shuffle(kinds)

    rows: list[Row] = []
    created = 0
    for index, kind in enumerate(kinds):
        if kind == "cpu":
            num_gpu, gpu_milli = 0, 0
        elif kind == "share":
            num_gpu, gpu_milli = 1, _pick(rng, SHARING_MILLI)
        elif kind == "multi":
            num_gpu, gpu_milli = _pick(rng, MULTI_GPU_COUNT), GPU_MILLI
        else:
            num_gpu, gpu_milli = 1, GPU_MILLI
        spec = _pick(rng, SPECS) if num_gpu == 1 and rng.random() < SPEC_SHARE else ""
        cpu_milli = _pick(rng, POD_CPU_MILLI)
        memory_mib = cpu_milli // 1000 * MEMORY_MIB_PER_CPU
        phase = _pick(rng, PHASES)
        created += rng.randint(0, 20_000)
        deleted = created + rng.randint(600, 3_000_000)
        scheduled: str | int = "" if phase == "Pending" else created
        rows.append(
            (
                f"synth-pod-{index:04d}",
                cpu_milli,
                memory_mib,
                num_gpu,
                gpu_milli,
                spec,
                _pick(rng, QOS),
                phase,
                created,
                deleted,
                scheduled,
            )
        )
    return rows


def _csv_text(columns: tuple[str, ...], rows: list[Row]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()


def build() -> tuple[list[Row], list[Row]]:
    """Node rows and pod rows (deterministic: the pods are drawn with ``Random(SEED)``)."""
    return list(make_nodes()), make_pods(random.Random(SEED))


def render(nodes: list[Row], pods: list[Row]) -> dict[str, str]:
    """The two CSV files' text by file name."""
    return {NODE_FILE: _csv_text(NODE_COLUMNS, nodes), POD_FILE: _csv_text(POD_COLUMNS, pods)}


def _summary(nodes: list[Row], pods: list[Row]) -> str:
    gpus = sum(int(row[3]) for row in nodes)
    cpu = sum(int(row[1]) for row in nodes)
    demand = sum(int(row[3]) * int(row[4]) for row in pods) / GPU_MILLI
    pod_cpu = sum(int(row[1]) for row in pods)
    return (
        f"{len(nodes)} nodes, {gpus} GPUs, {cpu / 1000:.0f} vCPU; {len(pods)} pods request "
        f"{demand:.1f} GPUs ({demand / gpus:.1%} of capacity) and {pod_cpu / 1000:.0f} vCPU "
        f"({pod_cpu / cpu:.1%})"
    )


def main(argv: list[str] | None = None) -> int:
    """Write the CSVs into ``--out`` (default: the package data directory); 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output directory")
    args = parser.parse_args(argv)
    out: Path = args.out

    nodes, pods = build()
    gpus = sum(int(row[3]) for row in nodes)
    ratio = sum(int(row[3]) * int(row[4]) for row in pods) / GPU_MILLI / gpus
    print(_summary(nodes, pods))
    if not DEMAND_RANGE[0] <= ratio <= DEMAND_RANGE[1]:
        print(f"GPU request is {ratio:.1%} of capacity; accepted: {DEMAND_RANGE}", file=sys.stderr)
        return 1

    out.mkdir(parents=True, exist_ok=True)
    for name, text in render(nodes, pods).items():
        (out / name).write_text(text, encoding="utf-8", newline="")
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
