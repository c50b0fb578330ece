"""Digests of simulator runs on the openb traces: the check that a change moves no result.

Run: ``.venv/bin/python bench/openb_digests.py [--trace DIR] [--check]``. For each (workload,
policy) below, seed 42, one run through ``gpushare.sim.experiment.run_one`` (one process), and
``result_digest`` (``gpushare.sim.experiment``): the sha256 of ``repr((curves, placed,
failed_by_kind, empty_frag_amount_pct))`` followed by the bytes of the three curve arrays
(numpy's repr rounds to 8 digits; the bytes do not): every binned curve value bit for bit,
how many pods were placed, the failures by kind and the empty cluster's fragmentation.
``--check`` compares against ``RECORDED`` (taken before the simulator went two-dimensional,
docs/compute.md, at a00401e) and exits 1 on any difference. About 1 min of one core per
workload on an idle machine. The fast version of this check is
``tests/test_sim_two_dimensional.py`` (the embedded trace and a slice of openb default).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from gpushare.sim.experiment import result_digest, run_one
from gpushare.sim.trace import load_trace

DEFAULT_TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"
WORKLOADS = ("default", "multigpu50", "gpuspec33")
POLICIES = ("fgd", "fgd-cpu", "bestfit")
SEED = 42
RECORDED: dict[tuple[str, str], str] = {
    ("default", "fgd"): "c26c00472be94de407e668527ef4b572b2f903328fe801c2a85bfdc53ec4fc77",
    ("default", "fgd-cpu"): "acc9bc9b3a19c1457f1f0ac7d56fa1e54efa57cb7a9e7f76a135dce26a93682d",
    ("default", "bestfit"): "6b97c64f98e3203e4eeec181eda7529c5f1591e04ea93116d9f85578ec7a2562",
    ("multigpu50", "fgd"): "920780e360da703dfb97304ef2c5549c0ebdc32ce60fa572cb7568605cde5992",
    ("multigpu50", "fgd-cpu"): "13b5ae4db4f36fa1b990f939d9408b98362ccc6a810b172f4f769999299aa80b",
    ("multigpu50", "bestfit"): "13da347b8e80516c00ca200369c199cf02453b0140b15714c0c644e94db99993",
    ("gpuspec33", "fgd"): "997b9f943dc1d031101d7328f2589fdee0c189b70464e94d0c9ec7e1da5e5eb0",
    ("gpuspec33", "fgd-cpu"): "ec102b6bc53468537f0a352782f37c105a37c604aff062f5cf50737e3651c6e7",
    ("gpuspec33", "bestfit"): "153296ff3299c2c0c9b035c2327abb20a52ed3cb0df79785ac1d0cec23bc70f8",
}


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
            value = result_digest(run_one(trace.nodes, trace.pods, policy, SEED))
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
