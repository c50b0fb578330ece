"""How a share is held and shown (docs/share-view.md): the backend a node chooses
(``gpushare.core.isolation``), what Allocate and the DRA driver's CDI spec give a shared
container for it (``gpushare.deviceplugin.isolation``), a node that requires enforcement
refusing a shared container, and the library installed on the node. Allocate runs over real
gRPC with the kubelet stand-in (``gpushare.testing.kubelet``)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from gpushare.core.isolation import Available, Enforcement, Isolation, choose
from gpushare.core.model import ContainerAllocation, Gpu, Node
from gpushare.deviceplugin.daemon import inventory_gpus, resource_runner
from gpushare.deviceplugin.dialects import GPU_MEM_DIALECT, DialectResource
from gpushare.deviceplugin.inventory import parse_fake_gpus
from gpushare.deviceplugin.isolation import (
    CONTAINER_LIBRARY,
    NodeIsolation,
    ShareLibrary,
    install_library,
    installed_library,
    node_isolation,
)
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME
from gpushare.dra.prepare import ClaimError, PreparedClaim, PreparedDevice, cdi_spec
from gpushare.kube.codec import GPU_MEM, MemoryUnit, inventory_annotation, node_info
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.events import RecordedEvents
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.nvml import FakeDevice, FakeNvml
from gpushare.testing.podsource import MemoryPods

GPUS = parse_fake_gpus("2x16GiB:T4")
NODE = Node("n1", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
UUID = {g.index: g.uuid for g in GPUS}
LIBRARY = ShareLibrary(
    Path("/var/lib/gpushare/lib/libgpushare-share-0123456789abcdef.so"),
    Path("/var/lib/gpushare/lib/ld.so.preload"),
)
NO_DRIVER = "driver 580.159.04 has no nvmlDeviceSetMemoryLimits_v1"

# -- choosing the backend ----------------------------------------------------------------------


@dataclass(frozen=True)
class Chosen:
    available: Available
    wanted: Enforcement | None
    said: str
    missing: str = ""


CHOICES = {
    "mps-on-is-the-strongest": Chosen(
        Available(mps=True, driver_missing="", library=True), None, "enforced (mps)"),
    "the-driver-without-mps": Chosen(
        Available(driver_missing="", library=True), None, "enforced (driver)"),
    "the-library-alone-refuses-past-the-share-advisory": Chosen(
        Available(driver_missing=NO_DRIVER, library=True), None, "advisory (library)"),
    "nothing-at-all-is-none": Chosen(Available(driver_missing=NO_DRIVER), None, "none"),
    "asked-none-with-the-library-is-view-only": Chosen(
        Available(mps=True, driver_missing=NO_DRIVER, library=True), Enforcement.NONE,
        "view only"),
    "asked-the-library-over-mps": Chosen(
        Available(mps=True, library=True), Enforcement.LIBRARY, "advisory (library)"),
    "asked-the-driver-it-lacks-is-none-with-the-reason": Chosen(
        Available(driver_missing=NO_DRIVER, library=True), Enforcement.DRIVER, "view only",
        "the driver cannot limit memory per container: " + NO_DRIVER),
    "asked-mps-without-it-says-so": Chosen(
        Available(driver_missing=NO_DRIVER), Enforcement.MPS, "none",
        "MPS is off (the device plugin runs without --mps or --mps-managed)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CHOICES.values()), ids=list(CHOICES))
def test_a_node_chooses_the_strongest_backend_it_has_or_the_one_asked(case: Chosen) -> None:
    choice = choose(case.available, case.wanted)
    assert choice.isolation.said() == case.said
    assert choice.missing == case.missing


def test_required_enforcement_refuses_what_does_not_enforce_and_says_why() -> None:
    library_only = choose(Available(driver_missing=NO_DRIVER, library=True))
    assert library_only.refusal(required=False) == ""
    refusal = library_only.refusal(required=True)
    assert "requires an enforced share" in refusal
    assert "advisory (library)" in refusal
    asked = choose(Available(driver_missing=NO_DRIVER), Enforcement.DRIVER)
    assert NO_DRIVER in asked.refusal(required=True)
    assert choose(Available(mps=True)).refusal(required=True) == ""


def test_the_driver_backend_is_detected_through_nvml() -> None:
    nvml = FakeNvml([FakeDevice("GPU-a", 0, "H200", 1 << 30)])
    nvml.init()
    assert node_isolation(mps=False, nvml=nvml, library=None).isolation == Isolation(
        Enforcement.NONE, False
    )
    nvml.memory_limits_missing = ""
    assert node_isolation(mps=False, nvml=nvml, library=None).isolation == Isolation(
        Enforcement.DRIVER, False
    )
    declared = node_isolation(mps=False, nvml=None, library=LIBRARY)
    assert declared.available.missing(Enforcement.DRIVER).endswith("no NVML (declared GPUs)")


# -- the inventory says it per GPU -------------------------------------------------------------


def test_the_inventory_publishes_each_gpus_isolation_and_reads_it_back() -> None:
    isolation = Isolation(Enforcement.MPS, True)
    annotation = inventory_annotation(
        MemoryUnit.GIB, inventory_gpus(GPUS, MemoryUnit.GIB, isolation)
    )
    assert '"enforcement":"mps","view":true' in annotation
    assert node_info(_node(annotation)).isolation == (isolation, isolation)
    before = inventory_annotation(MemoryUnit.GIB, inventory_gpus(GPUS, MemoryUnit.GIB))
    assert node_info(_node(before)).isolation == (None, None)


def _node(inventory: str) -> dict[str, Any]:
    return {"metadata": {"name": "n1", "annotations": {"gpushare.io/gpu-inventory": inventory}}}


@pytest.mark.parametrize(
    "entry",
    [
        pytest.param('"enforcement":"magic","view":true', id="unknown-backend"),
        pytest.param('"enforcement":"mps"', id="enforcement-without-view"),
        pytest.param('"view":"yes","enforcement":"none"', id="view-not-a-boolean"),
    ],
)
def test_a_garbled_isolation_in_the_inventory_is_refused_with_the_gpu_named(entry: str) -> None:
    raw = '{"unit":"GiB","gpus":[{"index":0,"memory":16,' + entry + "}]}"
    with pytest.raises(ValueError, match="GPU 0: enforcement must be"):
        node_info(_node(raw))


# -- Allocate ------------------------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpsh-iso-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def plugin(
    socket_dir: Path, pods: Sequence[dict[str, Any]], isolation: NodeIsolation | None
) -> AsyncIterator[tuple[FakeKubelet, MemoryPods, RecordedEvents]]:
    """gpu-mem served over ``GPUS`` with ``isolation`` and registered with a kubelet."""
    source, events = MemoryPods(pods), RecordedEvents()
    resource = DialectResource(GPU_MEM, DEFAULT_SOCKET_NAME, per_gpu=None, allocate=GPU_MEM_DIALECT)
    async with FakeKubelet(socket_dir) as kubelet:
        runner, allocator = resource_runner(
            resource, GPUS, MemoryUnit.GIB, source, node_name="n1", socket_dir=socket_dir,
            isolation=isolation, events=events,
        )  # fmt: skip
        assert allocator is not None
        await runner.start()
        try:
            await asyncio.wait_for(runner.wait_registered(), 20)
            await kubelet.wait_for_devices(GPU_MEM, lambda view: view.allocatable > 0, 20)
            yield kubelet, source, events
            await allocator.drain_events()
        finally:
            await runner.stop()


def _pod(containers: Sequence[ContainerAllocation]) -> dict[str, Any]:
    whole = {"gpushare.io/exclusive": "true"} if any(c.exclusive for c in containers) else {}
    pod = dialect_pod_json("p", {"main": {GPU_MEM: 4}}, annotations=whole)
    return bound_dialect_pod(pod, NODE, containers, assigned=False)


@dataclass(frozen=True)
class Given:
    """A pod pending on n1 with ``containers``; the node's ``available`` backends, the one
    ``wanted`` and ``required``; Allocate of ``size`` units answers ``envs`` (a subset),
    ``mounted`` (container path → host path), none of ``absent``, and an Event ending in
    ``said`` — or fails with ``refused`` in its message."""

    containers: tuple[ContainerAllocation, ...]
    available: Available
    envs: dict[str, str] = field(default_factory=dict)
    absent: tuple[str, ...] = ()
    mounted: dict[str, str] = field(default_factory=dict)
    said: str = ""
    wanted: Enforcement | None = None
    required: bool = False
    refused: str = ""
    size: int = 4


SHARE = (ContainerAllocation("main", (1,), 4),)
WHOLE = (ContainerAllocation("main", (1,), 16, 1000, True),)
VIEW_ENVS = {"GPUSHARE_SHARE_MIB": f"{UUID[1]}=4096"}
LIBRARY_MOUNT = {
    str(CONTAINER_LIBRARY): str(LIBRARY.host_path),
    "/etc/ld.so.preload": str(LIBRARY.preload_path),
}
SHARE_VARIABLES = ("LD_PRELOAD", "GPUSHARE_SHARE_MIB", "GPUSHARE_SHARE_ENFORCE",
                   "NVIDIA_GPU_MEMORY_LIMIT", "NVIDIA_GPU_MEMORY_REQUEST")  # fmt: skip

GIVEN = {
    "a-share-with-the-library-and-mps-sees-its-share-and-mps-holds-it": Given(
        SHARE, Available(mps=True, driver_missing=NO_DRIVER, library=True),
        envs=VIEW_ENVS, absent=("GPUSHARE_SHARE_ENFORCE", "NVIDIA_GPU_MEMORY_LIMIT"),
        mounted=LIBRARY_MOUNT, said="share enforced (mps)"),
    "the-library-alone-also-refuses-past-the-share": Given(
        SHARE, Available(driver_missing=NO_DRIVER, library=True),
        envs={**VIEW_ENVS, "GPUSHARE_SHARE_ENFORCE": "1"}, mounted=LIBRARY_MOUNT,
        said="share advisory (library)"),
    "the-driver-gets-the-toolkits-limit-variables-in-mib": Given(
        SHARE, Available(driver_missing="", library=True),
        envs={**VIEW_ENVS, "NVIDIA_GPU_MEMORY_LIMIT": "4096", "NVIDIA_GPU_MEMORY_REQUEST": "4096"},
        absent=("GPUSHARE_SHARE_ENFORCE",), mounted=LIBRARY_MOUNT, said="share enforced (driver)"),
    "asked-none-with-the-library-is-a-view-only": Given(
        SHARE, Available(driver_missing=NO_DRIVER, library=True), envs=VIEW_ENVS,
        absent=("GPUSHARE_SHARE_ENFORCE",), mounted=LIBRARY_MOUNT, wanted=Enforcement.NONE,
        said="share view only"),
    "no-library-and-no-backend-gives-nothing-and-says-none": Given(
        SHARE, Available(driver_missing=NO_DRIVER), absent=SHARE_VARIABLES, said="share none"),
    "a-whole-gpu-is-untouched": Given(
        WHOLE, Available(driver_missing="", library=True), absent=SHARE_VARIABLES,
        said="whole GPU", size=4),
    "required-enforcement-refuses-a-share-the-node-cannot-hold": Given(
        SHARE, Available(driver_missing=NO_DRIVER, library=True), required=True,
        refused="requires an enforced share (node config requireEnforcement) and has "
                "advisory (library)"),
    "required-enforcement-lets-a-whole-gpu-start": Given(
        WHOLE, Available(driver_missing=NO_DRIVER), required=True, said="whole GPU"),
    "required-enforcement-with-mps-starts": Given(
        SHARE, Available(mps=True, driver_missing=NO_DRIVER), required=True,
        said="share enforced (mps)"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(GIVEN.values()), ids=list(GIVEN))
def test_allocate_gives_a_shared_container_its_view_and_backend(
    socket_dir: Path, case: Given
) -> None:
    library = LIBRARY if case.available.library else None
    isolation = NodeIsolation(case.available, library)
    isolation.configure(case.wanted, case.required)

    async def scenario() -> tuple[Any, str, RecordedEvents]:
        async with plugin(socket_dir, [_pod(case.containers)], isolation) as (kubelet, _, events):
            try:
                answer = await kubelet.allocate(GPU_MEM, size=case.size)
            except aio.AioRpcError as error:
                return None, f"{error.code().name}: {error.details()}", events
            (container,) = answer.container_responses
            return container, "", events

    container, refusal, events = asyncio.run(asyncio.wait_for(scenario(), 60))
    if case.refused:
        assert container is None
        assert refusal.startswith("FAILED_PRECONDITION: ")
        assert case.refused in refusal
        assert events.events[-1][1:3] == ("Warning", "FailedGPUAllocation")
        assert case.refused in events.events[-1][3]
        return
    assert container is not None, refusal
    envs = dict(container.envs)
    assert {k: envs.get(k) for k in case.envs} == case.envs
    assert [name for name in case.absent if name in envs] == []
    mounts = {m.container_path: m.host_path for m in container.mounts}
    assert mounts == case.mounted
    assert all(m.read_only for m in container.mounts)
    (allocated,) = [e for e in events.events if e[2] == "GPUAllocated"]
    assert allocated[3].endswith(f"; {case.said}")


# -- the DRA driver's CDI spec ------------------------------------------------------------------


def _claim(memory_units: int) -> PreparedClaim:
    device = PreparedDevice("gpu", GPUS[1], memory_units, 0, "")
    return PreparedClaim("ns", "c", "uid-1", (device,))


def test_a_claim_for_a_share_gets_the_same_edits_in_its_cdi_spec() -> None:
    isolation = NodeIsolation(Available(driver_missing=NO_DRIVER, library=True), LIBRARY)
    (device,) = cdi_spec(_claim(4), MemoryUnit.GIB, isolation=isolation)["devices"]
    edits = device["containerEdits"]
    assert f"GPUSHARE_SHARE_MIB={UUID[1]}=4096" in edits["env"]
    assert "GPUSHARE_SHARE_ENFORCE=1" in edits["env"]
    assert edits["mounts"] == [
        {
            "hostPath": str(LIBRARY.host_path),
            "containerPath": str(CONTAINER_LIBRARY),
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
        {
            "hostPath": str(LIBRARY.preload_path),
            "containerPath": "/etc/ld.so.preload",
            "options": ["ro", "nosuid", "nodev", "bind"],
        },
    ]
    (whole,) = cdi_spec(_claim(16), MemoryUnit.GIB, isolation=isolation)["devices"]
    assert "mounts" not in whole["containerEdits"]
    assert not any(e.startswith("GPUSHARE_SHARE") for e in whole["containerEdits"]["env"])


def test_a_claim_for_a_share_a_node_cannot_enforce_is_refused_when_required() -> None:
    isolation = NodeIsolation(Available(driver_missing=NO_DRIVER, library=True), LIBRARY)
    isolation.configure(None, True)
    with pytest.raises(ClaimError, match=r"claim ns/c: the node requires an enforced share"):
        cdi_spec(_claim(4), MemoryUnit.GIB, isolation=isolation)


# -- the library on the node ----------------------------------------------------------------------


def test_the_library_is_installed_under_its_hash_and_kept_for_running_containers(
    tmp_path: Path,
) -> None:
    source = tmp_path / "libgpushare-share.so"
    source.write_bytes(b"\x7fELF first")
    first = install_library(source, tmp_path / "host")
    assert first.host_path.read_bytes() == b"\x7fELF first"
    assert first.preload_path.read_text() == f"{CONTAINER_LIBRARY}\n"
    assert install_library(source, tmp_path / "host") == first
    source.write_bytes(b"\x7fELF second")
    second = install_library(source, tmp_path / "host")
    assert second != first
    assert first.host_path.is_file()  # a container started before still maps it
    assert sorted(p.name for p in (tmp_path / "host").iterdir()) == sorted(
        [first.host_path.name, second.host_path.name, "ld.so.preload"]
    )


def test_no_directory_or_no_library_means_no_view(tmp_path: Path) -> None:
    assert installed_library(None, None) is None
    assert installed_library(tmp_path / "missing.so", tmp_path / "host") is None
    (tmp_path / "file").write_text("")
    source = tmp_path / "lib.so"
    source.write_bytes(b"x")
    assert installed_library(source, tmp_path / "file" / "under-a-file") is None
