"""Pods written for Alibaba's gpushare rewritten into DRA claims at admission, by the
MutatingAdmissionPolicy of deploy/dra/gpu-mem-to-claims.yaml on the real API server v1.37.1
(issue 29, item 2, first part; docs/dra.md, "Existing pods unchanged")."""

from __future__ import annotations

import contextlib
import uuid
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from click.testing import CliRunner
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.resources.admissionregistration_v1 import (
    MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim

from gpushare.cli.main import main
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import device_class, resource_slice
from gpushare.dra.templates import DEVICE_CLASS
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.controlplane import REPO_ROOT, Binaries, ControlPlane, wait_for, wait_until
from gpushare.testing.nodes import create_nodes, plain_node
from gpushare.testing.pods import delete_namespace

pytestmark = pytest.mark.cluster

POLICY = REPO_ROOT / "deploy" / "dra" / "gpu-mem-to-claims.yaml"


def pod(name: str, namespace: str, containers: dict[str, str | None]) -> dict[str, Any]:
    """Pod ``name``: containers by name, each asking that much ``aliyun.com/gpu-mem`` (or
    none); bound to a node that does not exist, so that nothing runs it."""
    specs = []
    for container, gpu_mem in containers.items():
        limits = {"cpu": "100m"} | ({"aliyun.com/gpu-mem": gpu_mem} if gpu_mem else {})
        specs.append({"name": container, "image": "registry.invalid/none:0",
                      "resources": {"limits": limits, "requests": dict(limits)}})  # fmt: skip
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": specs, "nodeName": "nowhere"}}  # fmt: skip


def created_pod(kube: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Pod ``body`` created; what the API server made of it (after admission)."""
    created: dict[str, Any] = kube.create(cast(Pod, from_dict(body))).to_dict()
    return created


def test_a_gpu_mem_pod_gets_claims_in_a_dra_namespace_and_stays_as_it_is_elsewhere(
    kube: Client,
) -> None:
    dra_ns, plain_ns = f"dra-t-{uuid.uuid4().hex[:5]}", f"plain-t-{uuid.uuid4().hex[:5]}"
    with contextlib.ExitStack() as stack:
        for document in yaml.safe_load_all(POLICY.read_text()):
            kube.create(from_dict(document))
        stack.callback(kube.delete, MutatingAdmissionPolicyBinding, "gpushare-gpu-mem-to-claims")
        stack.callback(kube.delete, MutatingAdmissionPolicy, "gpushare-gpu-mem-to-claims")
        for name, labels in ((dra_ns, {"gpushare.io/dra": "true"}), (plain_ns, {})):
            kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": name, "labels": labels}}))  # fmt: skip
            stack.callback(delete_namespace, kube, name)

        def translated() -> dict[str, Any] | None:  # the policy takes effect within seconds
            probe = pod(f"probe-{uuid.uuid4().hex[:5]}", dra_ns, {"main": "1"})
            created: dict[str, Any] = created_pod(kube, probe)
            return created if created["spec"].get("resourceClaims") else None

        wait_for("the policy in effect", translated, 30)
        created = created_pod(kube, pod("mixed", dra_ns, {"a": "4", "side": None, "b": "8"}))
        spec = created["spec"]
        assert spec["resourceClaims"] == [
            {"name": "gpushare-a", "resourceClaimTemplateName": "gpushare-gpu-mem-4"},
            {"name": "gpushare-b", "resourceClaimTemplateName": "gpushare-gpu-mem-8"},
        ]
        a, side, b = spec["containers"]
        assert a["resources"]["claims"] == [{"name": "gpushare-a"}]
        assert b["resources"]["claims"] == [{"name": "gpushare-b"}]
        assert "claims" not in side["resources"]
        for container in (a, b):
            assert "aliyun.com/gpu-mem" not in container["resources"]["limits"]
            assert "aliyun.com/gpu-mem" not in container["resources"]["requests"]
        elsewhere = created_pod(kube, pod("plain", plain_ns, {"main": "4"}))
        assert "resourceClaims" not in elsewhere["spec"]
        assert (
            elsewhere["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "4"
        )


def test_an_alibaba_pod_runs_through_the_policy_templates_and_allocation(tmp_path: Path) -> None:
    """The whole translation of an ``aliyun.com/gpu-mem: 4`` pod, unchanged, on a control
    plane with kube-controller-manager: the policy rewrites it, ``gpushare dra-templates`` made
    the template, the resourceclaim controller makes its claim, kube-scheduler allocates 4Gi of
    one GPU of gpushare's slice and binds it; a second pod of 12 shares that GPU (16 GiB)."""
    with (
        ControlPlane(Binaries.locate(), controller_manager=True, log_dir=tmp_path) as plane,
        plane.client() as kube,
    ):
        node = "dra-translated"
        create_nodes(kube, [plain_node(node)])
        gpus = [PhysicalGpu(i, f"GPU-t-{i}", i, "Tesla-T4", 16384) for i in range(2)]
        kube.create(from_dict(resource_slice(node, gpus, unit=MemoryUnit.GIB, generation=1)))
        kube.create(from_dict(device_class(DEVICE_CLASS)))
        for document in yaml.safe_load_all(POLICY.read_text()):
            kube.create(from_dict(document))
        namespace = "team-a"
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {"gpushare.io/dra": "true"}}}))  # fmt: skip
        wait_until(  # made by kube-controller-manager; pods are refused before it exists
            "the default ServiceAccount",
            lambda: any(True for _ in kube.list(ServiceAccount, namespace=namespace)),
            60,
        )
        made = CliRunner().invoke(main, [
            "dra-templates", "-n", namespace, "--largest", "16",
            "--kubeconfig", str(plane.kubeconfig),
        ])  # fmt: skip
        assert made.exit_code == 0, made.output
        assert "16 template(s) created" in made.output
        for name, gib in (("infer", "4"), ("train", "12")):
            body = pod(name, namespace, {"main": gib})
            del body["spec"]["nodeName"]  # for kube-scheduler to place
            body["spec"]["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]
            created_pod(kube, body)

        def allocated(name: str) -> dict[str, Any] | None:
            found = kube.get(Pod, name, namespace=namespace)
            if found.spec is None or not found.spec.nodeName or found.status is None:
                return None
            statuses = found.status.resourceClaimStatuses or []
            if not statuses or not statuses[0].resourceClaimName:
                return None
            claim = kube.get(ResourceClaim, statuses[0].resourceClaimName, namespace=namespace)
            results = claim.to_dict()["status"]["allocation"]["devices"]["results"]
            return dict(results[0])

        infer = wait_for("infer allocated and bound", lambda: allocated("infer"), 90)
        train = wait_for("train allocated and bound", lambda: allocated("train"), 90)
        # cores: the request policy's default, 0, as an aliyun.com/gpu-mem pod asks no compute
        assert (infer["device"], infer["consumedCapacity"]) == (
            "gpu-0", {"memory": "4Gi", "cores": "0"}
        )  # fmt: skip
        assert (train["device"], train["consumedCapacity"]) == (
            "gpu-0", {"memory": "12Gi", "cores": "0"}
        )  # fmt: skip
