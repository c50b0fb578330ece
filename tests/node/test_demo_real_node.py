"""``make demo-real-node`` (``python -m gpushare.demo up --real-node``) end to end, as a user
runs it: beside the kwok nodes, a real kubelet + containerd node whose ``gpushare device-plugin``
serves two fake 16 GiB GPUs; the binpack example's four pods run there for real and print the
``ALIYUN_COM_GPU_MEM_*`` variables Allocate gave them (Alibaba's walkthrough): 2 GiB each, all
four on one GPU of 16 GiB (the demo's policy is binpack); the kwok examples still land as
docs/usage.md says (the real node is tainted); ``down`` stops everything and frees the node.

The demo takes the machine's real-node lock itself, so this module runs before any test that
uses the session's real node (``conftest.py`` orders it first).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.node

DEMO = [sys.executable, "-m", "gpushare.demo"]
LINE = re.compile(r"real-node/(real-binpack-\d) on demo-real-0: (.*)")


def run(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEMO, *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )


@pytest.fixture(scope="module")
def real_demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    directory = tmp_path_factory.mktemp("demo-real")
    up = run("up", "--real-node", directory=directory)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield up.stdout
    finally:
        down = run("down", directory=directory)
        assert down.returncode == 0, down.stdout + down.stderr
        assert run("status", directory=directory).returncode == 3  # nothing left running


def test_the_binpack_pods_run_on_the_real_node_and_print_their_gpu(real_demo: str) -> None:
    found = {m[1]: dict(kv.split("=", 1) for kv in m[2].split()) for m in LINE.finditer(real_demo)}
    assert sorted(found) == [f"real-binpack-{i}" for i in range(1, 5)], real_demo
    for name, env in found.items():
        assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "2", name
        assert env["ALIYUN_COM_GPU_MEM_DEV"] == "16", name
    assert len({env["ALIYUN_COM_GPU_MEM_IDX"] for env in found.values()}) == 1, "binpack: one GPU"


def test_the_kwok_examples_stay_off_the_real_node(real_demo: str) -> None:
    assert "starting the real node demo-real-0" in real_demo
    table = real_demo.split("The example pods:")[1].split("Running the binpack", maxsplit=1)[0]
    assert "binpack-1" in table
    assert "demo-real-0" not in table
