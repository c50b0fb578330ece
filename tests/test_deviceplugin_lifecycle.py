"""Device plugin lifecycle: a real `PluginRunner` against `FakeKubelet` on a temporary socket dir.

Both sides are real grpc.aio servers and clients on unix sockets (spec 2.4-2.6): registration,
ListAndWatch updates, kubelet and plugin restarts, clean shutdown and the refusals.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from gpushare.deviceplugin._proto import api_pb2
from gpushare.deviceplugin.inventory import (
    UNHEALTHY,
    DeviceListTooLargeError,
    PhysicalGpu,
    build_devices,
    gpu_of_device,
    parse_fake_gpus,
)
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME, PluginRunner
from gpushare.deviceplugin.registration import RegistrationError, register
from gpushare.deviceplugin.server import DevicePluginService, options, serve
from gpushare.kube.codec import GPU_MEM, MemoryUnit
from gpushare.testing.controlplane import async_wait_until
from gpushare.testing.kubelet import FakeKubelet, KubeletError, ResourceView

SPEC = "2x4GiB:T4"
UNITS = 4
DEVICES = 2 * UNITS
TIMEOUT_S = 20.0
WAIT_S = 10.0


@pytest.fixture
def socket_dir(tmp_path: Path) -> Iterator[Path]:
    """`tmp_path`, or a short directory under /tmp when unix socket paths would be too long."""
    if len(str(tmp_path)) + len(f"/{DEFAULT_SOCKET_NAME}") < 100:
        yield tmp_path
        return
    short = Path(tempfile.mkdtemp(prefix="gpsh-", dir="/tmp"))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


class EchoAllocator:
    """Answers Allocate with the device IDs it was given, as one env var."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        ids = ",".join(request.container_requests[0].devices_ids)
        return api_pb2.AllocateResponse(
            container_responses=[api_pb2.ContainerAllocateResponse(envs={"IDS": ids})]
        )


def _service(gpus: list[PhysicalGpu] | None = None) -> DevicePluginService:
    return DevicePluginService(
        parse_fake_gpus(SPEC) if gpus is None else gpus, MemoryUnit.GIB, EchoAllocator()
    )


def _runner(
    service: DevicePluginService,
    socket_dir: Path,
    resource_name: str = GPU_MEM,
    on_registered: Callable[[], Awaitable[None]] | None = None,
) -> PluginRunner:
    return PluginRunner(
        service,
        socket_dir=socket_dir,
        resource_name=resource_name,
        on_registered=on_registered,
        register_timeout_s=5.0,
        backoff_initial_s=0.02,
        backoff_max_s=0.2,
        rescan_s=1.0,
    )


def _run(main: Awaitable[None]) -> None:
    async def bounded() -> None:
        async with asyncio.timeout(TIMEOUT_S):
            await main

    asyncio.run(bounded())


def _all_healthy(view: ResourceView) -> bool:
    return view.connected and view.capacity == view.allocatable == DEVICES


@dataclass
class Env:
    """A registered plugin: the fake kubelet, the runner and its service, the socket dir."""

    dir: Path
    kubelet: FakeKubelet
    service: DevicePluginService
    runner: PluginRunner


Scenario = Callable[[Env], Awaitable[None]]


async def serve_then_register(env: Env) -> None:
    expected = api_pb2.RegisterRequest(
        version="v1beta1",
        endpoint=DEFAULT_SOCKET_NAME,
        resource_name="aliyun.com/gpu-mem",
        options=options(),
    )
    assert env.kubelet.registrations == [expected]
    assert env.runner.registrations == 1
    assert env.runner.registered
    assert env.runner.last_error is None
    assert env.runner.socket_path == env.dir / DEFAULT_SOCKET_NAME
    assert env.runner.socket_path.is_socket()


async def full_device_list(env: Env) -> None:
    view = await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    gpus = parse_fake_gpus(SPEC)
    assert view.ids == [d.ID for d in build_devices(gpus, MemoryUnit.GIB)]
    assert len(set(view.ids)) == DEVICES
    assert view.endpoint == DEFAULT_SOCKET_NAME


