"""The share view library (``libgpushare-share.so``) proven without a GPU: stub drivers, a reader.

``tests/native`` holds a stand-in CUDA driver (``stub_cuda.c`` -> ``libcuda.so.1``), a stand-in
NVML (``stub_nvml.c`` -> ``libnvidia-ml.so.1``) and ``read_share.c``, a program that reads its
GPUs' memory every way CUDA programs and NVML tools read it and prints one JSON object.
:func:`build_tools` compiles the three with the system ``cc`` (``-Wall -Werror``);
:func:`build_share_library` builds the library with ``scripts/build-native.sh``; :func:`read_share`
runs the reader with a given environment, with the library preloaded or not, and returns a
:class:`Reading`; :func:`holding_reader` keeps one reader's allocations alive while others read.

The stubs' devices come from ``STUB_CUDA_GPUS`` (:func:`stub_env`): a card's "real" free memory
is its total less what the reading process allocated through the stub and less
``STUB_CUDA_USED_MIB`` (other tenants; NVML reports it as used). The library's own variables
(``GPUSHARE_SHARE_MIB``, ``GPUSHARE_SHARE_ENFORCE``, ``GPUSHARE_SHARE_STATE``) come from
:func:`share_env`. The reader never inherits the caller's environment: what it sees is exactly
what the test passed, plus ``PATH`` and ``LD_LIBRARY_PATH`` (the stubs' directory).

Sizes in :class:`Reading` are bytes, as the APIs report them; :data:`MIB` converts.
Used by ``tests/test_share_view.py`` and ``bench/share_view.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal

__all__ = [
    "BUILD_SCRIPT",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "CUDA_PATHS",
    "LIBRARY_PREFIX",
    "MIB",
    "SOURCES",
    "AllocKind",
    "AllocPlan",
    "AllocResult",
    "AllocRound",
    "BenchResult",
    "CudaMemory",
    "DeviceView",
    "HeldReader",
    "NativeError",
    "NativeTools",
    "NvmlMemory",
    "Reading",
    "StubGpu",
    "Via",
    "build_share_library",
    "build_tools",
    "holding_reader",
    "parse_reading",
    "racing_readers",
    "read_share",
    "share_env",
    "stub_env",
    "stub_uuid",
]

REPO_ROOT = Path(__file__).resolve().parents[3]
SOURCES = REPO_ROOT / "tests" / "native"
"""``stub_cuda.c``, ``stub_nvml.c`` and ``read_share.c``."""
BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-native.sh"
"""Builds ``libgpushare-share.so`` into its argument directory; its last stdout line is the
library's absolute path."""

MIB = 1024 * 1024
CUDA_ERROR_OUT_OF_MEMORY = 2
LIBRARY_PREFIX = "gpushare-share: "
"""How every line the library writes to stderr starts."""

CUDA_PATHS = ("dlsym", "proc_address", "proc_address_v2", "proc_address_self")
"""The ways the reader reaches ``cuDeviceTotalMem_v2`` and ``cuMemGetInfo_v2``:
``dlsym(dlopen("libcuda.so.1"), "..._v2")``; ``cuGetProcAddress`` with the base name at version
12000; ``cuGetProcAddress_v2`` (from ``dlsym``) the same; and ``cuGetProcAddress_v2`` obtained
from ``cuGetProcAddress("cuGetProcAddress", 12000)``, as CUDA 12+ runtimes chain it."""

AllocKind = Literal["alloc", "pitch", "managed", "async", "pool", "create"]
"""``cuMemAlloc_v2``, ``cuMemAllocPitch_v2``, ``cuMemAllocManaged``, ``cuMemAllocAsync``,
``cuMemAllocFromPoolAsync``, ``cuMemCreate`` (freed by ``cuMemFree_v2``, ``cuMemFreeAsync`` and
``cuMemRelease``)."""

