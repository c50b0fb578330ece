"""The simulator against the real scheduler: the same pods, order and policy through
``gpushare simulate``'s engine and through kube-scheduler + ``gpushare extender`` on kwok nodes.

Run: ``make bench-replay`` (or ``.venv/bin/python bench/replay.py [--policy bestfit|a,b|all]
[--seed 42] [--sim-seeds 42-57] [--trace embedded|openb-sample] [--pods N] [--score-all]
[--simulator like-cluster|ideal] [--out out/replay]``). Needs the test control plane (``make
controlplane``).

The cluster and the pods are the embedded trace's (``--trace embedded``, the default: ``make
run``'s 120 nodes, 624 GPUs of 1000 milli-GPU each, 820 pods) or a sample of the openb default
trace (``--trace openb-sample``: ``--sample-nodes`` 300 of the 1,213 GPU nodes of
``--trace-dir``, drawn with ``--sample-seed`` 42 by ``gpushare.sim.sample.sample_nodes``, and
the default pod list less the pods no sampled node could hold, ``servable_pods``); the stream
as the simulator makes it for ``--seed`` (shuffled, tuned to 130 % of the GPU capacity:
``gpushare.sim.workload.make_run``), cut to ``--pods``. The simulator
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

The simulator runs once per ``--sim-seeds`` seed (default: 16 from ``--seed``), in parallel
processes (``--jobs``): each seed draws the simulator's ties, the stream stays ``--seed``'s
(``gpushare.sim.compare.simulate_stream``); the band is their [min, max] per arrived %, and the
real curve lies within it where ``min − 0.25 <= real <= max + 0.25``
(``gpushare.sim.compare``).

Prints progress, and at the end the unallocated GPU % at arrived 50/75/100/110/130 % for the
``--seed`` run, the band and the real run; the largest difference against the ``--seed`` run
over arrived 0–130 %, the largest distance outside the band (inside or not), and the first pod
the real run put on another node than the ``--seed`` run, the first on another kind of node
(GPUs, CPU, memory: a draw among equal nodes does not count), and the first it placed where
the simulator refused it or the other way round. Writes ``replay.json`` (the curves, the band, the
numbers) and ``replay.png`` (the curves and the band shaded, the paper's Fig. 9a axes) into
``--out`` (``--out/<policy>`` for several policies), and ``summary.json`` (one line per
policy, as the summary table printed last). ``--real-from DIR`` judges the real runs an
earlier replay wrote into DIR (with the same trace, stream and policies) against these
``--sim-seeds`` instead of running them again.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
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

from gpushare.cli.simulate import parse_seeds
from gpushare.core.model import Node, PodRequest
from gpushare.core.policies import policy_names
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import DRIVER, MEMORY, device_class, resource_slice
from gpushare.dra.templates import DEVICE_CLASS
from gpushare.dra.usage import device_order, memory_used
from gpushare.kube.codec import GPU_COUNT_ANNOTATION, GPU_MEM, GPU_MODELS_ANNOTATION, MemoryUnit
from gpushare.sim.compare import (
    MAX_PERCENT,
    TOLERANCE_POINTS,
    Largest,
    PlacedDifferently,
    SeedBand,
    distance_outside,
    first_placed_differently,
    largest,
    seed_band,
    simulate_stream,
    unallocated_curve,
    within_band,
)
from gpushare.sim.experiment import run_in_processes
from gpushare.sim.sample import sample_nodes, servable_pods
from gpushare.sim.trace import TraceError, load_embedded_trace, load_trace
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


def decided(kube: Client, name: str, timeout_s: float = 60.0) -> str | None:
    """Wait until pod ``name`` is bound (its node's name) or marked unschedulable (``None``)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while time.monotonic() < deadline:
        pod = kube.get(Pod, name, namespace=NAMESPACE)
        if pod.spec is not None and pod.spec.nodeName:
            return pod.spec.nodeName
        for condition in (pod.status.conditions if pod.status else None) or ():
            if condition.type == "PodScheduled" and condition.reason == "Unschedulable":
                return None
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)
    raise TimeoutError(f"pod {name} neither bound nor unschedulable in {timeout_s:.0f} s")


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
) -> RealRun:
    """The stream through the real scheduler (module doc)."""
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


