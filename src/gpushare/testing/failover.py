"""Leader failover under load: extender replicas as processes, the leader SIGKILLed mid-burst.

:func:`run_failover` (used by ``tests/cluster/test_extender_failover.py`` and
``bench/failover.py``) runs, on a real control plane:

* ``plan.nodes`` kwok nodes with ``plan.gpus_per_node`` GPUs of ``plan.gpu_gib`` GiB;
* ``plan.replicas`` extender **processes** (``gpushare extender --leader-elect``, default lease
  timing unless the plan says otherwise) behind a :class:`~gpushare.testing.service_proxy.
  ServiceProxy` — the stand-in for the extender's Service, since kube-scheduler's extender
  configuration has one ``urlPrefix``;
* a kube-scheduler profile calling the proxy, with kube-scheduler's default pod backoff;
* ``plan.pods`` GPU pods of mixed sizes (seeded), created in one burst, asking more than fits.

While they are scheduled, the replica holding the Lease is killed with SIGKILL ``plan.kills``
times, each time once a random number of pods has been bound and after a random delay; the
killed replica is started again at once (as the kubelet would restart its container) under a
new identity. For each kill the time from the kill to the next successful bind (the earliest
``ALIYUN_COM_GPU_MEM_ASSUME_TIME`` after it) is measured. At the end the run waits until every
pod is bound or fits nowhere and returns the outcome read from the pods' annotations
(:mod:`gpushare.testing.outcome`), with every violation :func:`~gpushare.testing.outcome.judge`
finds.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Namespace, Pod

from gpushare.kube.codec import MemoryUnit
from gpushare.testing.controlplane import (
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    wait_for,
)
from gpushare.testing.metrics import sample_sum
from gpushare.testing.nodes import create_nodes, delete_nodes, gpu_node
from gpushare.testing.outcome import Ask, Outcome, Spec, judge, make_pod, read_outcome
from gpushare.testing.pods import delete_namespace
from gpushare.testing.rbac import EXTENDER_RULES
from gpushare.testing.service_proxy import ServiceProxy

__all__ = [
    "Burst",
    "FailoverPlan",
    "FailoverResult",
    "Replica",
    "bound_count",
    "replicated_extenders",
    "run_failover",
    "start_burst",
    "workload",
]

PREFIX = "/gpushare-scheduler"
LEASE_NAMESPACE = "kube-system"


@dataclass(frozen=True)
class FailoverPlan:
    """What to run (module doc). ``lease_args``: extra ``--leader-elect-*`` arguments (none:
    the defaults); ``settle_s``: how long the end state may take after the last kill;
    ``create_interval_s``: a pause between two pod creations of the burst (0: as fast as the
    API server takes them), so that a small burst still lasts past the kills: on an idle
    machine 100 pods were created and bound in ~2 s, before a kill timed at up to 66 bound
    pods plus up to 1 s."""

    nodes: int = 10
    gpus_per_node: int = 8
    gpu_gib: int = 16
    pods: int = 100
    replicas: int = 3
    kills: int = 1
    seed: int = 20261123
    lease_args: tuple[str, ...] = ()
    settle_s: float = 180.0
    name: str = "failover"
    create_interval_s: float = 0.0


@dataclass
class Kill:
    """One SIGKILL: when (wall clock, ns), whom, how many pods were bound then, whether the
    burst was still creating pods then, and the time to the next successful bind (seconds;
    ``None`` if none came)."""

    at_ns: int
    identity: str
    bound_before: int
    mid_burst: bool = False
    failover_s: float | None = None


@dataclass
class FailoverResult:
    """The run's outcome, its violations, the kills and phase timings (seconds)."""

    outcome: Outcome
    problems: list[str]
    kills: list[Kill]
    timings: dict[str, float] = field(default_factory=dict)
    forwarded: int = 0  # verbs the replicas alive at the end forwarded to a leader

    @property
    def failovers_s(self) -> list[float]:
        return [k.failover_s for k in self.kills if k.failover_s is not None]


