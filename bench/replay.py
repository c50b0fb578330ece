"""The simulator against the real scheduler: the same pods, order and policy through
``gpushare simulate``'s engine and through kube-scheduler + ``gpushare extender`` on kwok nodes.

Run: ``make bench-replay`` (or ``.venv/bin/python bench/replay.py [--policy bestfit]
[--seed 42] [--pods N] [--score-all] [--simulator like-cluster|ideal] [--out out/replay]``).
Needs the test control plane (``make controlplane``).

The cluster and the pods are the embedded trace's (``make run``'s: 120 nodes, 624 GPUs of 1000
milli-GPU each, 820 pods), the stream as the simulator makes it for ``--seed`` (shuffled, tuned to
130 % of the GPU capacity: ``gpushare.sim.workload.make_run``), cut to ``--pods``. The simulator
places it with ``--policy`` (``gpushare.sim.engine.simulate``), by default like the cluster
(``--simulator like-cluster``: pods that ask no GPU by kube-scheduler's own scores, the nodes
kube-scheduler passes on, M learned online: ``gpushare.sim.engine.LikeCluster``; with
``--score-all`` its ``percentage_of_nodes_to_score`` is 100 too), or as the paper's ideal run
(``--simulator ideal``); the other mode's largest difference is printed too. The real run: a
kwok node per trace node (its GPUs in an inventory of 1000 "MiB" each, so one unit is one
milli-GPU; its CPU and memory as the trace says), ``gpushare extender --policy P --gpu-unit
1000`` as its own process, and a kube-scheduler wired to it as the chart wires it
(``--score-all``: with ``percentageOfNodesToScore: 100``, so that kube-scheduler does not stop
looking after 100 feasible nodes). Each pod is created, then waited for until it is bound or
kube-scheduler marks it unschedulable, which is then deleted (the simulator drops it): one pod
at a time, as the simulator places them.

``--dra best-fit`` (or ``--dra index``) replays the stream as Dynamic Resource Allocation
claims instead (docs/dra.md, "Placement"): each kwok node has gpushare's
ResourceSlice (its GPUs of 1000 MiB, so one MiB is one milli-GPU), each GPU pod a ResourceClaim
asking ``memory: <share>Mi`` on ``count`` distinct GPUs (its allowed models as a CEL selector),
which kube-scheduler's allocator places first fit; after each bind the node's slice is published
again in the order the DRA driver would publish it (``gpushare.dra.usage``: least free first
for ``best-fit``, by index for ``index``) — the driver's own process cannot run on kwok nodes,
so the replay publishes for it, the same functions, before the next pod. kube-scheduler scores
the nodes with its own plugins, no extender; with ``--dra-scoring`` also through ``gpushare
extender --dra-scoring`` (``dra/prioritize``, a second extender without managedResources).

Prints progress, and at the end the unallocated GPU % at arrived 50/75/100/130 % for both and
the largest difference over arrived 0–130 %; writes ``replay.json`` (both curves) and
``replay.png`` (the two curves, the paper's Fig. 9a axes) into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.models.core_v1 import (
    Container,
    PodResourceClaim,
    PodSpec,
    ResourceRequirements,
)
from lightkube.models.core_v1 import (
    ResourceClaim as ResourceClaimRef,
)
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Pod
from lightkube.resources.core_v1 import Node as KwokNode
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice
from lightkube.types import PatchType

from gpushare.core.model import Node, PodRequest
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import DRIVER, MEMORY, device_class, resource_slice
from gpushare.dra.templates import DEVICE_CLASS
from gpushare.dra.usage import device_order, memory_used
from gpushare.kube.codec import GPU_COUNT_ANNOTATION, GPU_MEM, GPU_MODELS_ANNOTATION, MemoryUnit
from gpushare.sim.engine import LikeCluster, RunRecord, simulate
from gpushare.sim.experiment import policy_context, run_policy
from gpushare.sim.metrics import arrived_bins
from gpushare.sim.trace import load_embedded_trace
from gpushare.sim.workload import gpu_demand, make_run
from gpushare.testing.controlplane import (
    Binaries,
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_dra_extender,
    gpushare_extender,
    http_ok,
    wait_until,
)
from gpushare.testing.nodes import FakeGpu, create_nodes, gpu_node

SCHEDULER = "gpushare-replay"
NAMESPACE = "replay"
MAX_PERCENT = 130
FloatArray = npt.NDArray[np.float64]


def kwok_node(node: Node) -> KwokNode:
    """The trace node as a kwok node: GPUs of 1000 units (milli-GPU), its CPU and memory."""
    return gpu_node(
        node.name,
        [FakeGpu(g.index, g.capacity, g.model) for g in node.gpus],
        unit=MemoryUnit.MIB,
        cpu=f"{node.cpu_milli}m",
        memory=f"{node.memory_mib}Mi",
        pods=1000,
    )


def kube_pod(pod: PodRequest, name: str) -> Pod:
    """The trace pod as written for gpushare: ``aliyun.com/gpu-mem`` = share × count, the
    count and the allowed models as annotations; its CPU and memory as requests."""
    resources: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
    annotations: dict[str, str] = {}
    if pod.gpu_containers:
        (container,) = pod.gpu_containers
        resources[GPU_MEM] = str(container.gpu_share * container.gpu_count)
        if container.gpu_count > 1:
            annotations[GPU_COUNT_ANNOTATION] = str(container.gpu_count)
        if container.allowed_models:
            annotations[GPU_MODELS_ANNOTATION] = ",".join(sorted(container.allowed_models))
    return Pod(
        metadata=ObjectMeta(name=name, namespace=NAMESPACE, annotations=annotations),
        spec=PodSpec(
            schedulerName=SCHEDULER,
            containers=[
                Container(
                    name="main",
                    image="registry.invalid/gpushare/replay:0",
                    resources=ResourceRequirements(limits=resources, requests=resources),
                )
            ],
        ),
    )


def decided(kube: Client, name: str, timeout_s: float = 60.0) -> bool:
    """Wait until pod ``name`` is bound (True) or marked unschedulable (False)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while time.monotonic() < deadline:
        pod = kube.get(Pod, name, namespace=NAMESPACE)
        if pod.spec is not None and pod.spec.nodeName:
            return True
        for condition in (pod.status.conditions if pod.status else None) or ():
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return False
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)
    raise TimeoutError(f"pod {name} neither bound nor unschedulable in {timeout_s:.0f} s")


