"""The real node on a lent GPU machine: what ``bench/gpu/node.sh`` runs once the bundles are
unpacked and runc and containerd have passed its probe (docs/testing.md, "Real GPU node").

The harness of the real-node tier (``gpushare.testing.node``: the same host set-up, the same
containerd and kubelet configuration) with what the machine holds instead of fakes: etcd,
kube-apiserver, kube-scheduler and a second kube-scheduler with gpushare's extender entry,
kubelet + containerd (no kube-proxy, kwok or kube-controller-manager: not carried), ``gpushare
extender``, and then either

* ``device-plugin``: ``gpushare device-plugin`` over NVML with ``--mps-managed`` (the MPS control
  daemon run and supervised by the plugin; implies ``--mps``) and ``--cdi gpushare`` (the
  GPU's device nodes and the driver's files given to the container as CDI devices), a pod asking
  ``aliyun.com/gpu-mem`` through the extender's scheduler; or
* ``dra``: ``gpushare dra-driver`` over NVML with ``--mps``, a ResourceClaim of gpushare's
  DeviceClass and a pod using it (kube-scheduler allocates).

The pod runs the busybox test image with the machine's ``/usr``, ``/lib``, ``/lib64`` and
``/opt`` mounted read-only (hostPath): its shell prints the GPU variables and device nodes it
got, runs ``nvidia-smi -L`` and the machine's Python with PyTorch. Writes
``<out>/result-<mode>.json`` (the pod's phase and log) and the processes' logs as
``<out>/logs-<mode>.tar.gz``; exits 1 when the pod did not succeed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lightkube import Client
from lightkube.codecs import from_dict
from lightkube.core.exceptions import ApiError
from lightkube.models.rbac_v1 import PolicyRule
from lightkube.resources.core_v1 import Node, Pod

from gpushare.dra.slices import device_class
from gpushare.kube.codec import GPU_MEM
from gpushare.kube.codec.dra import DEVICE_CLASS, MEMORY
from gpushare.testing.controlplane import (
    Binaries,
    ControlPlane,
    ControlPlaneError,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    gpushare_extender,
    http_ok,
    wait_for,
    wait_until,
)
from gpushare.testing.node import TEST_IMAGE, NodeHost, RealNode
from gpushare.testing.node.gpu import EXTENDER_PREFIX, PLUGIN_RULES, SCHEDULER_NAME
from gpushare.testing.rbac import DRA_DRIVER_RULES

MODES = ("device-plugin", "dra")
NAMESPACE = "default"
POD = "gpu-check"
CGROUP2 = Path("/sys/fs/cgroup")
CGROUP_ROOT = CGROUP2 / "gpushare-node"
HOST_DIRS = ("/usr", "/lib", "/lib64", "/opt")
CONFIGMAP_RULES = [
    PolicyRule(apiGroups=[""], resources=["configmaps"], verbs=["get", "list", "watch"])
]


def pod_script(python: str) -> str:
    """What the pod's shell runs: the GPU it was given, ``nvidia-smi -L``, PyTorch on it."""
    torch_check = (
        "import torch; ok = torch.cuda.is_available(); "
        "print('torch', torch.__version__, 'cuda', ok); "
        "ok and print('device', torch.cuda.get_device_name(0), "
        "'mem_get_info_bytes', torch.cuda.mem_get_info()); "
        "ok and print('matmul', float((torch.ones(1024, 1024, device='cuda') @ "
        "torch.ones(1024, 1024, device='cuda')).sum()))"
    )
    return (
        "env | sort | grep -E '^(ALIYUN|CUDA|NVIDIA|GPUSHARE)' ; ls -l /dev/nvidia* ; "
        f'nvidia-smi -L && {python} -c "{torch_check}"'
    )


def pod_body(mode: str, python: str, memory_gib: int) -> dict[str, Any]:
    """The check pod (module doc) for ``mode``; ``memory_gib`` of one GPU."""
    mounts = [d for d in HOST_DIRS if Path(d).exists()]
    container: dict[str, Any] = {
        "name": "main",
        "image": TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", pod_script(python)],
        "env": [
            {"name": "PATH", "value": "/bin:/usr/local/nvidia/bin:/usr/bin"},
            {"name": "LD_LIBRARY_PATH", "value": "/usr/local/nvidia/lib64:/usr/local/nvidia/lib"},
        ],
        "volumeMounts": [
            {"name": f"host{i}", "mountPath": d, "readOnly": True} for i, d in enumerate(mounts)
        ],
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "containers": [container],
        "volumes": [{"name": f"host{i}", "hostPath": {"path": d}} for i, d in enumerate(mounts)],
    }
    if mode == "device-plugin":
        spec["schedulerName"] = SCHEDULER_NAME
        container["resources"] = {"limits": {GPU_MEM: str(memory_gib)}}
    else:
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": POD}]
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": POD, "namespace": NAMESPACE}, "spec": spec}  # fmt: skip


