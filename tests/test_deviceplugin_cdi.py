"""Real NVIDIA GPUs without the NVIDIA container toolkit (docs/deviceplugin.md, "How the GPU
gets into the container"): the pure spec builder and choice (``gpushare.deviceplugin.cdi``) on
an H200-like node, discovery over a tree of stand-in driver files
(``gpushare.deviceplugin.cdifiles``, ``gpushare.testing.nvidia_files``), Allocate naming the
CDI devices over real gRPC with the kubelet stand-in, the DRA driver's devices naming them, and
the CLI's refusals. On the real kubelet and containerd: tests/node/test_node_cdi.py."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from grpc import aio

from gpushare.cli.main import main
from gpushare.core.model import ContainerAllocation, Gpu, Node
from gpushare.deviceplugin.cdi import (
    CONTAINER_LIB_DIR,
    GPUSHARE_KIND,
    LIBRARY_PATH,
    TOOLKIT_KIND,
    CdiError,
    CdiMode,
    DeviceNode,
    DriverLibrary,
    GpuCdi,
    GpuNode,
    NodeDriver,
    ToolkitSpec,
    choose_cdi,
    gpu_spec,
)
from gpushare.deviceplugin.cdifiles import (
    find_driver,
    find_toolkit_spec,
    is_character_device,
    node_gpu_cdi,
)
from gpushare.deviceplugin.daemon import resource_runner
from gpushare.deviceplugin.dialects import GPU_MEM_DIALECT, DialectResource
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME
from gpushare.dra.prepare import ClaimError, PreparedClaim, PreparedDevice, device_cdi_ids
from gpushare.kube.codec import GPU_MEM, MemoryUnit
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.events import RecordedEvents
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.nvidia_files import stand_in_driver
from gpushare.testing.podsource import MemoryPods

VERSION = "580.159.04"
UUIDS = ("GPU-7a1c0b42-0000-4000-8000-000000000000", "GPU-7a1c0b42-0000-4000-8000-000000000001")
H200 = [PhysicalGpu(i, UUIDS[i], i, "NVIDIA H200", 143771) for i in range(2)]
NVIDIA_LIB = "/usr/local/nvidia/lib64"
ROOT = os.geteuid() == 0


def h200_driver(
    *,
    control: tuple[str, ...] = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"),
    libraries: tuple[str, ...] = ("libcuda.so", "libnvidia-ml.so", "libnvidia-nvvm.so"),
    binaries: tuple[str, ...] = ("nvidia-smi", "nvidia-cuda-mps-control"),
) -> NodeDriver:
    """What discovery finds on the lent H200 machine: driver 580, libraries and binaries under
    the read-only ``/usr/local/nvidia``."""
    sonames = {"libnvidia-nvvm.so": "libnvidia-nvvm.so.4"}
    return NodeDriver(
        VERSION,
        tuple(GpuNode(g.index, g.uuid, DeviceNode(f"/dev/nvidia{g.minor}",
                                                  f"/dev/nvidia{g.minor}")) for g in H200),
        tuple(DeviceNode(f"/dev/{n}", f"/dev/{n}") for n in control),
        tuple(
            DriverLibrary(f"{NVIDIA_LIB}/{n}.{VERSION}",
                          (f"{n}.{VERSION}", sonames.get(n, f"{n}.1")))
            for n in libraries
        ),
        tuple(f"/usr/local/nvidia/bin/{b}" for b in binaries),
    )  # fmt: skip


def _mounts(spec: dict[str, Any]) -> dict[str, str]:
    """Container path → host path of the spec's common mounts (all read-only binds)."""
    mounts = spec["containerEdits"].get("mounts", [])
    assert all(m["options"] == ["ro", "nosuid", "nodev", "bind"] for m in mounts)
    return {m["containerPath"]: m["hostPath"] for m in mounts}


# -- the spec (pure) ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Built:
    driver: NodeDriver
    mounted: dict[str, str] = field(default_factory=dict)  # a subset of the common mounts
    not_mounted: tuple[str, ...] = ()
    control_nodes: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


