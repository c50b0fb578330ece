"""Every command that takes a kubeconfig answers a bad one with one line naming the file and the
problem, never a traceback (``--kubeconfig /etc/passwd`` once ended in
``AttributeError`` in ``gpushare device-plugin``). Commands × bad kubeconfigs, table-driven."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from gpushare.cli.inspect import PROG_NAME, inspect
from gpushare.cli.main import main

GOOD = """apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: not-a-real-token}
contexts:
- name: test
  context: {cluster: c, user: u}
- name: lost
  context: {cluster: gone, user: u}
current-context: test
"""


@dataclass(frozen=True)
class Command:
    """How to run one command with ``--kubeconfig PATH`` and extra arguments."""

    cli: click.Command
    args: Callable[[Path], list[str]]
    prog_name: str = "gpushare"


def _device_plugin(tmp: Path) -> list[str]:
    fake = ["--fake-gpus", "1x16GiB:T4", "--device-plugin-dir", str(tmp), "--metrics-port", "0"]
    return ["device-plugin", "--node-name", "n1", *fake]


COMMANDS = {
    "extender": Command(main, lambda _: ["extender", "--port", "1"]),
    "device-plugin": Command(main, _device_plugin),
    "gpushare inspect": Command(main, lambda _: ["inspect"]),
    "kubectl-inspect-gpushare": Command(inspect, lambda _: [], prog_name=PROG_NAME),
}


@dataclass(frozen=True)
class BadKubeconfig:
    """A kubeconfig (written by ``make`` into the temp dir, or a fixed path) and the problem
    the one error line must name (a regular expression)."""

    make: Callable[[Path], Path]
    problem: str
    context: str | None = None


def _write(text: str | bytes) -> Callable[[Path], Path]:
    def make(tmp: Path) -> Path:
        path = tmp / "kubeconfig"
        if isinstance(text, bytes):
            path.write_bytes(text)
        else:
            path.write_text(text)
        return path

    return make


def _pem(tmp: Path) -> Path:
    """A file that exists where a certificate is named (its content is never read: the check
    of the missing key comes first)."""
    path = tmp / "admin.crt"
    path.write_text("not read\n")
    return path


BAD = {
    "not YAML": BadKubeconfig(_write("clusters: [unclosed\n"), r"not YAML at line \d+"),
    "/etc/passwd (YAML, a string)": BadKubeconfig(
        _write("root:x:0:0:root:/root:/bin/bash\nbin:x:1:1:bin:/bin:/sbin/nologin\n"),
        r"not a kubeconfig \(YAML str\); expected a kubeconfig",
    ),
    "empty": BadKubeconfig(_write(""), r"not a kubeconfig \(empty\)"),
    "YAML but a Pod": BadKubeconfig(
        _write("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n"),
        r"not a kubeconfig \(no 'clusters'\)",
    ),
    "clusters not a list": BadKubeconfig(
        _write("clusters: 3\ncontexts: []\n"), r"'clusters' must be a list of entries"
    ),
    "cluster entry of the wrong shape": BadKubeconfig(
        _write("clusters:\n- name: c\n  cluster: 7\ncontexts: []\n"),
        r"not a valid kubeconfig",
    ),
    "not UTF-8": BadKubeconfig(_write(b"\xff\xfe\x00binary"), r"not text \(byte 0 is not UTF-8\)"),
    "unreadable (read fails)": BadKubeconfig(
        lambda _: Path("/proc/self/mem"), r"cannot read it: Input/output error"
    ),
    "missing file": BadKubeconfig(
        lambda tmp: tmp / "absent.yaml", r"does not exist|no kubeconfig found at"
    ),
    "no such context": BadKubeconfig(
        _write(GOOD), r"no context 'nope' \(contexts: lost, test\)", context="nope"
    ),
    "context naming a missing cluster": BadKubeconfig(
        _write(GOOD), r"context 'lost' names cluster 'gone', which the file lacks", context="lost"
    ),
    "context naming no user": BadKubeconfig(
        _write(GOOD.replace("context: {cluster: c, user: u}", "context: {cluster: c}")),
        r"context 'test' names no user",
    ),
    "client certificate gone (a cluster torn down)": BadKubeconfig(
        _write(
            GOOD.replace(
                "user: {token: not-a-real-token}",
                "user: {client-certificate: /nonexistent/demo/admin.crt, "
                "client-key: /nonexistent/demo/admin.key}",
            )
        ),
        r"users entry 'u' points client-certificate at /nonexistent/demo/admin\.crt, which "
        r"does not exist",
    ),
    "client key gone, relative to the kubeconfig's folder": BadKubeconfig(
        lambda tmp: _write(
            GOOD.replace(
                "user: {token: not-a-real-token}",
                f"user: {{client-certificate: {_pem(tmp)}, client-key: gone/admin.key}}",
            )
        )(tmp),
        r"users entry 'u' points client-key at /\S+/gone/admin\.key, which does not exist",
    ),
    "certificate authority gone": BadKubeconfig(
        _write(
            GOOD.replace(
                "insecure-skip-tls-verify: true", "certificate-authority: /nonexistent/ca.crt"
            )
        ),
        r"clusters entry 'c' points certificate-authority at /nonexistent/ca\.crt, which "
        r"does not exist",
    ),
    "no current context": BadKubeconfig(
        _write(GOOD.replace("current-context: test\n", "")),
        r"no current-context; choose one with --context",
    ),
}


def run(command: Command, path: Path, context: str | None, tmp: Path) -> Result:
    args = [*command.args(tmp), "--kubeconfig", str(path)]
    if context is not None:
        args += ["--context", context]
    return CliRunner().invoke(command.cli, args, prog_name=command.prog_name)


@pytest.fixture(autouse=True)
def no_ambient_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("bad", BAD.values(), ids=BAD.keys())
@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_bad_kubeconfig_is_one_line_naming_file_and_problem(
    command: Command, bad: BadKubeconfig, tmp_path: Path
) -> None:
    path = bad.make(tmp_path)
    result = run(command, path, bad.context, tmp_path)
    assert "Traceback" not in result.output
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (1, 2), result.output
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    (line,) = errors
    assert str(path) in line
    assert re.search(bad.problem, line), line


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_bad_kubeconfig_from_the_environment_is_named_too(
    command: Command, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = _write("root:x:0:0:root:/root:/bin/bash\n")(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(path))
    result = CliRunner().invoke(command.cli, command.args(tmp_path), prog_name=command.prog_name)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    expected = "not a kubeconfig (YAML str); expected a kubeconfig (a YAML mapping with"
    assert len(errors) == 1
    assert errors[0].startswith(f"Error: kubeconfig {path}: {expected}")
