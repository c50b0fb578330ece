"""Claim pods on the real node (docs/dra.md, "On a real node"): kubelet v1.37.1 and containerd
2.x (CDI) with ``gpushare dra-driver --fake-gpus 2x16GiB:T4`` as a process on the node (its
sockets in kubelet's plugin directories, its CDI specs where containerd reads them), the
default kube-scheduler allocating. Every started container's environment, read back through
the API server, names the GPU and share its claim was allocated."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from click.testing import CliRunner
from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import ConfigMap, Event, Namespace, Pod, ServiceAccount
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice

from gpushare.cli.main import main
from gpushare.dra.slices import device_class, slice_name
from gpushare.kube.codec.dra import DEVICE_CLASS, MEMORY
from gpushare.testing.controlplane import (
    REPO_ROOT,
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    gpushare_argv,
    wait_for,
    wait_until,
)
from gpushare.testing.node import TEST_IMAGE, RealNode
from gpushare.testing.node.gpu import PRINT_ENV, container_env, delete_pods, runnable
from gpushare.testing.node.waits import container_ids, running
from gpushare.testing.pods import unschedulable
from gpushare.testing.rbac import DRA_DRIVER_RULES

pytestmark = pytest.mark.node

CORES = "cores"
GPU_UUID = "GPU-fa4e0000-0000-4000-8000-{:012x}"  # --fake-gpus' UUIDs, by index
MARKS_RULES = [PolicyRule(apiGroups=[""], resources=["configmaps"],
                          verbs=["get", "list", "watch"])]  # fmt: skip


class Driver:
    """``gpushare dra-driver`` on the real node under its least RBAC (module doc)."""

    def __init__(self, plane: ControlPlane, node: RealNode, workdir: Path) -> None:
        kubeconfig = plane.service_account_kubeconfig(
            "gpushare-dra-driver-node", "kube-system", [*DRA_DRIVER_RULES, *MARKS_RULES]
        )
        self.node = node
        self.argv = gpushare_argv(
            "dra-driver", "--node-name", node.name, "--fake-gpus", "2x16GiB:T4",
            "--plugin-dir", str(node.kubelet_root / "plugins"),
            "--registry-dir", str(node.kubelet_root / "plugins_registry"),
            "--cdi-dir", str(node.containerd.cdi_dir), "--resync", "2",
            "--unhealthy-configmap", "--kubeconfig", str(kubeconfig),
        )  # fmt: skip
        self.workdir = workdir
        self.plane = plane
        self.process: ManagedProcess | None = None
        self.runs = 0

    def start(self) -> None:
        self.runs += 1
        self.process = ManagedProcess(f"dra-driver-{self.runs}", self.argv, self.workdir)
        self.process.start()
        registration = self.node.kubelet_root / "plugins_registry" / "gpu.gpushare.io-reg.sock"
        wait_until("the driver's sockets", registration.exists, 60, processes=[self.process])

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.plane.keep_log(self.process)


@pytest.fixture(scope="module")
def driver(real_node: tuple[ControlPlane, RealNode], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Driver]:  # fmt: skip
    """The driver, started once for the module (a test may restart it), and the DeviceClass."""
    plane, node = real_node
    with plane.client() as kube, contextlib.suppress(ApiError):
        kube.create(from_dict(device_class(DEVICE_CLASS)))
    running_driver = Driver(plane, node, tmp_path_factory.mktemp("dra-driver"))
    running_driver.start()
    try:
        yield running_driver
    finally:
        running_driver.stop()
        with plane.client() as kube, contextlib.suppress(ApiError):
            kube.delete(ResourceSlice, slice_name(node.name))


def claim_pod(kube: Client, namespace: str, name: str, memory: str, cores: int = 0) -> None:
    """A ResourceClaim ``name`` of ``memory`` (and ``cores`` percent) of one GPU and a pod
    ``name`` whose container prints its environment."""
    requests = {MEMORY: memory} | ({CORES: str(cores)} if cores else {})
    kube.create(from_dict({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DEVICE_CLASS, "capacity": {"requests": requests}}}]}},
    }))  # fmt: skip
    kube.create(from_dict({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": TEST_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", PRINT_ENV],
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
        },
    }))  # fmt: skip


def allocated_device(kube: Client, namespace: str, claim: str) -> str:
    found = kube.get(ResourceClaim, claim, namespace=namespace).to_dict()
    (result,) = found["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def gpu_env(kube: Client, namespace: str, pod: str) -> dict[str, str]:
    """The GPU variables the pod's container printed."""
    env = container_env(kube, pod, namespace, "main")
    return {k: v for k, v in env.items() if k.startswith(("NVIDIA_", "ALIYUN_", "GPUSHARE_"))}


