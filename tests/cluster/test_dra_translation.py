"""Pods written for Alibaba's gpushare, Tencent's gpu-manager and HAMi rewritten into DRA claims
at admission, by the admission policies of deploy/dra/ on the real API server v1.37.1
(docs/dra.md, "Existing pods unchanged")."""

from __future__ import annotations

import contextlib
import itertools
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from click.testing import CliRunner
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.core.resource import GlobalResource
from lightkube.resources.admissionregistration_v1 import (
    MutatingAdmissionPolicy,
    MutatingAdmissionPolicyBinding,
    ValidatingAdmissionPolicy,
    ValidatingAdmissionPolicyBinding,
)
from lightkube.resources.core_v1 import Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim

from gpushare.cli.main import main
from gpushare.deviceplugin.inventory import PhysicalGpu
from gpushare.dra.slices import device_class, resource_slice
from gpushare.dra.templates import DEVICE_CLASS, share_template_name, whole_template_name
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.controlplane import REPO_ROOT, Binaries, ControlPlane, wait_for, wait_until
from gpushare.testing.nodes import create_nodes, plain_node
from gpushare.testing.pods import delete_namespace, unschedulable

pytestmark = pytest.mark.cluster

POLICY = REPO_ROOT / "deploy" / "dra" / "gpu-mem-to-claims.yaml"
DIALECT_POLICIES = REPO_ROOT / "deploy" / "dra" / "vcuda-hami-to-claims.yaml"
GPU_MEM = "aliyun.com/gpu-mem"
VCORE, VMEMORY = "tencent.com/vcuda-core", "tencent.com/vcuda-memory"
FORK_CORE, FORK_MEMORY = "nvidia.com/vcuda-core", "nvidia.com/vcuda-memory"
HAMI_GPU, GPUMEM, GPUCORES = "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"
GPUMEM_PERCENT = "nvidia.com/gpumem-percentage"
KINDS: dict[str, type[GlobalResource]] = {
    "MutatingAdmissionPolicy": MutatingAdmissionPolicy,
    "MutatingAdmissionPolicyBinding": MutatingAdmissionPolicyBinding,
    "ValidatingAdmissionPolicy": ValidatingAdmissionPolicy,
    "ValidatingAdmissionPolicyBinding": ValidatingAdmissionPolicyBinding,
}


def pod(
    name: str,
    namespace: str,
    containers: Mapping[str, Mapping[str, str]],
    init_containers: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """Pod ``name``: containers (and init containers) by name, each with those GPU limits (and
    requests) beside ``cpu: 100m``; bound to a node that does not exist, so that nothing runs
    it."""

    def specs(by_name: Mapping[str, Mapping[str, str]]) -> list[dict[str, Any]]:
        made = []
        for container, gpu in by_name.items():
            limits = {"cpu": "100m"} | dict(gpu)
            made.append({"name": container, "image": "registry.invalid/none:0",
                         "resources": {"limits": limits, "requests": dict(limits)}})  # fmt: skip
        return made

    spec: dict[str, Any] = {"containers": specs(containers), "nodeName": "nowhere"}
    if init_containers:
        spec["initContainers"] = specs(init_containers)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}  # fmt: skip


@contextlib.contextmanager
def policies(kube: Client, *paths: Path) -> Iterator[None]:
    """The admission policies and bindings of ``paths`` created, deleted on the way out."""
    with contextlib.ExitStack() as stack:
        for path in paths:
            for document in yaml.safe_load_all(path.read_text()):
                kube.create(from_dict(document))
                kind, name = KINDS[document["kind"]], document["metadata"]["name"]
                stack.callback(partial(kube.delete, kind, name))
        yield


def dra_namespace(kube: Client, stack: contextlib.ExitStack, labels: Mapping[str, str]) -> str:
    """A new namespace with ``labels``, deleted when ``stack`` closes."""
    name = f"dra-t-{uuid.uuid4().hex[:5]}"
    kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace",
                           "metadata": {"name": name, "labels": dict(labels)}}))  # fmt: skip
    stack.callback(delete_namespace, kube, name)
    return name


