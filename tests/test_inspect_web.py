"""The GPU map (``kubectl inspect gpushare --web``, ``gpushare.cli.inspectweb``) in a real
headless browser (Debian's chromium, ``gpushare.testing.browser``).

The page is served by the real app over a scripted report source, so what the cluster "does"
between two refreshes is exact: the page shows the report's nodes, GPUs, pods, flags and pending
reasons in words; each GPU is a keyboard-focusable group whose label says everything the bar
shows; across refreshes it follows the cluster, says when the cluster cannot be read (keeping the
last view) and recovers. The real command on a real cluster: ``tests/cluster/test_inspect_web.py``.

How the bars are drawn is measured by the browser's own layout (a probe page beside the map,
``gpushare.testing.browser.layout_probe_page``): a segment of nothing (the free rest of a full
GPU, the used compute of an idle one) is not drawn, and no label is cut short. GPU pods that
bypassed gpushare's scheduler are a warning above the nodes, whose cells wrap rather than
overflow.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse
from starlette.routing import Mount, Route

from gpushare.cli.inspectweb import ReportError, web_app
from gpushare.core.model import ContainerAllocation
from gpushare.extender.state import ExtenderState
from gpushare.inspect.render import report_json
from gpushare.inspect.report import Snapshot, build_report
from gpushare.kube.codec import GPU_MEM, MemoryUnit, node_info
from gpushare.testing.browser import Box, dump_dom, layout_probe_page, read_boxes, screenshot
from gpushare.testing.dialects import bound_dialect_pod, dialect_pod_json
from gpushare.testing.extender import bound_pod, node_json, pod_json, serve_in_thread
from gpushare.testing.nodes import FakeGpu


def report(*, with_b: bool = False) -> dict[str, Any]:
    """n1: two 16 GiB GPUs, pod a (4 GiB) on GPU 0 (and b, 8 GiB, on GPU 1 with ``with_b``);
    n2: GPU 1 unhealthy; a pending pod that no GPU can take."""
    state = ExtenderState()
    n1 = node_json("n1", [FakeGpu(0, 16, "Tesla T4"), FakeGpu(1, 16, "Tesla T4")],
                   unit=MemoryUnit.GIB)  # fmt: skip
    n2 = node_json("n2", [FakeGpu(0, 16, "Tesla T4"), FakeGpu(1, 16, "Tesla T4", healthy=False)],
                   unit=MemoryUnit.GIB)  # fmt: skip
    for node in (n1, n2):
        state.upsert_node(node)
    pods = [bound_pod(state, "a", "n1", {0: 4})]
    if with_b:
        pods.append(bound_pod(state, "b", "n1", {1: 8}))
    pods.append(pod_json("huge", 40))
    snapshot = Snapshot(nodes=(n1, n2), pods=tuple(pods), holds=())
    return report_json(build_report(snapshot, node=None, pod_rows=True, now_s=time.time()))


class Script:
    """The report source: one answer per call, the last repeated (an exception is raised)."""

    def __init__(self, *answers: dict[str, Any] | ReportError) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def __call__(self) -> dict[str, Any]:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, ReportError):
            raise answer
        return answer


@pytest.fixture
def serve() -> Iterator[Any]:
    """``serve(script)``: the page's URL, served over ``script`` until the test ends."""
    with contextlib.ExitStack() as stack:

        def start(script: Script) -> str:
            port = stack.enter_context(serve_in_thread(web_app(script)))
            return f"http://127.0.0.1:{port}/"

        yield start