def unallocated_curve(arrived: FloatArray, allocated: FloatArray, capacity: float) -> FloatArray:
    """Unallocated GPU % (100 × (capacity − allocated request) / capacity) at each arrived %
    0..MAX_PERCENT: the last event at or below each bin (NaN before the first)."""
    bins = arrived_bins(arrived, capacity)
    curve = np.full(MAX_PERCENT + 1, np.nan)
    for event, b in enumerate(bins.tolist()):
        if 0 <= b <= MAX_PERCENT:
            curve[b] = 100.0 * (capacity - allocated[event]) / capacity
    reached = int(min(bins.max(), MAX_PERCENT))
    last = np.nan
    for b in range(reached + 1):  # carry the last value over bins no event fell in
        if np.isnan(curve[b]):
            curve[b] = last
        last = curve[b]
    return curve


class DraSlices:
    """The kwok nodes' ResourceSlices, published again after each bind in the order the DRA
    driver would publish (``best_fit``) or by index: what ``gpushare dra-driver`` does on a real
    node, with the same functions (``gpushare.dra.usage``, ``resource_slice``)."""

    def __init__(self, kube: Client, nodes: Sequence[Node], best_fit: bool) -> None:
        self.kube = kube
        self.best_fit = best_fit
        self.gpus = {
            n.name: [PhysicalGpu(g.index, f"GPU-{n.name}-{g.index}", g.index, g.model, g.capacity)
                     for g in n.gpus]
            for n in nodes if n.gpus
        }  # fmt: skip
        self.claims: dict[str, list[dict[str, Any]]] = {name: [] for name in self.gpus}
        self.generation = dict.fromkeys(self.gpus, 1)
        for name, gpus in self.gpus.items():
            kube.create(from_dict(resource_slice(name, gpus, unit=MemoryUnit.MIB, generation=1)))
        kube.create(from_dict(device_class(DEVICE_CLASS)))

    def bound(self, node: str, claim: dict[str, Any]) -> None:
        """``claim`` allocated on ``node``: publish the node's next order if it changed."""
        if not self.best_fit or node not in self.gpus:
            return
        gpus = self.gpus[node]
        before = device_order(gpus, self._used(node), MemoryUnit.MIB)
        self.claims[node].append(claim)
        order = device_order(gpus, self._used(node), MemoryUnit.MIB)
        if order != before:
            self.generation[node] += 1
            body = resource_slice(node, gpus, unit=MemoryUnit.MIB,
                                  generation=self.generation[node], order=order)  # fmt: skip
            self.kube.patch(ResourceSlice, body["metadata"]["name"], {"spec": body["spec"]},
                            patch_type=PatchType.MERGE)  # fmt: skip

    def _used(self, node: str) -> dict[int, int]:
        used, errors = memory_used(self.claims[node], driver=DRIVER, node=node,
                                   gpus=self.gpus[node], unit=MemoryUnit.MIB)  # fmt: skip
        assert not errors, errors
        return used


