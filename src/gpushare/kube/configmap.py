"""A list+watch of one ConfigMap by name (``gpushare.kube.watch.Reflector`` with a
``metadata.name`` field selector): what the device plugin's hand-kept controls read, Alibaba's
``unhealthy-gpu-<node>`` (``gpushare.kube.unhealthy``) and ``gpushare-node-config``
(``gpushare.kube.nodeconfig``). RBAC: ``configmaps`` ``get``, ``list``, ``watch`` in the
namespace."""

from __future__ import annotations

import random
from collections.abc import Callable

from lightkube import AsyncClient
from lightkube.core.client import FieldValue
from lightkube.resources.core_v1 import ConfigMap

from gpushare.kube.watch import Backoff, Change, Reflector, name_key

__all__ = ["configmap_reflector"]


def configmap_reflector(
    client: AsyncClient,
    namespace: str,
    name: str,
    sink: Callable[[Change], None],
    *,
    backoff: Backoff | None = None,
    watch_timeout_s: int = 300,
) -> Reflector:
    """A reflector of ConfigMap ``namespace``/``name`` (keyed by name) reporting to ``sink``."""
    fields: dict[str, FieldValue] = {"metadata.name": name}
    return Reflector(
        kind="ConfigMap",
        list_fn=lambda: client.list(ConfigMap, namespace=namespace, fields=fields),
        watch_fn=lambda rv, timeout_s: client.watch(
            ConfigMap,
            namespace=namespace,
            fields=fields,
            resource_version=rv,
            server_timeout=timeout_s,
        ),
        key=name_key,
        sink=sink,
        backoff=backoff or Backoff(),
        watch_timeout_s=watch_timeout_s,
        rng=random.Random(),
    )
