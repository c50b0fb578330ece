"""The real-node path packed for a lent GPU machine (docs/testing.md, "Real GPU node"): the
bundles' split (``gpushare.testing.gpubundle``) over the binaries ``make test`` builds, the
packer's plan, and the runner ``bench/gpu/node.sh`` checked as shell and in ``--dry-run``.

Compressing the bundles takes minutes on this machine (``xz -9`` of about 410 MB), so the sizes
are the plan's: the files' real sizes and the measured compression ratios
(``gpubundle.XZ_RATIO``); ``bench/gpu/pack.py`` measures the real bundles against the same
limits when it writes them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpushare.testing.controlplane import REPO_ROOT, Binaries
from gpushare.testing.gpubundle import (
    BUNDLE_LIMIT_MIB,
    CALL_LIMIT_MIB,
    MIB,
    XZ_RATIO,
    BundleError,
    Item,
    call_limit_mib,
    fewest_calls,
    node_items,
    plan_bundles,
    repository_mib,
    stripped,
)
from gpushare.testing.node.containerd import containerd2_config
from gpushare.testing.node.prerequisites import containerd_dir

RUNNER = REPO_ROOT / "bench" / "gpu" / "node.sh"
PACKER = REPO_ROOT / "bench" / "gpu" / "pack.py"


def item(dest: str, group: str, estimate_mib: float) -> Item:
    """An item whose estimate under ``XZ_RATIO`` is ``estimate_mib``."""
    return Item(Path("/nowhere") / dest, dest, group, round(estimate_mib / XZ_RATIO[group] * MIB))


def real_items() -> list[Item]:
    return node_items(
        controlplane_dir=Binaries.locate().directory,
        containerd_dir=containerd_dir(),
        runc=Path(shutil.which("runc") or "/usr/sbin/runc"),
        cni_dir=Path("/usr/lib/cni"),
        busybox=Path("/bin/busybox"),
        site_dir=REPO_ROOT / ".gpu-bundle" / "site",
    )


def test_the_real_bundles_each_fit_one_call_beside_the_checkout_and_are_as_few_as_possible() -> (
    None
):
    items = real_items()
    limit = call_limit_mib(repository_mib(REPO_ROOT))
    bundles = plan_bundles(items, limit_mib=limit)
    sizes = {b.name: round(b.estimate_mib, 1) for b in bundles}
    assert all(b.estimate_mib <= limit <= BUNDLE_LIMIT_MIB for b in bundles), sizes
    assert len(bundles) == fewest_calls(items, limit_mib=limit), sizes
    assert sorted(i.dest for b in bundles for i in b.items) == sorted(i.dest for i in items)
    # the probe (runc, containerd, the image, the harness's Python) needs the first one only
    assert {"runtime", "python"} <= set(bundles[0].groups)


def test_every_carried_binary_is_already_stripped() -> None:
    binaries = [i.source for i in real_items() if i.dest.startswith("bin/")]
    assert [str(b) for b in binaries if not stripped(b)] == []


def test_a_file_that_is_not_elf_is_refused_by_name(tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(BundleError, match=re.escape(f"{script}: not a 64-bit")):
        stripped(script)


@pytest.mark.parametrize(
    ("items", "limit_mib", "expected"),
    [
        pytest.param(
            [item("bin/a", "kubernetes", 10), item("bin/b", "runtime", 5)], 58.0,
            [["bin/b", "bin/a"]], id="everything-under-the-limit-is-one-bundle-runtime-first",
        ),
        pytest.param(
            [item("bin/k1", "kubernetes", 30), item("bin/k2", "kubernetes", 30),
             item("bin/r", "runtime", 20), item("site", "python", 6)], 58.0,
            [["bin/r", "site", "bin/k1"], ["bin/k2"]],
            id="the-runtime-and-python-fill-the-first-bundle-then-the-largest-that-fit",
        ),
        pytest.param(
            [item("bin/k1", "kubernetes", 40), item("bin/k2", "kubernetes", 30),
             item("bin/k3", "kubernetes", 15)], 58.0,
            [["bin/k1", "bin/k3"], ["bin/k2"]], id="a-later-item-fills-an-earlier-bundle",
        ),
        pytest.param(
            [item("bin/a", "kubernetes", 29), item("bin/b", "kubernetes", 29)], 58.0,
            [["bin/a", "bin/b"]], id="exactly-the-limit-fits",
        ),
    ],
)  # fmt: skip
def test_plan_splits_in_group_order_into_the_fewest_bundles_under_the_limit(
    items: list[Item], limit_mib: float, expected: list[list[str]]
) -> None:
    bundles = plan_bundles(items, limit_mib=limit_mib)
    assert [[i.dest for i in b.items] for b in bundles] == expected
    assert [b.name for b in bundles] == [
        f"gpu-node-{k}-of-{len(expected)}.tar.xz" for k in range(1, len(expected) + 1)
    ]


def test_an_item_no_call_can_carry_is_refused_naming_it_and_the_limit() -> None:
    with pytest.raises(BundleError, match=r"bin/huge \(~70\.0 MiB\): over the 58\.0 MiB"):
        plan_bundles([item("bin/huge", "kubernetes", 70)], limit_mib=58.0)


@pytest.mark.parametrize(
    ("repository", "limit"),
    [
        pytest.param(5.0, CALL_LIMIT_MIB - 5.0 - 0.5, id="a-5-MiB-checkout-leaves-58.5"),
        pytest.param(1.0, BUNDLE_LIMIT_MIB, id="a-small-checkout-still-caps-a-bundle-at-60"),
    ],
)
def test_a_bundle_may_weigh_what_the_checkout_leaves_of_a_call(
    repository: float, limit: float
) -> None:
    assert call_limit_mib(repository) == pytest.approx(limit)


def test_the_packers_plan_prints_each_bundle_and_the_fewest_possible() -> None:
    done = subprocess.run(
        [sys.executable, str(PACKER), "--plan"], capture_output=True, text=True, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT / "src")},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    counted = re.search(r"(\d+) bundle\(s\), fewest possible (\d+)", done.stdout)
    assert counted is not None, done.stdout
    assert counted[1] == counted[2]
    assert done.stdout.count("gpu-node-") == int(counted[1])


@pytest.mark.parametrize(
    ("snapshotter", "line"),
    [
        pytest.param(None, "snapshotter = 'overlayfs'", id="overlayfs-by-default-as-in-tests-node"),
        pytest.param("native", "snapshotter = 'native'", id="native-where-overlay-is-refused"),
    ],
)
def test_containerd_takes_the_snapshotter_the_runner_chose(
    tmp_path: Path, snapshotter: str | None, line: str
) -> None:
    config = (
        containerd2_config(tmp_path, tmp_path)
        if snapshotter is None
        else containerd2_config(tmp_path, tmp_path, snapshotter)
    )
    assert [text.strip() for text in config.splitlines() if "snapshotter" in text] == [line]


# ---- the runner ---------------------------------------------------------------------------


def test_the_runner_is_valid_bash() -> None:
    done = subprocess.run(["bash", "-n", str(RUNNER)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_runner_passes_shellcheck() -> None:
    done = subprocess.run(["shellcheck", str(RUNNER)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def dry_run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPUSHARE_NODE_ROOT": str(tmp_path)}
    return subprocess.run(
        ["bash", str(RUNNER), *args], capture_output=True, text=True, env=env, check=False
    )


PROBE = ["unpack", "runc starts", "cgroups", "snapshotter", "runc runs", "containerd 2.x",
         "nvidia-smi -L"]  # fmt: skip


@pytest.mark.parametrize(
    ("args", "steps"),
    [
        pytest.param(["--probe"], PROBE, id="probe-checks-runc-containerd-and-the-gpu-only"),
        pytest.param(
            ["device-plugin"], [*PROBE, "node_run.py device-plugin"],
            id="device-plugin-probes-first-then-runs-the-node",
        ),
        pytest.param(["dra"], [*PROBE, "node_run.py dra"], id="dra-probes-first-then-runs"),
        pytest.param(
            [], [*PROBE, "node_run.py device-plugin", "node_run.py dra"],
            id="the-default-runs-both-after-the-probe",
        ),
        pytest.param(["unpack"], ["unpack"], id="unpack-only-unpacks"),
    ],
)  # fmt: skip
def test_the_runners_dry_run_prints_its_steps_in_order_and_runs_nothing(
    tmp_path: Path, args: list[str], steps: list[str]
) -> None:
    done = dry_run(tmp_path, "--dry-run", *args)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "step:" in line]
    found = [next((k for k, line in enumerate(lines) if s in line), -1) for s in steps]
    assert -1 not in found, lines
    assert found == sorted(found), lines
    if "node_run.py dra" not in steps:
        assert "node_run.py dra" not in done.stdout
    assert "nothing ran" in done.stdout or args == ["unpack"]
    assert (tmp_path / "out" / "node.log").read_text() == done.stdout
    assert list(tmp_path.iterdir()) == [tmp_path / "out"]  # no bundle unpacked, nothing made


def test_the_runner_refuses_an_unknown_mode_naming_it() -> None:
    done = subprocess.run(
        ["bash", str(RUNNER), "--prob"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 2
    assert "unknown argument '--prob'" in done.stderr
    assert "usage: bash bench/gpu/node.sh" in done.stderr
