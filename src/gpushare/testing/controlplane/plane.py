"""The :class:`ControlPlane` itself: start, supervise and stop etcd, kube-apiserver,
kube-scheduler, kwok and (optionally) kube-controller-manager."""

from __future__ import annotations

import atexit
import contextlib
import functools
import ipaddress
import json
import shutil
import tempfile
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpushare.testing.controlplane.api import ApiAccess
from gpushare.testing.controlplane.binaries import KWOK_STAGES, Binaries
from gpushare.testing.controlplane.credentials import Credentials, write_kubeconfig
from gpushare.testing.controlplane.errors import ControlPlaneError
from gpushare.testing.controlplane.polling import wait_until
from gpushare.testing.controlplane.processes import (
    ManagedProcess,
    free_ports,
    http_ok,
    unverified_context,
)
from gpushare.testing.controlplane.scheduler_config import scheduler_configuration


def _etcd_post(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """One call to etcd's JSON gateway (``/v3/...``)."""
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(request, timeout=10) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"


@dataclass
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int
    controller_manager: int


@dataclass
class ControlPlane(ApiAccess):
    """etcd + kube-apiserver + kube-scheduler + kwok on loopback; use as a context manager.

    ``extenders`` go into the main kube-scheduler's configuration (profile
    ``default-scheduler``); ``scheduler_extra`` adds top-level configuration fields. ``log_dir``
    receives a copy of every process log at :meth:`stop`.

    For a real node (``gpushare.testing.node``): ``controller_manager=True`` also runs
    kube-controller-manager (Deployments, ReplicaSets, DaemonSets, ServiceAccounts and their
    tokens, ``kube-root-ca.crt``, pod garbage collection), with the ServiceAccount and
    TaintNodesByCondition admission plugins on as in a real cluster; ``bind_address`` puts
    kube-apiserver on an address pods can reach (the node's bridge, never a routed interface)
    and lets it publish that address as the ``kubernetes`` Service's endpoint. The defaults
    (loopback, no controller-manager) are what the kwok tier needs: faster, and no PodGC
    deleting the pods that tests bind to nodes they never create.
    """

    binaries: Binaries
    extenders: Sequence[Mapping[str, Any]] = ()
    scheduler_extra: Mapping[str, Any] = field(default_factory=dict)
    log_dir: Path | None = None
    startup_timeout: float = 90.0
    bind_address: str = "127.0.0.1"
    controller_manager: bool = False
    kwok: bool = True
    """Run kwok (fake nodes); ``False`` where only real nodes join and kwok's binary is not
    there (the real-node run on a lent GPU machine, ``bench/gpu/node.sh``)."""
    root: Path = field(init=False)
    credentials: Credentials = field(init=False)
    kubeconfig: Path = field(init=False)
    server: str = field(init=False)
    processes: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
    _finished: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
    #: The base URL (``https://127.0.0.1:<port>``, a self-signed certificate) of every extra
    #: kube-scheduler started by :meth:`scheduler`, by name, while it runs; its ``/metrics``
    #: needs no credentials.
    scheduler_urls: dict[str, str] = field(init=False, default_factory=dict)
    _ports: _Ports = field(init=False)
    _started: bool = field(init=False, default=False)

    # ---- lifecycle ----------------------------------------------------------------------

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        """Start everything and wait until each part is ready; on any failure stop it all."""
        if self._started:
            raise ControlPlaneError("control plane already started")
        self.root = Path(tempfile.mkdtemp(prefix="gpushare-controlplane-"))
        self._started = True
        # Backstop for an interpreter that exits without running fixture teardown.
        atexit.register(self.stop)
        try:
            ports = free_ports(6)
            self._ports = _Ports(*ports)
            self.server = f"https://{self.bind_address}:{self._ports.apiserver}"
            self.credentials = Credentials.generate(
                self.root / "pki", extra_ips=(self.bind_address,)
            )
            self.kubeconfig = write_kubeconfig(
                self.root / "admin.kubeconfig",
                self.server,
                self.credentials.ca_cert,
                {
                    "client-certificate": str(self.credentials.admin_cert),
                    "client-key": str(self.credentials.admin_key),
                },
            )
            self._start_etcd()
            self._start_apiserver()
            if self.controller_manager:
                self._start_controller_manager()
            self._start_scheduler(
                "kube-scheduler",
                self._ports.scheduler,
                scheduler_configuration(
                    self.kubeconfig, extenders=self.extenders, **self.scheduler_extra
                ),
            )
            if self.kwok:
                self._start_kwok()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process (newest first), keep the logs, remove the temporary root."""
        atexit.unregister(self.stop)
        errors: list[str] = []
        for proc in reversed(list(self.processes.values())):
            try:
                proc.stop()
            except Exception as exc:  # keep going: every process must be stopped
                errors.append(f"{proc.name}: {exc!r}")
        for proc in self.processes.values():
            self.keep_log(proc)
        if self._started:
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise ControlPlaneError("errors while stopping: " + "; ".join(errors))

    def keep_log(self, proc: ManagedProcess) -> None:
        """Copy ``proc``'s log into ``log_dir`` (when one is given): for processes that other
        harnesses (``gpushare.testing.node``) start next to the plane and stop themselves."""
        if self.log_dir is not None and proc.log_path.exists():
            self.log_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(proc.log_path, self.log_dir / proc.log_path.name)

    def check_running(self) -> None:
        """Raise with the log of the first process that has exited."""
        for proc in self.processes.values():
            proc.check_running()

    def logs(self, lines: int = 60) -> dict[str, str]:
        """The last ``lines`` of every process log (extra schedulers too), by process name."""
        procs = {**self._finished, **self.processes}
        return {name: proc.log_tail(lines) for name, proc in procs.items()}

    def logs_written_since(self, epoch_s: float, lines: int = 40) -> dict[str, str]:
        """The last ``lines`` of every other ``*.log`` under the plane's directory (what
        tests start beside it: extender replicas, device plugins) written at or after
        ``epoch_s`` (``time.time()``), by path relative to that directory."""
        own = {proc.log_path for proc in {**self._finished, **self.processes}.values()}
        found = {}
        for path in sorted(self.root.rglob("*.log")):
            try:
                if path in own or path.stat().st_mtime < epoch_s:
                    continue
                text = path.read_text(errors="replace").splitlines()[-lines:]
            except OSError:
                continue
            found[str(path.relative_to(self.root))] = "\n".join(text)
        return found

    # ---- extra schedulers --------------------------------------------------------------

    @contextlib.contextmanager
    def scheduler(
        self,
        name: str,
        *,
        profiles: Sequence[Mapping[str, Any]],
        extenders: Sequence[Mapping[str, Any]] = (),
        **extra: Any,
    ) -> Iterator[ManagedProcess]:
        """Run one more kube-scheduler (its own profiles and extenders) for the ``with`` body.

        Give it a profile with its own ``schedulerName``; pods opt in with
        ``spec.schedulerName``, so the main scheduler and other tests are unaffected.
        """
        if name in self.processes:
            raise ControlPlaneError(f"a process named {name!r} is already running")
        (port,) = free_ports(1)
        config = scheduler_configuration(
            self.kubeconfig, profiles=profiles, extenders=extenders, **extra
        )
        try:
            self.scheduler_urls[name] = f"https://127.0.0.1:{port}"
            yield self._start_scheduler(name, port, config)
        finally:
            self.scheduler_urls.pop(name, None)
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
                self.keep_log(proc)
                self._finished[name] = proc  # its log still goes into failure reports

    # ---- API-server outages -------------------------------------------------------------

    @contextlib.contextmanager
    def apiserver_down(self) -> Iterator[None]:
        """Stop kube-apiserver (SIGTERM, SIGKILL after 10 s) for the ``with`` body, then start
        it again on the same port with the same certificates and data (etcd keeps running), and
        wait until it is ready. Clients see connections refused meanwhile."""
        proc = self.processes.pop("kube-apiserver")
        proc.stop()
        self.keep_log(proc)
        try:
            yield
        finally:
            self._start_apiserver()

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (physically), so that a watch
        resumed from any older resourceVersion gets 410 Gone; returns that revision."""
        base = f"http://127.0.0.1:{self._ports.etcd_client}/v3"
        header = _etcd_post(f"{base}/kv/range", {"key": "AA==", "limit": 1})["header"]
        revision = int(header["revision"])
        _etcd_post(f"{base}/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # ---- the parts ---------------------------------------------------------------------

    def _launch(self, name: str, argv: Sequence[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, self.root / name)
        self.processes[name] = proc
        return proc.start()

    def _start_etcd(self) -> None:
        p = self._ports
        client_url = f"http://127.0.0.1:{p.etcd_client}"
        peer_url = f"http://127.0.0.1:{p.etcd_peer}"
        proc = self._launch(
            "etcd",
            [
                str(self.binaries.path("etcd")),
                "--name=default",
                f"--data-dir={self.root / 'etcd' / 'data'}",
                f"--listen-client-urls={client_url}",
                f"--advertise-client-urls={client_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync=true",
                "--log-level=warn",
            ],
        )
        wait_until(
            "etcd /health",
            lambda: http_ok(f"{client_url}/health", body='"health":"true"'),
            self.startup_timeout,
            processes=[proc],
        )

    def _start_apiserver(self) -> None:
        c = self.credentials
        loopback = ipaddress.ip_address(self.bind_address).is_loopback
        proc = self._launch(
            "kube-apiserver",
            [
                str(self.binaries.path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self._ports.etcd_client}",
                f"--bind-address={self.bind_address}",
                f"--advertise-address={self.bind_address}",
                # The endpoint reconciler refuses a loopback advertise address ("may not be in
                # the loopback range") and exits; the kwok tier needs no `kubernetes` Endpoints.
                f"--endpoint-reconciler-type={'none' if loopback else 'lease'}",
                f"--secure-port={self._ports.apiserver}",
                f"--cert-dir={self.root / 'kube-apiserver' / 'certs'}",
                f"--tls-cert-file={c.serving_cert}",
                f"--tls-private-key-file={c.serving_key}",
                f"--client-ca-file={c.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={c.sa_pub}",
                f"--service-account-signing-key-file={c.sa_key}",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                "--allow-privileged=true",
                # Logs and exec reach a real kubelet at its InternalIP (whatever the node is
                # called) with the admin client pair, which kubelet's x509 authn accepts.
                "--kubelet-preferred-address-types=InternalIP",
                f"--kubelet-client-certificate={c.admin_cert}",
                f"--kubelet-client-key={c.admin_key}",
                # Without kube-controller-manager nobody would create the `default`
                # ServiceAccount (ServiceAccount admission would refuse pods) nor lift the
                # node.kubernetes.io/not-ready taint that TaintNodesByCondition puts on every
                # new Node (the scheduler would refuse every kwok node).
                *(
                    []
                    if self.controller_manager
                    else ["--disable-admission-plugins=ServiceAccount,TaintNodesByCondition"]
                ),
                "--enable-priority-and-fairness=false",
                "--profiling=false",
            ],
        )
        context = c.admin_ssl_context()
        wait_until(
            "kube-apiserver /readyz",
            lambda: http_ok(f"{self.server}/readyz", context),
            self.startup_timeout,
            processes=[self.processes["etcd"], proc],
        )
        # The system namespaces and the authentication ConfigMap come from post-start hooks.
        for path in (
            "/api/v1/namespaces/default",
            "/api/v1/namespaces/kube-system/configmaps/extension-apiserver-authentication",
        ):
            url = f"{self.server}{path}"
            wait_until(
                f"GET {path}",
                functools.partial(http_ok, url, context),
                self.startup_timeout,
                processes=[proc],
            )

    def _start_controller_manager(self) -> None:
        c = self.credentials
        port = self._ports.controller_manager
        workdir = self.root / "kube-controller-manager"
        proc = self._launch(
            "kube-controller-manager",
            [
                str(self.binaries.path("kube-controller-manager")),
                f"--kubeconfig={self.kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={workdir / 'certs'}",
                # Its /metrics too, for the benchmarks (scheduling cycle times, queue lengths).
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--leader-elect=false",
                f"--service-account-private-key-file={c.sa_key}",
                f"--root-ca-file={c.ca_cert}",
                "--use-service-account-credentials=true",
                f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
                # No CSR signing (no cluster signing key: kubelet uses the admin pair).
                "--controllers=*,-csrsigning",
                "--profiling=false",
            ],
        )
        insecure = unverified_context()  # its self-signed serving cert, on loopback
        wait_until(
            "kube-controller-manager /healthz",
            lambda: http_ok(f"https://127.0.0.1:{port}/healthz", insecure),
            self.startup_timeout,
            processes=[proc],
        )

    def _start_scheduler(self, name: str, port: int, config: Mapping[str, Any]) -> ManagedProcess:
        workdir = self.root / name
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "config.json"
        config_path.write_text(json.dumps(config, indent=2))
        proc = ManagedProcess(
            name,
            [
                str(self.binaries.path("kube-scheduler")),
                f"--config={config_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                f"--cert-dir={workdir / 'certs'}",
                # Its /metrics too, for the benchmarks (scheduling cycle times, queue lengths).
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                # No --authentication/authorization-kubeconfig: with them kube-scheduler logs an
                # error many times a second because this apiserver has no front-proxy CA, and
                # its health endpoints are always allowed anyway.
            ],
            workdir,
        )
        self.processes[name] = proc.start()
        insecure = unverified_context()  # its self-signed serving cert, on loopback
        wait_until(
            f"{name} /readyz",
            lambda: http_ok(f"https://127.0.0.1:{port}/readyz", insecure),
            self.startup_timeout,
            processes=[proc],
        )
        return proc

    def _start_kwok(self) -> None:
        address = f"127.0.0.1:{self._ports.kwok}"
        proc = self._launch(
            "kwok",
            [
                str(self.binaries.path("kwok")),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={self.binaries.path(KWOK_STAGES)}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector="
                f"{KWOK_NODE_ANNOTATION}={KWOK_NODE_ANNOTATION_VALUE}",
                "--cidr=10.244.0.0/16",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address={address}",
            ],
        )
        wait_until(
            "kwok /healthz",
            lambda: http_ok(f"http://{address}/healthz"),
            self.startup_timeout,
            processes=[proc],
        )
