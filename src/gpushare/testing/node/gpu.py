"""gpushare on a real node: ``gpushare extender`` and ``gpushare device-plugin`` as processes, a
kube-scheduler that calls the extender, pod builders, and the invariants checked after every
step (no GPU over capacity; the extender's ledger equals the pods' annotations).

:class:`GpuStack` is what the real-node tests use; the image/chart tests run the same two
programs as pods instead and can still use :func:`gpu_pod`, :func:`container_env` and
:func:`check_ledger`.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.models.apps_v1 import DeploymentSpec
from lightkube.models.core_v1 import Container, PodSpec, PodTemplateSpec, ResourceRequirements
from lightkube.models.meta_v1 import LabelSelector, ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.core_v1 import Node, Pod

from gpushare.deviceplugin.dialects import resources_for
from gpushare.deviceplugin.inventory import parse_fake_gpus
from gpushare.kube import nodepods, nodes, unhealthy
from gpushare.kube.codec import (
    GPU_COUNT_ANNOTATION,
    GPU_MEM,
    MemoryUnit,
    pod_allocation,
    pod_finished,
)
from gpushare.testing.controlplane import (
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    wait_for,
)
from gpushare.testing.live_extender import http_get
from gpushare.testing.metrics import sample_sum
from gpushare.testing.node.host import DEVICE_PLUGIN_DIR
from gpushare.testing.node.images import TEST_IMAGE
from gpushare.testing.node.node import RealNode

SCHEDULER_NAME = "gpushare-node-scheduler"
"""The ``schedulerName`` of pods placed through gpushare's extender on the real node."""
EXTENDER_PREFIX = "/gpushare-scheduler"
PLUGIN_RULES = [
    PolicyRule(
        apiGroups=list(r["apiGroups"]), resources=list(r["resources"]), verbs=list(r["verbs"])
    )
    for r in (*nodes.RBAC_RULES, *nodepods.RBAC_RULES, *unhealthy.RBAC_RULES)
]
PRINT_ENV = 'trap "exit 0" TERM; env | sort; while :; do sleep 1; done'
"""A container command: print the environment once (read back with ``kubectl logs``), then
idle until SIGTERM (sh as PID 1 ignores it otherwise)."""


# ---- pods -------------------------------------------------------------------------------


def runnable(pod: Mapping[str, Any], namespace: str) -> Pod:
    """``pod`` (JSON, e.g. a dialect's pod as its system's docs write it) with only what this
    machine needs to run it: ``namespace``, no fixed UID, the local test image (no registry)
    printing its env (:data:`PRINT_ENV`), a short grace period."""
    body = json.loads(json.dumps(pod))
    body["metadata"]["namespace"] = namespace
    body["metadata"].pop("uid", None)
    body["spec"]["terminationGracePeriodSeconds"] = 2
    for container in body["spec"]["containers"]:
        container.update(image=TEST_IMAGE, imagePullPolicy="Never", command=["sh", "-c", PRINT_ENV])
    return cast(Pod, Pod.from_dict(body))


def gpu_container(name: str, gpu_mem: int, *, command: str = PRINT_ENV) -> Container:
    """A test-image container asking ``gpu_mem`` units of ``aliyun.com/gpu-mem`` (0: none)."""
    limits = {GPU_MEM: str(gpu_mem)} if gpu_mem else None
    return Container(
        name=name,
        image=TEST_IMAGE,
        imagePullPolicy="Never",
        command=["sh", "-c", command],
        resources=ResourceRequirements(limits=limits),
    )


def gpu_pod_spec(
    containers: Mapping[str, int], *, init_containers: Mapping[str, int] | None = None
) -> PodSpec:
    """Containers (name → gpu-mem units, in order) through gpushare's scheduler, 2 s grace."""
    return PodSpec(
        schedulerName=SCHEDULER_NAME,
        terminationGracePeriodSeconds=2,
        containers=[gpu_container(n, units) for n, units in containers.items()],
        initContainers=[
            gpu_container(n, units, command="env | sort")
            for n, units in (init_containers or {}).items()
        ]
        or None,
    )


def gpu_pod(
    namespace: str,
    name: str,
    containers: Mapping[str, int],
    *,
    gpu_count: Mapping[str, int] | None = None,
    init_containers: Mapping[str, int] | None = None,
) -> Pod:
    """A bare GPU pod; ``gpu_count`` spreads a container over several GPUs
    (``gpushare.io/gpu-count``)."""
    annotations = {GPU_COUNT_ANNOTATION: json.dumps(dict(gpu_count))} if gpu_count else None
    return Pod(
        metadata=ObjectMeta(name=name, namespace=namespace, annotations=annotations),
        spec=gpu_pod_spec(containers, init_containers=init_containers),
    )


