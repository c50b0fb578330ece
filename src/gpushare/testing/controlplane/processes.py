"""Process supervision and readiness: children in their own process groups, polled to a deadline
(the poll loop itself: :mod:`gpushare.testing.controlplane.polling`, re-exported here)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from gpushare.testing.controlplane.errors import ControlPlaneError
from gpushare.testing.controlplane.polling import wait_for, wait_until

__all__ = [
    "ManagedProcess",
    "free_ports",
    "gpushare_argv",
    "http_ok",
    "unverified_context",
    "wait_for",
    "wait_until",
]

_PROXY_VARIABLES = ("http_proxy", "https_proxy", "all_proxy", "no_proxy")


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


def gpushare_argv(*args: str) -> list[str]:
    """The argv that runs ``gpushare ARGS`` with this interpreter (the checkout's code, whether
    or not the console script is on ``PATH``), for a :class:`ManagedProcess`."""
    return [sys.executable, "-c", "from gpushare.cli.main import main; main()", *args]


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

    def exit_code(self) -> int | None:
        """The exit status once the process has exited (negative: killed by that signal);
        ``None`` while it runs or before it started."""
        return None if self._proc is None else self._proc.poll()

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

        def exited() -> bool:
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:  # already reaped
                return True
            return info is not None

        try:
            wait_until(f"process {pid} to exit", exited, timeout)
        except ControlPlaneError:
            return False
        return True

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


def http_ok(url: str, context: ssl.SSLContext | None = None, body: str | None = None) -> bool:
    """True when GET ``url`` answers 200 (and contains ``body`` when given), never through a
    proxy (the targets are loopback or the test node's bridge); a readiness probe for
    :func:`wait_until`. ``context``: for ``https://`` (e.g. :func:`unverified_context`)."""
    handlers: list[urllib.request.BaseHandler] = [urllib.request.ProxyHandler({})]
    if context is not None:
        handlers.append(urllib.request.HTTPSHandler(context=context))
    try:
        with urllib.request.build_opener(*handlers).open(url, timeout=2) as resp:
            text = resp.read().decode(errors="replace")
            return bool(resp.status == 200 and (body is None or body in text))
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def unverified_context() -> ssl.SSLContext:
    """A client TLS context that checks neither the certificate nor the host name: for a test
    program's self-signed serving certificate on loopback, never for what a test verifies."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