def kube_claim(pod: PodRequest, name: str) -> dict[str, Any] | None:
    """The trace pod's GPU ask as a ResourceClaim: ``memory: <share>Mi`` (one MiB a milli-GPU)
    on ``count`` distinct GPUs of its allowed models; ``None`` for a pod without GPU."""
    if not pod.gpu_containers:
        return None
    (container,) = pod.gpu_containers
    exactly: dict[str, Any] = {
        "deviceClassName": DEVICE_CLASS,
        "count": container.gpu_count,
        "capacity": {"requests": {MEMORY: f"{container.gpu_share}Mi"}},
    }
    if container.allowed_models:
        models = ", ".join(json.dumps(m) for m in sorted(container.allowed_models))
        exactly["selectors"] = [
            {"cel": {"expression": f'device.attributes["{DRIVER}"].model in [{models}]'}}
        ]
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if container.gpu_count > 1:
        devices["constraints"] = [{"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/uuid"}]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE}, "spec": {"devices": devices},
    }  # fmt: skip


def claim_pod(pod: PodRequest, name: str) -> Pod:
    """The trace pod with its claim (``kube_claim``) instead of ``aliyun.com/gpu-mem``."""
    body = kube_pod(pod, name)
    assert body.spec is not None
    assert body.metadata is not None
    body.metadata.annotations = {}
    (container,) = body.spec.containers
    assert container.resources is not None
    for amounts in (container.resources.limits, container.resources.requests):
        if amounts is not None:
            amounts.pop(GPU_MEM, None)
    if pod.gpu_containers:
        body.spec.resourceClaims = [PodResourceClaim(name="gpu", resourceClaimName=name)]
        container.resources.claims = [ResourceClaimRef(name="gpu")]
    return body


def replay(
    nodes: Sequence[Node],
    stream: Sequence[PodRequest],
    policy: str,
    score_all: bool,
    *,
    extender_only: bool = False,
    dra: str = "",
    dra_scoring: bool = False,
) -> tuple[FloatArray, FloatArray, int]:
    """The stream through the real scheduler; (arrived, allocated) per event, pods bound."""
    with contextlib.ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="gpushare-replay-")))
        plane = stack.enter_context(ControlPlane(Binaries.locate()))
        kube = stack.enter_context(plane.client())
        print(f"creating {len(nodes)} kwok nodes", flush=True)
        create_nodes(kube, [kwok_node(n) for n in nodes], timeout=300)
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
        slices = DraSlices(kube, nodes, best_fit=dra == "best-fit") if dra else None
        extenders = []
        if not dra or dra_scoring:
            (port,) = free_ports(1)
            url = f"http://127.0.0.1:{port}"
            argv = gpushare_argv(
                "extender", "--kubeconfig", str(plane.kubeconfig), "--port", str(port),
                "--policy", policy, "--gpu-unit", "1000", "--handshake-timeout", "0",
                *(["--dra-scoring"] if dra_scoring else []),
            )  # fmt: skip
            extender = ManagedProcess("gpushare-extender", argv, tmp).start()
            stack.callback(extender.stop)
            wait_until("extender ready", lambda: http_ok(f"{url}/readyz"), 120)
            prefix = f"{url}/gpushare-scheduler"
            extenders.append(
                gpushare_dra_extender(prefix) if dra else gpushare_extender(prefix, preempt=False)
            )
        profile: dict[str, object] = {"schedulerName": SCHEDULER}
        if score_all:
            profile["percentageOfNodesToScore"] = 100
        if extender_only:
            profile["plugins"] = {"score": {"disabled": [{"name": "*"}]}}
        stack.enter_context(
            plane.scheduler("kube-scheduler-replay", profiles=[profile], extenders=extenders)
        )
        return _one_at_a_time(kube, stream, slices)


