"""The deployment artefacts in ``deploy/`` and the image, without a cluster.

The chart is rendered by a real helm (``scripts/build-helm.sh``; ``gpushare.testing.helm``
builds it when missing, never skips). Proved here: the committed manifests are exactly a fresh
render; helm refuses values the schema forbids; the ClusterRoles are exactly the rules the code
needs (``gpushare.kube.nodes``/``nodepods`` ``RBAC_RULES`` for the device plugin, docs/extender.md
for the extender); every kube-scheduler configuration the chart and ``deploy/scheduler`` carry
has gpushare's extender entry (``gpushare.testing.controlplane.gpushare_extender``); the
workloads pass only flags the commands have; the legacy Policy file is marked legacy; the
v1beta2/v1beta3 files decode strictly with the scheduler configuration API of Kubernetes 1.23 and
1.24 (``scripts/build-schedconfig.sh``; ``gpushare.testing.schedconfig``) into the v1 file's
extender entry and profile, and a misspelt copy is refused; the Dockerfile has its stages, a
non-root user and the ``gpushare`` entry point.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import os
import re
import socket
import ssl
import subprocess
import tempfile
import threading
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

import click
import pytest

from gpushare.cli.deviceplugin import device_plugin
from gpushare.cli.dradriver import dra_driver
from gpushare.cli.extender import extender
from gpushare.core.policies import policy_names
from gpushare.core.serves import Serves
from gpushare.extender.rbac import cluster_rules
from gpushare.kube import nodeconfig, nodepods, nodes, unhealthy
from gpushare.kube.codec import MemoryUnit
from gpushare.kube.codec.dialects import DIALECT_NAMES
from gpushare.kube.codec.nodeconfig import MemoryReserve, NodeConfig, node_config
from gpushare.kube.holds import HOLD_SHARDS, HoldsRef, rbac_rules
from gpushare.testing.controlplane import (
    PREEMPTION_CANDIDATE_NODES,
    REPO_ROOT,
    gpushare_dra_extender,
    gpushare_extender,
    gpushare_profile,
)
from gpushare.testing.helm import (
    CHART_DIR,
    MANIFESTS,
    MANIFESTS_DIR,
    HelmError,
    locate_helm,
    manifest_text,
    parse_yaml,
    render_notes,
    render_objects,
)
from gpushare.testing.rbac import (
    DRA_DRIVER_RULES,
    DRA_SCORING_RULES,
    NAMESPACED_GRANTS,
)
from gpushare.testing.rbac import EXTENDER_RULES as TEST_EXTENDER_RULES
from gpushare.testing.schedconfig import (
    RELEASES,
    SchedulerConfigRefusedError,
    decode_scheduler_config,
)

SCHEDULER_DIR = REPO_ROOT / "deploy" / "scheduler"
EXTENDER_RULES = cluster_rules(preemption=True, dra_scoring=False)  # what its clients need
HOLDS_REF = HoldsRef("kube-system", "gpushare-preemption-holds", HOLD_SHARDS)
HOLDS_RULES = rbac_rules(HOLDS_REF.names)  # the ConfigMaps it writes, every shard
SERVICE_URL = "https://gpushare-extender.kube-system.svc:12345/gpushare-scheduler"
SERVER_NAME = "gpushare-extender.kube-system.svc"
HOST_CA_FILE = "/etc/kubernetes/gpushare-extender-ca.crt"  # the default scheduler's, on the host
MOUNTED_CA_FILE = "/etc/kubernetes/gpushare-extender-ca/ca.crt"  # the second scheduler's mount
# kube-scheduler's client certificate for the extender's verbs: on the hosts (wiring (a)), and
# where the second scheduler mounts it (wiring (b))
HOST_CLIENT = {
    "certFile": "/etc/kubernetes/gpushare-extender-client.crt",
    "keyFile": "/etc/kubernetes/gpushare-extender-client.key",
}
MOUNTED_CLIENT = {
    "certFile": "/etc/kubernetes/gpushare-extender-client/tls.crt",
    "keyFile": "/etc/kubernetes/gpushare-extender-client/tls.key",
}
Obj = dict[str, Any]
PROMETHEUS_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}
"""The peer the extender's NetworkPolicy admits for Prometheus by default
(``extender.networkPolicy.prometheus``: kube-prometheus-stack in namespace monitoring)."""


@pytest.fixture(scope="module")
def helm() -> Path:
    return locate_helm()


@pytest.fixture(scope="module")
def default_objects(helm: Path) -> list[Obj]:
    return render_objects(helm=helm)


@pytest.fixture(scope="module")
def with_scheduler(helm: Path) -> list[Obj]:
    return render_objects({"scheduler": {"second": {"enabled": True}}}, helm=helm)


def find(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} rendered"
    return found[0]


def normalized(rules: Iterable[Mapping[str, Any]]) -> list[tuple[tuple[str, ...], ...]]:
    """Rules as sorted tuples: order of rules and of list items carries no meaning in RBAC."""
    keys = ("apiGroups", "resources", "resourceNames", "verbs")
    return sorted(tuple(tuple(sorted(rule.get(k) or ())) for k in keys) for rule in rules)


def scheduler_config(configmap: Obj) -> Obj:
    (config,) = parse_yaml(configmap["data"]["kube-scheduler-config.yaml"])
    return config


def with_tls(url: str, ca_file: str, **extra: str) -> Obj:
    """gpushare's extender entry with the chart's TLS: https, the certificate checked for the
    Service's DNS name against ``ca_file``."""
    tls = {"serverName": SERVER_NAME, "caFile": ca_file, **extra}
    return {**gpushare_extender(url), "enableHTTPS": True, "tlsConfig": tls}


def flags(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def container(workload: Obj) -> Obj:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(only)


# ---- rendering ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MANIFESTS))
def test_committed_manifests_are_a_fresh_render(helm: Path, name: str) -> None:
    committed = (MANIFESTS_DIR / name).read_text(encoding="utf-8")
    assert committed == manifest_text(name, helm=helm), (
        f"deploy/manifests/{name} is out of date: run scripts/render-manifests.sh"
    )


def test_chart_metadata(helm: Path) -> None:
    (chart,) = parse_yaml((CHART_DIR / "Chart.yaml").read_text(encoding="utf-8"))
    assert chart["apiVersion"] == "v2"
    assert chart["kubeVersion"] == ">=1.28.0-0"
    # helm enforces it: a 1.27 cluster is refused.
    with pytest.raises(HelmError, match="kubeVersion"):
        render_objects(helm=helm, kube_version="1.27.9")
    render_objects(helm=helm, kube_version="1.28.0")


@pytest.mark.parametrize(
    "settings",
    ["scheduler.second.enabled=false", "scheduler.second.enabled=true", "draDriver.enabled=true"],
)
def test_helm_lint_strict(helm: Path, settings: str, tmp_path: Path) -> None:
    homes = {f"HELM_{k}_HOME": str(tmp_path) for k in ("CACHE", "CONFIG", "DATA")}
    done = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART_DIR), "--set", settings],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **homes},
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_rendered_objects(default_objects: list[Obj], with_scheduler: list[Obj]) -> None:
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in default_objects)
    assert kinds == [
        ("ClusterRole", "gpushare-device-plugin"),
        ("ClusterRole", "gpushare-extender"),
        ("ClusterRoleBinding", "gpushare-device-plugin"),
        ("ClusterRoleBinding", "gpushare-extender"),
        ("ConfigMap", "gpushare-default-scheduler-config"),
        ("ConfigMap", "gpushare-node-config"),
        *sorted(("ConfigMap", name) for name in HOLDS_REF.names),
        ("DaemonSet", "gpushare-device-plugin"),
        ("Deployment", "gpushare-extender"),
        ("NetworkPolicy", "gpushare-extender"),
        ("PodDisruptionBudget", "gpushare-extender"),
        ("Role", "gpushare-device-plugin"),
        ("Role", "gpushare-device-plugin-node-config"),
        ("Role", "gpushare-extender-leader-election"),
        ("Role", "gpushare-extender-preemption"),
        ("RoleBinding", "gpushare-device-plugin"),
        ("RoleBinding", "gpushare-device-plugin-node-config"),
        ("RoleBinding", "gpushare-extender-leader-election"),
        ("RoleBinding", "gpushare-extender-preemption"),
        ("Secret", "gpushare-extender-client"),
        ("Secret", "gpushare-extender-tls"),
        ("Service", "gpushare-extender"),
        ("ServiceAccount", "gpushare-device-plugin"),
        ("ServiceAccount", "gpushare-extender"),
        ("ValidatingAdmissionPolicy", "gpushare-device-plugin-own-node"),
        ("ValidatingAdmissionPolicyBinding", "gpushare-device-plugin-own-node"),
    ]
    extra = {(o["kind"], o["metadata"]["name"]) for o in with_scheduler} - set(kinds)
    assert extra == {
        ("ServiceAccount", "gpushare-scheduler"),
        ("ClusterRoleBinding", "gpushare-scheduler"),
        ("ClusterRoleBinding", "gpushare-scheduler-volume"),
        ("RoleBinding", "gpushare-scheduler-authentication-reader"),
        ("Role", "gpushare-scheduler-leader-election"),
        ("RoleBinding", "gpushare-scheduler-leader-election"),
        ("ConfigMap", "gpushare-scheduler-config"),
        ("Deployment", "gpushare-scheduler"),
    }
    for obj in with_scheduler:
        namespaced = obj["kind"] not in {
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        }
        assert ("namespace" in obj["metadata"]) == namespaced, obj["metadata"]


