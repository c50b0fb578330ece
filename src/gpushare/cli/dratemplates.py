"""``gpushare dra-templates``: the ResourceClaimTemplates that pods rewritten at admission
claim from, made in a namespace (``gpushare.dra.templates``; docs/dra.md, "Existing pods
unchanged"): Alibaba's sizes always, gpu-manager's and HAMi's shares and whole GPUs with
``--cores`` or ``--gpus``. Existing templates are left as they are."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from gpushare.cli.options import connect_or_exit, kube_options
from gpushare.dra.templates import (
    DEVICE_CLASS,
    MOST_GPUS,
    claim_templates,
    share_templates,
    template_name,
)
from gpushare.kube.claimtemplates import ensure_templates
from gpushare.kube.client import AsyncClient
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.errors import KubeError


async def _ensure(client: AsyncClient, templates: list[dict[str, object]]) -> tuple[int, int]:
    try:
        return await ensure_templates(client, templates)
    finally:
        await client.close()


@click.command("dra-templates")
@click.option("--namespace", "-n", required=True, help="The namespace of the pods to serve.")
@click.option(
    "--largest",
    type=click.IntRange(1, 4096),
    required=True,
    help="The largest aliyun.com/gpu-mem a pod there asks (templates 1..this).",
)
@click.option(
    "--memory-unit",
    type=click.Choice([u.value for u in MemoryUnit]),
    default=MemoryUnit.GIB.value,
    show_default=True,
    help="The unit of aliyun.com/gpu-mem on the DRA nodes.",
)
@click.option(
    "--cores",
    "cores_text",
    default=None,
    metavar="LIST",
    help="The compute shares (percent, 0-99, comma-separated) gpu-manager's vcuda-core and "
    "HAMi's nvidia.com/gpucores ask there: a template per share, size (1..--largest GiB) and "
    "GPU count; whole-GPU templates too.",
)
@click.option(
    "--gpus",
    type=click.IntRange(1, MOST_GPUS),
    default=None,
    help="The most GPUs one container asks there (nvidia.com/gpu, vcuda-core 100 a GPU): "
    "whole-GPU templates 1..this, shares on 1..this GPUs.  [default with --cores: 1]",
)
@click.option(
    "--device-class",
    default=DEVICE_CLASS,
    show_default=True,
    help="The DeviceClass of gpushare's GPUs (the chart's draDriver.deviceClassName).",
)
@kube_options
def dra_templates(
    *,
    namespace: str,
    largest: int,
    memory_unit: str,
    cores_text: str | None,
    gpus: int | None,
    device_class: str,
    kubeconfig: Path | None,
    context: str | None,
) -> None:
    """Make the ResourceClaimTemplates gpushare-gpu-mem-1..LARGEST in NAMESPACE, and with
    --cores or --gpus those of gpu-manager's and HAMi's pods."""
    unit = MemoryUnit(memory_unit)
    templates = claim_templates(namespace, largest, unit=unit, device_class=device_class)
    if cores_text is not None or gpus is not None:
        cores = _cores(cores_text or "")
        largest_gib = largest if unit is MemoryUnit.GIB else -(-largest // 1024)
        try:
            templates += share_templates(
                namespace, largest_gib, cores, gpus=gpus or 1, device_class=device_class
            )
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="--cores/--gpus") from None
    client = connect_or_exit(kubeconfig, context)
    try:
        created, existing = asyncio.run(_ensure(client, templates))
    except KubeError as error:
        raise click.ClickException(f"namespace {namespace}: {error}") from None
    click.echo(
        f"{namespace}: {created} template(s) created, {existing} already there "
        f"({template_name(1)} .. {template_name(largest)}"
        + (f" and {len(templates) - largest} for gpu-manager and HAMi)" if cores_text or gpus
           else ")")
    )  # fmt: skip


def _cores(text: str) -> list[int]:
    """``--cores``' comma-separated whole percents; ``click.BadParameter`` naming the value."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r}: accepted whole percents 0-99, comma-separated (0,25,50)",
            param_hint="--cores",
        ) from None
