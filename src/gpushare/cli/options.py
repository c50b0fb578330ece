"""Options and set-up shared by the long-running commands (``extender``, ``device-plugin``,
``dra-driver``)."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from gpushare.kube.client import AsyncClient, ConfigError, KubeconfigError, connect

__all__ = [
    "connect_or_exit",
    "kube_options",
    "log_level_option",
    "run_until_signalled",
    "setup_logging",
]

F = TypeVar("F", bound=Callable[..., object])


def kube_options(command: F) -> F:
    """``--kubeconfig PATH`` and ``--context NAME`` (both optional)."""
    command = click.option(
        "--context", help="Context of the kubeconfig (default: its current context)."
    )(command)
    return click.option(
        "--kubeconfig",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Kubeconfig file (default: in-cluster service account, $KUBECONFIG, ~/.kube/config).",
    )(command)


def share_library_options(command: F) -> F:
    """``--share-library-dir DIR`` and ``--share-library FILE`` (docs/share-view.md): where on
    the host the share-view library is installed for shared containers (unset: no view), and
    which library file (default: the image's)."""
    command = click.option(
        "--share-library",
        type=click.Path(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="The share-view library to install (libgpushare-share.so; default: the image's "
        "/opt/gpushare/lib/libgpushare-share.so).",
    )(command)
    return click.option(
        "--share-library-dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=None,
        help="Host directory to install the share-view library into (mounted at the same path "
        "in this pod): shared containers then see their share in CUDA and nvidia-smi "
        "(docs/share-view.md). Unset: they see the whole GPU.",
    )(command)


def connect_or_exit(kubeconfig: Path | None, context: str | None) -> AsyncClient:
    """The client of ``--kubeconfig``/``--context`` (``gpushare.kube.client.connect``); a bad
    or missing configuration ends the command with one line (``click.ClickException``): the
    kubeconfig's own ``kubeconfig <path>: <problem>``, or ``no Kubernetes configuration: ...``."""
    try:
        return connect(kubeconfig, context=context)
    except KubeconfigError as error:
        raise click.ClickException(str(error)) from None
    except ConfigError as error:
        raise click.ClickException(f"no Kubernetes configuration: {error}") from None


def log_level_option(command: F) -> F:
    """``--log-level debug|info|warning|error`` (default info)."""
    return click.option(
        "--log-level",
        type=click.Choice(["debug", "info", "warning", "error"]),
        default="info",
        show_default=True,
    )(command)


def setup_logging(log_level: str) -> None:
    """One line per record with time, level and logger; the HTTP client's per-request lines
    only at debug."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if log_level != "debug":
        logging.getLogger("httpx2").setLevel(logging.WARNING)


async def run_until_signalled(run: Callable[[asyncio.Event], Awaitable[None]]) -> None:
    """``run(stop)``, with ``stop`` set by SIGTERM or SIGINT (the daemon then ends cleanly)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await run(stop)