# ---- values and their schema ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"memoryUnit": "KiB"}, "memoryUnit"),
        ({"extender": {"policy": "first-fit"}}, "policy"),
        ({"extender": {"replicas": 0}}, "replicas"),
        ({"extender": {"leaderElection": {"leaseDurationSeconds": 1}}}, "leaseDurationSeconds"),
        ({"extender": {"service": {"type": "LoadBalancer"}}}, "type"),
        ({"extender": {"service": {"type": "NodePort", "nodePort": 80}}}, "nodePort"),
        ({"scheduler": {"httpTimeout": 30}}, "httpTimeout"),
        ({"scheduler": {"urlPrefix": "10.0.0.1:12345"}}, "urlPrefix"),
        ({"devicePlugin": {"devicePluginDir": "relative/dir"}}, "devicePluginDir"),
        ({"devicePlugin": {"mpsManaged": {"root": "run/mps"}}}, "root"),
        ({"devicePlugin": {"mpsManaged": {"enable": True}}}, "enable"),
        ({"nodeSelector": {"gpushare": True}}, "nodeSelector"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"extender": {"tls": {"source": "self-signed"}}}, "source"),
        ({"extender": {"tls": {"validityDays": 0}}}, "validityDays"),
        ({"extender": {"tls": {"clientAuth": {"mode": "maybe"}}}}, "mode"),
        ({"scheduler": {"defaultSchedulerClientKeyFile": "client.key"}}, "KeyFile"),
        ({"extender": {"networkPolicy": {"controlPlaneCIDRs": ["10.0.0.1"]}}}, "controlPlaneCIDRs"),
        ({"devicePlugin": {"restrictToOwnNode": "yes"}}, "restrictToOwnNode"),
        ({"scheduler": {"dialectResources": ["amd.com/gpu"]}}, "dialectResources"),
        ({"devicePlugin": {"dialects": ["fork"]}}, "dialects"),
        ({"devicePlugin": {"splitCount": 0}}, "splitCount"),
    ],
)
def test_the_values_schema_refuses_bad_values(
    helm: Path, values: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(HelmError, match="schema") as refused:
        render_objects(values, helm=helm)
    assert complaint in str(refused.value)


def test_the_schema_knows_every_policy_and_every_default() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text(encoding="utf-8"))
    policies = schema["properties"]["extender"]["properties"]["policy"]["enum"]
    assert sorted(policies) == sorted(policy_names())
    (values,) = parse_yaml((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))

    def keys(node: Mapping[str, Any], prefix: str = "") -> set[str]:
        out = set()
        for key, value in node.items():
            out.add(prefix + key)
            if isinstance(value, Mapping) and value and key not in {"nodeSelector", "resources"}:
                out |= keys(value, f"{prefix}{key}.")
        return out

    readme = (CHART_DIR / "README.md").read_text(encoding="utf-8")
    undocumented = sorted(k for k in keys(values) if f"`{k}`" not in readme)
    assert not undocumented, f"values missing from deploy/helm/gpushare/README.md: {undocumented}"


# ---- RBAC ----------------------------------------------------------------------------------


def test_device_plugin_role_is_exactly_what_the_code_needs(default_objects: list[Obj]) -> None:
    role = find(default_objects, "ClusterRole", "gpushare-device-plugin")
    assert normalized(role["rules"]) == normalized([*nodes.RBAC_RULES, *nodepods.RBAC_RULES])
    # Alibaba's unhealthy-gpu-<node> ConfigMaps: read in kube-system only.
    configmaps = find(default_objects, "Role", "gpushare-device-plugin")
    assert configmaps["metadata"]["namespace"] == "kube-system"
    assert normalized(configmaps["rules"]) == normalized(unhealthy.RBAC_RULES)
    binding = find(default_objects, "RoleBinding", "gpushare-device-plugin")
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["name"] == "gpushare-device-plugin"
    # The node-config ConfigMap: read in the release namespace only.
    role = find(default_objects, "Role", "gpushare-device-plugin-node-config")
    assert role["metadata"]["namespace"] == "kube-system"  # the release namespace
    assert normalized(role["rules"]) == normalized(nodeconfig.RBAC_RULES)
    binding = find(default_objects, "RoleBinding", "gpushare-device-plugin-node-config")
    assert binding["roleRef"]["name"] == "gpushare-device-plugin-node-config"


def test_extender_role_is_exactly_the_documented_rules(default_objects: list[Obj]) -> None:
    role = find(default_objects, "ClusterRole", "gpushare-extender")
    assert normalized(role["rules"]) == normalized(EXTENDER_RULES)
    holds = find(default_objects, "Role", "gpushare-extender-preemption")
    assert normalized(holds["rules"]) == normalized(HOLDS_RULES)
    assert holds["metadata"]["namespace"] == "kube-system"
    docs = " ".join((REPO_ROOT / "docs" / "extender.md").read_text(encoding="utf-8").split())
    for rule in EXTENDER_RULES:  # docs/extender.md, "Running it", names every grant
        for resource in rule["resources"]:
            said = [f"`{resource}` {'/'.join(v)}" for v in itertools.permutations(rule["verbs"])]
            assert any(s in docs for s in said), said[0]


def test_the_tests_run_the_extender_with_the_charts_rules() -> None:
    """The cluster tests' extender identity (``gpushare.testing.rbac``) has the chart's
    ClusterRole and its Roles' grants (without names), and nothing more: a requeue that needs
    ``pods`` ``patch`` would fail in the tests as on a cluster."""
    namespaced = [r.to_dict() for r in NAMESPACED_GRANTS]
    assert normalized(r.to_dict() for r in TEST_EXTENDER_RULES) == normalized(
        [*EXTENDER_RULES, *namespaced]
    )
    (holds,) = HOLDS_RULES
    assert normalized([{**holds, "resourceNames": []}]) == normalized(
        [r for r in namespaced if r["resources"] == ["configmaps"]]
    )
    verbs = {(tuple(r["resources"]), v) for r in EXTENDER_RULES for v in r["verbs"]}
    assert (("pods",), "patch") not in verbs
    assert (("pods/status",), "patch") in verbs  # the requeue: a status condition


def test_bindings_give_each_service_account_its_own_role(with_scheduler: list[Obj]) -> None:
    for component in ("extender", "device-plugin"):
        binding = find(with_scheduler, "ClusterRoleBinding", f"gpushare-{component}")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": f"gpushare-{component}",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": f"gpushare-{component}", "namespace": "kube-system"}
        ]
    roles = {
        (o["kind"], o["metadata"]["name"]): o["roleRef"]["name"]
        for o in with_scheduler
        if o["kind"] in {"ClusterRoleBinding", "RoleBinding"}
        and o["subjects"][0]["name"] == "gpushare-scheduler"
    }
    assert roles == {
        ("ClusterRoleBinding", "gpushare-scheduler"): "system:kube-scheduler",
        ("ClusterRoleBinding", "gpushare-scheduler-volume"): "system:volume-scheduler",
        ("RoleBinding", "gpushare-scheduler-authentication-reader"): (
            "extension-apiserver-authentication-reader"
        ),
        ("RoleBinding", "gpushare-scheduler-leader-election"): "gpushare-scheduler-leader-election",
    }
    lease = find(with_scheduler, "Role", "gpushare-scheduler-leader-election")
    assert {"resourceNames": ["gpushare-scheduler"], "verbs": ["get", "update"]}.items() <= (
        lease["rules"][1].items()
    )


# ---- kube-scheduler configuration --------------------------------------------------------------