def _one_at_a_time(
    kube: Client, stream: Sequence[PodRequest], slices: DraSlices | None = None
) -> tuple[FloatArray, FloatArray, int]:
    arrived = np.zeros(len(stream) + 1)
    allocated = np.zeros(len(stream) + 1)
    bound = 0
    refusals: list[str] = []
    started = time.monotonic()
    total_arrived = total_allocated = 0.0
    for i, pod in enumerate(stream, start=1):
        name = f"p{i:05d}"
        claim = kube_claim(pod, name) if slices is not None else None
        if claim is not None:
            kube.create(from_dict(claim))
        kube.create(claim_pod(pod, name) if slices is not None else kube_pod(pod, name))
        demand = gpu_demand(pod)
        total_arrived += demand
        if decided(kube, name):
            total_allocated += demand
            bound += 1
            if slices is not None and claim is not None:
                placed = kube.get(Pod, name, namespace=NAMESPACE)
                assert placed.spec is not None
                assert placed.spec.nodeName
                allocated_claim = kube.get(ResourceClaim, name, namespace=NAMESPACE).to_dict()
                slices.bound(placed.spec.nodeName, allocated_claim)
        else:
            if len(refusals) < 5:
                refusals.append(f"{name} ({_shape(pod)}): {_why(kube, name)}")
            _delete(kube, name)
            if claim is not None:
                kube.delete(ResourceClaim, name, namespace=NAMESPACE)
        arrived[i], allocated[i] = total_arrived, total_allocated
        if i % 50 == 0 or i == len(stream):
            rate = i / (time.monotonic() - started)
            print(f"  {i}/{len(stream)} pods, {bound} bound, {rate:.1f} pods/s", flush=True)
    for line in refusals:
        print(f"  refused: {line}")
    return arrived, allocated, bound


def _shape(pod: PodRequest) -> str:
    gpus = ", ".join(
        f"{c.gpu_count}x{c.gpu_share}"
        + (f" on {sorted(c.allowed_models)}" if c.allowed_models else "")
        for c in pod.gpu_containers
    )
    return f"{gpus or 'no GPU'}, {pod.cpu_milli}m CPU, {pod.memory_mib} MiB"


def _why(kube: Client, name: str) -> str:
    pod = kube.get(Pod, name, namespace=NAMESPACE)
    for condition in (pod.status.conditions if pod.status else None) or ():
        if condition.type == "PodScheduled":
            return condition.message or ""
    return ""


