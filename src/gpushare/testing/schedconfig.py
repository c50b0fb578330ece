"""kube-scheduler configurations decoded by older Kubernetes releases' own configuration API.

``scripts/build-schedconfig.sh`` builds ``testenv/schedconfig`` once per release in
:data:`RELEASES`: a program that decodes a configuration file strictly with that release's
``k8s.io/kube-scheduler`` types (``kubescheduler.config.k8s.io/v1beta2`` and ``v1beta3``) and
codec, as that release's kube-scheduler does before defaulting and validation. An unknown,
misspelt or wrongly-cased field, at the top or in a known plugin's ``args``, is refused.
:func:`locate_schedconfig` finds (and builds when missing, never skips) the binary of a release;
:func:`decode_scheduler_config` runs it.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpushare.testing.controlplane import REPO_ROOT
from gpushare.testing.scriptbuilt import script_built

__all__ = [
    "BUILD_SCRIPT",
    "RELEASES",
    "SchedConfigError",
    "SchedulerConfigRefusedError",
    "decode_scheduler_config",
    "locate_schedconfig",
]

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-schedconfig.sh"

RELEASES: Mapping[str, str] = {"1.23": "v0.23.17", "1.24": "v0.24.17"}
"""Each Kubernetes release a binary is built for, and the ``k8s.io/kube-scheduler`` version
that pins it (``testenv/schedconfig/k8s-<release>.mod``): the last patch of each release."""


class SchedConfigError(RuntimeError):
    """The decoder of a release is missing and cannot be built, or it failed otherwise than by
    refusing the file (its output included)."""


class SchedulerConfigRefusedError(ValueError):
    """The release's configuration API refused the file: the message is the decoder's (file,
    release, and the field or kind it refused)."""


def locate_schedconfig(release: str, *, build: bool = True) -> Path:
    """The decoder binary for Kubernetes ``release`` (a key of :data:`RELEASES`, e.g.
    ``"1.23"``), from the build script's cache directory (``--print-dir``).

    When it is missing and ``build`` is true, runs ``scripts/build-schedconfig.sh`` (about a
    minute for both releases on a cold build cache, 2 cores; needs Go and the module proxy)
    and fails with its output if that fails. ``ValueError`` for a release not in
    :data:`RELEASES`; :class:`SchedConfigError` otherwise.
    """
    if release not in RELEASES:
        raise ValueError(f"no decoder for Kubernetes {release!r}: built for {sorted(RELEASES)}")
    return script_built(
        BUILD_SCRIPT,
        "--print-dir",
        lambda printed: Path(printed) / f"schedconfig-k8s-{release}",
        build=build,
        error=SchedConfigError,
        missing="build it with scripts/build-schedconfig.sh (needs Go and the Go module "
        "proxy). The deploy tests are never skipped.",
    )


def decode_scheduler_config(path: Path, release: str) -> dict[str, Any]:
    """``path`` decoded by Kubernetes ``release``'s scheduler configuration API.

    Returns ``{"kubeScheduler": "v0.23.17", "apiVersion": ..., "kind": ..., "config": {...}}``:
    ``config`` is the typed configuration encoded again as JSON (fields at their Go zero value
    mostly left out, plugin ``args`` as their typed structs). Raises
    :class:`SchedulerConfigRefusedError` when the release refuses the file and
    :class:`SchedConfigError` when the decoder cannot run.
    """
    binary = locate_schedconfig(release)
    done = subprocess.run(
        [str(binary), str(path)], capture_output=True, text=True, check=False, timeout=60
    )
    if done.returncode == 1:
        raise SchedulerConfigRefusedError(done.stderr.strip())
    if done.returncode != 0:
        raise SchedConfigError(f"{binary} {path} failed (exit {done.returncode}): {done.stderr}")
    decoded: dict[str, Any] = json.loads(done.stdout)
    return decoded
