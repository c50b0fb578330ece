"""The image and the chart, for real: ``helm install`` runs gpushare as pods on the real node.

The image is built from the repository's Dockerfile by ``scripts/build-image.sh`` (buildah on
a base made from Debian's packages, no registry, no Docker engine) and imported into the node's
containerd. The real helm installs the chart with every value that matters written out here
(the image and ``imagePullPolicy: Never``, plain HTTP, fake GPUs, a pinned cluster IP): a
changed chart default does not change what this test installs. Then, as an operator sees it:

* the extender Deployment's two pods (the chart's default: a Lease holder and a follower that
  forwards to it) run on the node as the chart's ServiceAccount, uid 10001 with a read-only
  root, Ready through their readiness probe (``/readyz``, called by kubelet), no restart by the
  liveness probe; they read the cluster in-cluster (token, ``kube-root-ca.crt``);
* the device plugin DaemonSet's pod runs there as root with the host's kubelet device-plugin
  directory and ``/proc`` (hostPath), registers with the real kubelet: the Node advertises the
  fake GPUs' 32 GiB of ``aliyun.com/gpu-mem``;
* kube-scheduler with the extender entry of the chart's default-scheduler ConfigMap (wiring (a):
  the extender at its pinned cluster IP, reached from the host through kube-proxy) places a GPU
  pod; kubelet calls the plugin pod's Allocate; the container's env (``kubectl logs``) names
  the GPU the extender recorded; the extender's ledger equals the annotations;
* ``helm uninstall`` removes the pods, and the plugin its socket.

The module runs before the tests that use the ``gpu_stack`` processes (one device plugin per
kubelet): it checks that no other plugin is registered first.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightkube import Client
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import DaemonSet, Deployment
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod

from gpushare.kube.codec import GPU_MEM
from gpushare.testing.controlplane import (
    SERVICE_CLUSTER_IP_RANGE,
    ControlPlane,
    gpushare_extender,
    wait_for,
)
from gpushare.testing.helm import CHART_DIR, helm_ok
from gpushare.testing.image import ImageArchive, build_image
from gpushare.testing.live_extender import http_get
from gpushare.testing.node import DEVICE_PLUGIN_DIR, RealNode
from gpushare.testing.node.gpu import (
    annotated_usage,
    container_env,
    delete_pods,
    gpu_pod,
    ledger_usage,
)
from gpushare.testing.node.waits import gpu_env_matches_annotations, running, wait_event

# The first use builds the image when `make image` did not (about 2 minutes cold, more under load).
pytestmark = [pytest.mark.node, pytest.mark.timeout(1500)]

RELEASE = "chart"
NAMESPACE = "gpushare-chart"
FULLNAME = f"{RELEASE}-gpushare"  # the chart's <release>-<chart> prefix
CLUSTER_IP = str(ipaddress.ip_network(SERVICE_CLUSTER_IP_RANGE)[250])
EXTENDER_PORT = 12345
PREFIX = "/gpushare-scheduler"
FAKE_GPUS = "2x16GiB:T4"
SCHEDULER_NAME = "gpushare-chart-scheduler"  # stands for default-scheduler (wiring (a))
WAIT_S = 180.0


def chart_values(image: ImageArchive, plane: ControlPlane) -> dict[str, Any]:
    """Every value this test depends on, explicit (defaults may change, e.g. TLS)."""
    return {
        "image": {"repository": image.repository, "tag": image.tag, "pullPolicy": "Never"},
        "memoryUnit": "GiB",
        "nodeSelector": {"gpushare": "true"},
        "extender": {
            "enabled": True,
            "replicas": 2,  # the chart's default: a leader and a forwarding follower
            "policy": "binpack",
            "port": EXTENDER_PORT,
            "prefix": PREFIX,
            "tls": {"enabled": False},
            "service": {"type": "ClusterIP", "clusterIP": CLUSTER_IP},
        },
        "devicePlugin": {
            "enabled": True,
            "devicePluginDir": str(DEVICE_PLUGIN_DIR),
            "fakeGpus": FAKE_GPUS,
            "hostProc": True,
            "metricsPort": 9445,
            "runtimeClassName": "",
        },
        "scheduler": {
            "urlPrefix": "",
            "defaultSchedulerKubeconfig": str(plane.kubeconfig),
            "second": {"enabled": False},
        },
    }


def helm(plane: ControlPlane, *args: str) -> str:
    return helm_ok(plane.kubeconfig, *args, timeout_s=WAIT_S + 60)


def plugin_sockets() -> set[str] | None:
    """The device plugins' sockets kubelet sees (None: only kubelet's own)."""
    return {p.name for p in DEVICE_PLUGIN_DIR.glob("*.sock")} - {"kubelet.sock"} or None


def component_pods(kube: Client, component: str) -> list[Pod]:
    labels: dict[str, str | None] = {
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": component,
    }
    return list(kube.list(Pod, namespace=NAMESPACE, labels=dict(labels)))


def component_pod(kube: Client, component: str) -> Pod:
    (pod,) = component_pods(kube, component)
    return pod


def extender_get(path: str) -> tuple[int, Any]:
    """GET from the extender's Service, from the host: the path kube-scheduler takes."""
    return http_get(f"http://{CLUSTER_IP}:{EXTENDER_PORT}{path}", timeout_s=10)


