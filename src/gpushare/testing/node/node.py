""":class:`RealNode`: containerd, kubelet and kube-proxy as one node of a test control plane."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Node

from gpushare.testing.controlplane import (
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    free_ports,
    http_ok,
    wait_for,
    wait_until,
)
from gpushare.testing.node.config import kube_proxy_configuration, kubelet_configuration
from gpushare.testing.node.containerd import Containerd
from gpushare.testing.node.host import GATEWAY, NodeHost
from gpushare.testing.node.images import write_image_archive
from gpushare.testing.node.prerequisites import containerd_dir

NODE_LABELS = {"gpushare": "true"}


def node_ready(node: Node) -> bool:
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


@dataclass
class RealNode:
    """One real node named ``name`` on ``host``, registered with ``plane``.

    :meth:`start` writes and imports the test images, starts containerd, kubelet (labels
    :data:`NODE_LABELS`, node IP :data:`~gpushare.testing.node.host.GATEWAY`) and, when
    ``kube_proxy``, kube-proxy, and waits until the Node is Ready. :meth:`stop` removes every
    container and stops the three; ``NodeHost.close`` then puts the machine back.

    Lifecycle helpers for tests: :meth:`stop_kubelet`, :meth:`start_kubelet`,
    :meth:`restart_kubelet` (containers keep running) and :meth:`power_cut` (kubelet stopped,
    every container and network namespace gone, containerd restarted with empty state: what a
    reboot leaves before kubelet starts again).
    """

    host: NodeHost
    plane: ControlPlane
    name: str = "gpushare-node"
    kube_proxy: bool = True
    startup_timeout_s: float = 120.0
    snapshotter: str = "overlayfs"
    """containerd's snapshotter (``native`` where the machine refuses overlay mounts)."""
    containerd: Containerd = field(init=False)
    kubelet: ManagedProcess | None = field(init=False, default=None)
    proxy: ManagedProcess | None = field(init=False, default=None)
    kubelet_port: int = field(init=False, default=0)
    kubelet_started_s: float = field(init=False, default=0.0)
    """When the running kubelet was started (Unix time, whole seconds)."""
    _kubelet_healthz: int = field(init=False, default=0)
    _kubelet_argv: list[str] = field(init=False, default_factory=list)
    _started: bool = field(init=False, default=False)

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def root(self) -> Path:
        return self.host.root / "node"

    @property
    def kubelet_root(self) -> Path:
        """kubelet's ``--root-dir``: DRA drivers put their sockets in ``plugins`` and
        ``plugins_registry`` under it."""
        return self.root / "kubelet" / "root"

    # ---- start / stop ----------------------------------------------------------------

    def start(self) -> RealNode:
        self._started = True
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            archive = write_image_archive(self.root / "images.tar")
            self.containerd = Containerd(
                self.root / "containerd", bin_dir=containerd_dir(), snapshotter=self.snapshotter
            )
            self.containerd.start()
            self.containerd.import_images(archive)
            self._write_kubelet_config()
            self.start_kubelet()
            if self.kube_proxy:
                self._start_kube_proxy()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Remove every container, stop kube-proxy (and its iptables rules), kubelet, containerd."""
        if not self._started:
            return
        self._started = False
        errors: list[str] = []
        if self.proxy is not None:
            self.proxy.stop()
            done = subprocess.run(
                [str(self.plane.binaries.path("kube-proxy")), "--cleanup"],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                errors.append(f"kube-proxy --cleanup: {done.stderr[-500:]}")
        self.stop_kubelet()
        if hasattr(self, "containerd"):
            try:
                self.containerd.remove_all_containers()
            except Exception as exc:
                errors.append(f"removing containers: {exc}")
            self.containerd.stop()
        for proc in (self.kubelet, self.proxy, getattr(self.containerd, "process", None)):
            if proc is not None:
                self.plane.keep_log(proc)
        if errors:
            raise ControlPlaneError("real node stop: " + "; ".join(errors))

    def logs(self, lines: int = 60) -> dict[str, str]:
        procs = [
            self.kubelet,
            self.proxy,
            getattr(self, "containerd", None) and self.containerd.process,
        ]
        return {p.name: p.log_tail(lines) for p in procs if isinstance(p, ManagedProcess)}

    # ---- kubelet ---------------------------------------------------------------------

    def _write_kubelet_config(self) -> None:
        self.kubelet_port, self._kubelet_healthz = free_ports(2)
        workdir = self.root / "kubelet"
        workdir.mkdir(parents=True, exist_ok=True)
        config = kubelet_configuration(
            runtime_endpoint=self.containerd.endpoint,
            client_ca=self.plane.credentials.ca_cert,
            port=self.kubelet_port,
            healthz_port=self._kubelet_healthz,
            root=workdir,
        )
        (workdir / "config.json").write_text(json.dumps(config, indent=2))
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._kubelet_argv = [
            str(self.plane.binaries.path("kubelet")),
            f"--config={workdir / 'config.json'}",
            f"--kubeconfig={self.plane.kubeconfig}",
            f"--root-dir={self.kubelet_root}",
            f"--cert-dir={workdir / 'pki'}",
            f"--node-ip={GATEWAY}",
            f"--hostname-override={self.name}",
            f"--node-labels={labels}",
        ]

    def start_kubelet(self, *, wait_ready: bool = True) -> ManagedProcess:
        """Start kubelet (a new process, same state directories); wait for its healthz and,
        when ``wait_ready``, for the Node to be Ready."""
        if self.kubelet is not None and self.kubelet.running():
            raise ControlPlaneError("kubelet is already running")
        self.kubelet = ManagedProcess("kubelet", self._kubelet_argv, self.root / "kubelet")
        # whole seconds: the Node's heartbeat times have no finer resolution
        self.kubelet_started_s = float(int(time.time()))
        self.kubelet.start()
        wait_until(
            "kubelet /healthz",
            lambda: http_ok(f"http://127.0.0.1:{self._kubelet_healthz}/healthz"),
            self.startup_timeout_s,
            processes=[self.kubelet],
        )
        if wait_ready:
            self.wait_ready()
        return self.kubelet

    def stop_kubelet(self) -> None:
        if self.kubelet is not None:
            self.kubelet.stop()

    def restart_kubelet(self) -> ManagedProcess:
        """kubelet stops and starts again; containers keep running (as ``systemctl restart``)."""
        self.stop_kubelet()
        return self.start_kubelet()

    def wait_ready(self) -> Node:
        """Wait until the Node is Ready (failing at once if kubelet exits); the Node."""
        procs = [p for p in (self.kubelet,) if p is not None]
        with self.plane.client() as client:

            def ready() -> Node | None:
                try:
                    node = client.get(Node, self.name)
                except ApiError:  # not registered yet
                    return None
                return node if node_ready(node) else None

            what = f"node {self.name} Ready"
            return wait_for(what, ready, self.startup_timeout_s, processes=procs)

    def revive(self) -> list[str]:
        """Start containerd and kubelet again where a test left them stopped (it failed between
        :meth:`power_cut` and :meth:`start_kubelet`), so that one failure does not fail every
        later test on the node; the names of those started."""
        started = []
        if self.containerd.process is None or not self.containerd.process.running():
            self._start_containerd_again()
            started.append("containerd")
        if self.kubelet is None or not self.kubelet.running():
            self.start_kubelet()
            started.append("kubelet")
        return started

    def power_cut(self) -> int:
        """What a reboot leaves: kubelet stopped, no container, no pod network namespace, no
        pod IP reserved, containerd restarted with empty runtime state; kubelet's own state
        (``--root-dir``, the device-plugin checkpoint) kept. Returns the number of containers
        removed. Start kubelet again with :meth:`start_kubelet`."""
        self.stop_kubelet()
        removed = self.containerd.remove_all_containers()
        self.containerd.stop()
        for point in self.host.new_mounts():
            if point.startswith("/run/netns/") or point.startswith("/var/run/netns/"):
                subprocess.run(["umount", point], check=False, capture_output=True)
                Path(point).unlink(missing_ok=True)
        shutil.rmtree(self.containerd.root / "state", ignore_errors=True)
        shutil.rmtree(self.containerd.root / "runc", ignore_errors=True)
        shutil.rmtree(self.containerd.root / "cni" / "ipam", ignore_errors=True)
        self._start_containerd_again()
        return removed

    def _start_containerd_again(self) -> None:
        """A new containerd process over the same root and binaries."""
        self.containerd = Containerd(
            self.containerd.root,
            bin_dir=self.containerd.bin_dir,
            snapshotter=self.containerd.snapshotter,
        )
        self.containerd.start()

    # ---- kube-proxy ------------------------------------------------------------------

    def _start_kube_proxy(self) -> None:
        healthz, metrics = free_ports(2)
        workdir = self.root / "kube-proxy"
        workdir.mkdir(parents=True, exist_ok=True)
        config = kube_proxy_configuration(
            kubeconfig=self.plane.kubeconfig,
            node_name=self.name,
            healthz_port=healthz,
            metrics_port=metrics,
        )
        (workdir / "config.json").write_text(json.dumps(config, indent=2))
        self.proxy = ManagedProcess(
            "kube-proxy",
            [str(self.plane.binaries.path("kube-proxy")), f"--config={workdir / 'config.json'}"],
            workdir,
        ).start()
        wait_until(
            "kube-proxy /healthz",
            lambda: http_ok(f"http://127.0.0.1:{healthz}/healthz", None),
            self.startup_timeout_s,
            processes=[self.proxy],
        )
