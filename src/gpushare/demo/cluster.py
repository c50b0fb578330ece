"""The demo cluster: the project's real components on this machine, kept running in the
background until ``gpushare demo down``.

:func:`serve` (run detached by ``python -m gpushare.demo up``) starts, in this order:

* the test control plane (``gpushare.testing.controlplane.ControlPlane``): etcd,
  kube-apiserver, kube-controller-manager (Deployments, ReplicaSets, ServiceAccounts), the
  default kube-scheduler and kwok (the kubelet stand-in that runs the pods of fake nodes);
* kwok GPU nodes (:data:`NODES`): GPUs of four models and sizes, in GiB; with ``dialects``
  (``up --dialects``) each advertises the gpu-manager and HAMi resources too, as a device plugin
  with ``--dialects tencent,hami`` (split count 10) would. Without it the demo is the chart with
  its defaults, which serve no dialect (docs/compute.md, "What an operator configures");
* the device plugin's handshake record for the kwok nodes
  (``gpushare.testing.kwokstart.KwokDevicePlugin``): kwok starts pods without kubelet's
  Allocate, so this marks each bound GPU pod started (``ALIYUN_COM_GPU_MEM_ASSIGNED: "true"``) as
  the device plugin does once it has answered its containers; ``kubectl inspect gpushare`` then
  shows them ``assigned`` rather than ``starting`` for ever;
* ``gpushare extender`` as its own process on the admin kubeconfig (``--policy``, default
  :data:`DEFAULT_POLICY`), ``--handshake-timeout 0`` (no kubelet admits the pods of kwok nodes,
  so there is no Allocate order to protect: docs/deviceplugin.md, "The handshake");
* a second kube-scheduler, ``gpushare-scheduler``, wired to the extender as the chart's second
  scheduler is (filter, prioritize, bind and preempt; ``aliyun.com/gpu-mem`` managed, and the
  dialects' resources with ``dialects`` as the chart's ``scheduler.dialectResources`` lists
  them; ``gpushare.testing.controlplane.gpushare_extender``);
* with ``real_node`` (``up --real-node``), a real kubelet + containerd node with
  ``gpushare device-plugin`` over fake GPUs (``gpushare.demo.realnode``); the control plane then
  listens on the node host's bridge address, as the real-node tests run it.

It then writes ``state.json`` in its folder (its PID, the kubeconfig, the extender's URL, the
kubectl it was built with, whether the dialects are on) and waits for SIGTERM or SIGINT, when
it stops everything and removes the file and the kubeconfig (:data:`KUBECONFIG`), whose
certificates are gone with the control plane. Everything it logs goes to ``demo.log`` and the
components' logs to ``logs/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightkube.resources.core_v1 import ServiceAccount

from gpushare.demo.realnode import REAL_GPUS, REAL_NODE, start_real_node
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.controlplane import (
    Binaries,
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    http_ok,
    wait_until,
)
from gpushare.testing.kwokstart import KwokDevicePlugin
from gpushare.testing.node import NodeHost, check_prerequisites
from gpushare.testing.nodes import FakeGpu, create_nodes, gpu_node

__all__ = [
    "DEFAULT_POLICY",
    "DIALECTS",
    "KUBECONFIG",
    "NODES",
    "SCHEDULER_NAME",
    "DemoNode",
    "read_state",
    "serve",
]

SCHEDULER_NAME = "gpushare-scheduler"
STATE = "state.json"
KUBECONFIG = "kubeconfig"
"""The demo's admin kubeconfig in its folder: written once the cluster is up, removed when it
stops (its certificates go with the control plane, so a kept file would only fail)."""
DEFAULT_POLICY = "binpack"
"""The demo's placement policy: the examples land as docs/usage.md describes them (the binpack
demo on one GPU, the notebooks on one card); ``--policy fgd-spare`` shows the default."""


@dataclass(frozen=True)
class DemoNode:
    """One kwok node: ``count`` GPUs of ``model`` with ``memory_gib`` each."""

    name: str
    model: str
    count: int
    memory_gib: int


NODES = (
    DemoNode("demo-t4-0", "Tesla-T4", 1, 15),
    DemoNode("demo-a10-0", "NVIDIA-A10", 2, 22),
    DemoNode("demo-v100-0", "Tesla-V100-SXM2-16GB", 2, 16),
    DemoNode("demo-a100-0", "NVIDIA-A100-SXM4-40GB", 4, 40),
)
"""The demo's GPU nodes (models as the device plugin publishes them: spaces as dashes)."""

DIALECTS = ("tencent", "hami")
"""The request dialects ``up --dialects`` serves: the chart's ``devicePlugin.dialects``."""