def kubectl(plane: ControlPlane, *args: str) -> str:
    done = subprocess.run(
        [str(plane.binaries.path("kubectl")), "--kubeconfig", str(plane.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def image() -> ImageArchive:
    """The image archive (built, or reused when up to date, by scripts/build-image.sh)."""
    return build_image()


@pytest.fixture
def release(
    real_node: tuple[ControlPlane, RealNode], kube: Client, image: ImageArchive, tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """The image imported into the node's containerd and the chart installed (``helm install
    --wait``: the Deployment and the DaemonSet ready); uninstalled and waited for at the end."""
    plane, node = real_node
    assert not plugin_sockets(), (
        f"another device plugin is registered with kubelet ({plugin_sockets()}): this module "
        "must run before the gpu_stack tests"
    )
    node.containerd.import_images(image.path)
    listed = node.containerd.ctr("images", "ls", "--quiet").stdout.split()
    assert f"docker.io/{image.reference}" in listed, listed
    values = chart_values(image, plane)
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    helm(
        plane, "install", RELEASE, str(CHART_DIR), "--namespace", NAMESPACE,
        "--create-namespace", "--values", str(values_file), "--wait", "--timeout", f"{WAIT_S:.0f}s",
    )  # fmt: skip
    try:
        yield values
    finally:
        delete_pods(kube, NAMESPACE, ["cuda-share"])
        helm(plane, "uninstall", RELEASE, "--namespace", NAMESPACE, "--wait")
        wait_for(
            "the chart's pods gone",
            lambda: not list(kube.list(Pod, namespace=NAMESPACE)) or None,
            WAIT_S,
        )
        wait_for("the plugin's socket removed", lambda: not plugin_sockets() or None, 60.0)
        with contextlib.suppress(ApiError):
            kube.delete(Namespace, NAMESPACE)


def _volumes(pod: Pod) -> dict[str, str]:
    assert pod.spec is not None
    return {v.name: v.hostPath.path for v in pod.spec.volumes or [] if v.hostPath is not None}


def _assert_running_on(pod: Pod, node: RealNode, service_account: str) -> None:
    assert pod.spec is not None
    assert pod.status is not None
    assert pod.spec.nodeName == node.name
    assert pod.spec.serviceAccountName == service_account
    assert pod.status.phase == "Running"
    (status,) = pod.status.containerStatuses or []
    assert status.ready
    assert status.restartCount == 0, status


def test_helm_install_runs_gpushare_as_pods_and_a_gpu_pod_starts_through_them(
    real_node: tuple[ControlPlane, RealNode],
    kube: Client,
    release: Mapping[str, Any],
    image: ImageArchive,
) -> None:
    plane, node = real_node

    # The Deployment and the DaemonSet, as kube-controller-manager and kubelet run them.
    deployment = kube.get(Deployment, f"{FULLNAME}-extender", namespace=NAMESPACE)
    assert deployment.status is not None
    assert deployment.status.readyReplicas == 2
    daemonset = kube.get(DaemonSet, f"{FULLNAME}-device-plugin", namespace=NAMESPACE)
    assert daemonset.status is not None
    assert (daemonset.status.desiredNumberScheduled, daemonset.status.numberReady) == (1, 1)

    extenders = component_pods(kube, "extender")
    assert len(extenders) == 2
    for extender in extenders:
        _assert_running_on(extender, node, f"{FULLNAME}-extender")
        assert extender.spec is not None
        (container,) = extender.spec.containers
        assert container.image == image.reference
        assert container.imagePullPolicy == "Never"
        assert container.readinessProbe is not None
        assert container.readinessProbe.httpGet is not None
        assert container.readinessProbe.httpGet.path == "/readyz"
        assert container.livenessProbe is not None
        assert container.livenessProbe.httpGet is not None
        assert container.livenessProbe.httpGet.path == "/healthz"
        assert extender.metadata is not None
        assert extender.metadata.name
        ids = kubectl(plane, "exec", "-n", NAMESPACE, extender.metadata.name, "--",
                      "python3", "-c", "import os; print(os.getuid(), os.getgid())")  # fmt: skip
        assert ids.split() == ["10001", "10001"]

    plugin = component_pod(kube, "device-plugin")
    _assert_running_on(plugin, node, f"{FULLNAME}-device-plugin")
    assert _volumes(plugin) == {
        "device-plugins": str(DEVICE_PLUGIN_DIR),
        "host-proc": "/proc",
        "share-view": "/var/lib/gpushare/lib",
    }
    # The DaemonSet has no readiness probe: Ready when started, its socket a moment later.
    wait_for(f"the plugin's socket in {DEVICE_PLUGIN_DIR} on the host", plugin_sockets, 60.0)

    def advertised() -> str | None:
        status = kube.get(Node, node.name).status
        allocatable = (status.allocatable if status else None) or {}
        return allocatable.get(GPU_MEM) if allocatable.get(GPU_MEM) == "32" else None

    wait_for(f"node allocatable {GPU_MEM}=32", advertised, 60.0)

    # Wiring (a): the ConfigMap the chart renders for the default scheduler, as docs/install.md
    # takes it to the control-plane hosts.
    config_map = kube.get(ConfigMap, f"{FULLNAME}-default-scheduler-config", namespace=NAMESPACE)
    assert config_map.data is not None
    config = yaml.safe_load(config_map.data["kube-scheduler-config.yaml"])
    assert config["clientConnection"] == {"kubeconfig": str(plane.kubeconfig)}
    (entry,) = config["extenders"]
    assert entry == gpushare_extender(f"http://{CLUSTER_IP}:{EXTENDER_PORT}{PREFIX}")
    # From the host, through kube-proxy: the Service answers once kube-proxy has programmed the
    # Ready pods' endpoints, a few seconds after Ready on a loaded machine (a single GET right
    # after Ready failed there now and then).
    wait_for("the extender's /readyz through kube-proxy",
             lambda: extender_get("/readyz")[0] == 200 or None, 60.0)  # fmt: skip

    with plane.scheduler(
        "kube-scheduler-chart", profiles=[{"schedulerName": SCHEDULER_NAME}], extenders=[entry]
    ):
        pod = gpu_pod(NAMESPACE, "cuda-share", {"main": 4})
        assert pod.spec is not None
        pod.spec.schedulerName = SCHEDULER_NAME
        kube.create(pod)
        started = running(kube, NAMESPACE, "cuda-share")
        seen = gpu_env_matches_annotations(kube, started, node.name)
        assert seen == {"main": [0]}  # binpack: the first GPU
        wait_event(kube, NAMESPACE, "cuda-share", "GPUAssigned", node.name)
        # The share view from the image, installed on the host by the DaemonSet and given by
        # Allocate (docs/share-view.md); declared GPUs have no NVML: the library's advisory
        # refusal is the strongest backend there.
        env = container_env(kube, "cuda-share", NAMESPACE, "main")
        assert env["GPUSHARE_SHARE_MIB"] == f"{env['NVIDIA_VISIBLE_DEVICES']}=4096"
        assert env["GPUSHARE_SHARE_ENFORCE"] == "1"
        wait_event(kube, NAMESPACE, "cuda-share", "GPUAllocated", "share advisory (library)")
        assert list(Path("/var/lib/gpushare/lib").glob("libgpushare-share-*.so"))

        status, report = extender_get(f"{PREFIX}/inspect/{node.name}")
        assert status == 200, report
        assert ledger_usage(report) == annotated_usage(kube, node.name)
        assert all(dev["usedGPU"] <= dev["totalGPU"] for dev in report["devs"])

    assert plugin.metadata is not None
    assert plugin.metadata.name
    plugin_log = "".join(kube.log(plugin.metadata.name, namespace=NAMESPACE))
    assert "cuda-share" in plugin_log, plugin_log[-2000:]
