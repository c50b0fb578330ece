"""A real headless browser for tests: Debian's ``chromium`` (``scripts/install-observe-tools.sh``).

:func:`dump_dom` loads a page, lets its scripts run for ``budget_ms`` of virtual time (timers
fire at once; the clock waits while a fetch is in flight) and returns the DOM as HTML;
:func:`screenshot` writes a PNG of the page. Each call is a fresh browser with a profile of its
own in a temporary folder; ``--no-sandbox`` because the tests run as root.

What a page looks like, measured by the browser's own layout: :func:`layout_probe_page` is a
page that loads another page of the same origin in a frame and writes down the boxes of its
elements (:class:`Box`: width, text, whether the text overflows, how many lines it takes);
serve it beside the page under test, :func:`dump_dom` it and read the boxes with
:func:`read_boxes`.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "Box",
    "BrowserError",
    "dump_dom",
    "layout_probe_page",
    "read_boxes",
    "screenshot",
]


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


@dataclass(frozen=True)
class Box:
    """One element as laid out: ``owner`` the ``id`` of its nearest ancestor that has one,
    ``parent_class`` and ``element_class`` the ``class`` attributes of its parent and itself,
    ``text`` what it shows, ``title`` its tooltip, ``width_px`` its border-box width in CSS
    pixels, ``overflows`` whether its content is wider than its box (a label cut short),
    ``lines`` how many lines its content takes (its height over its line height, rounded; 0
    when it has no text; a word broken across lines counts its lines)."""

    owner: str
    parent_class: str
    element_class: str
    text: str
    title: str
    width_px: float
    overflows: bool
    lines: int


_PROBE = """<!doctype html>
<html><head><meta charset="utf-8"><title>layout probe</title></head>
<body style="margin:0">
<iframe id="frame" src="{target}" style="border:0;width:{width}px;height:{height}px"></iframe>
<pre id="boxes"></pre>
<script>
"use strict";
const SELECTOR = {selector};
function lineCount(e) {{
  if (!e.textContent) return 0;
  const range = e.ownerDocument.createRange();
  range.selectNodeContents(e);
  const perLine = parseFloat(e.ownerDocument.defaultView.getComputedStyle(e).lineHeight);
  return perLine > 0 ? Math.max(1, Math.round(range.getBoundingClientRect().height / perLine)) : 1;
}}
function measure() {{
  const doc = document.getElementById("frame").contentDocument;
  const found = doc ? [...doc.querySelectorAll(SELECTOR)] : [];
  if (found.length === 0) {{ setTimeout(measure, 50); return; }}
  document.getElementById("boxes").textContent = JSON.stringify(found.map(e => ({{
    owner: (e.parentElement && e.parentElement.closest("[id]") || {{id: ""}}).id,
    parent_class: e.parentElement ? e.parentElement.className : "",
    element_class: e.className,
    text: e.textContent,
    title: e.getAttribute("title") || "",
    width_px: e.getBoundingClientRect().width,
    overflows: e.scrollWidth > e.clientWidth,
    lines: lineCount(e),
  }})));
}}
document.getElementById("frame").addEventListener("load", measure);
</script>
</body></html>
"""


def layout_probe_page(target: str, selector: str, *, size: tuple[int, int] = (1280, 900)) -> str:
    """A page (HTML) that loads ``target`` (a URL of the same origin, so that the frame can be
    read) in a frame of ``size`` (CSS pixels), waits until an element matches ``selector`` (a
    CSS selector), and writes each such element's :class:`Box` as JSON into ``<pre
    id="boxes">`` (:func:`read_boxes`)."""
    return _PROBE.format(
        target=html.escape(target, quote=True),
        width=size[0],
        height=size[1],
        selector=json.dumps(selector),
    )


_BOXES = re.compile(r'<pre id="boxes">(.*?)</pre>', re.DOTALL)


def read_boxes(dom: str) -> list[Box]:
    """The boxes a :func:`layout_probe_page` wrote, from its DOM (:func:`dump_dom`).
    ``BrowserError`` when it wrote none (the selector never matched within the time budget)."""
    found = _BOXES.search(dom)
    text = html.unescape(found[1]) if found else ""
    if not text:
        raise BrowserError("the layout probe measured nothing: no element matched in time")
    return [Box(**box) for box in json.loads(text)]