def gpu_deployment(namespace: str, name: str, replicas: int, gpu_mem: int) -> Deployment:
    """``replicas`` equal one-container pods of ``gpu_mem`` units each."""
    labels = {"app": name}
    return Deployment(
        metadata=ObjectMeta(name=name, namespace=namespace),
        spec=DeploymentSpec(
            replicas=replicas,
            selector=LabelSelector(matchLabels=labels),
            template=PodTemplateSpec(
                metadata=ObjectMeta(labels=labels), spec=gpu_pod_spec({"main": gpu_mem})
            ),
        ),
    )


def container_env(client: Client, pod: str, namespace: str, container: str) -> dict[str, str]:
    """The ``env`` a :data:`PRINT_ENV` container printed, read through the API server (the
    same path as ``kubectl logs``: kube-apiserver → kubelet → containerd's log file); retried
    while kubelet answers 404 (right after its restart) or the log is still empty."""

    def read() -> dict[str, str] | None:
        env: dict[str, str] = {}
        try:
            for line in client.log(pod, namespace=namespace, container=container):
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and key.isidentifier():
                    env[key] = value
        except ApiError:  # 404 for a few seconds after a kubelet restart: it re-syncs its pods
            return None
        return env or None

    return wait_for(f"logs of {namespace}/{pod}/{container}", read, 60.0)


# ---- invariants -------------------------------------------------------------------------


def annotated_usage(client: Client, node: str) -> dict[str, dict[int, int]]:
    """What the pods' annotations say: pod ``ns/name`` → GPU index → units, for every pod on
    ``node`` that still holds its GPUs (bound, not Succeeded/Failed)."""
    usage: dict[str, dict[int, int]] = {}
    for pod in client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
        obj = pod.to_dict()
        if pod_finished(obj):
            continue
        allocation = pod_allocation(obj)
        if allocation is not None:
            usage[allocation.pod] = allocation.per_gpu()
    return usage


def ledger_usage(report: Mapping[str, Any]) -> dict[str, dict[int, int]]:
    """The same from the extender's ``/inspect/<node>`` report."""
    usage: dict[str, dict[int, int]] = {}
    for dev in report["devs"]:
        for pod in dev["pods"]:
            usage.setdefault(f"{pod['namespace']}/{pod['name']}", {})[dev["id"]] = pod["usedGPU"]
    return usage


