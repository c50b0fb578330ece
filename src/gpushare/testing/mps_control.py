"""A fake ``nvidia-cuda-mps-control`` that speaks the real one's command protocol, for tests.

The real binary ships with the NVIDIA driver and needs a GPU; this one lets the device plugin's
MPS supervision (``gpushare.deviceplugin.mps``) run for real against a separate process. It
follows NVIDIA's "Multi-Process Service" documentation (section "nvidia-cuda-mps-control"):

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the background and returns 0 once
  it listens; ``-f`` runs it in the foreground. A second start while one answers prints
  ``An instance of this daemon is already running`` and exits 1. The daemon listens on
  ``$CUDA_MPS_PIPE_DIRECTORY/control`` (default ``/tmp/nvidia-mps``), writes its PID to
  ``nvidia-cuda-mps-control.pid`` there, and logs to ``$CUDA_MPS_LOG_DIRECTORY/control.log``
  (default ``/var/log/nvidia-mps``), one ``Cmd:<command>`` line per command, as the real log does.
* With no option it is the front end: each line of standard input is one command sent to the
  daemon, whose answer is printed. With no daemon answering it prints ``Cannot find MPS control
  daemon process`` and exits 1 (the real front end's message).
* Commands: ``quit`` (the daemon exits, its socket and PID file removed), ``get_server_list``
  (PIDs of the servers, one a line), ``start_server -uid <uid>`` (a fake server PID),
  ``shutdown_server <pid>``, ``ps``, ``set_default_active_thread_percentage <p>`` /
  ``get_default_active_thread_percentage`` (answer ``<p>.0``, default ``100.0``),
  ``set_default_device_pinned_mem_limit <dev> <value>`` /
  ``get_default_device_pinned_mem_limit <dev>`` (``<N>M`` or ``<N>G``; unset: ``0``); anything
  else answers ``Unrecognized command``. Limits set by default commands are lost on ``quit``.

A crash is simulated by killing the daemon's PID (``kill_daemon``): its socket file stays and
connections are refused, as after a real crash. ``install(directory)`` writes an executable
``nvidia-cuda-mps-control`` that runs this module with the current interpreter.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import stat
import sys
import time
from pathlib import Path

__all__ = ["BINARY_NAME", "daemon_pid", "install", "kill_daemon", "main"]

BINARY_NAME = "nvidia-cuda-mps-control"
PID_FILE = "nvidia-cuda-mps-control.pid"
NOT_FOUND = "Cannot find MPS control daemon process"
ALREADY_RUNNING = "An instance of this daemon is already running"
_MEMORY = re.compile(r"^\d+[MG]$")


def install(directory: Path) -> Path:
    """Write an executable ``nvidia-cuda-mps-control`` into ``directory`` that runs this fake."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / BINARY_NAME
    path.write_text(
        f"#!{sys.executable}\nfrom gpushare.testing.mps_control import main\nmain()\n",
        encoding="utf-8",
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def daemon_pid(pipe_dir: Path) -> int | None:
    """The PID the daemon in ``pipe_dir`` wrote, None without a PID file."""
    try:
        return int((pipe_dir / PID_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None


def kill_daemon(pipe_dir: Path) -> int:
    """SIGKILL the daemon of ``pipe_dir`` (a crash: its socket file stays); its PID."""
    pid = daemon_pid(pipe_dir)
    if pid is None:
        raise RuntimeError(f"no MPS control daemon PID file in {pipe_dir}")
    os.kill(pid, signal.SIGKILL)
    return pid


def _dirs() -> tuple[Path, Path]:
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    log = Path(os.environ.get("CUDA_MPS_LOG_DIRECTORY", "/var/log/nvidia-mps"))
    return pipe, log


def _ask(pipe: Path, command: str) -> str | None:
    """The daemon's answer to ``command``; None when no daemon answers."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(pipe / "control"))
            conn.sendall(command.encode() + b"\n")
            conn.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := conn.recv(65536):
                chunks.append(chunk)
    except OSError:
        return None
    return b"".join(chunks).decode()


class _Daemon:
    def __init__(self, pipe: Path, log: Path) -> None:
        self.pipe, self.log = pipe, log
        self.thread_percentage = 100.0
        self.pinned: dict[str, str] = {}
        self.servers: dict[int, int] = {}  # fake server PID -> uid
        self._next_server = 40000

    def _log(self, text: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with (self.log / "control.log").open("a", encoding="utf-8") as file:
            file.write(f"[{stamp} Control {os.getpid()}] {text}\n")

    def answer(self, line: str) -> tuple[str, bool]:
        """The reply to one command and whether the daemon quits."""
        self._log(f"Cmd:{line}")
        words = line.split()
        name, args = (words[0], words[1:]) if words else ("", [])
        if name == "quit":
            return "", True
        if name in ("get_server_list", "ps"):
            return "".join(f"{pid}\n" for pid in self.servers), False
        if name == "start_server" and args[:1] == ["-uid"] and len(args) == 2:
            self._next_server += 1
            self.servers[self._next_server] = int(args[1])
            return f"{self._next_server}\n", False
        if name == "shutdown_server" and args and args[0].isdigit():
            self.servers.pop(int(args[0]), None)
            return "", False
        if name == "set_default_active_thread_percentage" and len(args) == 1:
            try:
                value = float(args[0])
            except ValueError:
                value = -1.0
            if not 0 < value <= 100:
                return f"Invalid percentage {args[0]}\n", False
            self.thread_percentage = value
            return f"{value:.1f}\n", False
        if name == "get_default_active_thread_percentage" and not args:
            return f"{self.thread_percentage:.1f}\n", False
        if name == "set_default_device_pinned_mem_limit" and len(args) == 2:
            if not _MEMORY.match(args[1]):
                return f"Invalid memory limit {args[1]}\n", False
            self.pinned[args[0]] = args[1]
            return "", False
        if name == "get_default_device_pinned_mem_limit" and len(args) == 1:
            return f"{self.pinned.get(args[0], '0')}\n", False
        return "Unrecognized command\n", False

    def serve(self, listener: socket.socket) -> None:
        self._log(f"Starting control daemon using socket {self.pipe / 'control'}")
        while True:
            conn, _ = listener.accept()
            with conn:
                data = b""
                while not data.endswith(b"\n") and (chunk := conn.recv(4096)):
                    data += chunk
                reply, quitting = self.answer(data.decode().strip())
                conn.sendall(reply.encode())
            if quitting:
                self._log("Exit")
                listener.close()
                (self.pipe / "control").unlink(missing_ok=True)
                (self.pipe / PID_FILE).unlink(missing_ok=True)
                return


def _listen(pipe: Path) -> socket.socket:
    path = pipe / "control"
    path.unlink(missing_ok=True)  # a crashed daemon's socket
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    listener.listen(16)
    return listener


def _start(foreground: bool) -> int:
    pipe, log = _dirs()
    pipe.mkdir(parents=True, exist_ok=True)
    log.mkdir(parents=True, exist_ok=True)
    if _ask(pipe, "get_server_list") is not None:
        print(ALREADY_RUNNING, file=sys.stderr)
        return 1
    listener = _listen(pipe)
    daemon = _Daemon(pipe, log)
    if foreground:
        (pipe / PID_FILE).write_text(str(os.getpid()), encoding="utf-8")
        daemon.serve(listener)
        return 0
    if os.fork():  # the front end returns once the daemon listens
        listener.close()
        return 0
    os.setsid()
    if os.fork():
        os._exit(0)
    (pipe / PID_FILE).write_text(str(os.getpid()), encoding="utf-8")
    with open(os.devnull, "rb") as null_in, open(os.devnull, "wb") as null_out:
        for fd, target in ((0, null_in), (1, null_out), (2, null_out)):
            os.dup2(target.fileno(), fd)
    with contextlib.suppress(BaseException):
        daemon.serve(listener)
    os._exit(0)


def _front_end() -> int:
    pipe, _ = _dirs()
    for line in sys.stdin:
        command = line.strip()
        if not command:
            continue
        reply = _ask(pipe, command)
        if reply is None:
            print(NOT_FOUND)
            return 1
        sys.stdout.write(reply)
    return 0


def main(argv: list[str] | None = None) -> None:
    """The ``nvidia-cuda-mps-control`` entry point (module doc)."""
    args = sys.argv[1:] if argv is None else argv
    if args == ["-d"]:
        code = _start(foreground=False)
    elif args == ["-f"]:
        code = _start(foreground=True)
    elif not args:
        code = _front_end()
    else:
        print(f"usage: {BINARY_NAME} [-d | -f]", file=sys.stderr)
        code = 2
    sys.stdout.flush()
    raise SystemExit(code)
