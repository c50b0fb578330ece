"""``gpushare inspect --web`` (``kubectl inspect gpushare --web``) on a real cluster, read by a
real headless browser.

kwok GPU nodes, GPU pods placed by kube-scheduler and the extender, one pod that fits nowhere;
the command runs as a process with the admin kubeconfig and prints its URL. Proved: the page
shows each node's GPUs with the pods the annotations say, and the pending pod with its reason;
the JSON it reads is ``kubectl inspect gpushare -o json``'s; after a pod is deleted and another
placed, the page shows the new state; only 127.0.0.1 is served.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import Client
from lightkube.resources.core_v1 import Pod

from gpushare.testing.browser import dump_dom
from gpushare.testing.controlplane import (
    ControlPlane,
    ManagedProcess,
    free_ports,
    gpushare_argv,
    http_ok,
    wait_for,
    wait_until,
)
from gpushare.testing.live_extender import t4_cluster_with_extender
from gpushare.testing.outcome import Ask, Spec, make_pod

pytestmark = pytest.mark.cluster

NAMESPACE = "web"
SCHEDULER_NAME = "gpushare-web"
NODES = ("web-n1", "web-n2")


@dataclass
class Page:
    url: str
    kube: Client
    kubeconfig: Path

    def text(self) -> str:
        return " ".join(re.sub(r"<[^>]+>", " ", dump_dom(self.url)).split())


def place(kube: Client, name: str, gib: int, node: str) -> None:
    spec = Spec(name, (Ask("main", 1, gib),))
    selector = {"kubernetes.io/hostname": node}
    kube.create(
        make_pod(spec, namespace=NAMESPACE, scheduler_name=SCHEDULER_NAME, node_selector=selector)
    )


def _bound(kube: Client, name: str) -> bool | None:
    pod = kube.get(Pod, name, namespace=NAMESPACE)
    return bool(pod.spec is not None and pod.spec.nodeName) or None


@pytest.fixture(scope="module")
def page(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    workdir = tmp_path_factory.mktemp("inspect-web")
    with contextlib.ExitStack() as stack:
        kube, _ = stack.enter_context(
            t4_cluster_with_extender(
                control_plane, NODES, NAMESPACE, "gpushare-extender-web", SCHEDULER_NAME
            )
        )
        place(kube, "train", 12, NODES[0])
        place(kube, "serve", 4, NODES[0])
        for name in ("train", "serve"):
            wait_for(f"{name} bound", functools.partial(_bound, kube, name))
        place(kube, "huge", 40, NODES[0])  # larger than any GPU: Pending
        (port,) = free_ports(1)
        argv = gpushare_argv("inspect", "--web", "--web-port", str(port))
        argv += ["--kubeconfig", str(control_plane.kubeconfig)]
        web = ManagedProcess("gpushare-inspect-web", argv, workdir).start()
        stack.callback(web.stop)
        url = f"http://127.0.0.1:{port}/"
        wait_until("the GPU map serves", lambda: http_ok(url), 30, processes=[web])
        assert f"GPU map on {url}" in web.log_path.read_text()
        yield Page(url, kube, control_plane.kubeconfig)


def test_the_page_shows_the_cluster(page: Page) -> None:
    text = page.text()
    assert f"{NODES[0]} 16/32 GiB allocated" in text
    assert "GPU 0 · Tesla T4 · 16/16 GiB" in text  # binpack: both on GPU 0
    assert f"{NAMESPACE}/train 12" in text
    assert f"{NAMESPACE}/serve 4" in text
    assert "UNHEALTHY" in text.upper()
    assert f"{NAMESPACE}/huge 40 GiB" in text
    assert "request is larger than any GPU" in text


def test_the_json_is_kubectl_inspect_gpushare_o_json(page: Page) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(page.url + "report.json", timeout=10) as response:
        served = json.loads(response.read())
    printed = subprocess.run(
        [*gpushare_argv("inspect", "-o", "json"), "--kubeconfig", str(page.kubeconfig)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert served == json.loads(printed)


def test_the_page_follows_the_cluster(page: Page) -> None:
    page.kube.delete(Pod, "train", namespace=NAMESPACE, grace_period=0)
    place(page.kube, "notebook", 6, NODES[0])
    wait_for("notebook bound", functools.partial(_bound, page.kube, "notebook"))

    def without_train() -> str | None:
        text = page.text()
        return text if f"{NAMESPACE}/train" not in text else None

    text = wait_for("the page without train", without_train)
    assert f"{NAMESPACE}/notebook 6" in text
    assert f"{NAMESPACE}/serve 4" in text


def test_only_loopback_is_served(page: Page) -> None:
    port = int(page.url.rsplit(":", 1)[1].strip("/"))
    listening = Path("/proc/net/tcp").read_text()
    local = [line.split()[1] for line in listening.splitlines()[1:] if line.split()[3] == "0A"]
    ours = [address for address in local if int(address.split(":")[1], 16) == port]
    assert ours == ["0100007F:" + f"{port:04X}"]  # 127.0.0.1, little-endian hex
