"""The RBAC rules a test gives ``gpushare extender`` processes that run under a ServiceAccount
of their own (``ControlPlane.service_account_kubeconfig``): exactly the chart's ClusterRole
(``gpushare.extender.rbac.cluster_rules``, which ``tests/test_deploy_manifests.py`` holds the
chart to), plus the namespaced grants (the leader-election Lease, the preemption holds
ConfigMap) cluster-wide and without names, since tests choose their own Lease and ConfigMap
names. Nothing else: a test that needs more than the chart grants fails here as it would on a
cluster (``test_the_tests_run_the_extender_with_the_charts_rules``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from lightkube.models.rbac_v1 import PolicyRule

from gpushare.extender.rbac import cluster_rules
from gpushare.kube import dracache

__all__ = [
    "DRA_DRIVER_RULES",
    "DRA_SCORING_RULES",
    "EXTENDER_RULES",
    "EXTENDER_RULES_BUT_NODES",
    "NAMESPACED_GRANTS",
    "READ_NODES",
]


def _policy_rules(rules: Iterable[Mapping[str, Sequence[str]]]) -> list[PolicyRule]:
    return [
        PolicyRule(
            apiGroups=list(r["apiGroups"]),
            resources=list(r["resources"]),
            resourceNames=list(r["resourceNames"]) if r.get("resourceNames") else None,
            verbs=list(r["verbs"]),
        )
        for r in rules
    ]


NAMESPACED_GRANTS = [
    PolicyRule(
        apiGroups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "create", "update"]
    ),
    PolicyRule(apiGroups=[""], resources=["configmaps"], verbs=["get", "list", "watch", "patch"]),
]
"""The chart's Roles for the Lease and the holds ConfigMap (``gpushare.kube.holds.rbac_rules``),
without the names: tests choose their own."""
READ_NODES = PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["list", "watch"])
_CHART = _policy_rules(cluster_rules(preemption=True, dra_scoring=False))
EXTENDER_RULES = [*_CHART, *NAMESPACED_GRANTS]
EXTENDER_RULES_BUT_NODES = [r for r in EXTENDER_RULES if r.resources != ["nodes"]]
"""Everything but reading nodes (a test may leave that out on purpose)."""
DRA_SCORING_RULES = [
    PolicyRule(
        apiGroups=list(r["apiGroups"]), resources=list(r["resources"]), verbs=list(r["verbs"])
    )
    for r in dracache.RBAC_RULES
]
"""What ``gpushare extender --dra-scoring`` needs beyond ``EXTENDER_RULES``: the rules of
``gpushare.kube.dracache``, which the chart's test holds the chart to."""

DRA_DRIVER_RULES = [
    PolicyRule(
        apiGroups=["resource.k8s.io"], resources=["resourceslices"],
        verbs=["get", "create", "update", "list", "watch"],
    ),
    PolicyRule(apiGroups=["resource.k8s.io"], resources=["resourceclaims"], verbs=["get"]),
    PolicyRule(apiGroups=[""], resources=["pods"], verbs=["list", "watch"]),
]  # fmt: skip
"""What ``gpushare dra-driver`` needs: its node's ResourceSlice (written and watched), the
claims kubelet names and its node's pods (``--placement best-fit``)."""
