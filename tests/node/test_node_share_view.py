"""The share view on the real kubelet and containerd (docs/share-view.md): a pod asking
``aliyun.com/gpu-mem`` is placed by kube-scheduler and the extender, admitted by the real
kubelet, and given by the device plugin's Allocate the share-view library (two read-only
mounts: the library and ``/etc/ld.so.preload``) and ``GPUSHARE_SHARE_MIB``; a program in it
reads its GPU through the stand-in CUDA driver and NVML (``tests/native``, the GPU being the
one thing that cannot exist here) and sees its share, every way CUDA programs and
``nvidia-smi`` read it. The container runs the gpushare image (glibc, as every CUDA image has)
with the stubs and the reader on a hostPath; it runs as root only to read them there."""

from __future__ import annotations

from typing import Any, cast

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.kube.codec import GPU_MEM
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.image import ImageArchive, build_image
from gpushare.testing.native import (
    CUDA_PATHS,
    MIB,
    NativeTools,
    Reading,
    build_tools,
    parse_reading,
)
from gpushare.testing.node import RealNode
from gpushare.testing.node.gpu import SCHEDULER_NAME, GpuStack

pytestmark = pytest.mark.node

TOOLS = "/opt/gpushare-stubs"
CARD_MIB = 16 * 1024  # the stack's fake GPUs: 2x16GiB
READ = (
    # the stand-in driver has the GPU Allocate gave the container, whole
    f'export STUB_CUDA_GPUS="$NVIDIA_VISIBLE_DEVICES:{CARD_MIB}"; '
    f'echo "share: $GPUSHARE_SHARE_MIB" >&2; exec {TOOLS}/read_share'
)


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> NativeTools:
    return build_tools(tmp_path_factory.mktemp("share-view-tools"))


@pytest.fixture(scope="module")
def image(real_node: tuple[ControlPlane, RealNode]) -> ImageArchive:
    """The gpushare image imported into the node's containerd (a glibc userland)."""
    _, node = real_node
    built = build_image()
    node.containerd.import_images(built.path)
    return built


def reader_pod(namespace: str, name: str, gpu_mem: int, tools: NativeTools, image: str) -> Pod:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "securityContext": {"runAsUser": 0, "runAsGroup": 0},
            "volumes": [
                {
                    "name": "tools",
                    "hostPath": {"path": str(tools.reader.parent), "type": "Directory"},
                }
            ],
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", READ],
                    "env": [{"name": "LD_LIBRARY_PATH", "value": f"{TOOLS}/lib"}],
                    "resources": {"limits": {GPU_MEM: str(gpu_mem)}},
                    "volumeMounts": [{"name": "tools", "mountPath": TOOLS, "readOnly": True}],
                }
            ],
        },
    }
    return cast(Pod, Pod.from_dict(body))


def finished_log(kube: Client, namespace: str, name: str) -> str:
    """The container's log once the pod has finished (the reader exits)."""

    def done() -> str | None:
        pod = kube.get(Pod, name, namespace=namespace)
        phase = pod.status.phase if pod.status else None
        if phase not in ("Succeeded", "Failed"):
            return None
        return "".join(kube.log(name, namespace=namespace, container="main"))

    return wait_for(f"pod {namespace}/{name} to finish", done, 120.0)


def reading_of(log: str) -> Reading:
    """The reader's JSON line among the container's log lines."""
    return parse_reading(next(line for line in log.splitlines() if line.startswith("{")))


def test_a_shared_container_reads_its_share_through_the_library_given_by_allocate(
    gpu_stack: GpuStack, kube: Client, namespace: str, tools: NativeTools, image: ImageArchive
) -> None:
    kube.create(reader_pod(namespace, "reader", 4, tools, f"docker.io/{image.reference}"))
    log = finished_log(kube, namespace, "reader")
    pod = kube.get(Pod, "reader", namespace=namespace)
    assert pod.status is not None, log
    assert pod.status.phase == "Succeeded", log
    (device,) = reading_of(log).devices
    share = 4 * 1024 * MIB
    seen = {path: (m.device_total, m.total) for path, m in device.cuda.items()}
    assert seen == dict.fromkeys(CUDA_PATHS, (share, share)), log
    assert device.nvml is not None, log
    assert device.nvml_v2 is not None, log
    assert (device.nvml.total, device.nvml_v2.total) == (share, share)
    assert all(m.free <= share for m in device.cuda.values())


def test_a_container_without_a_share_sees_the_whole_stand_in_card(
    gpu_stack: GpuStack, kube: Client, namespace: str, tools: NativeTools, image: ImageArchive
) -> None:
    """A pod outside gpushare (no GPU memory asked, the default scheduler) gets no library: the
    same reader in the same image sees the stand-in card whole."""
    body = reader_pod(namespace, "no-gpu", 0, tools, f"docker.io/{image.reference}").to_dict()
    container = body["spec"]["containers"][0]
    container["resources"] = {}
    container["command"] = [
        "sh", "-c",
        f'export STUB_CUDA_GPUS="GPU-00000000-0000-4000-8000-000000000000:{CARD_MIB}"; '
        f"exec {TOOLS}/read_share",
    ]  # fmt: skip
    del body["spec"]["schedulerName"]
    kube.create(cast(Pod, Pod.from_dict(body)))
    log = finished_log(kube, namespace, "no-gpu")
    (device,) = parse_reading(
        next(line for line in log.splitlines() if line.startswith("{"))
    ).devices
    card = CARD_MIB * MIB
    assert {m.total for m in device.cuda.values()} == {card}, log
