"""Builders for the DRA tests: ResourceClaims as the API server returns them once kube-scheduler
has allocated them (``allocated_claim``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.dra.slices import DRIVER

__all__ = ["allocated_claim", "result"]


def result(
    device: str,
    *,
    memory: str | None = "8Gi",
    cores: str | None = None,
    pool: str = "n1",
    driver: str = DRIVER,
    request: str = "gpu",
    share_id: str | None = "share-1",
) -> dict[str, Any]:
    """One allocation result (``status.allocation.devices.results[]``) of ``device``."""
    consumed = {k: v for k, v in (("memory", memory), ("cores", cores)) if v is not None}
    entry: dict[str, Any] = {"request": request, "driver": driver, "pool": pool, "device": device}
    if consumed:
        entry["consumedCapacity"] = consumed
    if share_id is not None:
        entry["shareID"] = share_id
    return entry


def allocated_claim(
    results: Sequence[Mapping[str, Any]] | None,
    *,
    name: str = "c",
    namespace: str = "ns",
    uid: str = "uid-1",
) -> dict[str, Any]:
    """ResourceClaim ``namespace/name`` (``uid``) allocated with ``results`` (``None``: not
    allocated)."""
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu"}]}},
    }
    if results is not None:
        claim["status"] = {"allocation": {"devices": {"results": list(results)}}}
    return claim
