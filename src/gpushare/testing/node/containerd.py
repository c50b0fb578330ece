"""containerd for a real test node: its own config, root, state and socket in a temp directory.

The settings come from a trial on this kind of machine (docs/testing.md, "The real-node tier"):
``restrict_oom_score_adj`` (root here lacks CAP_SYS_RESOURCE, so runc cannot set a sandbox's
``oom_score_adj: -998``: every sandbox would fail with "can't get final child's PID from pipe"),
the locally imported pause image as ``sandbox_image``, cgroupfs (no systemd), overlayfs,
no AppArmor, and the CNI configuration of :func:`cni_conflist`.

**Started means CRI answers.** containerd serves its socket (``ctr version`` answers) before its
CRI plugin has recovered the state of the sandboxes and containers it knows (a node that ran
pods, then lost power: 175 ms for a few dozen); until then every CRI call fails with
"server is not initialized yet", and kubelet, started in that window, exits at once ("validate
CRI v1 runtime API"). A real node's systemd restarts kubelet; :meth:`Containerd.start` returns
only once the CRI runtime service answers (:meth:`Containerd.serves_cri`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import grpc

from gpushare.testing.controlplane import ControlPlaneError, ManagedProcess, wait_until
from gpushare.testing.node.host import BRIDGE, GATEWAY, POD_SUBNET
from gpushare.testing.node.images import PAUSE_IMAGE

CNI_BIN_DIR = Path("/usr/lib/cni")  # Debian's containernetworking-plugins
NAMESPACE = "k8s.io"  # the containerd namespace of the CRI plugin


def cni_conflist(ipam_dir: Path) -> dict[str, Any]:
    """A ``bridge`` + ``host-local`` network on :data:`BRIDGE` (cniVersion 0.4.0)."""
    base = GATEWAY.rsplit(".", 1)[0]
    return {
        "cniVersion": "0.4.0",
        "name": "gpushare-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "dataDir": str(ipam_dir),
                    "ranges": [
                        [
                            {
                                "subnet": POD_SUBNET,
                                "rangeStart": f"{base}.10",
                                "rangeEnd": f"{base}.250",
                                "gateway": GATEWAY,
                            }
                        ]
                    ],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            }
        ],
    }


def containerd_config(root: Path) -> str:
    """containerd 1.6 configuration (version 2) with everything under ``root``."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    return f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
[grpc]
  address = "{root / "containerd.sock"}"