def claim_body(memory_gib: int) -> dict[str, Any]:
    """A ResourceClaim of ``memory_gib`` of one GPU of gpushare's DeviceClass."""
    request = {"deviceClassName": DEVICE_CLASS,
               "capacity": {"requests": {MEMORY: f"{memory_gib}Gi"}}}  # fmt: skip
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": POD, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": request}]}},
    }  # fmt: skip


@contextlib.contextmanager
def cgroup2_root() -> Iterator[None]:
    """On cgroup v2, kubelet's ``cgroupRoot`` (``NodeHost`` makes it in v1's hierarchies only)
    with the controllers kubelet needs enabled; removed afterwards (deepest first)."""
    if not (CGROUP2 / "cgroup.controllers").exists():
        yield
        return
    wanted = set((CGROUP2 / "cgroup.controllers").read_text().split()) & {
        "cpu", "cpuset", "memory", "pids", "io", "hugetlb",
    }  # fmt: skip
    enable = " ".join(f"+{c}" for c in sorted(wanted))
    (CGROUP2 / "cgroup.subtree_control").write_text(enable)
    CGROUP_ROOT.mkdir(exist_ok=True)
    (CGROUP_ROOT / "cgroup.subtree_control").write_text(enable)
    try:
        yield
    finally:
        for path in sorted(CGROUP_ROOT.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                with contextlib.suppress(OSError):
                    path.rmdir()
        with contextlib.suppress(OSError):
            CGROUP_ROOT.rmdir()


def node_allocatable(client: Client, node: str, resource: str) -> int:
    found = client.get(Node, node)
    allocatable = (found.status.allocatable if found.status else None) or {}
    return int(allocatable.get(resource, "0"))


def start_extender(plane: ControlPlane, workdir: Path) -> tuple[ManagedProcess, int]:
    (port,) = free_ports(1)
    proc = ManagedProcess(
        "gpushare-extender",
        gpushare_argv("extender", "--host", "127.0.0.1", "--port", str(port),
                      "--kubeconfig", str(plane.kubeconfig), "--log-level", "debug",
                      "--policy", "binpack"),
        workdir,
    ).start()  # fmt: skip
    wait_until(
        "extender /readyz",
        lambda: http_ok(f"http://127.0.0.1:{port}/readyz"),
        60.0,
        processes=[proc],
    )
    return proc, port


def stop_and_keep(plane: ControlPlane, proc: ManagedProcess) -> None:
    proc.stop()
    plane.keep_log(proc)


def gpu_server_argv(
    mode: str, plane: ControlPlane, node: RealNode, fake_gpus: str | None
) -> list[str]:
    """``gpushare device-plugin`` or ``gpushare dra-driver`` over NVML for ``node`` (over
    ``--fake-gpus``, without MPS or CDI, when ``fake_gpus``: a rehearsal where there is no GPU)."""
    cdi_dir = str(node.containerd.cdi_dir)
    gpus = ["--fake-gpus", fake_gpus] if fake_gpus else []
    if mode == "device-plugin":
        kubeconfig = plane.service_account_kubeconfig(
            "gpushare-device-plugin", "kube-system", PLUGIN_RULES
        )
        (metrics,) = free_ports(1)
        return gpushare_argv(
            "device-plugin", "--node-name", node.name, "--kubeconfig", str(kubeconfig),
            *(gpus or ["--mps-managed", "--cdi", "gpushare"]), "--cdi-dir", cdi_dir,
            "--metrics-port", str(metrics), "--log-level", "debug",
        )  # fmt: skip
    kubeconfig = plane.service_account_kubeconfig(
        "gpushare-dra-driver", "kube-system", [*DRA_DRIVER_RULES, *CONFIGMAP_RULES]
    )
    return gpushare_argv(
        "dra-driver", "--node-name", node.name, "--kubeconfig", str(kubeconfig),
        *(gpus or ["--mps"]),
        "--plugin-dir", str(node.kubelet_root / "plugins"),
        "--registry-dir", str(node.kubelet_root / "plugins_registry"),
        "--cdi-dir", cdi_dir, "--log-level", "debug",
    )  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Bring the node up, run the check pod, return what it showed (module doc)."""
    log_dir: Path = args.out / f"logs-{args.mode}"
    log_dir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"mode": args.mode, "started": time.strftime("%FT%TZ", time.gmtime())}
    binaries = Binaries(args.bin_dir)
    with (
        cgroup2_root(),
        NodeHost() as host,
        ControlPlane(binaries, log_dir=log_dir, bind_address=host.address, kwok=False) as plane,
        RealNode(host, plane, kube_proxy=False, snapshotter=args.snapshotter) as node,
        contextlib.ExitStack() as stack,
    ):
        t0 = time.monotonic()
        workdir = node.root / "gpushare"
        workdir.mkdir(parents=True, exist_ok=True)
        extender, port = start_extender(plane, workdir)
        stack.callback(stop_and_keep, plane, extender)
        stack.enter_context(plane.scheduler(
            "kube-scheduler-gpushare", profiles=[{"schedulerName": SCHEDULER_NAME}],
            extenders=[gpushare_extender(f"http://127.0.0.1:{port}{EXTENDER_PREFIX}")],
        ))  # fmt: skip
        argv = gpu_server_argv(args.mode, plane, node, args.fake_gpus)
        server = ManagedProcess(f"gpushare-{args.mode}", argv, workdir).start()
        stack.callback(stop_and_keep, plane, server)
        with plane.client() as client:
            if args.mode == "device-plugin":
                units = wait_for(
                    f"node allocatable {GPU_MEM}",
                    lambda: node_allocatable(client, node.name, GPU_MEM) or None,
                    args.timeout_s, processes=[server, node.kubelet] if node.kubelet else [server],
                )  # fmt: skip
                result["allocatable_gpu_mem"] = units
            else:
                with contextlib.suppress(ApiError):
                    client.create(from_dict(device_class(DEVICE_CLASS)))
                client.create(from_dict(claim_body(args.memory_gib)))
            result["node_ready_s"] = round(time.monotonic() - t0, 1)
            client.create(from_dict(pod_body(args.mode, args.python, args.memory_gib)))

            def finished() -> str | None:
                pod = client.get(Pod, POD, namespace=NAMESPACE)
                phase = pod.status.phase if pod.status else None
                return phase if phase in ("Succeeded", "Failed") else None

            try:
                result["phase"] = wait_for("the check pod finished", finished, args.timeout_s,
                                           processes=[server, extender])  # fmt: skip
            except ControlPlaneError as error:
                result["phase"] = "timeout"
                result["error"] = str(error)
                pod = client.get(Pod, POD, namespace=NAMESPACE)
                result["pod_status"] = pod.status.to_dict() if pod.status else None
            with contextlib.suppress(ApiError):
                result["log"] = "".join(client.log(POD, namespace=NAMESPACE)).splitlines()
            result["pod_s"] = round(time.monotonic() - t0, 1)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=MODES)
    parser.add_argument("--bin-dir", type=Path, required=True, help="the unpacked binaries")
    parser.add_argument("--snapshotter", default="overlayfs", choices=("overlayfs", "native"))
    parser.add_argument("--out", type=Path, default=Path("out/gpu-node"))
    parser.add_argument("--python", default=sys.executable, help="the pod's Python (the host's)")
    parser.add_argument("--memory-gib", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=180.0)
    parser.add_argument(
        "--fake-gpus", help="rehearse without a GPU (e.g. 1x16GiB:T4): the pod's GPU steps fail"
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("node_run: needs root (kubelet, containerd, mounts)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        result = run(args)
    except ControlPlaneError as error:
        result = {"mode": args.mode, "phase": "error", "error": str(error)}
    path = args.out / f"result-{args.mode}.json"
    path.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    shutil.make_archive(str(args.out / f"logs-{args.mode}"), "gztar", args.out,
                        f"logs-{args.mode}")  # fmt: skip
    # One archive, not a file per process: the device tool returns at most 8 files from $OUT.
    shutil.rmtree(args.out / f"logs-{args.mode}", ignore_errors=True)
    return 0 if result.get("phase") == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