class Groups(HTMLParser):
    """The focusable GPU groups of a DOM: (id, tabindex, aria-label)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[str, str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("role") == "group":
            self.groups.append(
                (found.get("id") or "", found.get("tabindex") or "", found.get("aria-label") or "")
            )


def text_of(dom: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", dom).split())


def test_the_page_shows_the_report_in_words(serve: Any) -> None:
    dom = dump_dom(serve(Script(report())))
    text = text_of(dom)
    assert "Cluster: 4/64 GiB allocated (6%) on 2 node(s), 16 GiB on unhealthy GPUs" in text
    assert "GPU 0 · Tesla T4 · 4/16 GiB" in text
    assert "default/a 4" in text
    assert "free 12" in text
    assert "unhealthy" in text  # n2's GPU 1, in words
    assert "default/huge 40 GiB" in text
    assert "request is larger than any GPU" in text
    assert "Updated" in text


def test_each_gpu_is_a_focusable_group_that_says_what_the_bar_shows(serve: Any) -> None:
    parser = Groups()
    parser.feed(dump_dom(serve(Script(report()))))
    by_id = {gid: (tabindex, label) for gid, tabindex, label in parser.groups}
    assert sorted(by_id) == ["gpu-n1-0", "gpu-n1-1", "gpu-n2-0", "gpu-n2-1"]
    assert all(tabindex == "0" for tabindex, _ in by_id.values())
    assert by_id["gpu-n1-0"][1] == (
        "GPU 0, Tesla T4: 4 of 16 GiB allocated, 12 free; pods: default/a: 4 GiB"
    )
    assert by_id["gpu-n2-1"][1] == (
        "GPU 1, Tesla T4: 0 of 16 GiB allocated, 0 free, unhealthy; no pods"
    )


def test_the_page_follows_the_cluster_through_an_outage(serve: Any) -> None:
    script = Script(
        report(), report(with_b=True), ReportError("cannot reach the API server"), report()
    )
    # Four refreshes (2 s each, virtual time): a; a and b; the error; a again.
    text = text_of(dump_dom(serve(script), budget_ms=7000))
    assert script.calls >= 4
    assert "default/b" not in text  # b is gone again: the last view is the last report
    assert "default/a 4" in text
    assert "Updated" in text  # recovered after the error


def test_an_unreadable_cluster_is_said_and_the_last_view_kept(serve: Any) -> None:
    script = Script(report(with_b=True), ReportError("cannot reach the API server at x"))
    text = text_of(dump_dom(serve(script), budget_ms=3000))
    assert "Cannot read the cluster: cannot reach the API server at x" in text
    assert "default/b 8" in text  # the last good view stays


@pytest.mark.parametrize(
    ("host", "status"),
    [
        ("127.0.0.1:{port}", 200),
        ("localhost:{port}", 200),
        ("127.0.0.1", 200),
        ("evil.example:{port}", 400),  # DNS rebinding: a name of the attacker's at 127.0.0.1
        ("127.0.0.1.evil.example:{port}", 400),
        ("", 400),
    ],
    ids=[
        "loopback",
        "localhost",
        "loopback without port",
        "another name",
        "a name like it",
        "no host",
    ],
)
@pytest.mark.parametrize("path", ["/", "/report.json"])
def test_only_requests_naming_the_loopback_address_are_answered(
    serve: Any, host: str, status: int, path: str
) -> None:
    url = serve(Script(report()))
    port = int(url.rsplit(":", 1)[1].strip("/"))
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.putrequest("GET", path, skip_host=True)
        if host:
            connection.putheader("Host", host.format(port=port))
        connection.endheaders()
        response = connection.getresponse()
        body = response.read()
    finally:
        connection.close()
    assert response.status == status, body
    if status == 400:
        assert b"default/a" not in body


@dataclass(frozen=True)
class Held:
    """A pod on the map's node: its container ``main`` asks ``limits`` and holds ``got``."""

    name: str
    limits: Mapping[str, int]
    got: ContainerAllocation


def share(name: str, gpu: int, gib: int) -> Held:
    """A pod holding ``gib`` GiB of GPU ``gpu``, no compute asked."""
    return Held(name, {GPU_MEM: gib}, ContainerAllocation("main", (gpu,), gib))


def whole(name: str, gpu: int, gib: int) -> Held:
    """A pod holding GPU ``gpu`` (``gib`` GiB) whole, all its compute (HAMi's dialect)."""
    limits = {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 100}
    return Held(name, limits, ContainerAllocation("main", (gpu,), gib, 1000, exclusive=True))


def map_report(gpus_gib: Sequence[int], pods: Sequence[Held]) -> dict[str, Any]:
    """The report of one node ``n1`` with T4-like GPUs of ``gpus_gib`` GiB holding ``pods``."""
    n1 = node_json("n1", [FakeGpu(i, gib, "Tesla T4") for i, gib in enumerate(gpus_gib)],
                   unit=MemoryUnit.GIB)  # fmt: skip
    on = node_info(n1).node
    bound = tuple(
        bound_dialect_pod(dialect_pod_json(p.name, {"main": p.limits}), on, [p.got]) for p in pods
    )
    return report_json(build_report(Snapshot(nodes=(n1,), pods=bound, holds=()), node=None))


def full_and_idle() -> dict[str, Any]:
    """n1: GPU 0 full (12 + 4 GiB shares), GPU 1 held whole, GPU 2 idle (a compute bar shows
    on the node, since GPU 1's compute is held)."""
    return map_report([16, 16, 16], [share("a", 0, 12), share("b", 0, 4), whole("w", 1, 16)])


FRAME_WIDTH_PX = 1280
"""The width of the frame the map is measured in (the layout probe's default)."""


def measure(script: Script, selector: str = ".bar li") -> list[Box]:
    """The boxes of the elements of the map over ``script`` that match ``selector`` (every bar
    segment by default), as the browser laid them out in a 1280 × 900 frame."""
    app = web_app(script)
    probe = layout_probe_page("/", selector)

    async def page(request: Request) -> HTMLResponse:
        return HTMLResponse(probe)

    both = Starlette(routes=[Route("/probe", page), Mount("/", app=app)])
    with serve_in_thread(both) as port:
        return read_boxes(dump_dom(f"http://127.0.0.1:{port}/probe"))


Segments = dict[tuple[str, str], list[tuple[str, str, str]]]
"""(GPU group id, bar class) → [(segment class, label shown, tooltip)], left to right."""


