"""``make demo`` (``python -m gpushare.demo up|status|down``) end to end, as a user runs it.

``up`` starts the demo cluster in the background (its own control plane with
kube-controller-manager, kwok GPU nodes, the extender and the second scheduler, as the chart's
defaults have them: no request dialect), applies ``examples/`` one file at a time and prints
where the pods went and ``kubectl inspect gpushare -d``; the cluster keeps running after the
command returns. Proved, from the pods' annotations through the demo's kubeconfig: the examples
land as docs/usage.md says (the four binpack pods on one GPU; the three notebooks on the T4; the
exclusive pod alone on its GPU); the dialect examples are left out, saying why and how to see
them (tests/cluster/test_demo_dialects.py runs ``up --dialects``); every placed pod is recorded
started as the device plugin records it, so ``kubectl inspect gpushare -d`` shows no pod
``starting``; the commands the demo prints run as printed from a fresh shell (no PATH set up);
the pod that fits nowhere is Pending with the extender's reason; a second ``up`` reuses the
running cluster, and refuses ``--dialects`` it was not started with; ``status`` answers;
``down`` stops every process.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Pod

from gpushare.core.model import Allocation
from gpushare.kube.codec import ALIYUN_ASSIGNED, pod_allocation
from gpushare.testing.controlplane import wait_until

pytestmark = pytest.mark.cluster

DEMO = [sys.executable, "-m", "gpushare.demo"]


def run(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    """``python -m gpushare.demo ARGS --dir DIRECTORY``, from this directory."""
    return subprocess.run(
        [*DEMO, *args, "--dir", str(directory)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


@contextlib.contextmanager
def running_demo(
    tmp_path_factory: pytest.TempPathFactory, *flags: str
) -> Iterator[tuple[Path, str]]:
    """``up FLAGS`` in a directory of its own: (the directory, what ``up`` printed); ``down``
    after, leaving nothing running."""
    directory = tmp_path_factory.mktemp("demo")
    up = run("up", *flags, directory=directory)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield directory, up.stdout
    finally:
        down = run("down", directory=directory)
        assert down.returncode == 0, down.stdout + down.stderr
        assert run("status", directory=directory).returncode == 3  # nothing left running


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    with running_demo(tmp_path_factory) as running:
        yield running


def pods_of(directory: Path) -> list[Pod]:
    """Every example pod, through the demo's kubeconfig."""
    with Client(KubeConfig.from_file(directory / "kubeconfig"), trust_env=False) as kube:
        return [p for ns in ("default", "notebooks") for p in kube.list(Pod, namespace=ns)]


def allocations(directory: Path) -> dict[str, tuple[str | None, Allocation | None]]:
    """Pod name → (node, allocation) of every example pod."""
    found: dict[str, tuple[str | None, Allocation | None]] = {}
    for pod in pods_of(directory):
        assert pod.metadata is not None
        assert pod.spec is not None
        allocation = pod_allocation(pod.to_dict())
        found[pod.metadata.name or ""] = (pod.spec.nodeName, allocation)
    return found


def gpus(allocation: Allocation | None) -> set[tuple[str, int]]:
    assert allocation is not None
    return {(allocation.node, i) for c in allocation.containers for i in c.gpu_indices}


