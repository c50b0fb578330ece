"""The GPU map (``kubectl inspect gpushare --web``, ``gpushare.cli.inspectweb``) in a real
headless browser (Debian's chromium, ``gpushare.testing.browser``).

The page is served by the real app over a scripted report source, so what the cluster "does"
between two refreshes is exact: the page shows the report's nodes, GPUs, pods, flags and pending
reasons in words; each GPU is a keyboard-focusable group whose label says everything the bar
shows; across refreshes it follows the cluster, says when the cluster cannot be read (keeping the
last view) and recovers. The real command on a real cluster: ``tests/cluster/test_inspect_web.py``.
"""

from __future__ import annotations

import contextlib
import http.client
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import pytest

from gpushare.cli.inspectweb import ReportError, web_app
from gpushare.extender.state import ExtenderState
from gpushare.inspect.render import report_json
from gpushare.inspect.report import Snapshot, build_report
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.browser import dump_dom
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