@dataclass(frozen=True, slots=True)
class RealRun:
    """The real run: cumulative arrived and allocated GPU units per event (index 0: the empty
    cluster), pods bound, and the node each pod of the stream was bound to (``None``:
    refused)."""

    arrived: FloatArray
    allocated: FloatArray
    bound: int
    placed_on: tuple[str | None, ...]


def _one_at_a_time(
    kube: Client, stream: Sequence[PodRequest], slices: DraSlices | None = None
) -> RealRun:
    placed_on: list[str | None] = []
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
        node = decided(kube, name)
        placed_on.append(node)
        if node is not None:
            total_allocated += demand
            bound += 1
            if slices is not None and claim is not None:
                allocated_claim = kube.get(ResourceClaim, name, namespace=NAMESPACE).to_dict()
                slices.bound(node, allocated_claim)
        else:
            if len(refusals) < 5:
                why = _why(kube, name)
                why = why if len(why) <= 300 else f"{why[:300]}..."
                refusals.append(f"{name} ({_shape(pod)}): {why}")
            _delete(kube, name)
            if claim is not None:
                kube.delete(ResourceClaim, name, namespace=NAMESPACE)
        arrived[i], allocated[i] = total_arrived, total_allocated
        if i % 50 == 0 or i == len(stream):
            rate = i / (time.monotonic() - started)
            print(f"  {i}/{len(stream)} pods, {bound} bound, {rate:.1f} pods/s", flush=True)
    for line in refusals:
        print(f"  refused: {line}")
    return RealRun(arrived, allocated, bound, tuple(placed_on))


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


OPENB_DIR = Path(__file__).resolve().parents[1].parent / "shared" / "traces" / "openb"
"""The openb trace on the project's machines (read from there, never copied into the repo)."""

SIM_SEEDS = 16
"""Simulator seeds by default: this many, from ``--seed`` on."""


@dataclass(frozen=True, slots=True)
class Workload:
    """The cluster and the trace's pods a replay runs on; ``source`` says how they were chosen
    (written into replay.json)."""

    label: str
    nodes: tuple[Node, ...]
    pods: tuple[PodRequest, ...]
    source: dict[str, object]