def in_effect(
    kube: Client,
    namespace: str,
    limits: Mapping[str, str],
    refused: Mapping[str, str] | None = None,
) -> None:
    """Wait until a probe pod asking ``limits`` is translated and, with ``refused``, one asking
    that is refused (policies take effect within seconds of their creation, each on its own:
    the refusing one may come first or last)."""

    def translated() -> bool | None:
        probe = pod(f"probe-{uuid.uuid4().hex[:5]}", namespace, {"main": limits})
        try:
            created: dict[str, Any] = created_pod(kube, probe)
        except ApiError as error:
            if "gpushare-dra-untranslated" not in (error.status.message or ""):
                raise
            return None
        return True if created["spec"].get("resourceClaims") else None

    wait_for("the policy in effect", translated, 30)
    if refused is None:
        return

    def refusing() -> bool | None:
        probe = pod(f"probe-{uuid.uuid4().hex[:5]}", namespace, {"main": refused})
        try:
            created_pod(kube, probe)
        except ApiError as error:
            return True if "which no ResourceClaim serves" in (error.status.message or "") else None
        return None  # created: the refusing policy is not in effect yet

    wait_for("the refusing policy in effect", refusing, 30)


def created_pod(kube: Client, body: dict[str, Any]) -> dict[str, Any]:
    """Pod ``body`` created; what the API server made of it (after admission)."""
    created: dict[str, Any] = kube.create(cast(Pod, from_dict(body))).to_dict()
    return created


def test_a_gpu_mem_pod_gets_claims_in_a_dra_namespace_and_stays_as_it_is_elsewhere(
    kube: Client,
) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(policies(kube, POLICY))
        dra_ns = dra_namespace(kube, stack, {"gpushare.io/dra": "true"})
        plain_ns = dra_namespace(kube, stack, {})
        in_effect(kube, dra_ns, {GPU_MEM: "1"})
        created = created_pod(
            kube, pod("mixed", dra_ns, {"a": {GPU_MEM: "4"}, "side": {}, "b": {GPU_MEM: "8"}})
        )
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
            assert GPU_MEM not in container["resources"]["limits"]
            assert GPU_MEM not in container["resources"]["requests"]
        elsewhere = created_pod(kube, pod("plain", plain_ns, {"main": {GPU_MEM: "4"}}))
        assert "resourceClaims" not in elsewhere["spec"]
        assert elsewhere["spec"]["containers"][0]["resources"]["limits"][GPU_MEM] == "4"


@dataclass(frozen=True)
class Translation:
    """A container asking ``limits``: the template its claim names, or the refusal."""

    id: str
    limits: dict[str, str]
    template: str | None = None
    refused: str | None = None


TRANSLATIONS = [
    Translation("gpu-manager: vcuda-core 50 with 32 blocks of 256 MiB is 8 GiB and half of the "
                "compute", {VCORE: "50", VMEMORY: "32"}, share_template_name(1, 8, 50)),
    Translation("gpu-manager: 3 blocks (768 MiB) round up to a whole GiB, as the slice would",
                {VCORE: "10", VMEMORY: "3"}, share_template_name(1, 1, 10)),
    Translation("gpu-manager: vcuda-core 100 is a whole GPU, its vcuda-memory unused",
                {VCORE: "100", VMEMORY: "8"}, whole_template_name(1)),
    Translation("gpu-manager: vcuda-core 200 is two whole GPUs", {VCORE: "200"},
                whole_template_name(2)),
    Translation("the gpu-manager fork counts nvidia.com/vcuda-memory in MiB",
                {FORK_CORE: "30", FORK_MEMORY: "2048"}, share_template_name(1, 2, 30)),
    Translation("HAMi: two GPUs, each 3000 MiB (3 GiB) and 30 % of the compute",
                {HAMI_GPU: "2", GPUMEM: "3000", GPUCORES: "30"}, share_template_name(2, 3, 30)),
    Translation("HAMi: gpumem without nvidia.com/gpu asks one GPU and no compute bound",
                {GPUMEM: "4096"}, share_template_name(1, 4, 0)),
    Translation("HAMi: nvidia.com/gpu alone is a whole GPU (all its memory, HAMi's default)",
                {HAMI_GPU: "1"}, whole_template_name(1)),
    Translation("HAMi: gpucores 100 is the whole GPU", {HAMI_GPU: "3", GPUMEM: "2000",
                GPUCORES: "100"}, whole_template_name(3)),
    Translation("gpu-manager: 150 is neither a share nor whole GPUs", {VCORE: "150"},
                refused="asks tencent.com/vcuda-core=150, which no ResourceClaim serves"),
    Translation("gpu-manager: a share without vcuda-memory", {VCORE: "50"},
                refused="asks tencent.com/vcuda-core=50, which no ResourceClaim serves"),
    Translation("HAMi: gpumem-percentage is no amount a claim can ask", {GPUMEM_PERCENT: "50"},
                refused="gpumem-percentage cannot be written as a claim"),
    Translation("HAMi: no GPU", {HAMI_GPU: "0", GPUMEM: "1000"},
                refused="asks nvidia.com/gpu=0, nvidia.com/gpumem=1k"),
    Translation("two dialects in one container", {GPU_MEM: "4", HAMI_GPU: "1"},
                refused="asks aliyun.com/gpu-mem=4, nvidia.com/gpu=1"),
]  # fmt: skip


