"""The ``KubeSchedulerConfiguration`` written for each test kube-scheduler."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpushare.kube.codec import GPU_MEM
from gpushare.kube.codec.dialects import ADVERTISED_NAMES, DIALECT_NAMES

SCHEDULER_CONFIG_API_VERSION = "kubescheduler.config.k8s.io/v1"

PREEMPTION_CANDIDATE_NODES = 10
"""The chart's ``scheduler.preemptionCandidateNodes``: DefaultPreemption's dry run stops after
this many candidate nodes (docs/usage.md, "Numbers")."""


def gpushare_profile(
    scheduler_name: str, *, candidate_nodes: int = PREEMPTION_CANDIDATE_NODES
) -> dict[str, Any]:
    """A ``profiles`` entry as the chart writes it with the extender's preemption on: named
    ``scheduler_name``, DefaultPreemption's dry run cut at ``candidate_nodes`` candidate nodes
    (``minCandidateNodesAbsolute``, ``minCandidateNodesPercentage: 0``); ``candidate_nodes``
    0: kube-scheduler's defaults (10 % of the nodes, at least 100), no ``pluginConfig``."""
    profile: dict[str, Any] = {"schedulerName": scheduler_name}
    if candidate_nodes > 0:
        args = {"minCandidateNodesPercentage": 0, "minCandidateNodesAbsolute": candidate_nodes}
        profile["pluginConfig"] = [{"name": "DefaultPreemption", "args": args}]
    return profile


def gpushare_extender(
    url_prefix: str, *, http_timeout: str = "30s", dialects: bool = False, preempt: bool = True
) -> dict[str, Any]:
    """The ``extenders`` entry that sends ``aliyun.com/gpu-mem`` pods to gpushare's extender at
    ``url_prefix``: filter, prioritize, bind and (``preempt``, as the chart's default) preempt
    verbs, ``nodeCacheCapable``, not ignorable, and
    kube-scheduler still checking the node total (``ignoredByScheduler: false``;
    docs/interfaces.md, "``managedResources``, ``ignoredByScheduler``, ``ignorable``").
    ``dialects``: the dialects' resources too (``DIALECT_NAMES``), kube-scheduler checking the
    node total of those the device plugin advertises (``ADVERTISED_NAMES``) and ignoring the
    others (the extender alone checks them: docs/compute.md, "What an operator configures")."""
    managed = [{"name": GPU_MEM, "ignoredByScheduler": False}]
    if dialects:
        managed += [
            {"name": n, "ignoredByScheduler": n not in ADVERTISED_NAMES}
            for n in sorted(DIALECT_NAMES)
        ]
    entry: dict[str, Any] = {
        "urlPrefix": url_prefix,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "bindVerb": "bind",
        "weight": 10,
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "httpTimeout": http_timeout,
        "ignorable": False,
        "managedResources": managed,
    }
    if preempt:
        entry["preemptVerb"] = "preempt"
    return entry


def gpushare_dra_extender(url_prefix: str, *, weight: int = 10) -> dict[str, Any]:
    """The second ``extenders`` entry, for DRA claim pods: ``dra/prioritize`` only, without
    ``managedResources`` (so kube-scheduler calls it for every pod; the extender answers an
    empty list for pods without gpushare's claims), ignorable (a failed call loses only the
    score); as the chart's ``draDriver.scoreNodes`` writes it (docs/dra.md)."""
    return {
        "urlPrefix": url_prefix,
        "prioritizeVerb": "dra/prioritize",
        "weight": weight,
        "enableHTTPS": False,
        "nodeCacheCapable": True,
        "httpTimeout": "5s",
        "ignorable": True,
    }


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
