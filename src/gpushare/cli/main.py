"""The ``gpushare`` command.

Subcommands are imported only when they run (click's lazy group pattern, "Lazily Loading
Subcommands" in click's documentation): ``gpushare device-plugin`` and ``gpushare extender``
never import the simulator's polars and matplotlib, which live in the ``sim`` extra
(``pip install 'gpushare-k8s[sim]'``). Without that extra, ``gpushare simulate`` says which
extra to install (exit status 1) instead of a traceback.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

import click

from gpushare import __version__

__all__ = ["DISTRIBUTION", "SUBCOMMANDS", "LazyCommand", "LazyGroup", "main"]

DISTRIBUTION = "gpushare-k8s"
"""The distribution's name on package indexes (``gpushare`` there is an unrelated project)."""


@dataclass(frozen=True, slots=True)
class LazyCommand:
    """Where a subcommand's ``click.Command`` lives (``module``, ``attribute``), and the extra
    whose packages it needs beyond the runtime's (``None``: none)."""

    module: str
    attribute: str
    extra: str | None = None


SUBCOMMANDS: dict[str, LazyCommand] = {
    "device-plugin": LazyCommand("gpushare.cli.deviceplugin", "device_plugin"),
    "dra-driver": LazyCommand("gpushare.cli.dradriver", "dra_driver"),
    "dra-templates": LazyCommand("gpushare.cli.dratemplates", "dra_templates"),
    "extender": LazyCommand("gpushare.cli.extender", "extender"),
    "inspect": LazyCommand("gpushare.cli.inspect", "inspect"),
    "simulate": LazyCommand("gpushare.cli.simulate", "simulate", extra="sim"),
}
"""Subcommand name → where it lives; imported on first use."""


def _missing_extra(name: str, extra: str, error: ModuleNotFoundError) -> click.Command:
    """A stand-in for subcommand ``name`` whose extra is not installed: it fails with one line
    naming the missing module and the install command."""
    message = (
        f"gpushare {name} needs the '{extra}' extra ({error.name} is not installed): "
        f"pip install '{DISTRIBUTION}[{extra}]'"
    )

    def fail(**_: object) -> None:
        raise click.ClickException(message)

    return click.Command(
        name,
        callback=fail,
        help=f"(not installed: pip install '{DISTRIBUTION}[{extra}]')",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )


class LazyGroup(click.Group):
    """A ``click.Group`` whose ``lazy`` subcommands are imported when they are invoked or
    listed by ``--help``, not when the group is built."""

    def __init__(self, *args: Any, lazy: dict[str, LazyCommand] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.lazy = dict(lazy or {})

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        where = self.lazy.get(cmd_name)
        if where is None:
            return super().get_command(ctx, cmd_name)
        try:
            module = importlib.import_module(where.module)
        except ModuleNotFoundError as error:
            if where.extra is None or (error.name or "").startswith("gpushare"):
                raise
            return _missing_extra(cmd_name, where.extra, error)
        command = getattr(module, where.attribute)
        if not isinstance(command, click.Command):
            raise TypeError(f"{where.module}.{where.attribute} is not a click command")
        return command


@click.group(cls=LazyGroup, lazy=SUBCOMMANDS)
@click.version_option(__version__, prog_name="gpushare")
def main() -> None:
    """Shared-GPU scheduling for Kubernetes."""
