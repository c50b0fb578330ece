"""A GPU and its driver through CDI on the real kubelet and containerd, without the NVIDIA
container toolkit (docs/deviceplugin.md, "How the GPU gets into the container"): the device
plugin, started with ``--cdi auto`` pointed at a stand-in driver (``gpushare.testing.
nvidia_files``: device nodes with /dev/null's numbers made with ``mknod``, versioned libraries
with their soname links, an ``nvidia-smi`` script; the GPU being the one thing that cannot exist
here), writes gpushare's CDI spec into containerd's ``cdi_spec_dirs``; Allocate names the
container's GPU (``gpushare.io/nvidia-gpu=<uuid>``), kubelet hands it to containerd
(DevicePluginCDIDevices), and the running container lists what it got: its GPU's device node
and no other GPU's, the control nodes, the libraries under their sonames in one directory with
``LD_LIBRARY_PATH`` naming it, and ``nvidia-smi`` runnable from ``/usr/bin`` (the test image's
``PATH`` is ``/bin`` alone: it is run by its path)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.models.core_v1 import PodSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Pod

from gpushare.deviceplugin.cdi import (
    CONTAINER_BIN_DIR,
    CONTAINER_LIB_DIR,
    GPUSHARE_KIND,
    LIBRARY_PATH,
    SPEC_FILE_NAME,
)
from gpushare.deviceplugin.inventory import parse_fake_gpus
from gpushare.testing.controlplane import ControlPlane, wait_for
from gpushare.testing.node import RealNode
from gpushare.testing.node.gpu import SCHEDULER_NAME, GpuStack, gpu_container
from gpushare.testing.nvidia_files import stand_in_driver

pytestmark = pytest.mark.node

CONTROL = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")
NODES = ("/dev/nvidia0", "/dev/nvidia1", *CONTROL)
LIST = (
    f"for f in {' '.join(NODES)}; do "
    'if [ -c "$f" ]; then echo "chardev $f"; elif [ -e "$f" ]; then echo "other $f"; fi; done; '
    f"cat {CONTAINER_LIB_DIR}/libcuda.so.1 {CONTAINER_LIB_DIR}/libnvidia-ml.so.1; "
    f"{CONTAINER_BIN_DIR}/nvidia-smi; env | sort"
)
"""What the container prints: the device nodes it has, the stand-in libraries read through
their sonames, the stand-in ``nvidia-smi``'s output, its environment."""


def finished_log(kube: Client, namespace: str, name: str) -> tuple[str, str]:
    """The pod's phase and its container's log once it has finished."""

    def done() -> tuple[str, str] | None:
        pod = kube.get(Pod, name, namespace=namespace)
        phase = pod.status.phase if pod.status else None
        if phase not in ("Succeeded", "Failed"):
            return None
        return phase, "".join(kube.log(name, namespace=namespace, container="main"))

    return wait_for(f"pod {namespace}/{name} to finish", done, 120.0)


def test_a_pod_gets_its_gpus_device_node_and_the_driver_through_gpushares_cdi_spec(
    gpu_stack: GpuStack,
    real_node: tuple[ControlPlane, RealNode],
    kube: Client,
    namespace: str,
    tmp_path: Path,
) -> None:
    _, node = real_node
    stand_in = stand_in_driver(tmp_path / "nvidia")  # mknod: the tier runs as root
    cdi_dir = node.containerd.cdi_dir
    with gpu_stack.plugin_flags(*stand_in.flags(cdi_dir)):
        spec = json.loads((cdi_dir / SPEC_FILE_NAME).read_text())
        assert spec["kind"] == GPUSHARE_KIND
        pod = Pod(
            metadata=ObjectMeta(name="cdi", namespace=namespace),
            spec=PodSpec(
                schedulerName=SCHEDULER_NAME,
                restartPolicy="Never",
                terminationGracePeriodSeconds=2,
                containers=[gpu_container("main", 4, command=LIST)],
            ),
        )
        kube.create(pod)
        phase, log = finished_log(kube, namespace, "cdi")
    assert phase == "Succeeded", log
    lines = log.splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line and line[0].isupper())
    index = int(env["ALIYUN_COM_GPU_MEM_IDX"])
    uuid = parse_fake_gpus(gpu_stack.fake_gpus)[index].uuid
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    other = 1 - index
    assert f"chardev /dev/nvidia{index}" in lines, log
    assert not any(line.endswith(f"/dev/nvidia{other}") for line in lines), log
    for control in CONTROL:
        assert f"chardev {control}" in lines, log
    version = stand_in.version
    assert f"stand-in libcuda.so.{version}" in lines, log
    assert f"stand-in libnvidia-ml.so.{version}" in lines, log
    assert "stand-in nvidia-smi" in lines, log
    assert env["LD_LIBRARY_PATH"] == LIBRARY_PATH