def test_default_scheduler_config_has_gpushare_extender(default_objects: list[Obj]) -> None:
    config = scheduler_config(
        find(default_objects, "ConfigMap", "gpushare-default-scheduler-config")
    )
    assert config["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert config["clientConnection"] == {"kubeconfig": "/etc/kubernetes/scheduler.conf"}
    assert config["profiles"] == [gpushare_profile("default-scheduler")]
    assert config["extenders"] == [with_tls(SERVICE_URL, HOST_CA_FILE, **HOST_CLIENT)]


@pytest.mark.parametrize(
    ("values", "candidate_nodes"),
    [
        pytest.param({}, PREEMPTION_CANDIDATE_NODES, id="preemption-on-dry-run-cut-at-10-nodes"),
        pytest.param(
            {"scheduler": {"preemptionCandidateNodes": 25}}, 25, id="operator-sets-the-cut"
        ),
        pytest.param(
            {"scheduler": {"preemptionCandidateNodes": 0}}, 0, id="zero-keeps-kube-defaults"
        ),
        pytest.param(
            {"extender": {"preemption": {"enabled": False}}}, 0, id="no-preemption-no-args"
        ),
    ],
)
def test_scheduler_profiles_cut_the_preemption_dry_run(
    helm: Path, values: Obj, candidate_nodes: int
) -> None:
    """Both wirings get DefaultPreemption's ``minCandidateNodesAbsolute`` from
    ``scheduler.preemptionCandidateNodes`` while the extender preempts (values.yaml)."""
    second = {"scheduler": {**values.get("scheduler", {}), "second": {"enabled": True}}}
    objects = render_objects({**values, **second}, helm=helm)
    for configmap, name in [
        ("gpushare-default-scheduler-config", "default-scheduler"),
        ("gpushare-scheduler-config", "gpushare-scheduler"),
    ]:
        config = scheduler_config(find(objects, "ConfigMap", configmap))
        assert config["profiles"] == [gpushare_profile(name, candidate_nodes=candidate_nodes)]


def test_dialect_resources_join_the_extender_entry_advertised_ones_checked_by_kube_scheduler(
    helm: Path,
) -> None:
    values = {"scheduler": {"dialectResources": sorted(DIALECT_NAMES)}}
    objects = render_objects(values, helm=helm)
    config = scheduler_config(find(objects, "ConfigMap", "gpushare-default-scheduler-config"))
    (entry,) = config["extenders"]
    expected = gpushare_extender(SERVICE_URL, dialects=True)["managedResources"]
    assert entry["managedResources"] == expected


PLAIN_HTTP: dict[str, Any] = {"tls": {"enabled": False}}  # unsafe, but possible


@pytest.mark.parametrize(
    ("values", "url", "https"),
    [
        (
            {"extender": {"service": {"clusterIP": "10.96.0.250"}}},
            "https://10.96.0.250:12345",
            True,
        ),
        (
            {"extender": {**PLAIN_HTTP, "service": {"clusterIP": "10.96.0.250"}}},
            "http://10.96.0.250:12345",
            False,
        ),
        (
            {"scheduler": {"urlPrefix": "https://192.0.2.7:31234/x"}},
            "https://192.0.2.7:31234/x",
            True,
        ),
        (
            {"extender": {"tls": {"secretName": "t"}, "port": 8443}},
            "https://gpushare-extender.kube-system.svc:8443",
            True,
        ),
        (
            {"extender": PLAIN_HTTP},
            "http://gpushare-extender.kube-system.svc:12345",
            False,
        ),
    ],
)
def test_the_extender_url_follows_the_values(
    helm: Path, values: dict[str, Any], url: str, https: bool
) -> None:
    objects = render_objects(values, helm=helm)
    (entry,) = scheduler_config(find(objects, "ConfigMap", "gpushare-default-scheduler-config"))[
        "extenders"
    ]
    expected = url if url.endswith("/x") else f"{url}/gpushare-scheduler"
    assert entry == (
        with_tls(expected, HOST_CA_FILE, **HOST_CLIENT) if https else gpushare_extender(expected)
    )


def test_second_scheduler_config_and_deployment(with_scheduler: list[Obj]) -> None:
    config = scheduler_config(find(with_scheduler, "ConfigMap", "gpushare-scheduler-config"))
    assert config["profiles"] == [gpushare_profile("gpushare-scheduler")]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "gpushare-scheduler",
        "resourceNamespace": "kube-system",
    }
    assert "clientConnection" not in config  # in-cluster: its ServiceAccount
    assert config["extenders"] == [with_tls(SERVICE_URL, MOUNTED_CA_FILE, **MOUNTED_CLIENT)]
    deployment = find(with_scheduler, "Deployment", "gpushare-scheduler")
    main = container(deployment)
    assert main["image"] == "registry.k8s.io/kube-scheduler:v1.37.1"
    assert "--config=/etc/kubernetes/gpushare/kube-scheduler-config.yaml" in main["command"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpushare-scheduler"
    assert pod["volumes"][0]["configMap"]["name"] == "gpushare-scheduler-config"
    # The extender's CA, from its TLS Secret, where tlsConfig.caFile reads it.
    assert pod["volumes"][1] == {
        "name": "extender-ca",
        "secret": {
            "secretName": "gpushare-extender-tls",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        },
    }
    assert {
        "name": "extender-ca",
        "mountPath": "/etc/kubernetes/gpushare-extender-ca",
        "readOnly": True,
    } in (main["volumeMounts"])
    # Its client certificate for the extender's verbs, from the generated client Secret.
    assert pod["volumes"][2] == {
        "name": "extender-client",
        "secret": {
            "secretName": "gpushare-extender-client",
            "items": [{"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}],
        },
    }
    assert {
        "name": "extender-client",
        "mountPath": "/etc/kubernetes/gpushare-extender-client",
        "readOnly": True,
    } in (main["volumeMounts"])
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    # a new CA or client certificate restarts it
    assert set(annotations) == {"checksum/config", "checksum/tls", "checksum/client-tls"}


def test_deploy_scheduler_config_is_the_chart_config_with_a_pinned_ip(helm: Path) -> None:
    objects = render_objects({"extender": {"service": {"clusterIP": "10.96.0.250"}}}, helm=helm)
    rendered = scheduler_config(find(objects, "ConfigMap", "gpushare-default-scheduler-config"))
    (committed,) = parse_yaml((SCHEDULER_DIR / "kube-scheduler-config.yaml").read_text())
    assert committed == rendered
    service = find(objects, "Service", "gpushare-extender")
    assert service["spec"]["clusterIP"] == "10.96.0.250"


def test_legacy_policy_is_marked_legacy_and_equivalent() -> None:
    policy = json.loads((SCHEDULER_DIR / "legacy-policy.json").read_text(encoding="utf-8"))
    assert (policy["kind"], policy["apiVersion"]) == ("Policy", "v1")
    (entry,) = policy["extenders"]
    v1 = with_tls("https://10.96.0.250:12345/gpushare-scheduler", HOST_CA_FILE, **HOST_CLIENT)
    # Policy spelling: enableHttps, and httpTimeout in integer nanoseconds.
    assert entry.pop("enableHttps") is v1.pop("enableHTTPS") is True
    assert entry.pop("httpTimeout") == 30_000_000_000
    v1.pop("httpTimeout")
    assert entry == v1
    readme = (SCHEDULER_DIR / "README.md").read_text(encoding="utf-8")
    assert "LEGACY: only clusters older than 1.23" in readme
    assert "--policy-config-file=/etc/kubernetes/legacy-policy.json" in readme


# kube-scheduler 1.23 and 1.24 read kubescheduler.config.k8s.io/v1beta2 and v1beta3 (v1 came in
# 1.25): each file in both releases, decoded by the release's own configuration API.
BETA_ON_RELEASES = [(api_version, r) for api_version in ("v1beta2", "v1beta3") for r in RELEASES]


def beta_config_path(api_version: str) -> Path:
    return SCHEDULER_DIR / f"kube-scheduler-config-{api_version}.yaml"


def without_zero_values(value: Any) -> Any:
    """``value`` less the keys whose value is false, zero, empty or null, at any depth: what a
    Go struct field at its zero value with ``omitempty`` encodes to (nothing)."""
    if isinstance(value, dict):
        kept = {k: without_zero_values(v) for k, v in value.items()}
        return {k: v for k, v in kept.items() if v not in (None, False, 0, "", [], {})}
    if isinstance(value, list):
        return [without_zero_values(v) for v in value]
    return value


@pytest.mark.parametrize(
    ("api_version", "release"),
    [pytest.param(*p, id=f"{p[0]}-file-decodes-strictly-on-{p[1]}") for p in BETA_ON_RELEASES],
)
def test_beta_scheduler_config_is_the_v1_config_as_its_release_decodes_it(
    api_version: str, release: str
) -> None:
    """The v1beta2/v1beta3 files hold the v1 file's profile and extender entry (verbs, managed
    resources, TLS, weight, timeout), key for key, and the release's kube-scheduler types know
    every key: it decodes them strictly into the same values."""
    (v1,) = parse_yaml((SCHEDULER_DIR / "kube-scheduler-config.yaml").read_text())
    (beta,) = parse_yaml(beta_config_path(api_version).read_text())
    assert beta == {**v1, "apiVersion": f"kubescheduler.config.k8s.io/{api_version}"}
    decoded = decode_scheduler_config(beta_config_path(api_version), release)
    assert decoded["kubeScheduler"] == RELEASES[release]
    assert decoded["apiVersion"] == f"kubescheduler.config.k8s.io/{api_version}"
    config = decoded["config"]
    assert config["clientConnection"]["kubeconfig"] == v1["clientConnection"]["kubeconfig"]
    (entry,) = config["extenders"]
    assert without_zero_values(entry) == without_zero_values(
        with_tls("https://10.96.0.250:12345/gpushare-scheduler", HOST_CA_FILE, **HOST_CLIENT)
    )
    assert without_zero_values(config["extenders"]) == without_zero_values(v1["extenders"])
    for profile in config["profiles"]:
        for plugin in profile.get("pluginConfig", []):
            plugin["args"].pop("apiVersion", None)  # the typed args' TypeMeta, if set
            plugin["args"].pop("kind", None)
    assert config["profiles"] == [gpushare_profile("default-scheduler")] == v1["profiles"]


@pytest.mark.parametrize(
    ("edit", "refusal"),  # refusal: a regular expression (1.24 names the field's path too)
    [
        pytest.param(
            ("enableHTTPS: true", "enableHttps: true"),
            r'unknown field "(extenders\[0\]\.)?enableHttps"',
            id="the-legacy-policy-spelling-enableHttps-is-refused",
        ),
        pytest.param(
            ("ignoredByScheduler: false", "ignoreByScheduler: false"),
            r'unknown field "(extenders\[0\]\.managedResources\[0\]\.)?ignoreByScheduler"',
            id="a-misspelt-managed-resource-key-is-refused",
        ),
        pytest.param(
            ("caFile:", "caFilePath:"),
            r'unknown field "(extenders\[0\]\.tlsConfig\.)?caFilePath"',
            id="a-tls-key-the-release-lacks-is-refused",
        ),
        pytest.param(
            ("minCandidateNodesAbsolute: 10", "minCandidateNodesAbsolut: 10"),
            r'DefaultPreemption: strict decoding error: unknown field "minCandidateNodesAbsolut"',
            id="a-misspelt-default-preemption-arg-is-refused",
        ),
        pytest.param(
            ("weight: 10", "weight: ten"),
            r"cannot unmarshal string into Go struct field Extender\.extenders\.weight of type",
            id="a-weight-that-is-no-number-is-refused",
        ),
    ],
)
@pytest.mark.parametrize(
    ("api_version", "release"),
    [pytest.param(*p, id=f"{p[0]}-file-on-{p[1]}") for p in BETA_ON_RELEASES],
)
def test_the_release_refuses_a_misspelt_copy_of_the_beta_config(
    api_version: str, release: str, edit: tuple[str, str], refusal: str, tmp_path: Path
) -> None:
    """The check can fail: a copy of the file with one key misspelt (``edit``: the text
    replaced and its replacement) is refused, naming the field, the file and the release."""
    old, new = edit
    text = beta_config_path(api_version).read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} must occur once in the {api_version} file"
    misspelt = tmp_path / f"kube-scheduler-config-{api_version}.yaml"
    misspelt.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(SchedulerConfigRefusedError) as refused:
        decode_scheduler_config(misspelt, release)
    assert re.search(refusal, str(refused.value)), refused.value
    assert str(misspelt) in str(refused.value)
    assert RELEASES[release] in str(refused.value)  # the release that refused it


@pytest.mark.parametrize("release", RELEASES)
def test_the_v1_config_is_refused_by_releases_before_1_25(release: str) -> None:
    """Why the v1beta files exist: kube-scheduler 1.23/1.24 know no kubescheduler v1."""
    with pytest.raises(SchedulerConfigRefusedError) as refused:
        decode_scheduler_config(SCHEDULER_DIR / "kube-scheduler-config.yaml", release)
    assert 'for version "kubescheduler.config.k8s.io/v1"' in str(refused.value)
    assert "accepted: kind KubeSchedulerConfiguration of kubescheduler.config.k8s.io/v1beta2" in (
        str(refused.value)
    )


def test_the_docs_say_which_scheduler_config_fits_which_kubernetes() -> None:
    readme = (SCHEDULER_DIR / "README.md").read_text(encoding="utf-8")
    install = (REPO_ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    for name in ("kube-scheduler-config-v1beta2.yaml", "kube-scheduler-config-v1beta3.yaml"):
        assert name in readme
        assert name in install


# ---- workloads -----------------------------------------------------------------------------


def _args(main: Obj) -> list[str]:
    return [str(a) for a in main.get("args", [])]


def _flag_names(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, None, id="default-derived-from-the-inventory"),
        pytest.param({"extender": {"gpuUnit": 16384}}, "--gpu-unit=16384", id="given-in-MiB"),
    ],
)
def test_extender_gpu_unit(helm: Path, values: dict[str, Any], expected: str | None) -> None:
    deployment = find(render_objects(values, helm=helm), "Deployment", "gpushare-extender")
    given = [a for a in _args(container(deployment)) if a.startswith("--gpu-unit")]
    assert given == ([] if expected is None else [expected])


def test_extender_deployment(helm: Path, default_objects: list[Obj]) -> None:
    deployment = find(default_objects, "Deployment", "gpushare-extender")
    spec = deployment["spec"]
    assert spec["replicas"] == 2  # high availability by default: one decider, one warm
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gpushare-extender"
    assert pod["securityContext"]["runAsNonRoot"] is True
    main = container(deployment)
    args = _args(main)
    assert args[0] == "extender"
    assert _flag_names(args) <= flags(extender)
    assert "--policy=fgd-spare" in args  # gpushare's policy is the default
    assert not any(a.startswith("--gpu-unit") for a in args)  # derived from the inventory
    assert "--port=12345" in args
    # The pod's IP only, not every interface (kubelet expands $(POD_IP) from the env).
    assert "--host=$(POD_IP)" in args
    assert {
        "--tls-cert=/etc/gpushare/tls/tls.crt",
        "--tls-key=/etc/gpushare/tls/tls.key",
    } <= set(args)
    # kube-scheduler's calls need its client certificate; the CA comes from the client Secret
    assert {
        "--tls-client-ca=/etc/gpushare/client-ca/ca.crt",
        "--tls-client-auth=required",
    } <= set(args)
    assert {"name": "client-ca", "mountPath": "/etc/gpushare/client-ca", "readOnly": True} in (
        main["volumeMounts"]
    )
    assert {  # the CA only: the extender never holds kube-scheduler's key
        "name": "client-ca",
        "secret": {
            "secretName": "gpushare-extender-client",
            "items": [{"key": "ca.crt", "path": "ca.crt"}],
        },
    } in spec["template"]["spec"]["volumes"]
    # the probes need no client certificate: they stay HTTP(S) probes of /readyz and /healthz
    assert main["readinessProbe"]["httpGet"] == {
        "path": "/readyz",
        "port": "http",
        "scheme": "HTTPS",
    }
    assert main["livenessProbe"]["httpGet"] == {
        "path": "/healthz",
        "port": "http",
        "scheme": "HTTPS",
    }
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert {
        "--leader-elect",
        "--leader-elect-resource-namespace=kube-system",
        "--leader-elect-resource-name=gpushare-extender",
        "--leader-elect-lease-duration=8",
        "--leader-elect-renew-deadline=6",
        "--leader-elect-retry-period=1",
    } <= set(args)
    assert main["env"] == [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    anti = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti[0]["podAffinityTerm"]["labelSelector"]["matchLabels"]
        == (spec["selector"]["matchLabels"])
    )
    budget = find(default_objects, "PodDisruptionBudget", "gpushare-extender")
    assert budget["spec"] == {
        "minAvailable": 1,
        "selector": {"matchLabels": spec["selector"]["matchLabels"]},
    }
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]
    assert {"name": "tls", "mountPath": "/etc/gpushare/tls", "readOnly": True} in (
        main["volumeMounts"]
    )
    assert {"name": "tls", "secret": {"secretName": "gpushare-extender-tls"}} in (
        spec["template"]["spec"]["volumes"]
    )
    # A renewed certificate or client CA restarts the extender.
    assert set(spec["template"]["metadata"]["annotations"]) == {
        "checksum/tls",
        "checksum/client-tls",
    }
    service = find(default_objects, "Service", "gpushare-extender")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["port"] == 12345

    tls = render_objects(
        {"extender": {"tls": {"enabled": True, "secretName": "ext-tls", "clientCA": True}}},
        helm=helm,
    )
    main = container(find(tls, "Deployment", "gpushare-extender"))
    assert {
        "--tls-cert=/etc/gpushare/tls/tls.crt",
        "--tls-key=/etc/gpushare/tls/tls.key",
        "--tls-client-ca=/etc/gpushare/tls/ca.crt",
        "--tls-client-auth=required",
    } <= set(_args(main))
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"  # needs no certificate
    assert not [o for o in tls if o["kind"] == "Secret"]  # bring your own: nothing generated

    optional = render_objects(
        {"extender": {"tls": {"clientAuth": {"mode": "optional"}}}}, helm=helm
    )
    assert "--tls-client-auth=optional" in _args(
        container(find(optional, "Deployment", "gpushare-extender"))
    )
    off = render_objects({"extender": {"tls": {"clientAuth": {"mode": "off"}}}}, helm=helm)
    main = container(find(off, "Deployment", "gpushare-extender"))
    assert not any(a.startswith("--tls-client") for a in _args(main))
    assert [o["metadata"]["name"] for o in off if o["kind"] == "Secret"] == [
        "gpushare-extender-tls"
    ]
    (entry,) = scheduler_config(find(off, "ConfigMap", "gpushare-default-scheduler-config"))[
        "extenders"
    ]
    assert "certFile" not in entry["tlsConfig"]

    plain = render_objects({"extender": PLAIN_HTTP}, helm=helm)
    deployment = find(plain, "Deployment", "gpushare-extender")
    main = container(deployment)
    assert not any(a.startswith("--tls") for a in _args(main))
    assert main["readinessProbe"]["httpGet"]["scheme"] == "HTTP"
    assert [v["name"] for v in deployment["spec"]["template"]["spec"]["volumes"]] == ["tmp"]
    assert not [o for o in plain if o["kind"] == "Secret"]


