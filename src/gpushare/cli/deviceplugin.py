"""``gpushare device-plugin``: the kubelet device plugin of one node (``gpushare.deviceplugin``).

User errors (no NVML, a bad ``--fake-gpus``, a device list over kubelet's limit, no such node,
missing RBAC, no kubelet directory) end with one line naming the value and the fix, exit 2 for
usage and 1 otherwise, never a traceback.
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
from gpushare.deviceplugin.daemon import DaemonOptions, DevicePluginDaemon
from gpushare.deviceplugin.dialects import (
    DEFAULT_SPLIT_COUNT,
    DialectsError,
    parse_dialects,
    resources_for,
)
from gpushare.deviceplugin.inventory import (
    DeviceListTooLargeError,
    check_message_size,
)
from gpushare.deviceplugin.lifecycle import DEFAULT_SOCKET_NAME
from gpushare.deviceplugin.metrics import DEFAULT_METRICS_PORT
from gpushare.deviceplugin.mps import DEFAULT_MPS_CONTROL, DEFAULT_MPS_ROOT
from gpushare.deviceplugin.registration import DEVICE_PLUGIN_DIR
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.nodeconfig import NODE_CONFIG_NAME
from gpushare.kube.errors import KubeError


@click.command("device-plugin")
@click.option(
    "--node-name",
    envvar="NODE_NAME",
    required=True,
    help="This node's name (env NODE_NAME; set it from spec.nodeName with the downward API).",
)
@click.option(
    "--fake-gpus",
    metavar="SPEC",
    help="Declare fake GPUs instead of NVML discovery, e.g. '2x16GiB:T4' or "
    "'1x80GiB:H100,2x24GiB:L4' (for nodes without GPUs: tests, demos).",
)
@click.option(
    "--memory-unit",
    type=click.Choice([u.value for u in MemoryUnit]),
    default=MemoryUnit.GIB.value,
    show_default=True,
    help="Unit of aliyun.com/gpu-mem: one advertised device per unit per GPU (the node "
    "config's memoryUnit wins).",
)
@click.option(
    "--device-plugin-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEVICE_PLUGIN_DIR,
    show_default=True,
    help="kubelet's device-plugin directory (kubelet.sock lives there).",
)
@click.option("--socket-name", default=DEFAULT_SOCKET_NAME, show_default=True)
@click.option(
    "--health/--no-health",
    default=True,
    show_default=True,
    help="Watch NVML critical XID events and mark failing GPUs unhealthy.",
)
@click.option(
    "--health-recovery",
    "recovery_s",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="Seconds without a critical XID before an unhealthy GPU is healthy again.",
)
@click.option(
    "--ignore-xid",
    "ignored_xids",
    type=click.IntRange(min=0),
    multiple=True,
    help="An XID that never marks a GPU unhealthy (repeatable; application XIDs always are).",
)
@click.option(
    "--unhealthy-configmap/--no-unhealthy-configmap",
    default=True,
    show_default=True,
    help="Also treat as unhealthy the GPUs listed in Alibaba's ConfigMap "
    'kube-system/unhealthy-gpu-<node> (data.gpus, e.g. "0,2").',
)
@click.option(
    "--node-config/--no-node-config",
    default=True,
    show_default=True,
    help="Read this node's entry in the node-config ConfigMap (memoryUnit, reservedMemory, "
    "excludeGpus, serves; docs/node-config.md) and follow its changes; its keys win over "
    "--memory-unit.",
)
@click.option(
    "--node-config-namespace",
    envvar="POD_NAMESPACE",
    default="kube-system",
    show_default=True,
    help="Namespace of the node-config ConfigMap (env POD_NAMESPACE: the release namespace).",
)
@click.option(
    "--node-config-name",
    default=NODE_CONFIG_NAME,
    show_default=True,
    help="Name of the node-config ConfigMap.",
)
@click.option(
    "--mps",
    is_flag=True,
    help="Also give containers CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and "
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE for their share (needs an MPS daemon on the node).",
)
@click.option(
    "--mps-managed",
    is_flag=True,
    help="Run and supervise the CUDA MPS control daemon for this node's GPUs (compute mode "
    "EXCLUSIVE_PROCESS, restored on exit; GPUs unhealthy while it is down) and give containers "
    "its directories and their limits (implies --mps; needs NVML).",
)
@click.option(
    "--mps-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_MPS_ROOT,
    show_default=True,
    help="Host directory of the managed MPS daemon's pipe/, log/ and shm/ (mounted at the same "
    "path in the plugin's pod).",
)
@click.option(
    "--mps-control",
    default=DEFAULT_MPS_CONTROL,
    show_default=True,
    help="The nvidia-cuda-mps-control binary (a path, or a name on $PATH).",
)
@click.option(
    "--dialects",
    "dialects_text",
    envvar="GPUSHARE_DIALECTS",
    default="",
    metavar="LIST",
    help="Also serve these request dialects' resources, each on its own socket: 'tencent' "
    "(tencent.com/vcuda-core, 100 per GPU; tencent.com/vcuda-memory, one per 256 MiB), "
    "'hami' (nvidia.com/gpu, --split-count per GPU; not beside NVIDIA's device plugin). "
    "Comma-separated; none by default.",
)
@click.option(
    "--split-count",
    type=int,
    default=DEFAULT_SPLIT_COUNT,
    show_default=True,
    help="nvidia.com/gpu devices advertised per GPU with --dialects hami (HAMi's "
    "deviceSplitCount): kubelet admits at most GPUs x this many nvidia.com/gpu on the node.",
)
@share_library_options
@click.option(
    "--cdi-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/var/run/cdi"),
    show_default=True,
    help="Where gpushare's CDI spec of the node's GPUs is written with --cdi gpushare (a "
    "directory the container runtime reads: cdi_spec_dirs).",
)
@cdi_options
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_METRICS_PORT,
    show_default=True,
    help="Port of /metrics (Prometheus); 0 turns it off.",
)
@click.option(
    "--proc-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/proc"),
    show_default=True,
    help="The host's /proc (GPU processes are mapped to pods through their cgroups; run "
    "with hostPID or mount the host's /proc).",
)
@kube_options
@log_level_option
def device_plugin(
    *,
    node_name: str,
    fake_gpus: str | None,
    memory_unit: str,
    device_plugin_dir: Path,
    socket_name: str,
    health: bool,
    recovery_s: float,
    ignored_xids: tuple[int, ...],
    unhealthy_configmap: bool,
    node_config: bool,
    node_config_namespace: str,
    node_config_name: str,
    mps: bool,
    mps_managed: bool,
    mps_root: Path,
    mps_control: str,
    dialects_text: str,
    split_count: int,
    share_library_dir: Path | None,
    share_library: Path | None,
    cdi_dir: Path,
    cdi_mode: str,
    cdi_dev_root: Path,
    cdi_library_dirs_text: str,
    cdi_binary_dirs_text: str,
    metrics_port: int,
    proc_root: Path,
    kubeconfig: Path | None,
    context: str | None,
    log_level: str,
) -> None:
    """Run the kubelet device plugin for aliyun.com/gpu-mem (and the --dialects' resources)
    on this node."""
    setup_logging(log_level)
    try:
        dialects = parse_dialects(dialects_text)
        served = resources_for(dialects, split_count)
    except DialectsError as error:
        raise click.BadParameter(str(error), param_hint="--dialects/--split-count") from None
    if not device_plugin_dir.is_dir():
        raise click.BadParameter(
            f"{device_plugin_dir} is not a directory (mount the host's "
            "/var/lib/kubelet/device-plugins into the plugin's pod)",
            param_hint="--device-plugin-dir",
        )
    if mps_managed and fake_gpus is not None:
        raise click.UsageError(
            "--mps-managed needs real GPUs (NVML sets their compute mode); it cannot be used "
            "with --fake-gpus"
        )
    inventory, nvml = inventory_or_exit(fake_gpus)
    try:
        check_message_size(inventory.gpus(), MemoryUnit(memory_unit))
        for resource in served:
            check_message_size(
                inventory.gpus(),
                MemoryUnit(memory_unit),
                per_gpu=resource.per_gpu,
                resource=resource.resource,
            )
    except DeviceListTooLargeError as error:
        raise click.ClickException(str(error)) from None
    cdi = gpu_cdi_or_exit(
        cdi_mode=cdi_mode, cdi_dir=cdi_dir, cdi_dev_root=cdi_dev_root,
        cdi_library_dirs_text=cdi_library_dirs_text, cdi_binary_dirs_text=cdi_binary_dirs_text,
        inventory=inventory, nvml=nvml,
    )  # fmt: skip
    options = DaemonOptions(
        node_name=node_name,
        unit=MemoryUnit(memory_unit),
        socket_dir=device_plugin_dir,
        socket_name=socket_name,
        health=health,
        recovery_s=recovery_s,
        ignored_xids=ignored_xids,
        unhealthy_configmap=unhealthy_configmap,
        node_config=node_config,
        node_config_namespace=node_config_namespace,
        node_config_name=node_config_name,
        mps=mps,
        mps_managed=mps_managed,
        mps_root=mps_root,
        mps_control=mps_control,
        metrics_port=metrics_port or None,
        proc_root=proc_root,
        dialects=dialects,
        split_count=split_count,
        share_library=share_library,
        share_library_dir=share_library_dir,
    )
    client = connect_or_exit(kubeconfig, context)
    try:
        daemon = DevicePluginDaemon(client, inventory, options, nvml=nvml, cdi=cdi)
        asyncio.run(run_until_signalled(daemon.run))
    except DeviceListTooLargeError as error:
        raise click.ClickException(str(error)) from None
    except KubeError as error:
        raise click.ClickException(f"node {node_name}: {error}") from None
    except OSError as error:
        raise click.ClickException(f"cannot serve: {error}") from None
    except TimeoutError:
        raise click.ClickException(
            f"could not list the pods of node {node_name} within {options.sync_timeout_s:g} s "
            "(is the API server reachable?)"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            asyncio.run(client.close())
        close = getattr(inventory, "close", None)
        if callable(close):
            close()
