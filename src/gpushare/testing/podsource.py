"""An in-memory stand-in for the device plugin's pods (``gpushare.deviceplugin.allocate``'s
``PodSource``, ``gpushare.kube.nodepods.NodePods`` in production): the node's pods as plain
JSON, annotation patches merged into them. For tests of Allocate over real gRPC without an API
server; the cluster tests use ``NodePods`` on the real one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["MemoryPods"]


class MemoryPods:
    """The pods ``pods`` (dicts, changed in place by ``patch_annotations``); ``patches`` keeps
    every patch as (``namespace/name``, annotations)."""

    def __init__(self, pods: Sequence[dict[str, Any]]) -> None:
        self._pods = list(pods)
        self.patches: list[tuple[str, dict[str, str]]] = []

    def pods(self) -> list[dict[str, Any]]:
        """The pods now."""
        return list(self._pods)

    async def list_now(self) -> list[dict[str, Any]]:
        """The same pods (no cache to lag behind)."""
        return self.pods()

    async def patch_annotations(
        self, namespace: str, name: str, annotations: Mapping[str, str]
    ) -> None:
        """Merge ``annotations`` into pod ``namespace/name``; ``KeyError`` when it is absent."""
        for pod in self._pods:
            metadata = pod["metadata"]
            if (metadata.get("namespace"), metadata.get("name")) == (namespace, name):
                metadata.setdefault("annotations", {}).update(annotations)
                self.patches.append((f"{namespace}/{name}", dict(annotations)))
                return
        raise KeyError(f"{namespace}/{name}")
