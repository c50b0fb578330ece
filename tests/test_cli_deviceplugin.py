"""``gpushare device-plugin``: absurd flags end at once in one line naming the value, the flag
and what is accepted (these once ran forever before any check)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from gpushare.cli.main import main

ABSURD = [
    ("99999999x16GiB:T4", "--fake-gpus", "GPU count 99999999 is out of range; accepted 1 to 256"),
    (
        "1x99999999999999999999GiB:X",
        "--fake-gpus",
        "memory in GiB 99999999999999999999 is out of range; accepted 1 to 1024",
    ),
    ("256x1024GiB:X", "", "over kubelet's 4194304-byte gRPC message limit"),
]


@pytest.mark.parametrize(
    ("spec", "flag", "message"), ABSURD, ids=["99999999 GPUs", "10^20 GiB", "2^28 MiB devices"]
)
def test_absurd_fake_gpus_end_at_once_in_one_line(
    tmp_path: Path, spec: str, flag: str, message: str
) -> None:
    args = ["device-plugin", "--node-name", "n1", "--device-plugin-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--fake-gpus", spec, "--memory-unit", "MiB"])
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (1, 2)
    errors = [line for line in result.output.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, result.output
    assert flag in errors[0]
    assert message in errors[0]


def test_mps_managed_needs_real_gpus(tmp_path: Path) -> None:
    args = ["device-plugin", "--node-name", "n1", "--device-plugin-dir", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--fake-gpus", "1x16GiB", "--mps-managed"])
    assert result.exit_code == 2
    assert "--mps-managed needs real GPUs" in result.output


def test_help_names_the_mps_options() -> None:
    result = CliRunner().invoke(main, ["device-plugin", "--help"])
    for option in ("--mps-managed", "--mps-root", "--mps-control", "/run/gpushare/mps"):
        assert option in result.output