LIB = CONTAINER_LIB_DIR
BUILT = {
    "driver libs found under /usr/local/nvidia: each at its own name and its soname in one dir":
        Built(h200_driver(), mounted={
            f"{LIB}/libcuda.so.{VERSION}": f"{NVIDIA_LIB}/libcuda.so.{VERSION}",
            f"{LIB}/libcuda.so.1": f"{NVIDIA_LIB}/libcuda.so.{VERSION}",
            f"{LIB}/libnvidia-ml.so.1": f"{NVIDIA_LIB}/libnvidia-ml.so.{VERSION}",
            f"{LIB}/libnvidia-nvvm.so.4": f"{NVIDIA_LIB}/libnvidia-nvvm.so.{VERSION}",
        }),
    "binaries mounted read-only on every PATH": Built(h200_driver(), mounted={
        "/usr/bin/nvidia-smi": "/usr/local/nvidia/bin/nvidia-smi",
        "/usr/bin/nvidia-cuda-mps-control": "/usr/local/nvidia/bin/nvidia-cuda-mps-control",
    }, not_mounted=("/usr/bin/nvidia-persistenced",)),
    "no nvidia-uvm: left out": Built(
        h200_driver(control=("nvidiactl",)), control_nodes=("/dev/nvidiactl",)),
    "nvidia-modeset where present": Built(
        h200_driver(control=("nvidiactl", "nvidia-modeset")),
        control_nodes=("/dev/nvidiactl", "/dev/nvidia-modeset")),
    "no binaries: no binary mounts": Built(
        h200_driver(binaries=()), not_mounted=("/usr/bin/nvidia-smi",)),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BUILT.values()), ids=list(BUILT))
def test_gpushares_spec_gives_each_gpu_its_node_and_every_container_the_driver(
    case: Built,
) -> None:
    spec = gpu_spec(case.driver)
    assert (spec["cdiVersion"], spec["kind"]) == ("0.6.0", GPUSHARE_KIND)
    devices = {d["name"]: d["containerEdits"]["deviceNodes"] for d in spec["devices"]}
    assert devices == {
        "0": [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
        UUIDS[0]: [{"path": "/dev/nvidia0", "hostPath": "/dev/nvidia0"}],
        "1": [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}],
        UUIDS[1]: [{"path": "/dev/nvidia1", "hostPath": "/dev/nvidia1"}],
        "all": [devices["0"][0], devices["1"][0]],
    }
    common = spec["containerEdits"]
    assert common["env"] == [f"LD_LIBRARY_PATH={LIBRARY_PATH}"]
    assert LIBRARY_PATH.startswith(f"{CONTAINER_LIB_DIR}:")
    assert tuple(n["path"] for n in common["deviceNodes"]) == case.control_nodes
    mounts = _mounts(spec)
    assert {k: mounts.get(k) for k in case.mounted} == case.mounted
    assert [path for path in case.not_mounted if path in mounts] == []
    assert json.loads(json.dumps(spec)) == spec


def test_a_stand_in_gpus_node_is_mounted_from_its_host_path() -> None:
    stand_in = DeviceNode("/dev/nvidia0", "/tmp/stand-in/dev/nvidia0")
    driver = NodeDriver(VERSION, (GpuNode(0, UUIDS[0], stand_in),), (), ())
    (device, *_) = gpu_spec(driver)["devices"]
    assert device["containerEdits"]["deviceNodes"] == [
        {"path": "/dev/nvidia0", "hostPath": "/tmp/stand-in/dev/nvidia0"}
    ]


# -- the choice (pure) ----------------------------------------------------------------------------

TOOLKIT = ToolkitSpec("/etc/cdi/nvidia.yaml", frozenset({"0", "1", *UUIDS, "all"}))
TOOLKIT_BY_INDEX = ToolkitSpec("/var/run/cdi/nvidia.json", frozenset({"0", "1", "all"}))


@dataclass(frozen=True)
class Chosen:
    mode: CdiMode
    toolkit: ToolkitSpec | None
    driver: NodeDriver | None
    ids: list[str] | None  # the CDI IDs of GPUs 1 and 0, in that order; None: no CDI
    write: bool = False
    refused: str = ""