def test_with_the_dialects_their_examples_land_as_the_docs_say(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """``up --dialects`` (the chart with devicePlugin.dialects and scheduler.dialectResources
    set) applies gpu-manager's and HAMi's examples too: gpu-manager's pod with half a GPU's
    compute and 8 GiB, its whole-GPU pod and the exclusive pod alone on their GPUs; HAMi's
    3,000 MiB as 3 GiB, on two GPUs for the two-GPU pod. First in this file, so that its own
    demo is down before the shared one (``demo``) starts."""
    with running_demo(tmp_path_factory, "--dialects") as (directory, out):
        assert "gpu-manager.yaml, hami.yaml" in out
        assert "were left out" not in out
        assert_dialect_examples_land(directory)


def assert_dialect_examples_land(directory: Path) -> None:
    placed = allocations(directory)
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


def test_up_shows_progress_placements_and_inspect(demo: tuple[Path, str]) -> None:
    _, out = demo
    assert "starting etcd, kube-apiserver, kube-controller-manager" in out
    assert "ready" in out
    assert "The example pods:" in out
    assert "$ .venv/bin/gpushare inspect -d     # kubectl inspect gpushare -d" in out
    assert "export KUBECONFIG=" in out
    assert "gpu-manager.yaml and hami.yaml were left out" in out
    assert "-m gpushare.demo up --dialects" in out


def test_the_examples_land_as_the_docs_say(demo: tuple[Path, str]) -> None:
    directory, _ = demo
    placed = allocations(directory)
    binpack = [placed[f"binpack-{i}"][1] for i in range(1, 5)]
    assert len(set().union(*(gpus(a) for a in binpack))) == 1  # one GPU for all four
    notebooks = [a for name, (_, a) in placed.items() if name.startswith("tf-notebook-")]
    assert len(notebooks) == 3
    assert {g for a in notebooks for g in gpus(a)} == {("demo-t4-0", 0)}
    whole = placed["whole-gpu"][1]
    assert whole is not None
    assert all(c.exclusive for c in whole.containers)
    others = {g for name, (_, a) in placed.items() if name != "whole-gpu" and a for g in gpus(a)}
    assert not gpus(whole) & others, "whole-gpu shares its GPU"
    assert not {"vcuda-half", "vcuda-whole", "hami-one", "hami-two"} & set(placed)
    assert placed["never-fits"] == (None, None)


def started(directory: Path) -> dict[str, bool]:
    """Placed example pod name → whether the device plugin's record says it started."""
    return {
        pod.metadata.name or "": (pod.metadata.annotations or {}).get(ALIYUN_ASSIGNED) == "true"
        for pod in pods_of(directory)
        if pod.metadata is not None and pod.spec is not None and pod.spec.nodeName
    }


def test_every_placed_pod_is_recorded_started_so_none_stays_starting(
    demo: tuple[Path, str],
) -> None:
    directory, _ = demo
    wait_until(
        "every placed example pod recorded started",
        lambda: all(started(directory).values()),
        60,
        detail=lambda: started(directory),
    )
    assert len(started(directory)) == 8  # 4 binpack, 3 notebooks, whole-gpu
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "gpushare"), "inspect", "-d", "--kubeconfig",
         str(directory / "kubeconfig")],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert "STATE" not in shown, shown  # the column appears only while a pod is not assigned
    assert "starting" not in shown.split(), shown


def test_the_printed_commands_run_as_printed_from_a_fresh_shell(demo: tuple[Path, str]) -> None:
    """The next steps ``up`` prints, pasted into a shell whose PATH has neither the venv nor
    kubectl (the GPU map's server left out: it runs until Ctrl-C), then ``kubectl inspect
    gpushare`` as kubectl's plugin after the printed PATH line."""
    directory, out = demo
    block = out.split("The cluster keeps running.", 1)[1].splitlines()[1:]
    commands = [line.split("  #", 1)[0].strip() for line in block if line.startswith("  ")]
    commands = [c for c in commands if c and "--web" not in c and not c.startswith("pods ")]
    assert any(c.startswith("export PATH=") for c in commands), commands
    script = "set -e\n" + "\n".join([*commands, "kubectl inspect gpushare -d"]) + "\n"
    shell = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script],
        capture_output=True, text=True, timeout=300, check=False,
        env={"PATH": "/usr/bin:/bin", "HOME": str(directory)},
    )  # fmt: skip
    assert shell.returncode == 0, script + shell.stdout + shell.stderr
    assert shell.stdout.count("demo-t4-0") >= 3, shell.stdout  # get pods, inspect twice, status
    assert "The demo runs (PID" in shell.stdout
    stop = out.rsplit("Stop it with: ", 1)[1].strip()
    assert stop.endswith(f"-m gpushare.demo down --dir {directory}"), stop


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
    refused = run("up", "--dialects", directory=directory)
    assert refused.returncode == 1
    assert "the running demo has the dialects off" in refused.stderr
    status = run("status", directory=directory)
    assert status.returncode == 0, status.stderr
    assert "The demo runs (PID" in status.stdout
    assert "demo-t4-0" in status.stdout
