"""The share-view library (``libgpushare-share.so``, docs/share-view.md) on a real GPU, under
the MPS daemon the device plugin manages, with PyTorch programs started exactly as a container
runtime would start them from the device plugin's Allocate answers.

Run on a lent GPU (root; the machine's ``python3`` has PyTorch) with ``build/native/`` (made by
``bash scripts/build-native.sh``) and ``.whl/`` carried::

    bash bench/gpu/run.sh -k share_view

(about 2.5 minutes; without ``build/native/`` the library is built into /tmp/gpushare-native
when ``cc`` exists, else the check fails saying so). Targets: PyTorch's
``total_memory`` and ``mem_get_info()`` total = share ± 1 %; ``nvidia-smi`` memory.total,
memory.used = the share; a vLLM-style sizing (0.9 × total as one pool, then a bf16 matmul loop)
starts and runs in each; with MPS a process past its share still fails at ≤ share + 1 %; each
neighbour keeps ≥ 85 % of its alone matmul throughput; the library's cost on the matmul ≤ 1 %.

How: the device plugin's gpu-mem resource (``resource_runner``: the real ``HandshakeAllocator``
over two bound pods, real NVML) with the managed MPS daemon (``managed_mps`` of
``test_gpu_checks.py``) and ``isolation=node_isolation(mps=True, ...)`` with the library
installed, answers Allocate for pods a (a quarter of the memory, 50 % compute) and b (a quarter,
25 %) through the kubelet stand-in. Each answer becomes a process environment as a container
runtime makes it: its ``envs`` and ``CUDA_VISIBLE_DEVICES`` from ``NVIDIA_VISIBLE_DEVICES``.
There is no container, so what it would preload is given as ``LD_PRELOAD`` (inherited by the
process's children, as a container's ``/etc/ld.so.preload`` covers them): the entries of the
file the answer mounts at ``/etc/ld.so.preload`` and of an ``LD_PRELOAD`` it gives, each read
through the answer's mounts (container path -> host path). A container has its own ``/tmp``;
here the processes share the host's, so each share gets its own usage file
(``GPUSHARE_SHARE_STATE``, docs/share-view.md). ``share_probe.py`` runs once per share in
``limit`` mode (totals, ``nvidia-smi``, share + 2 %, the largest allocation), then four times
alone per share in ``bench`` mode (with the library, without, without, with: the library's
cost), then both shares at once (windows synchronised by a start time). Every number is
printed, and written to ``$OUT/share-view.json`` and ``$OUT/share-view.md`` (``/tmp`` without
``$OUT``), before the targets are asserted.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
from test_gpu_checks import NODE, UNIT, Pod, bound_pod, compute_mode, managed_mps

from gpushare.deviceplugin.daemon import resource_runner
from gpushare.deviceplugin.dialects import GPU_MEM_DIALECT, DialectResource
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.isolation import (
    CONTAINER_LIBRARY,
    LIBRARY_NAME,
    NodeIsolation,
    install_library,
    node_isolation,
)
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME
from gpushare.deviceplugin.mps import MpsPaths
from gpushare.deviceplugin.nvml import COMPUTE_MODE_NAMES, NvmlInventory
from gpushare.kube.codec import GPU_MEM
from gpushare.testing.kubelet import FakeKubelet
from gpushare.testing.podsource import MemoryPods

# pytest's ini timeout (300 s) is tight for this one; the marker exists with pytest-timeout.
pytestmark = [pytest.mark.timeout(600)] if importlib.util.find_spec("pytest_timeout") else []

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROBE = HERE / "share_probe.py"
BUILT_LIBRARY = ROOT / "build" / "native" / LIBRARY_NAME
BUILD_DIR = Path("/tmp/gpushare-native")
PROBE_PYTHON = os.environ.get("GPUSHARE_PROBE_PYTHON", "python3")  # the one with torch
PERCENTS = {"a": 50, "b": 25}  # compute per share, as test_gpu_checks builds the pods
ALONE_ORDER = (True, False, False, True)  # with the library or not, per alone run (ABBA)
WINDOW_S = 6.0  # each alone matmul window
TOGETHER_WINDOW_S = 10.0
POOL_FRACTION = 0.9
TOLERANCE = 0.01  # totals, the largest allocation, the library's cost
KEEP = 0.85  # a neighbour's throughput, of its alone throughput
LATE_S = 1.0  # the most a synchronised window may start late
PROBE_TIMEOUT_S = 180
PRELOAD_FILE = "/etc/ld.so.preload"  # glibc's dynamic linker reads it in every process


@dataclass(frozen=True)
class Answer:
    """One container's Allocate answer: ``envs``, ``mounts`` (container path -> host path)
    and ``preload``: what the container's dynamic linker would load first (container paths:
    the entries of the file mounted at ``/etc/ld.so.preload``, then of ``LD_PRELOAD``)."""

    envs: dict[str, str]
    mounts: dict[str, str]
    preload: list[str]


def preload_entries(text: str) -> list[str]:
    """The libraries of an ``ld.so.preload`` file (``ld.so(8)``: separated by white space) or
    an ``LD_PRELOAD`` value (white space or colons)."""
    return [entry for entry in re.split(r"[:\s]+", text) if entry]


def answer_of(envs: dict[str, str], mounts: dict[str, str]) -> Answer:
    """The ``Answer`` of ``envs`` and ``mounts``, reading the mounted preload file now."""
    listed = ""
    if PRELOAD_FILE in mounts:
        try:
            listed = Path(mounts[PRELOAD_FILE]).read_text()
        except OSError as error:
            print(f"cannot read the file mounted at {PRELOAD_FILE}: {error}")
    return Answer(
        envs, mounts, preload_entries(listed) + preload_entries(envs.get("LD_PRELOAD", ""))
    )


@dataclass(frozen=True)
class Row:
    """One target: what was measured, the target, met or not."""

    check: str
    measured: str
    target: str
    ok: bool


def share_library() -> Path:
    """``build/native/libgpushare-share.so`` when carried, else built with ``cc``."""
    if BUILT_LIBRARY.is_file():
        return BUILT_LIBRARY
    script = ROOT / "scripts" / "build-native.sh"
    if shutil.which("cc") is None:
        pytest.fail(
            f"no {BUILT_LIBRARY} (carry build/native/ after `bash {script.relative_to(ROOT)}`) "
            "and no cc on PATH to build it here"
        )
    done = subprocess.run(
        ["bash", str(script), str(BUILD_DIR)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    print(f"bash {script} {BUILD_DIR}: exit {done.returncode}\n{done.stdout}{done.stderr}")
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines or not Path(lines[-1]).is_file():
        pytest.fail(
            f"building the library failed: bash {script} {BUILD_DIR}: exit {done.returncode}; "
            f"stdout {done.stdout[-2000:]!r}; stderr {done.stderr[-4000:]!r}"
        )
    return Path(lines[-1])


def library_facts(library: Path) -> dict[str, Any]:
    """Which build of the library this is: size, content hash, build-native.sh's stamp."""
    data = library.read_bytes()
    stamp = library.with_name(library.name + ".stamp")
    return {
        "path": str(library),
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest()[:16],
        "stamp": stamp.read_text().strip() if stamp.is_file() else None,
        "modified": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(library.stat().st_mtime)),
    }


