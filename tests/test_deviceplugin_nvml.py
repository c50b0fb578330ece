"""NVML discovery (`NvmlInventory`) over `FakeNvml`, NVML-unavailable errors, and `gpucheck`."""

from __future__ import annotations

import importlib
import subprocess
import sys
from types import SimpleNamespace

import pytest

from gpushare.deviceplugin import gpucheck
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import (
    ERROR_GPU_IS_LOST,
    ERROR_LIBRARY_NOT_FOUND,
    ERROR_UNINITIALIZED,
    EventSet,
    NvmlError,
    NvmlEvent,
    NvmlInventory,
    NvmlUnavailableError,
    PynvmlBackend,
    event_type_names,
)
from gpushare.testing.nvml import FakeDevice, FakeNvml

GIB = 2**30
T4 = FakeDevice("GPU-7a1c0000-0000-4000-8000-000000000001", 1, "Tesla T4", 15_843_721_216)
A100 = FakeDevice("GPU-a1000000-0000-4000-8000-000000000002", 0, "NVIDIA A100-SXM4-80GB", 80 * GIB)
UNAVAILABLE_HINT = "NVML could not be loaded/initialised"


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(
            [T4, A100],
            [
                PhysicalGpu(0, T4.uuid, 1, "Tesla T4", 15_109),
                PhysicalGpu(1, A100.uuid, 0, "NVIDIA A100-SXM4-80GB", 81_920),
            ],
            id="two heterogeneous GPUs: fields, NVML index order, MiB rounded down",
        ),
        pytest.param(
            [FakeDevice("GPU-1", 3, "L4", 2**20 - 1), FakeDevice("GPU-2", 2, "L4", 2**20)],
            [PhysicalGpu(0, "GPU-1", 3, "L4", 0), PhysicalGpu(1, "GPU-2", 2, "L4", 1)],
            id="one byte short of a MiB rounds down to the MiB below",
        ),
        pytest.param([], [], id="no GPUs is an empty inventory"),
    ],
)
def test_discovery(devices: list[FakeDevice], expected: list[PhysicalGpu]) -> None:
    inventory = NvmlInventory(FakeNvml(devices))
    assert inventory.fake is False
    assert inventory.gpus() == expected
    assert all(gpu.healthy for gpu in inventory.gpus())


def test_close_shuts_nvml_down() -> None:
    fake = FakeNvml([T4])
    NvmlInventory(fake).close()
    with pytest.raises(NvmlError) as raised:
        fake.device_count()
    assert raised.value.code == ERROR_UNINITIALIZED


