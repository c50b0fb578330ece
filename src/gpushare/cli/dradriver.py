"""``gpushare dra-driver``: the Dynamic Resource Allocation driver of one node
(``gpushare.dra.driver``): the node's GPUs as a ResourceSlice with consumable memory and compute,
and the kubelet plugin that prepares claims (CDI specs). docs/dra.md.

User errors (no NVML, a bad ``--fake-gpus``, a GPU smaller than one unit, missing RBAC, a socket
that cannot be made) end with one line naming the value and the fix, exit 2 for usage and 1
otherwise, never a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import click

from gpushare.cli.cdi import cdi_options, gpu_cdi_or_exit
from gpushare.cli.gpus import inventory_or_exit
from gpushare.cli.options import (
    connect_or_exit,
    kube_options,
    log_level_option,
    run_until_signalled,
    setup_logging,
    share_library_options,
)
from gpushare.core.isolation import Enforcement
from gpushare.deviceplugin.isolation import installed_library, node_isolation
from gpushare.dra.driver import DraDriver, DriverOptions
from gpushare.dra.slices import DRIVER
from gpushare.kube.claims import ApiClaims
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.errors import Failure, KubeError


@click.command("dra-driver")
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    required=True,
    help="This node's name (env NODE_NAME; from spec.nodeName by the downward API).",
)
@click.option(
    "--fake-gpus",
    metavar="SPEC",
    help="Declare fake GPUs instead of NVML discovery, as for device-plugin ('2x16GiB:T4').",
)
@click.option(
    "--memory-unit",
    type=click.Choice([u.value for u in MemoryUnit]),
    default=MemoryUnit.GIB.value,
    show_default=True,
    help="The unit a GPU's memory is shared in (a claim's request rounds up to it).",
)
@click.option(
    "--driver-name",
    default=DRIVER,
    show_default=True,
    help="The DRA driver name (slices, DeviceClass selector, kubelet plugin).",
)
@click.option(
    "--plugin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/kubelet/plugins"),
    show_default=True,
    help="Where the plugin socket goes (<dir>/<driver>/dra.sock).",
)
@click.option(
    "--registry-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/lib/kubelet/plugins_registry"),
    show_default=True,
    help="kubelet's plugin registry (<dir>/<driver>-reg.sock).",
)
@click.option(
    "--cdi-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/run/cdi"),
    show_default=True,
    help="Where the claims' CDI specs, and with --cdi gpushare the spec of the node's GPUs, "
    "are written (the container runtime reads them).",
)
@cdi_options
@click.option(
    "--resync",
    "resync_s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    help="Seconds between inventory reads (health changes).",
)
@click.option(
    "--mps/--no-mps",
    default=False,
    show_default=True,
    help="Give containers CUDA MPS limits (memory per GPU, thread percentage): the node's GPUs "
    "must run an MPS control daemon.",
)
@click.option(
    "--unhealthy-configmap/--no-unhealthy-configmap",
    default=False,
    show_default=True,
    help="Also taint the GPUs listed in Alibaba's ConfigMap kube-system/unhealthy-gpu-<node> "
    '(data.gpus, e.g. "0,2"), as the device plugin reads it (needs get/list/watch on '
    "configmaps in kube-system).",
)
@click.option(
    "--placement",
    type=click.Choice(["best-fit", "index"]),
    default="best-fit",
    show_default=True,
    help="The order the slice lists GPUs in, which the allocator's first fit follows: least "
    "free first, from the claims of this node's pods (gpushare's best fit; the driver watches "
    "them), or by index.",
)
@share_library_options
@click.option(
    "--enforcement",
    type=click.Choice([e.value for e in Enforcement]),
    default=None,
    help='The backend that holds a share (docs/share-view.md, "Enforcement backends"); '
    "default: the strongest the node has (mps with --mps, driver, library, none).",
)
@click.option(
    "--require-enforcement",
    is_flag=True,
    help="Refuse claims for a share unless mps or driver holds it (the claim's pod then fails "
    "to start with the reason).",
)
@kube_options
@log_level_option
def dra_driver(
    *,
    node_name: str,
    fake_gpus: str | None,
    memory_unit: str,
    driver_name: str,
    plugin_dir: Path,
    registry_dir: Path,
    cdi_dir: Path,
    cdi_mode: str,
    cdi_dev_root: Path,
    cdi_library_dirs_text: str,
    cdi_binary_dirs_text: str,
    resync_s: float,
    mps: bool,
    placement: str,
    unhealthy_configmap: bool,
    share_library_dir: Path | None,
    share_library: Path | None,
    enforcement: str | None,
    require_enforcement: bool,
    kubeconfig: Path | None,
    context: str | None,
    log_level: str,
) -> None:
    """Run the DRA driver of this node: publish its GPUs as a ResourceSlice and prepare the
    claims kube-scheduler allocates on them."""  # fmt: skip
    setup_logging(log_level)
    inventory, nvml = inventory_or_exit(fake_gpus)
    gpu_cdi = gpu_cdi_or_exit(
        cdi_mode=cdi_mode, cdi_dir=cdi_dir, cdi_dev_root=cdi_dev_root,
        cdi_library_dirs_text=cdi_library_dirs_text, cdi_binary_dirs_text=cdi_binary_dirs_text,
        inventory=inventory, nvml=nvml,
    )  # fmt: skip
    isolation = node_isolation(
        mps=mps, nvml=nvml, library=installed_library(share_library, share_library_dir)
    )
    isolation.configure(
        None if enforcement is None else Enforcement(enforcement), require_enforcement
    )
    options = DriverOptions(
        node=node_name, unit=MemoryUnit(memory_unit), driver=driver_name, plugin_dir=plugin_dir,
        registry_dir=registry_dir, cdi_dir=cdi_dir, resync_s=resync_s, mps=mps,
        best_fit=placement == "best-fit", unhealthy_configmap=unhealthy_configmap,
    )  # fmt: skip
    client = connect_or_exit(kubeconfig, context)
    try:
        driver = DraDriver(
            options, inventory, client, ApiClaims(client), isolation=isolation, gpu_cdi=gpu_cdi
        )
        asyncio.run(run_until_signalled(driver.run))
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    except KubeError as error:
        hint = (
            " (the driver needs get/create/update/list/watch on resourceslices, get on"
            " resourceclaims"
            ", with --placement best-fit list/watch on pods, with --unhealthy-configmap"
            " get/list/watch on configmaps in kube-system)"
            if error.failure is Failure.FORBIDDEN
            else ""
        )
        raise click.ClickException(f"node {node_name}: {error}{hint}") from None
    except OSError as error:
        raise click.ClickException(f"cannot serve: {error}") from None
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(client.close())
