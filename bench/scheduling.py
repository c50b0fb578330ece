"""Scheduling throughput through kube-scheduler with the extender (docs/design.md, "Budgets": at
least 0.8× the same scheduler on pods without GPU memory).

Run: ``make bench-scheduling`` (or ``.venv/bin/python bench/scheduling.py [--nodes 1000]
[--pods 1000] [--rounds 2] [--budget 0.8]``). Needs the test control plane (``make
controlplane``). ``make bench-scale`` runs it at 5,000 nodes against the 0.9× budget of
docs/extender.md, "5,000 nodes".

Set-up: a real control plane, ``--nodes`` kwok nodes with eight 16 GiB GPUs each, and
``gpushare extender --kubeconfig`` as its own process (default options: binpack, the handshake
rule on). One kube-scheduler configured with the extender (``nodeCacheCapable``, filter, prioritize,
bind for ``aliyun.com/gpu-mem``), exactly as deployed: pods that ask no GPU memory never reach
the extender, so the same scheduler is its own baseline.

Each round creates ``--pods`` pods first, with the scheduler stopped, then starts it and times
the first to the last binding (``spec.nodeName`` set), so pod creation and scheduler start-up
are not counted: (1) pods without GPU memory (100m CPU), (2) pods asking 2 GiB of
``aliyun.com/gpu-mem`` each (bound by the extender), and with ``--dra`` (3) pods each with a
ResourceClaim asking 2 GiB of one GPU as consumable capacity (docs/dra.md; every node then also
publishes gpushare's ResourceSlice of its eight GPUs; kube-scheduler allocates the claims itself,
the extender is not asked: it manages ``aliyun.com/gpu-mem`` only). Reports pods/s per round, the
medians and the ratios gpu/plain (and claim/plain, claim/gpu), and the extender's own mean time
per filter, prioritize and bind request (its ``/metrics``). ``--dra-scoring`` starts the
extender with ``--dra-scoring`` and times plain pods (and with ``--dra`` claim pods) again with
the second scheduler extender entry that scores claim pods (``dra/prioritize``, without
``managedResources``: kube-scheduler calls it for every pod), so the cost of that call on pods
that ask no GPU is measured against the same scheduler without it. Prints progress.
``--profile out/sched.txt`` samples the extender with py-spy (non-blocking, so it does not pause the
process it measures; the ``bench`` extra) through the rounds and writes collapsed stacks there.
kube-scheduler binds pods without GPU memory itself, through its client's rate limit (50/s, burst
100, by default), while the extender binds GPU pods with its own client: ``--scheduler-qps 500``
lifts that limit for both kinds, to compare the scheduling cycles alone.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import Container, PodSpec, ResourceRequirements
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.resource_v1 import ResourceClaim
from prometheus_client.parser import text_string_to_metric_families

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import MEMORY, device_class, resource_slice
from gpushare.dra.templates import DEVICE_CLASS
from gpushare.kube.codec import GPU_MEM, MemoryUnit
from gpushare.testing.controlplane import (
    Binaries,
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_dra_extender,
    gpushare_extender,
    wait_until,
)
from gpushare.testing.live_extender import http_get
from gpushare.testing.nodes import create_nodes, gpu_node

SCHEDULER = "gpushare-bench"
CLAIM = -1
"""The ``gpu_mem`` of a round of claim pods (``--dra``)."""


def publish_slices(kube: Client, names: list[str]) -> None:
    """gpushare's ResourceSlice for each node in ``names`` (eight 16 GiB GPUs) and the
    DeviceClass: a test publisher standing in for one ``gpushare dra-driver`` per node."""
    with contextlib.suppress(ApiError):  # 409: made by an earlier run of this plane
        kube.create(from_dict(device_class(DEVICE_CLASS)))
    for name in names:
        gpus = [PhysicalGpu(i, f"GPU-{name}-{i}", i, "Tesla-V100", 16384) for i in range(8)]
        kube.create(from_dict(resource_slice(name, gpus, unit=MemoryUnit.GIB, generation=1)))


def claim_pods(kube: Client, namespace: str, count: int) -> None:
    """``count`` pods, each with its ResourceClaim asking 2Gi of one GPU."""
    for i in range(count):
        kube.create(from_dict({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": f"p{i}", "namespace": namespace},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DEVICE_CLASS,
                "capacity": {"requests": {MEMORY: "2Gi"}}}}]}},
        }))  # fmt: skip
        kube.create(from_dict({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{i}", "namespace": namespace},
            "spec": {
                "schedulerName": SCHEDULER,
                "containers": [{
                    "name": "main", "image": "registry.invalid/gpushare/bench:0",
                    "resources": {"limits": {"cpu": "100m", "memory": "64Mi"},
                                  "claims": [{"name": "gpu"}]},
                }],
                "resourceClaims": [{"name": "gpu", "resourceClaimName": f"p{i}"}],
            },
        }))  # fmt: skip


def pods(namespace: str, count: int, gpu_mem: int | None) -> Iterator[Pod]:
    limits = {"cpu": "100m", "memory": "64Mi"}
    if gpu_mem is not None:
        limits[GPU_MEM] = str(gpu_mem)
    for i in range(count):
        yield Pod(
            metadata=ObjectMeta(name=f"p{i}", namespace=namespace),
            spec=PodSpec(
                schedulerName=SCHEDULER,
                containers=[
                    Container(
                        name="main",
                        image="registry.invalid/gpushare/bench:0",
                        resources=ResourceRequirements(limits=limits, requests=limits),
                    )
                ],
            ),
        )


def bound_times(kube: Client, namespace: str, count: int, timeout_s: float) -> list[float]:
    """Poll until ``count`` pods of ``namespace`` are bound; the time each was first seen bound
    (monotonic seconds, 0.2 s resolution)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(seen) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(seen)}/{count} pods bound after {timeout_s:g} s")
        now = time.monotonic()
        for pod in kube.list(Pod, namespace=namespace):
            name = pod.metadata.name if pod.metadata else None
            if name and name not in seen and pod.spec is not None and pod.spec.nodeName:
                seen[name] = now
        time.sleep(0.2)
    return sorted(seen.values())