def test_extender_replicas_and_leader_election(helm: Path) -> None:
    single = render_objects({"extender": {"replicas": 1}}, helm=helm)
    deployment = find(single, "Deployment", "gpushare-extender")
    assert deployment["spec"]["replicas"] == 1
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    assert not [o for o in single if o["kind"] == "PodDisruptionBudget"]
    assert "--leader-elect" in _args(container(deployment))  # hands over on a rolling update
    off = render_objects(
        {"extender": {"replicas": 1, "leaderElection": {"enabled": False}}}, helm=helm
    )
    deployment = find(off, "Deployment", "gpushare-extender")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--leader-elect" not in _args(container(deployment))
    assert not [
        o for o in off if o["kind"] == "Role" and "leader-election" in o["metadata"]["name"]
    ]
    with pytest.raises(HelmError, match=r"needs extender\.leaderElection\.enabled"):
        render_objects({"extender": {"leaderElection": {"enabled": False}}}, helm=helm)


def test_extender_lease_role_is_exactly_what_the_elector_needs(
    default_objects: list[Obj],
) -> None:
    role = find(default_objects, "Role", "gpushare-extender-leader-election")
    assert role["metadata"]["namespace"] == "kube-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": ["gpushare-extender"],
            "verbs": ["get", "update"],
        },
    ]
    binding = find(default_objects, "RoleBinding", "gpushare-extender-leader-election")
    assert binding["roleRef"]["name"] == "gpushare-extender-leader-election"
    assert binding["subjects"][0]["name"] == "gpushare-extender"


