"""Fixtures of the real-GPU checks. They are not part of ``make test`` (``bench/`` is
outside pytest's ``testpaths``; CI has no GPU) and run with:

    .venv/bin/pytest bench/gpu -v -s

Without an NVIDIA GPU every check is SKIPPED with the reason (never passed silently); the
MPS check also needs ``nvidia-cuda-mps-control`` on ``$PATH`` and root (compute mode).
"""

from __future__ import annotations

import ctypes
import os
import shutil
from collections.abc import Iterator

import pytest

from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import NvmlInventory, NvmlUnavailableError, PynvmlBackend


@pytest.fixture(scope="session")
def nvml_inventory() -> Iterator[NvmlInventory]:
    """NVML initialised over the real driver; skips (with why) where there is none."""
    try:
        inventory = NvmlInventory(PynvmlBackend())
    except NvmlUnavailableError as error:
        pytest.skip(f"no NVIDIA GPU here (GPU checks need one): {error.detail}")
    try:
        if not inventory.gpus():
            pytest.skip("NVML works but reports no GPU")
        yield inventory
    finally:
        inventory.close()


@pytest.fixture(scope="session")
def gpu(nvml_inventory: NvmlInventory) -> PhysicalGpu:
    """The first GPU (the checks run on one)."""
    return nvml_inventory.gpus()[0]


@pytest.fixture(scope="session")
def libcuda(nvml_inventory: NvmlInventory) -> None:
    """The CUDA driver library is loadable (the clients use it through ctypes)."""
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError as error:
        pytest.skip(f"libcuda.so.1 cannot be loaded: {error}")


@pytest.fixture(scope="session")
def mps_control_binary(nvml_inventory: NvmlInventory) -> str:
    """The real ``nvidia-cuda-mps-control``; skips without it or without root."""
    found = shutil.which("nvidia-cuda-mps-control")
    if found is None:
        pytest.skip("nvidia-cuda-mps-control is not on $PATH (install the driver's MPS tools)")
    if os.geteuid() != 0:
        pytest.skip("the MPS check sets the GPU's compute mode: run it as root")
    return found