def load_workload(args: argparse.Namespace) -> Workload:
    """``--trace embedded``: the embedded trace, whole. ``--trace openb-sample``: the openb
    default trace's GPU node list sampled (``gpushare.sim.sample.sample_nodes``:
    ``--sample-nodes`` of them, ``--sample-seed``), and its default pod list less the pods no
    sampled node could hold (``servable_pods``). ``TraceError`` / ``ValueError`` for a bad
    trace directory or sample size."""
    if args.trace == "embedded":
        trace = load_embedded_trace()
        return Workload("embedded trace", trace.nodes, trace.pods, {"trace": "embedded"})
    trace = load_trace(args.trace_dir, "default")
    nodes = sample_nodes(trace.nodes, args.sample_nodes, args.sample_seed)
    pods = servable_pods(trace.pods, nodes)
    label = f"openb default, {len(nodes)} of {len(trace.nodes)} nodes"
    return Workload(
        label,
        tuple(nodes),
        tuple(pods),
        {
            "trace": "openb-sample", "trace_dir": str(args.trace_dir), "workload": "default",
            "trace_nodes": len(trace.nodes), "sample_nodes": len(nodes),
            "sample_seed": args.sample_seed, "trace_pods": len(trace.pods),
            "servable_pods": len(pods),
        },
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Verdict:
    """One policy's replay: the largest difference against the simulator's ``--seed`` run,
    the largest distance outside the seed band, whether the real curve lies within the band
    (``gpushare.sim.compare.within_band``), the real run's wall time (s) and the load average
    (1, 5, 15 min) at its end."""

    policy: str
    difference: Largest | None
    outside: Largest | None
    inside: bool
    real_s: float
    load_average: tuple[float, float, float]


def seeds_text(seeds: Sequence[int]) -> str:
    """``42-49`` for consecutive seeds, else ``42,44``."""
    ordered = sorted(seeds)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(str(seed) for seed in seeds)


def _points(value: Largest | None) -> str:
    return "n/a" if value is None else f"{value.points:.2f} at {value.arrived_pct} %"


def _rounded(curve: FloatArray) -> list[float | None]:
    return [None if np.isnan(v) else round(float(v), 3) for v in curve]


def _largest_json(value: Largest | None, name: str) -> dict[str, object]:
    return {
        f"{name}_points": None if value is None else round(value.points, 3),
        f"{name}_at_arrived_pct": None if value is None else value.arrived_pct,
    }


def compare_policy(
    policy: str,
    args: argparse.Namespace,
    workload: Workload,
    stream: Sequence[PodRequest],
    out: Path,
    *,
    earlier: Path | None = None,
) -> Verdict:
    """The simulator, once per ``--sim-seeds`` seed, and one real run of ``stream`` with
    ``policy`` (or the real run an earlier replay.json ``earlier`` recorded:
    ``saved_real_run``); prints the comparison, writes replay.json and replay.png into
    ``out``."""
    nodes, pods = workload.nodes, workload.pods
    saved = None if earlier is None else saved_real_run(earlier, policy, args, stream)
    capacity = float(sum(g.capacity for n in nodes for g in n.gpus))
    like = args.simulator == "like-cluster"
    percentage = 100 if args.score_all else 0
    seeds = list(args.sim_seeds or range(args.seed, args.seed + SIM_SEEDS))
    run = partial(simulate_stream, nodes, pods, stream, policy,
                  percentage_of_nodes_to_score=percentage)  # fmt: skip
    calls = [partial(run, seed, like_cluster=like) for seed in seeds]
    if args.seed not in seeds:
        calls.append(partial(run, args.seed, like_cluster=like))
    calls.append(partial(run, args.seed, like_cluster=not like))
    started = time.monotonic()
    *simulated, other = run_in_processes(calls, jobs=args.jobs)
    by_seed = {r.seed: r for r in simulated}
    base = by_seed[args.seed]
    band = seed_band([by_seed[seed].unallocated_pct for seed in seeds])
    placed = sorted(by_seed[seed].placed for seed in seeds)
    print(
        f"simulator ({args.simulator}), {policy}: {base.placed} of {len(stream)} pods placed with "
        f"seed {args.seed}, {placed[0]}-{placed[-1]} over seeds {seeds_text(seeds)} "
        f"({time.monotonic() - started:.1f} s)",
        flush=True,
    )

    real_nodes: tuple[str | None, ...] | None
    if saved is None:
        started = time.monotonic()
        real_run = replay(
            nodes, stream, policy, args.score_all,
            extender_only=args.extender_only, dra=args.dra, dra_scoring=args.dra_scoring,
        )  # fmt: skip
        real_s = time.monotonic() - started
        load_average = os.getloadavg()
        real = unallocated_curve(real_run.arrived, real_run.allocated, capacity)
        bound, real_nodes = real_run.bound, real_run.placed_on
        print(
            f"{_real_name(args)}, {policy}: {bound} of {len(stream)} pods bound in "
            f"{real_s:.0f} s (load average {load_average[0]:.2f} {load_average[1]:.2f} "
            f"{load_average[2]:.2f})"
        )
    else:
        real, bound, real_nodes, real_s, load_average = saved
        print(f"{_real_name(args)}, {policy}: {bound} of {len(stream)} pods bound ({earlier})")

    simulated_curve = base.unallocated_pct
    print(
        f"{'arrived %':>10} {'simulator':>10} {'band low':>10} {'band high':>10} {'real':>10}"
        "  (unallocated GPU %)"
    )
    for percent in (50, 75, 100, 110, MAX_PERCENT):
        values = (simulated_curve[percent], band.low[percent], band.high[percent], real[percent])
        print(f"{percent:>10}" + "".join(f" {v:>10.2f}" for v in values))
    difference = largest(np.abs(real - simulated_curve))
    distance = distance_outside(real, band)
    outside = largest(distance)
    inside = within_band(distance)
    verdict = "inside" if inside else "OUTSIDE"
    print(f"largest difference against seed {args.seed}: {_points(difference)}")
    print(
        f"largest distance outside the seed band ({seeds_text(seeds)}): {_points(outside)}: "
        f"{verdict} (tolerance {TOLERANCE_POINTS} points)"
    )
    other_mode = "ideal" if like else "like-cluster"
    other_difference = largest(np.abs(real - other.unallocated_pct))
    print(
        f"with the simulator {other_mode} instead ({other.placed} placed): "
        f"{_points(other_difference)}"
    )
    kinds = {n.name: (n.gpus, n.cpu_milli, n.memory_mib) for n in nodes}
    firsts: dict[str, PlacedDifferently | None] = {}
    if real_nodes is None:  # an earlier replay.json without them
        print("the real run recorded no node per pod: no first pod placed differently")
    else:
        firsts = {
            "first_pod_on_another_node": first_placed_differently(
                stream, base.placed_on, real_nodes
            ),
            "first_pod_on_another_kind_of_node": first_placed_differently(
                stream, base.placed_on, real_nodes, kinds=kinds
            ),
            "first_pod_placed_by_one_side_only": first_placed_differently(
                stream, base.placed_on, real_nodes, outcome_only=True
            ),
        }
    arrived_units = np.cumsum([0, *(gpu_demand(pod) for pod in stream)])
    for what, first in firsts.items():
        if first is None:
            print(f"{what.replace('_', ' ')}: none")
            continue
        pod = stream[first.position - 1]
        arrived = 100.0 * arrived_units[first.position] / capacity
        print(
            f"{what.replace('_', ' ')}: p{first.position:05d} ({pod.key}; {_shape(pod)}; "
            f"arrived {arrived:.0f} %): simulator {first.simulated or 'refused'}, "
            f"real {first.real or 'refused'}"
        )

    out.mkdir(parents=True, exist_ok=True)
    result = {
        **workload.source, "policy": policy, "seed": args.seed, "pods": len(stream),
        "nodes": len(nodes),
        "score_all": args.score_all, "extender_only": args.extender_only,
        "gpu_pods_only": args.gpu_pods_only, "dra": args.dra, "dra_scoring": args.dra_scoring,
        "simulator": args.simulator, "sim_seeds": seeds,
        "placed_simulator": base.placed, "bound_real": bound,
        "real_seconds": round(real_s, 1), "load_average": [round(v, 2) for v in load_average],
        "unallocated_pct_simulator": _rounded(simulated_curve),
        "unallocated_pct_real": _rounded(real),
        **_largest_json(difference, "largest_difference"),
        "band": {
            "seeds": seeds, "placed_simulator": [by_seed[seed].placed for seed in seeds],
            "unallocated_pct_low": _rounded(band.low), "unallocated_pct_high": _rounded(band.high),
            "tolerance_points": TOLERANCE_POINTS, "inside": inside,
            **_largest_json(outside, "largest_distance_outside"),
        },
        **{what: None if first is None else {
            "position": first.position, "key": first.key,
            "simulator": first.simulated, "real": first.real,
        } for what, first in firsts.items()},
        other_mode: {
            "placed_simulator": other.placed,
            "unallocated_pct_simulator": _rounded(other.unallocated_pct),
            **_largest_json(other_difference, "largest_difference"),
        },
        "simulator_nodes": list(base.placed_on),
        "real_nodes": None if real_nodes is None else list(real_nodes),
    }  # fmt: skip
    (out / "replay.json").write_text(json.dumps(result, indent=1))
    _plot(out / "replay.png", real, simulated=simulated_curve, band=band, policy=policy,
          seeds=seeds, workload=workload, args=args)  # fmt: skip
    print(f"wrote {out / 'replay.json'} and {out / 'replay.png'}", flush=True)
    return Verdict(policy, difference, outside, inside, real_s, load_average)


def saved_real_run(
    path: Path, policy: str, args: argparse.Namespace, stream: Sequence[PodRequest]
) -> tuple[FloatArray, int, tuple[str | None, ...] | None, float, tuple[float, float, float]]:
    """The real run a replay.json at ``path`` recorded (``--real-from``): its curve, pods
    bound, node per pod (``None`` when it has none), wall time (s) and load average.
    ``SystemExit`` (a usage error naming the file) when it is missing, unreadable, or of
    another policy, seed, stream or trace."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        sys.exit(f"replay.py: --real-from {path}: cannot be read: {error}")
    want = {"policy": policy, "seed": args.seed, "pods": len(stream), "trace": args.trace}
    got = {key: saved.get(key) for key in want}
    nodes = saved.get("real_nodes")
    if got != want or (nodes is not None and len(nodes) != len(stream)):
        sys.exit(
            f"replay.py: --real-from {path}: a real run of {got}; accepted: one of {want}, "
            "with one node (or null) per pod in real_nodes if any"
        )
    real = np.array([np.nan if v is None else v for v in saved["unallocated_pct_real"]])
    average = saved["load_average"]
    return (
        real,
        int(saved["bound_real"]),
        None if nodes is None else tuple(nodes),
        float(saved["real_seconds"]),
        (float(average[0]), float(average[1]), float(average[2])),
    )


def summary_table(verdicts: Sequence[Verdict], seed: int, seeds: str) -> str:
    """One line per policy: the largest difference against seed ``seed``, the largest
    distance outside the seed band, inside or not, the real run's time."""
    header = (
        f"{'policy':<11} {f'difference (seed {seed})':>22} {f'outside band ({seeds})':>24} "
        f"{'inside':>7} {'real run':>9}"
    )
    lines = [header]
    for v in verdicts:
        lines.append(
            f"{v.policy:<11} {_points(v.difference):>22} {_points(v.outside):>24} "
            f"{'yes' if v.inside else 'no':>7} {v.real_s:>7.0f} s"
        )
    return "\n".join(lines)


def _policies(text: str) -> tuple[str, ...]:
    """``all`` (every policy the extender offers: ``policy_names``), one name, or names
    separated by commas."""
    if text == "all":
        return tuple(policy_names())
    names = tuple(name.strip() for name in text.split(","))
    unknown = [name for name in names if name not in policy_names()]
    if unknown or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(
            f"{text!r}: {'unknown ' + ', '.join(unknown) if unknown else 'a policy repeats'}; "
            f"accepted: all, or one or more (comma-separated) of {', '.join(policy_names())}"
        )
    return names


def _sim_seeds(text: str) -> tuple[int, ...]:
    try:
        return parse_seeds(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else "")
    parser.add_argument(
        "--policy",
        "--policies",
        dest="policies",
        type=_policies,
        default=("bestfit",),
        help="the extender's --policy, or several (fgd-spare,bestfit), or all: every one the "
        "extender offers; one real run each, then a summary",
    )
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--sim-seeds",
        type=_sim_seeds,
        default=None,
        help=f"the simulator's seeds for the band, e.g. 42-49 or 42,45 (default: {SIM_SEEDS} "
        "seeds from --seed); the stream stays --seed's",
    )
    parser.add_argument(
        "--trace",
        choices=["embedded", "openb-sample"],
        default="embedded",
        help="embedded: the embedded trace; openb-sample: --sample-nodes nodes of the openb "
        "default trace (--trace-dir) and the default pods they can hold",
    )
    parser.add_argument("--trace-dir", type=Path, default=OPENB_DIR)
    parser.add_argument("--sample-nodes", type=int, default=300)
    parser.add_argument("--sample-seed", type=int, default=42)
    parser.add_argument(
        "--jobs", type=int, default=None, help="processes for the simulator runs (default: all)"
    )
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
    parser.add_argument(
        "--real-from",
        type=Path,
        default=None,
        help="judge the real runs an earlier replay recorded in this --out (its replay.json, "
        "or <policy>/replay.json for several policies) against these --sim-seeds, instead of "
        "running them again",
    )
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"argument --jobs: {args.jobs} is not a process count; accepted: >= 1")

    try:
        workload = load_workload(args)
    except (TraceError, ValueError) as error:
        parser.error(f"--trace {args.trace}: {error}")
    setup = make_run(workload.nodes, workload.pods, args.seed)
    stream = list(setup.stream[: args.pods] if args.pods else setup.stream)
    if args.gpu_pods_only:
        stream = [pod for pod in stream if pod.gpu_containers]
    policies = list(args.policies)
    seeds = seeds_text(args.sim_seeds or range(args.seed, args.seed + SIM_SEEDS))
    print(
        f"{workload.label}: {len(workload.nodes)} nodes, {len(stream)} pods, "
        f"{'policies ' + ', '.join(policies) if len(policies) > 1 else 'policy ' + policies[0]}, "
        f"seed {args.seed}, simulator seeds {seeds}",
        flush=True,
    )
    verdicts = []
    for policy in policies:
        out = args.out / policy if len(policies) > 1 else args.out
        earlier = None
        if args.real_from is not None:
            earlier = args.real_from / policy if len(policies) > 1 else args.real_from
            earlier = earlier / "replay.json"
        verdicts.append(compare_policy(policy, args, workload, stream, out, earlier=earlier))
    print()
    print(summary_table(verdicts, args.seed, seeds))
    summary = [
        {
            "policy": v.policy, **_largest_json(v.difference, "largest_difference"),
            **_largest_json(v.outside, "largest_distance_outside_band"), "inside": v.inside,
            "real_seconds": round(v.real_s, 1),
            "load_average": [round(x, 2) for x in v.load_average],
        }
        for v in verdicts
    ]  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    document = {**workload.source, "seed": args.seed, "sim_seeds": seeds, "policies": summary}
    (args.out / "summary.json").write_text(json.dumps(document, indent=1))
    return 0 if all(v.difference is not None for v in verdicts) else 1