@pytest.mark.parametrize(
    ("code", "text"),
    [
        pytest.param(ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found", id="no library"),
        pytest.param(9, "Driver Not Loaded", id="driver not loaded"),
    ],
)
def test_init_failure_is_a_one_line_user_error(code: int, text: str) -> None:
    with pytest.raises(NvmlUnavailableError) as raised:
        NvmlInventory(FakeNvml([T4], init_error=NvmlError(code, text)))
    message = str(raised.value)
    assert message.startswith(f"{UNAVAILABLE_HINT}: {text}; ")
    assert "NVIDIA driver" in message
    assert "mount the driver libraries" in message
    assert "--fake-gpus" in message
    assert "\n" not in message
    assert raised.value.code == code
    assert isinstance(raised.value.__cause__, NvmlError)


def test_a_gpu_that_cannot_be_queried_names_it_and_shuts_nvml_down() -> None:
    fake = FakeNvml([A100, T4])
    fake.set_probe_ok(1, False)
    with pytest.raises(NvmlError, match="cannot query GPU 1: GPU is lost") as raised:
        NvmlInventory(fake)
    assert raised.value.code == ERROR_GPU_IS_LOST
    assert fake.calls[-1] == "shutdown"


def _nvml_available() -> bool:
    backend = PynvmlBackend()
    try:
        backend.init()
    except NvmlError:
        return False
    backend.shutdown()
    return True


def test_pynvml_backend_translates_errors() -> None:
    """Here (no GPU) pynvml's NVMLError becomes NvmlUnavailableError; on a GPU node, GPUs."""
    if not _nvml_available():
        with pytest.raises(NvmlUnavailableError, match=UNAVAILABLE_HINT) as raised:
            NvmlInventory(PynvmlBackend())
        assert isinstance(raised.value.__cause__, NvmlError)
        return
    inventory = NvmlInventory(PynvmlBackend())
    try:
        assert inventory.fake is False
        assert [g.index for g in inventory.gpus()] == list(range(len(inventory.gpus())))
    finally:
        inventory.close()


def test_pynvml_backend_translates_events_and_errors() -> None:
    """The backend over a stand-in pynvml module with pynvml's own error and event types."""
    pynvml = importlib.import_module("pynvml")  # untyped (no stubs): its attributes are Any

    results: list[object] = [
        pynvml.c_nvmlEventData_t(eventType=0x8, eventData=79),  # NULL device: all devices
        pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT),
        pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST),
    ]

    def wait(event_set: object, timeout_ms: int) -> object:
        result = results.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    module = SimpleNamespace(NVMLError=pynvml.NVMLError, nvmlEventSetWait=wait)
    backend = PynvmlBackend(module)
    assert backend.event_set_wait(EventSet(object()), 10) == NvmlEvent(None, 0x8, 79)
    assert backend.event_set_wait(EventSet(object()), 10) is None
    with pytest.raises(NvmlError) as raised:
        backend.event_set_wait(EventSet(object()), 10)
    assert raised.value.code == ERROR_GPU_IS_LOST


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        pytest.param(0, [], id="none"),
        pytest.param(0x1F, ["SingleBitEccError", "DoubleBitEccError", "PState",
                            "XidCriticalError", "Clock"], id="data-centre GPU"),
        pytest.param(0x8 | 1 << 40, ["XidCriticalError", "0x10000000000"], id="unknown bit"),
    ],
)  # fmt: skip
def test_event_type_names(mask: int, names: list[str]) -> None:
    assert event_type_names(mask) == names


def test_gpucheck_command() -> None:
    """Without NVML (this machine): exit 2 and one line on stderr; with NVML: exit 0 and a list."""
    done = subprocess.run(
        [sys.executable, "-m", "gpushare.deviceplugin.gpucheck", "--watch-s", "0.2"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if _nvml_available():
        assert done.returncode == 0, done.stderr
        assert "GPU(s) found by NVML" in done.stdout
        return
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1
    assert done.stderr.startswith(f"gpucheck: {UNAVAILABLE_HINT}: ")
    assert "--fake-gpus" in done.stderr
    assert "Traceback" not in done.stderr


def test_gpucheck_on_fake_nvml_lists_gpus_and_watches(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml([T4, A100])
    fake.fail_next_wait(NvmlError(999, "Unknown Error"))  # a failed wait: all GPUs unhealthy
    assert gpucheck.main(["--watch-s", "0.1"], nvml=fake) == 0
    out = capsys.readouterr().out
    assert (
        f"GPU 0: uuid={T4.uuid} minor=1 model='Tesla T4' memory_mib=15109 events=[SingleBitEcc"
        in out
    )
    assert f"GPU 1: uuid={A100.uuid} minor=0 model='NVIDIA A100-SXM4-80GB' memory_mib=81920" in out
    assert "GPU 0 is now UNHEALTHY\nGPU 1 is now UNHEALTHY\n" in out
    assert "done; unhealthy GPU(s): [0, 1]; watched: [0, 1]" in out
    assert fake.live_event_sets == 0
    assert fake.calls[-1] == "shutdown"


def test_gpucheck_on_unavailable_fake_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml(
        [], init_error=NvmlError(ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
    )
    assert gpucheck.main(["--watch-s", "0"], nvml=fake) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith(f"gpucheck: {UNAVAILABLE_HINT}: NVML Shared Library Not Found;")