async def health_flip(env: Env) -> None:
    await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    sick = env.service.gpus[1].uuid
    await env.service.set_health(1, healthy=False)
    view = await env.kubelet.wait_for_devices(
        GPU_MEM, lambda v: v.allocatable == DEVICES - UNITS, WAIT_S
    )
    assert view.capacity == DEVICES
    assert {d.ID for d in view.devices if d.health == UNHEALTHY} == {
        i for i in view.ids if gpu_of_device(i) == sick
    }
    await env.service.set_health(1, healthy=True)
    await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)


async def kubelet_restart(env: Env) -> None:
    before = await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    await env.service.set_health(0, healthy=False)  # health state must survive re-registration
    await env.kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == UNITS, WAIT_S)

    await env.kubelet.restart()
    await asyncio.wait_for(env.runner.wait_registered(2), WAIT_S)
    after = await env.kubelet.wait_for_devices(
        GPU_MEM, lambda v: v.registration == 1 and v.capacity == DEVICES, WAIT_S
    )
    assert after.ids == before.ids
    assert after.allocatable == UNITS
    assert env.kubelet.registrations[1] == env.kubelet.registrations[0]
    assert env.runner.socket_path.is_socket()

    response = await env.kubelet.allocate(GPU_MEM, size=2)  # served by the new socket
    chosen = list(env.kubelet.allocate_requests[-1].container_requests[0].devices_ids)
    assert response.container_responses[0].envs["IDS"] == ",".join(chosen)
    assert {gpu_of_device(i) for i in chosen} == {env.service.gpus[1].uuid}


async def kubelet_socket_recreated(env: Env) -> None:
    """Detection method 2 alone (spec 2.6): kubelet.sock re-created, the plugin's socket kept."""
    before = await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    await env.kubelet.stop()
    await env.kubelet.start()
    assert env.runner.socket_path.is_socket()
    await asyncio.wait_for(env.runner.wait_registered(2), WAIT_S)
    after = await env.kubelet.wait_for_devices(
        GPU_MEM, lambda v: v.registration == 1 and _all_healthy(v), WAIT_S
    )
    assert after.ids == before.ids


async def plugin_restart(env: Env) -> None:
    before = await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    await env.runner.stop()
    gone = await env.kubelet.wait_for_devices(GPU_MEM, lambda v: not v.connected, WAIT_S)
    assert (gone.capacity, gone.allocatable) == (DEVICES, 0)  # spec 2.6: stream broke

    async with _runner(_service(), env.dir) as again:
        await asyncio.wait_for(again.wait_registered(1), WAIT_S)
        after = await env.kubelet.wait_for_devices(
            GPU_MEM, lambda v: v.registration == 1 and _all_healthy(v), WAIT_S
        )
        assert after.ids == before.ids


async def clean_shutdown(env: Env) -> None:
    await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    await env.runner.stop()
    await env.runner.stop()  # idempotent
    assert not env.runner.socket_path.exists()
    assert env.kubelet.socket_path.is_socket()
    assert sorted(p.name for p in env.dir.iterdir()) == ["DEPRECATION", "kubelet.sock"]
    await env.kubelet.wait_for_devices(GPU_MEM, lambda v: not v.connected, WAIT_S)


async def deprecation_ignored(env: Env) -> None:
    await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
    deprecation = env.dir / "DEPRECATION"
    deprecation.unlink()
    deprecation.touch()
    with socket.socket(socket.AF_UNIX) as other:
        other.bind(str(env.dir / "other.sock"))
    (env.dir / "other.sock").unlink()
    await asyncio.sleep(0.2)  # several inotify batches (20 ms steps); a reaction would show
    assert env.runner.registrations == 1
    assert len(env.kubelet.registrations) == 1
    assert (await env.kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)).registration == 0