def base_env() -> dict[str, str]:
    """This process's environment without what a container would not inherit: the pytest
    process's ``PYTHONPATH`` (``/tmp/site`` could shadow torch's packages) and any
    ``LD_PRELOAD``."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LD_PRELOAD")}


def torch_version() -> str:
    """PyTorch's and its CUDA's versions in the probe's Python; fails saying what it saw."""
    command = [PROBE_PYTHON, "-c", "import torch; print(torch.__version__, torch.version.cuda)"]
    try:
        done = subprocess.run(
            command, env=base_env(), capture_output=True, text=True, timeout=120, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        pytest.fail(f"{command}: {error!r} (set GPUSHARE_PROBE_PYTHON to a Python with torch)")
    if done.returncode != 0:
        pytest.fail(
            f"{PROBE_PYTHON} cannot import torch (the probe needs PyTorch; set "
            f"GPUSHARE_PROBE_PYTHON): exit {done.returncode}: {done.stderr[-3000:]}"
        )
    return done.stdout.strip()


async def allocate_shares(
    gpu: PhysicalGpu, isolation: NodeIsolation, paths: MpsPaths, root: Path, pods: list[Pod]
) -> list[Answer]:
    """``allocate_two`` of ``test_gpu_checks.py`` with the node's ``isolation``: the gpu-mem
    resource registered with the kubelet stand-in, Allocate once per pod; envs and mounts."""
    source = MemoryPods(pods)
    served = DialectResource(GPU_MEM, DEFAULT_SOCKET_NAME, per_gpu=None, allocate=GPU_MEM_DIALECT)
    socket_dir = root / "device-plugins"
    socket_dir.mkdir()
    answers = []
    async with FakeKubelet(socket_dir) as kubelet:
        runner, _ = resource_runner(
            served,
            [gpu],
            UNIT,
            source,
            node_name=NODE,
            socket_dir=socket_dir,
            mps_paths=paths,
            isolation=isolation,
        )
        await runner.start()
        try:
            await kubelet.wait_for_devices(GPU_MEM, lambda v: v.allocatable == gpu.units(UNIT), 30)
            for pod in pods:
                share = int(pod["spec"]["containers"][0]["resources"]["limits"][GPU_MEM])
                response = (await kubelet.allocate(GPU_MEM, size=share)).container_responses[0]
                answer = answer_of(
                    dict(response.envs), {m.container_path: m.host_path for m in response.mounts}
                )
                answers.append(answer)
                print(
                    f"Allocate {share} GiB -> envs {json.dumps(answer.envs, sort_keys=True)} "
                    f"mounts {json.dumps(answer.mounts, sort_keys=True)} "
                    f"preloaded {answer.preload}"
                )
        finally:
            await runner.stop()
    print(f"annotation patches: {source.patches}")
    return answers


def process_env(answer: Answer, usage_file: Path, library: bool = True) -> dict[str, str]:
    """The environment a container runtime gives the container (module doc); ``library``
    False: the same without ``LD_PRELOAD``."""
    env = base_env()
    env.update(answer.envs)
    env["CUDA_VISIBLE_DEVICES"] = answer.envs.get("NVIDIA_VISIBLE_DEVICES", "")
    env.pop("LD_PRELOAD", None)
    if library and answer.preload:
        env["LD_PRELOAD"] = ":".join(answer.mounts.get(entry, entry) for entry in answer.preload)
    if "GPUSHARE_SHARE_STATE" not in answer.envs:
        env["GPUSHARE_SHARE_STATE"] = str(usage_file)
    return env


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return value if isinstance(value, str) else ""


def parsed(label: str, code: int | None, stdout: str, stderr: str) -> dict[str, Any]:
    """The probe's JSON line (its last stdout line), or what it printed instead."""
    print(f"--- {label}: exit {code}\n{stdout.strip()}\nstderr: {stderr[-3000:].strip()}")
    report: dict[str, Any]
    try:
        report = json.loads(stdout.strip().splitlines()[-1])
        if not isinstance(report, dict):
            raise TypeError(type(report).__name__)
    except (IndexError, ValueError, TypeError):
        report = {
            "error": f"exit {code} and no JSON line",
            "stdout": stdout[-2000:],
            "stderr": stderr[-2000:],
        }
    report["label"] = label
    report["exit"] = code
    report["stderr_tail"] = stderr[-1000:]
    return report


def probes(runs: Sequence[tuple[str, dict[str, str], list[str]]]) -> list[dict[str, Any]]:
    """Start ``share_probe.py`` once per ``(label, environment, arguments)``, all at once;
    their reports in order."""
    started = []
    for label, env, args in runs:
        command = [PROBE_PYTHON, str(PROBE), "--label", label, *args]
        print(f"start {label}: {' '.join(command)}")
        process = subprocess.Popen(  # its own process group: a timeout kills its children too
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        started.append((label, process))
    reports = []
    for label, process in started:
        try:
            out, err = process.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired as error:
            os.killpg(process.pid, signal.SIGKILL)
            out, err = process.communicate()
            print(f"--- {label}: timed out after {PROBE_TIMEOUT_S} s")
            report = parsed(label, None, _text(out or error.stdout), _text(err or error.stderr))
            report["error"] = f"timed out after {PROBE_TIMEOUT_S} s"
            reports.append(report)
            continue
        reports.append(parsed(label, process.returncode, out, err))
    return reports


def num(report: dict[str, Any], *keys: str) -> float | None:
    """``report[k1][k2]...`` when it is a number, else ``None``."""
    value: Any = report
    for key in keys:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def within(value: float | None, target: float, tolerance: float = TOLERANCE) -> bool:
    return value is not None and abs(value - target) <= tolerance * target


def mean_tflops(reports: list[dict[str, Any]]) -> float | None:
    values = [v for r in reports if (v := num(r, "tflops")) is not None]
    return statistics.fmean(values) if len(values) == len(reports) and values else None


def evaluate(summary: dict[str, Any]) -> list[Row]:
    """Every target of the module doc against what ``summary`` holds."""
    share = float(summary["share_mib"])
    uuid = summary["gpu"]["uuid"]
    runs: list[dict[str, Any]] = summary["runs"]
    rows: list[Row] = []
    if "error" in summary:
        rows.append(Row("the scenario ran to its end", summary["error"][-300:], "no error", False))
    for report in runs:
        error = str(report.get("error", "")).strip().splitlines()
        rows.append(
            Row(f"{report['label']}: the probe ran", error[-1] if error else "ok", "ok", not error)
        )
        if "with_library" in report:
            loaded = report.get("library_loaded")
            rows.append(
                Row(
                    f"{report['label']}: libgpushare-share mapped",
                    str(loaded),
                    str(report["with_library"]),
                    loaded is report["with_library"],
                )
            )
    for name in PERCENTS:
        answer = summary.get("answers", {}).get(name, {})
        envs, mounts = answer.get("envs", {}), answer.get("mounts", {})
        preload, listed = answer.get("preload", []), envs.get("GPUSHARE_SHARE_MIB")
        library = str(CONTAINER_LIBRARY)
        rows.append(
            Row(
                f"{name}: Allocate gives the library (preloaded, mounted, GPUSHARE_SHARE_MIB)",
                f"preloaded {preload}, mount {mounts.get(library)}, {listed}",
                f"{library} preloaded and mounted, {uuid}={int(share)}",
                library in preload and library in mounts and listed == f"{uuid}={int(share)}",
            )
        )
        mine = [r for r in runs if r.get("share") == name]
        limit = next((r for r in mine if r.get("phase") == "limit"), {})
        for what, keys in (
            ("torch total_memory", ("totals", "total_memory_mib")),
            ("torch mem_get_info() total", ("totals", "mem_get_info_total_mib")),
            ("nvidia-smi memory.total", ("nvidia_smi", "total_mib")),
        ):
            value = num(limit, *keys)
            rows.append(
                Row(
                    f"{name}: {what} (MiB)", fmt(value), f"{share:,.0f} ± 1 %", within(value, share)
                )
            )
        held = num(limit, "largest_mib")
        used = num(limit, "nvidia_smi_holding", "used_mib")
        rows.append(
            Row(
                f"{name}: nvidia-smi memory.used holding the largest allocation (MiB)",
                f"{fmt(used)} holding {fmt(held, 0)}",
                "held - 1 % <= used <= share + 1 %",
                used is not None
                and held is not None
                and held * (1 - TOLERANCE) <= used <= share * (1 + TOLERANCE),
            )
        )
        past = limit.get("past_share", {})
        rows.append(
            Row(
                f"{name}: one allocation of share + 2 % ({past.get('mib', '-')} MiB)",
                str(past.get("result")),
                "out_of_memory",
                past.get("result") == "out_of_memory",
            )
        )
        rows.append(
            Row(
                f"{name}: largest 256-MiB-step allocation that succeeds (MiB)",
                fmt(held, 0),
                f"<= {share * (1 + TOLERANCE):,.0f} (share + 1 %)",
                held is not None and held <= share * (1 + TOLERANCE),
            )
        )
        for report in (r for r in mine if r.get("phase") != "limit" and r.get("with_library")):
            pool = report.get("pool_from_total", {})
            tflops = num(report, "tflops")
            rows.append(
                Row(
                    f"{report['label']}: 0.9 × total as one pool, then the matmul loop",
                    f"pool {fmt(num(pool, 'mib'), 0)} MiB {pool.get('result')}, "
                    f"{fmt(tflops)} TFLOP/s",
                    "pool ok, TFLOP/s > 0",
                    pool.get("result") == "ok" and tflops is not None and tflops > 0,
                )
            )
        alone = [r for r in mine if r.get("phase") == "alone"]
        with_lib = mean_tflops([r for r in alone if r.get("with_library")])
        without = mean_tflops([r for r in alone if not r.get("with_library")])
        cost = None if with_lib is None or not without else 1 - with_lib / without
        rows.append(
            Row(
                f"{name}: the library's cost on the matmul (alone, mean of 2 runs each)",
                f"{fmt(None if cost is None else 100 * cost, 2)} % "
                f"({fmt(with_lib)} with, {fmt(without)} without TFLOP/s)",
                "<= 1 %",
                cost is not None and cost <= TOLERANCE,
            )
        )
        together = next((r for r in mine if r.get("phase") == "together"), {})
        both = num(together, "tflops")
        kept = None if both is None or not with_lib else both / with_lib
        rows.append(
            Row(
                f"{name}: throughput with the neighbour, of alone (with the library)",
                f"{fmt(None if kept is None else 100 * kept)} % ({fmt(both)} of {fmt(with_lib)})",
                ">= 85 %",
                kept is not None and kept >= KEEP,
            )
        )
        late = num(together, "late_s")
        rows.append(
            Row(
                f"{name}: together, window started after the common start time (s)",
                fmt(late, 2),
                f"<= {LATE_S}",
                late is not None and late <= LATE_S,
            )
        )
    before, after = summary.get("compute_mode") or (None, None)
    rows.append(Row("compute mode restored", f"{before} -> {after}", "as before", before == after))
    return rows


def markdown(summary: dict[str, Any], rows: list[Row]) -> str:
    """The checks and every run, as Markdown tables."""
    lines = [
        f"# Share view on {summary['gpu']['model']} ({summary['gpu']['uuid']})",
        "",
        f"Share {summary['share_gib']} GiB ({summary['share_mib']} MiB) of "
        f"{summary['gpu']['memory_mib']} MiB; isolation {summary.get('isolation')}; "
        f"torch {summary.get('torch')}; library {json.dumps(summary.get('library'))}; "
        f"{summary.get('elapsed_s', 0):.0f} s.",
        "",
        "| check | measured | target | ok |",
        "|---|---|---|---|",
        *(
            f"| {r.check} | {r.measured} | {r.target} | {'yes' if r.ok else '**NO**'} |"
            for r in rows
        ),
        "",
        "| run | library | pool from 0.9 × total | torch total | mem_get_info free / total "
        "| nvidia-smi total / used | TFLOP/s (median batch) | late s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["runs"]:
        pool = r.get("pool_from_total", {})
        lines.append(
            f"| {r['label']} | {r.get('library_loaded')} "
            f"| {fmt(num(pool, 'mib'), 0)} {pool.get('result', '-')} "
            f"| {fmt(num(r, 'totals', 'total_memory_mib'), 0)} "
            f"| {fmt(num(r, 'totals', 'mem_get_info_free_mib'), 0)} / "
            f"{fmt(num(r, 'totals', 'mem_get_info_total_mib'), 0)} "
            f"| {fmt(num(r, 'nvidia_smi', 'total_mib'), 0)} / "
            f"{fmt(num(r, 'nvidia_smi', 'used_mib'), 0)} "
            f"| {fmt(num(r, 'tflops'))} ({fmt(num(r, 'tflops_batches', 'median'))}) "
            f"| {fmt(num(r, 'late_s'), 2)} |"
        )
    return "\n".join(lines) + "\n"


def test_share_view_under_mps(
    nvml_inventory: NvmlInventory, gpu: PhysicalGpu, libcuda: None, mps_control_binary: str
) -> None:
    """The module doc's scenario and targets."""
    began = time.monotonic()
    library = share_library()
    torch = torch_version()
    share = max(1, gpu.units(UNIT) // 4)
    share_mib = share * UNIT.mib
    mode_before = compute_mode(nvml_inventory, gpu)
    root = Path(tempfile.mkdtemp(prefix="gpushare-share-view-", dir="/tmp"))
    isolation = node_isolation(
        mps=True, nvml=nvml_inventory.nvml, library=install_library(library, root / "host-lib")
    )
    pods = [
        bound_pod(name, gpu, share, percent, assume_ns)
        for assume_ns, (name, percent) in enumerate(PERCENTS.items(), start=1)
    ]
    runs: list[dict[str, Any]] = []
    summary: dict[str, Any] = {
        "gpu": {"uuid": gpu.uuid, "model": gpu.model, "memory_mib": gpu.memory_mib},
        "share_gib": share,
        "share_mib": share_mib,
        "compute_percent": PERCENTS,
        "library": library_facts(library),
        "installed_as": str(isolation.library.host_path if isolation.library else None),
        "isolation": isolation.isolation.said(),
        "torch": torch,
        "runs": runs,
    }
    print(f"share {share} GiB = {share_mib} MiB; isolation {summary['isolation']}; torch {torch}")
    print(f"library {json.dumps(summary['library'])}")

    def record(phase: str, name: str, with_library: bool | None, report: dict[str, Any]) -> None:
        report["phase"], report["share"] = phase, name
        if with_library is not None:
            report["with_library"] = with_library
        runs.append(report)

    async def scenario() -> None:
        async with managed_mps(nvml_inventory, gpu, mps_control_binary, root) as supervisor:
            answers = dict(
                zip(
                    PERCENTS,
                    await allocate_shares(gpu, isolation, supervisor.control.paths, root, pods),
                    strict=True,
                )
            )
            summary["answers"] = {n: asdict(a) for n, a in answers.items()}
            env = {n: process_env(a, root / f"usage-{n}") for n, a in answers.items()}
            bare = {n: process_env(a, root / f"usage-{n}", False) for n, a in answers.items()}
            for name in PERCENTS:
                args = ["--mode", "limit", "--share-mib", str(share_mib)]
                (report,) = await asyncio.to_thread(probes, [(f"{name} limit", env[name], args)])
                record("limit", name, True, report)
            fallback = ["--fallback-pool-mib", str(int(POOL_FRACTION * share_mib))]
            for name in PERCENTS:
                for run, with_library in enumerate(ALONE_ORDER, start=1):
                    label = f"{name} alone {'with' if with_library else 'without'} library #{run}"
                    args = ["--mode", "bench", "--window-s", str(WINDOW_S), *fallback]
                    chosen = env[name] if with_library else bare[name]
                    (report,) = await asyncio.to_thread(probes, [(label, chosen, args)])
                    record("alone", name, with_library, report)
            ready = [v for r in runs if (v := num(r, "ready_s")) is not None]
            start_at = time.time() + max(ready, default=60.0) + 8.0
            args = ["--mode", "bench", "--window-s", str(TOGETHER_WINDOW_S), *fallback]
            args += ["--start-at", f"{start_at:.3f}"]
            together = await asyncio.to_thread(
                probes, [(f"{n} together", env[n], args) for n in PERCENTS]
            )
            for name, report in zip(PERCENTS, together, strict=True):
                record("together", name, True, report)

    try:
        asyncio.run(scenario())
    except Exception as error:  # the numbers so far are still reported
        summary["error"] = f"{type(error).__name__}: {error}"
        raise
    finally:
        mode_after = compute_mode(nvml_inventory, gpu)
        summary["compute_mode"] = [
            COMPUTE_MODE_NAMES.get(mode_before, str(mode_before)),
            COMPUTE_MODE_NAMES.get(mode_after, str(mode_after)),
        ]
        summary["elapsed_s"] = time.monotonic() - began
        rows = evaluate(summary)
        summary["checks"] = [asdict(r) for r in rows]
        out = Path(os.environ.get("OUT") or "/tmp")
        table = markdown(summary, rows)
        print(table)
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "share-view.json").write_text(json.dumps(summary, indent=2, default=str))
            (out / "share-view.md").write_text(table)
            print(f"wrote {out / 'share-view.json'} and {out / 'share-view.md'}")
        except OSError as error:
            print(f"cannot write the summary into {out}: {error}")
        shutil.rmtree(root, ignore_errors=True)
    failed = [f"{r.check}: {r.measured} (target {r.target})" for r in rows if not r.ok]
    assert not failed, "share view targets missed:\n" + "\n".join(failed)
