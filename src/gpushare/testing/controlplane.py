"""A real Kubernetes control plane on loopback for the cluster-test tier.

:class:`ControlPlane` runs etcd, kube-apiserver, kube-scheduler and kwok as child processes,
built from the Go module proxy by ``scripts/build-controlplane.sh`` (see ``docs/testing.md``):

* every process listens on a free 127.0.0.1 port and owns a directory under one temporary root;
* kube-apiserver has RBAC on, TLS from a throw-away CA, a service-account signing key, and an
  admin identity (client certificate in ``system:masters``) in ``<root>/admin.kubeconfig``;
* kube-scheduler reads a ``KubeSchedulerConfiguration`` (``kubescheduler.config.k8s.io/v1``) file
  that may carry ``extenders``; :meth:`ControlPlane.scheduler` starts further schedulers with
  their own profiles and extenders for one test;
* kwok marks nodes annotated ``kwok.x-k8s.io/node: fake`` Ready and runs the pods bound to them;
* readiness waits on health endpoints and API conditions (short polls with a deadline, never a
  fixed sleep); a process that dies while being waited for fails at once with its log;
* :meth:`ControlPlane.stop` terminates every process group (SIGTERM, then SIGKILL), copies the
  logs to ``log_dir`` when one is given, and removes the temporary root, whatever happened before.

Test-only code: it needs the ``test`` extra (lightkube) and the binaries, and nothing in the
``gpushare`` runtime packages may import it.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule, RoleRef, Subject
from lightkube.resources.core_v1 import Namespace, ServiceAccount, ServiceAccountToken
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-controlplane.sh"
BINARY_NAMES = ("etcd", "kube-apiserver", "kube-scheduler", "kwok")
KWOK_STAGES = "kwok-stages.yaml"  # kwok >= 0.8 needs stages; the build script collects defaults
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


class ControlPlaneError(RuntimeError):
    """The control plane could not be built, started or reached; the message says why."""


# --------------------------------------------------------------------------------------------
# Binaries


@dataclass(frozen=True)
class Binaries:
    """Paths of the four control-plane programs (and kwok's stages file) in one directory."""

    directory: Path

    def path(self, name: str) -> Path:
        return self.directory / name

    @classmethod
    def locate(cls) -> Binaries:
        """The binaries ``scripts/build-controlplane.sh`` built, or a clear error.

        ``GPUSHARE_CONTROLPLANE_BIN`` overrides the directory; otherwise the script says where
        its cache is (``--print-dir`` needs no Go). Missing binaries are an error, never a skip:
        ``make test`` builds them first (``make controlplane``).
        """
        override = os.environ.get("GPUSHARE_CONTROLPLANE_BIN")
        if override:
            directory = Path(override)
        else:
            try:
                done = subprocess.run(
                    ["bash", str(BUILD_SCRIPT), "--print-dir"],
                    check=True,
                    capture_output=True,
                    text=True,
                )
            except (OSError, subprocess.CalledProcessError) as exc:
                raise ControlPlaneError(f"cannot run {BUILD_SCRIPT} --print-dir: {exc}") from exc
            directory = Path(done.stdout.strip())
        missing = [n for n in BINARY_NAMES if not os.access(directory / n, os.X_OK)]
        if not (directory / KWOK_STAGES).is_file():
            missing.append(KWOK_STAGES)
        if missing:
            raise ControlPlaneError(
                f"control-plane binaries missing in {directory}: {', '.join(missing)}. "
                "Build them with `make controlplane` (scripts/build-controlplane.sh; needs Go "
                ">= 1.26 and the Go module proxy). The cluster tests are never skipped."
            )
        return cls(directory)


# --------------------------------------------------------------------------------------------
# Processes


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (all reserved at once, then released)."""
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _child_environment(home: Path) -> dict[str, str]:
    """The environment for every child: no proxies (extender calls would go through them), and
    HOME in its own directory so that no user file (``~/.kwok/kwok.yaml``, ``~/.kube``) leaks in.
    """
    env = {k: v for k, v in os.environ.items() if k.lower() not in _PROXY_VARIABLES}
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env["HOME"] = str(home)
    return env


class ManagedProcess:
    """One child process in its own process group, its output in ``<workdir>/<name>.log``."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.workdir = workdir
        self.log_path = workdir / f"{name}.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> ManagedProcess:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = self.log_path.open("ab")
        self._log.write(f"$ {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            env=_child_environment(self.workdir),
            start_new_session=True,  # its own process group: stop() reaches its children too
        )
        return self

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def check_running(self) -> None:
        """Raise with the log's tail when the process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise ControlPlaneError(
                f"{self.name} exited with status {self._proc.returncode}; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``timeout`` s; idempotent.

        The group is signalled only while its leader is not yet reaped (an exited leader stays
        a zombie until ``wait``), so its id can never belong to an unrelated process.
        """
        proc = self._proc
        if proc is not None and proc.returncode is None:
            self._signal_group(proc.pid, signal.SIGTERM)
            if not self._exited(proc.pid, timeout):
                self._signal_group(proc.pid, signal.SIGKILL)
                self._exited(proc.pid, 60.0)
            self._signal_group(proc.pid, signal.SIGKILL)  # stragglers of the group, if any
            proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    @staticmethod
    def _exited(pid: int, timeout: float) -> bool:
        """Wait up to ``timeout`` s for ``pid`` to exit, without reaping it."""
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # already reaped
                return True
            if info is not None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])