def test_device_plugin_daemonset(helm: Path, default_objects: list[Obj]) -> None:
    daemonset = find(default_objects, "DaemonSet", "gpushare-device-plugin")
    pod = daemonset["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpushare": "true"}
    assert pod["serviceAccountName"] == "gpushare-device-plugin"
    assert pod["volumes"] == [
        {
            "name": "device-plugins",
            "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
        },
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
        {"name": "host-proc", "hostPath": {"path": "/proc", "type": "Directory"}},
        {
            "name": "share-view",
            "hostPath": {"path": "/var/lib/gpushare/lib", "type": "DirectoryOrCreate"},
        },
    ]
    main = container(daemonset)
    assert main["volumeMounts"] == [
        {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True},
        {"name": "share-view", "mountPath": "/var/lib/gpushare/lib"},
    ]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert main["securityContext"]["runAsUser"] == 0
    assert main["securityContext"]["privileged"] is False
    env = {e["name"]: e for e in main["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert main["ports"] == [{"name": "metrics", "containerPort": 9445, "protocol": "TCP"}]
    args = _args(main)
    assert args[0] == "device-plugin"
    assert "--memory-unit=GiB" in args
    assert "--metrics-port=9445" in args
    assert "--proc-root=/host/proc" in args
    assert "--share-library-dir=/var/lib/gpushare/lib" in args  # shareView on by default
    assert _flag_names(args) <= flags(device_plugin)
    assert "runtimeClassName" not in pod

    demo = render_objects(
        {
            "memoryUnit": "MiB",
            "devicePlugin": {"fakeGpus": "2x16GiB:T4", "mps": True, "runtimeClassName": "nvidia"},
        },
        helm=helm,
    )
    daemonset = find(demo, "DaemonSet", "gpushare-device-plugin")
    args = _args(container(daemonset))
    assert {"--memory-unit=MiB", "--fake-gpus=2x16GiB:T4", "--no-health", "--mps"} <= set(args)
    assert _flag_names(args) <= flags(device_plugin)
    assert daemonset["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert not any(a.startswith("--dialects") for a in args)

    dialects = render_objects(
        {"devicePlugin": {"dialects": ["tencent", "hami"], "splitCount": 4}}, helm=helm
    )
    args = _args(container(find(dialects, "DaemonSet", "gpushare-device-plugin")))
    assert {"--dialects=tencent,hami", "--split-count=4"} <= set(args)
    assert _flag_names(args) <= flags(device_plugin)

    quiet = render_objects(
        {"devicePlugin": {"metricsPort": 0, "hostProc": False}, "shareView": {"enabled": False}},
        helm=helm,
    )
    daemonset = find(quiet, "DaemonSet", "gpushare-device-plugin")
    main = container(daemonset)
    assert "--metrics-port=0" in _args(main)
    assert "ports" not in main
    assert not any(a.startswith(("--proc-root", "--share-library")) for a in _args(main))
    assert [v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]] == [
        "device-plugins",
        "tmp",
    ]


def test_the_node_config_configmap_carries_the_values_the_plugin_reads(helm: Path) -> None:
    """devicePlugin.nodeConfig becomes ConfigMap gpushare-node-config, read by the plugin's
    own reader into the configuration the values say; the plugin finds it through
    POD_NAMESPACE; ``enabled: false`` drops it, its Role, and passes ``--no-node-config``."""
    values = {
        "devicePlugin": {
            "nodeConfig": {
                "defaults": {"reservedMemory": "5%"},
                "nodes": [
                    {"name": "gpu-1", "memoryUnit": "MiB", "excludeGpus": [1]},
                    {"selector": {"pool": "training"}, "serves": "whole"},
                ],
            }
        }
    }
    objects = render_objects(values, helm=helm)
    configmap = find(objects, "ConfigMap", "gpushare-node-config")
    config = node_config(configmap, "gpu-1", {"pool": "training"}, load=nodeconfig.yaml_document)
    assert config == NodeConfig(
        memory_unit=MemoryUnit.MIB,
        reserved=MemoryReserve(fraction=Fraction(1, 20)),
        excluded_indices=frozenset({1}),
        serves=Serves.WHOLE,
    )
    main = container(find(objects, "DaemonSet", "gpushare-device-plugin"))
    env = {e["name"]: e for e in main["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert "--no-node-config" not in _args(main)

    off = render_objects({"devicePlugin": {"nodeConfig": {"enabled": False}}}, helm=helm)
    assert not [o for o in off if "node-config" in o["metadata"]["name"]]
    assert "--no-node-config" in _args(container(find(off, "DaemonSet", "gpushare-device-plugin")))


def test_device_plugin_with_managed_mps(helm: Path, default_objects: list[Obj]) -> None:
    """``devicePlugin.mpsManaged`` (docs/usage.md, "Enforced shares (MPS)"): the flags, SYS_ADMIN
    for the compute mode, the driver's compute capability for the MPS binaries, the host directory
    and its shm/ as /dev/shm, a PID namespace shared with the pause container (which reaps the
    daemon); off by default; refused with fake GPUs."""
    default = container(find(default_objects, "DaemonSet", "gpushare-device-plugin"))
    assert not any(a.startswith("--mps") for a in _args(default))
    assert "add" not in default["securityContext"]["capabilities"]
    default_pod = find(default_objects, "DaemonSet", "gpushare-device-plugin")["spec"]["template"]
    assert "shareProcessNamespace" not in default_pod["spec"]

    values = {"devicePlugin": {"mpsManaged": {"enabled": True, "root": "/run/mps"}}}
    daemonset = find(render_objects(values, helm=helm), "DaemonSet", "gpushare-device-plugin")
    main = container(daemonset)
    args = _args(main)
    assert {"--mps-managed", "--mps-root=/run/mps"} <= set(args)
    assert _flag_names(args) <= flags(device_plugin)
    assert main["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    mounts = {m["name"]: m["mountPath"] for m in main["volumeMounts"]}
    assert (mounts["mps-root"], mounts["mps-shm"]) == ("/run/mps", "/dev/shm")
    volumes = {
        v["name"]: v.get("hostPath") for v in daemonset["spec"]["template"]["spec"]["volumes"]
    }
    assert volumes["mps-root"] == {"path": "/run/mps", "type": "DirectoryOrCreate"}
    assert volumes["mps-shm"] == {"path": "/run/mps/shm", "type": "DirectoryOrCreate"}
    # the pause container reaps the daemonized MPS processes when they exit
    assert daemonset["spec"]["template"]["spec"]["shareProcessNamespace"] is True

    with pytest.raises(HelmError, match=r"mpsManaged\.enabled needs real GPUs"):
        render_objects(
            {"devicePlugin": {"fakeGpus": "1x16GiB", "mpsManaged": {"enabled": True}}}, helm=helm
        )


# ---- authenticated by default: TLS, NetworkPolicy, the device plugin's own node ----------------


def _load_pair(context: ssl.SSLContext, secret: Obj) -> None:
    """Load ``tls.crt``/``tls.key`` of a Secret (base64 ``data``) into ``context``."""
    data = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    with tempfile.TemporaryDirectory(prefix="gpushare-tls-") as tmp:
        (Path(tmp) / "tls.crt").write_bytes(data["tls.crt"])
        (Path(tmp) / "tls.key").write_bytes(data["tls.key"])
        context.load_cert_chain(Path(tmp) / "tls.crt", Path(tmp) / "tls.key")


def _handshake(
    secret: Obj,
    ca_pem: str,
    server_name: str,
    *,
    client_ca_pem: str | None = None,
    client_secret: Obj | None = None,
) -> None:
    """A TLS handshake over a socket pair: the server presents the Secret's certificate, the
    client checks it against ``ca_pem`` for ``server_name``; with ``client_ca_pem`` the server
    requires a client certificate that CA signed, and the client presents ``client_secret``'s
    (``ssl.SSLError`` if any check fails)."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_pair(server, secret)
    if client_ca_pem is not None:
        server.load_verify_locations(cadata=client_ca_pem)
        server.verify_mode = ssl.CERT_REQUIRED
    client = ssl.create_default_context(cadata=ca_pem)
    if client_secret is not None:
        _load_pair(client, client_secret)
    ours, theirs = socket.socketpair()

    def serve() -> None:
        with (
            contextlib.suppress(ssl.SSLError, OSError),
            server.wrap_socket(theirs, server_side=True) as served,
        ):
            if served.recv(1) == b"x":  # the handshake, client certificate included, passed
                served.sendall(b"ok")

    thread = threading.Thread(target=serve)
    thread.start()
    try:
        with client.wrap_socket(ours, server_hostname=server_name) as wrapped:
            wrapped.settimeout(5)
            wrapped.sendall(b"x")  # TLS 1.3 checks a client certificate after the handshake
            if wrapped.recv(2) != b"ok":
                raise ssl.SSLError("the server refused the client certificate")
    finally:
        ours.close()
        thread.join(5)
        theirs.close()


def test_the_generated_certificate_is_for_the_service_and_the_schedulers_trust_it(
    helm: Path,
) -> None:
    """source=helm (auto, no cert-manager): a CA and a serving certificate in a kubernetes.io/tls
    Secret; the CA the default scheduler's ConfigMap carries is the Secret's and verifies the
    certificate for the scheduler entries' serverName (and the pinned cluster IP)."""
    objects = render_objects({"extender": {"service": {"clusterIP": "10.96.0.250"}}}, helm=helm)
    secret = find(objects, "Secret", "gpushare-extender-tls")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    configmap = find(objects, "ConfigMap", "gpushare-default-scheduler-config")
    ca_pem = configmap["data"]["extender-ca.crt"]
    assert ca_pem.encode() == base64.b64decode(secret["data"]["ca.crt"])
    (entry,) = scheduler_config(configmap)["extenders"]
    for name in (entry["tlsConfig"]["serverName"], "gpushare-extender", "10.96.0.250"):
        _handshake(secret, ca_pem, name)
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(secret, ca_pem, "gpushare-extender.other-namespace.svc")
    other_ca = render_objects(helm=helm)  # a fresh render: another CA
    wrong = base64.b64decode(find(other_ca, "Secret", "gpushare-extender-tls")["data"]["ca.crt"])
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(secret, wrong.decode(), SERVER_NAME)


def test_the_generated_client_certificate_is_one_the_extender_accepts(helm: Path) -> None:
    """The client Secret (helm): kube-scheduler's certificate, signed by the client CA that the
    extender checks callers against (its ca.crt); a fresh render's certificate (another client
    CA) is refused, as is a client without one."""
    objects = render_objects(helm=helm)
    serving = find(objects, "Secret", "gpushare-extender-tls")
    client = find(objects, "Secret", "gpushare-extender-client")
    assert client["type"] == "kubernetes.io/tls"
    assert set(client["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    ca_pem = base64.b64decode(serving["data"]["ca.crt"]).decode()
    client_ca = base64.b64decode(client["data"]["ca.crt"]).decode()
    assert client_ca != ca_pem  # its own CA: the serving one stays as the hosts know it
    _handshake(serving, ca_pem, SERVER_NAME, client_ca_pem=client_ca, client_secret=client)
    other = find(render_objects(helm=helm), "Secret", "gpushare-extender-client")
    with pytest.raises(ssl.SSLError):
        _handshake(serving, ca_pem, SERVER_NAME, client_ca_pem=client_ca, client_secret=other)
    with pytest.raises(ssl.SSLError):
        _handshake(serving, ca_pem, SERVER_NAME, client_ca_pem=client_ca)


def test_cert_manager_issues_the_certificate_when_the_cluster_has_it(helm: Path) -> None:
    objects = render_objects(args=("--api-versions", "cert-manager.io/v1"), helm=helm)
    issued = {
        (o["kind"], o["metadata"]["name"]) for o in objects if "cert-manager" in o["apiVersion"]
    }
    assert issued == {
        ("Issuer", "gpushare-extender-selfsigned"),
        ("Certificate", "gpushare-extender-ca"),
        ("Issuer", "gpushare-extender-ca"),
        ("Certificate", "gpushare-extender"),
    }
    # cert-manager writes the serving Secret; kube-scheduler's client certificate is helm's
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "Secret"] == [
        "gpushare-extender-client"
    ]
    serving = find(objects, "Certificate", "gpushare-extender")["spec"]
    assert serving["secretName"] == "gpushare-extender-tls"
    assert SERVER_NAME in serving["dnsNames"]
    assert serving["issuerRef"] == {"kind": "Issuer", "name": "gpushare-extender-ca"}
    assert serving["duration"] == "87600h"
    assert find(objects, "Certificate", "gpushare-extender-ca")["spec"]["isCA"] is True
    configmap = find(objects, "ConfigMap", "gpushare-default-scheduler-config")
    assert set(configmap["data"]) == {"kube-scheduler-config.yaml"}  # the CA is in the Secret
    assert scheduler_config(configmap)["extenders"] == [
        with_tls(SERVICE_URL, HOST_CA_FILE, **HOST_CLIENT)
    ]
    # The value chooses too; and a Secret of yours wins over both.
    chosen = render_objects({"extender": {"tls": {"source": "cert-manager"}}}, helm=helm)
    assert find(chosen, "Certificate", "gpushare-extender")
    yours = render_objects(
        {"extender": {"tls": {"secretName": "mine"}}},
        args=("--api-versions", "cert-manager.io/v1"),
        helm=helm,
    )
    assert not [o for o in yours if o["kind"] in {"Certificate", "Issuer"}]
    assert [o["metadata"]["name"] for o in yours if o["kind"] == "Secret"] == [
        "gpushare-extender-client"
    ]
    volumes = find(yours, "Deployment", "gpushare-extender")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "mine"}} in volumes


@pytest.mark.parametrize(
    ("tls", "complaint"),
    [
        ({"source": "secret"}, "needs extender.tls.secretName"),
        ({"clientCA": True}, "extender.tls.clientCA needs a CA"),
    ],
    ids=["secret without a name", "mutual TLS without a CA key"],
)
def test_tls_values_that_cannot_work_are_refused(
    helm: Path, tls: dict[str, Any], complaint: str
) -> None:
    with pytest.raises(HelmError, match=complaint):
        render_objects({"extender": {"tls": tls}}, helm=helm)


def test_scheduler_tls_config_goes_on_top_of_the_charts(helm: Path) -> None:
    objects = render_objects(
        {"scheduler": {"tlsConfig": {"caData": "Y2E=", "certFile": "/etc/c.crt"}}}, helm=helm
    )
    (entry,) = scheduler_config(find(objects, "ConfigMap", "gpushare-default-scheduler-config"))[
        "extenders"
    ]
    assert entry["tlsConfig"] == {
        "serverName": SERVER_NAME,
        "caData": "Y2E=",
        "certFile": "/etc/c.crt",
    }


SCHEDULER_PEER = {
    "podSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "gpushare",
            "app.kubernetes.io/instance": "gpushare",
            "app.kubernetes.io/component": "scheduler",
        }
    }
}


@pytest.mark.parametrize(
    ("values", "peers"),
    [
        ({}, None),  # wiring (a) and no CIDRs yet: nobody (the node itself always may)
        ({"scheduler": {"second": {"enabled": True}}}, [SCHEDULER_PEER]),
        (
            {"extender": {"networkPolicy": {"controlPlaneCIDRs": ["192.0.2.10/32"]}}},
            [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
        ),
        (
            {
                "scheduler": {"second": {"enabled": True}},
                "extender": {
                    "networkPolicy": {
                        "controlPlaneCIDRs": ["192.0.2.10/32", "2001:db8::/64"],
                        "from": [{"namespaceSelector": {"matchLabels": {"n": "monitoring"}}}],
                    }
                },
            },
            [
                SCHEDULER_PEER,
                {"ipBlock": {"cidr": "192.0.2.10/32"}},
                {"ipBlock": {"cidr": "2001:db8::/64"}},
                {"namespaceSelector": {"matchLabels": {"n": "monitoring"}}},
            ],
        ),
        ({"serviceMonitor": {"enabled": True}}, [PROMETHEUS_PEER]),
        (
            {
                "extender": {
                    "networkPolicy": {
                        "prometheus": {
                            "enabled": True,
                            "namespace": "obs",
                            "podLabels": {"a": "vm"},
                        }
                    }
                }
            },
            [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "obs"}},
                    "podSelector": {"matchLabels": {"a": "vm"}},
                }
            ],
        ),
    ],
    ids=[
        "default",
        "second scheduler",
        "control-plane hosts",
        "all peers",
        "the ServiceMonitor admits Prometheus",
        "Prometheus of another namespace and labels",
    ],
)
def test_only_kube_scheduler_may_reach_the_extender(
    helm: Path, values: dict[str, Any], peers: list[Obj] | None
) -> None:
    objects = render_objects(values, helm=helm)
    policy = find(objects, "NetworkPolicy", "gpushare-extender")["spec"]
    deployment = find(objects, "Deployment", "gpushare-extender")
    assert policy["podSelector"] == deployment["spec"]["selector"]
    assert policy["policyTypes"] == ["Ingress"]
    # the replicas reach the leader's peer port (mutual TLS), and only that
    replicas = {
        "ports": [{"port": "peer", "protocol": "TCP"}],
        "from": [{"podSelector": deployment["spec"]["selector"]}],
    }
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "peer", "containerPort": 12346, "protocol": "TCP"} in container["ports"]
    if peers is None:  # never a rule without `from`: that would admit anyone
        assert policy["ingress"] == [replicas]
    else:
        assert policy["ingress"] == [
            {"ports": [{"port": "http", "protocol": "TCP"}], "from": peers},
            replicas,
        ]
    if values.get("scheduler"):
        labels = find(objects, "Deployment", "gpushare-scheduler")["spec"]["template"]["metadata"][
            "labels"
        ]
        assert SCHEDULER_PEER["podSelector"]["matchLabels"].items() <= labels.items()
    off = render_objects({"extender": {"networkPolicy": {"enabled": False}}}, helm=helm)
    assert not [o for o in off if o["kind"] == "NetworkPolicy"]


