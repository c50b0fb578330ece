"""What the share view library (``libgpushare-share.so``) costs per intercepted call.

Run: ``make bench-share-view`` (or ``.venv/bin/python bench/share_view.py [--calls 200000]
[--runs 3] [--json FILE]``). Needs ``cc`` and ``scripts/build-native.sh``; no GPU: the calls go
to the stub drivers of ``tests/native`` (``gpushare.testing.native``).

Set-up: one stub GPU of 16 GiB; the reader (``read_share --bench``) resolves each entry point
with ``dlsym`` as a CUDA runtime would, then times ``--calls`` calls each of
``cuMemGetInfo_v2``, a 1 MiB ``cuMemAlloc_v2`` + ``cuMemFree_v2`` pair (device 0's context
current) and ``nvmlDeviceGetMemoryInfo``. Four set-ups, ``--runs`` processes each, the median
taken:

* **stubs alone**: no ``LD_PRELOAD`` (the floor);
* **listed, enforced**: the library with a 4 GiB share of the GPU, ``GPUSHARE_SHARE_ENFORCE=1``,
  a state file in a temporary directory (what a shared pod runs with);
* **listed, view only**: the same without enforcement;
* **not listed**: the library with a share of another GPU only (a pass-through);
* **listed, 7 others**: as "listed, enforced" while seven other processes of the container hold
  1 MiB each in the same state file (what each call pays per live process of the container).

Prints ns/call per set-up and call, the ratio and the difference against the stubs alone, and
the load averages at start and end. The stubs answer in tens of ns where a real driver takes
microseconds, so the difference in ns, not the ratio, is what a program on a GPU pays.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path

from gpushare.testing.native import (
    AllocPlan,
    NativeTools,
    StubGpu,
    build_share_library,
    build_tools,
    holding_reader,
    read_share,
    share_env,
    stub_env,
    stub_uuid,
)

GPU = StubGpu(stub_uuid(0), 16384)
CALLS = ("mem_get_info_ns", "alloc_free_ns", "nvml_memory_info_ns")
LABELS = {
    "mem_get_info_ns": "cuMemGetInfo_v2",
    "alloc_free_ns": "cuMemAlloc_v2 + cuMemFree_v2",
    "nvml_memory_info_ns": "nvmlDeviceGetMemoryInfo",
}


def setups(state: Path) -> dict[str, tuple[bool, dict[str, str], int]]:
    """Set-up name -> (preload the library, the library's variables, other processes holding
    memory in the state file meanwhile)."""
    listed = {GPU.uuid: 4096}
    enforced = share_env(listed, enforce=True, state=state)
    return {
        "stubs alone": (False, {}, 0),
        "listed, enforced": (True, enforced, 0),
        "listed, view only": (True, share_env(listed, state=state), 0),
        "not listed": (True, share_env({stub_uuid(1): 4096}, enforce=True, state=state), 0),
        "listed, 7 others": (True, enforced, 7),
    }


def measure(
    tools: NativeTools,
    library: Path | None,
    env: Mapping[str, str],
    *,
    others: int,
    calls: int,
    runs: int,
) -> dict[str, float]:
    """Median over ``runs`` reader processes of each call's ns/call, ``library`` preloaded
    unless None, while ``others`` processes hold 1 MiB each."""
    samples: dict[str, list[float]] = {name: [] for name in CALLS}
    full = {**stub_env((GPU,)), **env}
    with ExitStack() as holders:
        for _ in range(others):
            plan = AllocPlan(1, max_count=1)
            holders.enter_context(holding_reader(tools, full, library=library, alloc=plan))
        for _ in range(runs):
            reading = read_share(tools, full, library=library, bench_calls=calls, timeout_s=600)
            if reading.bench is None or reading.stderr:
                raise SystemExit(f"no benchmark, or a line on stderr: {reading.stderr}")
            for name in CALLS:
                samples[name].append(getattr(reading.bench, name))
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200_000, help="calls per process and kind")
    parser.add_argument("--runs", type=int, default=3, help="processes per set-up (median)")
    parser.add_argument("--json", type=Path, help="write the numbers here")
    args = parser.parse_args()
    print(f"load averages at start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-share-") as scratch:
        root = Path(scratch)
        tools = build_tools(root / "tools")
        library = build_share_library(root / "library")
        results = {
            name: measure(
                tools,
                library if preload else None,
                env,
                others=others,
                calls=args.calls,
                runs=args.runs,
            )
            for name, (preload, env, others) in setups(root / "usage").items()
        }
    floor = results["stubs alone"]
    print(f"{args.calls:,} calls per process, median of {args.runs} processes, ns/call:")
    print(f"{'set-up':<20} " + " ".join(f"{LABELS[c]:>30}" for c in CALLS))
    for name, values in results.items():
        cells = [
            f"{values[c]:8.1f} (x{values[c] / floor[c]:5.2f}, {values[c] - floor[c]:+8.1f})"
            for c in CALLS
        ]
        print(f"{name:<20} " + " ".join(f"{cell:>30}" for cell in cells))
    print("(ratio and difference in ns against the stubs alone)")
    print(f"load averages at end: {os.getloadavg()}", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"calls": args.calls, "runs": args.runs, **results}))


if __name__ == "__main__":
    main()
