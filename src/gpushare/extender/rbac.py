"""The extender's RBAC, from what each of its API clients says it needs: one source for the
chart and the tests.

Each module of ``gpushare.kube`` that the live extender (``gpushare.extender.live``) calls the
API server through states its own rules (``RBAC_RULES``): the cache (nodes and pods, list and
watch; the PodDisruptionBudgets with preemption), the binder (``pods/binding``), the Event
recorder, the requeue (``pods/status`` ``patch``: never ``pods`` ``patch``), and with
preemption the fresh read of a preemptor (``pods`` ``get``), the evictor (``pods/eviction``) and
the check of who else may write the holds (``subjectaccessreviews``). :func:`cluster_rules`
joins them into the ClusterRole the chart grants (``deploy/helm/gpushare/templates/
extender-rbac.yaml``); ``tests/test_deploy_manifests.py`` holds the chart to exactly these, and
the cluster tests run the extender with them (``gpushare.testing.rbac``), so the two cannot
diverge. The holds ConfigMap's Role is ``gpushare.kube.holds.rbac_rules``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpushare.kube import binder, cache, dracache, events, evictions, podreader, requeue, writers

__all__ = ["Rule", "cluster_rules", "merged"]

Rule = Mapping[str, Sequence[str]]
"""A PolicyRule as JSON: ``apiGroups``, ``resources``, optional ``resourceNames``, ``verbs``."""


def merged(rules: Iterable[Rule]) -> list[dict[str, list[str]]]:
    """``rules`` with those of the same API groups, resources and names joined (their verbs
    united, in the order first seen), each list as given; in the order first seen."""
    joined: dict[tuple[tuple[str, ...], ...], dict[str, list[str]]] = {}
    for rule in rules:
        key = tuple(tuple(rule.get(k) or ()) for k in ("apiGroups", "resources", "resourceNames"))
        if key not in joined:
            joined[key] = {k: list(v) for k, v in rule.items() if k != "verbs"}
            joined[key]["verbs"] = []
        verbs = joined[key]["verbs"]
        verbs.extend(v for v in rule["verbs"] if v not in verbs)
    return list(joined.values())


def cluster_rules(*, preemption: bool, dra_scoring: bool) -> list[dict[str, list[str]]]:
    """The extender's cluster-wide rules (module doc), with GPU-aware preemption
    (``--preemption``) and DRA scoring (``--dra-scoring``) as configured."""
    rules: list[Rule] = [
        *cache.RBAC_RULES,
        *binder.RBAC_RULES,
        *events.RBAC_RULES,
        *requeue.RBAC_RULES,
    ]
    if preemption:
        rules += [
            *podreader.RBAC_RULES,
            *evictions.RBAC_RULES,
            *cache.BUDGET_RBAC_RULES,
            *writers.RBAC_RULES,
        ]
    if dra_scoring:
        rules += dracache.RBAC_RULES
    return merged(rules)