SPEC = "/var/run/cdi/gpushare.io-nvidia-gpu.json"
CHOSEN = {
    "toolkit spec present: its names used, gpushare writes nothing": Chosen(
        CdiMode.AUTO, TOOLKIT, h200_driver(), [f"{TOOLKIT_KIND}={UUIDS[1]}",
                                               f"{TOOLKIT_KIND}={UUIDS[0]}"]),
    "toolkit spec naming indices only: GPUs named by index": Chosen(
        CdiMode.TOOLKIT, TOOLKIT_BY_INDEX, None, [f"{TOOLKIT_KIND}=1", f"{TOOLKIT_KIND}=0"]),
    "no toolkit spec, device nodes present: gpushare's spec, written": Chosen(
        CdiMode.AUTO, None, h200_driver(), [f"{GPUSHARE_KIND}={UUIDS[1]}",
                                            f"{GPUSHARE_KIND}={UUIDS[0]}"], write=True),
    "gpushare asked beside the toolkit's spec: gpushare's": Chosen(
        CdiMode.GPUSHARE, TOOLKIT, h200_driver(), [f"{GPUSHARE_KIND}={UUIDS[1]}",
                                                   f"{GPUSHARE_KIND}={UUIDS[0]}"], write=True),
    "auto on a node without NVIDIA devices: none": Chosen(CdiMode.AUTO, None, None, None),
    "off: none, whatever the node has": Chosen(CdiMode.OFF, TOOLKIT, h200_driver(), None),
    "toolkit asked, no toolkit spec: refused": Chosen(
        CdiMode.TOOLKIT, None, h200_driver(), None,
        refused="--cdi toolkit: no CDI spec of kind nvidia.com/gpu on this node"),
    "gpushare asked, no device nodes: refused naming what is missing": Chosen(
        CdiMode.GPUSHARE, None, None, None,
        refused="--cdi gpushare: no NVIDIA device node /dev/nvidiactl"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CHOSEN.values()), ids=list(CHOSEN))
def test_cdi_mode_chooses_the_toolkits_devices_else_gpushares_else_none(case: Chosen) -> None:
    def choose() -> Any:
        return choose_cdi(
            case.mode, toolkit=case.toolkit, driver=case.driver,
            driver_missing="no NVIDIA device node /dev/nvidiactl", spec_path=SPEC,
        )  # fmt: skip

    if case.refused:
        with pytest.raises(CdiError, match=case.refused):
            choose()
        return
    choice = choose()
    assert choice.write == case.write
    if case.ids is None:
        assert choice.cdi is None
    else:
        assert choice.cdi is not None
        assert choice.cdi.ids([(1, UUIDS[1]), (0, UUIDS[0])]) == case.ids


def test_a_gpu_the_spec_lacks_is_refused_naming_the_spec() -> None:
    cdi = GpuCdi(TOOLKIT_KIND, TOOLKIT_BY_INDEX.names, TOOLKIT_BY_INDEX.path)
    with pytest.raises(CdiError, match=r"GPU 7 \(GPU-x\) is not a device of CDI spec "
                       r"/var/run/cdi/nvidia.json .*the spec is stale"):  # fmt: skip
        cdi.ids([(7, "GPU-x")])


# -- discovery over stand-in files ----------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return tmp_path / "node"


IS_DEVICE: Callable[[Path], bool] = is_character_device if ROOT else Path.is_file
"""Stand-in device nodes are character devices as root (``mknod``), regular files otherwise."""


@dataclass(frozen=True)
class Found:
    stand_in: dict[str, Any]  # stand_in_driver's keywords
    libraries: dict[str, tuple[str, ...]] | None  # file name -> names; None: no driver
    control: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
    driver_version: str | None = VERSION
    missing: str = ""


