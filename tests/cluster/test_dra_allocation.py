"""gpushare's ResourceSlices on the real API server, allocated by the real kube-scheduler
(docs/dra.md, "What runs today"): the slice of ``gpushare.dra.slices`` is accepted as it is; claims
that ask part of a GPU's memory (consumable capacity) share one GPU, each allocation recording its
``consumedCapacity`` and a ``shareID``; a claim larger than any GPU stays Pending with the
scheduler's reason; an unhealthy GPU (device taint) takes no claim. The nodes are kwok nodes (no
kubelet runs the pods: allocation is the scheduler's, at bind)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpushare.deviceplugin.inventory import FakeInventory, PhysicalGpu
from gpushare.dra._proto.dra import api_pb2 as dra_pb2
from gpushare.dra._proto.dra import api_pb2_grpc as dra_grpc
from gpushare.dra._proto.registration import api_pb2 as reg_pb2
from gpushare.dra._proto.registration import api_pb2_grpc as reg_grpc
from gpushare.dra.driver import DraDriver, DriverOptions
from gpushare.dra.plugin import DraPluginService, cdi_spec_path, serve
from gpushare.dra.slices import (
    CORES,
    DRIVER,
    MEMORY,
    device_class,
    resource_slice,
    slice_name,
)
from gpushare.dra.templates import DEVICE_CLASS
from gpushare.kube.claims import ApiClaims
from gpushare.kube.client import connect
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.resourceslices import publish_slice
from gpushare.testing.controlplane import (
    REPO_ROOT,
    Binaries,
    ControlPlane,
    ManagedProcess,
    gpushare_argv,
    wait_for,
    wait_until,
)
from gpushare.testing.helm import locate_helm, render_objects
from gpushare.testing.nodes import create_nodes, delete_nodes, plain_node
from gpushare.testing.pods import delete_namespace, unschedulable
from gpushare.testing.rbac import DRA_DRIVER_RULES

pytestmark = pytest.mark.cluster

CLASS = DEVICE_CLASS
GIB = 1024


def gpus(*memory_gib: int, unhealthy: tuple[int, ...] = ()) -> list[PhysicalGpu]:
    return [
        PhysicalGpu(i, f"GPU-{uuid.uuid4()}", i, "Tesla-T4", gib * GIB, i not in unhealthy)
        for i, gib in enumerate(memory_gib)
    ]


@contextlib.contextmanager
def dra_world(kube: Client, nodes: dict[str, list[PhysicalGpu]]) -> Iterator[str]:
    """kwok ``nodes`` with gpushare's slices, the DeviceClass and a namespace (its name)."""
    namespace = f"dra-{uuid.uuid4().hex[:6]}"
    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(name) for name in nodes])
        stack.callback(delete_nodes, kube, list(nodes))
        _device_class(kube)
        for name, devices in nodes.items():
            body = resource_slice(name, devices, unit=MemoryUnit.GIB, generation=1)
            kube.create(from_dict(body))
            stack.callback(kube.delete, ResourceSlice, body["metadata"]["name"])
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}}))  # fmt: skip
        stack.callback(delete_namespace, kube, namespace)
        yield namespace


def _device_class(kube: Client) -> None:
    """The DeviceClass of gpushare's GPUs (kept across tests: cluster-scoped, the same each)."""
    with contextlib.suppress(ApiError):  # 409: made by an earlier test
        kube.create(from_dict(device_class(CLASS)))


def claim_pod(
    kube: Client,
    namespace: str,
    name: str,
    memory: str | None,
    cores: int = 0,
    *,
    node: str = "",
    device_class: str = CLASS,
) -> None:
    """A ResourceClaim ``name`` asking ``memory`` (and ``cores`` percent; neither: the device
    whole) of one device of ``device_class``, and a pod ``name`` that uses it, for the default
    kube-scheduler (to ``node`` only, when given)."""
    requests: dict[str, str] = {MEMORY: memory} if memory is not None else {}
    if cores:
        requests[CORES] = str(cores)
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if requests:
        exactly["capacity"] = {"requests": requests}
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }  # fmt: skip
    kube.create(from_dict(claim))
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "registry.invalid/none:0",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        },
    }  # fmt: skip
    if node:
        pod["spec"]["nodeSelector"] = {"gpushare.io/test-node": node}
    kube.create(from_dict(pod))