def test_gpu_manager_and_hami_pods_get_the_claim_their_ask_names_or_a_clear_refusal(
    kube: Client,
) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(policies(kube, POLICY, DIALECT_POLICIES))
        namespace = dra_namespace(kube, stack, {"gpushare.io/dra": "true"})
        in_effect(kube, namespace, {HAMI_GPU: "1"}, refused={VCORE: "150"})
        failures = []
        for n, case in enumerate(TRANSLATIONS):
            body = pod(f"p{n}", namespace, {"side": {}, "main": case.limits})
            try:
                created = created_pod(kube, body)
            except ApiError as error:
                message = error.status.message or ""
                if case.refused is None or case.refused not in message:
                    failures.append(f"{case.id}: refused: {message}")
                elif "container main asks" not in message or "accepted:" not in message:
                    failures.append(f"{case.id}: the refusal names no container: {message}")
                continue
            spec = created["spec"]
            claims = spec.get("resourceClaims")
            expected = [{"name": "gpushare-main", "resourceClaimTemplateName": case.template}]
            if case.template is None or claims != expected:
                failures.append(f"{case.id}: claims {claims}, expected {case.template}")
                continue
            side, main_ = spec["containers"]
            if "claims" in side["resources"] or main_["resources"]["claims"] != [
                {"name": "gpushare-main"}
            ]:
                failures.append(f"{case.id}: containers' claims {spec['containers']}")
            for kind in ("limits", "requests"):  # the dialect's resources gone, cpu kept
                if main_["resources"][kind] != {"cpu": "100m"}:
                    failures.append(f"{case.id}: {kind} {main_['resources'][kind]}")
        assert not failures, "\n".join(failures)


LONG = "x" * 62  # with one more character, a container name as long as a DNS label may be


@dataclass(frozen=True)
class Kept:
    """A pod of ``containers`` (name: GPU limits), with a claim ``own`` of its own used by its
    first container when ``own``: the pod's claims once admitted (in any order: each policy
    adds its own, in no fixed order) and each container's claim names."""

    id: str
    containers: dict[str, dict[str, str]]
    claims: list[dict[str, str]]
    container_claims: dict[str, list[str]]
    own: bool = False


def claim(name: str, template: str) -> dict[str, str]:
    return {"name": name, "resourceClaimTemplateName": template}