FOUND = {
    "the driver is found with its soname links": Found({}, {
        f"libcuda.so.{VERSION}": (f"libcuda.so.{VERSION}", "libcuda.so", "libcuda.so.1"),
        f"libnvidia-ml.so.{VERSION}": (f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1"),
        f"libnvidia-ptxjitcompiler.so.{VERSION}": (
            f"libnvidia-ptxjitcompiler.so.{VERSION}", "libnvidia-ptxjitcompiler.so.1"),
    }),
    "no nvidia-uvm: left out": Found(
        {"control": ("nvidiactl",), "libraries": ("libcuda.so", "libnvidia-ml.so")},
        {f"libcuda.so.{VERSION}": (f"libcuda.so.{VERSION}", "libcuda.so", "libcuda.so.1"),
         f"libnvidia-ml.so.{VERSION}": (f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1")},
        control=("/dev/nvidiactl",)),
    "no soname links on the node: the sonames are mounted all the same": Found(
        {"links": False, "libraries": ("libcuda.so", "libnvidia-ml.so", "libnvidia-nvvm.so")},
        {f"libcuda.so.{VERSION}": (f"libcuda.so.{VERSION}", "libcuda.so.1"),
         f"libnvidia-ml.so.{VERSION}": (f"libnvidia-ml.so.{VERSION}", "libnvidia-ml.so.1"),
         f"libnvidia-nvvm.so.{VERSION}": (f"libnvidia-nvvm.so.{VERSION}", "libnvidia-nvvm.so.4")}),
    "without NVML the installed libcuda's version is the driver's": Found(
        {"libraries": ("libcuda.so", "libnvidia-ml.so"), "version": "590.1.2"},
        {"libcuda.so.590.1.2": ("libcuda.so.590.1.2", "libcuda.so", "libcuda.so.1"),
         "libnvidia-ml.so.590.1.2": ("libnvidia-ml.so.590.1.2", "libnvidia-ml.so.1")},
        driver_version=None),
    "no nvidiactl: no driver": Found(
        {"control": ()}, None, missing="no NVIDIA device node {root}/dev/nvidiactl"),
    "a GPU without its device node: no driver": Found(
        {"minors": (0,)}, None, missing=f"no device node {{root}}/dev/nvidia1 for GPU 1 "
                                        f"({UUIDS[1]})"),
    "NVML's driver version has no libraries here: no driver": Found(
        {}, None, driver_version="999.9", missing="no libcuda.so.999.9 (driver 999.9) in "
                                                  "{root}/lib"),
    "no libnvidia-ml: no driver": Found(
        {"libraries": ("libcuda.so",)}, None,
        missing=f"no libnvidia-ml.so.{VERSION} (driver {VERSION}) in {{root}}/lib"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FOUND.values()), ids=list(FOUND))
def test_discovery_finds_the_drivers_nodes_libraries_and_binaries(tree: Path, case: Found) -> None:
    stand_in = stand_in_driver(tree, device_nodes=ROOT, **case.stand_in)
    found = find_driver(
        [(g.index, g.minor, g.uuid) for g in H200], stand_in.paths(tree / "cdi"),
        driver_version=case.driver_version, is_device=IS_DEVICE,
    )  # fmt: skip
    if case.libraries is None:
        assert found == case.missing.format(root=tree)
        return
    assert isinstance(found, NodeDriver), found
    assert {Path(lib.host_path).name: lib.names for lib in found.libraries} == case.libraries
    assert all(Path(lib.host_path).parent == stand_in.library_dir for lib in found.libraries)
    assert tuple(n.path for n in found.control_nodes) == case.control
    assert [(g.index, g.node.path, g.node.host_path) for g in found.gpus] == [
        (0, "/dev/nvidia0", str(tree / "dev" / "nvidia0")),
        (1, "/dev/nvidia1", str(tree / "dev" / "nvidia1")),
    ]
    assert found.binaries == (str(stand_in.binary_dir / "nvidia-smi"),)


def test_only_character_devices_count_as_device_nodes(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    assert is_character_device(Path("/dev/null"))
    assert not is_character_device(tmp_path / "file")
    assert not is_character_device(tmp_path / "missing")


def test_gpushares_spec_is_written_whole_and_found_again_at_the_next_start(tree: Path) -> None:
    stand_in = stand_in_driver(tree, device_nodes=ROOT)
    paths = stand_in.paths(tree / "cdi")
    gpus = [(g.index, g.minor, g.uuid) for g in H200]
    choice = node_gpu_cdi(CdiMode.AUTO, gpus, paths, is_device=IS_DEVICE)
    assert choice.cdi is not None
    assert choice.cdi.kind == GPUSHARE_KIND
    written = json.loads(paths.spec_path.read_text())
    found = find_driver(gpus, paths, is_device=IS_DEVICE)
    assert isinstance(found, NodeDriver)
    assert written == gpu_spec(found)
    assert [p.name for p in paths.spec_dir.iterdir()] == [paths.spec_path.name]  # no temp left
    paths.spec_path.write_text("{}")  # a stale spec is replaced at the next start
    node_gpu_cdi(CdiMode.AUTO, gpus, paths, is_device=IS_DEVICE)
    assert json.loads(paths.spec_path.read_text()) == written


TOOLKIT_YAML = f"""---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits: {{deviceNodes: [{{path: /dev/nvidia0}}]}}
- name: {UUIDS[0]}
  containerEdits: {{deviceNodes: [{{path: /dev/nvidia0}}]}}
- name: all
  containerEdits: {{deviceNodes: [{{path: /dev/nvidia0}}]}}
"""


def test_toolkit_spec_present_its_names_are_used_and_gpushare_writes_nothing(tree: Path) -> None:
    stand_in = stand_in_driver(tree, device_nodes=ROOT)
    etc_cdi = tree / "etc-cdi"
    etc_cdi.mkdir()
    (etc_cdi / "broken.yaml").write_text("kind: [")  # logged and skipped
    (etc_cdi / "other.json").write_text(json.dumps({"kind": "example.com/fpga", "devices": []}))
    (etc_cdi / "nvidia.yaml").write_text(TOOLKIT_YAML)
    paths = stand_in.paths(tree / "cdi", toolkit_dirs=(tree / "absent", etc_cdi))
    assert find_toolkit_spec(paths.toolkit_dirs) == ToolkitSpec(
        str(etc_cdi / "nvidia.yaml"), frozenset({"0", UUIDS[0], "all"})
    )
    choice = node_gpu_cdi(CdiMode.AUTO, [(0, 0, UUIDS[0])], paths, is_device=IS_DEVICE)
    assert choice.cdi is not None
    assert choice.cdi.ids([(0, UUIDS[0])]) == [f"nvidia.com/gpu={UUIDS[0]}"]
    assert not paths.spec_path.exists()


# -- Allocate over gRPC ---------------------------------------------------------------------------


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpsh-cdi-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


NODE = Node("n1", tuple(Gpu(g.index, "H200", 140) for g in H200))


def _allocate(socket_dir: Path, cdi: GpuCdi | None) -> tuple[Any, str]:
    """Allocate of 4 GiB for a pod the extender put on GPU 1; (answer, refusal)."""
    pod = bound_dialect_pod(
        dialect_pod_json("p", {"main": {GPU_MEM: 4}}), NODE,
        (ContainerAllocation("main", (1,), 4),), assigned=False,
    )  # fmt: skip
    resource = DialectResource(GPU_MEM, DEFAULT_SOCKET_NAME, per_gpu=None, allocate=GPU_MEM_DIALECT)

    async def scenario() -> tuple[Any, str]:
        async with FakeKubelet(socket_dir) as kubelet:
            runner, allocator = resource_runner(
                resource, H200, MemoryUnit.GIB, MemoryPods([pod]), node_name="n1",
                socket_dir=socket_dir, cdi=cdi, events=RecordedEvents(),
            )  # fmt: skip
            assert allocator is not None
            await runner.start()
            try:
                await asyncio.wait_for(runner.wait_registered(), 20)
                await kubelet.wait_for_devices(GPU_MEM, lambda view: view.allocatable > 0, 20)
                try:
                    answer = await kubelet.allocate(GPU_MEM, size=4)
                except aio.AioRpcError as error:
                    return None, f"{error.code().name}: {error.details()}"
                await allocator.drain_events()
                return answer, ""
            finally:
                await runner.stop()

    return asyncio.run(asyncio.wait_for(scenario(), 60))


GIVEN_CDI = {
    "gpushare's spec: its GPU by UUID": (
        GpuCdi(GPUSHARE_KIND, frozenset({"0", "1", *UUIDS}), SPEC),
        [f"{GPUSHARE_KIND}={UUIDS[1]}"]),
    "the toolkit's spec: its name for the GPU": (
        GpuCdi(TOOLKIT_KIND, TOOLKIT_BY_INDEX.names, TOOLKIT_BY_INDEX.path),
        [f"{TOOLKIT_KIND}=1"]),
    "--cdi off: no CDI device, NVIDIA_VISIBLE_DEVICES as before": (None, []),
}  # fmt: skip


@pytest.mark.parametrize(("cdi", "names"), list(GIVEN_CDI.values()), ids=list(GIVEN_CDI))
def test_allocate_names_the_cdi_devices_of_the_containers_gpus(
    socket_dir: Path, cdi: GpuCdi | None, names: list[str]
) -> None:
    answer, refusal = _allocate(socket_dir, cdi)
    assert answer is not None, refusal
    (container,) = answer.container_responses
    assert [d.name for d in container.cdi_devices] == names
    assert container.envs["NVIDIA_VISIBLE_DEVICES"] == UUIDS[1]
    assert list(container.devices) == []


def test_allocate_refuses_a_gpu_the_cdi_spec_lacks(socket_dir: Path) -> None:
    stale = GpuCdi(GPUSHARE_KIND, frozenset({"0", UUIDS[0]}), SPEC)
    answer, refusal = _allocate(socket_dir, stale)
    assert answer is None
    assert refusal.startswith("FAILED_PRECONDITION: gpushare: container main of pod ")
    assert f"GPU 1 ({UUIDS[1]}) is not a device of CDI spec {SPEC}" in refusal


# -- the DRA driver's devices ---------------------------------------------------------------------


CLAIM = PreparedClaim(
    "ns", "c", "uid-1", tuple(PreparedDevice("gpu", gpu, 4, 0, "") for gpu in H200)
)
DRA = {
    "each device names its GPU, the first also the claim's environment": (
        GpuCdi(GPUSHARE_KIND, frozenset(UUIDS), SPEC),
        [["gpushare.io/gpu=uid-1", f"{GPUSHARE_KIND}={UUIDS[0]}"],
         [f"{GPUSHARE_KIND}={UUIDS[1]}"]]),
    "the toolkit's names": (
        GpuCdi(TOOLKIT_KIND, TOOLKIT.names, TOOLKIT.path),
        [["gpushare.io/gpu=uid-1", f"{TOOLKIT_KIND}={UUIDS[0]}"], [f"{TOOLKIT_KIND}={UUIDS[1]}"]]),
    "--cdi off: the claim's environment only": (None, [["gpushare.io/gpu=uid-1"], []]),
}  # fmt: skip


@pytest.mark.parametrize(("cdi", "ids"), list(DRA.values()), ids=list(DRA))
def test_a_prepared_claims_devices_name_their_gpus_cdi_devices(
    cdi: GpuCdi | None, ids: list[list[str]]
) -> None:
    assert device_cdi_ids(CLAIM, cdi) == ids


def test_a_claim_on_a_gpu_the_spec_lacks_is_refused() -> None:
    stale = GpuCdi(GPUSHARE_KIND, frozenset({UUIDS[0]}), SPEC)
    with pytest.raises(ClaimError, match=rf"claim ns/c: GPU 1 \({UUIDS[1]}\) is not a device"):
        device_cdi_ids(CLAIM, stale)


# -- the command line -----------------------------------------------------------------------------


REFUSED = {
    "gpushare without the device nodes": (
        ["--cdi", "gpushare", "--cdi-dev-root", "/nonexistent-dev"],
        "--cdi gpushare: no NVIDIA device node /nonexistent-dev/nvidiactl"),
    "a relative library directory": (
        ["--cdi", "gpushare", "--cdi-library-dirs", "/usr/lib64,lib"],
        "lib: not an absolute path"),
}  # fmt: skip


@pytest.mark.parametrize(("flags", "message"), list(REFUSED.values()), ids=list(REFUSED))
@pytest.mark.parametrize("command", ["device-plugin", "dra-driver"])
def test_a_cdi_mode_the_node_cannot_serve_ends_in_one_line(
    tmp_path: Path, command: str, flags: list[str], message: str
) -> None:
    args = [command, "--node-name", "n1", "--fake-gpus", "1x16GiB", "--cdi-dir", str(tmp_path)]
    if command == "device-plugin":
        args += ["--device-plugin-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, *flags])
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert message in errors[0]
