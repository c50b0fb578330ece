"""The chart in ``deploy/helm/gpushare`` rendered by a real helm (test and release tool).

:func:`locate_helm` finds the helm that ``scripts/build-helm.sh`` builds from the Go module proxy
(``GPUSHARE_HELM`` overrides it) and builds it when it is missing: the deploy tests need it and
are never skipped. :func:`render` runs ``helm template`` with values and returns its YAML;
:func:`render_objects` parses it into API objects. :data:`MANIFESTS` says how each committed file
in ``deploy/manifests`` is rendered (``scripts/render-manifests.sh`` does the same) and
:func:`manifest_text` produces its exact content. :func:`helm_run` and :func:`helm_ok` run helm
against a test cluster (``install``, ``upgrade``, ``status``...).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from gpushare.testing.controlplane import REPO_ROOT
from gpushare.testing.scriptbuilt import script_built

__all__ = [
    "BUILD_SCRIPT",
    "CHART_DIR",
    "KUBE_VERSION",
    "MANIFESTS",
    "MANIFESTS_DIR",
    "MANIFEST_CLIENT_SECRET",
    "MANIFEST_TLS_SECRET",
    "NAMESPACE",
    "RELEASE",
    "HelmError",
    "helm_ok",
    "helm_run",
    "helm_version",
    "locate_helm",
    "manifest_text",
    "parse_yaml",
    "render",
    "render_notes",
    "render_objects",
]

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-helm.sh"
CHART_DIR = REPO_ROOT / "deploy" / "helm" / "gpushare"
MANIFESTS_DIR = REPO_ROOT / "deploy" / "manifests"
RELEASE = "gpushare"
NAMESPACE = "kube-system"
KUBE_VERSION = "1.37.1"
"""The Kubernetes version the committed manifests are rendered for (the test control plane's):
it sets the second scheduler's image tag (``registry.k8s.io/kube-scheduler:v1.37.1``)."""

MANIFEST_TLS_SECRET = "gpushare-extender-tls"
"""The extender's TLS Secret the committed manifests name: plain YAML cannot generate a key, so
the user creates it (docs/install.md, "With plain manifests")."""

MANIFEST_CLIENT_SECRET = "gpushare-extender-client"
"""kube-scheduler's client certificate (and its CA) the committed manifests name: the user
creates it too."""

_MANIFEST_TLS = (
    "--set",
    f"extender.tls.secretName={MANIFEST_TLS_SECRET}",
    "--set",
    f"extender.tls.clientAuth.secretName={MANIFEST_CLIENT_SECRET}",
)
MANIFESTS: Mapping[str, Sequence[str]] = {
    "gpushare.yaml": _MANIFEST_TLS,
    "gpushare-with-scheduler.yaml": (*_MANIFEST_TLS, "--set", "scheduler.second.enabled=true"),
}
"""Each committed file of ``deploy/manifests`` and the extra ``helm template`` arguments."""


class HelmError(RuntimeError):
    """helm is missing and cannot be built, or it refused to render or to act on a cluster
    (its message included)."""


def locate_helm(*, build: bool = True) -> Path:
    """The helm binary: ``$GPUSHARE_HELM``, else the build script's cache (``--print-path``).

    When it is missing and ``build`` is true, runs ``scripts/build-helm.sh`` (minutes on a cold
    Go cache; needs Go and the module proxy) and fails with its output if that fails.
    """
    override = os.environ.get("GPUSHARE_HELM")
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise HelmError(f"GPUSHARE_HELM={override} is not an executable file")
        return path
    return script_built(
        BUILD_SCRIPT,
        "--print-path",
        Path,
        build=build,
        error=HelmError,
        missing="build it with scripts/build-helm.sh (needs Go >= 1.26 and the Go module "
        "proxy). The deploy tests are never skipped.",
    )


def render(
    values: Mapping[str, Any] | None = None,
    *,
    args: Sequence[str] = (),
    helm: Path | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
    kube_version: str = KUBE_VERSION,
) -> str:
    """``helm template`` of the chart: its YAML (``HelmError`` with helm's message on failure).

    ``values`` go in as a values file (JSON is YAML), ``args`` after it (e.g. ``--set k=v``).
    """
    binary = helm or locate_helm()
    with tempfile.TemporaryDirectory(prefix="gpushare-helm-") as tmp:
        command = [
            str(binary),
            "template",
            release,
            str(CHART_DIR),
            "--namespace",
            namespace,
            "--kube-version",
            kube_version,
        ]
        if values is not None:
            values_file = Path(tmp) / "values.json"
            values_file.write_text(json.dumps(values), encoding="utf-8")
            command += ["--values", str(values_file)]
        command += list(args)
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise HelmError(f"helm template failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def helm_run(
    kubeconfig: Path, *args: str, timeout_s: float = 120.0
) -> subprocess.CompletedProcess[str]:
    """``helm ARGS --kubeconfig KUBECONFIG`` (output captured as text), whatever its exit
    status: the caller judges it. ``subprocess.TimeoutExpired`` after ``timeout_s`` seconds."""
    return subprocess.run(
        [str(locate_helm()), *args, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def helm_ok(kubeconfig: Path, *args: str, timeout_s: float = 120.0) -> str:
    """:func:`helm_run` that must succeed: its standard output; :class:`HelmError` with the
    command and everything helm printed otherwise."""
    done = helm_run(kubeconfig, *args, timeout_s=timeout_s)
    if done.returncode != 0:
        raise HelmError(f"helm {' '.join(args)}:\n{done.stdout}\n{done.stderr}")
    return done.stdout


def parse_yaml(text: str) -> list[dict[str, Any]]:
    """The non-empty documents of a YAML stream, each a mapping (``ValueError`` otherwise)."""
    documents: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(text):
        if document is None:
            continue
        if not isinstance(document, dict):
            raise ValueError(f"not a mapping: {document!r:.80}")
        documents.append(document)
    return documents


def render_notes(
    values: Mapping[str, Any] | None = None,
    *,
    helm: Path | None = None,
    release: str = RELEASE,
    namespace: str = NAMESPACE,
) -> str:
    """The chart's install notes (``templates/NOTES.txt``) as ``helm install`` prints them,
    rendered without a cluster (``--dry-run=client``: helm's own default Kubernetes version,
    as ``helm template`` sees it); ``HelmError`` with helm's message on failure."""
    binary = helm or locate_helm()
    with tempfile.TemporaryDirectory(prefix="gpushare-helm-") as tmp:
        command = [
            str(binary), "install", release, str(CHART_DIR), "--namespace", namespace,
            "--dry-run=client", "--output", "json",
        ]  # fmt: skip
        if values is not None:
            values_file = Path(tmp) / "values.json"
            values_file.write_text(json.dumps(values), encoding="utf-8")
            command += ["--values", str(values_file)]
        env = {**os.environ, "HELM_CACHE_HOME": tmp, "HELM_CONFIG_HOME": tmp, "HELM_DATA_HOME": tmp}
        done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise HelmError(f"helm install --dry-run failed (exit {done.returncode}): "
                        f"{done.stderr.strip()}")  # fmt: skip
    notes: str = json.loads(done.stdout)["info"]["notes"]
    return notes


def render_objects(values: Mapping[str, Any] | None = None, **kwargs: Any) -> list[dict[str, Any]]:
    """:func:`render`, parsed: the API objects the chart renders, in helm's order."""
    return parse_yaml(render(values, **kwargs))


def helm_version(helm: Path | None = None) -> str:
    """``helm version --short`` (e.g. ``v4.3.1``)."""
    done = subprocess.run(
        [str(helm or locate_helm()), "version", "--short"],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.strip()


def manifest_text(name: str, *, helm: Path | None = None) -> str:
    """The exact content of ``deploy/manifests/<name>``: a header, then helm's output."""
    binary = helm or locate_helm()
    extra = MANIFESTS[name]
    how = " ".join(extra) if extra else "default values"
    header = (
        f"# Rendered from deploy/helm/gpushare by scripts/render-manifests.sh: do not edit.\n"
        f"# helm {helm_version(binary)} template {RELEASE} --namespace {NAMESPACE} "
        f"--kube-version {KUBE_VERSION} ({how}).\n"
    )
    return header + render(args=extra, helm=binary)
