"""The real-node path packed for a lent GPU machine: what goes into the bundles and how they are
split (``bench/gpu/pack.py`` writes them, ``bench/gpu/node.sh`` unpacks and runs them there;
docs/testing.md, "Real GPU node").

One call of the device tool carries at most :data:`CALL_LIMIT_MIB` (64 MiB): the working tree
(tracked files and untracked ones git does not ignore) plus the paths it is told to carry, and
what a call leaves on the machine survives only while the machine stays held (about 30 s idle
between calls). So a bundle, with the checkout beside it, must fit one call, each at most
:data:`BUNDLE_LIMIT_MIB`, and there should be as few as the sizes allow.

What travels (:func:`node_items`), in the order the bundles are filled (:data:`GROUPS`):

* ``runtime``: containerd 2.x, its runc shim and ``ctr`` (``scripts/build-containerd.sh``),
  runc with the shared libraries it needs beyond glibc (``libseccomp``), the CNI plugins the
  node's network uses (``bridge``, ``host-local``, ``loopback``) and ``busybox`` (the pods'
  images are written from it on the machine, as ``gpushare.testing.node.images`` does here):
  enough for ``bench/gpu/node.sh --probe``;
* ``python``: gpushare's runtime dependencies the machine's Python 3.12 may lack or hold at
  another version, installed for cp312 manylinux x86_64 (``site/``); gpushare itself and its
  test harness come from the checkout's ``src/``, which travels anyway (the wheel leaves
  ``gpushare.testing`` out);
* ``kubernetes``: etcd, kube-apiserver, kube-scheduler and kubelet (``make controlplane``).
  Not kwok (no fake nodes there), kube-controller-manager (the run creates no ServiceAccount
  tokens for pods nor claim templates), kube-proxy (the pods reach no Service) or kubectl.

Every binary is already stripped (the Go builds use ``-s -w``; Debian strips its packages):
:func:`stripped` says so from the ELF section table, and the packer refuses one that is not.

Compressing takes minutes on a 2-core machine (``xz -9`` of about 410 MB), so tests size the
bundles with :func:`plan_bundles` from the files' sizes and :data:`XZ_RATIO` (measured), and the
packer checks the real sizes against the same limits.
"""

from __future__ import annotations

import math
import os
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

MIB = 1024 * 1024
CALL_LIMIT_MIB = 64.0
"""What one call of the device tool carries: working tree plus carried paths."""
BUNDLE_LIMIT_MIB = 60.0
"""The most one bundle may weigh, whatever the checkout's size."""
MARGIN_MIB = 0.5
"""Kept free in each call beside the checkout and the bundle (files written meanwhile)."""
GROUPS = ("runtime", "python", "kubernetes")
"""The order bundles are filled in: the first bundle is enough for ``node.sh --probe``."""
XZ_RATIO = {"runtime": 0.20, "python": 0.30, "kubernetes": 0.20}
"""Compressed/raw size under ``xz -9``, per group, rounded up from this machine's files
(2026-11-29, each group as one tar: runtime 95.4 MB -> 18.0 MB, 0.19; the cp312 site 25.2 MB ->
6.6 MB, 0.26; the four Kubernetes binaries 0.17 under ``zstd -19 --long`` with the runtime).
A plan is an estimate; the packer measures and refuses a bundle over the limit."""
SITE_ESTIMATE_BYTES = 26 * MIB
"""What the pinned wheels install for cp312 (24.1 MiB on 2026-11-29), for a plan made before
pip has installed them (``bench/gpu/pack.py --plan``, the tests: no index there)."""
KUBERNETES_BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kubelet")
CONTAINERD_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr")
CNI_PLUGINS = ("bridge", "host-local", "loopback")
RUNTIME_WHEELS = (
    "anyio",
    "grpcio",
    "h11",
    "httpcore2",
    "httpx2",
    "lightkube",
    "lightkube-models",
    "msgspec",
    "protobuf",
    "starlette",
    "truststore",
    "uvicorn",
    "watchfiles",
)
"""gpushare's runtime dependencies carried at the versions of constraints.txt. The rest of its
closure (numpy, click, rich and theirs, PyYAML, prometheus-client, nvidia-ml-py, idna,
typing-extensions) is in the machine's image (the device tool's KINDS.md) within
pyproject.toml's ranges."""


class BundleError(Exception):
    """A file missing, not stripped, or a plan that cannot fit a call (the message says which)."""


@dataclass(frozen=True)
class Item:
    """One file or directory to carry: ``source`` here, ``dest`` (relative) under the unpack
    root there, its ``group`` (:data:`GROUPS`) and raw ``size_bytes``."""

    source: Path
    dest: str
    group: str
    size_bytes: int

    @property
    def estimate_mib(self) -> float:
        """Its compressed size by :data:`XZ_RATIO`, MiB."""
        return self.size_bytes * XZ_RATIO[self.group] / MIB


@dataclass(frozen=True)
class Bundle:
    """The items of one bundle (one call), in order; ``name`` is its file name."""

    name: str
    items: tuple[Item, ...]

    @property
    def estimate_mib(self) -> float:
        return sum(item.estimate_mib for item in self.items)

    @property
    def raw_mib(self) -> float:
        return sum(item.size_bytes for item in self.items) / MIB

    @property
    def groups(self) -> tuple[str, ...]:
        return tuple(g for g in GROUPS if any(item.group == g for item in self.items))


def size_bytes(path: Path) -> int:
    """A file's size, or the sum of the files under a directory (symbolic links not followed)."""
    if path.is_dir():
        return sum(
            (Path(root) / name).lstat().st_size
            for root, _dirs, files in os.walk(path)
            for name in files
        )
    return path.stat().st_size


