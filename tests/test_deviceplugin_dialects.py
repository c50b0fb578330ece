"""The request dialects on the node (docs/compute.md): the device plugin serves
``tencent.com/vcuda-core``, ``tencent.com/vcuda-memory`` and ``nvidia.com/gpu`` next to
``aliyun.com/gpu-mem``, each on its own socket registered with the kubelet stand-in
(``gpushare.testing.kubelet.FakeKubelet``, real gRPC on unix sockets), and answers each
resource's Allocate for the pod the extender placed (pods as the extender records them:
``gpushare.testing.dialects.bound_dialect_pod``; in memory: ``gpushare.testing.podsource``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from grpc import aio

from gpushare.core.model import ContainerAllocation, Gpu, Node
from gpushare.deviceplugin.daemon import resource_runner
from gpushare.deviceplugin.dialects import (
    DIALECTS,
    GPU_MEM_DIALECT,
    DialectResource,
    DialectsError,
    parse_dialects,
    resources_for,
)
from gpushare.deviceplugin.inventory import DeviceListTooLargeError, parse_fake_gpus
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME, PluginRunner
from gpushare.deviceplugin.server import DevicePluginService
from gpushare.kube.codec import ALIYUN_ASSIGNED, GPU_MEM, MemoryUnit
from gpushare.kube.codec.dialects import ADVERTISED_NAMES
from gpushare.testing.dialects import (
    bound_dialect_pod,
    dialect_pod_json,
    gpu_manager_readme_pod_1,
    gpu_manager_readme_pod_2,
)
from gpushare.testing.kubelet import FakeKubelet, ResourceView
from gpushare.testing.podsource import MemoryPods

GPUS = parse_fake_gpus("2x16GiB:T4")
NODE = Node("n1", (Gpu(0, "T4", 16), Gpu(1, "T4", 16)))
UUID = {g.index: g.uuid for g in GPUS}
TIMEOUT_S = 20.0
VCORE = "tencent.com/vcuda-core"
VMEM = "tencent.com/vcuda-memory"
NVGPU = "nvidia.com/gpu"


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="gpsh-dl-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass
class Plugin:
    """The plugin's runners (gpu-mem first) as ``gpushare device-plugin --dialects`` wires
    them, and kubelet."""

    kubelet: FakeKubelet
    pods: MemoryPods
    runners: list[PluginRunner] = field(default_factory=list)


@contextlib.asynccontextmanager
async def plugin(
    socket_dir: Path,
    pods: Sequence[dict[str, Any]],
    dialects: Sequence[str] = ("tencent", "hami"),
    *,
    split_count: int = 10,
    mps: bool = False,
) -> AsyncIterator[Plugin]:
    """gpu-mem and the dialects' resources served and registered with a ``FakeKubelet``."""
    source = MemoryPods(pods)
    async with FakeKubelet(socket_dir) as kubelet:
        served = Plugin(kubelet, source)

        gpu_mem = DialectResource(
            GPU_MEM, DEFAULT_SOCKET_NAME, per_gpu=None, allocate=GPU_MEM_DIALECT
        )
        for resource in (gpu_mem, *resources_for(dialects, split_count)):
            runner, _ = resource_runner(
                resource,
                GPUS,
                MemoryUnit.GIB,
                source,
                node_name="n1",
                socket_dir=socket_dir,
                mps=mps,
            )
            served.runners.append(runner)
        try:
            for runner in served.runners:
                await runner.start()
            for runner in served.runners:
                await asyncio.wait_for(runner.wait_registered(), TIMEOUT_S)
                await kubelet.wait_for_devices(
                    runner.resource_name, lambda v: v.allocatable > 0, TIMEOUT_S
                )
            yield served
        finally:
            for runner in served.runners:
                await runner.stop()


def _allocatable_is(count: int, view: ResourceView) -> bool:
    return view.allocatable == count


def run(coro: Any) -> Any:
    return asyncio.run(asyncio.wait_for(coro, 60))


# ---------------------------------------------------------------------------- advertising