def _real_name(args: argparse.Namespace) -> str:
    if args.dra:
        scored = ", nodes scored by the extender" if args.dra_scoring else ""
        return f"kube-scheduler + DRA claims (slices {args.dra}{scored})"
    return "kube-scheduler + gpushare extender"


def _plot(
    path: Path,
    real: FloatArray,
    *,
    simulated: FloatArray,
    band: SeedBand,
    policy: str,
    seeds: Sequence[int],
    workload: Workload,
    args: argparse.Namespace,
) -> None:
    import matplotlib  # noqa: PLC0415 (the sim extra)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    x = np.arange(MAX_PERCENT + 1)
    figure, axis = plt.subplots(figsize=(8, 5), constrained_layout=True)
    mode = "like the cluster" if args.simulator == "like-cluster" else "ideal"
    axis.fill_between(
        x, band.low, band.high, alpha=0.3, linewidth=0,
        label=f"gpushare simulate ({mode}), seeds {seeds_text(seeds)}",
    )  # fmt: skip
    axis.plot(x, simulated, label=f"gpushare simulate ({mode}), seed {args.seed}", linewidth=2)
    axis.plot(x, real, label=f"{_real_name(args)} (kwok)", linestyle="--")
    axis.plot(x, np.clip(100 - x, 0, None), color="grey", linewidth=0.8, label="ideal")
    axis.set_xlabel("arrived GPU workload (% of capacity)")
    axis.set_ylabel("unallocated GPU (%)")
    axis.set_title(f"{workload.label}, {policy}, stream seed {args.seed}")
    axis.legend()
    figure.savefig(path, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
