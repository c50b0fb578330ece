"""``gpushare dra-templates``: the ResourceClaimTemplates that pods rewritten from
``aliyun.com/gpu-mem`` claim from, made in a namespace (``gpushare.dra.templates``;
docs/dra.md, "Existing pods unchanged"). Existing templates are left as they are."""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from gpushare.cli.options import connect_or_exit, kube_options
from gpushare.dra.templates import DEVICE_CLASS, claim_templates, template_name
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
    device_class: str,
    kubeconfig: Path | None,
    context: str | None,
) -> None:
    """Make the ResourceClaimTemplates gpushare-gpu-mem-1..LARGEST in NAMESPACE."""
    templates = claim_templates(
        namespace, largest, unit=MemoryUnit(memory_unit), device_class=device_class
    )
    client = connect_or_exit(kubeconfig, context)
    try:
        created, existing = asyncio.run(_ensure(client, templates))
    except KubeError as error:
        raise click.ClickException(f"namespace {namespace}: {error}") from None
    click.echo(
        f"{namespace}: {created} template(s) created, {existing} already there "
        f"({template_name(1)} .. {template_name(largest)})"
    )