def test_the_device_plugin_is_held_to_its_own_node(helm: Path) -> None:
    """The ValidatingAdmissionPolicy's shape; tests/cluster/test_deploy_chart.py proves it on
    the API server."""
    objects = render_objects(namespace="gpu-system", helm=helm)
    name = "gpushare-device-plugin-own-node"
    policy = find(objects, "ValidatingAdmissionPolicy", name)
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["UPDATE"],
            "resources": ["nodes", "nodes/status", "pods"],
        }
    ]
    (condition,) = spec["matchConditions"]
    assert '"system:serviceaccount:gpu-system:gpushare-device-plugin"' in condition["expression"]
    assert "authentication.kubernetes.io/node-name" in spec["variables"][0]["expression"]
    binding = find(objects, "ValidatingAdmissionPolicyBinding", name)
    assert binding["spec"] == {"policyName": name, "validationActions": ["Deny"]}
    off = render_objects({"devicePlugin": {"restrictToOwnNode": False}}, helm=helm)
    assert not [o for o in off if "ValidatingAdmissionPolicy" in o["kind"]]


# ---- image ---------------------------------------------------------------------------------


def test_the_grafana_dashboard_ships_as_a_sidecar_configmap(helm: Path) -> None:
    objects = render_objects(
        {"grafanaDashboard": {"enabled": True, "namespace": "monitoring"}}, helm=helm
    )
    (configmap,) = [o for o in objects if o["metadata"]["name"] == "gpushare-grafana-dashboard"]
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(configmap["data"]["gpushare-dashboard.json"])
    source = CHART_DIR / "dashboards" / "gpushare-dashboard.json"
    assert shipped == json.loads(source.read_text(encoding="utf-8"))
    assert not [o for o in render_objects(helm=helm) if "grafana" in o["metadata"]["name"]]


