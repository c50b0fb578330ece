"""``make demo`` (``python -m gpushare.demo up|status|down``) end to end, as a user runs it.

``up`` starts the demo cluster in the background (its own control plane with
kube-controller-manager, kwok GPU nodes, the extender and the second scheduler), applies
``examples/`` one file at a time and prints where the pods went and ``kubectl inspect gpushare
-d``; the cluster keeps running after the command returns. Proved, from the pods' annotations
through the demo's kubeconfig: the examples land as docs/usage.md says (the four binpack pods on
one GPU; the three notebooks on the T4; the gpu-manager pod with half a GPU's compute and 8 GiB,
its whole-GPU pod and the exclusive pod alone on their GPUs; HAMi's 3,000 MiB as 3 GiB, on two
GPUs for the two-GPU pod); the pod that fits nowhere is Pending with the extender's reason; a
second ``up`` reuses the running cluster; ``status`` answers; ``down`` stops every process.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from gpushare.core.model import Allocation
from gpushare.kube.codec import pod_allocation

pytestmark = pytest.mark.cluster

DEMO = [sys.executable, "-m", "gpushare.demo"]


def run(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*DEMO, *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    directory = tmp_path_factory.mktemp("demo")
    up = run("up", directory=directory)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield directory, up.stdout
    finally:
        down = run("down", directory=directory)
        assert down.returncode == 0, down.stdout + down.stderr
        assert run("status", directory=directory).returncode == 3  # nothing left running


def allocations(directory: Path) -> dict[str, tuple[str | None, Allocation | None]]:
    """Pod name → (node, allocation) of every example pod."""
    found: dict[str, tuple[str | None, Allocation | None]] = {}
    with Client(KubeConfig.from_file(directory / "kubeconfig"), trust_env=False) as kube:
        for namespace in ("default", "notebooks"):
            for pod in kube.list(Pod, namespace=namespace):
                assert pod.metadata is not None
                assert pod.spec is not None
                allocation = pod_allocation(pod.to_dict())
                found[pod.metadata.name or ""] = (pod.spec.nodeName, allocation)
    return found


def gpus(allocation: Allocation | None) -> set[tuple[str, int]]:
    assert allocation is not None
    return {(allocation.node, i) for c in allocation.containers for i in c.gpu_indices}


def test_up_shows_progress_placements_and_inspect(demo: tuple[Path, str]) -> None:
    _, out = demo
    assert "starting etcd, kube-apiserver, kube-controller-manager" in out
    assert "ready" in out
    assert "The example pods:" in out
    assert "$ kubectl inspect gpushare -d" in out
    assert "export KUBECONFIG=" in out


def test_the_examples_land_as_the_docs_say(demo: tuple[Path, str]) -> None:
    directory, _ = demo
    placed = allocations(directory)
    binpack = [placed[f"binpack-{i}"][1] for i in range(1, 5)]
    assert len(set().union(*(gpus(a) for a in binpack))) == 1  # one GPU for all four
    notebooks = [a for name, (_, a) in placed.items() if name.startswith("tf-notebook-")]
    assert len(notebooks) == 3
    assert {g for a in notebooks for g in gpus(a)} == {("demo-t4-0", 0)}
    half = placed["vcuda-half"][1]
    assert half is not None
    (container,) = half.containers
    assert (container.gpu_share, container.compute_milli) == (8, 500)  # 30 x 256 MiB, 50 %
    for whole in ("vcuda-whole", "whole-gpu"):
        allocation = placed[whole][1]
        assert allocation is not None
        assert all(c.exclusive for c in allocation.containers), whole
        others = {g for name, (_, a) in placed.items() if name != whole and a for g in gpus(a)}
        assert not gpus(allocation) & others, f"{whole} shares its GPU"
    one, two = placed["hami-one"][1], placed["hami-two"][1]
    assert one is not None
    assert two is not None
    assert [(c.gpu_share, c.compute_milli) for c in one.containers] == [(3, 300)]
    assert len(gpus(two)) == 2
    assert placed["never-fits"] == (None, None)


def test_the_pod_that_fits_nowhere_says_why(demo: tuple[Path, str]) -> None:
    _, out = demo
    (line,) = [
        line for line in out.splitlines() if "default/never-fits" in line and "Pending" in line
    ]
    assert "gpushare: request is larger than any GPU; container main; requested 100" in line


def test_a_second_up_reuses_it_and_status_answers(demo: tuple[Path, str]) -> None:
    directory, _ = demo
    again = run("up", directory=directory)
    assert again.returncode == 0, again.stderr
    assert "The demo runs already" in again.stdout
    status = run("status", directory=directory)
    assert status.returncode == 0, status.stderr
    assert "The demo runs (PID" in status.stdout
    assert "demo-t4-0" in status.stdout
