"""The real-GPU checks of issue 16. Run on a machine with an NVIDIA GPU, as root:

    .venv/bin/pytest bench/gpu -v -s

(a) ``python -m gpushare.deviceplugin.gpucheck`` sees the GPUs NVML and ``nvidia-smi`` see.
(b) The device plugin, with real NVML and the MPS daemon it manages (``MpsSupervisor``, the real
    ``nvidia-cuda-mps-control``), answers Allocate for two containers sharing GPU 0 through the
    kubelet stand-in; two CUDA processes started with exactly those environments (plus
    ``CUDA_VISIBLE_DEVICES``, which the container runtime would set from
    ``NVIDIA_VISIBLE_DEVICES``) allocate: one within its share (succeeds), one past it (fails
    with CUDA_ERROR_OUT_OF_MEMORY). The compute mode is restored afterwards.
(c) The device plugin's NVML metrics (memory per compute process) agree with ``nvidia-smi``.

Without a GPU every check is skipped with the reason (``conftest.py``). Outputs are printed
(``-s``) for the issue's note.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.handshake import Step
from gpushare.deviceplugin._proto import api_pb2
from gpushare.deviceplugin.allocate import container_envs
from gpushare.deviceplugin.inventory import RESOURCE_GPU_MEM, PhysicalGpu
from gpushare.deviceplugin.lifecycle import PluginRunner
from gpushare.deviceplugin.metrics import DevicePluginMetrics
from gpushare.deviceplugin.mps import MpsControl, MpsPaths, MpsSupervisor
from gpushare.deviceplugin.nvml import COMPUTE_MODE_NAMES, NvmlInventory
from gpushare.deviceplugin.server import DevicePluginService
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.kubelet import FakeKubelet

HERE = Path(__file__).resolve().parent
CUDA_ALLOC = HERE / "cuda_alloc.py"
UNIT = MemoryUnit.GIB


def nvidia_smi(*args: str) -> str:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not on $PATH")
    return subprocess.run(
        ["nvidia-smi", *args], check=True, capture_output=True, text=True, timeout=60
    ).stdout


def test_a_gpucheck_sees_the_gpus(nvml_inventory: NvmlInventory) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpushare.deviceplugin.gpucheck", "--watch-s", "3"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(done.stdout, done.stderr)
    assert done.returncode == 0
    listed = nvidia_smi("--query-gpu=uuid,memory.total", "--format=csv,noheader,nounits")
    smi = {
        uuid.strip(): int(mib) for uuid, mib in (line.split(",") for line in listed.splitlines())
    }
    for gpu in nvml_inventory.gpus():
        assert gpu.uuid in done.stdout
        assert abs(smi[gpu.uuid] - gpu.memory_mib) <= 1, (gpu, smi)


class TwoContainers:
    """The Allocator of this check: container ``a`` then ``b``, each ``share`` units of GPU 0,
    answered as ``HandshakeAllocator`` answers with a managed daemon (``container_envs`` plus the
    daemon's variables and mounts); the API-server handshake is proven without a GPU."""

    def __init__(self, gpu: PhysicalGpu, share: int, paths: MpsPaths) -> None:
        self._gpu, self._paths = gpu, paths
        self._steps = [Step("a", (gpu.index,), share), Step("b", (gpu.index,), share)]

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        step = self._steps.pop(0)
        assert [len(c.devices_ids) for c in request.container_requests] == [step.units]
        envs = container_envs(step, step.units, {self._gpu.index: self._gpu}, UNIT, mps=True)
        envs.update(self._paths.envs())
        answer = api_pb2.ContainerAllocateResponse(envs=envs, mounts=self._paths.mounts())
        return api_pb2.AllocateResponse(container_responses=[answer])


@contextlib.asynccontextmanager
async def managed_mps(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, binary: str, root: Path
) -> AsyncIterator[MpsPaths]:
    paths = MpsPaths(root)
    healthy: list[bool] = []

    async def on_health(value: bool) -> None:
        healthy.append(value)

    supervisor = MpsSupervisor(
        MpsControl(paths, [gpu.uuid], binary=binary), nvml_inventory.nvml, [gpu], on_health
    )
    assert await supervisor.start(), f"MPS did not start; see {paths.log_dir}/control.log"
    try:
        yield paths
    finally:
        await supervisor.stop()
        print("MPS control.log:\n" + (paths.log_dir / "control.log").read_text(errors="replace"))


def run_client(envs: Mapping[str, str], gpu: PhysicalGpu, mib: int) -> dict[str, object]:
    env = {**os.environ, **envs, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    done = subprocess.run(
        [sys.executable, str(CUDA_ALLOC), "--mib", str(mib)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(f"client {mib} MiB with {envs}: exit {done.returncode}: {done.stdout}{done.stderr}")
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def test_b_two_containers_one_within_its_share_one_past_it(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, libcuda: None, mps_control_binary: str
) -> None:
    share = max(1, gpu.units(UNIT) // 4)  # a quarter of the GPU each, in GiB
    share_mib = share * UNIT.mib
    mode_before = nvml_inventory.nvml.device_compute_mode(
        nvml_inventory.nvml.device_handle_by_index(gpu.index)
    )
    root = Path(tempfile.mkdtemp(prefix="gpushare-mps-check-", dir="/tmp"))

    async def scenario() -> list[dict[str, object]]:
        async with managed_mps(nvml_inventory, gpu, mps_control_binary, root) as paths:
            service = DevicePluginService([gpu], UNIT, TwoContainers(gpu, share, paths))
            socket_dir = root / "device-plugins"
            socket_dir.mkdir()
            async with FakeKubelet(socket_dir) as kubelet:
                runner = PluginRunner(service, socket_dir=socket_dir)
                await runner.start()
                try:
                    await kubelet.wait_for_devices(
                        RESOURCE_GPU_MEM, lambda v: v.allocatable == gpu.units(UNIT), 30
                    )
                    answers = [await kubelet.allocate(RESOURCE_GPU_MEM, size=share) for _ in "ab"]
                finally:
                    await runner.stop()
            envs = [dict(a.container_responses[0].envs) for a in answers]
            for e in envs:
                assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={share_mib}M"
                assert e["CUDA_MPS_PIPE_DIRECTORY"] == str(paths.pipe_dir)
            return [
                await asyncio.to_thread(run_client, envs[0], gpu, share_mib // 2),
                await asyncio.to_thread(run_client, envs[1], gpu, share_mib + 1024),
            ]

    try:
        within, past = asyncio.run(scenario())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert within["result"] == "ok", within
    assert past["result"] == "out_of_memory", past
    mode_after = nvml_inventory.nvml.device_compute_mode(
        nvml_inventory.nvml.device_handle_by_index(gpu.index)
    )
    assert mode_after == mode_before, COMPUTE_MODE_NAMES.get(mode_after)


def test_c_process_memory_metrics_match_nvidia_smi(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, libcuda: None
) -> None:
    client = subprocess.Popen(
        [sys.executable, str(CUDA_ALLOC), "--mib", "1024", "--hold-s", "60"],
        env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert client.stdout is not None
        ready = json.loads(client.stdout.readline())
        assert ready["result"] == "ok", ready
        metrics = DevicePluginMetrics("gpu-check", lambda: [gpu], nvml=nvml_inventory.nvml)
        text = metrics.exposition()[0].decode()
        ours = {
            int(sample.labels["pid"]): int(sample.value) >> 20
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "gpushare_gpu_process_memory_used_bytes"
        }
        listed = nvidia_smi(
            f"--id={gpu.uuid}",
            "--query-compute-apps=pid,used_memory",
            "--format=csv,noheader,nounits",
        )
        smi = {int(pid): int(mib) for pid, mib in (line.split(",") for line in listed.splitlines())}
        print(f"metrics (pid: MiB) {ours}\nnvidia-smi (pid: MiB) {smi}")
        assert client.pid in ours
        assert ours == smi
    finally:
        client.kill()
        client.wait()
