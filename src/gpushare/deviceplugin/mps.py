"""CUDA MPS managed by the device plugin (``gpushare device-plugin --mps-managed``, opt-in).

On a node that opts in, the device plugin runs the MPS control daemon for the node's GPUs and
keeps it alive, so that the per-container limits Allocate hands out
(``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``) are enforced by the
CUDA driver. The sequence follows NVIDIA's MPS documentation ("Starting and stopping MPS on
Linux") and the design of NVIDIA's k8s-device-plugin MPS mode (its ``mps-control-daemon``:
compute mode, one daemon for the managed GPUs, pipe/log directories on the host, shared with the
containers through Allocate's mounts); the code is gpushare's own:

1. ``start``: every GPU's compute mode is read (to restore it later) and set to
   EXCLUSIVE_PROCESS through NVML, so that CUDA processes can only reach the GPU through the MPS
   server; then ``nvidia-cuda-mps-control -d`` is started with ``CUDA_VISIBLE_DEVICES`` (the
   GPUs' UUIDs), ``CUDA_MPS_PIPE_DIRECTORY`` and ``CUDA_MPS_LOG_DIRECTORY`` (``MpsPaths``), and
   asked ``get_server_list`` until it answers.
2. ``run``: every ``check_interval_s`` the daemon is asked ``get_server_list``. When it does not
   answer (crashed, killed), ``on_health(False)`` marks the GPUs unhealthy (ListAndWatch sends
   them so: kubelet admits no new pod there), a Warning Event ``MPSDaemonDown`` goes on the node,
   and the daemon is started again with exponential backoff (``backoff_initial_s`` doubling to
   ``backoff_max_s``) until it answers; then ``on_health(True)`` and a Normal Event
   ``MPSDaemonRestarted``. A failed first start is handled the same way.
3. ``stop`` (the node leaves MPS mode, or the plugin shuts down): ``quit`` is sent and each GPU's
   compute mode restored to what it was.

``MpsControl`` runs the binary (``binary``: a path or a name on ``$PATH``). Errors: ``MpsError``
with the command, its exit status and output; NVML failures are ``NvmlError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpushare.deviceplugin._proto import api_pb2
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import (
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    COMPUTE_MODE_NAMES,
    Nvml,
    NvmlError,
)

__all__ = [
    "DEFAULT_MPS_CONTROL",
    "DEFAULT_MPS_ROOT",
    "MPS_DOWN",
    "MPS_RESTARTED",
    "MpsControl",
    "MpsError",
    "MpsPaths",
    "MpsSupervisor",
]

log = logging.getLogger(__name__)

DEFAULT_MPS_ROOT = Path("/run/gpushare/mps")
"""Host directory of the managed daemon's ``pipe``, ``log`` and ``shm`` (``--mps-root``)."""
DEFAULT_MPS_CONTROL = "nvidia-cuda-mps-control"
MPS_DOWN = "MPSDaemonDown"
MPS_RESTARTED = "MPSDaemonRestarted"


class MpsError(Exception):
    """An ``nvidia-cuda-mps-control`` call failed (message: command, status, output)."""


