"""Layering, checked by a test rather than by review (style.md, "Shape of the code" 1).

``gpushare.core`` is the pure core: its modules import only the Python standard library (minus the
modules that do I/O or import dynamically), numpy, and ``gpushare.core`` itself. The check parses
the source with ``ast``, so it sees every import statement, including those under
``if TYPE_CHECKING:`` or inside functions, whatever happens to be imported at run time.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CORE_DIR = Path(__file__).resolve().parents[1] / "src" / "gpushare" / "core"
CORE = "gpushare.core"
THIRD_PARTY_ALLOWED = frozenset({"numpy"})
# Standard-library modules the core must not use: I/O, processes, networking, dynamic imports.
STDLIB_FORBIDDEN = frozenset(
    {
        "asyncio",
        "ftplib",
        "http",
        "importlib",
        "io",
        "multiprocessing",
        "os",
        "pathlib",
        "select",
        "selectors",
        "shutil",
        "signal",
        "smtplib",
        "socket",
        "socketserver",
        "sqlite3",
        "ssl",
        "subprocess",
        "tempfile",
        "urllib",
    }
)


def module_name(path: Path) -> str:
    """The dotted module name of a file under ``CORE_DIR`` (a package's ``__init__`` is it)."""
    parts = path.relative_to(CORE_DIR).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((CORE, *parts))


def imported_names(tree: ast.AST, module: str, is_package: bool) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` for every import in ``tree``; relative ones resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base)
                target = f"{prefix}.{node.module}" if node.module else prefix
            else:
                target = node.module or ""
            # ``from gpushare import sim`` / ``from .. import sim``: the names are the modules.
            if not node.module or CORE.startswith(target + "."):
                found.extend((node.lineno, f"{target}.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, target))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "__import__"
        ):
            found.append((node.lineno, "__import__"))
    return found


def why_forbidden(name: str) -> str | None:
    """Why the core may not import ``name``, or ``None`` when it may."""
    if name == CORE or name.startswith(CORE + "."):
        return None
    top = name.partition(".")[0]
    if top == "gpushare":
        return "another gpushare package"
    if top in THIRD_PARTY_ALLOWED:
        return None
    if top == "__import__":
        return "dynamic import"
    if top not in sys.stdlib_module_names:
        return "not in the standard library"
    if top in STDLIB_FORBIDDEN:
        return "standard-library I/O or dynamic import"
    return None


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """Every forbidden import in ``source`` as ``"line N: name (why)"``."""
    tree = ast.parse(source)
    found: list[str] = []
    for line, name in imported_names(tree, module, is_package):
        why = why_forbidden(name)
        if why is not None:
            found.append(f"line {line}: {name} ({why})")
    return found


CORE_FILES = sorted(CORE_DIR.rglob("*.py"))


def test_core_has_the_modules_this_test_guards() -> None:
    names = {module_name(path) for path in CORE_FILES}
    assert {CORE, f"{CORE}.model", f"{CORE}.fit", f"{CORE}.ledger"} <= names


@pytest.mark.parametrize("path", CORE_FILES, ids=[str(p.relative_to(CORE_DIR)) for p in CORE_FILES])
def test_core_module_imports_only_stdlib_numpy_and_core(path: Path) -> None:
    source = path.read_text(encoding="utf-8")
    found = violations(source, module_name(path), is_package=path.name == "__init__.py")
    assert found == [], f"{path.relative_to(CORE_DIR.parents[1])} imports outside the core: {found}"


# The checker itself: it must fail on what it is meant to catch.
CHECKER_CASES = [
    ("stdlib is allowed", "import math\nfrom collections.abc import Mapping", []),
    ("numpy is allowed", "import numpy as np\nfrom numpy.typing import NDArray", []),
    ("core absolute import is allowed", "from gpushare.core.model import Node", []),
    ("core package import is allowed", "from gpushare import core", []),
    ("relative import inside core is allowed", "from .model import Node\nfrom . import fit", []),
    (
        "third-party library is rejected",
        "import polars as pl",
        ["line 1: polars (not in the standard library)"],
    ),
    (
        "other gpushare package is rejected",
        "from gpushare.sim import engine",
        ["line 1: gpushare.sim (another gpushare package)"],
    ),
    (
        "other gpushare package by name is rejected",
        "from gpushare import cli",
        ["line 1: gpushare.cli (another gpushare package)"],
    ),
    (
        "relative import out of core is rejected",
        "from ..sim import engine\nfrom .. import cli",
        [
            "line 1: gpushare.sim (another gpushare package)",
            "line 2: gpushare.cli (another gpushare package)",
        ],
    ),
    (
        "import under TYPE_CHECKING is still an import",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import httpx",
        ["line 3: httpx (not in the standard library)"],
    ),
    (
        "import inside a function is still an import",
        "def f() -> None:\n    import grpc",
        ["line 2: grpc (not in the standard library)"],
    ),
    (
        "stdlib I/O is rejected",
        "import socket\nfrom subprocess import run",
        [
            "line 1: socket (standard-library I/O or dynamic import)",
            "line 2: subprocess (standard-library I/O or dynamic import)",
        ],
    ),
    (
        "dynamic import is rejected",
        "m = __import__('kubernetes')",
        ["line 1: __import__ (dynamic import)"],
    ),
]


@pytest.mark.parametrize(
    ("source", "expected"),
    [(source, expected) for _, source, expected in CHECKER_CASES],
    ids=[case_id for case_id, _, _ in CHECKER_CASES],
)
def test_checker(source: str, expected: list[str]) -> None:
    assert violations(source, f"{CORE}.example") == expected


def test_checker_resolves_relative_imports_from_a_subpackage_init() -> None:
    assert violations("from . import base", f"{CORE}.policies", is_package=True) == []
    assert violations("from .. import fit", f"{CORE}.policies", is_package=True) == []
    assert violations("from ... import sim", f"{CORE}.policies", is_package=True) == [
        "line 1: gpushare.sim (another gpushare package)"
    ]


# -- the whole design table (design.md section 2), as import-linter contracts ----------------
# The contracts live in pyproject.toml ([tool.importlinter]); docs/architecture.md explains them.
# The AST check above stays for what import-linter does not see: the standard library's I/O
# modules in the core.

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(src: Path, *contracts: str) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts over the ``gpushare`` package in ``src``."""
    args = [str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache"]
    for contract in contracts:
        args += ["--contract", contract]
    return subprocess.run(
        args,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(src)},
        check=False,
    )


def test_the_layering_contracts_are_kept() -> None:
    result = lint_imports(REPO / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


# Each contract must fail on what it is meant to catch: one import added to a copy of the package.
BREAKS = [
    ("core imports kube", "core/fit.py", "import gpushare.kube.codec", "core-pure"),
    ("core imports an HTTP client", "core/model.py", "import httpx2", "core-pure"),
    ("kube imports the extender", "kube/cache.py", "import gpushare.extender", "layers"),
    ("device plugin imports extender", "deviceplugin/allocate.py", "import gpushare.extender",
     "deviceplugin-not-extender"),
    ("device plugin imports the DRA driver", "deviceplugin/allocate.py", "import gpushare.dra",
     "layers"),
    ("DRA driver imports the extender", "dra/slices.py", "import gpushare.extender.state",
     "dra-not-extender"),
    ("simulator imports kube", "sim/engine.py", "import gpushare.kube.codec", "sim-not-kube"),
    ("inspect imports the extender", "inspect/report.py", "import gpushare.extender.state",
     "inspect-below-extender"),
    ("codec imports the client", "kube/codec/pods.py", "import gpushare.kube.client",
     "codec-pure"),
    ("extender imports lightkube", "extender/wire.py", "import lightkube",
     "only-kube-talks-to-the-api-server"),
    ("extender imports httpx2 outside the forwarder", "extender/live.py", "import httpx2",
     "only-kube-talks-to-the-api-server"),
    ("codec imports the lease", "kube/codec/nodes.py", "import gpushare.kube.lease",
     "codec-pure"),
    ("runtime imports testing", "extender/wire.py", "import gpushare.testing.pods",
     "runtime-not-testing"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [case[1:] for case in BREAKS],
    ids=[case[0] for case in BREAKS],
)
def test_a_contract_breaks_on_the_import_it_forbids(
    tmp_path: Path, module: str, line: str, contract: str
) -> None:
    copy = tmp_path / "gpushare"
    shutil.copytree(REPO / "src" / "gpushare", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}\n", encoding="utf-8")
    result = lint_imports(tmp_path, contract)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "1 broken" in result.stdout


def test_a_stale_exception_breaks_the_check(tmp_path: Path) -> None:
    """The forwarder's exception (``ignore_imports``) names a real import: without that import
    the contract fails instead of keeping a stale exception that would hide a later one."""
    copy = tmp_path / "gpushare"
    shutil.copytree(REPO / "src" / "gpushare", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "extender" / "forward.py"
    source = target.read_text(encoding="utf-8")
    assert "\nimport httpx2\n" in source
    target.write_text(source.replace("\nimport httpx2\n", "\nhttpx2 = None\n"), encoding="utf-8")
    result = lint_imports(tmp_path, "only-kube-talks-to-the-api-server")
    assert result.returncode != 0, result.stdout + result.stderr
    assert "No matches for ignored import gpushare.extender.forward -> httpx2" in (
        result.stdout + result.stderr
    )
