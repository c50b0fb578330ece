"""Allocate against the real API server: the device plugin's gRPC server on a temporary unix
socket, a real gRPC client calling Allocate as kubelet does (one container per call, device IDs
only), pods bound to a kwok node with the allocation the extender records.

* a pod gets the GPU its annotations name, with Alibaba's variables, and is marked assigned;
* pending pods of different sizes, admitted in both orders, each get their own GPUs;
* equal pending pods on one GPU (the extender's rule) are interchangeable in both orders;
* equal pending pods on different GPUs (the rule bypassed) are refused, never guessed;
* a multi-container pod gets its containers' GPUs in spec order, even when another pending pod
  asks as much as its second container first;
* nothing pending of that size: FAILED_PRECONDITION naming the amount, the node and the pods;
* a restarted plugin reads what was assigned from the pods and never answers a step twice;
* MPS mode adds the pinned memory limit and the thread percentage, a managed daemon its
  directories (variables and mounts);
* with a ServiceAccount that lacks ``patch`` on pods, Allocate fails and says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import pytest
from grpc import aio
from lightkube import Client
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Event, Namespace, Pod

from gpushare.core.model import Gpu
from gpushare.core.model import Node as CoreNode
from gpushare.deviceplugin._proto import api_pb2, api_pb2_grpc
from gpushare.deviceplugin.allocate import HandshakeAllocator
from gpushare.deviceplugin.daemon import EVENT_COMPONENT
from gpushare.deviceplugin.inventory import PhysicalGpu, device_id, parse_fake_gpus
from gpushare.deviceplugin.mps import MpsPaths
from gpushare.deviceplugin.server import DevicePluginService, serve
from gpushare.kube.client import connect
from gpushare.kube.codec import (
    ALIYUN_ASSIGNED,
    GPU_MEM,
    MemoryUnit,
)
from gpushare.kube.codec.handshake import ASSIGNED_CONTAINERS
from gpushare.kube.events import EventRecorder
from gpushare.kube.nodepods import NodePods
from gpushare.testing.controlplane import ControlPlane
from gpushare.testing.nodes import FakeGpu, create_nodes, delete_nodes, gpu_node
from gpushare.testing.pods import bound_gpu_pod

if TYPE_CHECKING:
    from gpushare.deviceplugin._proto.api_pb2_grpc import DevicePluginAsyncStub

pytestmark = pytest.mark.cluster

T = TypeVar("T")
GPUS = parse_fake_gpus("2x16GiB:T4")
CORE_NODE = CoreNode("n", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
_names = itertools.count()
PLUGIN_RULES = [
    PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list", "watch", "patch"]),
]


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture
def node(kube: Client) -> Iterator[str]:
    name = f"dp-node-{next(_names)}-{int(time.time())}"
    create_nodes(kube, [gpu_node(name, [FakeGpu(0, 16), FakeGpu(1, 16)], unit=MemoryUnit.GIB)])
    yield name
    delete_nodes(kube, [name])


@pytest.fixture
def namespace(kube: Client) -> Iterator[str]:
    name = f"dp-{next(_names)}-{int(time.time())}"
    kube.create(Namespace(metadata=ObjectMeta(name=name)))
    yield name
    kube.delete(Namespace, name)


def bound_pod(
    kube: Client,
    namespace: str,
    node: str,
    name: str,
    containers: Sequence[tuple[str, tuple[int, ...], int]],
    *,
    assume_ns: int,
) -> str:
    """Create pod ``name`` bound to ``node`` with the allocation the extender records."""
    core = CoreNode(node, CORE_NODE.gpus)
    kube.create(bound_gpu_pod(namespace, name, core, containers, assume_ns=assume_ns))
    return f"{namespace}/{name}"


@contextlib.asynccontextmanager
async def plugin(
    plane: ControlPlane,
    node: str,
    gpus: list[PhysicalGpu],
    *,
    mps: bool = False,
    mps_paths: MpsPaths | None = None,
    kubeconfig: Path | None = None,
) -> AsyncIterator[DevicePluginAsyncStub]:
    """The device plugin for ``node`` (pods cache, handshake allocator, gRPC server on a fresh
    socket) and a client stub dialled as kubelet dials it."""
    client = connect(kubeconfig or plane.kubeconfig, trust_env=False)
    pods = NodePods(client, node)
    pods.start()
    socket_dir = Path(tempfile.mkdtemp(prefix="gpushare-dp-", dir="/tmp"))
    try:
        await pods.wait_synced(30)
        events = EventRecorder(client, component=EVENT_COMPONENT)
        service = DevicePluginService(gpus, MemoryUnit.GIB)
        service.allocator = allocator = HandshakeAllocator(
            node, service, pods, mps=mps, mps_paths=mps_paths, events=events
        )
        server = await serve(service, socket_dir)
        try:
            async with aio.insecure_channel(server.address) as channel:
                yield api_pb2_grpc.DevicePluginStub(channel)
        finally:
            await server.stop()
            await allocator.drain_events()
    finally:
        await pods.stop()
        await client.close()
        socket_dir.rmdir()


async def allocate(stub: DevicePluginAsyncStub, units: int) -> dict[str, str]:
    """One Allocate call as kubelet makes it: ``units`` device IDs of one container."""
    ids = [device_id(GPUS[0], n) for n in range(units)]
    request = api_pb2.AllocateRequest(
        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
    )
    response = await stub.Allocate(request)
    assert len(response.container_responses) == 1
    return dict(response.container_responses[0].envs)


async def refused(stub: DevicePluginAsyncStub, units: int) -> grpc.aio.AioRpcError:
    """The error of an Allocate of ``units`` that must fail with FAILED_PRECONDITION."""
    with pytest.raises(grpc.aio.AioRpcError) as failure:
        await allocate(stub, units)
    assert failure.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    return failure.value


def gpu_of(envs: dict[str, str]) -> tuple[str, str]:
    return envs["ALIYUN_COM_GPU_MEM_IDX"], envs["NVIDIA_VISIBLE_DEVICES"]


def events_of(kube: Client, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the device plugin's Events on ``namespace/name`` (a pod, or
    a node with namespace ``default``)."""
    found = kube.list(Event, namespace=namespace, fields={"involvedObject.name": name})
    return [
        (e.type or "", e.reason or "", e.message or "")
        for e in found
        if e.source is not None and e.source.component == EVENT_COMPONENT
    ]