def workload(count: int, seed: int) -> list[Spec]:
    """``count`` pods (seeded): mostly one container of 1–16 GiB, some with two or three small
    containers, some over two GPUs, and a few larger than any 16 GiB GPU."""
    rng = random.Random(seed)
    sizes = [1, 2, 3, 4, 4, 6, 8, 8, 10, 12, 12, 16]
    specs: list[Spec] = []
    for i in range(count):
        name = f"p{i:04d}"
        if i % 97 == 50:
            asks: tuple[Ask, ...] = (Ask("main", 1, 32),)  # fits no GPU
        elif i % 10 == 3:
            n = rng.choice([2, 3])
            asks = tuple(Ask(f"c{j}", 1, rng.choice([1, 2, 3, 4, 6])) for j in range(n))
        elif i % 25 == 7:
            asks = (Ask("main", 2, rng.choice([4, 8])),)
        else:
            asks = (Ask("main", 1, rng.choice(sizes)),)
        specs.append(Spec(name, asks))
    return specs


class Replica:
    """One extender process on a fixed loopback port; restartable under a new identity. With
    ``lease`` ``None`` it runs without leader election (the only extender of its scheduler);
    ``args``: more ``gpushare extender`` arguments."""

    def __init__(
        self,
        index: int,
        port: int,
        kubeconfig: Path,
        lease: str | None,
        root: Path,
        *,
        args: Sequence[str] = (),
    ) -> None:
        self.args = tuple(args)
        self.index = index
        self.port = port
        self.kubeconfig = kubeconfig
        self.lease = lease
        self.root = root
        self.generation = 0
        self.identity = ""
        self.process: ManagedProcess | None = None

    def start(self, lease_args: tuple[str, ...] = ()) -> None:
        self.generation += 1
        self.identity = f"replica{self.index}-gen{self.generation}"
        election = (
            (
                "--leader-elect",
                f"--leader-elect-identity={self.identity}",
                f"--leader-elect-resource-namespace={LEASE_NAMESPACE}",
                f"--leader-elect-resource-name={self.lease}",
                *lease_args,
            )
            if self.lease is not None
            else ()
        )
        argv = gpushare_argv(
            "extender",
            f"--kubeconfig={self.kubeconfig}",
            "--host=127.0.0.1",
            f"--port={self.port}",
            "--handshake-timeout=0",  # no kubelet starts pods on kwok nodes
            *election,
            *self.args,
        )
        self.process = ManagedProcess(self.identity, argv, self.root / self.identity).start()

    def ready(self) -> bool:
        """Whether the process answers ``GET /readyz`` with 200 (caches synced)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(f"http://127.0.0.1:{self.port}/readyz", timeout=2.0) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def kill(self) -> int:
        """SIGKILL the process (group); the wall-clock time of the signal (ns)."""
        assert self.process is not None
        assert self.process.pid is not None
        at_ns = time.time_ns()
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.stop()  # reaps it
        return at_ns

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


def _holder(kube: Client, lease: str) -> str:
    try:
        obj = kube.get(Lease, lease, namespace=LEASE_NAMESPACE)
    except Exception:  # not created yet
        return ""
    return (obj.spec.holderIdentity if obj.spec is not None else None) or ""


def bound_count(kube: Client, namespace: str) -> int:
    """How many pods of ``namespace`` are bound (``spec.nodeName`` set)."""
    return sum(1 for p in kube.list(Pod, namespace=namespace) if p.spec and p.spec.nodeName)


@dataclass
class Burst:
    """Pods being created in a thread (:func:`start_burst`): how many creations were sent
    (``sent``), those the API server refused (``"HTTP <status>: <answer>"``) and, once done, how
    long the burst took (seconds from its start)."""

    thread: threading.Thread
    failures: list[str] = field(default_factory=list)
    took_s: float | None = None
    sent: int = 0

    def running(self) -> bool:
        """Whether pods are still being created."""
        return self.thread.is_alive()

    def join(self) -> None:
        self.thread.join()


def start_burst(
    plane: ControlPlane,
    namespace: str,
    bodies: Sequence[Mapping[str, object]],
    *,
    interval_s: float = 0.0,
    name: str = "burst",
) -> Burst:
    """Create the pods ``bodies`` (pod JSON) in ``namespace`` one after the other, ``interval_s``
    apart (0: as fast as the API server takes them), in a daemon thread ``name``, so that the
    burst goes on while a test kills an extender. Plain HTTP (``ControlPlane.api_request``):
    lightkube's decoding is not safe in two threads at once."""
    path = f"/api/v1/namespaces/{namespace}/pods"

    def create_all() -> None:
        start = time.monotonic()
        for body in bodies:
            status, answer = plane.api_request("POST", path, body)
            burst.sent += 1
            if status != 201:
                burst.failures.append(f"HTTP {status}: {answer}")
            if interval_s:
                time.sleep(interval_s)
        burst.took_s = time.monotonic() - start

    burst = Burst(threading.Thread(target=create_all, name=name, daemon=True))
    burst.thread.start()
    return burst