BARRIER_DRIVER = "barrier.test.gpushare.io"
"""A driver of one device per node, and the DeviceClass that selects it (the same name)."""


def scheduler_has_slices(
    kube: Client, namespace: str, node: str, stack: contextlib.ExitStack
) -> None:
    """Return once kube-scheduler's informer has every ResourceSlice change made before this
    call: a slice of a barrier driver is published on ``node`` after them and a pod claims its
    one device. kube-scheduler can allocate that only once its informer has the slice, and one
    watch delivers slices in resourceVersion order. (Reading the API server says nothing about
    kube-scheduler's informer, which may still hold the slice before the change.)"""
    tag = f"barrier-{uuid.uuid4().hex[:6]}"
    with contextlib.suppress(ApiError):  # 409: made by an earlier call
        kube.create(from_dict(device_class(BARRIER_DRIVER, BARRIER_DRIVER)))
    kube.create(from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": tag},
        "spec": {"driver": BARRIER_DRIVER, "nodeName": node, "devices": [{"name": "d0"}],
                 "pool": {"name": tag, "generation": 1, "resourceSliceCount": 1}},
    }))  # fmt: skip
    stack.callback(kube.delete, ResourceSlice, tag)
    claim_pod(kube, namespace, tag, None, node=node, device_class=BARRIER_DRIVER)
    allocated(kube, namespace, tag)


def allocation(kube: Client, namespace: str, name: str) -> dict[str, Any] | None:
    """The claim's single allocation result (``status.allocation.devices.results[0]``), or
    ``None`` while it is not allocated."""
    claim = kube.get(ResourceClaim, name, namespace=namespace).to_dict()
    results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {})
    found = results.get("results") or []
    return found[0] if found else None


def allocated(kube: Client, namespace: str, name: str) -> dict[str, Any]:
    return wait_for(
        f"claim {namespace}/{name} allocated", lambda: allocation(kube, namespace, name), 60
    )


def test_the_slice_is_accepted_and_claims_share_one_gpu_within_its_memory(kube: Client) -> None:
    with dra_world(kube, {"dra-n1": gpus(16, 16)}) as namespace:
        # one after the other: a claim kube-scheduler has in flight may keep a device from the
        # next one (the cold CI of 2026-11-28 saw "b" on GPU 1 when both were made at once)
        claim_pod(kube, namespace, "a", "8Gi")
        first = allocated(kube, namespace, "a")
        claim_pod(kube, namespace, "b", "8Gi")
        second = allocated(kube, namespace, "b")
        for result in (first, second):
            assert (result["driver"], result["pool"]) == (DRIVER, "dra-n1")
            assert result["consumedCapacity"][MEMORY] == "8Gi"
            assert result.get("shareID")
        assert first["device"] == second["device"] == "gpu-0"  # first fit: both on GPU 0
        assert first["shareID"] != second["shareID"]
        claim_pod(kube, namespace, "c", "10Gi")  # GPU 0 has 0 left: GPU 1
        assert allocated(kube, namespace, "c")["device"] == "gpu-1"
        claim_pod(kube, namespace, "d", "3500Mi")  # rounds up to 4Gi (the step), GPU 1
        d = allocated(kube, namespace, "d")
        assert (d["device"], d["consumedCapacity"][MEMORY]) == ("gpu-1", "4Gi")


def test_a_claim_larger_than_any_gpu_stays_pending_with_the_schedulers_reason(
    kube: Client,
) -> None:
    with dra_world(kube, {"dra-n2": gpus(16)}) as namespace:
        claim_pod(kube, namespace, "huge", "40Gi")
        message = wait_for("huge unschedulable", lambda: unschedulable(kube, namespace, "huge"), 60)
        assert "cannot allocate all claims" in message, message
        assert allocation(kube, namespace, "huge") is None


