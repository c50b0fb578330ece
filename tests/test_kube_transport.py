"""A request interrupted in its TLS handshake closes its connection (docs/interfaces.md, Pitfalls:
32; a soak's ResourceWarning, docs/testing.md, "The soak"): httpcore2 closes such a connection when
the handshake fails, not when the task is cancelled, so every cancelled request and every
``asyncio.timeout`` around a call that hit a slow handshake leaked a socket until the event loop
closed. Real TCP and TLS against ``gpushare.testing.silent_server``, which never answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx2
import pytest
from lightkube.resources.core_v1 import Node

from gpushare.kube.client import connect
from gpushare.kube.transport import closing_transport
from gpushare.testing.controlplane import unverified_kubeconfig
from gpushare.testing.silent_server import SilentServer, silent_server

WAIT_S = 10.0


async def _lightkube_get(server: SilentServer, tmp: Path) -> None:
    path = unverified_kubeconfig(tmp / "kubeconfig", server.url)
    async with connect(path, trust_env=False) as client:
        await _interrupted(server, client.get(Node, "n1"))


async def _httpx_get(server: SilentServer, tmp: Path) -> None:
    transport = closing_transport(False)
    async with httpx2.AsyncClient(transport=transport, trust_env=False) as client:
        await _interrupted(server, client.get(server.url + "/"))


async def _timed_out_get(server: SilentServer, tmp: Path) -> None:
    path = unverified_kubeconfig(tmp / "kubeconfig", server.url)
    async with connect(path, trust_env=False) as client:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await client.get(Node, "n1")


async def _interrupted(server: SilentServer, request: Awaitable[object]) -> None:
    """Run ``request`` until the server got its ClientHello, then cancel it."""
    task = asyncio.ensure_future(request)
    await asyncio.wait_for(server.spoke.wait(), WAIT_S)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


@dataclass(frozen=True)
class Case:
    id: str
    interrupt: Callable[[SilentServer, Path], Awaitable[None]]


CASES = [
    Case("the API client's request cancelled in the handshake", _lightkube_get),
    Case("the API client's request timed out in the handshake", _timed_out_get),
    Case("an httpx2 client on closing_transport, cancelled in the handshake", _httpx_get),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_request_interrupted_in_its_tls_handshake_closes_its_connection(
    case: Case, tmp_path: Path
) -> None:
    async def scenario() -> bool:
        async with silent_server() as server:
            await case.interrupt(server, tmp_path)
            # the client is closed and the loop still runs: only a connection closed by the
            # interruption reaches the server as an end of stream
            try:
                await asyncio.wait_for(server.closed.wait(), WAIT_S)
            except TimeoutError:
                return False
            return True

    assert asyncio.run(scenario()), "the interrupted connection was left open"


def test_closing_transport_refuses_an_httpx2_without_the_pool_it_patches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def without_pool(self: httpx2.AsyncHTTPTransport, **options: object) -> None:
        pass

    monkeypatch.setattr(httpx2.AsyncHTTPTransport, "__init__", without_pool)
    with pytest.raises(RuntimeError, match=r"gpushare\.kube\.transport needs updating"):
        closing_transport(True)
