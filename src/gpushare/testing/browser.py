"""A real headless browser for tests: Debian's ``chromium`` (``scripts/install-observe-tools.sh``).

:func:`dump_dom` loads a page, lets its scripts run for ``budget_ms`` of virtual time (timers
fire at once; the clock waits while a fetch is in flight) and returns the DOM as HTML;
:func:`screenshot` writes a PNG of the page. Each call is a fresh browser with a profile of its
own in a temporary folder; ``--no-sandbox`` because the tests run as root.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["BrowserError", "dump_dom", "screenshot"]


class BrowserError(Exception):
    """Chromium is missing or failed; the text carries its output."""


def _chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        raise BrowserError(
            "chromium is missing: run scripts/install-observe-tools.sh (make test does)"
        )
    return found


def _run(url: str, budget_ms: int, extra: list[str], timeout_s: float) -> str:
    with tempfile.TemporaryDirectory(prefix="gpushare-chromium-") as profile:
        argv = [
            _chromium(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-proxy-server",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *extra,
            url,
        ]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    if result.returncode != 0:
        raise BrowserError(f"chromium exited {result.returncode}: {result.stderr[-2000:]}")
    return result.stdout


def dump_dom(url: str, *, budget_ms: int = 5000, timeout_s: float = 120.0) -> str:
    """The DOM of ``url`` after ``budget_ms`` of virtual time, serialised as HTML."""
    return _run(url, budget_ms, ["--dump-dom"], timeout_s)


def screenshot(
    url: str, path: Path, *, size: tuple[int, int] = (1280, 900), budget_ms: int = 5000
) -> Path:
    """A PNG of ``url`` at ``size`` (pixels) after ``budget_ms`` of virtual time, at ``path``."""
    _run(url, budget_ms, [f"--screenshot={path}", f"--window-size={size[0]},{size[1]}"], 120.0)
    if not path.is_file():
        raise BrowserError(f"chromium wrote no screenshot at {path}")
    return path
