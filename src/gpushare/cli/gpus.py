"""The node's GPUs for the node commands (``device-plugin``, ``dra-driver``): ``--fake-gpus`` or
NVML, with one line naming the fix when neither can be had."""

from __future__ import annotations

import click

from gpushare.deviceplugin.inventory import FakeGpuSpecError, FakeInventory, Inventory
from gpushare.deviceplugin.nvml import Nvml, NvmlInventory, NvmlUnavailableError, PynvmlBackend

__all__ = ["inventory_or_exit"]


def inventory_or_exit(fake_gpus: str | None) -> tuple[Inventory, Nvml | None]:
    """The declared fake GPUs (``--fake-gpus``), or NVML's GPUs and NVML itself
    (``BadParameter``/``ClickException`` with the fix when neither)."""
    try:
        if fake_gpus is not None:
            return FakeInventory(fake_gpus), None
        inventory = NvmlInventory(PynvmlBackend())
    except FakeGpuSpecError as error:
        raise click.BadParameter(str(error), param_hint="--fake-gpus") from None
    except NvmlUnavailableError as error:
        raise click.ClickException(str(error)) from None
    return inventory, inventory.nvml