def test_an_unhealthy_gpu_takes_no_claim_and_compute_is_shared_too(kube: Client) -> None:
    with dra_world(kube, {"dra-n3": gpus(16, 16, unhealthy=(0,))}) as namespace:
        claim_pod(kube, namespace, "x", "2Gi", cores=60)
        x = allocated(kube, namespace, "x")
        assert x["device"] == "gpu-1"
        assert x["consumedCapacity"][CORES] == "60"
        claim_pod(kube, namespace, "y", "2Gi", cores=60)  # 40 % left on GPU 1, GPU 0 tainted
        wait_for("y unschedulable", lambda: unschedulable(kube, namespace, "y"), 60)
        assert allocation(kube, namespace, "y") is None


# -- the kubelet plugin prepares what kube-scheduler allocated ----------------------------------


async def _prepare_and_unprepare(
    control_plane: ControlPlane, tmp_path: Path, namespace: str, node_gpus: list[PhysicalGpu]
) -> None:
    claims = {name: kube_claim(control_plane, namespace, name) for name in ("a", "b")}
    async with connect(control_plane.kubeconfig) as client:
        service = DraPluginService(
            driver=DRIVER, node="dra-n4", gpus=lambda: node_gpus, unit=MemoryUnit.GIB,
            claims=ApiClaims(client), cdi_dir=tmp_path / "cdi",
        )  # fmt: skip
        sockets = await serve(service, tmp_path / "dra.sock", tmp_path / "reg.sock")
        try:
            async with grpc.aio.insecure_channel(f"unix://{tmp_path / 'reg.sock'}") as channel:
                info = await reg_grpc.RegistrationStub(channel).GetInfo(reg_pb2.InfoRequest())
                assert (info.type, info.name, list(info.supported_versions)) == (
                    "DRAPlugin", DRIVER, ["v1.DRAPlugin"]
                )  # fmt: skip
                assert info.endpoint == str(tmp_path / "dra.sock")
                await reg_grpc.RegistrationStub(channel).NotifyRegistrationStatus(
                    reg_pb2.RegistrationStatus(plugin_registered=True)
                )
            assert sockets.registration.registered
            async with grpc.aio.insecure_channel(f"unix://{tmp_path / 'dra.sock'}") as channel:
                stub = dra_grpc.DRAPluginStub(channel)
                asked = [dra_pb2.Claim(namespace=namespace, name=n, uid=c["metadata"]["uid"])
                         for n, c in claims.items()]  # fmt: skip
                asked.append(dra_pb2.Claim(namespace=namespace, name="a", uid="not-the-uid-of-a"))
                asked.append(dra_pb2.Claim(namespace=namespace, name="gone", uid="u-gone"))
                asked.append(dra_pb2.Claim(namespace=namespace, name="a", uid="../../etc/x"))
                answer = await stub.NodePrepareResources(
                    dra_pb2.NodePrepareResourcesRequest(claims=asked)
                )
                assert set(answer.claims) == {c.uid for c in asked}  # every claim answered
                for name, claim in claims.items():
                    uid = claim["metadata"]["uid"]
                    entry = answer.claims[uid]
                    assert entry.error == ""
                    (device,) = entry.devices
                    result = claim["status"]["allocation"]["devices"]["results"][0]
                    assert (device.pool_name, device.device_name) == ("dra-n4", result["device"])
                    assert device.share_id == result["shareID"]
                    assert list(device.cdi_device_ids) == [f"gpushare.io/gpu={uid}"]
                    spec = json.loads(cdi_spec_path(tmp_path / "cdi", uid).read_text())
                    (cdi,) = spec["devices"]
                    env = dict(e.split("=", 1) for e in cdi["containerEdits"]["env"])
                    index = int(result["device"].removeprefix("gpu-"))
                    assert env["NVIDIA_VISIBLE_DEVICES"] == node_gpus[index].uuid, name
                    assert (env["ALIYUN_COM_GPU_MEM_POD"], env["ALIYUN_COM_GPU_MEM_DEV"]) == (
                        "8", "16"
                    )  # fmt: skip
                assert (
                    "kubelet asked for 'not-the-uid-of-a'"
                    in answer.claims["not-the-uid-of-a"].error
                )
                assert answer.claims["u-gone"].error == f"claim {namespace}/gone not found"
                assert "not a UID" in answer.claims["../../etc/x"].error  # names no file
                done = await stub.NodeUnprepareResources(
                    dra_pb2.NodeUnprepareResourcesRequest(claims=asked)
                )
                errors = {uid: e.error for uid, e in done.claims.items()}
                assert "not a UID" in errors.pop("../../etc/x")
                assert errors == {c.uid: "" for c in asked if c.uid != "../../etc/x"}
                assert list((tmp_path / "cdi").iterdir()) == []
        finally:
            await sockets.stop()
    assert not (tmp_path / "dra.sock").exists()