@pytest.mark.parametrize(
    ("dialects", "split_count", "expected"),
    [
        pytest.param((), 10, {GPU_MEM: 32}, id="default-off-only-gpu-mem"),
        pytest.param(
            ("tencent",), 10, {GPU_MEM: 32, VCORE: 200, VMEM: 128},
            id="tencent-100-vcuda-core-per-gpu-one-vcuda-memory-per-256MiB",
        ),
        pytest.param(("hami",), 10, {GPU_MEM: 32, NVGPU: 20}, id="hami-gpus-times-split-10"),
        pytest.param(("hami",), 4, {GPU_MEM: 32, NVGPU: 8}, id="hami-split-count-4"),
        pytest.param(
            ("tencent", "hami"), 10, {GPU_MEM: 32, VCORE: 200, VMEM: 128, NVGPU: 20},
            id="both-dialects-one-process-four-sockets",
        ),
    ],
)  # fmt: skip
def test_each_served_resource_is_registered_with_its_devices(
    socket_dir: Path, dialects: tuple[str, ...], split_count: int, expected: dict[str, int]
) -> None:
    async def scenario() -> dict[str, int]:
        async with plugin(socket_dir, [], dialects, split_count=split_count) as served:
            seen = {}
            for resource, count in expected.items():
                view = await served.kubelet.wait_for_devices(
                    resource, functools.partial(_allocatable_is, count), TIMEOUT_S
                )
                seen[resource] = view.capacity
            registered = {r.resource_name for r in served.kubelet.registrations}
            assert registered == set(expected)
            assert len({r.endpoint for r in served.kubelet.registrations}) == len(expected)
            return seen

    assert run(scenario()) == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param("tencent,volcano", "unknown dialect volcano", id="unknown-dialect"),
        pytest.param("fork", "nvidia.com/vcuda-* is not served", id="the-fork-is-refused"),
    ],
)
def test_dialects_flag_refuses_unknown_names_naming_the_accepted(text: str, fragment: str) -> None:
    with pytest.raises(DialectsError, match="accepted: tencent, hami") as caught:
        parse_dialects(text)
    assert fragment in str(caught.value)


def test_dialects_flag_reads_any_case_and_order() -> None:
    assert parse_dialects(" HAMI , tencent ") == ("tencent", "hami")
    assert parse_dialects("") == ()


def test_kube_scheduler_checks_exactly_the_resources_the_plugin_advertises() -> None:
    """``ADVERTISED_NAMES`` (``ignoredByScheduler: false`` in the extender entry, the chart's
    list with it) is the set of dialect resources ``--dialects`` can advertise: one missing
    would let kube-scheduler bind pods kubelet refuses; one extra would make it refuse pods on
    every node (no node advertises it)."""
    served = {resource.resource for resource in resources_for(DIALECTS)}
    assert served == ADVERTISED_NAMES


def test_split_count_out_of_range_is_refused() -> None:
    with pytest.raises(DialectsError, match="--split-count 0: accepted 1 to 1000"):
        resources_for(("hami",), 0)


def test_the_forks_1_mib_devices_would_not_fit_kubelets_message() -> None:
    """Why the fork's nvidia.com/vcuda-memory is not served: one 80 GiB GPU in 1 MiB devices
    is over kubelet's 4 MiB ListAndWatch limit."""
    service_gpus = parse_fake_gpus("1x80GiB:H100")
    with pytest.raises(DeviceListTooLargeError, match=r"nvidia\.com/vcuda-memory device list"):
        DevicePluginService(
            service_gpus,
            MemoryUnit.GIB,
            per_gpu=lambda g: g.memory_mib,
            resource="nvidia.com/vcuda-memory",
        )


# ---------------------------------------------------------------------------- Allocate


def _tencent(name: str, core: int, memory: int, **kw: Any) -> dict[str, Any]:
    return dialect_pod_json(name, {"main": {VCORE: core, VMEM: memory}}, **kw)


def _hami(name: str, containers: dict[str, dict[str, str | int]]) -> dict[str, Any]:
    return dialect_pod_json(name, containers)


def _bound(
    pod: dict[str, Any], containers: Sequence[ContainerAllocation], assume_ns: int = 1
) -> dict[str, Any]:
    return bound_dialect_pod(pod, NODE, containers, assume_ns=assume_ns, assigned=False)


