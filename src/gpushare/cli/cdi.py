"""The ``--cdi`` flags of the node commands (``device-plugin``, ``dra-driver``): how GPU
containers get their GPU and driver (``gpushare.deviceplugin.cdi``), decided and written at
start (``gpushare.deviceplugin.cdifiles``), with one line naming the fix when it cannot be."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

from gpushare.deviceplugin.cdi import CdiError, CdiMode, GpuCdi
from gpushare.deviceplugin.cdifiles import (
    DEFAULT_BINARY_DIRS,
    DEFAULT_LIBRARY_DIRS,
    DEFAULT_TOOLKIT_DIRS,
    CdiPaths,
    node_gpu_cdi,
)
from gpushare.deviceplugin.inventory import Inventory
from gpushare.deviceplugin.nvml import Nvml, NvmlError

__all__ = ["cdi_options", "gpu_cdi_or_exit"]

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., object])


def _dirs(text: str, flag: str) -> tuple[Path, ...]:
    dirs = tuple(Path(part.strip()) for part in text.split(",") if part.strip())
    relative = [str(d) for d in dirs if not d.is_absolute()]
    if relative:
        raise click.BadParameter(
            f"{', '.join(relative)}: not an absolute path (a comma-separated list of absolute "
            "directories)",
            param_hint=flag,
        )
    return dirs


def cdi_options(function: F) -> F:
    """``--cdi``, ``--cdi-dev-root``, ``--cdi-library-dirs``, ``--cdi-binary-dirs`` (the
    command's ``--cdi-dir`` says where the spec goes)."""
    options = [
        click.option(
            "--cdi",
            "cdi_mode",
            type=click.Choice([m.value for m in CdiMode]),
            default=CdiMode.AUTO.value,
            show_default=True,
            help="How GPU containers get their GPU and driver: as CDI devices of the NVIDIA "
            "container toolkit's spec (toolkit), of a spec gpushare writes into --cdi-dir "
            "from the node's device nodes and driver files (gpushare), or only "
            "NVIDIA_VISIBLE_DEVICES for a default NVIDIA runtime (off); auto: toolkit when "
            "its spec exists, else gpushare when the node has /dev/nvidiactl, else off.",
        ),
        click.option(
            "--cdi-dev-root",
            type=click.Path(file_okay=False, path_type=Path),
            default=Path("/dev"),
            show_default=True,
            help="Where the node's NVIDIA device nodes are (the host's /dev).",
        ),
        click.option(
            "--cdi-library-dirs",
            "cdi_library_dirs_text",
            default=",".join(map(str, DEFAULT_LIBRARY_DIRS)),
            show_default=True,
            metavar="DIRS",
            help="Where the driver's libraries are looked for (libcuda.so.<driver version>), "
            "comma-separated, first found wins.",
        ),
        click.option(
            "--cdi-binary-dirs",
            "cdi_binary_dirs_text",
            default=",".join(map(str, DEFAULT_BINARY_DIRS)),
            show_default=True,
            metavar="DIRS",
            help="Where nvidia-smi and the MPS binaries are looked for, comma-separated.",
        ),
    ]
    for option in reversed(options):
        function = option(function)
    return function


def gpu_cdi_or_exit(
    *,
    cdi_mode: str,
    cdi_dir: Path,
    cdi_dev_root: Path,
    cdi_library_dirs_text: str,
    cdi_binary_dirs_text: str,
    inventory: Inventory,
    nvml: Nvml | None,
) -> GpuCdi | None:
    """The CDI devices of the node's GPUs (``None``: none), gpushare's spec written into
    ``cdi_dir`` when it is the choice; ``ClickException`` naming the fix when the mode asked
    cannot be had or the spec cannot be written. The toolkit's spec is looked for in
    ``/etc/cdi``, ``/var/run/cdi`` and ``cdi_dir``."""
    toolkit_dirs = tuple(dict.fromkeys((*DEFAULT_TOOLKIT_DIRS, cdi_dir)))
    paths = CdiPaths(
        dev_root=cdi_dev_root,
        library_dirs=_dirs(cdi_library_dirs_text, "--cdi-library-dirs"),
        binary_dirs=_dirs(cdi_binary_dirs_text, "--cdi-binary-dirs"),
        toolkit_dirs=toolkit_dirs,
        spec_dir=cdi_dir,
    )
    version = None
    if nvml is not None:
        try:
            version = nvml.driver_version()
        except NvmlError as error:
            log.warning("NVML gives no driver version (%s): taken from libcuda.so.*", error)
    gpus = [(g.index, g.minor, g.uuid) for g in inventory.gpus()]
    try:
        return node_gpu_cdi(CdiMode(cdi_mode), gpus, paths, driver_version=version).cdi
    except CdiError as error:
        raise click.ClickException(str(error)) from None
    except OSError as error:
        raise click.ClickException(
            f"cannot write the CDI spec into {cdi_dir} (--cdi-dir): {error}"
        ) from None
