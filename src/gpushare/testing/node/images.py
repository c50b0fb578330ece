"""Container images made here, with no registry: a docker-archive tarball from busybox-static.

Two images share one layer (``/bin/busybox`` from Debian's ``busybox-static`` plus a symlink per
applet, ``/etc/passwd``, ``/tmp``): :data:`TEST_IMAGE` (command ``sh``) for test pods and
:data:`PAUSE_IMAGE` (``busybox sleep``, containerd's ``sandbox_image``) for pod sandboxes. The
archive is the format ``docker save`` writes (``manifest.json``, one config JSON per image,
layer tars named by digest); ``ctr -n k8s.io images import`` reads it in under a second. Pods use
``imagePullPolicy: Never``.
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpushare.testing.controlplane import ControlPlaneError

TEST_IMAGE = "gpushare.test/busybox:1"
PAUSE_IMAGE = "gpushare.test/pause:1"
BUSYBOX = Path("/bin/busybox")

_FILES: Mapping[str, str] = {
    "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
    "etc/group": "root:x:0:\nnogroup:x:65534:\n",
    "etc/hosts": "127.0.0.1 localhost\n",
}


def _applets(busybox: Path) -> list[str]:
    try:
        done = subprocess.run([str(busybox), "--list"], check=True, capture_output=True, text=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise ControlPlaneError(
            f"cannot run {busybox} --list ({exc}); install busybox-static "
            "(scripts/install-node-runtime.sh)"
        ) from exc
    return sorted({a for a in done.stdout.split() if a and a != "busybox"})


def _add(tar: tarfile.TarFile, name: str, *, data: bytes | None = None, **fields: Any) -> None:
    info = tarfile.TarInfo(name)
    info.mtime = 0
    for key, value in fields.items():
        setattr(info, key, value)
    if data is not None:
        info.size = len(data)
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def busybox_layer(busybox: Path = BUSYBOX) -> bytes:
    """The one layer (an uncompressed tar, deterministic: same input, same digest)."""
    applets = _applets(busybox)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for directory, mode in (
            ("bin", 0o755), ("dev", 0o755), ("etc", 0o755), ("proc", 0o755),
            ("root", 0o700), ("sys", 0o755), ("tmp", 0o1777), ("var", 0o755),
        ):  # fmt: skip
            _add(tar, directory, type=tarfile.DIRTYPE, mode=mode)
        _add(tar, "bin/busybox", data=busybox.read_bytes(), mode=0o755)
        for applet in applets:
            _add(tar, f"bin/{applet}", type=tarfile.SYMTYPE, linkname="busybox", mode=0o777)
        for name, text in _FILES.items():
            _add(tar, name, data=text.encode(), mode=0o644)
    return buffer.getvalue()


def _config(diff_id: str, entrypoint: Sequence[str], cmd: Sequence[str]) -> bytes:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/bin"],
            "Entrypoint": list(entrypoint) or None,
            "Cmd": list(cmd),
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpushare.testing.node.images"}],
    }
    return json.dumps(config, sort_keys=True).encode()


def write_image_archive(path: Path, busybox: Path = BUSYBOX) -> Path:
    """Write :data:`TEST_IMAGE` and :data:`PAUSE_IMAGE` as one docker-archive at ``path``."""
    layer = busybox_layer(busybox)
    digest = hashlib.sha256(layer).hexdigest()
    images = {
        TEST_IMAGE: _config(f"sha256:{digest}", (), ("sh",)),
        PAUSE_IMAGE: _config(f"sha256:{digest}", ("/bin/busybox", "sleep"), ("2147483647",)),
    }
    manifest = []
    with tarfile.open(path, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, f"{digest}/layer.tar", data=layer, mode=0o644)
        for tag, config in images.items():
            config_name = f"{hashlib.sha256(config).hexdigest()}.json"
            _add(tar, config_name, data=config, mode=0o644)
            manifest.append(
                {"Config": config_name, "RepoTags": [tag], "Layers": [f"{digest}/layer.tar"]}
            )
        _add(tar, "manifest.json", data=json.dumps(manifest).encode(), mode=0o644)
    return path
