"""The simulator in two dimensions: openb's results do not move (recorded digests), openb's
share read as compute places identically under ``fgd`` and ``fgd-cpu``, and the synthetic
two-dimensional workload (``gpushare.sim.synthetic``).

The full check on three openb workloads is ``bench/openb_digests.py --check``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli.main import main
from gpushare.core.model import ContainerRequest, Node, PodRequest
from gpushare.sim.experiment import result_digest as digest
from gpushare.sim.experiment import run_one
from gpushare.sim.synthetic import SYNTHETIC_2D, synthetic_trace, two_dimensional_pods
from gpushare.sim.trace import (
    NODE_FILE,
    embedded_trace_dir,
    load_embedded_trace,
    load_nodes,
    load_pods,
    load_trace,
    pod_file,
)
from gpushare.sim.trace.loaders import GpuMilliAs
from gpushare.sim.workload import gpu_demand
from gpushare.testing.core import pod_request

TRACE_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
needs_trace = pytest.mark.skipif(
    not TRACE_DIR.is_dir(), reason=f"the openb trace is not at {TRACE_DIR}"
)


# Recorded at a00401e, before compute entered the simulator (seed 42).
EMBEDDED_DIGESTS = {
    "fgd": "4b9f91e63028cc1f4fffccbcc7f9eeae4917f2c835155d9f6ed14cad518cfef9",
    "fgd-cpu": "764aa9fbe3ddd82bf1e17e5e37c015f1d4dcd538461b43a16ec76b8a384a217e",
    "bestfit": "3730b244afaffe5cb200d744774db964fa9b78edb31032e01468416d034aa5fe",
}
OPENB_SLICE_DIGESTS = {  # openb default, the first 200 nodes and 1,500 pods
    "fgd": "5c6b20fadfb39a5303dd6f4b5be3eebb301d5514d868022c5520266b30bf7378",
    "fgd-cpu": "cc820c6a4295fe605688236d3ecd6fdcc874c4e626a25357a96f1b308f0ae300",
    "bestfit": "35d0713c02a6910e18da3f5558cc45a000955a615e7e1a58cc338ec7c8e15522",
}


@pytest.mark.parametrize("policy", sorted(EMBEDDED_DIGESTS))
def test_embedded_trace_results_do_not_move(policy: str) -> None:
    trace = load_embedded_trace()
    assert digest(run_one(trace.nodes, trace.pods, policy, 42)) == EMBEDDED_DIGESTS[policy]


@needs_trace
@pytest.mark.parametrize("policy", sorted(OPENB_SLICE_DIGESTS))
def test_openb_slice_results_do_not_move(policy: str) -> None:
    trace = load_trace(TRACE_DIR, "default")
    result = run_one(trace.nodes[:200], trace.pods[:1500], policy, 42)
    assert digest(result) == OPENB_SLICE_DIGESTS[policy]


def _slice(gpu_milli_as: GpuMilliAs) -> tuple[list[Node], list[PodRequest]]:
    directory = embedded_trace_dir()
    nodes = load_nodes(directory / NODE_FILE)[:40]
    pods = load_pods(pod_file(directory, "default"), gpu_milli_as)[:300]
    return nodes, pods


@pytest.mark.parametrize("policy", ["fgd", "fgd-cpu"])
def test_openb_read_as_compute_places_as_read_as_memory(policy: str) -> None:
    """openb's ``gpu_milli`` is a compute share; read as compute (memory 0) the two-dimensional
    FGD makes the same decisions, to the last bit of every curve."""
    memory = run_one(*_slice("memory"), policy, 42)
    compute = run_one(*_slice("compute"), policy, 42)
    assert digest(compute) == digest(memory)
    assert compute.placed == memory.placed > 0


def test_compute_reading_asks_compute_and_no_memory() -> None:
    _, pods = _slice("compute")
    gpu = [pod.gpu_containers[0] for pod in pods if pod.gpu_containers]
    assert gpu
    assert all(c.gpu_share == 0 and 0 < c.compute_milli <= 1000 for c in gpu)


# --- the GPU a pod takes ---------------------------------------------------------------------


@dataclass(frozen=True)
class DemandCase:
    id: str
    pod: PodRequest
    expected: int


DEMAND_CASES = [
    DemandCase("memory only: the request, as openb", pod_request((300, 1)), 300),
    DemandCase("CPU only: none", PodRequest("p", (), cpu_milli=4000), 0),
    DemandCase(
        "memory larger than compute",
        pod_request(ContainerRequest("c", 700, 1, compute_milli=200)),
        700,
    ),
    DemandCase(
        "compute larger than memory",
        pod_request(ContainerRequest("c", 200, 2, compute_milli=700)),
        1400,
    ),
    DemandCase("whole GPUs", pod_request(ContainerRequest("c", 0, 4, exclusive=True)), 4000),
]


@pytest.mark.parametrize("case", DEMAND_CASES, ids=lambda c: c.id)
def test_gpu_demand(case: DemandCase) -> None:
    assert gpu_demand(case.pod) == case.expected


# --- the synthetic two-dimensional workload --------------------------------------------------


def test_synthetic_workload_is_fixed_and_mixes_both_kinds() -> None:
    trace = synthetic_trace(embedded_trace_dir())
    assert trace.workload == SYNTHETIC_2D
    assert trace.pods == tuple(two_dimensional_pods(trace.nodes))  # drawn once, same each time
    assert len(trace.pods) == round(1.25 * 624)
    kinds: Counter[str] = Counter()
    for pod in trace.pods:
        if not pod.gpu_containers:
            kinds["cpu"] += 1
            continue
        (container,) = pod.gpu_containers
        if container.gpu_share == 1000:
            kinds["whole"] += 1
            assert container.compute_milli == 1000
        elif container.gpu_share > container.compute_milli:
            kinds["inference"] += 1
        else:
            kinds["training"] += 1
    shares = {kind: count / len(trace.pods) for kind, count in kinds.items()}
    assert shares == pytest.approx(
        {"cpu": 0.10, "inference": 0.40, "training": 0.35, "whole": 0.15}, abs=0.04
    )


def test_simulate_runs_the_synthetic_workload(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = CliRunner().invoke(
        main,
        [
            *("simulate", "--workload", SYNTHETIC_2D, "--policy", "bestfit", "--seeds", "42"),
            *("--jobs", "1", "--out", str(out)),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "no offline reference" in result.output
    written = json.loads((out / "results.json").read_text())
    assert written["workload"] == SYNTHETIC_2D
    assert "reference" not in written
    (run,) = written["runs"]
    assert run["placed"] > 0