Via = Literal["dlsym", "proc", "proc-ptsz"]
"""How the reader finds the allocation family: ``dlsym`` of the ``_v2`` names;
``cuGetProcAddress_v2`` of the base names at version 12000; the same with
``CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`` (the driver answers the ``_ptsz`` variants of
the stream-ordered calls, as for programs built with ``--default-stream per-thread``)."""

_SOURCES_TO_OUTPUTS = (
    ("stub_cuda.c", "lib/libcuda.so.1", ("-fPIC", "-shared", "-Wl,-soname,libcuda.so.1")),
    ("stub_nvml.c", "lib/libnvidia-ml.so.1", ("-fPIC", "-shared", "-Wl,-soname,libnvidia-ml.so.1")),
    ("read_share.c", "read_share", ()),
)
_LIBRARIES = {"stub_cuda.c": ("-lpthread",), "stub_nvml.c": (), "read_share.c": ("-ldl",)}


class NativeError(RuntimeError):
    """A compiler, the build script or the reader failed (their output included)."""


@dataclass(frozen=True, slots=True)
class StubGpu:
    """One GPU of the stub drivers: its UUID (NVML's form) and its memory in MiB."""

    uuid: str
    total_mib: int


def stub_uuid(n: int) -> str:
    """A valid, distinct GPU UUID for test GPU ``n``: ``GPU-5707ab00-0000-4000-8000-<n:012x>``."""
    return f"GPU-5707ab00-0000-4000-8000-{n:012x}"


def stub_env(gpus: Sequence[StubGpu], *, others_used_mib: int | None = None) -> dict[str, str]:
    """The stubs' variables: ``STUB_CUDA_GPUS`` for ``gpus`` and, when given,
    ``STUB_CUDA_USED_MIB`` (memory other tenants hold on every card, MiB)."""
    env = {"STUB_CUDA_GPUS": ",".join(f"{g.uuid}:{g.total_mib}" for g in gpus)}
    if others_used_mib is not None:
        env["STUB_CUDA_USED_MIB"] = str(others_used_mib)
    return env


def share_env(
    shares_mib: Mapping[str, int],
    *,
    enforce: bool | None = None,
    state: Path | None = None,
) -> dict[str, str]:
    """The library's variables for well-formed input: ``GPUSHARE_SHARE_MIB`` from ``shares_mib``
    (UUID -> MiB, in order), ``GPUSHARE_SHARE_ENFORCE`` ``1``/``0`` when ``enforce`` is given,
    ``GPUSHARE_SHARE_STATE`` when ``state`` is (tests always give one: the default path is
    shared by every process of the machine)."""
    env = {"GPUSHARE_SHARE_MIB": ",".join(f"{u}={m}" for u, m in shares_mib.items())}
    if enforce is not None:
        env["GPUSHARE_SHARE_ENFORCE"] = "1" if enforce else "0"
    if state is not None:
        env["GPUSHARE_SHARE_STATE"] = str(state)
    return env


@dataclass(frozen=True, slots=True)
class NativeTools:
    """The compiled stubs and reader: ``lib_dir`` holds ``libcuda.so.1`` and
    ``libnvidia-ml.so.1`` (the reader's ``LD_LIBRARY_PATH``)."""

    lib_dir: Path
    reader: Path


def _compiler() -> str:
    found = shutil.which(os.environ.get("CC", "cc"))
    if found is None:
        raise NativeError("no C compiler: install gcc (Debian: apt-get install gcc) or set CC")
    return found


def build_tools(out_dir: Path) -> NativeTools:
    """Compile the stubs and the reader into ``out_dir`` (``lib/`` and ``read_share``) with
    ``$CC`` or ``cc``, ``-O2 -Wall -Werror``; a warning fails with :class:`NativeError`."""
    compiler = _compiler()
    (out_dir / "lib").mkdir(parents=True, exist_ok=True)
    for source, output, flags in _SOURCES_TO_OUTPUTS:
        command = [
            compiler, "-std=gnu11", "-O2", "-Wall", "-Werror", *flags,
            "-o", str(out_dir / output), str(SOURCES / source), *_LIBRARIES[source],
        ]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise NativeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    return NativeTools(lib_dir=out_dir / "lib", reader=out_dir / "read_share")