OWN = claim("own", "own-template")
KEPT = [
    Kept("a gpu-mem pod with a claim of its own keeps it and gets gpushare's beside it",
         {"main": {GPU_MEM: "4"}, "side": {}},
         [OWN, claim("gpushare-main", "gpushare-gpu-mem-4")],
         {"main": ["own", "gpushare-main"], "side": []}, own=True),
    Kept("a HAMi pod with a claim of its own keeps it and gets gpushare's beside it",
         {"main": {HAMI_GPU: "1"}}, [OWN, claim("gpushare-main", whole_template_name(1))],
         {"main": ["own", "gpushare-main"]}, own=True),
    Kept("a gpu-mem and a gpu-manager container of one pod each get their claim",
         {"a": {GPU_MEM: "2"}, "b": {VCORE: "100"}},
         [claim("gpushare-a", "gpushare-gpu-mem-2"),
          claim("gpushare-b", whole_template_name(1))],
         {"a": ["gpushare-a"], "b": ["gpushare-b"]}),
    Kept("a 63-character container name gets a 63-character claim name",
         {"side": {}, LONG + "a": {GPU_MEM: "4"}},
         [claim("gpushare--" + LONG[:51] + "-1", "gpushare-gpu-mem-4")],
         {"side": [], LONG + "a": ["gpushare--" + LONG[:51] + "-1"]}),
    Kept("long container names that differ only past the cut get distinct claims, HAMi's too",
         {LONG + "a": {GPU_MEM: "4"}, LONG + "b": {HAMI_GPU: "1"}},
         [claim("gpushare--" + LONG[:51] + "-0", "gpushare-gpu-mem-4"),
          claim("gpushare--" + LONG[:51] + "-1", whole_template_name(1))],
         {LONG + "a": ["gpushare--" + LONG[:51] + "-0"],
          LONG + "b": ["gpushare--" + LONG[:51] + "-1"]}),
    Kept("a 54-character name keeps the short form (63 characters), a 55-character one not",
         {"y" * 54: {GPU_MEM: "1"}, "y" * 55: {GPU_MEM: "1"}},
         [claim("gpushare-" + "y" * 54, "gpushare-gpu-mem-1"),
          claim("gpushare--" + "y" * 51 + "-1", "gpushare-gpu-mem-1")],
         {"y" * 54: ["gpushare-" + "y" * 54], "y" * 55: ["gpushare--" + "y" * 51 + "-1"]}),
]  # fmt: skip


def test_pods_with_claims_of_their_own_or_long_container_names_get_valid_claims(
    kube: Client,
) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(policies(kube, POLICY, DIALECT_POLICIES))
        namespace = dra_namespace(kube, stack, {"gpushare.io/dra": "true"})
        in_effect(kube, namespace, {GPU_MEM: "1"})
        in_effect(kube, namespace, {HAMI_GPU: "1"}, refused={VCORE: "150"})
        failures = []
        for n, case in enumerate(KEPT):
            body = pod(f"k{n}", namespace, case.containers)
            if case.own:
                body["spec"]["resourceClaims"] = [dict(OWN)]
                body["spec"]["containers"][0]["resources"]["claims"] = [{"name": "own"}]
            try:
                spec = created_pod(kube, body)["spec"]
            except ApiError as error:
                failures.append(f"{case.id}: refused: {error.status.message}")
                continue
            claims = spec.get("resourceClaims", [])
            if sorted(claims, key=str) != sorted(case.claims, key=str):
                failures.append(f"{case.id}: claims {claims}, expected {case.claims}")
            if any(len(claim["name"]) > 63 for claim in claims):
                failures.append(f"{case.id}: a claim name longer than 63 characters: {claims}")
            got = {c["name"]: [r["name"] for r in c["resources"].get("claims", [])]
                   for c in spec["containers"]}  # fmt: skip
            if got != case.container_claims:
                failures.append(f"{case.id}: containers' claims {got}")
        assert not failures, "\n".join(failures)


@dataclass(frozen=True)
class Refused:
    """A pod of ``containers`` and ``init_containers`` (name: GPU limits) refused with a message
    that says each of ``says``; ``gpu_mem_only``: refused by gpu-mem-to-claims.yaml alone too."""

    id: str
    containers: dict[str, dict[str, str]]
    says: tuple[str, ...]
    init_containers: dict[str, dict[str, str]] = field(default_factory=dict)
    gpu_mem_only: bool = True


NOT_IN_INIT = ("which no ResourceClaim serves", "init containers are not translated",
               "accepted: GPU resources in regular containers only")  # fmt: skip
