"""The ResourceClaimTemplates that pods rewritten at admission claim from (docs/dra.md,
"Existing pods unchanged"). Pure; no I/O. ResourceClaimTemplates are namespaced and CEL cannot
make objects, so the admission policies name them and ``gpushare dra-templates`` makes them.

* ``gpushare-gpu-mem-<N>`` (``deploy/dra/gpu-mem-to-claims.yaml``, Alibaba's
  ``aliyun.com/gpu-mem: N``): N units (the node's unit) of one GPU's memory.
* ``gpushare-gpu-<G>gi-<P>pct`` and ``gpushare-<K>gpus-<G>gi-<P>pct``
  (``deploy/dra/vcuda-hami-to-claims.yaml``, gpu-manager's and HAMi's shares): on each of K
  distinct GPUs (1 when left out), G GiB of memory and P % of compute.
* ``gpushare-gpu-whole`` and ``gpushare-<K>gpus-whole``: K whole GPUs, each all its memory (a
  claim that asks no memory takes the whole GPU's: the slice's memory ``default``,
  ``gpushare.dra.slices``) and all its compute.

The names are the policies' CEL written again (``share_template_name``,
``whole_template_name``); tests/cluster/test_dra_translation.py holds the two together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpushare.dra.slices import CORES, CORES_PERCENT, DRIVER, MEMORY
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dra import DEVICE_CLASS

__all__ = [
    "DEVICE_CLASS",
    "MOST_TEMPLATES",
    "TEMPLATE_PREFIX",
    "claim_templates",
    "share_template_name",
    "share_templates",
    "template_name",
    "whole_template_name",
]

TEMPLATE_PREFIX = "gpushare-gpu-mem-"
"""The templates' name before the size, as the admission policy writes it."""


MOST_TEMPLATES = 20_000
"""The most share templates one ``share_templates`` call makes (sizes × compute shares ×
GPU counts)."""
MOST_GPUS = 16
"""The most GPUs one container's template asks (``share_templates``' ``gpus``)."""


def template_name(units: int) -> str:
    """``gpushare-gpu-mem-<units>``."""
    return f"{TEMPLATE_PREFIX}{units}"


def claim_templates(
    namespace: str,
    largest: int,
    *,
    unit: MemoryUnit = MemoryUnit.GIB,
    device_class: str = DEVICE_CLASS,
) -> list[dict[str, Any]]:
    """The templates of ``namespace`` for every size 1..``largest`` units of ``unit``: each one
    request ``gpu`` of ``device_class`` asking that much ``memory`` of one GPU. ``ValueError``
    for ``largest`` outside 1..4096."""
    if not 1 <= largest <= 4096:
        raise ValueError(f"largest size {largest}: accepted 1 to 4096 units of {unit}")
    suffix = "Gi" if unit is MemoryUnit.GIB else "Mi"
    return [
        _template(
            namespace,
            template_name(units),
            {
                "deviceClassName": device_class,
                "capacity": {"requests": {MEMORY: f"{units}{suffix}"}},
            },
            1,
        )
        for units in range(1, largest + 1)
    ]


def _gpus_prefix(gpus: int) -> str:
    return "gpushare-gpu-" if gpus == 1 else f"gpushare-{gpus}gpus-"


def share_template_name(gpus: int, memory_gib: int, cores_percent: int) -> str:
    """``gpushare-gpu-<G>gi-<P>pct`` for one GPU, ``gpushare-<K>gpus-<G>gi-<P>pct`` for K."""
    return f"{_gpus_prefix(gpus)}{memory_gib}gi-{cores_percent}pct"


def whole_template_name(gpus: int) -> str:
    """``gpushare-gpu-whole`` for one GPU, ``gpushare-<K>gpus-whole`` for K."""
    return f"{_gpus_prefix(gpus)}whole"


def _template(namespace: str, name: str, exactly: dict[str, Any], gpus: int) -> dict[str, Any]:
    devices: dict[str, Any] = {"requests": [{"name": "gpu", "exactly": exactly}]}
    if gpus > 1:  # consumable capacity could put two of one request's shares on one GPU
        exactly["count"] = gpus
        devices["constraints"] = [{"requests": ["gpu"], "distinctAttribute": f"{DRIVER}/uuid"}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "gpushare"},
        },
        "spec": {"spec": {"devices": devices}},
    }


def share_templates(
    namespace: str,
    largest_gib: int,
    cores: Sequence[int],
    *,
    gpus: int = 1,
    device_class: str = DEVICE_CLASS,
) -> list[dict[str, Any]]:
    """The templates of ``namespace`` for gpu-manager's and HAMi's pods: the whole-GPU ones for
    1..``gpus`` GPUs, and for each GPU count, each size 1..``largest_gib`` GiB and each compute
    share in ``cores`` (percent) a share template. ``ValueError`` naming the value for a size
    outside 1..4096, a share outside 0..99 (100 is a whole GPU), ``gpus`` outside 1..16, or
    more than ``MOST_TEMPLATES`` templates."""
    if not 1 <= largest_gib <= 4096:
        raise ValueError(f"largest size {largest_gib} GiB: accepted 1 to 4096")
    if not 1 <= gpus <= MOST_GPUS:
        raise ValueError(f"GPUs per container {gpus}: accepted 1 to {MOST_GPUS}")
    for percent in cores:
        if not 0 <= percent < CORES_PERCENT:
            raise ValueError(
                f"compute share {percent} %: accepted 0 to 99 (100 is a whole GPU, "
                "made without asking)"
            )
    shares = sorted(set(cores))
    count = gpus * largest_gib * len(shares)
    if count > MOST_TEMPLATES:
        raise ValueError(
            f"{count} share templates ({gpus} GPU count(s) x {largest_gib} sizes x "
            f"{len(shares)} compute shares): accepted at most {MOST_TEMPLATES}"
        )
    templates = [
        _template(
            namespace,
            whole_template_name(k),
            {
                "deviceClassName": device_class,
                "capacity": {"requests": {CORES: str(CORES_PERCENT)}},
            },
            k,
        )
        for k in range(1, gpus + 1)
    ]
    templates += [
        _template(
            namespace,
            share_template_name(k, gib, percent),
            {
                "deviceClassName": device_class,
                "capacity": {"requests": {MEMORY: f"{gib}Gi", CORES: str(percent)}},
            },
            k,
        )
        for k in range(1, gpus + 1)
        for gib in range(1, largest_gib + 1)
        for percent in shares
    ]
    return templates