def test_claim_pods_start_with_their_gpu_and_share_and_share_one_gpu(
    driver: Driver, kube: Client, namespace: str
) -> None:
    """Two claims share GPU 0 (the driver lists it first once used: best fit); each container
    gets the variables of its share through the claim's CDI spec; 20 GiB fits no GPU and stays
    Pending with the scheduler's reason."""
    claim_pod(kube, namespace, "train", "8Gi", cores=30)
    running(kube, namespace, "train")
    claim_pod(kube, namespace, "serve", "6Gi")
    running(kube, namespace, "serve")
    assert allocated_device(kube, namespace, "train") == "gpu-0"
    assert allocated_device(kube, namespace, "serve") == "gpu-0"
    assert gpu_env(kube, namespace, "train") == {
        "NVIDIA_VISIBLE_DEVICES": GPU_UUID.format(0), "ALIYUN_COM_GPU_MEM_IDX": "0",
        "ALIYUN_COM_GPU_MEM_POD": "8", "ALIYUN_COM_GPU_MEM_CONTAINER": "8",
        "ALIYUN_COM_GPU_MEM_DEV": "16", "GPUSHARE_CORES_PERCENT": "30",
    }  # fmt: skip
    assert gpu_env(kube, namespace, "serve")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "6"
    claim_pod(kube, namespace, "huge", "20Gi")
    message = wait_for("huge unschedulable", lambda: unschedulable(kube, namespace, "huge"), 60)
    assert "cannot allocate all claims" in message, message


def test_an_unhealthy_gpu_takes_no_new_claim(
    driver: Driver, real_node: tuple[ControlPlane, RealNode], kube: Client, namespace: str
) -> None:
    """GPU 0 holds a claim (best fit would put the next one there); marked unhealthy in
    Alibaba's ConfigMap, the driver taints it and the next claim goes to GPU 1; the pod on GPU
    0 keeps running."""
    _, node = real_node
    claim_pod(kube, namespace, "before", "4Gi")
    before = running(kube, namespace, "before")
    assert allocated_device(kube, namespace, "before") == "gpu-0"
    name = f"unhealthy-gpu-{node.name}"
    kube.create(from_dict({"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": name, "namespace": "kube-system"},
                           "data": {"gpus": "0"}}))  # fmt: skip
    try:

        def tainted() -> bool:
            devices = kube.get(ResourceSlice, slice_name(node.name)).to_dict()["spec"]["devices"]
            return any(d["name"] == "gpu-0" and d.get("taints") for d in devices)

        wait_until("gpu-0 tainted in the slice", tainted, 60)
        claim_pod(kube, namespace, "after", "4Gi")
        running(kube, namespace, "after")
        assert allocated_device(kube, namespace, "after") == "gpu-1"
        assert container_ids(running(kube, namespace, "before")) == container_ids(before)
    finally:
        kube.delete(ConfigMap, name, namespace="kube-system")


def test_driver_and_kubelet_restarts_keep_claim_pods_running_and_new_ones_start(
    driver: Driver, real_node: tuple[ControlPlane, RealNode], kube: Client, namespace: str
) -> None:
    _, node = real_node
    claim_pod(kube, namespace, "kept", "4Gi")
    kept = container_ids(running(kube, namespace, "kept"))
    driver.stop()
    driver.start()
    claim_pod(kube, namespace, "after-driver", "4Gi")
    running(kube, namespace, "after-driver")
    node.restart_kubelet()
    claim_pod(kube, namespace, "after-kubelet", "4Gi")
    running(kube, namespace, "after-kubelet")
    assert container_ids(running(kube, namespace, "kept")) == kept
    assert gpu_env(kube, namespace, "after-kubelet")["ALIYUN_COM_GPU_MEM_CONTAINER"] == "4"


POLICIES = [REPO_ROOT / "deploy" / "dra" / n
            for n in ("gpu-mem-to-claims.yaml", "vcuda-hami-to-claims.yaml")]  # fmt: skip
# (example file, pod name) -> (ALIYUN_COM_GPU_MEM_CONTAINER, GPUSHARE_CORES_PERCENT or None)
TRANSLATED = {
    ("gpu-manager.yaml", "vcuda-half"): ("8", "50"),  # 30 x 256 MiB: 7.5 GiB, rounded up
    ("hami.yaml", "hami-one"): ("3", "30"),  # 3000 MiB: 3 GiB
}