@pytest.mark.parametrize(
    ("the_report", "expected"),
    [
        (
            full_and_idle(),
            {
                ("gpu-n1-0", "bar"): [
                    ("pod", "default/a 12", "default/a: 12 GiB"),
                    ("pod", "default/b 4", "default/b: 4 GiB"),
                ],
                ("gpu-n1-0", "bar compute"): [
                    ("free", "compute free 100%", "compute free: 100%"),
                ],
                ("gpu-n1-1", "bar"): [("pod", "default/w 16", "default/w: 16 GiB")],
                ("gpu-n1-1", "bar compute"): [
                    ("pod", "compute 100%", "compute allocated: 100%"),
                ],
                ("gpu-n1-2", "bar"): [("free", "free 16", "free: 16 GiB")],
                ("gpu-n1-2", "bar compute"): [
                    ("free", "compute free 100%", "compute free: 100%"),
                ],
            },
        ),
        (
            map_report([80], [share("tiny", 0, 1)]),
            {
                ("gpu-n1-0", "bar"): [
                    ("pod", "", "default/tiny: 1 GiB"),
                    ("free", "free 79", "free: 79 GiB"),
                ],
            },
        ),
    ],
    ids=[
        "a full GPU draws no free segment and an idle GPU no used compute",
        "a share too narrow for its label shows the label only as a tooltip",
    ],
)
def test_bars_draw_only_segments_of_something_with_whole_labels(
    the_report: dict[str, Any], expected: Segments
) -> None:
    boxes = measure(Script(the_report))
    drawn: Segments = {}
    for box in boxes:
        drawn.setdefault((box.owner, box.parent_class), []).append(
            (box.element_class, box.text, box.title)
        )
    assert drawn == expected
    assert [b for b in boxes if b.width_px <= 0] == []
    assert [b for b in boxes if b.text and b.overflows] == []  # no label cut short


def test_a_screenshot_of_the_map_with_a_full_and_an_idle_gpu(serve: Any, tmp_path: Path) -> None:
    shot = screenshot(serve(Script(full_and_idle())), tmp_path / "gpu-map-full-idle.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


LONG_NAMESPACE = "team-" + "n" * 58  # 63 characters, the most a namespace has
LONG_NAME = "stray-" + "x" * 247  # 253 characters, the most a pod name has


def bypassing(*strays: tuple[str, str]) -> dict[str, Any]:
    """n1: one 16 GiB GPU holding pod a, which ``gpushare-scheduler`` placed; each of
    ``strays`` (namespace, name) asks 4 GiB and was bound to n1 by the default scheduler (no
    ``schedulerName``), so it has no GPU."""
    state = ExtenderState()
    n1 = node_json("n1", [FakeGpu(0, 16, "Tesla T4")], unit=MemoryUnit.GIB)
    state.upsert_node(n1)
    pods = [bound_pod(state, "a", "n1", {0: 4}, scheduler="gpushare-scheduler")]
    pods += [pod_json(name, 4, namespace=ns, node="n1", scheduler=None) for ns, name in strays]
    snapshot = Snapshot(nodes=(n1,), pods=tuple(pods), holds=())
    return report_json(build_report(snapshot, node=None, pod_rows=True, now_s=time.time()))


WARNING = ["Warning: GPU pods placed without gpushare's scheduler",
           "Pod", "Node", "Placed by", "What to do"]  # fmt: skip
TO_DO = "Set spec.schedulerName: gpushare-scheduler and recreate the pod"


@pytest.mark.parametrize(
    ("the_report", "expected"),
    [
        pytest.param(bypassing(("team-a", "stray")),
                     [*WARNING, "team-a/stray", "n1", "default-scheduler", TO_DO],
                     id="a-pod-the-default-scheduler-placed-is-named-with-what-to-do"),
        pytest.param(bypassing((LONG_NAMESPACE, LONG_NAME)),
                     [*WARNING, f"{LONG_NAMESPACE}/{LONG_NAME}", "n1", "default-scheduler", TO_DO],
                     id="the-longest-pod-name-wraps-inside-the-warning"),
        pytest.param(bypassing(), [], id="no-pod-bypassed-shows-no-warning"),
    ],
)  # fmt: skip
def test_pods_that_bypassed_gpushare_are_a_warning_above_the_nodes(
    the_report: dict[str, Any], expected: list[str]
) -> None:
    boxes = measure(Script(the_report), ".warning, .warning h2, .warning th, .warning td, .node")
    warning = [b for b in boxes if b.owner == "bypassed"]
    assert [b.text for b in warning if b.element_class != "warning"] == expected
    if expected:
        assert boxes[0].element_class == "warning"  # first, above the nodes
        assert [b for b in warning if b.width_px <= 0 or b.overflows] == []
        short = {*WARNING, "n1", "default-scheduler"}  # each fits its column on one line
        assert {b.text: b.lines for b in warning if b.text in short} == dict.fromkeys(short, 1)
        assert 0 < boxes[0].width_px <= FRAME_WIDTH_PX
    assert [b.owner for b in boxes if b.element_class == "node"] == ["nodes"]


def test_a_screenshot_of_the_map_with_a_pod_that_bypassed_gpushare(
    serve: Any, tmp_path: Path
) -> None:
    shot = screenshot(
        serve(Script(bypassing(("team-a", "stray")))), tmp_path / "gpu-map-bypassed.png"
    )
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
