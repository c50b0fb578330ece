"""The RBAC rules a test gives ``gpushare extender`` processes that run under a ServiceAccount
of their own (``ControlPlane.service_account_kubeconfig``): what the chart grants, with the
namespaced parts (the leader-election Lease, the preemption holds ConfigMap) granted cluster-wide,
since tests choose their own Lease and ConfigMap names. The chart's exact, least rules are checked
by ``tests/test_deploy_manifests.py``."""

from __future__ import annotations

from lightkube.models.rbac_v1 import PolicyRule

from gpushare.kube import dracache

__all__ = [
    "DRA_DRIVER_RULES",
    "DRA_SCORING_RULES",
    "EXTENDER_RULES",
    "EXTENDER_RULES_BUT_NODES",
    "READ_NODES",
]

READ_NODES = PolicyRule(apiGroups=[""], resources=["nodes"], verbs=["get", "list", "watch"])
EXTENDER_RULES_BUT_NODES = [
    PolicyRule(apiGroups=[""], resources=["pods"], verbs=["get", "list", "watch", "patch"]),
    PolicyRule(apiGroups=[""], resources=["pods/binding"], verbs=["create"]),
    PolicyRule(apiGroups=[""], resources=["events"], verbs=["create"]),
    PolicyRule(
        apiGroups=["coordination.k8s.io"], resources=["leases"], verbs=["get", "create", "update"]
    ),
    PolicyRule(apiGroups=[""], resources=["pods/eviction"], verbs=["create"]),
    PolicyRule(apiGroups=["policy"], resources=["poddisruptionbudgets"], verbs=["list", "watch"]),
    PolicyRule(
        apiGroups=[""],
        resources=["configmaps"],
        verbs=["get", "list", "watch", "patch", "create"],
    ),
]
"""Everything but reading nodes (a test may leave that out on purpose)."""
EXTENDER_RULES = [READ_NODES, *EXTENDER_RULES_BUT_NODES]
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