def example(file: str, name: str) -> dict[str, Any]:
    for document in yaml.safe_load_all((REPO_ROOT / "examples" / file).read_text()):
        if document and document["metadata"]["name"] == name:
            return dict(document)
    raise LookupError(f"no pod {name} in examples/{file}")


def test_the_examples_for_gpu_manager_and_hami_run_through_the_translation(
    driver: Driver, real_node: tuple[ControlPlane, RealNode], kube: Client
) -> None:
    """The example pods of examples/gpu-manager.yaml and examples/hami.yaml, their resources
    as written (only the image, command and scheduler are this machine's), in a namespace
    labelled ``gpushare.io/dra=true``: the admission policies make them claims from the
    templates ``gpushare dra-templates`` made, and they start with their GPU and share."""
    plane, _ = real_node
    namespace = f"dra-{uuid.uuid4().hex[:5]}"
    with contextlib.ExitStack() as stack:
        for path in POLICIES:
            for document in yaml.safe_load_all(path.read_text()):
                kube.create(from_dict(document))
                stack.callback(_delete_quietly, kube, document)
        kube.create(from_dict({"apiVersion": "v1", "kind": "Namespace", "metadata": {
            "name": namespace, "labels": {"gpushare.io/dra": "true"}}}))  # fmt: skip
        stack.callback(kube.delete, Namespace, namespace)
        stack.callback(delete_pods, kube, namespace)
        wait_until(  # made by kube-controller-manager; pods are refused before it exists
            "the default ServiceAccount",
            lambda: any(True for _ in kube.list(ServiceAccount, namespace=namespace)),
            60,
        )
        made = CliRunner().invoke(main, [
            "dra-templates", "-n", namespace, "--largest", "16", "--cores", "30,50",
            "--kubeconfig", str(plane.kubeconfig),
        ])  # fmt: skip
        assert made.exit_code == 0, made.output
        for limits in ({"tencent.com/vcuda-core": "10", "tencent.com/vcuda-memory": "1"},
                       {"nvidia.com/gpumem": "1000"}):  # fmt: skip
            wait_for("the policies in effect", partial(translated, kube, namespace, limits), 30)
        for (file, name), (memory, cores) in TRANSLATED.items():
            body = runnable(example(file, name), namespace).to_dict()
            del body["spec"]["schedulerName"]  # the default scheduler allocates claims

            kube.create(from_dict(body))
            try:
                pod = running(kube, namespace, name)
            except ControlPlaneError as error:
                raise AssertionError(f"{error}\n{explain(kube, namespace, name)}") from None
            assert pod.spec is not None
            assert pod.spec.resourceClaims, f"{name} was not translated"
            env = container_env(kube, name, namespace, pod.spec.containers[0].name)
            assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == memory, env
            assert env.get("GPUSHARE_CORES_PERCENT") == cores, env
            assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-fa4e"), env


def _delete_quietly(kube: Client, document: dict[str, Any]) -> None:
    with contextlib.suppress(ApiError):
        kube.delete(type(from_dict(document)), document["metadata"]["name"])


def explain(kube: Client, namespace: str, name: str) -> str:
    """What a pod that did not start shows: its status, its claims' status, its events."""
    lines = [f"pod {namespace}/{name}: {kube.get(Pod, name, namespace=namespace).to_dict()}"]
    for claim in kube.list(ResourceClaim, namespace=namespace):
        lines.append(f"claim: {claim.to_dict()}")
    for event in kube.list(Event, namespace=namespace):
        lines.append(f"event {event.reason}: {event.message}")
    return "\n".join(lines)


def translated(kube: Client, namespace: str, limits: dict[str, str]) -> bool | None:
    """Whether a probe pod asking ``limits`` (bound to no node: it never runs) is translated
    into a claim; the policies take effect within seconds of their creation, each on its own
    (the refusing one may come first)."""
    container = {"name": "main", "image": TEST_IMAGE, "resources": {"limits": limits}}
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": f"probe-{uuid.uuid4().hex[:5]}", "namespace": namespace},
             "spec": {"nodeName": "nowhere", "containers": [container]}}  # fmt: skip
    try:
        made: dict[str, Any] = kube.create(cast(Pod, from_dict(probe))).to_dict()
    except ApiError as error:
        if "gpushare-dra-untranslated" not in (error.status.message or ""):
            raise
        return None
    return True if made["spec"].get("resourceClaims") else None