def _log(message: str) -> None:
    print(f"[demo] {time.strftime('%H:%M:%S')} {message}", flush=True)


def read_state(directory: Path) -> dict[str, Any] | None:
    """The running demo's ``state.json`` in ``directory``, or ``None`` when there is none or
    its process is gone."""
    path = directory / STATE
    try:
        state: dict[str, Any] = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def serve(
    directory: Path,
    policy: str = DEFAULT_POLICY,
    *,
    real_node: bool = False,
    dialects: bool = False,
) -> None:
    """Run the demo cluster (module doc) with the extender's ``policy``, a real node when
    ``real_node`` and the request dialects served when ``dialects``, until SIGTERM or
    SIGINT."""
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    directory.mkdir(parents=True, exist_ok=True)
    (directory / STATE).unlink(missing_ok=True)
    try:
        _run(directory, stop, policy, real_node, dialects)
    finally:
        (directory / STATE).unlink(missing_ok=True)
        (directory / KUBECONFIG).unlink(missing_ok=True)
    _log("stopped")


def _run(
    directory: Path, stop: threading.Event, policy: str, real_node: bool, dialects: bool
) -> None:
    logs = directory / "logs"
    with contextlib.ExitStack() as stack:
        binaries = Binaries.locate()
        host: NodeHost | None = None
        if real_node:
            check_prerequisites()
            _log("taking the real node's host (lock, bridge)")
            host = stack.enter_context(NodeHost())
        _log("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok")
        plane = stack.enter_context(
            ControlPlane(
                binaries,
                log_dir=logs,
                controller_manager=True,
                bind_address=host.address if host is not None else "127.0.0.1",
            )
        )
        kube = stack.enter_context(plane.client())
        wait_until(
            "kube-controller-manager's default ServiceAccount",
            lambda: bool(list(kube.list(ServiceAccount, namespace="default"))),
            60,
        )
        served = DIALECTS if dialects else ()
        _log(f"creating {len(NODES)} kwok GPU nodes"
             + (f" serving the dialects {', '.join(served)}" if served else ""))  # fmt: skip
        create_nodes(
            kube,
            [
                gpu_node(
                    node.name,
                    [FakeGpu(i, node.memory_gib, node.model) for i in range(node.count)],
                    unit=MemoryUnit.GIB,
                    dialects=served,
                    split_count=10,
                    labels={"nvidia.com/gpu.product": node.model},  # as GPU feature discovery
                )
                for node in NODES
            ],
        )
        _log("recording the kwok nodes' GPU pods as started, as their device plugin would")
        stack.enter_context(KwokDevicePlugin(kube, [node.name for node in NODES]))
        (port,) = free_ports(1)
        extender_url = f"http://127.0.0.1:{port}"
        argv = gpushare_argv(
            "extender", "--kubeconfig", str(plane.kubeconfig), "--port", str(port),
            "--handshake-timeout", "0", "--policy", policy,
        )  # fmt: skip
        _log(f"starting gpushare extender on {extender_url} (policy {policy})")
        extender = ManagedProcess("gpushare-extender", argv, logs).start()
        stack.callback(extender.stop)
        wait_until(
            "the extender ready", lambda: http_ok(f"{extender_url}/readyz"), 60,
            processes=[extender],
        )  # fmt: skip
        _log(f"starting the second kube-scheduler {SCHEDULER_NAME!r} wired to the extender")
        entry = gpushare_extender(f"{extender_url}/gpushare-scheduler", dialects=dialects)
        stack.enter_context(
            plane.scheduler(
                SCHEDULER_NAME, profiles=[{"schedulerName": SCHEDULER_NAME}], extenders=[entry]
            )
        )
        nodes = [node.name for node in NODES]
        if host is not None:
            _log(f"starting the real node {REAL_NODE} (containerd, kubelet, kube-proxy) and "
                 f"gpushare device-plugin --fake-gpus {REAL_GPUS}")  # fmt: skip
            start_real_node(stack, host, plane, logs)
            nodes.append(REAL_NODE)
        kubeconfig = directory / KUBECONFIG
        shutil.copyfile(plane.kubeconfig, kubeconfig)
        state = {
            "pid": os.getpid(),
            "kubeconfig": str(kubeconfig),
            "extender": extender_url,
            "kubectl": str(binaries.path("kubectl")),
            "nodes": nodes,
            "real_node": host is not None,
            "dialects": dialects,
            "policy": policy,
            "started": time.time(),
        }
        (directory / STATE).write_text(json.dumps(state, indent=2))
        _log("ready")
        while not stop.wait(1.0):
            plane.check_running()
            extender.check_running()
        _log("stopping")