def kube_claim(control_plane: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    with control_plane.client() as kube:
        allocated(kube, namespace, name)
        document: dict[str, Any] = kube.get(ResourceClaim, name, namespace=namespace).to_dict()
        return document


def test_the_kubelet_plugin_prepares_the_allocated_claims_and_unprepares_them(
    kube: Client, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """What kube-scheduler allocated, read from the API server by the plugin over real gRPC on
    a unix socket: a CDI spec per claim with the GPU's UUID and the share, the answer with the
    scheduler's device and shareID; a claim made again (another UID) and a claim that is gone
    get their error, the others are prepared all the same; unprepare removes the specs."""
    node_gpus = gpus(16, 16)
    with dra_world(kube, {"dra-n4": node_gpus}) as namespace:
        for name in ("a", "b"):
            claim_pod(kube, namespace, name, "8Gi")
            allocated(kube, namespace, name)  # one after the other (the test above says why)
        asyncio.run(_prepare_and_unprepare(control_plane, tmp_path, namespace, node_gpus))


# -- gpushare dra-driver, the process -----------------------------------------------------------


def driver_argv(control_plane: ControlPlane, node: str, tmp_path: Path, *more: str) -> list[str]:
    """``gpushare dra-driver`` of ``node`` with two fake 16 GiB GPUs, its directories under
    ``tmp_path``, under a ServiceAccount with the driver's rules only, and ``more``."""
    kubeconfig = control_plane.service_account_kubeconfig(
        "gpushare-dra-driver", "kube-system", DRA_DRIVER_RULES
    )
    return gpushare_argv(
        "dra-driver", "--node-name", node, "--fake-gpus", "2x16GiB:T4",
        "--plugin-dir", str(tmp_path / "plugins"), "--registry-dir", str(tmp_path / "registry"),
        "--cdi-dir", str(tmp_path / "cdi"), "--kubeconfig", str(kubeconfig), *more,
    )  # fmt: skip


def test_the_dra_driver_publishes_its_slice_serves_claims_and_stops_cleanly(
    kube: Client, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """``gpushare dra-driver`` under a ServiceAccount with the driver's rules only: it publishes
    the node's slice from ``--fake-gpus`` (pool generation 1, again 1 after a restart that
    changes nothing), kube-scheduler allocates a claim on it, the driver's socket prepares it
    (the CDI spec on disk), and SIGTERM stops it with its sockets removed."""
    node = "dra-n5"
    argv = driver_argv(control_plane, node, tmp_path, "--resync", "0.5", "--mps")
    dra_socket = tmp_path / "plugins" / DRIVER / "dra.sock"
    registration = tmp_path / "registry" / f"{DRIVER}-reg.sock"
    name = f"{node}-gpu-gpushare-io"
    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(node)])
        stack.callback(delete_nodes, kube, [node])
        stack.callback(lambda: kube.delete(ResourceSlice, name))
        for run in (1, 2):
            driver = ManagedProcess(f"dra-driver-{run}", argv, tmp_path).start()
            stack.callback(driver.stop)
            wait_until("the driver's sockets", registration.exists, 30, processes=[driver])
            published = kube.get(ResourceSlice, name).to_dict()["spec"]
            assert published["pool"]["generation"] == 1, f"run {run}"
            assert [d["name"] for d in published["devices"]] == ["gpu-0", "gpu-1"]
            if run == 1:
                driver.stop()
                assert driver.exit_code() == 0, driver.log_tail()
                assert not dra_socket.exists()
                assert not registration.exists()
        namespace = f"dra-{uuid.uuid4().hex[:6]}"
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}}))  # fmt: skip
        stack.callback(delete_namespace, kube, namespace)
        _device_class(kube)
        claim_pod(kube, namespace, "p", "4Gi")
        claim = kube_claim(control_plane, namespace, "p")
        uid = claim["metadata"]["uid"]

        async def prepare() -> dra_pb2.NodePrepareResourcesResponse:
            async with grpc.aio.insecure_channel(f"unix://{dra_socket}") as channel:
                return await dra_grpc.DRAPluginStub(channel).NodePrepareResources(
                    dra_pb2.NodePrepareResourcesRequest(
                        claims=[dra_pb2.Claim(namespace=namespace, name="p", uid=uid)]
                    )
                )

        answer = asyncio.run(prepare())
        assert answer.claims[uid].error == ""
        spec = json.loads(cdi_spec_path(tmp_path / "cdi", uid).read_text())
        env = dict(e.split("=", 1) for e in spec["devices"][0]["containerEdits"]["env"])
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"  # --mps: 4 of 16 GiB
        assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_a_changed_gpu_is_published_as_the_pools_next_generation(
    kube: Client, control_plane: ControlPlane
) -> None:
    """``publish_slice``: a new slice is generation 1; the same content keeps its generation;
    a GPU turned unhealthy (a device taint) is the next generation, which the scheduler then
    reads alone."""
    node = "dra-n6"
    healthy = gpus(16, 16)
    sick = [dataclasses.replace(g, healthy=g.index != 1) for g in healthy]  # GPU 1 only

    async def publish_all() -> list[int]:
        async with connect(control_plane.kubeconfig) as client:
            return [
                await publish_slice(
                    client, resource_slice(node, found, unit=MemoryUnit.GIB, generation=1)
                )
                for found in (healthy, healthy, sick, sick, healthy)
            ]

    try:
        assert asyncio.run(publish_all()) == [1, 1, 2, 2, 3]
        devices = kube.get(ResourceSlice, f"{node}-gpu-gpushare-io").to_dict()["spec"]["devices"]
        assert [bool(d.get("taints")) for d in devices] == [False, False]
    finally:
        kube.delete(ResourceSlice, f"{node}-gpu-gpushare-io")