def build_share_library(out_dir: Path) -> Path:
    """``libgpushare-share.so`` built by ``scripts/build-native.sh out_dir``: the absolute path
    the script prints last. ``$GPUSHARE_SHARE_LIBRARY`` names a prebuilt library instead (a
    node image's, or one built for another machine)."""
    override = os.environ.get("GPUSHARE_SHARE_LIBRARY")
    if override:
        if not Path(override).is_file():
            raise NativeError(f"GPUSHARE_SHARE_LIBRARY={override} is not a file")
        return Path(override)
    if not BUILD_SCRIPT.is_file():
        raise NativeError(f"{BUILD_SCRIPT} is missing: it builds libgpushare-share.so")
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), str(out_dir)], capture_output=True, text=True, check=False
    )
    lines = done.stdout.strip().splitlines()
    path = Path(lines[-1]) if lines else None
    if done.returncode != 0 or path is None or not path.is_absolute() or not path.is_file():
        raise NativeError(
            f"{BUILD_SCRIPT} {out_dir} failed (exit {done.returncode}) or printed no library "
            f"path last:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return path


@dataclass(frozen=True, slots=True)
class CudaMemory:
    """One way of reading through the CUDA driver, bytes: ``cuDeviceTotalMem_v2`` and
    ``cuMemGetInfo_v2``'s total and free (the device's context current)."""

    device_total: int
    total: int
    free: int


@dataclass(frozen=True, slots=True)
class NvmlMemory:
    """``nvmlDeviceGetMemoryInfo`` (``reserved`` None) or ``_v2``, bytes."""

    total: int
    free: int
    used: int
    reserved: int | None


@dataclass(frozen=True, slots=True)
class DeviceView:
    """One device as the reader saw it: ``cuda`` maps each of :data:`CUDA_PATHS` to its
    reading; ``nvml``/``nvml_v2`` are None when NVML has no device of that UUID."""

    index: int
    uuid: str
    name: str
    cuda: Mapping[str, CudaMemory]
    nvml: NvmlMemory | None
    nvml_v2: NvmlMemory | None


@dataclass(frozen=True, slots=True)
class AllocPlan:
    """An allocation loop: ``mib`` MiB at a time on CUDA device ``device`` with ``kind``,
    resolved as ``via`` says, until refused or ``max_count`` allocations; ``rounds`` times,
    everything freed between rounds."""

    mib: int
    kind: AllocKind = "alloc"
    via: Via = "dlsym"
    device: int = 0
    max_count: int = 1024
    rounds: int = 1

    def args(self) -> list[str]:
        """The reader's command-line options for this loop."""
        return [
            "--alloc-mib", str(self.mib), "--alloc-kind", self.kind, "--via", self.via,
            "--device", str(self.device), "--max", str(self.max_count),
            "--rounds", str(self.rounds),
        ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class AllocRound:
    """One round of an :class:`AllocPlan`: allocations that succeeded, the CUresult that
    stopped the loop (0: ``max_count`` reached), the device read with them held, and how many
    frees succeeded (None: still held by :func:`holding_reader`)."""

    count: int
    stopped_by: int
    view: DeviceView
    freed: int | None


@dataclass(frozen=True, slots=True)
class AllocResult:
    """The rounds of an :class:`AllocPlan`, in order."""

    plan: AllocPlan
    rounds: tuple[AllocRound, ...]


@dataclass(frozen=True, slots=True)
class BenchResult:
    """``calls`` calls timed on device 0, ns per call: ``cuMemGetInfo_v2``, a 1 MiB
    ``cuMemAlloc_v2`` + ``cuMemFree_v2`` pair, ``nvmlDeviceGetMemoryInfo``."""

    calls: int
    mem_get_info_ns: float
    alloc_free_ns: float
    nvml_memory_info_ns: float


@dataclass(frozen=True, slots=True)
class Reading:
    """What one reader process saw, before any allocation (``devices``, by CUDA index), its
    allocation loop and benchmark when asked, and its stderr (the library's lines)."""

    devices: tuple[DeviceView, ...]
    alloc: AllocResult | None
    bench: BenchResult | None
    stderr: str

    def device(self, uuid: str) -> DeviceView:
        """The device of ``uuid`` (KeyError if the reader saw none)."""
        for view in self.devices:
            if view.uuid == uuid:
                return view
        raise KeyError(uuid)

    def library_lines(self) -> list[str]:
        """The stderr lines that start with :data:`LIBRARY_PREFIX`."""
        return [line for line in self.stderr.splitlines() if line.startswith(LIBRARY_PREFIX)]


def _nvml(raw: Mapping[str, Any] | None) -> NvmlMemory | None:
    if raw is None:
        return None
    return NvmlMemory(raw["total"], raw["free"], raw["used"], raw.get("reserved"))


def _view(raw: Mapping[str, Any]) -> DeviceView:
    return DeviceView(
        index=raw["index"],
        uuid=raw["uuid"],
        name=raw["name"],
        cuda={p: CudaMemory(**raw[p]) for p in CUDA_PATHS},
        nvml=_nvml(raw["nvml"]),
        nvml_v2=_nvml(raw["nvml_v2"]),
    )


def parse_reading(stdout: str, stderr: str = "", plan: AllocPlan | None = None) -> Reading:
    """The :class:`Reading` of the reader's JSON line ``stdout`` (a container's log, too)."""
    raw = json.loads(stdout)
    alloc = None
    if plan is not None:
        rounds = tuple(
            AllocRound(r["count"], r["stopped_by"], _view(r["view"]), r["freed"])
            for r in raw["alloc"]["rounds"]
        )
        alloc = AllocResult(plan, rounds)
    bench = BenchResult(**raw["bench"]) if "bench" in raw else None
    return Reading(tuple(_view(d) for d in raw["devices"]), alloc, bench, stderr)


def _environment(
    tools: NativeTools, env: Mapping[str, str], library: Path | None
) -> dict[str, str]:
    full = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(tools.lib_dir)}
    full.update(env)
    if library is not None:
        full["LD_PRELOAD"] = str(library)
    return full


def _command(
    tools: NativeTools,
    alloc: AllocPlan | None,
    bench_calls: int | None,
    *,
    hold: bool,
    go: bool = False,
) -> list[str]:
    command = [str(tools.reader)]
    if alloc is not None:
        command += alloc.args()
    if bench_calls is not None:
        command += ["--bench", str(bench_calls)]
    if hold:
        command.append("--hold")
    if go:
        command.append("--go")
    return command


def read_share(
    tools: NativeTools,
    env: Mapping[str, str],
    *,
    library: Path | None,
    alloc: AllocPlan | None = None,
    bench_calls: int | None = None,
    timeout_s: float = 60,
) -> Reading:
    """Run the reader once with exactly ``env`` (plus ``PATH``, ``LD_LIBRARY_PATH`` and, when
    ``library`` is given, ``LD_PRELOAD``); its allocation loop and benchmark when asked.
    Raises :class:`NativeError` when it exits non-zero (a stub or reader call failed)."""
    done = subprocess.run(
        _command(tools, alloc, bench_calls, hold=False),
        env=_environment(tools, env, library),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise NativeError(f"read_share exited {done.returncode}:\n{done.stderr}")
    return parse_reading(done.stdout, done.stderr, alloc)


def _pipe(stream: IO[str] | None) -> IO[str]:
    if stream is None:  # Popen was asked for pipes: never
        raise NativeError("read_share started without pipes")
    return stream


def _start(
    tools: NativeTools,
    env: Mapping[str, str],
    library: Path | None,
    alloc: AllocPlan,
    stderr: IO[str],
    *,
    go: bool,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        _command(tools, alloc, None, hold=True, go=go),
        env=_environment(tools, env, library),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=stderr,
        text=True,
    )


def _held_reading(
    process: subprocess.Popen[str], stderr: IO[str], alloc: AllocPlan, timeout_s: float
) -> Reading:
    """The JSON line of a ``--hold`` reader (its allocations held), with its stderr so far."""
    line = _pipe(process.stdout).readline()
    stderr.seek(0)
    if not line:
        process.wait(timeout_s)
        raise NativeError(f"read_share exited {process.returncode}:\n{stderr.read()}")
    return parse_reading(line, stderr.read(), alloc)


def _check_exit(process: subprocess.Popen[str], stderr: IO[str], timeout_s: float) -> None:
    code = process.wait(timeout_s)
    if code != 0:
        stderr.seek(0)
        raise NativeError(f"read_share --hold exited {code}:\n{stderr.read()}")


def _stop(process: subprocess.Popen[str]) -> None:
    """Kill it if it still runs, reap it, close its pipes."""
    if process.poll() is None:
        process.kill()
        process.wait()
    for stream in (process.stdin, process.stdout):
        if stream is not None and not stream.closed:
            stream.close()


class HeldReader:
    """A reader holding its last round's allocations (from :func:`holding_reader`)."""

    def __init__(self, process: subprocess.Popen[str], reading: Reading) -> None:
        self._process = process
        self.reading = reading
        """What it printed, its allocations held."""

    def kill(self) -> None:
        """SIGKILL it while it holds its allocations (a crashed program), and reap it."""
        self._process.kill()
        self._process.wait()


@contextmanager
def holding_reader(
    tools: NativeTools,
    env: Mapping[str, str],
    *,
    library: Path | None,
    alloc: AllocPlan,
    timeout_s: float = 60,
) -> Iterator[HeldReader]:
    """A reader that keeps its last round's allocations while the block runs: yields it once it
    has printed its :class:`Reading` (allocations held); at the end of the block closes its
    stdin, which makes it free them and exit 0, unless :meth:`HeldReader.kill` killed it.
    Raises :class:`NativeError` if it fails to start, a free fails or it exits non-zero."""
    with tempfile.TemporaryFile(mode="w+") as stderr:
        process = _start(tools, env, library, alloc, stderr, go=False)
        try:
            yield HeldReader(process, _held_reading(process, stderr, alloc, timeout_s))
            if process.returncode is None:
                _pipe(process.stdin).close()
                _check_exit(process, stderr, timeout_s)
        finally:
            _stop(process)


def racing_readers(
    tools: NativeTools,
    env: Mapping[str, str],
    *,
    library: Path | None,
    alloc: AllocPlan,
    processes: int = 2,
    timeout_s: float = 60,
) -> list[Reading]:
    """``processes`` readers with the same ``env`` and ``alloc`` that start allocating at the
    same instant (each waits on stdin for the word); each keeps its allocations until all have
    printed their :class:`Reading`, then all free them and exit. Raises :class:`NativeError`
    if one fails or exits non-zero."""
    started: list[tuple[subprocess.Popen[str], IO[str]]] = []
    with ExitStack() as cleanup:
        for _ in range(processes):
            errors: IO[str] = cleanup.enter_context(tempfile.TemporaryFile(mode="w+"))
            started.append((_start(tools, env, library, alloc, errors, go=True), errors))
            cleanup.callback(_stop, started[-1][0])
        for process, _ in started:
            _pipe(process.stdin).write("go\n")
            _pipe(process.stdin).flush()
        readings = [_held_reading(p, errors, alloc, timeout_s) for p, errors in started]
        for process, _ in started:
            _pipe(process.stdin).close()
        for process, errors in started:
            _check_exit(process, errors, timeout_s)
        return readings
