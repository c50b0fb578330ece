"""``gpushare dra-driver``: user errors end at once in one line naming the value and the fix,
never a traceback. The driver at work: tests/cluster/test_dra_allocation.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli.main import main

KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


@pytest.mark.parametrize(
    ("gpus", "unit", "message"),
    [
        pytest.param("99999999x16GiB:T4", "GiB", "GPU count 99999999 is out of range",
                     id="an absurd GPU count"),
        pytest.param("1x512MiB:tiny", "GiB", "holds no whole GiB to share",
                     id="a GPU smaller than one unit"),
        pytest.param("2x16GiB:T4", "GiB", "node n1: ", id="no API server at the address"),
    ],
)  # fmt: skip
def test_a_user_error_is_one_line(tmp_path: Path, gpus: str, unit: str, message: str) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    args = [
        "dra-driver", "--node-name", "n1", "--fake-gpus", gpus, "--memory-unit", unit,
        "--plugin-dir", str(tmp_path / "p"), "--registry-dir", str(tmp_path / "r"),
        "--cdi-dir", str(tmp_path / "c"), "--kubeconfig", str(kubeconfig),
    ]  # fmt: skip
    result = CliRunner().invoke(main, args)
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (1, 2)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert message in errors[0]
    assert "Traceback" not in result.output


def test_help_names_where_the_driver_lives() -> None:
    result = CliRunner().invoke(main, ["dra-driver", "--help"])
    for text in ("--plugin-dir", "--registry-dir", "--cdi-dir", "gpu.gpushare.io"):
        assert text in result.output
