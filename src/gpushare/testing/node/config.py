"""The configuration files of a real test node: ``KubeletConfiguration`` and
``KubeProxyConfiguration``, with the settings this kind of machine needs (each function's
docstring says which and why; docs/testing.md, "The real-node tier")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpushare.testing.node.host import CGROUP_ROOT, GATEWAY, POD_SUBNET


def kubelet_configuration(
    *,
    runtime_endpoint: str,
    client_ca: Path,
    port: int,
    healthz_port: int,
    root: Path,
) -> dict[str, Any]:
    """``kubelet.config.k8s.io/v1beta1`` for a test node serving on :data:`GATEWAY`:``port``.

    * cgroup v1 allowed (``failCgroupV1: false``), cgroupfs driver, pod cgroups under
      :data:`CGROUP_ROOT`; no swap check; ``oomScoreAdj: 0`` (no CAP_SYS_RESOURCE here);
    * eviction and image garbage collection practically off (a busy test machine's disk must
      not evict pods or delete the locally imported images, which no registry can restore);
    * x509 authentication against the control plane's CA (kube-apiserver presents the admin
      pair for logs and exec), every authenticated request allowed: test only;
    * node status every 2 s (device-plugin capacity reaches the Node quickly).
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": CGROUP_ROOT,
        "cgroupsPerQOS": True,
        "failSwapOn": False,
        "containerRuntimeEndpoint": runtime_endpoint,
        "imageServiceEndpoint": runtime_endpoint,
        "oomScoreAdj": 0,
        "address": GATEWAY,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "nodeStatusUpdateFrequency": "2s",
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "podLogsDir": str(root / "pod-logs"),
        "volumePluginDir": str(root / "volume-plugins"),
        "resolvConf": "",
        "serializeImagePulls": False,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "registerNode": True,
    }


def kube_proxy_configuration(
    *, kubeconfig: Path, node_name: str, healthz_port: int, metrics_port: int
) -> dict[str, Any]:
    """``kubeproxy.config.k8s.io/v1alpha1``, iptables mode, touching no conntrack sysctl.

    ``masqueradeAll``: replies from a Service's backend pod on the same bridge return through
    the host, so that the DNAT is undone (no br_netfilter needed for hairpin traffic). NodePorts
    only on :data:`GATEWAY` (loopback NodePorts would make kube-proxy set ``route_localnet``).
    """
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "mode": "iptables",
        "bindAddress": GATEWAY,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}",
        "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        "clusterCIDR": POD_SUBNET,
        "nodePortAddresses": [f"{GATEWAY}/32"],
        "iptables": {"masqueradeAll": True, "syncPeriod": "5s", "minSyncPeriod": "0s"},
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