def wait_until(
    what: str,
    condition: Callable[[], bool],
    timeout: float,
    *,
    processes: Sequence[ManagedProcess] = (),
) -> None:
    """Poll ``condition`` with a short backoff until true; fail with ``what`` after ``timeout`` s.

    Every poll first checks that ``processes`` are still running, so a crash fails fast with
    the crashed program's log instead of a timeout.
    """
    deadline = time.monotonic() + timeout
    delay = 0.02
    while True:
        for proc in processes:
            proc.check_running()
        if condition():
            return
        if time.monotonic() >= deadline:
            logs = "".join(f"\n--- {p.name} ---\n{p.log_tail(30)}" for p in processes)
            raise ControlPlaneError(f"timed out after {timeout:.0f}s waiting for {what}{logs}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)


def _http_ok(url: str, context: ssl.SSLContext | None = None, body: str | None = None) -> bool:
    """True when GET ``url`` answers 200 (and contains ``body`` when given)."""
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as resp:
            text = resp.read().decode(errors="replace")
            return bool(resp.status == 200 and (body is None or body in text))
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


# --------------------------------------------------------------------------------------------
# Credentials


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{done.stderr}")


@dataclass(frozen=True)
class Credentials:
    """A throw-away CA, the API server's serving pair, the admin client pair and the SA keys."""

    ca_cert: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_key: Path
    sa_pub: Path

    @classmethod
    def generate(cls, directory: Path) -> Credentials:
        directory.mkdir(parents=True, exist_ok=True)
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            "-keyout", "ca.key", "-out", "ca.crt", "-subj", "/CN=gpushare-test-ca",
            cwd=directory,
        )  # fmt: skip
        (directory / "serving.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=serverAuth\n"
            "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc\n"
        )
        (directory / "client.ext").write_text(
            "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n"
        )
        for name, subject, ext in (
            ("serving", "/CN=kube-apiserver", "serving.ext"),
            ("admin", "/O=system:masters/CN=gpushare-test-admin", "client.ext"),
        ):
            _openssl(
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                "-out", f"{name}.csr", "-subj", subject,
                cwd=directory,
            )  # fmt: skip
            _openssl(
                "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", ext, "-out", f"{name}.crt",
                cwd=directory,
            )  # fmt: skip
        _openssl("genrsa", "-out", "sa.key", "2048", cwd=directory)
        _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=directory)
        return cls(
            ca_cert=directory / "ca.crt",
            serving_cert=directory / "serving.crt",
            serving_key=directory / "serving.key",
            admin_cert=directory / "admin.crt",
            admin_key=directory / "admin.key",
            sa_key=directory / "sa.key",
            sa_pub=directory / "sa.pub",
        )

    def admin_ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca_cert))
        context.load_cert_chain(str(self.admin_cert), str(self.admin_key))
        return context


