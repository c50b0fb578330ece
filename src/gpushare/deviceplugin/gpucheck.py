"""`python -m gpushare.deviceplugin.gpucheck [--watch-s N]`: check NVML discovery and XID health.

Run it on a GPU node (or in the device plugin's container) to see what the device plugin would
see: each GPU (index, UUID, minor number, model, memory in MiB) and its supported NVML event
types, then `--watch-s` seconds (default 5) of XID health watching with every transition printed.

Exit status: 0 after the watch; 2 when NVML is unavailable (one line on stderr saying why and
what to do, no traceback); 1 when an NVML query fails after initialisation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence

from gpushare.deviceplugin.health import HealthWatcher
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.deviceplugin.nvml import (
    Nvml,
    NvmlError,
    NvmlInventory,
    NvmlUnavailableError,
    PynvmlBackend,
    event_type_names,
)

__all__ = ["main"]

EXIT_OK = 0
EXIT_NVML_ERROR = 1
EXIT_NVML_UNAVAILABLE = 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gpushare.deviceplugin.gpucheck",
        description="List the GPUs NVML reports and watch their XID health for a while.",
    )
    parser.add_argument(
        "--watch-s",
        type=float,
        default=5.0,
        metavar="N",
        help="seconds to watch XID health events (default 5; 0 skips the watch)",
    )
    return parser


def _print_gpus(nvml: Nvml, gpus: Sequence[PhysicalGpu]) -> None:
    print(f"{len(gpus)} GPU(s) found by NVML")
    for gpu in gpus:
        try:
            mask = nvml.device_supported_event_types(nvml.device_handle_by_index(gpu.index))
            events = ", ".join(event_type_names(mask)) or "none"
        except NvmlError as error:
            events = f"unknown ({error})"
        print(
            f"GPU {gpu.index}: uuid={gpu.uuid} minor={gpu.minor} model={gpu.model!r} "
            f"memory_mib={gpu.memory_mib} events=[{events}]"
        )


async def _watch(nvml: Nvml, gpus: Sequence[PhysicalGpu], watch_s: float) -> None:
    async def on_change(index: int, healthy: bool) -> None:
        print(f"GPU {index} is now {'healthy' if healthy else 'UNHEALTHY'}", flush=True)

    # A wait no longer than the watch: the last NVML wait ends soon after the watch does.
    watcher = HealthWatcher(nvml, gpus, on_change, wait_timeout_s=min(1.0, watch_s))
    print(f"watching XID health for {watch_s:g} s ...", flush=True)
    with contextlib.suppress(TimeoutError):  # the watch ends by timing out
        await asyncio.wait_for(watcher.run(), timeout=watch_s)
    unhealthy = [g.index for g in gpus if not watcher.healthy(g.index)]
    print(f"done; unhealthy GPU(s): {unhealthy or 'none'}; watched: {watcher.watched}")


def main(argv: Sequence[str] | None = None, nvml: Nvml | None = None) -> int:
    """Run the check on `nvml` (default: the real `PynvmlBackend`); returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        inventory = NvmlInventory(PynvmlBackend() if nvml is None else nvml)
    except NvmlUnavailableError as error:
        print(f"gpucheck: {error}", file=sys.stderr)
        return EXIT_NVML_UNAVAILABLE
    except NvmlError as error:
        print(f"gpucheck: NVML query failed: {error}", file=sys.stderr)
        return EXIT_NVML_ERROR
    try:
        gpus = inventory.gpus()
        _print_gpus(inventory.nvml, gpus)
        if args.watch_s > 0 and gpus:
            # asyncio.run returns after the NVML wait thread has ended; only then shut NVML down.
            asyncio.run(_watch(inventory.nvml, gpus, args.watch_s))
    except NvmlError as error:
        print(f"gpucheck: NVML query failed: {error}", file=sys.stderr)
        return EXIT_NVML_ERROR
    finally:
        inventory.close()
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
