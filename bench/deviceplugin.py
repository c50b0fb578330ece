"""Device plugin Allocate latency with 110 pending GPU pods on the node (docs/design.md,
"Budgets": p99 ≤ 50 ms).

Run: ``make bench-deviceplugin`` (or ``.venv/bin/python bench/deviceplugin.py [--pods 110]
[--rounds 3] [--seed 1]``). Needs the test control plane (``make controlplane``).

Set-up: a real control plane (etcd, kube-apiserver, kwok), one kwok node with 8 GPUs of 80 GiB,
and ``--pods`` pods bound to it with the extender's allocation annotations, all pending (kubelet
has admitted none). Sizes 1-5 GiB; equal sizes share a GPU, as the extender's handshake rule
makes them. The device plugin runs as in production (pods cache over list+watch, the handshake
allocator, the gRPC server on a unix socket); a gRPC client plays kubelet and admits the pods in
a random order, one Allocate per pod, checking that each answer is the pod's own GPU. Each call
includes the annotation patch to the API server. The baseline, in the same run, is the same
gRPC stack with an allocator that returns a canned answer (no matching, no API call).
Reports p50/p99 over all calls of all rounds and the ratio to the baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from grpc import aio
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace

from gpushare.core.model import Gpu as CoreGpu
from gpushare.core.model import Node as CoreNode
from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.allocate import HandshakeAllocator
from gpushare.deviceplugin.inventory import device_id, parse_fake_gpus
from gpushare.deviceplugin.server import DevicePluginService, serve
from gpushare.kube.client import connect
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.nodepods import NodePods
from gpushare.testing.controlplane import Binaries, ControlPlane
from gpushare.testing.nodes import FakeGpu, create_nodes, gpu_node
from gpushare.testing.pods import bound_gpu_pod

GPUS = parse_fake_gpus("8x80GiB:H100")
SIZES = {1: 30, 2: 25, 3: 20, 4: 20, 5: 15}  # GiB -> pods; 110 in all, size s on GPU s-1


def pod_plan(pods: int) -> list[tuple[str, int, int]]:
    """(name, GiB, GPU) per pod: the SIZES mix scaled to ``pods``."""
    plan = []
    total = sum(SIZES.values())
    for size, count in SIZES.items():
        for i in range(max(1, round(count * pods / total))):
            plan.append((f"p{size}-{i}", size, size - 1))
    return plan[:pods]


class Canned:
    """The baseline allocator: a fixed answer, no matching, no API call."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        envs = {"NVIDIA_VISIBLE_DEVICES": GPUS[0].uuid, "ALIYUN_COM_GPU_MEM_IDX": "0"}
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs=envs)]
        )


async def timed_calls(
    service: DevicePluginService, calls: list[tuple[int, int]], check: bool
) -> list[float]:
    """Serve ``service`` and make one Allocate per (units, expected GPU index); ms each."""
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-bench-", dir="/tmp"))
    server = await serve(service, socket_dir)
    times_ms = []
    try:
        async with aio.insecure_channel(server.address) as channel:
            stub = api_pb2_grpc.DevicePluginStub(channel)
            for units, gpu in calls:
                ids = [device_id(GPUS[0], n) for n in range(units)]
                request = api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
                )
                start = time.perf_counter()
                response = await stub.Allocate(request)
                times_ms.append((time.perf_counter() - start) * 1000)
                got = response.container_responses[0].envs["ALIYUN_COM_GPU_MEM_IDX"]
                if check and got != str(gpu):
                    raise AssertionError(f"Allocate of {units} GiB got GPU {got}, not {gpu}")
    finally:
        await server.stop()
        socket_dir.rmdir()
    return times_ms


async def one_round(plane: ControlPlane, node: str, pods: int, seed: int) -> list[float]:
    """Bind ``pods`` pending pods to ``node`` in a fresh namespace, admit them all."""
    namespace = f"bench-{seed}-{time.time_ns()}"
    core = CoreNode(node, tuple(CoreGpu(g.index, g.model, 80) for g in GPUS))
    plan = pod_plan(pods)
    with plane.client() as kube:
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        for i, (name, size, gpu) in enumerate(plan):
            kube.create(
                bound_gpu_pod(namespace, name, core, [("main", (gpu,), size)], assume_ns=i + 1)
            )
    client = connect(plane.kubeconfig, trust_env=False)
    cache = NodePods(client, node)
    cache.start()
    try:
        await cache.wait_synced(30)
        while len(cache.pods()) < len(plan):  # every pod in the cache before timing
            await asyncio.sleep(0.05)
        service = DevicePluginService(GPUS, MemoryUnit.GIB)
        service.allocator = HandshakeAllocator(node, service, cache)
        order = [(size, gpu) for _, size, gpu in plan]
        random.Random(seed).shuffle(order)
        return await timed_calls(service, order, True)
    finally:
        await cache.stop()
        await client.close()
        with plane.client() as kube:
            kube.delete(Namespace, namespace)


def report(label: str, times_ms: list[float]) -> tuple[float, float]:
    p50 = statistics.median(times_ms)
    p99 = float(np.percentile(times_ms, 99))
    print(f"{label:<28} n={len(times_ms):4d}  p50 {p50:7.2f} ms  p99 {p99:7.2f} ms", flush=True)
    return p50, p99


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print("starting the test control plane ...", flush=True)
    with ControlPlane(Binaries.locate()) as plane:
        node = "bench-gpu-node"
        with plane.client() as kube:
            create_nodes(
                kube, [gpu_node(node, [FakeGpu(g.index, 80) for g in GPUS], unit=MemoryUnit.GIB)]
            )
        handshake: list[float] = []
        for r in range(args.rounds):
            print(f"round {r + 1}/{args.rounds}: {args.pods} pending pods ...", flush=True)
            handshake += asyncio.run(one_round(plane, node, args.pods, args.seed + r))
        canned = asyncio.run(
            timed_calls(
                DevicePluginService(GPUS, MemoryUnit.GIB, Canned()),
                [(size, 0) for _, size, _ in pod_plan(args.pods)] * args.rounds,
                False,
            )
        )
    _, p99 = report("Allocate (handshake)", handshake)
    _, floor = report("Allocate (canned baseline)", canned)
    print(f"p99 ratio to baseline: {p99 / floor:.1f}x; budget p99 <= 50 ms: "
          f"{'met' if p99 <= 50 else 'NOT met'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
