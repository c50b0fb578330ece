"""A real Kubernetes node on this machine for the real-node test tier (``tests/node``).

kubelet v1.37.1 (built with the control plane by ``scripts/build-controlplane.sh``), containerd,
runc and the CNI plugins (``scripts/install-node-runtime.sh``), kube-proxy, and two images made
here without a registry (:mod:`gpushare.testing.node.images`). Three layers, each a context
manager, entered in this order (or all at once with :func:`node_cluster`):

* :class:`NodeHost`: the machine-wide lock ``/run/gpushare-node.lock`` (one real node per
  machine: kubelet always uses ``/var/lib/kubelet/device-plugins/``), the bridge ``gpushare0``
  at ``10.77.0.1/24`` that pods and kube-apiserver share, a temp root; on close it removes new
  mounts, network namespaces, cgroups, the bridge, iptables-free state and restores the
  device-plugin directory and sysctls as they were;
* :class:`~gpushare.testing.controlplane.ControlPlane` with ``bind_address=host.address`` and
  ``controller_manager=True``;
* :class:`RealNode`: containerd, kubelet and kube-proxy; waits until the Node is Ready.

Pods use ``image: TEST_IMAGE`` and ``imagePullPolicy: Never``. Test-only code: nothing in the
``gpushare`` runtime packages may import it. Needs root.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gpushare.testing.controlplane import Binaries, ControlPlane
from gpushare.testing.node.containerd import Containerd, cni_conflist, containerd_config
from gpushare.testing.node.host import (
    BRIDGE,
    CGROUP_ROOT,
    DEVICE_PLUGIN_DIR,
    GATEWAY,
    LOCK_PATH,
    POD_SUBNET,
    NodeHost,
)
from gpushare.testing.node.images import PAUSE_IMAGE, TEST_IMAGE, write_image_archive
from gpushare.testing.node.node import NODE_LABELS, RealNode, node_ready
from gpushare.testing.node.prerequisites import check_prerequisites


@contextlib.contextmanager
def node_cluster(
    binaries: Binaries,
    *,
    log_dir: Path | None = None,
    node_name: str = "gpushare-node",
    kube_proxy: bool = True,
) -> Iterator[tuple[ControlPlane, RealNode]]:
    """Host, control plane (with kube-controller-manager) and one Ready real node; all three
    torn down on exit, in reverse order, whatever happened."""
    check_prerequisites()
    with (
        NodeHost() as host,
        ControlPlane(
            binaries, log_dir=log_dir, bind_address=host.address, controller_manager=True
        ) as plane,
        RealNode(host, plane, name=node_name, kube_proxy=kube_proxy) as node,
    ):
        yield plane, node


__all__ = [
    "BRIDGE",
    "CGROUP_ROOT",
    "DEVICE_PLUGIN_DIR",
    "GATEWAY",
    "LOCK_PATH",
    "NODE_LABELS",
    "PAUSE_IMAGE",
    "POD_SUBNET",
    "TEST_IMAGE",
    "Containerd",
    "NodeHost",
    "RealNode",
    "check_prerequisites",
    "cni_conflist",
    "containerd_config",
    "node_cluster",
    "node_ready",
    "write_image_archive",
]
