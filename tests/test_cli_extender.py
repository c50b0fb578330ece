"""``gpushare extender``: its options, the ``--in-memory`` state it builds, bad ``--nodes`` files
and bad kubeconfigs that exit non-zero with a message naming the file and the problem (never a
traceback), and options that do not go together. The live mode runs in
``tests/cluster/test_extender_live.py``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli import extender as extender_cli
from gpushare.cli.extender import build_state
from gpushare.cli.main import main
from gpushare.extender.live import LiveOptions
from gpushare.kube.codec import MemoryUnit
from gpushare.testing.extender import node_json, plain_node_json


def test_help_lists_the_options() -> None:
    result = CliRunner().invoke(main, ["extender", "--help"])
    assert result.exit_code == 0
    options = ("--port", "--prefix", "--policy", "--gpu-unit", "--assume-ttl", "--bind-timeout")
    for option in (*options, "--kubeconfig", "--context", "--in-memory", "--nodes"):
        assert option in result.output
    assert "12345" in result.output


@pytest.mark.parametrize("wrap", [True, False], ids=["NodeList", "list of nodes"])
def test_build_state_preloads_nodes(tmp_path: Path, wrap: bool) -> None:
    items = [node_json("n1", [16, 16], unit=MemoryUnit.GIB), plain_node_json("cpu")]
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps({"kind": "NodeList", "items": items} if wrap else items))
    state = build_state(path, assume_ttl_s=5)
    assert state.cluster.synced
    assert [info.node.name for info in state.cluster.nodes()] == ["cpu", "n1"]
    assert state.reservations.ledger_state("n1").gpu_free == (16, 16)


BAD_FILES = [
    ("not JSON", "{", "Expecting"),
    ("not a list", '{"items": 3}', "expected a NodeList"),
    ("item not an object", "[3]", "not a Node object"),
    ("garbage inventory", json.dumps([{"metadata": {"name": "x"}, "status": {"capacity": {
        "aliyun.com/gpu-mem": "lots"}}}]), "node x: status.capacity.aliyun.com/gpu-mem='lots'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"), [b[1:] for b in BAD_FILES], ids=[b[0] for b in BAD_FILES]
)
def test_bad_nodes_file(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(text)
    result = CliRunner().invoke(
        main, ["extender", "--in-memory", "--nodes", str(path), "--port", "1"]
    )
    assert result.exit_code != 0
    assert f"--nodes {path}" in result.output
    assert message in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nodes", "{nodes}"], "--nodes needs --in-memory"),
        (["--in-memory", "--kubeconfig", "{nodes}"], "--in-memory takes no --kubeconfig"),
        (["--in-memory", "--context", "c"], "--in-memory takes no --kubeconfig or --context"),
    ],
    ids=["nodes without in-memory", "in-memory with kubeconfig", "in-memory with context"],
)
def test_options_that_do_not_go_together(tmp_path: Path, extra: list[str], message: str) -> None:
    path = tmp_path / "nodes.json"
    path.write_text("[]")
    args = [a.format(nodes=path) for a in extra]
    result = CliRunner().invoke(main, ["extender", *args, "--port", "1"])
    assert result.exit_code == 2
    assert message in result.output


@pytest.mark.parametrize(
    ("text", "context"),
    [
        ("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n", None),
        (
            "apiVersion: v1\nkind: Config\ncurrent-context: a\nclusters:\n- name: a\n"
            "  cluster: {server: 'https://127.0.0.1:1'}\ncontexts:\n- name: a\n"
            "  context: {cluster: a, user: a}\nusers:\n- name: a\n  user: {}\n",
            "missing",
        ),
    ],
    ids=["no context", "unknown context"],
)
def test_bad_kubeconfig(tmp_path: Path, text: str, context: str | None) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(text)
    args = ["extender", "--kubeconfig", str(path), "--port", "1"]
    result = CliRunner().invoke(main, args + (["--context", context] if context else []))
    assert result.exit_code == 1
    assert f"Error: kubeconfig {path}: " in result.output
    assert "Traceback" not in result.output


def test_it_listens_on_loopback_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Not every interface by default; in a pod the chart passes the pod's IP."""
    heard: list[str] = []
    monkeypatch.setattr("uvicorn.run", lambda app, host, **kw: heard.append(host))

    async def serve(client: object, options: LiveOptions) -> None:
        heard.append(options.host)

    monkeypatch.setattr(extender_cli, "connect_or_exit", lambda *a, **kw: object())
    monkeypatch.setattr(extender_cli, "serve", serve)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("{}")
    for args in (["--in-memory"], ["--kubeconfig", str(kubeconfig)]):
        for host in ([], ["--host", "10.1.2.3"]):
            result = CliRunner().invoke(main, ["extender", *args, *host, "--port", "1"])
            assert result.exit_code == 0, result.output
    assert heard == ["127.0.0.1", "10.1.2.3", "127.0.0.1", "10.1.2.3"]