def one_round(
    plane: ControlPlane,
    kube: Client,
    url_prefix: str,
    what: tuple[int, int | None],
    tag: str,
    *,
    qps: float | None = None,
    scored: bool = False,
) -> float:
    """Create ``what`` = (count, GiB or None) pods, start the scheduler (``scored``: with the
    extender's second entry for claim pods, ``dra/prioritize``, which kube-scheduler calls for
    every pod), return pods/s from the first to the last binding."""
    count, gpu_mem = what
    namespace = f"bench-{tag}-{time.time_ns()}"
    kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
    if gpu_mem == CLAIM:
        claim_pods(kube, namespace, count)
    else:
        for pod in pods(namespace, count, gpu_mem):
            kube.create(pod)
    client: dict[str, Any] = {"kubeconfig": str(plane.kubeconfig)}
    if qps is not None:  # kube-scheduler's own client limit (default 50/s, burst 100)
        client.update(qps=qps, burst=int(2 * qps))
    with plane.scheduler(
        f"kube-scheduler-{tag}",
        profiles=[{"schedulerName": SCHEDULER}],
        extenders=[gpushare_extender(url_prefix)]
        + ([gpushare_dra_extender(url_prefix)] if scored else []),
        clientConnection=client,
    ):
        times = bound_times(kube, namespace, count, timeout_s=600)
    rate = (count - 1) / max(times[-1] - times[0], 1e-9)
    for pod in kube.list(Pod, namespace=namespace):  # free the nodes for the next round
        if pod.metadata is not None and pod.metadata.name:
            kube.delete(Pod, pod.metadata.name, namespace=namespace, grace_period=0)
    if gpu_mem == CLAIM:  # a claim's allocation is in its status: deleting it frees the GPU
        kube.deletecollection(ResourceClaim, namespace=namespace)
    return rate


def measure(
    plane: ControlPlane,
    kube: Client,
    url_prefix: str,
    count: int,
    rounds: int,
    *,
    qps: float | None = None,
    dra: bool = False,
    scored: bool = False,
) -> dict[str, list[float]]:
    """pods/s per round, for pods without GPU memory ("plain"), with 2 GiB ("gpu") and, with
    ``dra``, with a claim of 2 GiB ("claim"); with ``scored``, plain and claim pods again with
    the extender's ``dra/prioritize`` entry ("plain+dra", "claim+dra")."""
    kinds: list[tuple[str, int | None, bool]] = [("plain", None, False), ("gpu", 2, False)]
    if dra:
        kinds.append(("claim", CLAIM, False))
    if scored:
        kinds.append(("plain+dra", None, True))
        if dra:
            kinds.append(("claim+dra", CLAIM, True))
    rates: dict[str, list[float]] = {tag: [] for tag, _, _ in kinds}
    for r in range(rounds):
        for tag, gpu_mem, with_dra in kinds:
            rate = one_round(
                plane, kube, url_prefix, (count, gpu_mem), tag.replace("+", "-"), qps=qps,
                scored=with_dra,
            )  # fmt: skip
            rates[tag].append(rate)
            print(f"round {r + 1}/{rounds} {tag:<9} {rate:7.1f} pods/s", flush=True)
    return rates


