"""The ResourceClaimTemplates that pods rewritten from ``aliyun.com/gpu-mem`` claim from
(``deploy/dra/gpu-mem-to-claims.yaml``; docs/dra.md): ``gpushare-gpu-mem-<N>`` asks N units of
one GPU's memory (the node's unit), one per size a pod of the namespace may ask. Pure; no I/O.
ResourceClaimTemplates are namespaced and CEL cannot make objects, so the admission policy names
them and ``gpushare dra-templates`` makes them."""

from __future__ import annotations

from typing import Any

from gpushare.dra.slices import MEMORY
from gpushare.kube.codec import MemoryUnit

__all__ = ["DEVICE_CLASS", "TEMPLATE_PREFIX", "claim_templates", "template_name"]

DEVICE_CLASS = "gpushare-gpu"
"""The DeviceClass the templates' requests name (the chart's ``draDriver.deviceClassName``)."""
TEMPLATE_PREFIX = "gpushare-gpu-mem-"
"""The templates' name before the size, as the admission policy writes it."""


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
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {
                "name": template_name(units),
                "namespace": namespace,
                "labels": {"app.kubernetes.io/managed-by": "gpushare"},
            },
            "spec": {
                "spec": {
                    "devices": {
                        "requests": [
                            {
                                "name": "gpu",
                                "exactly": {
                                    "deviceClassName": device_class,
                                    "capacity": {"requests": {MEMORY: f"{units}{suffix}"}},
                                },
                            }
                        ]
                    }
                }
            },
        }
        for units in range(1, largest + 1)
    ]