@dataclass(frozen=True, slots=True)
class MpsPaths:
    """Where the managed daemon and its clients meet: ``root`` on the host, mounted at the same
    path in the plugin's pod and (by Allocate) in every container."""

    root: Path = DEFAULT_MPS_ROOT

    @property
    def pipe_dir(self) -> Path:
        """``CUDA_MPS_PIPE_DIRECTORY``: the control socket and the servers' pipes."""
        return self.root / "pipe"

    @property
    def log_dir(self) -> Path:
        """``CUDA_MPS_LOG_DIRECTORY``: ``control.log`` and ``server.log``."""
        return self.root / "log"

    @property
    def shm_dir(self) -> Path:
        """Mounted at ``/dev/shm`` in the containers and the plugin: MPS clients and server
        share memory there (a directory on the host's ``/run`` tmpfs)."""
        return self.root / "shm"

    def create(self) -> None:
        """Make the three directories (mode 0755; the shm one 1777 as ``/dev/shm`` is)."""
        for directory in (self.pipe_dir, self.log_dir, self.shm_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.shm_dir.chmod(0o1777)

    def envs(self) -> dict[str, str]:
        """The client variables that point CUDA at the managed daemon."""
        return {
            "CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir),
            "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir),
        }

    def mounts(self) -> list[api_pb2.Mount]:
        """Allocate's mounts: pipe (read-write: clients connect to its sockets), log (read-only)
        at the same paths, and the shared-memory directory at ``/dev/shm``."""
        return [
            api_pb2.Mount(
                container_path=str(self.pipe_dir), host_path=str(self.pipe_dir), read_only=False
            ),
            api_pb2.Mount(
                container_path=str(self.log_dir), host_path=str(self.log_dir), read_only=True
            ),
            api_pb2.Mount(container_path="/dev/shm", host_path=str(self.shm_dir), read_only=False),
        ]


class MpsControl:
    """``nvidia-cuda-mps-control`` for ``paths`` and the GPUs ``uuids`` (module doc).

    ``environ`` is the base environment of the child processes (default: this process's);
    ``timeout_s`` bounds each call (seconds).
    """

    def __init__(
        self,
        paths: MpsPaths,
        uuids: Sequence[str],
        *,
        binary: str | Path = DEFAULT_MPS_CONTROL,
        environ: Mapping[str, str] | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self.paths = paths
        self.binary = str(binary)
        self.timeout_s = timeout_s
        self._env = {
            **(os.environ if environ is None else environ),
            **paths.envs(),
            "CUDA_VISIBLE_DEVICES": ",".join(uuids),
        }

    async def _run(self, args: Sequence[str], stdin: str | None) -> str:
        """Run the binary, wait for it to exit (not for its output to close: the daemon
        started by ``-d`` may keep the inherited descriptors) and return its output."""
        what = " ".join([self.binary, *args]) + (f" <<< {stdin.strip()!r}" if stdin else "")
        with tempfile.TemporaryFile() as output:
            try:
                process = await asyncio.create_subprocess_exec(
                    self.binary,
                    *args,
                    stdin=asyncio.subprocess.PIPE
                    if stdin is not None
                    else asyncio.subprocess.DEVNULL,
                    stdout=output,
                    stderr=output,
                    env=self._env,
                )
            except OSError as error:
                raise MpsError(f"{what}: cannot run it: {error}") from error
            try:
                await asyncio.wait_for(
                    process.communicate(None if stdin is None else stdin.encode()), self.timeout_s
                )
            except BaseException as error:  # timeout or cancellation: never leave it running
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await asyncio.shield(process.wait())
                if isinstance(error, TimeoutError):
                    raise MpsError(f"{what}: no answer within {self.timeout_s:g} s") from None
                raise
            output.seek(0)
            text = output.read().decode(errors="replace").strip()
        if process.returncode != 0:
            raise MpsError(f"{what}: exit status {process.returncode}: {text or '(no output)'}")
        return text

    async def start_daemon(self) -> None:
        """``nvidia-cuda-mps-control -d`` (the directories are created first)."""
        self.paths.create()
        await self._run(["-d"], None)

    async def command(self, line: str) -> str:
        """Send one command (``get_server_list``, ``quit``, ...) and return the answer."""
        return await self._run([], line + "\n")

    async def alive(self) -> bool:
        """Whether the daemon answers ``get_server_list``."""
        try:
            await self.command("get_server_list")
        except MpsError as error:
            log.debug("MPS control daemon not answering: %s", error)
            return False
        return True


OnMpsHealth = Callable[[bool], Awaitable[None]]


@dataclass
class MpsSupervisor:
    """Runs and supervises the MPS control daemon of ``gpus`` (module doc).

    ``on_health(healthy)`` is awaited on each transition of the daemon (the first start that
    fails counts as one); ``events(reason, message, warning)`` records a node Event and must not
    raise. Intervals in seconds.
    """

    control: MpsControl
    nvml: Nvml
    gpus: Sequence[PhysicalGpu]
    on_health: OnMpsHealth
    events: Callable[[str, str, bool], Awaitable[None]] | None = None
    check_interval_s: float = 5.0
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0
    ready_timeout_s: float = 10.0
    restarts: int = 0
    healthy: bool = False
    _modes: dict[int, int] = field(default_factory=dict)

    def _set_exclusive(self) -> None:
        for gpu in self.gpus:
            device = self.nvml.device_handle_by_index(gpu.index)
            mode = self.nvml.device_compute_mode(device)
            self._modes.setdefault(gpu.index, mode)
            if mode != COMPUTE_MODE_EXCLUSIVE_PROCESS:
                self.nvml.device_set_compute_mode(device, COMPUTE_MODE_EXCLUSIVE_PROCESS)
                log.info(
                    "GPU %d (%s): compute mode %s -> EXCLUSIVE_PROCESS (MPS)",
                    gpu.index, gpu.uuid, COMPUTE_MODE_NAMES.get(mode, mode),
                )  # fmt: skip

    def _restore_modes(self) -> None:
        for gpu in self.gpus:
            mode = self._modes.pop(gpu.index, None)
            if mode is None:
                continue
            try:
                device = self.nvml.device_handle_by_index(gpu.index)
                self.nvml.device_set_compute_mode(device, mode)
                log.info(
                    "GPU %d (%s): compute mode restored to %s",
                    gpu.index, gpu.uuid, COMPUTE_MODE_NAMES.get(mode, mode),
                )  # fmt: skip
            except NvmlError as error:
                log.error("GPU %d: cannot restore its compute mode: %s", gpu.index, error)

    async def _start_once(self) -> None:
        """Compute mode, ``-d``, then ``get_server_list`` until it answers (``MpsError``)."""
        try:
            await asyncio.to_thread(self._set_exclusive)
        except NvmlError as error:
            raise MpsError(
                f"cannot set the GPUs' compute mode to EXCLUSIVE_PROCESS: {error}"
            ) from error
        await self.control.start_daemon()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.ready_timeout_s
        delay_s = 0.05
        while not await self.control.alive():
            if loop.time() >= deadline:
                raise MpsError(
                    f"the MPS control daemon started but did not answer within "
                    f"{self.ready_timeout_s:g} s"
                )
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 1.0)

    async def _set_health(self, healthy: bool) -> None:
        if healthy != self.healthy:
            self.healthy = healthy
            await self.on_health(healthy)

    async def _event(self, reason: str, message: str, warning: bool) -> None:
        if self.events is not None:
            await self.events(reason, message, warning)

    async def start(self) -> bool:
        """Start the daemon once; True when it answers (else the GPUs are marked unhealthy
        and ``run`` keeps trying)."""
        try:
            await self._start_once()
        except MpsError as error:
            log.error("MPS control daemon did not start: %s", error)
            self.healthy = True  # so that the transition below is reported
            await self._set_health(False)
            await self._event(
                MPS_DOWN, f"gpushare: the MPS control daemon did not start: {error}", True
            )
            return False
        log.info(
            "MPS control daemon running for GPU(s) %s (pipe %s)",
            [g.index for g in self.gpus], self.control.paths.pipe_dir,
        )  # fmt: skip
        self.healthy = True
        return True

    async def run(self) -> None:
        """Check the daemon every ``check_interval_s``; restart it when it stops answering
        (module doc). Runs until cancelled."""
        while True:
            if self.healthy:
                await asyncio.sleep(self.check_interval_s)
                if await self.control.alive():
                    continue
                log.error("the MPS control daemon stopped answering: GPUs marked unhealthy")
                await self._set_health(False)
                await self._event(
                    MPS_DOWN,
                    "gpushare: the MPS control daemon stopped answering; its GPUs are "
                    "unhealthy until it is restarted",
                    True,
                )
            await self._restart()

    async def _restart(self) -> None:
        delay_s = self.backoff_initial_s
        attempt = 0
        while True:
            attempt += 1
            try:
                await self._start_once()
            except MpsError as error:
                log.error(
                    "restarting the MPS control daemon (attempt %d) failed: %s; next in %g s",
                    attempt, error, delay_s,
                )  # fmt: skip
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, self.backoff_max_s)
                continue
            self.restarts += 1
            log.warning("MPS control daemon restarted (attempt %d): GPUs healthy", attempt)
            await self._set_health(True)
            await self._event(
                MPS_RESTARTED,
                f"gpushare: the MPS control daemon was restarted (after {attempt} attempt(s))",
                False,
            )
            return

    async def stop(self) -> None:
        """``quit`` the daemon and restore the compute modes (the node leaves MPS mode)."""
        try:
            await self.control.command("quit")
            log.info("MPS control daemon stopped (quit)")
        except MpsError as error:
            log.warning("quitting the MPS control daemon: %s", error)
        await asyncio.to_thread(self._restore_modes)
