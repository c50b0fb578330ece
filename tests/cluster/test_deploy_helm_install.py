"""``helm install`` of the chart into the real control plane, then ``helm uninstall``.

The real helm (``scripts/build-helm.sh``) installs a release with the second scheduler on into
its own namespace of the test kube-apiserver: helm checks the chart's ``kubeVersion`` against
the server, creates every object, and reports the release deployed; the objects are there with
helm's ownership labels. ``helm uninstall`` removes them again (cluster-scoped ones included).
No pod runs (there is no kube-controller-manager to create them, nor a container runtime):
``tests/cluster/test_deploy_chart.py`` runs the components with the chart's identities and
configuration instead.

The default install is authenticated: helm generates the extender's certificate into a Secret,
and ``helm upgrade`` keeps it (``lookup``) — the extender's pod template (its certificate
checksum) does not change — until the Secret is deleted: the next upgrade issues a new one and
the checksum restarts the extender (docs/install.md, "TLS"). The NetworkPolicy and the device
plugin's ValidatingAdmissionPolicy are part of the release.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.operators import Operator
from lightkube.resources.admissionregistration_v1 import (
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Secret, Service, ServiceAccount
from lightkube.resources.networking_v1 import NetworkPolicy
from lightkube.resources.rbac_authorization_v1 import ClusterRole, ClusterRoleBinding

from gpushare.testing.controlplane import ControlPlane
from gpushare.testing.helm import CHART_DIR, helm_ok, helm_run

pytestmark = pytest.mark.cluster

RELEASE = "helmtest"
NAMESPACE = "gpushare-helm-install"
LABELS: dict[str, str | Operator[Any] | Iterable[Any] | None] = {
    "app.kubernetes.io/managed-by": "Helm",
    "app.kubernetes.io/instance": RELEASE,
}


INSTALL_ARGS = ("--set", "scheduler.second.enabled=true", "--set", "image.tag=0.1.0")
EXTENDER = f"{RELEASE}-gpushare-extender"


def owned(objects: Iterable[Any]) -> list[str]:
    return [o.metadata.name or "" for o in objects if o.metadata is not None]


def helm(plane: ControlPlane, *args: str) -> str:
    return helm_ok(plane.kubeconfig, *args)


def test_helm_install_creates_the_release_and_uninstall_removes_it(
    control_plane: ControlPlane, kube: Client
) -> None:
    helm(
        control_plane, "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
        "--create-namespace", *INSTALL_ARGS,
    )  # fmt: skip
    try:
        status = json.loads(helm(control_plane, "status", RELEASE, "-n", NAMESPACE, "-o", "json"))
        assert status["info"]["status"] == "deployed"
        manifest = helm(control_plane, "get", "manifest", RELEASE, "-n", NAMESPACE)
        kinds = {line.split(":", 1)[1].strip() for line in manifest.splitlines()
                 if line.startswith("kind:")}  # fmt: skip
        assert {"Deployment", "DaemonSet", "ClusterRole", "ClusterRoleBinding", "ConfigMap",
                "Service", "ServiceAccount"} <= kinds  # fmt: skip
        assert list(kube.list(Deployment, namespace=NAMESPACE, labels=LABELS))
        assert list(kube.list(DaemonSet, namespace=NAMESPACE, labels=LABELS))
        assert list(kube.list(ConfigMap, namespace=NAMESPACE, labels=LABELS))
        assert list(kube.list(Service, namespace=NAMESPACE, labels=LABELS))
        assert list(kube.list(ServiceAccount, namespace=NAMESPACE, labels=LABELS))
        roles = [r for r in kube.list(ClusterRole, labels=LABELS)
                 if ((r.metadata and r.metadata.name) or "").startswith(RELEASE)]  # fmt: skip
        assert len(roles) >= 2  # extender and device plugin at least
        deployments = {d.metadata.name for d in kube.list(Deployment, namespace=NAMESPACE)
                       if d.metadata is not None}  # fmt: skip
        assert any("scheduler" in (name or "") for name in deployments), deployments
        assert owned(kube.list(NetworkPolicy, namespace=NAMESPACE, labels=LABELS)) == [EXTENDER]
        own_node = f"{RELEASE}-gpushare-device-plugin-own-node"
        assert owned(kube.list(ValidatingAdmissionPolicy, labels=LABELS)) == [own_node]
        assert owned(kube.list(ValidatingAdmissionPolicyBinding, labels=LABELS)) == [own_node]
        check_upgrades_keep_the_certificate_until_it_is_deleted(control_plane, kube)
    finally:
        helm(control_plane, "uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout", "60s")
    assert owned(kube.list(ClusterRole, labels=LABELS)) == []
    assert owned(kube.list(ClusterRoleBinding, labels=LABELS)) == []
    assert owned(kube.list(ValidatingAdmissionPolicy, labels=LABELS)) == []
    assert owned(kube.list(Secret, namespace=NAMESPACE, labels=LABELS)) == []
    with pytest.raises(ApiError):
        kube.get(Deployment, f"{RELEASE}-gpushare-extender", namespace=NAMESPACE)


def _annotations(kube: Client, name: str) -> dict[str, str]:
    deployment = kube.get(Deployment, name, namespace=NAMESPACE)
    assert deployment.spec is not None
    assert deployment.spec.template.metadata is not None
    return dict(deployment.spec.template.metadata.annotations or {})


def _certificate(kube: Client, suffix: str = "tls") -> tuple[dict[str, str], str]:
    """The data of the extender's Secret ``<extender>-<suffix>`` (``tls``: its serving
    certificate; ``client``: kube-scheduler's client certificate) and the extender's pod
    template checksum of it."""
    secret = kube.get(Secret, f"{EXTENDER}-{suffix}", namespace=NAMESPACE)
    checksum = "checksum/tls" if suffix == "tls" else "checksum/client-tls"
    return dict(secret.data or {}), _annotations(kube, EXTENDER)[checksum]


def check_upgrades_keep_the_certificate_until_it_is_deleted(
    plane: ControlPlane, kube: Client
) -> None:
    for suffix in ("tls", "client"):
        first, checksum = _certificate(kube, suffix)
        assert set(first) == {"ca.crt", "tls.crt", "tls.key"}
        helm(plane, "upgrade", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, *INSTALL_ARGS)
        # lookup: the same certificate, no restart
        assert _certificate(kube, suffix) == (first, checksum)
        kube.delete(Secret, f"{EXTENDER}-{suffix}", namespace=NAMESPACE)
        helm(plane, "upgrade", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE, *INSTALL_ARGS)
        renewed, new_checksum = _certificate(kube, suffix)
        assert renewed["ca.crt"] != first["ca.crt"]
        assert renewed["tls.crt"] != first["tls.crt"]
        assert new_checksum != checksum  # the extender restarts with the new certificate


def test_an_upgrade_to_client_authentication_wires_both_sides(
    control_plane: ControlPlane, kube: Client
) -> None:
    """A release without client authentication (as before it existed: no client Secret, no
    --tls-client-ca) upgraded with the chart's defaults: the client Secret appears, the
    extender checks callers against its CA, and the second scheduler restarts with its
    certificate mounted and named in its configuration, in the same upgrade."""
    release, namespace = "upgradetest", NAMESPACE + "-up"
    extender, scheduler = f"{release}-gpushare-extender", f"{release}-gpushare-scheduler"
    off = ("--set", "extender.tls.clientAuth.mode=off")
    helm(control_plane, "install", release, str(CHART_DIR), "--namespace", namespace,
         "--create-namespace", *INSTALL_ARGS, *off)  # fmt: skip
    try:
        with pytest.raises(ApiError):
            kube.get(Secret, f"{extender}-client", namespace=namespace)
        helm(control_plane, "upgrade", release, str(CHART_DIR), "--namespace", namespace,
             *INSTALL_ARGS)  # fmt: skip
        secret = kube.get(Secret, f"{extender}-client", namespace=namespace)
        assert set(secret.data or {}) == {"ca.crt", "tls.crt", "tls.key"}
        ext = kube.get(Deployment, extender, namespace=namespace)
        assert ext.spec is not None
        assert ext.spec.template.spec is not None
        (main,) = ext.spec.template.spec.containers
        assert "--tls-client-ca=/etc/gpushare/client-ca/ca.crt" in (main.args or [])
        assert "--tls-client-auth=required" in (main.args or [])
        second = kube.get(Deployment, scheduler, namespace=namespace)
        assert second.spec is not None
        assert second.spec.template.spec is not None
        volumes = {v.name: v for v in second.spec.template.spec.volumes or []}
        client_volume = volumes["extender-client"].secret
        assert client_volume is not None
        assert client_volume.secretName == f"{extender}-client"
        assert second.spec.template.metadata is not None
        assert "checksum/client-tls" in (second.spec.template.metadata.annotations or {})
        config = kube.get(ConfigMap, f"{scheduler}-config", namespace=namespace)
        text = (config.data or {})["kube-scheduler-config.yaml"]
        assert "certFile: /etc/kubernetes/gpushare-extender-client/tls.crt" in text
    finally:
        helm(control_plane, "uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")


def test_helm_refuses_values_the_schema_rejects(control_plane: ControlPlane) -> None:
    done = helm_run(
        control_plane.kubeconfig, "install", "bad", str(CHART_DIR), "--namespace", NAMESPACE,
        "--dry-run=server", "--set", "memoryUnit=KiB",
    )  # fmt: skip
    assert done.returncode != 0
    assert "memoryUnit" in done.stderr, done.stderr