def _whole(name: str, gpus: tuple[int, ...]) -> ContainerAllocation:
    return ContainerAllocation(name, gpus, 16, 1000, True)


@dataclass(frozen=True)
class AllocateCase:
    """Pods pending on n1; kubelet admits a container asking ``size`` of ``resource``; the
    answer carries ``envs`` (a subset) or fails with ``refused`` in its message."""

    pods: tuple[dict[str, Any], ...]
    resource: str
    size: int
    envs: dict[str, str] = field(default_factory=dict)
    refused: str = ""
    mps: bool = False
    absent: tuple[str, ...] = ()


CASES = {
    "readme-pod-1-vcuda-core-50-gets-its-gpu": AllocateCase(
        (_bound(gpu_manager_readme_pod_1(), [ContainerAllocation("nvidia", (1,), 8, 500)]),),
        VCORE, 50, {"NVIDIA_VISIBLE_DEVICES": UUID[1]},
        absent=("ALIYUN_COM_GPU_MEM_IDX", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "LD_LIBRARY_PATH"),
    ),
    "readme-pod-2-vcuda-core-200-gets-two-whole-gpus": AllocateCase(
        (_bound(gpu_manager_readme_pod_2(), [_whole("nvidia", (0, 1))]),),
        VCORE, 200, {"NVIDIA_VISIBLE_DEVICES": f"{UUID[0]},{UUID[1]}"},
    ),
    "vcuda-memory-is-answered-empty-as-gpu-manager": AllocateCase(
        (_bound(gpu_manager_readme_pod_1(), [ContainerAllocation("nvidia", (1,), 8, 500)]),),
        VMEM, 30, {},
    ),
    "hami-one-gpu-gets-its-memory-and-sm-limits": AllocateCase(
        (_bound(
            _hami("h", {"cuda": {NVGPU: 1, "nvidia.com/gpumem": 3000, "nvidia.com/gpucores": 30}}),
            [ContainerAllocation("cuda", (0,), 3, 300)],
        ),),
        NVGPU, 1,
        {"NVIDIA_VISIBLE_DEVICES": UUID[0], "CUDA_DEVICE_MEMORY_LIMIT_0": "3072m",
         "CUDA_DEVICE_SM_LIMIT": "30"},
    ),
    "hami-two-whole-gpus-by-count": AllocateCase(
        (_bound(_hami("h", {"cuda": {NVGPU: 2, "nvidia.com/gpucores": 100}}),
                [_whole("cuda", (0, 1))]),),
        NVGPU, 2,
        {"NVIDIA_VISIBLE_DEVICES": f"{UUID[0]},{UUID[1]}", "CUDA_DEVICE_MEMORY_LIMIT_0": "16384m",
         "CUDA_DEVICE_MEMORY_LIMIT_1": "16384m", "CUDA_DEVICE_SM_LIMIT": "100"},
    ),
    "hami-without-gpucores-has-sm-limit-0-as-hami": AllocateCase(
        (_bound(_hami("h", {"cuda": {NVGPU: 1, "nvidia.com/gpumem-percentage": 50}}),
                [ContainerAllocation("cuda", (1,), 8)]),),
        NVGPU, 1, {"NVIDIA_VISIBLE_DEVICES": UUID[1], "CUDA_DEVICE_SM_LIMIT": "0"},
    ),
    "equal-vcuda-core-on-different-gpus-is-refused-not-guessed": AllocateCase(
        (
            _bound(_tencent("a", 50, 8), [ContainerAllocation("main", (0,), 2, 500)], 1),
            _bound(_tencent("b", 50, 16), [ContainerAllocation("main", (1,), 4, 500)], 2),
        ),
        VCORE, 50, refused="cannot be told apart",
    ),
    "vcuda-core-count-tells-pods-apart": AllocateCase(
        (
            _bound(_tencent("a", 30, 8), [ContainerAllocation("main", (0,), 2, 300)], 1),
            _bound(_tencent("b", 50, 8), [ContainerAllocation("main", (1,), 2, 500)], 2),
        ),
        VCORE, 50, {"NVIDIA_VISIBLE_DEVICES": UUID[1]},
    ),
    "a-gpu-mem-pod-never-answers-a-dialect-call": AllocateCase(
        (
            _bound(dialect_pod_json("ali", {"main": {GPU_MEM: 2}}),
                   [ContainerAllocation("main", (0,), 2)]),
        ),
        NVGPU, 1, refused="no GPU assignment from gpushare's scheduler for a container asking 1",
    ),
    "a-dialect-pod-never-answers-a-gpu-mem-call": AllocateCase(
        (
            _bound(_tencent("t", 50, 8), [ContainerAllocation("main", (1,), 2, 500)], 1),
            _bound(dialect_pod_json("ali", {"main": {GPU_MEM: 2}}),
                   [ContainerAllocation("main", (0,), 2)], 2),
        ),
        GPU_MEM, 2, {"NVIDIA_VISIBLE_DEVICES": UUID[0], "ALIYUN_COM_GPU_MEM_IDX": "0"},
    ),
    "hami-container-without-nvidia-gpu-is-counted-as-left-out": AllocateCase(
        (_bound(_hami("h", {"a": {NVGPU: 1, "nvidia.com/gpumem": 1024},
                            "b": {"nvidia.com/gpumem": 1024}}),
                [ContainerAllocation("a", (0,), 1), ContainerAllocation("b", (0,), 1)]),),
        NVGPU, 1, refused="1 GPU pod(s) bound here are left out of matching (a GPU container "
        "names no nvidia.com/gpu",
    ),
    "a-pod-without-assignment-beside-another-tenants-pod-is-told-its-own-lack": AllocateCase(
        (_bound(dialect_pod_json("other-tenant", {"main": {GPU_MEM: 2}}),
                [ContainerAllocation("main", (0,), 2)]),),
        GPU_MEM, 4, refused="no GPU assignment from gpushare's scheduler for a container "
        "asking 4 unit(s): this pod was not placed by gpushare's scheduler extender",
    ),
    "mps-thread-percentage-from-the-compute-share": AllocateCase(
        (_bound(_tencent("t", 30, 40), [ContainerAllocation("main", (0,), 10, 300)]),),
        VCORE, 30, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=10240M"}, mps=True,
    ),
    "mps-vcuda-core-limit-raises-the-cap-to-its-burst-ceiling": AllocateCase(
        (_bound(_tencent("t", 30, 30, annotations={"tencent.com/vcuda-core-limit": "80"}),
                [ContainerAllocation("main", (1,), 8, 300)]),),
        VCORE, 30, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "80"}, mps=True,
    ),
    "mps-vcuda-core-limit-above-100-is-100": AllocateCase(
        (_bound(_tencent("t", 30, 30, annotations={"tencent.com/vcuda-core-limit": "150"}),
                [ContainerAllocation("main", (1,), 8, 300)]),),
        VCORE, 30, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, mps=True,
    ),
    "vcuda-core-limit-on-a-hami-pod-is-not-its-system's-and-changes-nothing": AllocateCase(
        (_bound(dialect_pod_json("h", {"cuda": {NVGPU: 1, "nvidia.com/gpucores": 20}},
                                 annotations={"tencent.com/vcuda-core-limit": "90"}),
                [ContainerAllocation("cuda", (0,), 16, 200)]),),
        NVGPU, 1, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}, mps=True,
    ),
    "vcuda-core-limit-without-mps-changes-nothing": AllocateCase(
        (_bound(_tencent("t", 30, 30, annotations={"tencent.com/vcuda-core-limit": "80"}),
                [ContainerAllocation("main", (1,), 8, 300)]),),
        VCORE, 30, {"NVIDIA_VISIBLE_DEVICES": UUID[1]},
        absent=("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",),
    ),
    "mps-whole-gpus-get-100": AllocateCase(
        (_bound(gpu_manager_readme_pod_2(), [_whole("nvidia", (0, 1))]),),
        VCORE, 200, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"}, mps=True,
    ),
    "mps-alibaba-gpu-core-percentage-is-compute": AllocateCase(
        (_bound(dialect_pod_json("ali", {"main": {GPU_MEM: 8,
                                                  "aliyun.com/gpu-core.percentage": 20}}),
                [ContainerAllocation("main", (0,), 8, 200)]),),
        GPU_MEM, 8, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "20"}, mps=True,
    ),
    "gpushare-exclusive-is-matched-by-the-gpu-mem-its-spec-names": AllocateCase(
        (_bound(dialect_pod_json("ali", {"main": {GPU_MEM: 4}},
                                 annotations={"gpushare.io/exclusive": "true"}),
                [_whole("main", (1,))]),),
        GPU_MEM, 4,
        {"NVIDIA_VISIBLE_DEVICES": UUID[1], "ALIYUN_COM_GPU_MEM_IDX": "1",
         "ALIYUN_COM_GPU_MEM_CONTAINER": "16", "ALIYUN_COM_GPU_MEM_POD": "16"},
    ),
    "gpushare-exclusive-is-not-matched-by-the-whole-gpus-memory": AllocateCase(
        (_bound(dialect_pod_json("ali", {"main": {GPU_MEM: 4}},
                                 annotations={"gpushare.io/exclusive": "true"}),
                [_whole("main", (1,))]),),
        GPU_MEM, 16, refused="no GPU assignment from gpushare's scheduler for a container "
        "asking 16",
    ),
    "mps-alibaba-memory-only-stays-derived-from-memory": AllocateCase(
        (_bound(dialect_pod_json("ali", {"main": {GPU_MEM: 4}}),
                [ContainerAllocation("main", (0,), 4)]),),
        GPU_MEM, 4, {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "25"}, mps=True,
    ),
    "hami-mps-gets-both-systems-variables": AllocateCase(
        (_bound(_hami("h", {"cuda": {NVGPU: 1, "nvidia.com/gpumem": 2048,
                                     "nvidia.com/gpucores": 40}}),
                [ContainerAllocation("cuda", (1,), 2, 400)]),),
        NVGPU, 1, {"CUDA_DEVICE_SM_LIMIT": "40", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "40"},
        mps=True,
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_allocate_answers_each_resources_call(socket_dir: Path, case: AllocateCase) -> None:
    async def scenario() -> tuple[dict[str, str] | None, str, MemoryPods]:
        async with plugin(socket_dir, case.pods, mps=case.mps) as served:
            try:
                answer = await served.kubelet.allocate(case.resource, size=case.size)
            except aio.AioRpcError as error:
                code = error.code()
                return None, f"{code.name}: {error.details()}", served.pods
            (container,) = answer.container_responses
            if case.resource == VMEM:
                assert container == type(container)()  # empty, as gpu-manager's vmemory
            return dict(container.envs), "", served.pods

    envs, refusal, pods = run(scenario())
    if case.refused:
        assert envs is None
        assert refusal.startswith("FAILED_PRECONDITION: ")
        assert case.refused in refusal
        assert pods.patches == []
        for pod in case.pods:  # kubelet shows it to the admitted pod's owner: no other pod
            metadata = pod["metadata"]
            assert f"{metadata['namespace']}/{metadata['name']}" not in refusal
        return
    assert envs is not None, refusal
    assert {k: envs.get(k) for k in case.envs} == case.envs
    for name in case.absent:
        assert name not in envs
    if case.resource != VMEM:
        (_, annotations) = pods.patches[-1]
        assert annotations[ALIYUN_ASSIGNED] == "true"


def test_readme_pod_admitted_on_both_tencent_resources_in_either_order(socket_dir: Path) -> None:
    """kubelet calls each resource of a container in map order: vcuda-memory first or second,
    the container gets its GPU once, from vcuda-core."""
    pods = [_bound(gpu_manager_readme_pod_1(), [ContainerAllocation("nvidia", (1,), 8, 500)])]

    async def scenario(order: tuple[str, str]) -> dict[str, str]:
        async with plugin(socket_dir, [dict(p) for p in pods]) as served:
            envs: dict[str, str] = {}
            for resource in order:
                answer = await served.kubelet.allocate(
                    resource, size=50 if resource == VCORE else 30
                )
                envs.update(answer.container_responses[0].envs)
            assert len(served.pods.patches) == 1
            return envs

    for order in ((VCORE, VMEM), (VMEM, VCORE)):
        pods = [_bound(gpu_manager_readme_pod_1(), [ContainerAllocation("nvidia", (1,), 8, 500)])]
        assert run(scenario(order)) == {"NVIDIA_VISIBLE_DEVICES": UUID[1]}