@dataclass
class GpuStack:
    """``gpushare extender`` and ``gpushare device-plugin --fake-gpus FAKE_GPUS`` as processes,
    and a kube-scheduler (:data:`SCHEDULER_NAME`) that calls the extender, on ``node``.

    The plugin runs with a ServiceAccount holding exactly its documented rules and the real
    kubelet's ``/var/lib/kubelet/device-plugins/``; the extender with the admin identity.
    ``dialects`` (e.g. ``("tencent", "hami")``): the plugin also serves those dialects'
    resources (``--dialects``) and kube-scheduler sends their pods to the extender.
    ``policy``: the extender's ``--policy``; ``binpack`` (Alibaba's rule) by default, because
    the node tests' expected GPUs are its choices (shares packed on one GPU, leaving the other
    empty for a whole-GPU pod); the default policy, ``fgd-spare``, is exercised by the cluster
    tier: ``tests/cluster/test_extender_failover.py`` places 100 pods through the command as
    shipped, behind the real kube-scheduler, and finds no GPU overcommitted.
    """

    plane: ControlPlane
    node: RealNode
    fake_gpus: str = "2x16GiB:T4"
    dialects: tuple[str, ...] = ()
    policy: str = "binpack"
    share_library: Path | None = None
    """The share-view library the plugin installs and gives shared containers
    (``--share-library``; ``None``: no view)."""
    workdir: Path = field(init=False)
    extender: ManagedProcess = field(init=False)
    plugin: ManagedProcess = field(init=False)
    extender_port: int = field(init=False)
    metrics_port: int = field(init=False)
    _plugin_argv: list[str] = field(init=False)
    _stack: contextlib.ExitStack = field(init=False, default_factory=contextlib.ExitStack)

    @contextlib.contextmanager
    def running(self) -> Iterator[GpuStack]:
        """Start everything, wait until the node advertises the GPUs; stop it all on exit."""
        self.workdir = self.node.root / "gpushare"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.extender_port, self.metrics_port = free_ports(2)
        with self._stack:
            self.extender = ManagedProcess(
                "gpushare-extender",
                gpushare_argv(
                    "extender", "--host", "127.0.0.1", "--port", str(self.extender_port),
                    "--kubeconfig", str(self.plane.kubeconfig), "--log-level", "debug",
                    "--policy", self.policy,
                ),
                self.workdir,
            ).start()  # fmt: skip
            self._stack.callback(self._stop, self.extender)
            wait_for(
                "extender /readyz",
                lambda: self.extender_get("/readyz")[0] == 200 or None,
                60.0,
                processes=[self.extender],
            )
            kubeconfig = self.plane.service_account_kubeconfig(
                "gpushare-device-plugin", "kube-system", PLUGIN_RULES
            )
            self._plugin_argv = gpushare_argv(
                "device-plugin", "--node-name", self.node.name, "--fake-gpus", self.fake_gpus,
                "--kubeconfig", str(kubeconfig), "--metrics-port", str(self.metrics_port),
                "--log-level", "debug",
            )  # fmt: skip
            if self.dialects:
                self._plugin_argv += ["--dialects", ",".join(self.dialects)]
            if self.share_library is not None:
                self._plugin_argv += [
                    "--share-library", str(self.share_library),
                    "--share-library-dir", str(self.workdir / "share-lib"),
                ]  # fmt: skip
            self.start_plugin()
            self._stack.callback(lambda: self._stop(self.plugin))
            self._stack.enter_context(
                self.plane.scheduler(
                    "kube-scheduler-gpushare",
                    profiles=[{"schedulerName": SCHEDULER_NAME}],
                    extenders=[
                        gpushare_extender(
                            f"http://127.0.0.1:{self.extender_port}{EXTENDER_PREFIX}",
                            dialects=bool(self.dialects),
                        )
                    ],
                )
            )
            yield self

    def _stop(self, proc: ManagedProcess) -> None:
        proc.stop()
        self.plane.keep_log(proc)

    # ---- the device plugin -----------------------------------------------------------

    def start_plugin(self, *, wait_capacity: bool = True) -> ManagedProcess:
        """Start ``gpushare device-plugin``; when ``wait_capacity``, wait until kubelet holds
        this process's devices as healthy (:meth:`wait_devices_taken`) and the Node's
        allocatable gpu-mem is the fake GPUs' total."""
        started = time.time()
        self.plugin = ManagedProcess("gpushare-device-plugin", self._plugin_argv, self.workdir)
        self.plugin.start()
        if wait_capacity:
            self.wait_devices_taken(since=started)
            self.wait_capacity()
        return self.plugin

    def wait_devices_taken(self, *, since: float, timeout_s: float = 60.0) -> None:
        """Wait until kubelet's device manager took a device list sent after ``since`` (a
        ``time.time()``): it rewrites its checkpoint (``kubelet_internal_checkpoint``:
        ``Data.RegisteredDevices``, the healthy devices by resource) on every ListAndWatch
        update. The Node's allocatable cannot tell: kubelet posts it every 10 s, so right after
        a plugin restart it still shows the old plugin's devices while kubelet refuses GPU pods
        ("no healthy devices present", UnexpectedAdmissionError)."""
        checkpoint = DEVICE_PLUGIN_DIR / "kubelet_internal_checkpoint"
        want = self.total_units()

        def taken() -> bool | None:
            try:
                if checkpoint.stat().st_mtime < since:
                    return None
                data = json.loads(checkpoint.read_text())["Data"]
            except (OSError, ValueError, KeyError):  # not written yet, or mid-write
                return None
            return len(data.get("RegisteredDevices", {}).get(GPU_MEM) or ()) == want or None

        procs = [p for p in (self.plugin, self.node.kubelet) if p is not None]
        what = f"kubelet's checkpoint: {want} healthy {GPU_MEM}"
        wait_for(what, taken, timeout_s, processes=procs)

    def stop_plugin(self) -> None:
        self.plugin.stop()

    @contextlib.contextmanager
    def plugin_flags(self, *flags: str) -> Iterator[ManagedProcess]:
        """The plugin restarted with ``flags`` added (e.g. ``--cdi`` pointed at a stand-in
        driver) for the block, and as it was after it, whatever happened; each waits for
        kubelet to hold its devices."""
        before = list(self._plugin_argv)
        self.stop_plugin()
        self._plugin_argv = [*before, *flags]
        try:
            yield self.start_plugin()
        finally:
            self.stop_plugin()
            self.plane.keep_log(self.plugin)
            self._plugin_argv = before
            self.start_plugin()

    def total_units(self) -> int:
        """The ``aliyun.com/gpu-mem`` devices the plugin advertises (its default unit, GiB)."""
        return sum(gpu.units(MemoryUnit.GIB) for gpu in parse_fake_gpus(self.fake_gpus))

    def advertised(self) -> dict[str, str]:
        """What the node's allocatable must say once kubelet has every resource the plugin
        serves: ``aliyun.com/gpu-mem`` and the dialects' resources, their device counts."""
        gpus = parse_fake_gpus(self.fake_gpus)
        want = {GPU_MEM: str(self.total_units())}
        for served in resources_for(self.dialects):
            if served.per_gpu is not None:
                want[served.resource] = str(sum(served.per_gpu(gpu) for gpu in gpus))
        return want

    def wait_capacity(self, timeout_s: float = 60.0) -> None:
        """Wait until the running kubelet has reported every resource the plugin serves
        (:meth:`advertised`): a Node status it posted after it started (the Ready condition's
        heartbeat), not the one a kubelet before it left, which a restarted kubelet then
        replaces with zeros for the resources whose plugin has not registered again yet."""
        want = self.advertised()
        started = self.node.kubelet_started_s

        procs = [p for p in (self.plugin, self.node.kubelet) if p is not None]
        with self.plane.client() as client:

            def reported() -> bool | None:
                node = client.get(Node, self.node.name)
                status = node.status
                allocatable = (status.allocatable if status else None) or {}
                ready = [c for c in (status.conditions if status else None) or []
                         if c.type == "Ready"]  # fmt: skip
                beat = ready[0].lastHeartbeatTime if ready else None
                fresh = beat is not None and beat.timestamp() > started
                return (fresh and all(allocatable.get(k) == v for k, v in want.items())) or None

            what = f"node allocatable {want} reported by the running kubelet"
            wait_for(what, reported, timeout_s, processes=procs)

    def allocate_calls(self) -> int:
        """Successful Allocate calls the current plugin process served (its ``/metrics``)."""
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        ok = sample_sum(url, "gpushare_device_plugin_allocate_requests_total", {"outcome": "ok"})
        return int(ok)

    def registrations(self) -> int:
        """How often this plugin process registered with kubelet (its log)."""
        return self.plugin.log_path.read_text().count("registered aliyun.com/gpu-mem")

    # ---- the extender ----------------------------------------------------------------

    def extender_get(self, path: str) -> tuple[int, Any]:
        """``GET path`` on the extender process (:func:`~gpushare.testing.live_extender.http_get`:
        status and JSON body, ``(0, None)`` when nothing answers)."""
        return http_get(f"http://127.0.0.1:{self.extender_port}{path}")

    def inspect_node(self) -> dict[str, Any]:
        status, report = self.extender_get(f"{EXTENDER_PREFIX}/inspect/{self.node.name}")
        if status != 200:
            raise ControlPlaneError(f"/inspect/{self.node.name} answered {status}")
        return dict(report)

    def check_ledger(self, client: Client, timeout_s: float = 30.0) -> dict[str, dict[int, int]]:
        """Wait until the extender's ledger equals the pods' annotations (watch lag), then
        check that no GPU holds more than its capacity. Returns the usage by pod."""

        def agreed() -> tuple[dict[str, Any], dict[str, dict[int, int]]] | None:
            report = self.inspect_node()
            annotated = annotated_usage(client, self.node.name)
            return (report, annotated) if ledger_usage(report) == annotated else None

        try:
            report, annotated = wait_for(
                "ledger == annotations", agreed, timeout_s, processes=[self.extender]
            )
        except ControlPlaneError:
            report = self.inspect_node()
            raise AssertionError(
                f"ledger {ledger_usage(report)} != annotations "
                f"{annotated_usage(client, self.node.name)}"
            ) from None
        for dev in report["devs"]:
            if dev["usedGPU"] > dev["totalGPU"]:
                raise AssertionError(f"GPU {dev['id']} over capacity: {dev}")
        status, cluster = self.extender_get(f"{EXTENDER_PREFIX}/inspect")
        if status != 200:
            raise ControlPlaneError(f"/inspect answered {status}")
        if cluster["violations"]:
            raise AssertionError(f"ledger violations: {cluster['violations']}")
        return annotated


def delete_pods(client: Client, namespace: str, names: Sequence[str] | None = None) -> None:
    """Delete pods (all in ``namespace`` when ``names`` is None), grace 0, and wait until gone."""
    targets = names
    if targets is None:
        targets = [
            p.metadata.name
            for p in client.list(Pod, namespace=namespace)
            if p.metadata and p.metadata.name
        ]
    for name in targets:
        with contextlib.suppress(ApiError):
            client.delete(Pod, name, namespace=namespace, grace_period=0)

    def gone() -> bool | None:
        left = {p.metadata.name for p in client.list(Pod, namespace=namespace) if p.metadata}
        return not (left & set(targets)) or None

    wait_for(f"pods {targets} deleted", gone, 60.0)
