"""Publishing a node's ResourceSlice (``resource.k8s.io/v1``) for the DRA driver: created, or
replaced with the next pool generation when what it says changed (``publish_slice``); and a
watch of that one slice (``slice_reflector``), so that the driver publishes it again at once
when someone else deletes or changes it (kubelet deletes every slice of its node when it
starts, and a driver's slices when the driver stays unregistered: ``k8s.io/kubernetes``
v1.37.1, ``pkg/kubelet/cm/dra/plugin``, ``wipeResourceSlices``)."""

from __future__ import annotations

import copy
import hashlib
import json
import random
from collections.abc import Callable, Mapping
from typing import Any

from lightkube import AsyncClient
from lightkube.codecs import from_dict
from lightkube.core.client import FieldValue
from lightkube.core.exceptions import ApiError
from lightkube.resources.resource_v1 import ResourceSlice

from gpushare.kube.errors import CLIENT_ERRORS, api_call_error
from gpushare.kube.watch import Backoff, Change, Reflector, name_key

__all__ = ["DIGEST", "publish_slice", "published_digest", "slice_digest", "slice_reflector"]

DIGEST = "gpushare.io/slice-digest"
"""The slice's annotation holding the SHA-256 of the spec it was published with (pool
generation left out): what the API server holds is compared by it, not field by field (the
server adds defaults, and a field dropped, such as a GPU's taint, must count as a change)."""


async def publish_slice(client: AsyncClient, body: Mapping[str, Any]) -> int:
    """Make the ResourceSlice ``body`` (JSON; ``spec.pool.generation`` ignored) the one the API
    server holds under its name, and return the pool generation it now has: 1 for a new slice,
    the one it had when its spec says the same, else that one plus 1 (the scheduler then drops
    what an older generation said). ``ApiCallError`` (``gpushare.kube.errors``) when the API
    server refuses or cannot be reached."""
    name = body["metadata"]["name"]
    try:
        return await _publish(client, name, body)
    except ApiError as error:
        raise api_call_error(f"publish ResourceSlice {name}", error) from error
    except CLIENT_ERRORS as error:
        raise api_call_error(f"publish ResourceSlice {name}", error) from error


def slice_digest(body: Mapping[str, Any]) -> str:
    """The :data:`DIGEST` of slice ``body``: the SHA-256 of its spec, pool generation left out."""
    spec = copy.deepcopy(dict(body["spec"]))
    spec["pool"]["generation"] = 0  # not part of what the slice says
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()


def published_digest(obj: Mapping[str, Any]) -> str | None:
    """The :data:`DIGEST` annotation of a slice as the API server holds it (``None``: none)."""
    annotations = (obj.get("metadata") or {}).get("annotations") or {}
    found = annotations.get(DIGEST)
    return found if isinstance(found, str) else None


def slice_reflector(
    client: AsyncClient, name: str, sink: Callable[[Change], None], *, watch_timeout_s: int = 300
) -> Reflector:
    """A reflector of ResourceSlice ``name`` (a ``metadata.name`` field selector) reporting to
    ``sink``. RBAC: ``resourceslices`` ``list`` and ``watch``."""
    fields: dict[str, FieldValue] = {"metadata.name": name}
    return Reflector(
        kind="ResourceSlice",
        list_fn=lambda: client.list(ResourceSlice, fields=fields),
        watch_fn=lambda rv, timeout_s: client.watch(
            ResourceSlice, fields=fields, resource_version=rv, server_timeout=timeout_s
        ),
        key=name_key,
        sink=sink,
        backoff=Backoff(),
        watch_timeout_s=watch_timeout_s,
        rng=random.Random(),
    )


async def _publish(client: AsyncClient, name: str, body: Mapping[str, Any]) -> int:
    wanted = copy.deepcopy(dict(body))
    wanted["spec"]["pool"]["generation"] = 0  # not part of what the slice says
    digest = slice_digest(wanted)
    wanted["metadata"].setdefault("annotations", {})[DIGEST] = digest
    try:
        current = (await client.get(ResourceSlice, name)).to_dict()
    except ApiError as error:
        if error.status.code != 404:
            raise
        wanted["spec"]["pool"]["generation"] = 1
        await client.create(from_dict(wanted))
        return 1
    generation = int(current["spec"]["pool"]["generation"])
    if (current["metadata"].get("annotations") or {}).get(DIGEST) == digest:
        return generation
    wanted["spec"]["pool"]["generation"] = generation + 1
    wanted["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    await client.replace(from_dict(wanted))
    return generation + 1
