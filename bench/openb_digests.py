"""Digests of simulator runs on the openb traces: the check that a change moves no result.

Run: ``.venv/bin/python bench/openb_digests.py [--trace DIR] [--check]``. For each (workload,
policy) below, seed 42, one run through ``gpushare.sim.experiment.run_one`` (one process), and
the sha256 of ``repr((curves, placed, failed_by_kind, empty_frag_amount_pct))``: every binned
curve value, how many pods were placed, the failures by kind and the empty cluster's
fragmentation. ``--check`` compares against ``RECORDED`` (taken before issue 14's simulator
work, at a00401e) and exits 1 on any difference. About 1 min of one core per workload.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

from gpushare.sim.experiment import RunResult, run_one
from gpushare.sim.trace import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
WORKLOADS = ("default", "multigpu50", "gpuspec33")
POLICIES = ("fgd", "fgd-cpu", "bestfit")
SEED = 42
RECORDED: dict[tuple[str, str], str] = {
    ("default", "fgd"): "cb76e5d9fd0ab39b5c5ed462700cc88886f59fc8fe8947aadd5226e58eb2d351",
    ("default", "fgd-cpu"): "1a648afdad991f60f6911805bf815d4593d6a1a0b76e687e0e7d81e5b09a1f42",
    ("default", "bestfit"): "f2b6b9547ef369ba5d86a76502a492c439ad97675d8c1744ca44a95aa613bdf4",
    ("multigpu50", "fgd"): "dda9564b522ec22da439c157d12df14b8f092fe2ea25d13551268f0e674b76e6",
    ("multigpu50", "fgd-cpu"): "e0696662e7cf04a4fdad4cba4f14c75a7db2ca44bd444e8c15f82dce3d8c0521",
    ("multigpu50", "bestfit"): "2fc2a4e3ccff032e365dc174e3e8cf8814a650cb9ec3d487fe515340c4f3db1d",
    ("gpuspec33", "fgd"): "a9ef636ddad7238f476566f5067dc755a8f02bcb96cefa4d04b967638ead2e76",
    ("gpuspec33", "fgd-cpu"): "2d75a2d18bfd9cbfae5dfb1ee536356e6f2a5bbc4fe0623f7dde98cb412ab912",
    ("gpuspec33", "bestfit"): "01e2a47004538ae47296828f8a7fa5751b918cd900a8692b7ea223a95a507e96",
}


def digest(result: RunResult) -> str:
    """sha256 of everything a run reports but its wall time."""
    value = (result.curves, result.placed, result.failed_by_kind, result.empty_frag_amount_pct)
    return hashlib.sha256(repr(value).encode()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    parser.add_argument("--check", action="store_true", help="compare with RECORDED")
    parser.add_argument("--workload", action="append", help="only these workloads")
    args = parser.parse_args()
    moved = 0
    for workload in args.workload or WORKLOADS:
        trace = load_trace(args.trace, workload)
        for policy in POLICIES:
            started = time.perf_counter()
            value = digest(run_one(trace.nodes, trace.pods, policy, SEED))
            seconds = time.perf_counter() - started
            verdict = ""
            if args.check:
                same = RECORDED.get((workload, policy)) == value
                moved += not same
                verdict = "same" if same else "MOVED"
            print(f"{workload:12s} {policy:8s} {value} {seconds:5.1f} s {verdict}", flush=True)
    if moved:
        sys.exit(1)


if __name__ == "__main__":
    main()
