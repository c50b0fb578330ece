"""``kubectl inspect gpushare --web``: the GPU map, a local page in the browser.

A starlette app on 127.0.0.1 only (never another address: it shows what the user's kubeconfig
may read, to whoever reaches the port), run by uvicorn until Ctrl-C:

* ``GET /`` — the page (``gpushare/inspect/gpumap.html``): each node's GPUs as bars of memory
  (and compute) by pod, starting pods (bound, not yet started by the device plugin) striped and
  named so, holds for preemptors hatched, unhealthy GPUs and whole-GPU holders flagged in words;
  the pending GPU pods with why they wait; preemption holds; problems. Each GPU is a focusable
  group whose label says all of it in words, so the page works by keyboard and with a screen
  reader, and reads without colour. It refreshes every 2 s and says when the cluster could not
  be read (keeping the last view).
* ``GET /report.json`` — the report of ``kubectl inspect gpushare -o json``
  (``gpushare.inspect.render.report_json``), read anew from the API server through the user's
  kubeconfig at each call; 503 with ``{"error": "<the one-line message>"}`` when it cannot be.

Every request must name the loopback address in its ``Host`` header (``127.0.0.1`` or
``localhost``, any port; starlette's ``TrustedHostMiddleware``): another name gets 400. A web
page elsewhere cannot read the report by pointing a DNS name of its own at 127.0.0.1 (DNS
rebinding): the browser sends that name as ``Host``.

Nothing is installed in the cluster: the page reads what ``kubectl inspect gpushare`` reads.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import click
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

__all__ = ["DEFAULT_WEB_PORT", "LOOPBACK_HOSTS", "ReportError", "serve_gpu_map", "web_app"]

DEFAULT_WEB_PORT = 8089
"""The port ``--web`` serves on (``--web-port``)."""
WEB_HOST = "127.0.0.1"
LOOPBACK_HOSTS = (WEB_HOST, "localhost")
"""The ``Host`` header values the GPU map answers (module doc); the port is not compared."""


class ReportError(Exception):
    """The report could not be read; the text is the one-line reason shown on the page."""


ReadReport = Callable[[], Awaitable[dict[str, Any]]]


def _page() -> str:
    return (importlib.resources.files("gpushare.inspect") / "gpumap.html").read_text("utf-8")


def web_app(read_report: ReadReport) -> Starlette:
    """The GPU map over ``read_report`` (the JSON report; ``ReportError`` when unreadable),
    answering only requests whose ``Host`` is one of ``LOOPBACK_HOSTS`` (else 400)."""
    page = _page()

    async def index(request: Request) -> Response:
        return HTMLResponse(page, headers={"Cache-Control": "no-store"})

    async def report(request: Request) -> Response:
        try:
            body = await read_report()
        except ReportError as error:
            return JSONResponse({"error": str(error)}, status_code=503)
        return JSONResponse(body, headers={"Cache-Control": "no-store"})

    return Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/report.json", report, methods=["GET"]),
        ],
        middleware=[Middleware(TrustedHostMiddleware, allowed_hosts=list(LOOPBACK_HOSTS))],
    )


def serve_gpu_map(read_report: ReadReport, port: int = DEFAULT_WEB_PORT) -> None:
    """Serve the GPU map on ``127.0.0.1:port`` (0: a free port) until interrupted; the URL is
    printed first. ``click.ClickException`` when the port cannot be bound."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((WEB_HOST, port))
    except OSError as error:
        listener.close()
        raise click.ClickException(
            f"cannot serve the GPU map on {WEB_HOST}:{port}: {error.strerror or error}; "
            "choose another with --web-port"
        ) from None
    click.echo(f"GPU map on http://{WEB_HOST}:{listener.getsockname()[1]}/ (Ctrl-C to stop)")
    config = uvicorn.Config(
        web_app(read_report), log_config=None, access_log=False, lifespan="off", ws="none"
    )
    try:
        asyncio.run(uvicorn.Server(config).serve(sockets=[listener]))
    finally:
        listener.close()
