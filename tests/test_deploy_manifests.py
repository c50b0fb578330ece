"""The deployment artefacts in ``deploy/`` and the image, without a cluster.

The chart is rendered by a real helm (``scripts/build-helm.sh``; ``gpushare.testing.helm``
builds it when missing, never skips). Proved here: the committed manifests are exactly a fresh
render; helm refuses values the schema forbids; the ClusterRoles are exactly the rules the code
needs (``gpushare.kube.nodes``/``nodepods`` ``RBAC_RULES`` for the device plugin, docs/extender.md
for the extender); every kube-scheduler configuration the chart and ``deploy/scheduler`` carry
has gpushare's extender entry (``gpushare.testing.controlplane.gpushare_extender``); the
workloads pass only flags the commands have; the legacy Policy file is marked legacy; the
Dockerfile has its stages, a non-root user and the ``gpushare`` entry point.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import click
import pytest

from gpushare.cli.deviceplugin import device_plugin
from gpushare.cli.extender import extender
from gpushare.core.policies import policy_names
from gpushare.kube import nodepods, nodes
from gpushare.testing.controlplane import REPO_ROOT, gpushare_extender
from gpushare.testing.helm import (
    CHART_DIR,
    MANIFESTS,
    MANIFESTS_DIR,
    HelmError,
    locate_helm,
    manifest_text,
    parse_yaml,
    render_objects,
)

SCHEDULER_DIR = REPO_ROOT / "deploy" / "scheduler"
EXTENDER_RULES = (  # docs/extender.md, "Running it": RBAC for its identity
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
)
SERVICE_URL = "http://gpushare-extender.kube-system.svc:12345/gpushare-scheduler"
Obj = dict[str, Any]


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
    (text,) = configmap["data"].values()
    (config,) = parse_yaml(text)
    return config


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
    "settings", ["scheduler.second.enabled=false", "scheduler.second.enabled=true"]
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
        ("DaemonSet", "gpushare-device-plugin"),
        ("Deployment", "gpushare-extender"),
        ("Service", "gpushare-extender"),
        ("ServiceAccount", "gpushare-device-plugin"),
        ("ServiceAccount", "gpushare-extender"),
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
        namespaced = obj["kind"] not in {"ClusterRole", "ClusterRoleBinding"}
        assert ("namespace" in obj["metadata"]) == namespaced, obj["metadata"]


# ---- values and their schema ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"memoryUnit": "KiB"}, "memoryUnit"),
        ({"extender": {"policy": "first-fit"}}, "policy"),
        ({"extender": {"replicas": 3}}, "replicas"),  # one extender per cluster: no such value
        ({"extender": {"service": {"type": "LoadBalancer"}}}, "type"),
        ({"extender": {"service": {"type": "NodePort", "nodePort": 80}}}, "nodePort"),
        ({"scheduler": {"httpTimeout": 30}}, "httpTimeout"),
        ({"scheduler": {"urlPrefix": "10.0.0.1:12345"}}, "urlPrefix"),
        ({"devicePlugin": {"devicePluginDir": "relative/dir"}}, "devicePluginDir"),
        ({"nodeSelector": {"gpushare": True}}, "nodeSelector"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
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


def test_extender_role_is_exactly_the_documented_rules(default_objects: list[Obj]) -> None:
    role = find(default_objects, "ClusterRole", "gpushare-extender")
    assert normalized(role["rules"]) == normalized(EXTENDER_RULES)
    docs = (REPO_ROOT / "docs" / "extender.md").read_text(encoding="utf-8")
    assert "`nodes` get/list/watch; `pods` get/list/watch; `pods/binding`\ncreate" in docs


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
    assert config["extenders"] == [gpushare_extender(SERVICE_URL)]


@pytest.mark.parametrize(
    ("values", "url", "https"),
    [
        (
            {"extender": {"service": {"clusterIP": "10.96.0.250"}}},
            "http://10.96.0.250:12345",
            False,
        ),
        (
            {"scheduler": {"urlPrefix": "http://192.0.2.7:31234/x"}},
            "http://192.0.2.7:31234/x",
            False,
        ),
        (
            {"extender": {"tls": {"enabled": True, "secretName": "t"}, "port": 8443}},
            "https://gpushare-extender.kube-system.svc:8443",
            True,
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
    assert entry == {**gpushare_extender(expected), "enableHTTPS": https}


def test_second_scheduler_config_and_deployment(with_scheduler: list[Obj]) -> None:
    config = scheduler_config(find(with_scheduler, "ConfigMap", "gpushare-scheduler-config"))
    assert config["profiles"] == [{"schedulerName": "gpushare-scheduler"}]
    assert config["leaderElection"] == {
        "leaderElect": True,
        "resourceName": "gpushare-scheduler",
        "resourceNamespace": "kube-system",
    }
    assert "clientConnection" not in config  # in-cluster: its ServiceAccount
    assert config["extenders"] == [gpushare_extender(SERVICE_URL)]
    deployment = find(with_scheduler, "Deployment", "gpushare-scheduler")
    main = container(deployment)
    assert main["image"] == "registry.k8s.io/kube-scheduler:v1.37.1"
    assert "--config=/etc/kubernetes/gpushare/kube-scheduler-config.yaml" in main["command"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "gpushare-scheduler"
    assert pod["volumes"][0]["configMap"]["name"] == "gpushare-scheduler-config"


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
    v1 = gpushare_extender("http://10.96.0.250:12345/gpushare-scheduler")
    # Policy spelling: enableHttps, and httpTimeout in integer nanoseconds.
    assert entry.pop("enableHttps") is v1.pop("enableHTTPS") is False
    assert entry.pop("httpTimeout") == 30_000_000_000
    v1.pop("httpTimeout")
    assert entry == v1
    readme = (SCHEDULER_DIR / "README.md").read_text(encoding="utf-8")
    assert "LEGACY: only clusters older than 1.23" in readme
    assert "--policy-config-file=/etc/kubernetes/legacy-policy.json" in readme


# ---- workloads -----------------------------------------------------------------------------


def _args(main: Obj) -> list[str]:
    return [str(a) for a in main.get("args", [])]


def _flag_names(args: Sequence[str]) -> set[str]:
    return {a.split("=", 1)[0] for a in args if a.startswith("--")}


def test_extender_deployment(helm: Path, default_objects: list[Obj]) -> None:
    deployment = find(default_objects, "Deployment", "gpushare-extender")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == "gpushare-extender"
    assert pod["securityContext"]["runAsNonRoot"] is True
    main = container(deployment)
    args = _args(main)
    assert args[0] == "extender"
    assert _flag_names(args) <= flags(extender)
    assert "--policy=binpack" in args
    assert "--port=12345" in args
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert main["env"] == [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in main["volumeMounts"]
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
    } <= set(_args(main))
    assert "tcpSocket" in main["readinessProbe"]  # mutual TLS: no client certificate in probes
    with pytest.raises(HelmError, match="secretName"):
        render_objects({"extender": {"tls": {"enabled": True}}}, helm=helm)


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
    ]
    main = container(daemonset)
    assert main["volumeMounts"] == [
        {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "host-proc", "mountPath": "/host/proc", "readOnly": True},
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

    quiet = render_objects({"devicePlugin": {"metricsPort": 0, "hostProc": False}}, helm=helm)
    daemonset = find(quiet, "DaemonSet", "gpushare-device-plugin")
    main = container(daemonset)
    assert "--metrics-port=0" in _args(main)
    assert "ports" not in main
    assert not any(a.startswith("--proc-root") for a in _args(main))
    assert [v["name"] for v in daemonset["spec"]["template"]["spec"]["volumes"]] == [
        "device-plugins",
        "tmp",
    ]


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


def test_dockerfile_structure() -> None:
    """No docker daemon in the test environment: the Dockerfile is checked for its shape."""
    text = (REPO_ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    stages = [ln for ln in lines if ln.upper().startswith("FROM ")]
    assert stages == ["FROM ${PYTHON_IMAGE} AS build", "FROM ${PYTHON_IMAGE} AS runtime"]
    assert "ARG PYTHON_IMAGE=python:3.11-slim" in lines
    # The runtime image installs the distribution without the simulator's extra (issue 13).
    assert "pip install --no-index --find-links=/wheels gpushare-k8s \\" in lines
    assert "[sim" not in text
    assert "MPLCONFIGDIR" not in text
    runtime = lines[lines.index(stages[1]) :]
    assert "pip wheel --wheel-dir /wheels ." in "\n".join(lines[: lines.index(stages[1])])
    assert not any(ln.startswith("COPY . ") or ln.startswith("COPY src") for ln in runtime)
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
    assert not {"src", "pyproject.toml", "README.md"} & ignored
