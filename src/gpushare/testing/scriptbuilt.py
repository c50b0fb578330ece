"""A tool that one of ``scripts/build-*.sh`` builds into its cache: where it is, built on
demand (``helm``, the scheduler-config decoders)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

__all__ = ["script_built"]


def script_built(
    script: Path,
    print_flag: str,
    where: Callable[[str], Path],
    *,
    build: bool,
    error: Callable[[str], Exception],
    missing: str,
) -> Path:
    """The executable ``where(<what bash script print_flag printed>)``. When it is missing and
    ``build`` is true, runs ``script`` and fails with its output if that fails; else fails with
    ``missing`` (how to build it). Failures raise ``error(message)``."""
    try:
        done = subprocess.run(
            ["bash", str(script), print_flag], check=True, capture_output=True, text=True
        )
    except (OSError, subprocess.CalledProcessError) as failure:
        raise error(f"cannot run {script} {print_flag}: {failure}") from failure
    path = where(done.stdout.strip())
    if os.access(path, os.X_OK):
        return path
    if not build:
        raise error(f"{path} is missing: {missing}")
    built = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if built.returncode == 0 and os.access(path, os.X_OK):
        return path
    raise error(
        f"{path} is missing and {script} failed (exit {built.returncode}):\n{built.stderr[-3000:]}"
    )
