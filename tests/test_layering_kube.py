"""Only ``gpushare.kube`` talks to the API server (design.md, section 2), checked by a test.

Outside ``gpushare.kube`` (and the test helpers in ``gpushare.testing``), no module of the
``gpushare`` package imports a Kubernetes client or its HTTP stack. Imports are read with
``ast``, so imports under ``if TYPE_CHECKING:`` and inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "gpushare"
ALLOWED = ("kube", "testing")
API_CLIENTS = frozenset({"lightkube", "httpx2", "httpx", "httpcore", "httpcore2", "kubernetes"})


def api_client_imports(source: str) -> list[str]:
    """``"line N: module"`` for each import of an API client library in ``source``."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found.extend(
            f"line {node.lineno}: {n}" for n in names if n.partition(".")[0] in API_CLIENTS
        )
    return found


# Modules that use the HTTP stack for something other than the API server, and what for.
PEER_HTTP = {
    "extender/forward.py": "a follower forwards kube-scheduler's requests to the leader replica",
}
FILES = sorted(
    p
    for p in PACKAGE.rglob("*.py")
    if p.relative_to(PACKAGE).parts[0] not in ALLOWED
    and str(p.relative_to(PACKAGE)) not in PEER_HTTP
)


def test_peer_http_exceptions_exist() -> None:
    """Every exception names a real module (a stale entry would hide nothing, but mislead)."""
    assert all((PACKAGE / name).is_file() for name in PEER_HTTP)


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(PACKAGE)) for p in FILES])
def test_only_gpushare_kube_imports_an_api_client(path: Path) -> None:
    found = api_client_imports(path.read_text(encoding="utf-8"))
    assert found == [], f"{path.relative_to(PACKAGE.parent)} talks to the API server: {found}"


def test_the_check_sees_what_it_must() -> None:
    source = "import lightkube\nfrom httpx2 import Client\ndef f() -> None:\n    import kubernetes"
    assert api_client_imports(source) == [
        "line 1: lightkube",
        "line 2: httpx2",
        "line 4: kubernetes",
    ]
    assert api_client_imports("import json\nfrom gpushare.kube.cache import ClusterCache") == []