def test_the_dra_example_is_placed_as_its_comment_says(tmp_path: Path) -> None:
    """examples/dra/gpu-share.yaml applied unchanged on a control plane with
    kube-controller-manager (its resourceclaim controller makes each pod's claim from the
    template): both pods bound, each claim 8Gi and 30 cores of GPU 0, two shares of it."""
    binaries = Binaries.locate()
    with (
        ControlPlane(binaries, controller_manager=True, log_dir=tmp_path) as plane,
        plane.client() as kube,
    ):
        node = "dra-example"
        create_nodes(kube, [plain_node(node)])
        kube.create(
            from_dict(resource_slice(node, gpus(16, 16), unit=MemoryUnit.GIB, generation=1))
        )
        wait_until(  # made by kube-controller-manager; pods are refused before it exists
            "the default ServiceAccount",
            lambda: any(True for _ in kube.list(ServiceAccount, namespace="default")),
            60,
        )
        example = (REPO_ROOT / "examples/dra/gpu-share.yaml").read_text()
        documents = list(yaml.safe_load_all(example))
        for document in documents:
            if document["kind"] == "Pod":
                document["spec"]["tolerations"] = [
                    {"key": "kwok.x-k8s.io/node", "operator": "Exists"}
                ]  # kwok's taint; the example is for real nodes
            if document["kind"] != "DeviceClass":
                document["metadata"]["namespace"] = "default"
            if document["kind"] != "Pod":
                kube.create(from_dict(document))
        pods = {d["metadata"]["name"]: d for d in documents if d["kind"] == "Pod"}
        results = []
        for pod in ("dra-inference-a", "dra-inference-b"):  # one after the other, as it says
            kube.create(from_dict(pods[pod]))

            def claimed(name: str = pod) -> dict[str, Any] | None:
                found = kube.get(Pod, name, namespace="default")
                statuses = (found.status.resourceClaimStatuses or []) if found.status else []
                if not statuses or not statuses[0].resourceClaimName:
                    return None
                return allocation(kube, "default", statuses[0].resourceClaimName)

            results.append(wait_for(f"{pod}'s claim allocated", claimed, 90))
        assert [(r["device"], r["consumedCapacity"]) for r in results] == [
            ("gpu-0", {MEMORY: "8Gi", CORES: "30"}),
        ] * 2
        assert results[0]["shareID"] != results[1]["shareID"]


