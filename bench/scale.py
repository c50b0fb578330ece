"""The extender's memory and cold start at scale (docs/extender.md, "5,000 nodes"): RSS and
its growth per 10,000 pods, and the time from start to ``/readyz`` with every node and pod in
the API server.

Run: ``make bench-scale`` (or ``.venv/bin/python bench/scale.py [--nodes 5000] [--pods 50000]
[--step 10000] [--cold-starts 3] [--concurrency 32] [--profile out/cold.raw]``). Needs the
test control plane (``make controlplane``); ``--profile``, py-spy (``pip install -e '.[bench]'``).

Set-up: a real control plane (etcd, kube-apiserver; its kube-scheduler and kwok idle) and
``--nodes`` GPU-share Nodes with eight 16 GiB GPUs each, created directly in the API server.
They are plain Node objects with the ``gpushare.io/gpu-inventory`` annotation and the capacity
(``gpushare.testing.nodes.gpu_node``) that kwok is told not to manage: the extender reads only
those, and 5,000 kwok heartbeats and 50,000 pod status updates would load the 2-core machine
with work the extender never sees. Pods are created already bound, carrying the allocation
annotations the extender writes at bind and Alibaba's ``ALIYUN_COM_GPU_MEM_ASSIGNED`` (started by
the device plugin), from ``gpushare.testing.pods.bound_gpu_pod``: 1 or 2 GiB each, round-robin
over the nodes and their GPUs (10 a node at 50,000 on 5,000 nodes).

Measured on the real ``gpushare extender --kubeconfig`` process (``/proc/<pid>/status``:
``VmRSS`` now, ``VmHWM`` its peak):

1. **Growth.** One extender started with the nodes only (its cold start and RSS: the base line),
   then ``--step`` pods at a time created through the API server while it watches; after each
   step, once ``/inspect/<node>`` shows the step's last pod (the watch delivers in order, so
   every earlier pod is in the ledger), its RSS. Prints MiB per 10,000 pods (least squares over
   the steps). Pod creation rate and the API server's and etcd's CPU seconds per step are
   printed too: they are what limits the size of the run on a small machine.
2. **Cold start.** ``--cold-starts`` fresh extender processes with every pod in the API server:
   the seconds from ``exec`` to the first 200 from ``/readyz`` (interpreter start, imports, list
   of nodes and pods in pages of 500, the ledger rebuilt from them), the RSS then and the peak.
   Median and each run; the ratio to the base line of step 1 (same run, no pods).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from lightkube import AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node

from gpushare.kube.client import connect
from gpushare.kube.codec import ALIYUN_ASSIGNED, MemoryUnit, node_info
from gpushare.testing.controlplane import (
    KWOK_NODE_ANNOTATION,
    Binaries,
    ControlPlane,
    ManagedProcess,
    free_ports,
)
from gpushare.testing.live_extender import http_get
from gpushare.testing.nodes import gpu_node
from gpushare.testing.pods import bound_gpu_pod

GPUS_PER_NODE = 8
GPU_GIB = 16
NAMESPACE = "scale"
MIB = 1024 * 1024


def proc_status_kib(pid: int, field: str) -> int:
    """``field`` (``VmRSS``, ``VmHWM``) of ``/proc/<pid>/status``, in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise KeyError(f"{field} not in /proc/{pid}/status")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` so far (``/proc/<pid>/stat`` fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # clock ticks (USER_HZ = 100)


def node_objects(count: int) -> list[Node]:
    """``count`` GPU-share Nodes ``scale-0000``... that kwok leaves alone (its selector asks
    the annotation to be ``fake``)."""
    return [
        gpu_node(
            f"scale-{i:04d}",
            [GPU_GIB] * GPUS_PER_NODE,
            unit=MemoryUnit.GIB,
            annotations={KWOK_NODE_ANNOTATION: "not-kwok"},
        )
        for i in range(count)
    ]


async def create_all(kube: AsyncClient, objects: Sequence[object], concurrency: int) -> float:
    """Create ``objects`` with ``concurrency`` requests in flight; the seconds it took."""
    started = time.monotonic()
    queue = list(reversed(objects))

    async def worker() -> None:
        while queue:
            await kube.create(queue.pop())  # type: ignore[call-overload]

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.monotonic() - started


class Extender:
    """One ``gpushare extender --kubeconfig`` process, timed from ``exec`` to ``/readyz``."""

    def __init__(self, kubeconfig: Path, workdir: Path, profile: Path | None = None) -> None:
        (self.port,) = free_ports(1)
        self.profile = profile
        self.profiler: subprocess.Popen[bytes] | None = None
        argv = [sys.executable, "-c", "from gpushare.cli.main import main; main()", "extender"]
        argv += ["--kubeconfig", str(kubeconfig), "--host", "127.0.0.1"]
        argv += ["--port", str(self.port), "--log-level", "warning"]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = ManagedProcess("gpushare-extender", argv, workdir)

    def start(self, timeout_s: float = 900.0) -> float:
        """Start it; the seconds until ``/readyz`` first answers 200."""
        started = time.monotonic()
        self.process.start()
        if self.profile is not None:  # py-spy attached from the start; it writes when we exit
            spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(self.pid)]
            spy += ["--format", "raw", "--rate", "200", "--output", str(self.profile)]
            self.profiler = subprocess.Popen(spy, stdout=subprocess.DEVNULL)
        while http_get(f"{self.url}/readyz", 5.0)[0] != 200:
            self.process.check_running()
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"extender not ready after {timeout_s:g} s")
            time.sleep(0.05)
        return time.monotonic() - started

    def stop(self) -> None:
        """Stop it (SIGTERM), and wait for py-spy to write its profile."""
        self.process.stop()
        if self.profiler is not None:
            self.profiler.wait(60)

    @property
    def pid(self) -> int:
        assert self.process.pid is not None
        return self.process.pid

    def rss_mib(self) -> tuple[float, float]:
        """(VmRSS, VmHWM) in MiB."""
        return (
            proc_status_kib(self.pid, "VmRSS") / 1024,
            proc_status_kib(self.pid, "VmHWM") / 1024,
        )

    def holds(self, node: str, pod: str, timeout_s: float = 600.0) -> float:
        """Wait until ``/inspect/<node>`` lists ``pod``; the seconds waited."""
        started = time.monotonic()
        while True:
            status, body = http_get(f"{self.url}/gpushare-scheduler/inspect/{node}", 10.0)
            if status == 200 and any(p["name"] == pod for d in body["devs"] for p in d["pods"]):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise TimeoutError(f"the extender did not see pod {pod} on {node}")
            time.sleep(0.1)


def slope_per(xs: Sequence[float], ys: Sequence[float], per: float) -> float:
    """Least-squares slope of ``ys`` over ``xs``, times ``per``."""
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    num = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True))
    den = sum((x - mean_x) ** 2 for x in xs)
    return num / den * per if den else 0.0


def run(args: argparse.Namespace, log: Callable[[str], None]) -> None:
    with ControlPlane(Binaries.locate()) as plane, tempfile.TemporaryDirectory() as workdir:
        apiserver = plane.processes["kube-apiserver"].pid
        etcd = plane.processes["etcd"].pid
        assert apiserver is not None
        assert etcd is not None
        nodes = node_objects(args.nodes)
        cores = [node_info(n.to_dict()).node for n in nodes]

        async def create_nodes_and_namespace() -> float:
            kube = connect(plane.kubeconfig, timeout_s=120.0)
            await kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
            took = await create_all(kube, nodes, args.concurrency)
            await kube.close()
            return took

        took = asyncio.run(create_nodes_and_namespace())
        log(f"{args.nodes} nodes created in {took:.1f} s ({args.nodes / took:.0f}/s)")

        extender = Extender(plane.kubeconfig, Path(workdir))
        base_ready_s = extender.start()
        base_rss, base_hwm = extender.rss_mib()
        log(
            f"extender, nodes only: ready after {base_ready_s:.2f} s, RSS {base_rss:.0f} MiB "
            f"(peak {base_hwm:.0f})"
        )
        counts, rsss = [0], [base_rss]
        created = 0
        while created < args.pods:
            count = min(args.step, args.pods - created)
            now_ns = time.time_ns()
            pods = []
            for i in range(created, created + count):
                node = cores[i % args.nodes]
                lap = i // args.nodes
                pod = bound_gpu_pod(
                    NAMESPACE,
                    f"pod-{i}",
                    node,
                    [("main", (lap % GPUS_PER_NODE,), 1 + lap % 2)],
                    assume_ns=now_ns,
                )
                assert pod.metadata is not None
                assert pod.metadata.annotations is not None
                pod.metadata.annotations[ALIYUN_ASSIGNED] = "true"
                pods.append(pod)
            cpu_before = cpu_s(apiserver), cpu_s(etcd)

            async def create_step(batch: Sequence[object] = pods) -> float:
                kube = connect(plane.kubeconfig, timeout_s=120.0)
                took = await create_all(kube, batch, args.concurrency)
                await kube.close()
                return took

            took = asyncio.run(create_step())
            cpu_api, cpu_etcd = cpu_s(apiserver) - cpu_before[0], cpu_s(etcd) - cpu_before[1]
            last = created + count - 1
            lag = extender.holds(cores[last % args.nodes].name, f"pod-{last}")
            created += count
            time.sleep(1.0)
            rss, hwm = extender.rss_mib()
            counts.append(created)
            rsss.append(rss)
            log(
                f"{created:6d} pods: created {count} in {took:.1f} s ({count / took:.0f}/s; "
                f"kube-apiserver {cpu_api:.0f} CPU s, etcd {cpu_etcd:.0f} CPU s); extender "
                f"caught up {lag:.1f} s later, RSS {rss:.0f} MiB (peak {hwm:.0f}); "
                f"kube-apiserver RSS {proc_status_kib(apiserver, 'VmRSS') / 1024:.0f} MiB, "
                f"etcd {proc_status_kib(etcd, 'VmRSS') / 1024:.0f} MiB"
            )
        extender.process.stop()
        growth = slope_per(counts, rsss, 10_000)
        log(
            f"RSS growth: {growth:.1f} MiB per 10,000 pods (least squares over {len(counts)} "
            f"points); {rsss[-1] - rsss[0]:.0f} MiB for {created} pods"
        )

        readies, cold_rss, cold_hwm = [], [], []
        for run_index in range(args.cold_starts):
            cold = Extender(plane.kubeconfig, Path(workdir))
            api_before = cpu_s(apiserver)
            ready_s = cold.start()
            rss, hwm = cold.rss_mib()
            own_cpu_s, api_cpu_s = cpu_s(cold.pid), cpu_s(apiserver) - api_before
            cold.stop()
            readies.append(ready_s)
            cold_rss.append(rss)
            cold_hwm.append(hwm)
            log(
                f"cold start {run_index + 1}/{args.cold_starts} with {args.nodes} nodes and "
                f"{created} pods: ready after {ready_s:.2f} s, RSS {rss:.0f} MiB (peak {hwm:.0f}); "
                f"CPU: the extender {own_cpu_s:.1f} s, kube-apiserver {api_cpu_s:.1f} s"
            )
        if args.profile is not None:
            profiled = Extender(plane.kubeconfig, Path(workdir), args.profile)
            ready_s = profiled.start()
            profiled.stop()
            log(f"cold start under py-spy: ready after {ready_s:.2f} s; profile {args.profile}")
        median = statistics.median(readies)
        log(
            f"cold start: median {median:.2f} s (runs {', '.join(f'{r:.2f}' for r in readies)})"
            f", {median / base_ready_s:.1f}x the nodes-only start ({base_ready_s:.2f} s); RSS at "
            f"ready median {statistics.median(cold_rss):.0f} MiB, peak median "
            f"{statistics.median(cold_hwm):.0f} MiB"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=50000)
    parser.add_argument("--step", type=int, default=10000)
    parser.add_argument("--cold-starts", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--profile",
        type=Path,
        help="also one cold start under py-spy (make bench-scale installs it), raw stacks here",
    )
    args = parser.parse_args()
    started = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {line}", flush=True)

    log(f"starting the test control plane; {args.nodes} nodes x {GPUS_PER_NODE} x {GPU_GIB} GiB")
    run(args, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
