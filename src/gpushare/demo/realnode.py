"""``gpushare demo up --real-node``: a real kubelet + containerd node beside the kwok ones, with
``gpushare device-plugin`` over fake GPUs, and the binpack example run on it for real.

* :func:`start_real_node` (in the demo's background process): the real node
  (``gpushare.testing.node.RealNode``: containerd, kubelet, kube-proxy, the local test images),
  tainted :data:`TAINT` so that only the pods made for it land there (the other examples'
  images exist in no registry here), and ``gpushare device-plugin --fake-gpus``
  (:data:`REAL_GPUS`) on it with a ServiceAccount of exactly its documented rules, registered
  with the real kubelet; returns once the node's allocatable ``aliyun.com/gpu-mem`` is the
  fake GPUs' total.
* :func:`apply_real_examples` (in ``up``): the pods of ``examples/binpack.yaml`` as copies in
  namespace :data:`NAMESPACE`, run on the real node (the local test image, printing its
  environment, ``gpushare.testing.node.gpu.runnable``), one at a time, each Running before the
  next (the demo's extender runs without the handshake rule, for the kwok nodes: equal pods
  created together could meet Allocate in either order); then :func:`real_outcome` reads each
  container's ``ALIYUN_COM_GPU_MEM_*`` variables back through the API server, as ``kubectl
  logs`` does and as Alibaba's walkthrough shows them.

Needs root and the node runtime (``make node-runtime``); what is missing is said before
anything starts (``check_prerequisites``).
"""

from __future__ import annotations

import contextlib
import functools
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.codecs import load_all_yaml
from lightkube.core.exceptions import ApiError
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Namespace, Node, Pod

from gpushare.demo.examples import EXAMPLES
from gpushare.kube.codec import GPU_MEM
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    wait_for,
)
from gpushare.testing.node import NodeHost, RealNode
from gpushare.testing.node.gpu import PLUGIN_RULES, container_env, runnable

__all__ = [
    "NAMESPACE",
    "REAL_GPUS",
    "REAL_NODE",
    "TAINT",
    "apply_real_examples",
    "real_outcome",
    "start_real_node",
]

REAL_NODE = "demo-real-0"
REAL_GPUS = "2x16GiB:Tesla-T4"
"""The real node's fake GPUs (``gpushare device-plugin --fake-gpus``)."""
REAL_GPU_MEM = 32
TAINT = {"key": "gpushare.io/demo-real-node", "value": "true", "effect": "NoSchedule"}
"""Keeps the kwok examples off the real node (their images are in no registry here)."""
NAMESPACE = "real-node"
SOURCE = "binpack.yaml"
ENV_PREFIX = "ALIYUN_COM_GPU_MEM_"


def start_real_node(
    stack: contextlib.ExitStack, host: NodeHost, plane: ControlPlane, logs: Path
) -> RealNode:
    """Start the real node and its device plugin (module doc); both stop with ``stack``."""
    node = stack.enter_context(RealNode(host, plane, name=REAL_NODE))
    with plane.client() as kube:
        kube.patch(Node, REAL_NODE, {"spec": {"taints": [TAINT]}})
    kubeconfig = plane.service_account_kubeconfig(
        "gpushare-device-plugin", "kube-system", PLUGIN_RULES
    )
    (metrics_port,) = free_ports(1)
    argv = gpushare_argv(
        "device-plugin", "--node-name", REAL_NODE, "--fake-gpus", REAL_GPUS,
        "--kubeconfig", str(kubeconfig), "--metrics-port", str(metrics_port),
    )  # fmt: skip
    plugin = ManagedProcess("gpushare-device-plugin", argv, logs).start()
    stack.callback(plugin.stop)

    def advertised() -> bool | None:
        with plane.client() as kube:
            status = kube.get(Node, REAL_NODE).status
        allocatable = (status.allocatable if status is not None else None) or {}
        return allocatable.get(GPU_MEM) == str(REAL_GPU_MEM) or None

    wait_for(f"{REAL_GPU_MEM} {GPU_MEM} on {REAL_NODE}", advertised, 120, processes=[plugin])
    return node


def _real_pods() -> list[Pod]:
    """``examples/binpack.yaml``'s pods made to run on the real node (module doc)."""
    pods = []
    for obj in load_all_yaml((EXAMPLES / SOURCE).read_text()):
        if obj.kind != "Pod":
            continue
        body: dict[str, Any] = obj.to_dict()  # type: ignore[no-untyped-call]
        body["metadata"]["name"] = f"real-{body['metadata']['name']}"
        body["spec"]["nodeSelector"] = {"kubernetes.io/hostname": REAL_NODE}
        body["spec"]["tolerations"] = [dict(TAINT, operator="Equal")]
        pods.append(runnable(body, NAMESPACE))
    return pods


def apply_real_examples(kube: Client, *, timeout_s: float = 120.0) -> list[str]:
    """Create the real node's pods one at a time, each Running before the next; their names.
    A pod that exists already is left alone (``up`` can run twice)."""
    with contextlib.suppress(ApiError):
        kube.create(Namespace(metadata=ObjectMeta(name=NAMESPACE)))
    names = []
    for pod in _real_pods():
        assert pod.metadata is not None
        assert pod.metadata.name is not None
        name = pod.metadata.name
        names.append(name)
        try:
            kube.create(pod)
        except ApiError as error:
            if error.status.code != 409:
                raise
        wait_for(f"{NAMESPACE}/{name} Running", functools.partial(_running, kube, name), timeout_s)
    return names


def _running(kube: Client, name: str) -> bool | None:
    status = kube.get(Pod, name, namespace=NAMESPACE).status
    return (status is not None and status.phase == "Running") or None


def real_outcome(kube: Client, names: list[str]) -> str:
    """For each pod in ``names``: its node and the ``ALIYUN_COM_GPU_MEM_*`` variables its
    container printed, as lines for people."""
    lines = []
    for name in names:
        env = container_env(kube, name, NAMESPACE, "main")
        shown = " ".join(f"{k}={v}" for k, v in sorted(env.items()) if k.startswith(ENV_PREFIX))
        lines.append(f"  {NAMESPACE}/{name} on {REAL_NODE}: {shown or '(none)'}")
    return "\n".join(lines)
