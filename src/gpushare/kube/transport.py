"""The HTTP transport of every asyncio client gpushare makes: a connection whose TLS handshake
is interrupted is closed, not left open.

httpcore2 (2.16.2, the version ``constraints.txt`` pins; upstream httpcore has the same code)
closes a new TCP connection when its TLS handshake fails with an ``Exception``
(``AnyIOStream.start_tls``), but not when the task is cancelled during the handshake:
``CancelledError`` is a ``BaseException``, and the connection pool never saw the connection. The
socket then stays open, registered with the event loop, until the loop closes and the garbage
collector finds it (a ``ResourceWarning``; one file descriptor per interrupted request until
then). Requests are cancelled on every shutdown and by every ``asyncio.timeout`` around a call,
and a handshake is slowest when the machine is busy, so a long-running extender or device plugin
would leak under load.

``closing_transport`` is httpx2's own ``AsyncHTTPTransport`` whose pool opens connections
through ``ClosingBackend``: httpcore2's anyio backend, with a ``start_tls`` that closes the TCP
connection on any interruption (shielded from the cancellation, as httpcore2 shields its own
closes) before re-raising it. httpx2 has no public way to pass a network backend, so the pool's
``_network_backend`` is replaced; ``closing_transport`` raises ``RuntimeError`` when a new
httpx2 no longer has that attribute (``tests/test_kube_transport.py`` runs the interrupted
handshake against a real socket). docs/interfaces.md, Pitfalls: 32.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable

import anyio
import httpcore2
import httpx2

__all__ = ["ClosingBackend", "closing_transport"]

SocketOption = (
    tuple[int, int, int] | tuple[int, int, bytes | bytearray] | tuple[int, int, None, int]
)
"""A ``setsockopt`` argument as httpcore2 takes it."""


class _ClosingStream(httpcore2.AsyncNetworkStream):
    """A TCP stream of httpcore2's anyio backend whose ``start_tls`` closes it when interrupted."""

    def __init__(self, stream: httpcore2.AsyncNetworkStream) -> None:
        self._stream = stream

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._stream.read(max_bytes, timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        await self._stream.write(buffer, timeout)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            return await self._stream.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:  # a cancellation too: nobody else holds this connection
            with anyio.CancelScope(shield=True):
                await self._stream.aclose()
            raise

    def get_extra_info(self, info: str) -> object:
        return self._stream.get_extra_info(info)


class ClosingBackend(httpcore2.AsyncNetworkBackend):
    """httpcore2's ``AnyIOBackend`` whose streams close themselves when their TLS handshake is
    interrupted (module doc)."""

    def __init__(self) -> None:
        self._backend = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        return _ClosingStream(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[SocketOption] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(path, timeout, socket_options)
        return _ClosingStream(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def closing_transport(
    verify: ssl.SSLContext | bool, *, trust_env: bool = False
) -> httpx2.AsyncHTTPTransport:
    """httpx2's ``AsyncHTTPTransport(verify=verify, trust_env=trust_env)`` opening its
    connections through ``ClosingBackend``. ``RuntimeError`` when httpx2's transport no longer
    keeps an httpcore2 pool with a ``_network_backend`` (a new version: see the module doc)."""
    transport = httpx2.AsyncHTTPTransport(verify=verify, trust_env=trust_env)
    pool = getattr(transport, "_pool", None)
    if not isinstance(pool, httpcore2.AsyncConnectionPool) or not hasattr(pool, "_network_backend"):
        raise RuntimeError(
            f"httpx2 {httpx2.__version__}: AsyncHTTPTransport keeps no httpcore2 connection "
            "pool with a _network_backend; gpushare.kube.transport needs updating"
        )
    pool._network_backend = ClosingBackend()
    return transport