def write_kubeconfig(path: Path, server: str, ca_cert: Path, user: Mapping[str, str]) -> Path:
    """A one-context kubeconfig (JSON, which is YAML) for ``server`` with ``user`` credentials."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "gpushare-test",
                "cluster": {"server": server, "certificate-authority": str(ca_cert)},
            }
        ],
        "users": [{"name": "user", "user": dict(user)}],
        "contexts": [{"name": "test", "context": {"cluster": "gpushare-test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(json.dumps(config, indent=2))
    path.chmod(0o600)
    return path


# --------------------------------------------------------------------------------------------
# kube-scheduler configuration


def scheduler_configuration(
    kubeconfig: Path,
    *,
    profiles: Sequence[Mapping[str, Any]] = ({"schedulerName": "default-scheduler"},),
    extenders: Sequence[Mapping[str, Any]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """A ``KubeSchedulerConfiguration`` (v1) for a test scheduler: no leader election.

    ``extenders`` entries use the v1 keys exactly (``urlPrefix``, ``filterVerb``,
    ``nodeCacheCapable``, ``managedResources``, ...); ``extra`` adds top-level fields such as
    ``percentageOfNodesToScore``.
    """
    config: dict[str, Any] = {
        "apiVersion": SCHEDULER_CONFIG_API_VERSION,
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [dict(p) for p in profiles],
    }
    if extenders:
        config["extenders"] = [dict(e) for e in extenders]
    config.update(extra)
    return config


# --------------------------------------------------------------------------------------------
# The control plane


@dataclass
class _Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    kwok: int


@dataclass
class ControlPlane:
    """etcd + kube-apiserver + kube-scheduler + kwok on loopback; use as a context manager.

    ``extenders`` go into the main kube-scheduler's configuration (profile
    ``default-scheduler``); ``scheduler_extra`` adds top-level configuration fields. ``log_dir``
    receives a copy of every process log at :meth:`stop`.
    """

    binaries: Binaries
    extenders: Sequence[Mapping[str, Any]] = ()
    scheduler_extra: Mapping[str, Any] = field(default_factory=dict)
    log_dir: Path | None = None
    startup_timeout: float = 90.0
    root: Path = field(init=False)
    credentials: Credentials = field(init=False)
    kubeconfig: Path = field(init=False)
    server: str = field(init=False)
    processes: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
    _finished: dict[str, ManagedProcess] = field(init=False, default_factory=dict)
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
            ports = free_ports(5)
            self._ports = _Ports(*ports)
            self.server = f"https://127.0.0.1:{self._ports.apiserver}"
            self.credentials = Credentials.generate(self.root / "pki")
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
            self._start_scheduler(
                "kube-scheduler",
                self._ports.scheduler,
                scheduler_configuration(
                    self.kubeconfig, extenders=self.extenders, **self.scheduler_extra
                ),
            )
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
            self._keep_log(proc)
        if self._started:
            shutil.rmtree(self.root, ignore_errors=True)
        if errors:
            raise ControlPlaneError("errors while stopping: " + "; ".join(errors))

    def _keep_log(self, proc: ManagedProcess) -> None:
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

    # ---- clients and identities --------------------------------------------------------

    def client(self, kubeconfig: Path | None = None) -> Client:
        """A lightkube client (admin unless another kubeconfig is given); close it after use."""
        config = KubeConfig.from_file(kubeconfig or self.kubeconfig)
        return Client(config, trust_env=False, field_manager="gpushare-tests")

    def service_account_token(
        self,
        name: str,
        namespace: str,
        rules: Sequence[PolicyRule],
        *,
        expiration_seconds: int = 3600,
    ) -> str:
        """A bearer token for ServiceAccount ``namespace/name`` with a ClusterRole of ``rules``.

        The token comes from the TokenRequest API (signed with the control plane's
        service-account key), so RBAC is exercised exactly as for an in-cluster component.
        """
        with self.client() as client:
            with contextlib.suppress(ApiError):  # already exists
                client.create(Namespace(metadata=ObjectMeta(name=namespace)))
            with contextlib.suppress(ApiError):
                client.create(ServiceAccount(metadata=ObjectMeta(name=name, namespace=namespace)))
            role_name = f"gpushare-test:{namespace}:{name}"
            client.apply(
                ClusterRole(metadata=ObjectMeta(name=role_name), rules=list(rules)),
                force=True,
            )
            client.apply(
                ClusterRoleBinding(
                    metadata=ObjectMeta(name=role_name),
                    roleRef=RoleRef(
                        apiGroup="rbac.authorization.k8s.io", kind="ClusterRole", name=role_name
                    ),
                    subjects=[Subject(kind="ServiceAccount", name=name, namespace=namespace)],
                ),
                force=True,
            )
            token = client.create(
                ServiceAccountToken(
                    metadata=ObjectMeta(name=name, namespace=namespace),
                    spec=TokenRequestSpec(audiences=[], expirationSeconds=expiration_seconds),
                ),
                name,
                namespace=namespace,
            )
        if token.status is None or not token.status.token:
            raise ControlPlaneError(f"TokenRequest for {namespace}/{name} returned no token")
        return token.status.token

    def service_account_kubeconfig(
        self,
        name: str,
        namespace: str,
        rules: Sequence[PolicyRule],
        *,
        expiration_seconds: int = 3600,
    ) -> Path:
        """A kubeconfig with :meth:`service_account_token`'s token for ``namespace/name``."""
        token = self.service_account_token(
            name, namespace, rules, expiration_seconds=expiration_seconds
        )
        return write_kubeconfig(
            self.root / f"sa-{namespace}-{name}.kubeconfig",
            self.server,
            self.credentials.ca_cert,
            {"token": token},
        )

    def api_request(
        self, method: str, path: str, body: Any = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        """A raw JSON request to the API server (admin, or ``token``): (HTTP status, body).

        For calls lightkube cannot make: it decodes the 201 ``Status`` that a ``pods/binding``
        POST returns as a ``Binding`` and raises although the bind succeeded.
        """
        context = ssl.create_default_context(cafile=str(self.credentials.ca_cert))
        headers = {"Accept": "application/json"}
        if token is None:
            context.load_cert_chain(
                str(self.credentials.admin_cert), str(self.credentials.admin_key)
            )
        else:
            headers["Authorization"] = f"Bearer {token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        request = urllib.request.Request(
            f"{self.server}{path}", data=data, headers=headers, method=method
        )
        try:
            with urllib.request.urlopen(request, timeout=10, context=context) as resp:
                return int(resp.status), json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            with exc:
                return exc.code, json.loads(exc.read() or b"null")

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
            yield self._start_scheduler(name, port, config)
        finally:
            proc = self.processes.pop(name, None)
            if proc is not None:
                proc.stop()
                self._keep_log(proc)
                self._finished[name] = proc  # its log still goes into failure reports

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
            lambda: _http_ok(f"{client_url}/health", body='"health":"true"'),
            self.startup_timeout,
            processes=[proc],
        )

    def _start_apiserver(self) -> None:
        c = self.credentials
        proc = self._launch(
            "kube-apiserver",
            [
                str(self.binaries.path("kube-apiserver")),
                f"--etcd-servers=http://127.0.0.1:{self._ports.etcd_client}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                # The endpoint reconciler refuses a loopback advertise address ("may not be in
                # the loopback range") and exits; nothing here needs the `kubernetes` Endpoints.
                "--endpoint-reconciler-type=none",
                f"--secure-port={self._ports.apiserver}",
                f"--cert-dir={self.root / 'kube-apiserver' / 'certs'}",
                f"--tls-cert-file={c.serving_cert}",
                f"--tls-private-key-file={c.serving_key}",
                f"--client-ca-file={c.ca_cert}",
                "--authorization-mode=RBAC",
                f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
                f"--service-account-key-file={c.sa_pub}",
                f"--service-account-signing-key-file={c.sa_key}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
                # There is no kube-controller-manager: nobody would create the `default`
                # ServiceAccount (ServiceAccount admission would refuse pods) nor lift the
                # node.kubernetes.io/not-ready taint that TaintNodesByCondition puts on every
                # new Node (the scheduler would refuse every kwok node).
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
                "--enable-priority-and-fairness=false",
                "--profiling=false",
            ],
        )
        context = c.admin_ssl_context()
        wait_until(
            "kube-apiserver /readyz",
            lambda: _http_ok(f"{self.server}/readyz", context),
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
                functools.partial(_http_ok, url, context),
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
                # No --authentication/authorization-kubeconfig: with them kube-scheduler logs an
                # error many times a second because this apiserver has no front-proxy CA, and
                # its health endpoints are always allowed anyway.
            ],
            workdir,
        )
        self.processes[name] = proc.start()
        insecure = ssl.create_default_context()
        insecure.check_hostname = False
        insecure.verify_mode = ssl.CERT_NONE  # its self-signed serving cert, on loopback
        wait_until(
            f"{name} /readyz",
            lambda: _http_ok(f"https://127.0.0.1:{port}/readyz", insecure),
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
            lambda: _http_ok(f"http://{address}/healthz"),
            self.startup_timeout,
            processes=[proc],
        )