def test_the_charts_dra_objects_are_accepted_by_the_api_server(kube: Client) -> None:
    """The chart with ``draDriver.enabled``: its DaemonSet, DeviceClass, ServiceAccount and RBAC
    pass the real API server's validation (a server-side dry run: nothing is created)."""
    values = {"draDriver": {"enabled": True, "deviceClassName": "gpushare-gpu-chart-check"}}
    rendered = render_objects(values, helm=locate_helm())  # its own class: CLASS may exist
    dra = [
        o for o in rendered if "dra-driver" in o["metadata"]["name"] or o["kind"] == "DeviceClass"
    ]
    assert sorted(o["kind"] for o in dra) == [
        "ClusterRole", "ClusterRoleBinding", "DaemonSet", "DeviceClass", "Role", "RoleBinding",
        "ServiceAccount",
    ]  # fmt: skip
    for obj in dra:
        if obj["kind"] in ("DaemonSet", "ServiceAccount"):
            obj["metadata"]["namespace"] = "default"
        kube.create(from_dict(obj), dry_run=True)


def test_the_driver_asks_the_api_server_again_only_when_its_slice_changed_or_is_due(
    control_plane: ControlPlane, kube: Client
) -> None:
    """``publish`` alone (the resync's part): every resync reads the inventory; a slice that
    says what the last published one said is not asked about again before ``recheck_s``:
    deleted behind ``publish``'s back, it stays gone until then, and comes back (generation 1,
    a new slice) once the recheck is due. The running driver also watches its slice and
    publishes it again at once (the next test)."""
    node = "dra-n7"
    name = f"{node}-gpu-gpushare-io"

    async def scenario() -> None:
        async with connect(control_plane.kubeconfig) as client:
            inventory = FakeInventory("2x16GiB:T4")
            patient = DraDriver(DriverOptions(node, recheck_s=3600), inventory, client,
                                ApiClaims(client))  # fmt: skip
            assert await patient.publish() == 1
            await client.delete(ResourceSlice, name)
            assert await patient.publish() == 1  # unchanged and not due: no API call
            with pytest.raises(ApiError):
                await client.get(ResourceSlice, name)
            due = DraDriver(DriverOptions(node, recheck_s=0), inventory, client,
                            ApiClaims(client))  # fmt: skip
            assert await due.publish() == 1
            assert await due.publish() == 1  # asked again: still there, same generation
            await client.get(ResourceSlice, name)

    try:
        asyncio.run(scenario())
    finally:
        with contextlib.suppress(ApiError):
            kube.delete(ResourceSlice, name)


def test_a_slice_deleted_behind_the_running_drivers_back_is_published_again_at_once(
    kube: Client, control_plane: ControlPlane, tmp_path: Path
) -> None:
    """kubelet deletes every slice of its node when it starts; the driver (inventory resync
    60 s, recheck 300 s) watches its own slice and publishes it again within seconds."""
    node = "dra-n8"
    name = slice_name(node)
    argv = driver_argv(control_plane, node, tmp_path, "--resync", "60")
    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(node)])
        stack.callback(delete_nodes, kube, [node])
        driver = ManagedProcess("dra-driver-watch", argv, tmp_path).start()
        stack.callback(driver.stop)
        stack.callback(lambda: kube.delete(ResourceSlice, name))
        wait_until("the slice", lambda: _exists(kube, name), 30, processes=[driver])
        kube.delete(ResourceSlice, name)
        wait_until("the slice published again", lambda: _exists(kube, name), 20,
                   processes=[driver])  # fmt: skip
        assert kube.get(ResourceSlice, name).to_dict()["spec"]["pool"]["generation"] == 1
        assert "publishing it again" in driver.log_tail(), driver.log_tail()