REFUSED = [
    Refused("an init container asking gpu-mem: init containers are not translated",
            {"main": {GPU_MEM: "2"}}, ("init container setup asks aliyun.com/gpu-mem=4",
            *NOT_IN_INIT), {"setup": {GPU_MEM: "4"}}),
    Refused("an init container asking a HAMi GPU: init containers are not translated",
            {"main": {}}, ("init container setup asks nvidia.com/gpu=1", *NOT_IN_INIT),
            {"setup": {HAMI_GPU: "1"}}, gpu_mem_only=False),
    Refused("gpu-mem 0 names no amount of memory", {"side": {}, "main": {GPU_MEM: "0"}},
            ("container main asks aliyun.com/gpu-mem=0, which no ResourceClaim serves",
             "accepted: aliyun.com/gpu-mem a whole number >= 1")),
    Refused("gpu-mem -1, left in place, is refused by the API server's own validation",
            {"main": {GPU_MEM: "-1"}},
            ("spec.containers[0].resources.limits[aliyun.com/gpu-mem]", '"-1"',
             "must be greater than or equal to 0")),
    Refused("gpu-mem 500m, left in place, is refused by the API server's own validation",
            {"main": {GPU_MEM: "500m"}},
            ("spec.containers[0].resources.limits[aliyun.com/gpu-mem]", "must be an integer")),
]  # fmt: skip


def refusal(kube: Client, body: dict[str, Any], within: float = 10.0) -> str | dict[str, Any]:
    """The message refusing pod ``body``, or the spec of the last one admitted when it is
    admitted throughout ``within`` s (tried again under a new name: a policy takes effect
    seconds after its creation)."""
    deadline = time.monotonic() + within
    name, attempts = body["metadata"]["name"], itertools.count()
    while True:
        body["metadata"]["name"] = f"{name}-{next(attempts)}"
        try:
            spec: dict[str, Any] = created_pod(kube, body)["spec"]
        except ApiError as error:
            return error.status.message or ""
        if time.monotonic() > deadline:
            return spec
        time.sleep(1)


@pytest.mark.parametrize(
    "files",
    [(POLICY,), (POLICY, DIALECT_POLICIES)],
    ids=["gpu-mem-to-claims.yaml alone", "both files"],
)
def test_gpu_asks_left_untranslated_are_refused_with_the_container_the_ask_and_what_is_accepted(
    kube: Client, files: tuple[Path, ...]
) -> None:
    with contextlib.ExitStack() as stack:
        stack.enter_context(policies(kube, *files))
        namespace = dra_namespace(kube, stack, {"gpushare.io/dra": "true"})
        in_effect(kube, namespace, {GPU_MEM: "1"})
        failures = []
        for n, case in enumerate(REFUSED):
            if DIALECT_POLICIES not in files and not case.gpu_mem_only:
                continue
            body = pod(f"r{n}", namespace, case.containers, case.init_containers)
            message = refusal(kube, body)
            if not isinstance(message, str):
                failures.append(f"{case.id}: admitted, claims {message.get('resourceClaims')}")
            elif not all(part in message for part in case.says):
                failures.append(f"{case.id}: refused with {message!r}, expected {case.says}")
        assert not failures, "\n".join(failures)


def allocated(kube: Client, namespace: str, name: str) -> list[dict[str, Any]] | None:
    """The allocation results of pod ``name``'s one claim once it is allocated and bound."""
    found = kube.get(Pod, name, namespace=namespace)
    if found.spec is None or not found.spec.nodeName or found.status is None:
        return None
    statuses = found.status.resourceClaimStatuses or []
    if not statuses or not statuses[0].resourceClaimName:
        return None
    claim = kube.get(ResourceClaim, statuses[0].resourceClaimName, namespace=namespace)
    results: list[dict[str, Any]] = claim.to_dict()["status"]["allocation"]["devices"]["results"]
    return results


@dataclass(frozen=True)
class Placed:
    """A pod of one container asking ``limits``, unchanged; the GPUs and capacity its claim got
    (``None``: it stays Pending)."""

    name: str
    limits: dict[str, str]
    consumed: dict[str, dict[str, str]] | None


