"""The ``KubeSchedulerConfiguration`` written for each test kube-scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"


def scheduler_configuration(
    kubeconfig: Path,
    *,
    profiles: Sequence[Mapping[str, Any]] = ({"schedulerName": "default-scheduler"},),
    extenders: Sequence[Mapping[str, Any]] = (),
    **extra: Any,
) -> dict[str, Any]:
    """A ``KubeSchedulerConfiguration`` (v1) for a test scheduler: no leader election.

    ``extenders`` entries use the v1 keys exactly (``urlPrefix``, ``filterVerb``,
    ``nodeCacheCapable``, ``managedResources``, ...); ``extra`` adds top-level fields such as
    ``percentageOfNodesToScore``.
    """
    config: dict[str, Any] = {
        "apiVersion": SCHEDULER_CONFIG_API_VERSION,
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [dict(p) for p in profiles],
    }
    if extenders:
        config["extenders"] = [dict(e) for e in extenders]
    config.update(extra)
    return config