@dataclass(frozen=True)
class Steered:
    """The driver run with ``--placement``; claims of 6, 11, 4 and 10 GiB in turn on two 16 GiB
    GPUs: the devices the last two get (``None``: Pending) and the slice's device order after
    the second."""

    placement: str
    order_after_b: list[str]
    c_gpu: str
    d_gpu: str | None


STEERED = [
    # best fit: 4 GiB goes where 5 are free (gpu-1), which leaves gpu-0's 10 for the 10 GiB one
    Steered("best-fit", ["gpu-1", "gpu-0"], "gpu-1", "gpu-0"),
    # by index, first fit puts 4 GiB on gpu-0 (10 free): 6 and 5 left, 10 GiB fits nowhere
    Steered("index", ["gpu-0", "gpu-1"], "gpu-0", None),
]


@pytest.mark.parametrize("case", STEERED, ids=[c.placement for c in STEERED])
def test_the_driver_lists_its_gpus_least_free_first_so_that_first_fit_is_best_fit(
    kube: Client, control_plane: ControlPlane, tmp_path: Path, case: Steered
) -> None:
    """kube-scheduler's allocator takes the first device of the slice that fits; the driver
    (``--placement best-fit``) keeps its devices least free first from the claims of its
    node's pods, so the allocator chooses what gpushare's best fit chooses."""
    node = f"dra-steer-{case.placement}"
    argv = driver_argv(
        control_plane, node, tmp_path, "--resync", "60", "--placement", case.placement
    )
    name = slice_name(node)

    def order() -> list[str]:
        devices = kube.get(ResourceSlice, name).to_dict()["spec"]["devices"]
        return [d["name"] for d in devices]

    def listed(expected: list[str]) -> None:
        wait_until(f"devices listed {expected}", lambda: order() == expected, 30)
        scheduler_has_slices(kube, namespace, node, stack)  # and kube-scheduler has that order

    with contextlib.ExitStack() as stack:
        create_nodes(kube, [plain_node(node, labels={"gpushare.io/test-node": node})])
        stack.callback(delete_nodes, kube, [node])
        driver = ManagedProcess(f"dra-driver-{case.placement}", argv, tmp_path).start()
        stack.callback(driver.stop)
        stack.callback(lambda: kube.delete(ResourceSlice, name))
        wait_until("the slice", lambda: _exists(kube, name), 30, processes=[driver])
        namespace = f"dra-{uuid.uuid4().hex[:6]}"
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": namespace}}))  # fmt: skip
        stack.callback(delete_namespace, kube, namespace)
        _device_class(kube)
        claim_pod(kube, namespace, "a", "6Gi", node=node)
        assert allocated(kube, namespace, "a")["device"] == "gpu-0"
        claim_pod(kube, namespace, "b", "11Gi", node=node)
        assert allocated(kube, namespace, "b")["device"] == "gpu-1"
        listed(case.order_after_b)
        claim_pod(kube, namespace, "c", "4Gi", node=node)
        assert allocated(kube, namespace, "c")["device"] == case.c_gpu
        listed(case.order_after_b)  # free 10 and 1 (best fit), or 6 and 5 (by index)
        claim_pod(kube, namespace, "d", "10Gi", node=node)
        if case.d_gpu is None:
            message = wait_for("d unschedulable", lambda: unschedulable(kube, namespace, "d"), 60)
            assert "cannot allocate all claims" in message, message
        else:
            assert allocated(kube, namespace, "d")["device"] == case.d_gpu
        assert driver.running(), driver.log_tail()


def _exists(kube: Client, slice_name: str) -> bool:
    try:
        kube.get(ResourceSlice, slice_name)
    except ApiError:
        return False
    return True