def stripped(path: Path) -> bool:
    """Whether the ELF file at ``path`` has no ``.symtab`` (what ``strip`` and Go's ``-s``
    remove). :class:`BundleError` for a file that is not 64-bit little-endian ELF."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise BundleError(f"{path}: not a 64-bit little-endian ELF file")
    shoff = int.from_bytes(data[0x28:0x30], "little")
    shentsize = int.from_bytes(data[0x3A:0x3C], "little")
    shnum = int.from_bytes(data[0x3C:0x3E], "little")
    sht_symtab = 2
    for index in range(shnum):
        start = shoff + index * shentsize
        if int.from_bytes(data[start + 4 : start + 8], "little") == sht_symtab:
            return False
    return True


def shared_libraries(binary: Path) -> list[tuple[str, Path]]:
    """The libraries ``binary`` loads beyond glibc's own (``ldd``), those a machine may lack:
    each as its soname (the name the loader looks for) and the file it resolves to."""
    glibc = ("linux-vdso", "libc.so", "ld-linux", "libm.so", "libpthread", "libdl.so", "librt")
    try:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    except OSError as error:
        raise BundleError(f"cannot run ldd on {binary}: {error}") from error
    found = []
    for line in done.stdout.splitlines():
        name, arrow, rest = line.strip().partition(" => ")
        if arrow and not name.startswith(glibc):
            found.append((name, Path(rest.split(" (")[0]).resolve()))
    return found


def node_items(
    *,
    controlplane_dir: Path,
    containerd_dir: Path,
    runc: Path,
    cni_dir: Path,
    busybox: Path,
    site_dir: Path,
) -> list[Item]:
    """Everything the real-node run needs (module doc), each with its size; the installed
    wheels in ``site_dir``, sized by :data:`SITE_ESTIMATE_BYTES` while it does not exist.
    :class:`BundleError` names every missing file at once."""
    wanted: list[tuple[Path, str, str]] = [
        *((containerd_dir / n, f"bin/{n}", "runtime") for n in CONTAINERD_BINARIES),
        (runc, "bin/runc", "runtime"),
        *((cni_dir / n, f"cni/{n}", "runtime") for n in CNI_PLUGINS),
        (busybox, "bin/busybox", "runtime"),
        *((controlplane_dir / n, f"bin/{n}", "kubernetes") for n in KUBERNETES_BINARIES),
    ]
    missing = [str(source) for source, _dest, _group in wanted if not source.is_file()]
    if missing:
        raise BundleError(
            f"missing: {', '.join(missing)}; build them with `make controlplane containerd "
            "node-runtime` (scripts/build-controlplane.sh, scripts/build-containerd.sh, "
            "scripts/install-node-runtime.sh)"
        )
    if runc.is_file():
        wanted += [(lib, f"lib/{soname}", "runtime") for soname, lib in shared_libraries(runc)]
    items = [Item(source, dest, group, size_bytes(source)) for source, dest, group in wanted]
    site_bytes = size_bytes(site_dir) if site_dir.is_dir() else SITE_ESTIMATE_BYTES
    return [*items, Item(site_dir, "site", "python", site_bytes)]


def plan_bundles(items: Sequence[Item], *, limit_mib: float) -> list[Bundle]:
    """Split ``items`` into bundles of at most ``limit_mib`` estimated MiB each: filled in
    :data:`GROUPS` order, largest first within a group, each item into the first bundle it fits
    (so the runtime lands in the first bundle). :class:`BundleError` when one item alone is
    over the limit. Pure: sizes come with the items."""
    too_big = [i for i in items if i.estimate_mib > limit_mib]
    if too_big:
        listed = ", ".join(f"{i.dest} (~{i.estimate_mib:.1f} MiB)" for i in too_big)
        raise BundleError(f"{listed}: over the {limit_mib:.1f} MiB one call can carry")
    order = sorted(items, key=lambda i: (GROUPS.index(i.group), -i.size_bytes))
    bins: list[list[Item]] = []
    for item in order:
        for content in bins:
            if sum(i.estimate_mib for i in content) + item.estimate_mib <= limit_mib:
                content.append(item)
                break
        else:
            bins.append([item])
    return [
        Bundle(f"gpu-node-{n}-of-{len(bins)}.tar.xz", tuple(content))
        for n, content in enumerate(bins, start=1)
    ]


def fewest_calls(items: Iterable[Item], *, limit_mib: float) -> int:
    """The fewest bundles the estimated total could take at ``limit_mib`` each."""
    return max(1, math.ceil(sum(i.estimate_mib for i in items) / limit_mib))


def repository_mib(root: Path) -> float:
    """What the device tool carries of the checkout at ``root`` each call: tracked files and
    untracked ones git does not ignore, MiB."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others",
             "--exclude-standard"],
            capture_output=True, check=True,
        )  # fmt: skip
    except (OSError, subprocess.CalledProcessError) as error:
        raise BundleError(f"cannot list the files of {root} with git: {error}") from error
    total = 0
    for name in {n for n in done.stdout.decode().split("\0") if n}:
        path = root / name
        if path.is_file() and not path.is_symlink():
            total += path.stat().st_size
    return total / MIB


def call_limit_mib(repository_mib: float) -> float:
    """The most one bundle may weigh beside a checkout of ``repository_mib``:
    :data:`BUNDLE_LIMIT_MIB`, or less where the checkout leaves less of the call."""
    return min(BUNDLE_LIMIT_MIB, CALL_LIMIT_MIB - repository_mib - MARGIN_MIB)
