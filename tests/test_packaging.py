"""What is shipped and what is installed (docs/install.md,
"The Python package (gpushare-k8s)").

The wheel (and so the image, whose app layer is the wheel installed) carries the runtime: no
test harness (``gpushare.testing``), no demo (``gpushare.demo``), both of which the development
install imports from src/. constraints.txt pins every package ``make`` and the image install,
and agrees with pyproject.toml and with the environment these tests run in.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import gpushare.demo
import gpushare.testing

REPO_ROOT = Path(__file__).resolve().parents[1]
RUNTIME_PACKAGES = ("cli", "core", "deviceplugin", "extender", "inspect", "kube", "sim")


def test_the_wheel_carries_the_runtime_alone(tmp_path: Path) -> None:
    """The wheel built from the tree as it is (with the development install's egg-info, whose
    SOURCES.txt lists the harness) has every runtime package and its data, and neither the
    harness nor the demo, as modules or as package data."""
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, tree / name)
    shutil.copytree(
        REPO_ROOT / "src", tree / "src", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--wheel-dir", str(tmp_path / "dist"), str(tree)],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("gpushare_k8s-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith(("gpushare/testing", "gpushare/demo"))]
    for package in RUNTIME_PACKAGES:
        assert f"gpushare/{package}/__init__.py" in names
    assert {"gpushare/py.typed", "gpushare/inspect/gpumap.html"} <= set(names)
    assert [n for n in names if n.startswith("gpushare/sim/data/") and n.endswith(".csv")]
    assert [
        n for n in names if n.startswith("gpushare/deviceplugin/_proto/") and n.endswith(".pyi")
    ]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "gpushare.cli.main:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


def test_the_harness_is_importable_in_the_development_install() -> None:
    """``make test``, ``make demo`` and bench/gpu import them from src/."""
    src = REPO_ROOT / "src"
    assert Path(gpushare.testing.__file__).is_relative_to(src)
    assert Path(gpushare.demo.__file__).is_relative_to(src)


def test_constraints_agree_with_pyproject_and_the_environment() -> None:
    """scripts/constraints.py --check: every package pyproject.toml requires is pinned within
    its range, and every package installed for gpushare-k8s[sim,test] is at its pin."""
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts" / "constraints.py"), "--check"],
        check=False, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