def _delete(kube: Client, name: str) -> None:
    try:
        kube.delete(Pod, name, namespace=NAMESPACE, grace_period=0)
    except ApiError as error:
        if error.status.code != 404:
            raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--pods", type=int, default=0, help="first N pods of the stream (0: all)")
    parser.add_argument("--score-all", action="store_true")
    parser.add_argument(
        "--gpu-pods-only",
        action="store_true",
        help="leave out the pods that ask no GPU (kube-scheduler places those without the "
        "extender; the simulator with the policy)",
    )
    parser.add_argument(
        "--extender-only",
        action="store_true",
        help="kube-scheduler's own score plugins off: the extender's prioritize alone ranks",
    )
    parser.add_argument(
        "--dra",
        choices=["best-fit", "index"],
        default="",
        help="replay as DRA claims on gpushare's ResourceSlices (no extender), the slices "
        "ordered as the DRA driver's --placement says",
    )
    parser.add_argument(
        "--dra-scoring",
        action="store_true",
        help="with --dra: gpushare extender --dra-scoring scores the nodes for the claim pods "
        "(--policy), as a second extender without managedResources",
    )
    parser.add_argument(
        "--simulator",
        choices=["like-cluster", "ideal"],
        default="like-cluster",
        help="the simulator's mode: placed as kube-scheduler + the extender would (default), "
        "or the paper's ideal run (every pod by the policy)",
    )
    parser.add_argument("--out", type=Path, default=Path("out/replay"))
    args = parser.parse_args(argv)

    trace = load_embedded_trace()
    nodes, pods = list(trace.nodes), list(trace.pods)
    setup = make_run(nodes, pods, args.seed)
    stream = list(setup.stream[: args.pods] if args.pods else setup.stream)
    if args.gpu_pods_only:
        stream = [pod for pod in stream if pod.gpu_containers]
    capacity = float(sum(g.capacity for n in nodes for g in n.gpus))
    print(f"{len(nodes)} nodes, {len(stream)} pods, policy {args.policy}, seed {args.seed}")

    def simulated_run(mode: str) -> RunRecord:
        context = policy_context(nodes, pods, args.seed)
        assert context.workload is not None
        like = mode == "like-cluster"
        return simulate(
            nodes, stream, run_policy(args.policy, context, like_cluster=like),
            tie_rank=setup.tie_rank, workload=context.workload,
            like_cluster=LikeCluster(args.seed, 100 if args.score_all else 0) if like else None,
        )  # fmt: skip

    other_mode = "ideal" if args.simulator == "like-cluster" else "like-cluster"
    record, other = simulated_run(args.simulator), simulated_run(other_mode)
    simulated = unallocated_curve(record.arrived, record.allocated, capacity)
    other_curve = unallocated_curve(other.arrived, other.allocated, capacity)
    print(f"simulator ({args.simulator}): {record.placed} of {len(stream)} pods placed")

    started = time.monotonic()
    arrived, allocated, bound = replay(
        nodes,
        stream,
        args.policy,
        args.score_all,
        extender_only=args.extender_only,
        dra=args.dra,
        dra_scoring=args.dra_scoring,
    )
    real = unallocated_curve(arrived, allocated, capacity)
    seconds = time.monotonic() - started
    print(f"{_real_name(args)}: {bound} of {len(stream)} pods bound in {seconds:.0f} s")

    difference = np.abs(real - simulated)
    print(f"{'arrived %':>10} {'simulator':>10} {'real':>10}  (unallocated GPU %)")
    for percent in (50, 75, 100, 110, MAX_PERCENT):
        print(f"{percent:>10} {simulated[percent]:>10.2f} {real[percent]:>10.2f}")
    if np.all(np.isnan(difference)):
        print("no arrived % in common")
        return 1
    worst = int(np.nanargmax(difference))
    print(f"largest difference: {difference[worst]:.2f} points at arrived {worst} %")
    other_difference = np.abs(real - other_curve)
    other_worst = int(np.nanargmax(other_difference))
    print(
        f"with the simulator {other_mode} instead ({other.placed} placed): "
        f"{other_difference[other_worst]:.2f} points at arrived {other_worst} %"
    )

    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "policy": args.policy, "seed": args.seed, "pods": len(stream),
        "score_all": args.score_all, "extender_only": args.extender_only,
        "gpu_pods_only": args.gpu_pods_only, "dra": args.dra, "dra_scoring": args.dra_scoring,
        "simulator": args.simulator,
        "placed_simulator": record.placed, "bound_real": bound,
        "unallocated_pct_simulator": [None if np.isnan(v) else round(v, 3) for v in simulated],
        "unallocated_pct_real": [None if np.isnan(v) else round(v, 3) for v in real],
        "largest_difference_points": round(float(difference[worst]), 3),
        "largest_difference_at_arrived_pct": worst,
        other_mode: {
            "placed_simulator": other.placed,
            "unallocated_pct_simulator": [None if np.isnan(v) else round(v, 3)
                                          for v in other_curve],
            "largest_difference_points": round(float(other_difference[other_worst]), 3),
            "largest_difference_at_arrived_pct": other_worst,
        },
    }  # fmt: skip
    (args.out / "replay.json").write_text(json.dumps(result, indent=1))
    _plot(args.out / "replay.png", simulated, real, args)
    print(f"wrote {args.out / 'replay.json'} and {args.out / 'replay.png'}")
    return 0


def _real_name(args: argparse.Namespace) -> str:
    if args.dra:
        scored = ", nodes scored by the extender" if args.dra_scoring else ""
        return f"kube-scheduler + DRA claims (slices {args.dra}{scored})"
    return "kube-scheduler + gpushare extender"


def _plot(path: Path, simulated: FloatArray, real: FloatArray, args: argparse.Namespace) -> None:
    import matplotlib  # noqa: PLC0415 (the sim extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    x = np.arange(MAX_PERCENT + 1)
    figure, axis = plt.subplots(figsize=(8, 5), constrained_layout=True)
    mode = "like the cluster" if args.simulator == "like-cluster" else "ideal"
    axis.plot(x, simulated, label=f"gpushare simulate ({mode})", linewidth=2)
    axis.plot(x, real, label=f"{_real_name(args)} (kwok)", linestyle="--")
    axis.plot(x, np.clip(100 - x, 0, None), color="grey", linewidth=0.8, label="ideal")
    axis.set_xlabel("arrived GPU workload (% of capacity)")
    axis.set_ylabel("unallocated GPU (%)")
    axis.set_title(f"embedded trace, {args.policy}, seed {args.seed}")
    axis.legend()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