EXTENDER_ENDPOINT_TLS = {
    "scheme": "https",
    "tlsConfig": {
        "serverName": SERVER_NAME,
        "ca": {"secret": {"name": "gpushare-extender-tls", "key": "ca.crt"}},
    },
}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param({}, {}, id="off-by-default"),
        pytest.param(
            {"serviceMonitor": {"enabled": True, "labels": {"release": "kps"}}},
            {("ServiceMonitor", "gpushare-extender"): EXTENDER_ENDPOINT_TLS},
            id="extender-over-https-checked-against-the-release-ca",
        ),
        pytest.param(
            {"serviceMonitor": {"enabled": True}, "extender": {"tls": {"enabled": False}}},
            {("ServiceMonitor", "gpushare-extender"): {"scheme": "http"}},
            id="extender-over-plain-http-without-tls",
        ),
        pytest.param(
            {"podMonitor": {"enabled": True, "labels": {"release": "kps"}, "interval": "15s"}},
            {("PodMonitor", "gpushare-device-plugin"): {"port": "metrics", "interval": "15s"}},
            id="device-plugin-metrics-port",
        ),
        pytest.param(
            {"podMonitor": {"enabled": True}, "devicePlugin": {"metricsPort": 0}},
            {},
            id="no-pod-monitor-when-the-plugin-serves-no-metrics",
        ),
        pytest.param(
            {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
            {
                ("ServiceMonitor", "gpushare-extender"): {"port": "http", "path": "/metrics"},
                ("PodMonitor", "gpushare-device-plugin"): {"port": "metrics", "path": "/metrics"},
            },
            id="both",
        ),
    ],
)
def test_prometheus_scrapes_the_extender_and_the_device_plugin_when_asked(
    helm: Path, values: dict[str, Any], expected: dict[tuple[str, str], Obj]
) -> None:
    """ServiceMonitor (extender Service, port http) and PodMonitor (device plugin pods, port
    metrics) for the Prometheus Operator, off by default, each selecting exactly its
    component's objects in the release namespace; docs/install.md, "Monitoring"."""
    objects = render_objects(values, helm=helm)
    monitors = {
        (o["kind"], o["metadata"]["name"]): o
        for o in objects
        if o["kind"] in {"ServiceMonitor", "PodMonitor"}
    }
    assert set(monitors) == set(expected)
    for (kind, name), fields in expected.items():
        monitor = monitors[kind, name]
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["namespace"] == "kube-system"
        key = "serviceMonitor" if kind == "ServiceMonitor" else "podMonitor"
        labels = values[key].get("labels", {})
        assert labels.items() <= monitor["metadata"]["labels"].items()
        spec = monitor["spec"]
        assert spec["namespaceSelector"] == {"matchNames": ["kube-system"]}
        if kind == "ServiceMonitor":
            service = find(objects, "Service", name)
            assert spec["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
            assert [p["name"] for p in service["spec"]["ports"]] == ["http"]
            (endpoint,) = spec["endpoints"]
        else:
            daemonset = find(objects, "DaemonSet", name)
            assert spec["selector"] == daemonset["spec"]["selector"]
            ports = container(daemonset)["ports"]
            assert [p["name"] for p in ports] == ["metrics"]
            (endpoint,) = spec["podMetricsEndpoints"]
        assert endpoint["path"] == "/metrics"
        assert endpoint["interval"] == fields.get("interval", "30s")
        assert fields.items() <= endpoint.items()


@pytest.mark.parametrize(
    ("values", "says"),
    [
        pytest.param(
            {"scheduler": {"second": {"enabled": True}}},
            [
                "registry.k8s.io/kube-scheduler:v1.",
                "helm's own",
                "default with helm template or --dry-run=client",
                "must not be newer than the API server",
                "--set scheduler.second.image.tag=",
            ],
            id="helms-version-and-how-to-choose",
        ),
        pytest.param(
            {"scheduler": {"second": {"enabled": True, "image": {"tag": "v1.31.4"}}}},
            [
                "registry.k8s.io/kube-scheduler:v1.31.4",
                "(scheduler.second.image.tag)",
                "must not be newer than the API server",
            ],
            id="the-tag-set",
        ),
        pytest.param(
            {"serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True}},
            [
                "ServiceMonitor gpushare-extender and PodMonitor gpushare-device-plugin",
                "admits Prometheus from namespace monitoring",
            ],
            id="the-monitors",
        ),
    ],
)
def test_the_install_notes_say_what_was_chosen(
    helm: Path, values: dict[str, Any], says: list[str]
) -> None:
    notes = render_notes(values, helm=helm)
    for text in says:
        assert text in notes, notes


def test_the_notes_name_no_scheduler_image_without_the_second_scheduler(helm: Path) -> None:
    assert "kube-scheduler:" not in render_notes(helm=helm)


def test_the_alert_rules_header_names_the_charts_value() -> None:
    """The rules file says how the chart ships it with a value that exists."""
    header = (CHART_DIR / "alerts" / "gpushare-alerts.yaml").read_text(encoding="utf-8")
    named = re.findall(r"`([A-Za-z.]+)=true`", header.split("groups:")[0])
    assert named == ["prometheusRule.enabled"]
    (values,) = parse_yaml((CHART_DIR / "values.yaml").read_text(encoding="utf-8"))
    assert values["prometheusRule"]["enabled"] is False


def test_dockerfile_structure() -> None:
    """The Dockerfile's shape (tests/node/test_chart_on_node.py builds and runs the image)."""
    text = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert stages == [
        "FROM ${PYTHON_IMAGE} AS deps",
        "FROM deps AS app",
        "FROM ${PYTHON_IMAGE} AS native",
        "FROM ${PYTHON_IMAGE} AS runtime",
    ]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    deps = lines[lines.index(stages[0]) : lines.index(stages[1])]
    native = lines[lines.index(stages[2]) : lines.index(stages[3])]
    runtime = lines[lines.index(stages[3]) :]
    # The share-view library is compiled in a stage of its own; only the library reaches the
    # runtime, which has no compiler (docs/share-view.md).
    assert "RUN bash scripts/build-native.sh build/native" in native
    assert [ln for ln in runtime if "--from=native" in ln] == [
        "COPY --from=native /src/build/native/libgpushare-share.so "
        "/opt/gpushare/lib/libgpushare-share.so"
    ]
    assert not any("gcc" in ln for ln in runtime)
    # The dependencies' layer is made from pyproject.toml and the pins alone: src/ changes do
    # not rebuild it.
    assert not any(ln.startswith("COPY src") for ln in deps)
    assert "COPY pyproject.toml constraints.txt README.md ./" in deps
    # The runtime dependencies of the distribution gpushare-k8s at the pinned versions, without
    # the simulator's extra: the stub stands in for it, then goes.
    deps_text = "\n".join(deps)
    assert re.search(
        r"/opt/gpushare/venv/bin/pip install --constraint constraints.txt \. ", deps_text
    )
    assert "pip uninstall --yes gpushare-k8s" in deps_text
    assert "[sim" not in text
    assert "MPLCONFIGDIR" not in text
    assert not any(ln.startswith("COPY . ") or ln.startswith("COPY src") for ln in runtime)
    # No RUN --mount=from a stage: buildah's layer cache (< 1.29) reuses such a step after the
    # stage changed (containers/buildah#4522); COPY --from is cached by content.
    assert "--mount" not in text
    (user,) = [ln for ln in runtime if ln.startswith("USER ")]
    assert re.fullmatch(r"USER [1-9][0-9]*:[1-9][0-9]*", user), user
    assert runtime[-2:] == ['ENTRYPOINT ["gpushare"]', 'CMD ["extender"]']
    # The chart runs the extender as that user and the device plugin as root.
    uid = int(user.split()[1].split(":")[0])
    chart = (CHART_DIR / "templates" / "extender.yaml").read_text(encoding="utf-8")
    assert f"runAsUser: {uid}" in chart

    ignored = set((REPO_ROOT / ".dockerignore").read_text(encoding="utf-8").split("\n"))
    assert {".git", ".venv", "out", "tests", "**/__pycache__", ".pytest_cache"} <= ignored
    assert {".mypy_cache", ".ruff_cache", ".hypothesis"} <= ignored
    assert not {"src", "pyproject.toml", "constraints.txt", "README.md"} & ignored
    # The test harness and the demo stay out of the image (the wheel leaves them out too:
    # tests/test_packaging.py).
    assert {"src/gpushare/testing", "src/gpushare/demo"} <= ignored


def test_the_openssl_recipe_for_the_plain_manifests_makes_a_secret_they_can_use(
    tmp_path: Path,
) -> None:
    """docs/install.md, "With plain manifests": its openssl commands (run as written, up to the
    kubectl that stores them) make a certificate that the CA verifies for the serverName the
    manifests' scheduler entries check."""
    docs = (REPO_ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    section = docs[docs.index("## With plain manifests") :]
    block = section[section.index("```sh\n") + 6 : section.index("\nkubectl ")]
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, capture_output=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode()
    secret = {
        "data": {
            key: base64.b64encode((tmp_path / key).read_bytes()).decode()
            for key in ("tls.crt", "tls.key")
        }
    }
    ca_pem = (tmp_path / "ca.crt").read_text()
    manifest = parse_yaml((MANIFESTS_DIR / "gpushare.yaml").read_text(encoding="utf-8"))
    (entry,) = scheduler_config(find(manifest, "ConfigMap", "gpushare-default-scheduler-config"))[
        "extenders"
    ]
    _handshake(secret, ca_pem, entry["tlsConfig"]["serverName"])
    client = {
        "data": {
            key: base64.b64encode((tmp_path / "client" / key).read_bytes()).decode()
            for key in ("tls.crt", "tls.key")
        }
    }
    client_ca = (tmp_path / "client" / "ca.crt").read_text()
    _handshake(secret, ca_pem, entry["tlsConfig"]["serverName"], client_ca_pem=client_ca,
               client_secret=client)  # fmt: skip
    volumes = find(manifest, "Deployment", "gpushare-extender")["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "gpushare-extender-tls"}} in volumes["volumes"]
    assert "kubectl -n kube-system create secret generic gpushare-extender-tls" in section
    assert "kubectl -n kube-system create secret generic gpushare-extender-client" in section
    client_volume = {"secretName": "gpushare-extender-client",
                     "items": [{"key": "ca.crt", "path": "ca.crt"}]}  # fmt: skip
    assert {"name": "client-ca", "secret": client_volume} in volumes["volumes"]


# ---- the DRA driver (docs/dra.md) -------------------------------------------------------------

DRA_RULES = (  # gpushare.testing.rbac.DRA_DRIVER_RULES, what the driver's tests run with
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "create", "update", "list", "watch"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
)  # fmt: skip


@pytest.fixture(scope="module")
def with_dra(helm: Path) -> list[Obj]:
    return render_objects({"draDriver": {"enabled": True, "fakeGpus": "2x16GiB:T4"}}, helm=helm)


def test_the_dra_driver_is_off_by_default(default_objects: list[Obj]) -> None:
    assert not [o for o in default_objects if "dra-driver" in o["metadata"]["name"]]
    assert not [o for o in default_objects if o["kind"] == "DeviceClass"]
    plugin = find(default_objects, "DaemonSet", "gpushare-device-plugin")
    assert "affinity" not in plugin["spec"]["template"]["spec"]


def test_a_node_serves_the_device_plugin_or_the_dra_driver(with_dra: list[Obj]) -> None:
    """The driver runs on the labelled nodes, the device plugin keeps off them; the driver's
    flags are the command's, its rules the least it needs; the DeviceClass selects its
    devices."""
    driver = find(with_dra, "DaemonSet", "gpushare-dra-driver")
    spec = driver["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpushare.io/dra": "true"}
    plugin = find(with_dra, "DaemonSet", "gpushare-device-plugin")
    (term,) = plugin["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [
        {"key": "gpushare.io/dra", "operator": "NotIn", "values": ["true"]}
    ]
    args = container(driver)["args"]
    assert args[0] == "dra-driver"
    assert {a.split("=", 1)[0] for a in args[1:]} <= flags(dra_driver)
    assert "--fake-gpus=2x16GiB:T4" in args
    mounts = {m["mountPath"] for m in container(driver)["volumeMounts"]}
    assert mounts == {"/var/lib/kubelet/plugins", "/var/lib/kubelet/plugins_registry",
                      "/var/run/cdi", "/var/lib/gpushare/lib"}  # fmt: skip
    assert "--share-library-dir=/var/lib/gpushare/lib" in args
    role = find(with_dra, "ClusterRole", "gpushare-dra-driver")
    assert normalized(role["rules"]) == normalized(DRA_RULES)
    assert "--unhealthy-configmap" in args  # Alibaba's health list, read in kube-system
    marks = find(with_dra, "Role", "gpushare-dra-driver")
    assert marks["metadata"]["namespace"] == "kube-system"
    assert normalized(marks["rules"]) == normalized(unhealthy.RBAC_RULES)
    binding = find(with_dra, "ClusterRoleBinding", "gpushare-dra-driver")
    assert binding["subjects"][0]["name"] == spec["serviceAccountName"]
    device_class = find(with_dra, "DeviceClass", "gpushare-gpu")
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpu.gpushare.io"'}}
    ]


def test_the_dra_rules_are_the_tests_rules() -> None:
    assert normalized(r.to_dict() for r in DRA_DRIVER_RULES) == normalized(DRA_RULES)


def test_with_dra_the_extender_scores_claim_pods_through_a_second_entry(
    with_dra: list[Obj], helm: Path
) -> None:
    """``draDriver.scoreNodes`` (on by default with the driver): ``--dra-scoring``, list/watch
    on slices and claims, and a second entry without managedResources in the scheduler
    configuration, as the tests wire it (``gpushare_dra_extender``)."""
    extender_ = find(with_dra, "Deployment", "gpushare-extender")
    assert "--dra-scoring" in container(extender_)["args"]
    assert "--dra-scoring" in flags(extender)
    role = find(with_dra, "ClusterRole", "gpushare-extender")
    assert normalized(role["rules"]) == normalized(
        [*EXTENDER_RULES, *(r.to_dict() for r in DRA_SCORING_RULES)]
    )
    config = scheduler_config(find(with_dra, "ConfigMap", "gpushare-default-scheduler-config"))
    tls = {"serverName": SERVER_NAME, "caFile": HOST_CA_FILE, **HOST_CLIENT}
    assert config["extenders"] == [
        with_tls(SERVICE_URL, HOST_CA_FILE, **HOST_CLIENT),
        {**gpushare_dra_extender(SERVICE_URL), "enableHTTPS": True, "tlsConfig": tls},
    ]
    off = render_objects(
        {"draDriver": {"enabled": True, "fakeGpus": "2x16GiB:T4", "scoreNodes": False}},
        helm=helm,
    )
    assert "--dra-scoring" not in container(find(off, "Deployment", "gpushare-extender"))["args"]
    off_config = scheduler_config(find(off, "ConfigMap", "gpushare-default-scheduler-config"))
    assert off_config["extenders"] == [with_tls(SERVICE_URL, HOST_CA_FILE, **HOST_CLIENT)]