PLACED = [
    Placed("alibaba-4", {GPU_MEM: "4"}, {"gpu-0": {"memory": "4Gi", "cores": "0"}}),
    Placed("alibaba-12", {GPU_MEM: "12"}, {"gpu-0": {"memory": "12Gi", "cores": "0"}}),
    Placed("vcuda-half", {VCORE: "50", VMEMORY: "32"},
           {"gpu-1": {"memory": "8Gi", "cores": "50"}}),
    Placed("hami-share", {GPUMEM: "4000", GPUCORES: "30"},
           {"gpu-1": {"memory": "4Gi", "cores": "30"}}),
    Placed("hami-two-whole", {HAMI_GPU: "2"},
           {"gpu-2": {"memory": "16Gi", "cores": "100"},
            "gpu-3": {"memory": "16Gi", "cores": "100"}}),
    # gpu-0's memory is taken, gpu-1 has 20 % of compute left, gpu-2 and gpu-3 are whole
    Placed("hami-no-room", {GPUMEM: "1000", GPUCORES: "30"}, None),
]  # fmt: skip


def test_unchanged_alibaba_gpu_manager_and_hami_pods_run_through_policies_templates_and_allocation(
    tmp_path: Path,
) -> None:
    """The whole translation of unchanged pods of the three dialects on a control plane with
    kube-controller-manager: the policies rewrite them, ``gpushare dra-templates`` made the
    templates, the resourceclaim controller makes their claims, kube-scheduler allocates them
    on gpushare's slice (four 16 GiB GPUs), first fit, and binds them; one that fits no GPU
    stays Pending with the scheduler's reason."""
    with (
        ControlPlane(Binaries.locate(), controller_manager=True, log_dir=tmp_path) as plane,
        plane.client() as kube,
    ):
        node = "dra-translated"
        create_nodes(kube, [plain_node(node)])
        gpus = [PhysicalGpu(i, f"GPU-t-{i}", i, "Tesla-T4", 16384) for i in range(4)]
        kube.create(from_dict(resource_slice(node, gpus, unit=MemoryUnit.GIB, generation=1)))
        kube.create(from_dict(device_class(DEVICE_CLASS)))
        for path in (POLICY, DIALECT_POLICIES):
            for document in yaml.safe_load_all(path.read_text()):
                kube.create(from_dict(document))
        namespace = "team-a"
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {"gpushare.io/dra": "true"}}}))  # fmt: skip
        wait_until(  # made by kube-controller-manager; pods are refused before it exists
            "the default ServiceAccount",
            lambda: any(True for _ in kube.list(ServiceAccount, namespace=namespace)),
            60,
        )
        in_effect(kube, namespace, {GPU_MEM: "1"})  # probes bound to no node: never allocated
        in_effect(kube, namespace, {HAMI_GPU: "1"})
        made = CliRunner().invoke(main, [
            "dra-templates", "-n", namespace, "--largest", "16", "--cores", "30,50",
            "--gpus", "2", "--kubeconfig", str(plane.kubeconfig),
        ])  # fmt: skip
        assert made.exit_code == 0, made.output
        # 16 Alibaba sizes; 2 whole; 2 GPU counts x 16 sizes x 2 shares
        assert "82 template(s) created" in made.output, made.output
        for case in PLACED:  # one after the other: first fit depends on the order
            body = pod(case.name, namespace, {"main": case.limits})
            del body["spec"]["nodeName"]  # for kube-scheduler to place
            body["spec"]["tolerations"] = [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}]
            created_pod(kube, body)
            name = case.name
            if case.consumed is None:
                message = wait_for(
                    f"{name} unschedulable", partial(unschedulable, kube, namespace, name), 60
                )
                assert "cannot allocate all claims" in message, message
                continue
            results = wait_for(
                f"{name} allocated and bound", partial(allocated, kube, namespace, name), 90
            )
            got = {r["device"]: r["consumedCapacity"] for r in results}
            assert got == case.consumed, case.name
