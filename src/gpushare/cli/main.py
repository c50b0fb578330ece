"""The ``gpushare`` command."""

from __future__ import annotations

import click

from gpushare import __version__
from gpushare.cli.deviceplugin import device_plugin
from gpushare.cli.extender import extender
from gpushare.cli.inspect import inspect
from gpushare.cli.simulate import simulate


@click.group()
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Shared-GPU scheduling for Kubernetes."""


main.add_command(simulate)
main.add_command(extender)
main.add_command(device_plugin)
main.add_command(inspect)