def _next_bind_after(outcome: Outcome, at_ns: int) -> int | None:
    later = [t for t in outcome.assume_time_ns.values() if t > at_ns]
    return min(later) if later else None


@contextlib.contextmanager
def replicated_extenders(
    plane: ControlPlane, plan: FailoverPlan, log: Callable[[str], None]
) -> Iterator[tuple[Client, list[Replica], str, str]]:
    """``plan``'s nodes, namespace, replicas, Service stand-in and kube-scheduler, for the
    ``with`` body: ``(admin client, replicas, Lease name, namespace)``; all removed after."""
    group = {"gpushare.io/test-group": plan.name}
    namespace = plan.name
    nodes = [f"{plan.name}-n{i:03d}" for i in range(plan.nodes)]
    lease = f"gpushare-extender-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as stack:
        kube = stack.enter_context(plane.client())
        create_nodes(
            kube,
            [
                gpu_node(n, [plan.gpu_gib] * plan.gpus_per_node, unit=MemoryUnit.GIB, labels=group)
                for n in nodes
            ],
            timeout=300.0,
        )
        stack.callback(delete_nodes, kube, nodes)
        kube.create(Namespace(metadata=ObjectMeta(name=namespace)))
        stack.callback(delete_namespace, kube, namespace)
        kubeconfig = plane.service_account_kubeconfig(
            f"gpushare-{plan.name}", LEASE_NAMESPACE, EXTENDER_RULES
        )
        replicas = [
            Replica(i, port, kubeconfig, lease, plane.root / f"{plan.name}-replicas")
            for i, port in enumerate(free_ports(plan.replicas))
        ]
        for replica in replicas:
            replica.start(plan.lease_args)
            stack.callback(replica.stop)
        proxy = stack.enter_context(ServiceProxy([("127.0.0.1", r.port) for r in replicas]))
        wait_for(
            "a ready replica and a Lease holder",
            lambda: (proxy.ready and _holder(kube, lease)) or None,
            90,
        )
        stack.enter_context(
            plane.scheduler(
                f"kube-scheduler-{plan.name}",
                profiles=[{"schedulerName": f"gpushare-{plan.name}"}],
                extenders=[gpushare_extender(proxy.url + PREFIX)],
            )
        )
        log(f"{plan.replicas} replicas ready, leader {_holder(kube, lease)}")
        yield kube, replicas, lease, namespace