[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{root / "runc"}"
[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{root / "cni" / "net.d"}"
"""


def containerd2_config(root: Path, bin_dir: Path, snapshotter: str = "overlayfs") -> str:
    """containerd 2.x configuration (version 4) with everything under ``root``, ``snapshotter``
    for images (``native`` where overlay mounts are refused: ``bench/gpu/node.sh``), the runc
    shim of ``bin_dir`` (not the first on ``PATH``, which may be another version's), CDI specs read
    from ``root/cdi`` (the DRA driver's ``--cdi-dir``; CDI is always on in 2.x). The settings of
    :func:`containerd_config`, in 2.x's places: the CRI plugin is split into
    ``io.containerd.cri.v1.images`` and ``io.containerd.cri.v1.runtime``, and the sockets are
    the ``io.containerd.server.v1.grpc``/``ttrpc`` plugins' (a top-level ``[grpc]`` is ignored:
    the daemon would listen on ``/run/containerd/containerd.sock``)."""
    images, runtime = (
        "plugins.'io.containerd.cri.v1.images'",
        "plugins.'io.containerd.cri.v1.runtime'",
    )
    return f"""version = 4
root = '{root / "root"}'
state = '{root / "state"}'
imports = []
[plugins.'io.containerd.server.v1.grpc']
  address = '{root / "containerd.sock"}'
[plugins.'io.containerd.server.v1.ttrpc']
  address = '{root / "containerd.sock.ttrpc"}'
[plugins.'io.containerd.internal.v1.opt']
  path = '{root / "opt"}'
[{images}]
  snapshotter = '{snapshotter}'
[{images}.pinned_images]
  sandbox = '{PAUSE_IMAGE}'
[{runtime}]
  restrict_oom_score_adj = true
  disable_apparmor = true
  cdi_spec_dirs = ['{root / "cdi"}']
[{runtime}.containerd]
  default_runtime_name = 'runc'
[{runtime}.containerd.runtimes.runc]
  runtime_type = 'io.containerd.runc.v2'
  runtime_path = '{bin_dir / "containerd-shim-runc-v2"}'
[{runtime}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = '{root / "runc"}'
[{runtime}.cni]
  bin_dirs = ['{CNI_BIN_DIR}']
  conf_dir = '{root / "cni" / "net.d"}'
[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = '127.0.0.1'
  stream_server_port = '0'
"""


class Containerd:
    """One containerd process over ``root``: Debian's 1.6 (:func:`containerd_config`), or with
    ``bin_dir`` the 2.x built by ``scripts/build-containerd.sh`` (:func:`containerd2_config`
    with ``snapshotter``; CDI specs in :attr:`cdi_dir`)."""

    def __init__(
        self,
        root: Path,
        *,
        bin_dir: Path | None = None,
        startup_timeout_s: float = 60.0,
        snapshotter: str = "overlayfs",
    ) -> None:
        self.root = root
        self.bin_dir = bin_dir
        self.snapshotter = snapshotter
        self.socket = root / "containerd.sock"
        self.cdi_dir = root / "cdi"
        self.startup_timeout_s = startup_timeout_s
        self.process: ManagedProcess | None = None
        conf_dir = root / "cni" / "net.d"
        conf_dir.mkdir(parents=True, exist_ok=True)
        self.cdi_dir.mkdir(parents=True, exist_ok=True)
        (conf_dir / "10-gpushare-node.conflist").write_text(
            json.dumps(cni_conflist(root / "cni" / "ipam"), indent=2)
        )
        self.config = root / "config.toml"
        self.config.write_text(
            containerd_config(root)
            if bin_dir is None
            else containerd2_config(root, bin_dir, snapshotter)
        )

    def _binary(self, name: str) -> str:
        return name if self.bin_dir is None else str(self.bin_dir / name)

    @property
    def endpoint(self) -> str:
        """The CRI endpoint for kubelet (``unix://...``)."""
        return f"unix://{self.socket}"

    def start(self) -> Containerd:
        argv = [self._binary("containerd"), "--config", str(self.config)]
        proc = ManagedProcess("containerd", argv, self.root)
        self.process = proc.start()
        wait_until(
            "containerd's CRI runtime service answering",
            self.serves_cri,
            self.startup_timeout_s,
            processes=[proc],
        )
        return self

    def serves_cri(self) -> bool:
        """Whether the CRI runtime service answers ``Version`` (kubelet's first call; module
        doc). The request is sent as its empty encoding: an empty ``VersionRequest``."""
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            version = channel.unary_unary(
                "/runtime.v1.RuntimeService/Version",
                request_serializer=bytes,
                response_deserializer=bytes,
            )
            try:
                version(b"", timeout=5)
            except grpc.RpcError:
                return False
        return True

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``ctr --address <socket> -n k8s.io ARGS``."""
        argv = [self._binary("ctr"), "--address", str(self.socket), "-n", NAMESPACE, *args]
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=120)
        if check and done.returncode != 0:
            raise ControlPlaneError(f"{' '.join(argv)} failed: {done.stderr or done.stdout}")
        return done

    def import_images(self, archive: Path) -> None:
        self.ctr("images", "import", str(archive))

    def remove_all_containers(self) -> int:
        """Kill and delete every task and container (what a power cut leaves): how many."""
        tasks = self.ctr("tasks", "ls", "-q", check=False).stdout.split()
        for task in tasks:
            self.ctr("tasks", "kill", "-s", "SIGKILL", task, check=False)
        for task in tasks:
            wait_until(
                f"task {task} stopped",
                lambda t=task: (
                    self.ctr("tasks", "delete", t, check=False).returncode == 0  # type: ignore[misc]
                    or t not in self.ctr("tasks", "ls", "-q", check=False).stdout.split()
                ),
                30.0,
            )
        containers = self.ctr("containers", "ls", "-q", check=False).stdout.split()
        for container in containers:
            self.ctr("containers", "delete", container, check=False)
        return len(containers)
