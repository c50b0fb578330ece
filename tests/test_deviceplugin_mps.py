"""The managed MPS control daemon (docs/usage.md, "Enforced shares (MPS)"): started with the GPUs in
EXCLUSIVE_PROCESS, a crash restarted with the GPUs unhealthy meanwhile and Events on the node,
``quit`` and the compute modes restored on stop. The daemon is ``gpushare.testing.mps_control`` (the
documented command protocol, a real separate process, killed for a crash); NVML is ``FakeNvml``. A
real GPU's daemon is exercised by ``bench/gpu`` (see docs/usage.md)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.mps import (
    MPS_DOWN,
    MPS_RESTARTED,
    MpsControl,
    MpsError,
    MpsPaths,
    MpsSupervisor,
)
from gpushare.deviceplugin.nvml import (
    COMPUTE_MODE_DEFAULT,
    COMPUTE_MODE_EXCLUSIVE_PROCESS,
    COMPUTE_MODE_NAMES,
    NvmlError,
)
from gpushare.testing import mps_control
from gpushare.testing.nvml import FakeDevice, FakeNvml

GIB = 2**30
UUIDS = ("GPU-00000000-0000-4000-8000-000000000000", "GPU-00000000-0000-4000-8000-000000000001")
ERROR_NO_PERMISSION = 4


@dataclass
class World:
    """Two fake GPUs, the fake binary, the MPS directories, and what the supervisor reported."""

    root: Path
    binary: Path
    nvml: FakeNvml
    gpus: list[PhysicalGpu]
    health: list[bool] = field(default_factory=list)
    events: list[tuple[str, str, bool]] = field(default_factory=list)
    changed: asyncio.Event | None = None

    @property
    def paths(self) -> MpsPaths:
        return MpsPaths(self.root / "mps")

    def control(self, binary: Path | None = None) -> MpsControl:
        return MpsControl(self.paths, [g.uuid for g in self.gpus], binary=binary or self.binary)

    async def on_health(self, healthy: bool) -> None:
        self.health.append(healthy)
        if self.changed is not None:
            self.changed.set()

    async def on_event(self, reason: str, message: str, warning: bool) -> None:
        self.events.append((reason, message, warning))

    def supervisor(self, binary: Path | None = None) -> MpsSupervisor:
        return MpsSupervisor(
            self.control(binary),
            self.nvml,
            self.gpus,
            self.on_health,
            events=self.on_event,
            check_interval_s=0.05,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
        )

    async def transition(self, count: int) -> None:
        """Wait until ``count`` health transitions were reported."""
        while len(self.health) < count:
            self.changed = asyncio.Event()
            await asyncio.wait_for(self.changed.wait(), 30)

    def log(self) -> str:
        path = self.paths.log_dir / "control.log"
        return path.read_text() if path.exists() else ""


@pytest.fixture
def world() -> Iterator[World]:
    # A short path: unix socket paths are limited to 107 bytes.
    root = Path(tempfile.mkdtemp(prefix="gpushare-mps-", dir="/tmp"))
    devices = [FakeDevice(uuid, i, "Tesla T4", 16 * GIB) for i, uuid in enumerate(UUIDS)]
    nvml = FakeNvml(devices)
    nvml.init()
    gpus = [PhysicalGpu(i, uuid, i, "Tesla T4", 16 * 1024) for i, uuid in enumerate(UUIDS)]
    w = World(root, mps_control.install(root / "bin"), nvml, gpus)
    try:
        yield w
    finally:
        with contextlib.suppress(ProcessLookupError, RuntimeError):
            mps_control.kill_daemon(w.paths.pipe_dir)
        shutil.rmtree(root, ignore_errors=True)


def test_start_sets_exclusive_process_and_the_daemon_answers(world: World) -> None:
    world.nvml.compute_modes[1] = COMPUTE_MODE_EXCLUSIVE_PROCESS  # already so: left as is

    async def scenario() -> None:
        supervisor = world.supervisor()
        assert await supervisor.start()
        assert supervisor.healthy
        control = world.control()
        assert await control.alive()
        assert await control.command("set_default_active_thread_percentage 25") == "25.0"
        assert await control.command("get_default_active_thread_percentage") == "25.0"

    asyncio.run(scenario())
    assert world.nvml.compute_modes == [COMPUTE_MODE_EXCLUSIVE_PROCESS] * 2
    assert world.nvml.calls.count("device_set_compute_mode") == 1
    assert world.health == []  # no transition: healthy from the start
    assert f"Starting control daemon using socket {world.paths.pipe_dir}/control" in world.log()
    assert mps_control.daemon_pid(world.paths.pipe_dir) is not None


def test_a_crash_is_restarted_with_gpus_unhealthy_meanwhile_and_events(world: World) -> None:
    async def scenario() -> tuple[int, int]:
        supervisor = world.supervisor()
        assert await supervisor.start()
        task = asyncio.create_task(supervisor.run())
        try:
            crashed = mps_control.kill_daemon(world.paths.pipe_dir)
            await world.transition(2)
            restarted = mps_control.daemon_pid(world.paths.pipe_dir)
            assert restarted is not None
            assert await world.control().alive()
            assert supervisor.restarts == 1
            return crashed, restarted
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    crashed, restarted = asyncio.run(scenario())
    assert restarted != crashed
    assert world.health == [False, True]
    assert [(reason, warning) for reason, _, warning in world.events] == [
        (MPS_DOWN, True),
        (MPS_RESTARTED, False),
    ]
    assert "stopped answering" in world.events[0][1]
    assert world.log().count("Starting control daemon") == 2


def test_stop_quits_the_daemon_and_restores_the_compute_modes(world: World) -> None:
    prohibited = next(m for m, name in COMPUTE_MODE_NAMES.items() if name == "PROHIBITED")
    world.nvml.compute_modes[1] = prohibited

    async def scenario() -> None:
        supervisor = world.supervisor()
        assert await supervisor.start()
        assert world.nvml.compute_modes == [COMPUTE_MODE_EXCLUSIVE_PROCESS] * 2
        await supervisor.stop()
        assert not await world.control().alive()

    asyncio.run(scenario())
    assert world.nvml.compute_modes == [COMPUTE_MODE_DEFAULT, prohibited]
    assert "Cmd:quit" in world.log()
    assert mps_control.daemon_pid(world.paths.pipe_dir) is None
    assert not (world.paths.pipe_dir / "control").exists()


def test_a_failed_first_start_is_reported_and_retried(world: World) -> None:
    world.nvml.set_compute_mode_error = NvmlError(ERROR_NO_PERMISSION, "Insufficient Permissions")

    async def scenario() -> None:
        supervisor = world.supervisor()
        assert not await supervisor.start()
        assert world.health == [False]
        task = asyncio.create_task(supervisor.run())
        try:
            world.nvml.set_compute_mode_error = None  # e.g. the operator fixed the privileges
            await world.transition(2)
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    asyncio.run(scenario())
    assert world.health == [False, True]
    reason, message, warning = world.events[0]
    assert (reason, warning) == (MPS_DOWN, True)
    assert "compute mode to EXCLUSIVE_PROCESS: Insufficient Permissions" in message
    assert world.events[1][0] == MPS_RESTARTED


def test_a_missing_binary_is_named(world: World) -> None:
    async def scenario() -> None:
        with pytest.raises(MpsError, match=r"/nowhere/nvidia-cuda-mps-control -d: cannot run it"):
            await world.control(Path("/nowhere/nvidia-cuda-mps-control")).start_daemon()

    asyncio.run(scenario())


def test_paths_give_clients_variables_and_mounts(world: World) -> None:
    paths = world.paths
    assert paths.envs() == {
        "CUDA_MPS_PIPE_DIRECTORY": f"{paths.root}/pipe",
        "CUDA_MPS_LOG_DIRECTORY": f"{paths.root}/log",
    }
    mounts = [(m.container_path, m.host_path, m.read_only) for m in paths.mounts()]
    assert mounts == [
        (f"{paths.root}/pipe", f"{paths.root}/pipe", False),
        (f"{paths.root}/log", f"{paths.root}/log", True),
        ("/dev/shm", f"{paths.root}/shm", False),
    ]