def request_means_ms(url: str) -> dict[str, float]:
    """The extender's mean handling time per request, by verb, in ms (``/metrics``:
    ``gpushare_extender_request_duration_seconds`` sum / count)."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback
    with opener.open(f"{url}/metrics", timeout=30) as response:
        body: bytes = response.read()
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name != "gpushare_extender_request_duration_seconds":
            continue
        for sample in family.samples:
            verb = sample.labels.get("verb", "")
            if sample.name.endswith("_sum"):
                sums[verb] = sample.value
            elif sample.name.endswith("_count"):
                counts[verb] = sample.value
    return {verb: 1000 * sums[verb] / counts[verb] for verb in sums if counts.get(verb)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget", type=float, default=0.8, help="least ratio gpu/plain")
    parser.add_argument("--profile", type=Path, help="py-spy collapsed stacks of the extender")
    parser.add_argument(
        "--dra", action="store_true", help="also time pods with ResourceClaims (docs/dra.md)"
    )
    parser.add_argument(
        "--dra-scoring",
        action="store_true",
        help="also time plain (and with --dra, claim) pods with the extender scoring claim pods "
        "(--dra-scoring, a second scheduler extender called for every pod)",
    )
    parser.add_argument(
        "--scheduler-qps",
        type=float,
        help="kube-scheduler's client QPS (burst twice it); default its own, 50 (burst 100), "
        "which is what bounds the pods without GPU memory: kube-scheduler binds them itself",
    )
    args = parser.parse_args()
    print(f"load averages at start: {os.getloadavg()}", flush=True)
    print("starting the test control plane ...", flush=True)
    with ControlPlane(Binaries.locate()) as plane, plane.client() as kube:
        print(f"creating {args.nodes} kwok nodes (8 x 16 GiB) ...", flush=True)
        started = time.monotonic()
        create_nodes(
            kube,
            [gpu_node(f"bench-{i:04d}", [16] * 8, unit=MemoryUnit.GIB) for i in range(args.nodes)],
            timeout=600,
        )
        print(f"  {time.monotonic() - started:.0f} s", flush=True)
        if args.dra:
            print(f"publishing {args.nodes} ResourceSlices ...", flush=True)
            started = time.monotonic()
            publish_slices(kube, [f"bench-{i:04d}" for i in range(args.nodes)])
            print(f"  {time.monotonic() - started:.0f} s", flush=True)
        (port,) = free_ports(1)
        argv = [sys.executable, "-c", "from gpushare.cli.main import main; main()", "extender"]
        argv += ["--kubeconfig", str(plane.kubeconfig), "--host", "127.0.0.1", "--port", str(port)]
        argv += ["--log-level", "warning"] + (["--dra-scoring"] if args.dra_scoring else [])
        url = f"http://127.0.0.1:{port}"
        with tempfile.TemporaryDirectory() as workdir:
            extender = ManagedProcess("gpushare-extender", argv, Path(workdir)).start()
            profiler: subprocess.Popen[bytes] | None = None
            try:
                wait_until(
                    "extender ready", lambda: http_get(f"{url}/readyz")[0] == 200, 120,
                    processes=[extender],
                )  # fmt: skip
                if args.profile is not None:
                    spy = [str(Path(sys.executable).parent / "py-spy"), "record", "--nonblocking"]
                    spy += ["--pid", str(extender.pid), "--format", "raw", "--rate", "100"]
                    profiler = subprocess.Popen([*spy, "--output", str(args.profile)])
                prefix = f"{url}/gpushare-scheduler"
                rates = measure(
                    plane, kube, prefix, args.pods, args.rounds, qps=args.scheduler_qps,
                    dra=args.dra, scored=args.dra_scoring,
                )  # fmt: skip
                means = request_means_ms(url)
            finally:
                extender.stop()
                if profiler is not None:
                    profiler.wait(60)
    plain, gpu = statistics.median(rates["plain"]), statistics.median(rates["gpu"])
    print(f"median: pods without GPU memory {plain:.1f} pods/s, GPU-memory pods {gpu:.1f} pods/s")
    met = "met" if gpu >= args.budget * plain else "NOT met"
    print(f"ratio {gpu / plain:.2f} (budget >= {args.budget:g}: {met})")
    if args.dra:
        claim = statistics.median(rates["claim"])
        print(
            f"claim pods (DRA, consumable capacity) {claim:.1f} pods/s: "
            f"{claim / plain:.2f} x plain, {claim / gpu:.2f} x the extender path"
        )
    if args.dra_scoring:
        scored = statistics.median(rates["plain+dra"])
        print(f"pods without GPU memory with dra/prioritize called for each: {scored:.1f} pods/s, "
              f"{scored / plain:.2f} x without")  # fmt: skip
        if args.dra:
            claim_scored = statistics.median(rates["claim+dra"])
            print(f"claim pods scored by the extender {claim_scored:.1f} pods/s: "
                  f"{claim_scored / statistics.median(rates['claim']):.2f} x unscored")  # fmt: skip
    shown = ", ".join(f"{verb} {ms:.2f} ms" for verb, ms in sorted(means.items()))
    print(f"the extender's mean time per request (all rounds): {shown}")
    print(f"load averages at the end: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
