"""Device plugin v1beta1: a real grpc.aio server on a temporary unix socket, a real client stub."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

import grpc
import pytest
from grpc import aio

from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.inventory import (
    HEALTHY,
    KUBELET_MAX_MESSAGE_BYTES,
    UNHEALTHY,
    DeviceListTooLargeError,
    FakeGpuSpecError,
    FakeInventory,
    PhysicalGpu,
    check_message_size,
    device_id,
    gpu_of_device,
    list_and_watch_response,
    parse_fake_gpus,
)
from gpushare.deviceplugin.server import ALLOCATE_NOT_READY, DevicePluginService, serve
from gpushare.kube.codec import MemoryUnit

if TYPE_CHECKING:
    from gpushare.deviceplugin._proto.api_pb2_grpc import DevicePluginAsyncStub

Scenario: TypeAlias = "Callable[[DevicePluginAsyncStub, DevicePluginService], Awaitable[None]]"


def _run(tmp_path: Path, gpus: list[PhysicalGpu], unit: MemoryUnit, scenario: Scenario) -> None:
    """Serve on `tmp_path`, dial it as kubelet would, run `scenario`, stop and check cleanup."""

    async def main() -> None:
        service = DevicePluginService(gpus, unit)
        server = await serve(service, tmp_path, "gpushare-test.sock")
        assert server.socket_path.exists()
        try:
            async with aio.insecure_channel(server.address) as channel:
                await asyncio.wait_for(
                    scenario(api_pb2_grpc.DevicePluginStub(channel), service), 20
                )
        finally:
            await server.stop()
        assert not server.socket_path.exists()

    asyncio.run(main())


def test_options(tmp_path: Path) -> None:
    async def scenario(stub: DevicePluginAsyncStub, _: DevicePluginService) -> None:
        opts = await stub.GetDevicePluginOptions(api_pb2.Empty())
        assert opts.get_preferred_allocation_available
        assert not opts.pre_start_required
        assert await stub.PreStartContainer(
            api_pb2.PreStartContainerRequest(devices_ids=["x"])
        ) == (api_pb2.PreStartContainerResponse())

    _run(tmp_path, parse_fake_gpus("1x2GiB:T4"), MemoryUnit.GIB, scenario)


@pytest.mark.parametrize(
    ("spec", "unit", "expected"),
    [("2x16GiB:T4", MemoryUnit.GIB, 32), ("1x3GiB:T4,2x1GiB:L4", MemoryUnit.MIB, 5 * 1024)],
)
def test_first_list_and_watch(tmp_path: Path, spec: str, unit: MemoryUnit, expected: int) -> None:
    gpus = parse_fake_gpus(spec)

    async def scenario(stub: DevicePluginAsyncStub, _: DevicePluginService) -> None:
        stream = stub.ListAndWatch(api_pb2.Empty())
        first = await stream.read()
        assert isinstance(first, api_pb2.ListAndWatchResponse)
        assert len(first.devices) == expected == sum(g.units(unit) for g in gpus)
        assert {d.health for d in first.devices} == {HEALTHY}
        ids = [d.ID for d in first.devices]
        assert len(set(ids)) == len(ids)
        assert all(len(i) <= 63 for i in ids)
        assert {gpu_of_device(i) for i in ids} == {g.uuid for g in gpus}

    _run(tmp_path, gpus, unit, scenario)


def test_health_flip_is_resent(tmp_path: Path) -> None:
    gpus = parse_fake_gpus("2x4GiB:T4")

    async def scenario(stub: DevicePluginAsyncStub, service: DevicePluginService) -> None:
        stream = stub.ListAndWatch(api_pb2.Empty())
        first = await stream.read()
        assert isinstance(first, api_pb2.ListAndWatchResponse)
        assert [d.health for d in first.devices] == [HEALTHY] * 8

        await service.set_health(1, healthy=False)
        second = await stream.read()
        assert isinstance(second, api_pb2.ListAndWatchResponse)
        health = {d.ID: d.health for d in second.devices}
        assert len(health) == 8
        for ident, state in health.items():
            bad = gpu_of_device(ident) == gpus[1].uuid
            assert state == (UNHEALTHY if bad else HEALTHY)

        await service.set_health(1, healthy=True)
        third = await stream.read()
        assert isinstance(third, api_pb2.ListAndWatchResponse)
        assert {d.health for d in third.devices} == {HEALTHY}

    _run(tmp_path, gpus, MemoryUnit.GIB, scenario)


def test_allocate_refuses_until_handshake(tmp_path: Path) -> None:
    async def scenario(stub: DevicePluginAsyncStub, _: DevicePluginService) -> None:
        request = api_pb2.AllocateRequest(
            container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=["a", "b"])]
        )
        with pytest.raises(aio.AioRpcError) as err:
            await stub.Allocate(request)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert ALLOCATE_NOT_READY in (err.value.details() or "")

    _run(tmp_path, parse_fake_gpus("1x2GiB"), MemoryUnit.GIB, scenario)


def test_preferred_allocation(tmp_path: Path) -> None:
    gpus = parse_fake_gpus("1x4GiB")
    a, b, c, d = (device_id(gpus[0], n) for n in range(4))

    async def scenario(stub: DevicePluginAsyncStub, _: DevicePluginService) -> None:
        request = api_pb2.PreferredAllocationRequest(
            container_requests=[
                api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[a, b, c, d],
                    must_include_deviceIDs=[c],
                    allocation_size=3,
                )
            ]
        )
        response = await stub.GetPreferredAllocation(request)
        assert [list(r.deviceIDs) for r in response.container_responses] == [[c, a, b]]

    _run(tmp_path, gpus, MemoryUnit.GIB, scenario)


def _preferred(
    available: Sequence[str], must: Sequence[str] = (), size: int = 1
) -> api_pb2.PreferredAllocationRequest:
    return api_pb2.PreferredAllocationRequest(
        container_requests=[
            api_pb2.ContainerPreferredAllocationRequest(
                available_deviceIDs=available, must_include_deviceIDs=must, allocation_size=size
            )
        ]
    )


FOUR = [device_id(parse_fake_gpus("1x4GiB")[0], n) for n in range(4)]
REFUSED_PREFERRED = {
    "more IDs than twice the devices": (
        _preferred(FOUR * 2, FOUR[:1], 1),
        "lists 9 device IDs over 1 container request(s); this plugin has 4 devices",
    ),
    "an ID never advertised": (
        _preferred([*FOUR[:3], "GPU-other-_-0"]),
        "device ID 'GPU-other-_-0' is not a device this plugin advertised",
    ),
    "allocation size past the devices": (
        _preferred(FOUR, size=5),
        "allocation_size 5 is out of range; accepted 0 to 4 devices",
    ),
}


@pytest.mark.parametrize(
    ("request_", "message"), REFUSED_PREFERRED.values(), ids=REFUSED_PREFERRED.keys()
)
def test_preferred_allocation_refuses_what_kubelet_never_sends(
    tmp_path: Path, request_: api_pb2.PreferredAllocationRequest, message: str
) -> None:
    async def scenario(stub: DevicePluginAsyncStub, _: DevicePluginService) -> None:
        with pytest.raises(aio.AioRpcError) as err:
            await stub.GetPreferredAllocation(request_)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert message in (err.value.details() or "")

    _run(tmp_path, parse_fake_gpus("1x4GiB"), MemoryUnit.GIB, scenario)


class _Immediate:
    """An allocator that answers at once (the handshake is tested elsewhere)."""

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        return api_pb2.AllocateResponse(
            container_responses=[
                api_pb2.ContainerAllocateResponse(envs={"N": str(len(c.devices_ids))})
                for c in request.container_requests
            ]
        )


def _allocate(ids: Sequence[str], containers: int = 1) -> api_pb2.AllocateRequest:
    return api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)] * containers
    )


HUGE_PREFERRED = {
    # 100,000 IDs (short, so that they fit gRPC's 4 MiB) once held the event loop for 30 s
    "100,000 IDs never advertised": (
        lambda ids: _preferred([f"d{n}" for n in range(100_000)], size=60_000),
        grpc.StatusCode.INVALID_ARGUMENT,
    ),
    # the largest legitimate request: every device of a 40 GiB GPU counted in MiB
    "every device of a 40960-device node": (
        lambda ids: _preferred(ids[::-1], ids[:20_000], size=len(ids)),
        grpc.StatusCode.OK,
    ),
}


@pytest.mark.parametrize(("make", "code"), HUGE_PREFERRED.values(), ids=HUGE_PREFERRED.keys())
def test_huge_preferred_allocation_leaves_allocates_answered(
    tmp_path: Path,
    make: Callable[[list[str]], api_pb2.PreferredAllocationRequest],
    code: grpc.StatusCode,
) -> None:
    """A huge GetPreferredAllocation, then 500 Allocates at once: every Allocate is answered
    within a generous 20 s deadline, and the huge request gets its answer or INVALID_ARGUMENT."""
    gpus = parse_fake_gpus("1x40GiB:A100")
    ids = [device_id(gpus[0], n) for n in range(gpus[0].units(MemoryUnit.MIB))]

    async def main() -> None:
        service = DevicePluginService(gpus, MemoryUnit.MIB, allocator=_Immediate())
        server = await serve(service, tmp_path, "gpushare-test.sock")
        try:
            async with aio.insecure_channel(server.address) as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                huge = asyncio.ensure_future(stub.GetPreferredAllocation(make(ids), timeout=120))
                await asyncio.sleep(0)
                allocates = [stub.Allocate(_allocate(ids[:2]), timeout=20) for _ in range(500)]
                answers = await asyncio.gather(*allocates, return_exceptions=True)
                failed = [a for a in answers if not isinstance(a, api_pb2.AllocateResponse)]
                assert failed == [], f"{len(failed)} of 500 Allocates failed: {failed[:1]}"
                outcome = (await asyncio.gather(huge, return_exceptions=True))[0]
                if code is grpc.StatusCode.OK:
                    assert isinstance(outcome, api_pb2.PreferredAllocationResponse), outcome
                    (chosen,) = outcome.container_responses
                    assert list(chosen.deviceIDs[:20_000]) == ids[:20_000]
                    assert sorted(chosen.deviceIDs) == sorted(ids)
                else:
                    assert isinstance(outcome, aio.AioRpcError), outcome
                    assert outcome.code() == code
        finally:
            await server.stop()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (_allocate(FOUR[:1], containers=17), "17 container requests; accepted at most 16"),
        (_allocate(FOUR + FOUR[:1]), "asks for 5 devices; this plugin has 4"),
    ],
    ids=["17 containers", "more devices than the plugin has"],
)
def test_allocate_refuses_what_kubelet_never_sends(
    tmp_path: Path, request_: api_pb2.AllocateRequest, message: str
) -> None:
    async def main() -> None:
        service = DevicePluginService(parse_fake_gpus("1x4GiB"), allocator=_Immediate())
        server = await serve(service, tmp_path, "gpushare-test.sock")
        try:
            async with aio.insecure_channel(server.address) as channel:
                stub = api_pb2_grpc.DevicePluginStub(channel)
                with pytest.raises(aio.AioRpcError) as err:
                    await stub.Allocate(request_)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert message in (err.value.details() or "")
                assert (await stub.Allocate(_allocate(FOUR[:2]))).container_responses[0].envs == {
                    "N": "2"
                }
        finally:
            await server.stop()

    asyncio.run(main())


@pytest.mark.parametrize("spec", ["1x1GiB", "2x16GiB:T4", "3x13GiB:X"])
def test_computed_size_matches_serialised(spec: str) -> None:
    gpus = [replace(g, healthy=False) for g in parse_fake_gpus(spec)]
    for unit in MemoryUnit:
        expected = list_and_watch_response(gpus, unit).ByteSize()
        assert check_message_size(gpus, unit, limit=10**9) == expected


def test_message_size_refusal_names_numbers() -> None:
    gpus = parse_fake_gpus("8x80GiB:H100")
    assert check_message_size(gpus, MemoryUnit.GIB) < KUBELET_MAX_MESSAGE_BYTES
    with pytest.raises(DeviceListTooLargeError) as err:
        check_message_size(gpus, MemoryUnit.MIB)
    e = err.value
    assert (e.gpus, e.devices, e.limit) == (8, 8 * 80 * 1024, KUBELET_MAX_MESSAGE_BYTES)
    assert e.size > KUBELET_MAX_MESSAGE_BYTES
    message = str(e)
    for part in ("8 GPU(s)", "655360 devices", str(e.size), str(KUBELET_MAX_MESSAGE_BYTES)):
        assert part in message
    assert "--memory-unit GiB" in message
    with pytest.raises(DeviceListTooLargeError):
        DevicePluginService(gpus, MemoryUnit.MIB)


def test_largest_declaration_is_refused_without_listing_every_device() -> None:
    """256 GPUs of 1 TiB in MiB are 2^28 devices: the check stops at kubelet's limit."""
    gpus = parse_fake_gpus("256x1024GiB:X")
    with pytest.raises(DeviceListTooLargeError) as err:
        check_message_size(gpus, MemoryUnit.MIB)
    assert err.value.devices == 256 * 1024 * 1024
    assert "at least" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("2x16GiB:T4", [(0, "T4", 16384), (1, "T4", 16384)]),
        ("16GiB:T4", [(0, "T4", 16384)]),
        ("1x512MiB", [(0, "FakeGPU", 512)]),
        (
            "1x80GiB:H100 80GB HBM3, 2X24GiB:L4",
            [(0, "H100 80GB HBM3", 81920), (1, "L4", 24576), (2, "L4", 24576)],
        ),
    ],
)
def test_fake_spec_parses(spec: str, expected: list[tuple[int, str, int]]) -> None:
    gpus = parse_fake_gpus(spec)
    assert [(g.index, g.model, g.memory_mib) for g in gpus] == expected
    assert [g.minor for g in gpus] == [g.index for g in gpus]
    assert len({g.uuid for g in gpus}) == len(gpus)
    assert all(g.healthy for g in gpus)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("", "empty --fake-gpus"),
        ("two T4s", "bad --fake-gpus group 'two T4s'"),
        ("2x16GB:T4", "COUNTxSIZE(GiB|MiB)"),
        ("0x16GiB:T4", "GPU count 0 is out of range; accepted 1 to 256"),
        ("2x0GiB:T4", "memory in GiB 0 is out of range; accepted 1 to 1024"),
        ("2x16GiB:", "model must be 1 to 64 characters"),
        ("2x16GiB:T4,", "bad --fake-gpus group ''"),
        (
            "99999999x16GiB:T4",
            "bad --fake-gpus group '99999999x16GiB:T4': GPU count 99999999 is out of range; "
            "accepted 1 to 256",
        ),
        (
            "1x99999999999999999999GiB:X",
            "memory in GiB 99999999999999999999 is out of range; accepted 1 to 1024",
        ),
        ("1x1048577MiB:X", "memory in MiB 1048577 is out of range; accepted 1 to 1048576"),
        ("200x16GiB:A,57x16GiB:B", "'57x16GiB:B': 257 GPUs in all; accepted at most 256"),
        ("9" * 5000 + "x1GiB", "GPU count 999"),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_fake_spec_errors(spec: str, fragment: str) -> None:
    with pytest.raises(FakeGpuSpecError) as err:
        parse_fake_gpus(spec)
    assert fragment in str(err.value)


def test_fake_inventory_logs_that_it_is_fake(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpushare.deviceplugin.inventory"):
        inventory = FakeInventory("2x16GiB:T4")
    assert inventory.fake
    assert len(inventory.gpus()) == 2
    assert "FAKE GPU inventory" in caplog.text
    assert inventory.set_health(1, healthy=False).healthy is False
    assert [g.healthy for g in inventory.gpus()] == [True, False]
