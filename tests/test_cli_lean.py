"""A lean runtime: the extender, the device plugin and ``kubectl inspect
gpushare`` start without the simulator's polars and matplotlib (the ``sim`` extra), and
``gpushare simulate`` without that extra says what to install. Each case runs the real command
in a fresh interpreter, so the modules it loads are exactly those a user's start-up loads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from gpushare.cli.main import DISTRIBUTION, SUBCOMMANDS

SIM_ONLY = ("polars", "matplotlib")

# Runs ``gpushare ARGS`` (argv[1:]) in this interpreter with the modules named in the environment
# variable BLOCK made unimportable, then prints the top-level packages it loaded.
PROBE = """
import os, sys
for name in filter(None, os.environ.get("BLOCK", "").split(",")):
    sys.modules[name] = None
from gpushare.cli.main import main
try:
    main(sys.argv[1:], prog_name="gpushare")
except SystemExit as exit:
    code = exit.code
else:
    code = 0
loaded = sorted({m.partition(".")[0] for m in sys.modules if sys.modules[m] is not None})
print("LOADED", ",".join(loaded))
sys.exit(code)
"""


def gpushare(*args: str, block: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"BLOCK": ",".join(block), "PATH": "/usr/bin:/bin"},
        check=False,
    )


def loaded(result: subprocess.CompletedProcess[str]) -> list[str]:
    line = next(x for x in result.stdout.splitlines() if x.startswith("LOADED"))
    return [name for name in line.removeprefix("LOADED").strip().split(",") if name in SIM_ONLY]


RUNTIME_COMMANDS = [
    pytest.param(("extender", "--help"), id="extender"),
    pytest.param(("device-plugin", "--help"), id="device-plugin"),
    pytest.param(("inspect", "--help"), id="inspect"),
    pytest.param(("--version",), id="version"),
]


@pytest.mark.parametrize("args", RUNTIME_COMMANDS)
def test_runtime_commands_do_not_load_the_simulators_dependencies(args: tuple[str, ...]) -> None:
    result = gpushare(*args)
    assert result.returncode == 0, result.stderr
    assert loaded(result) == []


@pytest.mark.parametrize("args", RUNTIME_COMMANDS)
def test_runtime_commands_run_without_the_sim_extra(args: tuple[str, ...]) -> None:
    result = gpushare(*args, block=SIM_ONLY)
    assert result.returncode == 0, result.stderr


def test_simulate_loads_the_simulator_when_it_runs() -> None:
    result = gpushare("simulate", "--help")
    assert result.returncode == 0, result.stderr
    assert "polars" in loaded(result)


@pytest.mark.parametrize("missing", SIM_ONLY)
def test_simulate_without_the_sim_extra_names_the_extra_to_install(missing: str) -> None:
    result = gpushare("simulate", "--seeds", "42", block=(missing,))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert result.stderr.strip() == (
        f"Error: gpushare simulate needs the 'sim' extra ({missing} is not installed): "
        f"pip install '{DISTRIBUTION}[sim]'"
    )


def test_help_lists_every_subcommand_even_without_the_sim_extra() -> None:
    result = gpushare("--help", block=SIM_ONLY)
    assert result.returncode == 0, result.stderr
    for name in SUBCOMMANDS:
        assert name in result.stdout
    assert f"pip install '{DISTRIBUTION}[sim]'" in result.stdout