def run_failover(
    plane: ControlPlane, plan: FailoverPlan, log: Callable[[str], None] = print
) -> FailoverResult:
    """Run ``plan`` on ``plane`` (module doc)."""
    rng = random.Random(plan.seed)
    specs = workload(plan.pods, plan.seed)
    by_name = {s.name: s for s in specs}
    node_gpus = {
        f"{plan.name}-n{i:03d}": [plan.gpu_gib] * plan.gpus_per_node for i in range(plan.nodes)
    }
    timings: dict[str, float] = {}
    started = time.monotonic()
    with replicated_extenders(plane, plan, log) as (kube, replicas, lease, namespace):
        timings["setup"] = time.monotonic() - started
        # Kill points: distinct bound counts in the first two thirds of what can be bound.
        capacity_pods = min(plan.pods, plan.nodes * plan.gpus_per_node * plan.gpu_gib // 8)
        span = range(max(1, capacity_pods // 10), max(2, capacity_pods * 2 // 3))
        thresholds = sorted(rng.sample(span, plan.kills))
        scheduler_name = f"gpushare-{plan.name}"
        selector = {"gpushare.io/test-group": plan.name}

        bodies = [
            make_pod(
                spec, namespace=namespace, scheduler_name=scheduler_name, node_selector=selector
            ).to_dict()
            for spec in specs
        ]
        burst = start_burst(  # the burst goes on while replicas are killed
            plane, namespace, bodies, interval_s=plan.create_interval_s, name="failover-burst"
        )
        kills: list[Kill] = []
        for index, threshold in enumerate(thresholds):
            # At the threshold, or at the latest once (index + 1) / (kills + 1) of the burst
            # is sent, however slowly a loaded machine binds: each kill lands mid-burst.
            latest = (index + 1) * plan.pods // (plan.kills + 1)

            def enough(t: int = threshold, sent: int = latest) -> bool | None:
                return bound_count(kube, namespace) >= t or burst.sent >= sent or None

            wait_for(f"{threshold} pods bound", enough, plan.settle_s)
            time.sleep(rng.uniform(0.0, 1.0))
            holder = _holder(kube, lease)
            victim = next((r for r in replicas if r.identity == holder), None)
            if victim is None:
                raise ControlPlaneError(f"the Lease holder {holder!r} is none of the replicas")
            bound = bound_count(kube, namespace)
            kill = Kill(victim.kill(), holder, bound, mid_burst=burst.running())
            kills.append(kill)
            log(f"SIGKILL {holder} with {bound} pods bound, burst running: {kill.mid_burst}")
            victim.start(plan.lease_args)  # the kubelet restarts the container

            def next_bind(k: Kill = kill) -> int | None:
                return _next_bind_after(read_outcome(kube, namespace, by_name, node_gpus), k.at_ns)

            try:
                first = wait_for("a bind after the kill", next_bind, 60.0)
            except ControlPlaneError:
                log("no bind within 60 s of the kill")
                continue
            kill.failover_s = (first - kill.at_ns) / 1e9
            log(f"  next bind {kill.failover_s:.2f}s later, leader now {_holder(kube, lease)}")

        burst.join()
        for failure in burst.failures:
            log(f"creating a pod failed: {failure}")
        timings[f"create {plan.pods}"] = burst.took_s or 0.0
        t1 = time.monotonic()

        def settled() -> bool | None:
            outcome = read_outcome(kube, namespace, by_name, node_gpus)
            if len(outcome.bound) + len(outcome.pending) != len(specs):
                return None
            return not judge(outcome, by_name, node_gpus) or None

        with contextlib.suppress(ControlPlaneError):  # the problems say what is wrong
            wait_for("every pod bound or fitting nowhere", settled, plan.settle_s)
        timings["settle"] = time.monotonic() - t1
        timings["total"] = time.monotonic() - started
        outcome = read_outcome(kube, namespace, by_name, node_gpus)
        problems = judge(outcome, by_name, node_gpus)
        forwarded = sum(_forwarded(r.port) for r in replicas)
        return FailoverResult(outcome, problems, kills, timings, forwarded)


def _forwarded(port: int) -> int:
    """``gpushare_extender_requests_total{outcome="forwarded"}`` of one replica, summed."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        forwarded = {"outcome": "forwarded"}
        return int(sample_sum(url, "gpushare_extender_requests_total", forwarded, timeout_s=5.0))
    except OSError:
        return 0
