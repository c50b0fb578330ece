"""The real-GPU checks (docs/testing.md, "Which tier proves what"). Run on a machine with an
NVIDIA GPU, as root:

    .venv/bin/pytest bench/gpu -v -s        (or: bash bench/gpu/run.sh, without a .venv)

(a) ``python -m gpushare.deviceplugin.gpucheck`` sees the GPUs NVML and ``nvidia-smi`` see.
(b) The device plugin's gpu-mem resource (``resource_runner``: the real ``HandshakeAllocator``
    over two bound pods, real NVML) with the MPS daemon it manages (``MpsSupervisor``, the real
    ``nvidia-cuda-mps-control``) answers Allocate for two containers sharing GPU 0 through the
    kubelet stand-in; CUDA processes started with exactly those environments (plus
    ``CUDA_VISIBLE_DEVICES``, which the container runtime would set from
    ``NVIDIA_VISIBLE_DEVICES``) allocate: one within its share (succeeds), one past it (fails
    with CUDA_ERROR_OUT_OF_MEMORY); a timed kernel runs about twice as long per halving of the
    compute share. The compute mode is restored afterwards.
(c) The device plugin's NVML metrics (memory per compute process) agree with ``nvidia-smi``.
(d) A SIGKILLed control daemon is restarted (unhealthy, then healthy) and serves clients again.

Without a GPU every check is skipped with the reason (``conftest.py``). Outputs are printed
(``-s``); the last run's numbers are in docs/usage.md, "Enforced shares (MPS)".
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
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpushare.core.model import ContainerAllocation, Gpu, Node
from gpushare.deviceplugin.daemon import resource_runner
from gpushare.deviceplugin.dialects import GPU_MEM_DIALECT, DialectResource
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME
from gpushare.deviceplugin.metrics import DevicePluginMetrics
from gpushare.deviceplugin.mps import MpsControl, MpsPaths, MpsSupervisor
from gpushare.deviceplugin.nvml import COMPUTE_MODE_NAMES, NvmlInventory
from gpushare.kube.codec import GPU_MEM, MemoryUnit
from gpushare.kube.codec.dialects import ALIYUN_CORE_PERCENT
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.podsource import MemoryPods

HERE = Path(__file__).resolve().parent
CUDA_ALLOC = HERE / "cuda_alloc.py"
UNIT = MemoryUnit.GIB
NODE = "gpu-node"
SPIN_ITERS = 1_000_000  # about 0.1 s of the timed kernel on an H100 at 100 %
Pod = dict[str, Any]


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


def bound_pod(name: str, gpu: PhysicalGpu, share: int, percent: int, assume_ns: int) -> Pod:
    """Pod ``gpu-check/name`` bound to the node as the extender binds it: one container asking
    ``share`` GiB of ``aliyun.com/gpu-mem`` and ``percent`` % of the GPU's compute
    (``aliyun.com/gpu-core.percentage``), given both on ``gpu``; not started yet."""
    node = Node(NODE, (Gpu(gpu.index, gpu.model, gpu.units(UNIT)),))
    pod = dialect_pod_json(
        name,
        {"main": {GPU_MEM: share, ALIYUN_CORE_PERCENT: percent}},
        namespace="gpu-check",
        node=NODE,
    )
    given = ContainerAllocation("main", (gpu.index,), share, compute_milli=percent * 10)
    return bound_dialect_pod(pod, node, [given], assume_ns=assume_ns, assigned=False)


@contextlib.asynccontextmanager
async def managed_mps(
    nvml_inventory: NvmlInventory,
    gpu: PhysicalGpu,
    binary: str,
    root: Path,
    health: list[bool] | None = None,
) -> AsyncIterator[MpsSupervisor]:
    """The MPS daemon for ``gpu`` as ``gpushare device-plugin --mps-managed`` runs it, checked
    every 0.5 s; health transitions appended to ``health``."""
    paths = MpsPaths(root)
    seen = [] if health is None else health

    async def on_health(value: bool) -> None:
        seen.append(value)
        print(f"MPS health -> {value}")

    supervisor = MpsSupervisor(
        MpsControl(paths, [gpu.uuid], binary=binary),
        nvml_inventory.nvml,
        [gpu],
        on_health,
        check_interval_s=0.5,
        backoff_initial_s=0.5,
    )
    assert await supervisor.start(), f"MPS did not start; see {paths.log_dir}/control.log"
    watch = asyncio.create_task(supervisor.run())
    try:
        yield supervisor
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
        await supervisor.stop()
        print("MPS control.log:\n" + (paths.log_dir / "control.log").read_text(errors="replace"))


async def allocate_two(
    gpu: PhysicalGpu, paths: MpsPaths, root: Path, pods: list[Pod]
) -> list[dict[str, str]]:
    """The device plugin's gpu-mem resource (real ``HandshakeAllocator``, real NVML GPU, the
    managed daemon's paths) registered with the kubelet stand-in, which calls Allocate once per
    pod, as kubelet does when their containers start; the environments it answered."""
    source = MemoryPods(pods)
    served = DialectResource(GPU_MEM, DEFAULT_SOCKET_NAME, per_gpu=None, allocate=GPU_MEM_DIALECT)
    socket_dir = root / "device-plugins"
    socket_dir.mkdir()
    async with FakeKubelet(socket_dir) as kubelet:
        runner, _ = resource_runner(
            served, [gpu], UNIT, source, node_name=NODE, socket_dir=socket_dir, mps_paths=paths
        )
        await runner.start()
        try:
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == gpu.units(UNIT), 30)
            envs = []
            for pod in pods:
                share = int(pod["spec"]["containers"][0]["resources"]["limits"][GPU_MEM])
                answer = await kubelet.allocate(GPU_MEM, size=share)
                envs.append(dict(answer.container_responses[0].envs))
                print(f"Allocate {share} GiB -> {json.dumps(envs[-1], sort_keys=True)}")
        finally:
            await runner.stop()
    print(f"annotation patches: {source.patches}")
    return envs


def run_client(
    envs: Mapping[str, str], gpu: PhysicalGpu, mib: int, spin_iters: int = 0
) -> dict[str, object]:
    env = {**os.environ, **envs, "CUDA_VISIBLE_DEVICES": gpu.uuid}
    done = subprocess.run(
        [sys.executable, str(CUDA_ALLOC), "--mib", str(mib), "--spin-iters", str(spin_iters)],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    print(f"client {mib} MiB: exit {done.returncode}: {done.stdout}{done.stderr}")
    report: dict[str, object] = json.loads(done.stdout.splitlines()[-1])
    return report


def mps_processes() -> str:
    """``ps`` lines of the MPS daemon and servers."""
    listed = subprocess.run(
        ["ps", "-eo", "pid,ppid,etimes,args"], check=False, capture_output=True, text=True
    ).stdout
    return "\n".join(line for line in listed.splitlines() if "nvidia-cuda-mps" in line)


def compute_mode(nvml_inventory: NvmlInventory, gpu: PhysicalGpu) -> int:
    nvml = nvml_inventory.nvml
    return nvml.device_compute_mode(nvml.device_handle_by_index(gpu.index))


def test_b_two_containers_one_within_its_share_one_past_it(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, libcuda: None, mps_control_binary: str
) -> None:
    """Pods a (a quarter of the memory, 50 % compute) and b (a quarter, 25 %) share GPU 0. Under
    the managed daemon, a allocates half its share (succeeds), b its share + 1 GiB (fails with
    out-of-memory while a holds its memory); each then times the same kernel: b's takes about
    twice a's, and a client given 100 % (the variable overridden) about half a's. What MPS does
    not stop is checked too: b raising its own memory limit variable; and what it does: b
    dropping the MPS variables cannot reach the GPU at all."""
    share = max(1, gpu.units(UNIT) // 4)
    share_mib = share * UNIT.mib
    mode_before = compute_mode(nvml_inventory, gpu)
    root = Path(tempfile.mkdtemp(prefix="gpushare-mps-check-", dir="/tmp"))
    pods = [bound_pod("a", gpu, share, 50, 1), bound_pod("b", gpu, share, 25, 2)]

    async def scenario() -> list[dict[str, object]]:
        async with managed_mps(nvml_inventory, gpu, mps_control_binary, root) as supervisor:
            paths = supervisor.control.paths
            envs = await allocate_two(gpu, paths, root, pods)
            for e, percent in zip(envs, ("50", "25"), strict=True):
                assert e["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={share_mib}M"
                assert e["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
                assert e["CUDA_MPS_PIPE_DIRECTORY"] == str(paths.pipe_dir)
            holder = await asyncio.create_subprocess_exec(
                sys.executable, str(CUDA_ALLOC), "--mib", str(share_mib // 2), "--hold-s", "30",
                env={**os.environ, **envs[0], "CUDA_VISIBLE_DEVICES": gpu.uuid},
                stdout=asyncio.subprocess.PIPE,
            )  # fmt: skip
            try:
                assert holder.stdout is not None
                held = json.loads(await holder.stdout.readline())
                print(f"a holds {share_mib // 2} MiB: {held}")
                print(mps_processes())
                print("nvidia-smi, compute apps:\n" + nvidia_smi(
                    "--query-compute-apps=pid,process_name,used_memory", "--format=csv"
                ))  # fmt: skip
                metrics = DevicePluginMetrics("gpu-check", lambda: [gpu], nvml=nvml_inventory.nvml)
                print("metrics, process memory:\n" + "\n".join(
                    line for line in metrics.exposition()[0].decode().splitlines()
                    if line.startswith("gpushare_gpu_process_memory_used_bytes")
                ))  # fmt: skip
                past = await asyncio.to_thread(run_client, envs[1], gpu, share_mib + 1024)
                # What a container could do to its own variables (docs/usage.md, limits):
                # raise its limit (MPS cannot stop it), or drop MPS (the GPU refuses it).
                raised = {**envs[1], "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={2 * share_mib}M"}
                without = {k: v for k, v in envs[1].items() if not k.startswith("CUDA_MPS_")}
                overridden = await asyncio.to_thread(run_client, raised, gpu, share_mib + 1024)
                bypass = await asyncio.to_thread(run_client, without, gpu, 256)
            finally:
                holder.kill()
                await holder.wait()
            timed = [
                await asyncio.to_thread(run_client, e, gpu, 64, SPIN_ITERS)
                for e in (envs[0], envs[1], {**envs[0], "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"})
            ]
            return [held, past, overridden, bypass, *timed]

    try:
        held, past, overridden, bypass, at_50, at_25, at_100 = asyncio.run(scenario())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert held["result"] == "ok", held
    assert past["result"] == "out_of_memory", past
    assert overridden["result"] == "ok", overridden  # the documented limit of MPS
    assert bypass["result"] == "error", bypass  # EXCLUSIVE_PROCESS: only through MPS
    times = {p: float(str(r["kernel_ms"])) for p, r in ((50, at_50), (25, at_25), (100, at_100))}
    sms = {p: r["context_sms"] for p, r in ((50, at_50), (25, at_25), (100, at_100))}
    print(f"kernel ms by active thread percentage {times}; context SMs {sms}")
    assert 1.6 <= times[25] / times[50] <= 2.4, times
    assert 1.6 <= times[50] / times[100] <= 2.4, times
    assert compute_mode(nvml_inventory, gpu) == mode_before, COMPUTE_MODE_NAMES.get(mode_before)


def test_d_a_killed_daemon_is_restarted_and_clients_work_again(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, libcuda: None, mps_control_binary: str
) -> None:
    """SIGKILL of the real control daemon: the supervisor marks the GPU unhealthy, starts it
    again, marks it healthy, and a new client allocates through it."""
    root = Path(tempfile.mkdtemp(prefix="gpushare-mps-crash-", dir="/tmp"))
    health: list[bool] = []

    async def scenario() -> dict[str, object]:
        async with managed_mps(nvml_inventory, gpu, mps_control_binary, root, health) as sup:
            envs = sup.control.paths.envs()
            before = await asyncio.to_thread(run_client, envs, gpu, 256)
            assert before["result"] == "ok", before
            print(mps_processes())
            killed = subprocess.run(  # the daemon only (its name is cut to 15 characters)
                ["pkill", "-KILL", "-f", "nvidia-cuda-mps-control -d"], check=False
            )
            print(f"pkill -KILL -f 'nvidia-cuda-mps-control -d': exit {killed.returncode}")
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while health[-2:] != [False, True] and loop.time() < deadline:
                await asyncio.sleep(0.2)
            print(f"health transitions {health}, restarts {sup.restarts}")
            print(mps_processes())
            return await asyncio.to_thread(run_client, envs, gpu, 256)

    try:
        after = asyncio.run(scenario())
    finally:
        shutil.rmtree(root, ignore_errors=True)
    assert health == [False, True], health
    assert after["result"] == "ok", after


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
        assert client.stdout is not None
        client.stdout.close()
