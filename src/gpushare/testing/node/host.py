"""The machine-wide part of a real node: the lock, the bridge, and putting the host back.

A kubelet always uses ``/var/lib/kubelet/device-plugins/`` (it does not follow ``--root-dir``),
containerd and CNI write a few fixed places (``/run/netns``, ``/run/containerd``,
``/var/lib/cni``), kubelet links container logs into ``/var/log/containers``, and kube-proxy
writes iptables chains. So one real node per machine: :class:`NodeHost` takes the flock
:data:`LOCK_PATH` (waiting for another checkout's run to finish), snapshots what it will touch,
creates the node's bridge, and on :meth:`NodeHost.close` puts every one of those places back as
it found it, whatever happened in between.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpushare.testing.controlplane import ControlPlaneError, wait_until

LOCK_PATH = Path("/run/gpushare-node.lock")
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
"""Where kubelet's ``kubelet.sock`` and every plugin's socket live, whatever ``--root-dir`` is."""
BRIDGE = "gpushare0"
GATEWAY = "10.77.0.1"
POD_SUBNET = "10.77.0.0/24"
_PREFIX = 24
CGROUP_ROOT = "/gpushare-node"
"""kubelet's ``cgroupRoot``: every pod cgroup lives below it, in every hierarchy."""
_CGROUP_MOUNTS = Path("/sys/fs/cgroup")
# Fixed places containerd, CNI and kubelet write outside their configured directories; what is
# new in them at close is removed.
_WATCHED_DIRS = (
    Path("/run/netns"),
    Path("/run/containerd"),
    Path("/var/lib/cni"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/var/lib/kubelet"),
)
_SYSCTLS = {
    # Pods reach Services (kube-proxy DNATs them) and one another through the host.
    "net/ipv4/ip_forward": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise ControlPlaneError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr}")
    return done


def _mountpoints() -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as info:
        for line in info:
            points.append(line.split()[4].replace("\\040", " "))
    return points


def _cgroup_hierarchies() -> list[Path]:
    return sorted(p for p in _CGROUP_MOUNTS.iterdir() if os.path.ismount(p))


@dataclass
class NodeHost:
    """The lock, the bridge :data:`BRIDGE` at :data:`GATEWAY` and the clean-up (module doc).

    Use as a context manager, before the control plane (kube-apiserver binds to
    :data:`GATEWAY` so that pods can reach it). ``root`` is a fresh temporary directory for
    containerd's and kubelet's state. ``lock_timeout_s``: how long to wait for another run.
    """

    lock_timeout_s: float = 1800.0
    root: Path = field(init=False)
    address: str = GATEWAY
    _lock: IO[str] | None = field(init=False, default=None)
    _entries: dict[Path, set[str] | None] = field(init=False, default_factory=dict)
    _mounts: set[str] = field(init=False, default_factory=set)
    _sysctls: dict[str, str] = field(init=False, default_factory=dict)
    _saved_device_plugins: Path | None = field(init=False, default=None)
    _opened: bool = field(init=False, default=False)

    def __enter__(self) -> NodeHost:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- open ------------------------------------------------------------------------

    def open(self) -> NodeHost:
        if os.geteuid() != 0:
            raise ControlPlaneError("a real node needs root (kubelet, containerd, mounts)")
        self._take_lock()
        self._opened = True
        try:
            self.root = Path(tempfile.mkdtemp(prefix="gpushare-node-"))
            self._mounts = set(_mountpoints())
            for directory in _WATCHED_DIRS:
                self._entries[directory] = (
                    set(os.listdir(directory)) if directory.is_dir() else None
                )
            self._set_aside_device_plugins()
            self._create_bridge()
            self._create_cgroup_root()
            for key, value in _SYSCTLS.items():
                path = Path("/proc/sys") / key
                if path.exists():
                    self._sysctls[key] = path.read_text().strip()
                    path.write_text(value)
        except BaseException:
            self.close()
            raise
        return self

    def _take_lock(self) -> None:
        lock = LOCK_PATH.open("a+")

        def taken() -> bool:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                return False
            return True

        def holder() -> str:
            lock.seek(0)
            return f"another real-node run holds it ({lock.read().strip() or 'unknown'})"

        try:
            wait_until(f"the lock {LOCK_PATH}", taken, self.lock_timeout_s, detail=holder)
        except BaseException:
            lock.close()
            raise
        lock.seek(0)
        lock.truncate()
        lock.write(f"pid {os.getpid()} since {time.strftime('%H:%M:%S')}\n")
        lock.flush()
        self._lock = lock

    def _set_aside_device_plugins(self) -> None:
        """Move an existing device-plugin directory aside (restored at close); start empty."""
        if DEVICE_PLUGIN_DIR.exists():
            # Outside the watched /var/lib/kubelet (same filesystem, so a rename).
            saved = Path(f"/var/lib/gpushare-saved-device-plugins-{os.getpid()}")
            DEVICE_PLUGIN_DIR.rename(saved)
            self._saved_device_plugins = saved
        DEVICE_PLUGIN_DIR.mkdir(parents=True)

    def _create_bridge(self) -> None:
        if Path(f"/sys/class/net/{BRIDGE}").exists():  # left by a run that was killed
            _run("ip", "link", "delete", BRIDGE)
        _run("ip", "link", "add", "name", BRIDGE, "type", "bridge")
        _run("ip", "addr", "add", f"{GATEWAY}/{_PREFIX}", "dev", BRIDGE)
        _run("ip", "link", "set", BRIDGE, "up")

    def _create_cgroup_root(self) -> None:
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / CGROUP_ROOT.lstrip("/")
            path.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":  # a new v1 cpuset starts with no CPUs and no memory
                for name in ("cpuset.cpus", "cpuset.mems"):
                    (path / name).write_text((hierarchy / name).read_text())

    # ---- close -----------------------------------------------------------------------

    def close(self) -> None:
        """Put everything back (each step runs even when an earlier one failed); unlock."""
        if not self._opened:
            return
        self._opened = False
        errors: list[str] = []
        for step in (
            self._unmount_new,
            self._remove_new_entries,
            self._remove_cgroups,
            self._delete_bridge,
            self._restore_sysctls,
            self._restore_device_plugins,
        ):
            try:
                step()
            except Exception as exc:  # keep going: every step must run
                errors.append(f"{step.__name__}: {exc}")
        if hasattr(self, "root"):
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None
        if errors:
            raise ControlPlaneError("real node clean-up incomplete: " + "; ".join(errors))

    def new_mounts(self) -> list[str]:
        """Mount points made since :meth:`open` (deepest first)."""
        return sorted((m for m in _mountpoints() if m not in self._mounts), key=len, reverse=True)

    def _unmount_new(self) -> None:
        for point in self.new_mounts():
            if _run("umount", point, check=False).returncode != 0:
                _run("umount", "-l", point, check=False)
        left = self.new_mounts()
        if left:
            raise ControlPlaneError(f"still mounted: {left}")

    def _remove_new_entries(self) -> None:
        for directory, before in self._entries.items():
            if before is None:
                if directory.exists() and directory != DEVICE_PLUGIN_DIR.parent:
                    shutil.rmtree(directory, ignore_errors=True)
                continue
            if not directory.is_dir():
                continue
            for name in set(os.listdir(directory)) - before:
                path = directory / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()

    def _remove_cgroups(self) -> None:
        busy = []
        for hierarchy in _cgroup_hierarchies():
            top = hierarchy / CGROUP_ROOT.lstrip("/")
            if not top.is_dir():
                continue
            for dirpath, _dirnames, _files in sorted(
                os.walk(top), key=lambda w: len(w[0]), reverse=True
            ):
                try:
                    os.rmdir(dirpath)
                except OSError as exc:
                    busy.append(f"{dirpath} ({exc.strerror})")
        if busy:
            raise ControlPlaneError(f"cgroups not removed: {busy[:5]}")

    def _delete_bridge(self) -> None:
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            _run("ip", "link", "delete", BRIDGE)

    def _restore_sysctls(self) -> None:
        for key, value in self._sysctls.items():
            (Path("/proc/sys") / key).write_text(value)

    def _restore_device_plugins(self) -> None:
        shutil.rmtree(DEVICE_PLUGIN_DIR, ignore_errors=True)
        if self._saved_device_plugins is not None:
            self._saved_device_plugins.rename(DEVICE_PLUGIN_DIR)
            self._saved_device_plugins = None
        elif self._entries.get(DEVICE_PLUGIN_DIR.parent) is None:
            shutil.rmtree(DEVICE_PLUGIN_DIR.parent, ignore_errors=True)