def annotations_of(kube: Client, key: str) -> dict[str, str]:
    namespace, name = key.split("/")
    meta = kube.get(Pod, name, namespace=namespace).metadata
    assert meta is not None
    return dict(meta.annotations or {})


def test_a_pod_gets_the_gpu_its_annotations_name_and_is_marked_assigned(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    key = bound_pod(kube, namespace, node, "one", [("main", (1,), 4)], assume_ns=1)

    async def scenario() -> dict[str, str]:
        async with plugin(control_plane, node, GPUS) as stub:
            return await allocate(stub, 4)

    envs = run(scenario())
    assert envs == {
        "NVIDIA_VISIBLE_DEVICES": GPUS[1].uuid,
        "ALIYUN_COM_GPU_MEM_IDX": "1",
        "ALIYUN_COM_GPU_MEM_POD": "4",
        "ALIYUN_COM_GPU_MEM_CONTAINER": "4",
        "ALIYUN_COM_GPU_MEM_DEV": "16",
    }
    got = annotations_of(kube, key)
    assert got[ALIYUN_ASSIGNED] == "true"
    assert got[ASSIGNED_CONTAINERS] == "1"
    assert events_of(kube, namespace, "one") == [
        (
            "Normal",
            "GPUAllocated",
            f"gpushare device plugin on node {node}: container main gets GPU 1 "
            f"({GPUS[1].uuid}), 4 GiB each; share none",
        )
    ]


@pytest.mark.parametrize("first", ["small", "big"])
def test_pods_of_different_sizes_get_their_own_gpus_in_either_order(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str, first: str
) -> None:
    small = bound_pod(kube, namespace, node, "small", [("main", (0,), 4)], assume_ns=2)
    big = bound_pod(kube, namespace, node, "big", [("main", (1,), 6)], assume_ns=1)
    order = [(small, 4, "0"), (big, 6, "1")]
    if first == "big":
        order.reverse()

    async def scenario() -> list[str]:
        async with plugin(control_plane, node, GPUS) as stub:
            return [gpu_of(await allocate(stub, units))[0] for _, units, _ in order]

    assert run(scenario()) == [gpu for _, _, gpu in order]
    for key, _, _ in order:
        assert annotations_of(kube, key)[ALIYUN_ASSIGNED] == "true"


def test_equal_pods_on_one_gpu_are_interchangeable(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    """Under the extender's rule equal pending pods share their GPUs, so whichever kubelet
    admits first, the answer is right; the oldest is marked first, deterministically."""
    old = bound_pod(kube, namespace, node, "old", [("main", (1,), 4)], assume_ns=1)
    new = bound_pod(kube, namespace, node, "new", [("main", (1,), 4)], assume_ns=2)

    async def scenario() -> list[tuple[str, str]]:
        async with plugin(control_plane, node, GPUS) as stub:
            first = gpu_of(await allocate(stub, 4))
            marked = [annotations_of(kube, k)[ALIYUN_ASSIGNED] for k in (old, new)]
            return [first, gpu_of(await allocate(stub, 4)), tuple(marked)]  # type: ignore[list-item]

    first, second, marked = run(scenario())
    assert first == second == ("1", GPUS[1].uuid)
    assert marked == ("true", "false")
    assert annotations_of(kube, new)[ALIYUN_ASSIGNED] == "true"


def test_equal_pods_on_different_gpus_are_refused_not_guessed(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    bound_pod(kube, namespace, node, "a", [("main", (0,), 4)], assume_ns=1)
    bound_pod(kube, namespace, node, "b", [("main", (1,), 4)], assume_ns=2)

    async def scenario() -> grpc.aio.AioRpcError:
        async with plugin(control_plane, node, GPUS) as stub:
            return await refused(stub, 4)

    error = run(scenario())
    details = error.details() or ""
    assert f"cannot allocate 4 GiB of {GPU_MEM} on node {node}" in details
    assert "cannot be told apart from 1 other pending pod(s)" in details
    assert f"{namespace}/" not in details  # the admitted pod's owner reads it: no other pod
    for name in "ab":
        assert events_of(kube, namespace, name) == [("Warning", "FailedGPUAllocation", details)]


def test_multi_container_pod_gets_each_containers_gpus_in_spec_order(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    multi = bound_pod(
        kube, namespace, node, "multi", [("a", (1,), 2), ("b", (0, 1), 3)], assume_ns=2
    )
    other = bound_pod(kube, namespace, node, "other", [("main", (0,), 6)], assume_ns=1)

    async def scenario() -> list[dict[str, str]]:
        async with plugin(control_plane, node, GPUS) as stub:
            return [await allocate(stub, 2), await allocate(stub, 6), await allocate(stub, 6)]

    a, b, then = run(scenario())
    assert gpu_of(a) == ("1", GPUS[1].uuid)
    assert gpu_of(b) == ("0,1", f"{GPUS[0].uuid},{GPUS[1].uuid}")
    assert (b["ALIYUN_COM_GPU_MEM_POD"], b["ALIYUN_COM_GPU_MEM_CONTAINER"]) == ("8", "6")
    assert gpu_of(then) == ("0", GPUS[0].uuid)  # the other pod, admitted after
    assert annotations_of(kube, multi)[ASSIGNED_CONTAINERS] == "2"
    assert annotations_of(kube, other)[ALIYUN_ASSIGNED] == "true"


def test_nothing_pending_of_that_size_tells_the_pod_what_it_lacks_and_the_node_the_pods(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    bound_pod(kube, namespace, node, "four", [("main", (0,), 4)], assume_ns=1)

    async def scenario() -> grpc.aio.AioRpcError:
        async with plugin(control_plane, node, GPUS) as stub:
            return await refused(stub, 5)

    error = run(scenario())
    assert (error.details() or "") == (
        f"gpushare: cannot allocate 5 GiB of {GPU_MEM} on node {node}: no GPU assignment from "
        "gpushare's scheduler for a container asking 5 unit(s): this pod was not placed by "
        "gpushare's scheduler extender (another scheduler placed it, or spec.nodeName was set "
        "by hand); set spec.schedulerName to the scheduler wired to gpushare (the chart's: "
        "gpushare-scheduler) and recreate the pod"
    )
    operators = (
        f"gpushare: cannot allocate 5 GiB of {GPU_MEM} on node {node}: no pending pod asks 5 "
        f"unit(s) next; pending: {namespace}/four container main asks 4 on GPU 0"
    )
    assert events_of(kube, "default", node) == [("Warning", "FailedGPUAllocation", operators)]


def test_a_restarted_plugin_reads_assignments_from_the_pods(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    first = bound_pod(kube, namespace, node, "first", [("main", (0,), 4)], assume_ns=1)

    async def scenario() -> grpc.aio.AioRpcError:
        async with plugin(control_plane, node, GPUS) as stub:
            await allocate(stub, 4)
        async with plugin(control_plane, node, GPUS) as stub:  # a new process: no memory
            return await refused(stub, 4)

    error = run(scenario())
    assert "no GPU assignment from gpushare's scheduler" in (error.details() or "")
    assert annotations_of(kube, first)[ALIYUN_ASSIGNED] == "true"


def test_mps_mode_adds_the_memory_limit_and_thread_percentage(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    bound_pod(kube, namespace, node, "mps", [("main", (0,), 4)], assume_ns=1)

    async def scenario() -> dict[str, str]:
        async with plugin(control_plane, node, GPUS, mps=True) as stub:
            return await allocate(stub, 4)

    envs = run(scenario())
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_managed_mps_gives_the_daemon_directories_mounts_and_limits(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    """With a managed daemon (``--mps-managed``), every container also gets the daemon's pipe and
    log directories (variables and mounts) and its shared memory at /dev/shm (docs/usage.md,
    "Enforced shares (MPS)")."""
    bound_pod(kube, namespace, node, "mps-managed", [("main", (0,), 4)], assume_ns=1)
    paths = MpsPaths(Path("/run/gpushare/mps"))

    async def scenario() -> api_pb2.ContainerAllocateResponse:
        async with plugin(control_plane, node, GPUS, mps_paths=paths) as stub:
            ids = [device_id(GPUS[0], n) for n in range(4)]
            request = api_pb2.AllocateRequest(
                container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=ids)]
            )
            (answer,) = (await stub.Allocate(request)).container_responses
            return answer

    answer = run(scenario())
    envs = dict(answer.envs)
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert envs["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpushare/mps/pipe"
    assert envs["CUDA_MPS_LOG_DIRECTORY"] == "/run/gpushare/mps/log"
    assert [(m.container_path, m.host_path, m.read_only) for m in answer.mounts] == [
        ("/run/gpushare/mps/pipe", "/run/gpushare/mps/pipe", False),
        ("/run/gpushare/mps/log", "/run/gpushare/mps/log", True),
        ("/dev/shm", "/run/gpushare/mps/shm", False),
    ]


def test_without_patch_permission_allocate_fails_and_says_so(
    control_plane: ControlPlane, kube: Client, node: str, namespace: str
) -> None:
    key = bound_pod(kube, namespace, node, "rbac", [("main", (0,), 4)], assume_ns=1)
    read_only = [PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list", "watch"])]
    kubeconfig = control_plane.service_account_kubeconfig("dp-read-only", namespace, read_only)

    async def scenario() -> grpc.aio.AioRpcError:
        async with plugin(control_plane, node, GPUS, kubeconfig=kubeconfig) as stub:
            return await refused(stub, 4)

    error = run(scenario())
    details = error.details() or ""
    assert f"cannot record the GPU of pod {key}" in details
    assert "forbidden" in details
    assert annotations_of(kube, key)[ALIYUN_ASSIGNED] == "false"