@pytest.mark.parametrize(
    "scenario",
    [
        serve_then_register,
        full_device_list,
        health_flip,
        kubelet_restart,
        kubelet_socket_recreated,
        plugin_restart,
        clean_shutdown,
        deprecation_ignored,
    ],
    ids=lambda s: s.__name__,
)
def test_registered_plugin(socket_dir: Path, scenario: Scenario) -> None:
    async def main() -> None:
        async with FakeKubelet(socket_dir) as kubelet:
            service = _service()
            async with _runner(service, socket_dir) as runner:
                await asyncio.wait_for(runner.wait_registered(1), WAIT_S)
                await scenario(Env(socket_dir, kubelet, service, runner))
            assert not runner.socket_path.exists()
            assert kubelet.socket_path.is_socket()

    _run(main())


def test_registers_once_kubelet_is_up(socket_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with _runner(_service(), socket_dir) as runner:
            assert runner.socket_path.is_socket()  # served before any registration
            await async_wait_until("4 register attempts", lambda: runner.attempts >= 4, WAIT_S)
            assert runner.registrations == 0
            assert runner.last_error is not None
            assert runner.last_error.code is None
            assert "kubelet.sock does not exist" in str(runner.last_error)
            assert "is kubelet running?" in str(runner.last_error)
            async with FakeKubelet(socket_dir) as kubelet:
                await asyncio.wait_for(runner.wait_registered(1), WAIT_S)
                await kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
                assert runner.last_error is None

    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin.lifecycle"):
        _run(main())
    failures = [r for r in caplog.records if "cannot register" in r.getMessage()]
    assert len(failures) == 1  # one log line per state, not per attempt


@pytest.mark.parametrize(
    ("resource", "fragment"),
    [
        ("gpu-mem", 'the ResourceName "gpu-mem" is invalid'),
        ("kubernetes.io/gpu-mem", 'the ResourceName "kubernetes.io/gpu-mem" is invalid'),
        ("requests.aliyun.com/gpu-mem", "is invalid"),
        ("aliyun.com/-gpu-mem", "is invalid"),
    ],
    ids=["no-domain", "native-domain", "requests-prefix", "bad-name"],
)
def test_register_rejected(socket_dir: Path, resource: str, fragment: str) -> None:
    async def main() -> None:
        async with FakeKubelet(socket_dir) as kubelet:
            server = await serve(_service(), socket_dir)
            try:
                with pytest.raises(RegistrationError) as err:
                    await register(kubelet.socket_path, DEFAULT_SOCKET_NAME, resource, 5.0)
            finally:
                await server.stop()
        e = err.value
        assert e.code == grpc.StatusCode.UNKNOWN
        assert (e.kubelet_socket, e.resource_name) == (kubelet.socket_path, resource)
        message = str(e)
        assert "\n" not in message
        for part in (str(kubelet.socket_path), resource, "UNKNOWN", fragment, "refused"):
            assert part in message

    _run(main())


def test_register_fails_when_plugin_does_not_answer(socket_dir: Path) -> None:
    """kubelet dials the plugin inside Register (spec 2.4, pitfall 15): no server, no Register."""

    async def main() -> None:
        async with FakeKubelet(socket_dir, dial_timeout_s=0.5) as kubelet:
            with pytest.raises(RegistrationError) as err:
                await register(kubelet.socket_path, "absent.sock", GPU_MEM, 5.0)
            assert "failed to dial device plugin" in str(err.value)
            assert kubelet.resource(GPU_MEM) is None
            with pytest.raises(KubeletError, match="unregistered device"):
                await kubelet.allocate(GPU_MEM, size=1)

    _run(main())


def test_register_reaches_a_kubelet_that_listens_where_a_dead_one_refused(
    socket_dir: Path,
) -> None:
    """A node reboot: the dead kubelet's socket refuses, the new kubelet listens on the same path
    a moment later. The next Register, with the refused attempt's error still held (the runner
    keeps it as `last_error`), reaches the new kubelet at once: gRPC's process-wide subchannel
    pool would answer it with the cached refusal for a reconnect backoff (about 1 s), and kubelet
    admitted the node's GPU pods before the plugin's devices came (UnexpectedAdmissionError)."""

    async def main() -> None:
        kubelet = FakeKubelet(socket_dir)
        with socket.socket(socket.AF_UNIX) as dead:
            dead.bind(str(kubelet.socket_path))  # a socket file that nothing listens on
        refused: list[RegistrationError] = []
        for resource in ("aliyun.com/gpu-mem", "tencent.com/vcuda-memory"):
            with pytest.raises(RegistrationError) as err:
                await register(kubelet.socket_path, DEFAULT_SOCKET_NAME, resource, 5.0)
            assert "Connection refused" in str(err.value)
            refused.append(err.value)
        server = await serve(_service(), socket_dir)
        try:
            async with kubelet:
                await register(kubelet.socket_path, DEFAULT_SOCKET_NAME, GPU_MEM, 5.0)
                await kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
        finally:
            await server.stop()

    _run(main())


def test_runner_keeps_retrying_a_rejected_register(socket_dir: Path) -> None:
    async def main() -> None:
        async with (
            FakeKubelet(socket_dir) as kubelet,
            _runner(_service(), socket_dir, resource_name="gpu-mem") as runner,
        ):
            await async_wait_until("2 register attempts", lambda: runner.attempts >= 2, WAIT_S)
            assert runner.registrations == 0
            assert runner.last_error is not None
            assert 'the ResourceName "gpu-mem" is invalid' in str(runner.last_error)
            assert kubelet.resource("gpu-mem") is None

    _run(main())


def test_device_list_too_large_refused_before_any_socket(socket_dir: Path) -> None:
    gpus = parse_fake_gpus("16x80GiB")

    async def main() -> None:
        async with FakeKubelet(socket_dir) as kubelet:
            with pytest.raises(DeviceListTooLargeError) as err:
                await _runner(DevicePluginService(gpus, MemoryUnit.MIB), socket_dir).start()
            assert "--memory-unit GiB" in str(err.value)
            assert sorted(p.name for p in socket_dir.iterdir()) == ["DEPRECATION", "kubelet.sock"]
            assert kubelet.registrations == []

    _run(main())


def test_stop_before_registration_leaves_no_socket(socket_dir: Path) -> None:
    async def main() -> None:
        runner = _runner(_service(), socket_dir)
        await runner.start()
        assert runner.socket_path.is_socket()
        await runner.stop()
        assert list(socket_dir.iterdir()) == []

    _run(main())


def test_on_registered_hook_runs_after_each_registration(socket_dir: Path) -> None:
    calls: list[int] = []

    async def main() -> None:
        async def hook() -> None:
            calls.append(runner.registrations)
            if len(calls) == 1:
                raise RuntimeError("hook failure is logged, not fatal")

        async with FakeKubelet(socket_dir) as kubelet:
            runner = _runner(_service(), socket_dir, on_registered=hook)
            async with runner:
                await asyncio.wait_for(runner.wait_registered(1), WAIT_S)
                await kubelet.restart()
                await asyncio.wait_for(runner.wait_registered(2), WAIT_S)
                await kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
                assert runner.registered

    _run(main())
    assert calls == [1, 2]


def test_serve_forever_shuts_down_cleanly_when_cancelled(socket_dir: Path) -> None:
    async def main() -> None:
        async with FakeKubelet(socket_dir) as kubelet:
            runner = _runner(_service(), socket_dir)
            task = asyncio.create_task(runner.serve_forever())
            await kubelet.wait_for_devices(GPU_MEM, _all_healthy, WAIT_S)
            task.cancel()
            await asyncio.wait([task])
            assert task.cancelled()
            assert not runner.socket_path.exists()
            await kubelet.wait_for_devices(GPU_MEM, lambda v: not v.connected, WAIT_S)

    _run(main())
